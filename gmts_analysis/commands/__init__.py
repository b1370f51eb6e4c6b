"""One module per ``gmts`` subcommand: ``register(subparsers)`` and ``run(args) -> int``."""
