"""Options: each declared once, as a dataclass field, and everything else derived from it.

- :mod:`~gmts_analysis.options.fields`: how an option is declared (:func:`opt`, :class:`Alias`, the help groups);
- :mod:`~gmts_analysis.options.config`: the probe, job, sampling and shared option dataclasses, the API keywords;
- :mod:`~gmts_analysis.options.checks`: the domains of option values (``check=`` of a declaration);
- :mod:`~gmts_analysis.options.parser`: argparse flags from the declarations (the one ``add_argument``);
- :mod:`~gmts_analysis.options.spellings`: TRL's and verl's names, underscores;
- :mod:`~gmts_analysis.options.gmts_parser`: the ``gmts`` parser class (spellings and ``--config`` together);
- :mod:`~gmts_analysis.options.config_file`: ``--config FILE.yaml``;
- :mod:`~gmts_analysis.options.reference`: the generated option tables of ``docs/cli.md``.
"""

from gmts_analysis.options.config_file import config_file_args, read_config_file  # noqa: F401,E402
from gmts_analysis.options.fields import Alias, opt  # noqa: F401
from gmts_analysis.options.gmts_parser import GmtsParser  # noqa: F401
from gmts_analysis.options.parser import add_fields, help_group, parser_fields  # noqa: F401
from gmts_analysis.options.spellings import (  # noqa: F401
    ALIAS_BY_NAME,
    ALIASES,
    CONFIG_FLAG,
    TRL_NAMES,
    install,
    resolve_aliases,
)
