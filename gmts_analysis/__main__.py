"""``python -m gmts_analysis`` (what torchrun launches) is the ``gmts`` console script."""

from gmts_analysis.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
