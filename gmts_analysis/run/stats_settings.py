"""The settings of ``gmts stats RUN_DIR`` (:mod:`gmts_analysis.run.stats_job`), each part named for what it sets.

:class:`StatsSettings` (the statistics: bootstrap, seed, the views' thresholds), :class:`RescoreSettings` (new
rewards: a verifier, a rewards file or TRL's truncation mask; any of them turns the job into a re-scoring) and
:class:`StatsOutput` (where the result goes). Each checks its fields' declared domains when built (the same
checks the command line runs on the flags). Light: the command's declaration imports them for ``gmts --help``;
the job is imported only when the command runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gmts_analysis.core.vocabulary import DEFAULT_N_BOOT, DEFAULT_RHO, DEFAULT_UNCERTAIN_BELOW
from gmts_analysis.options import checks
from gmts_analysis.options.fields import opt

#: what a re-scoring flag adds to its help
_RESCORE = "writes a new run directory to --out"


class _Checked:
    """A settings dataclass that checks its fields' declared domains (``opt(check=...)``) when built."""

    def __post_init__(self) -> None:
        fields = {f.name: f for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        checks.check_fields(fields, {n: getattr(self, n) for n in fields})


@dataclass
class StatsSettings(_Checked):
    """What the statistics are computed with: the bootstrap's resamples and seed, and the thresholds of the
    views (``None``: the run's manifest value, else the default)."""

    n_boot: int = opt(DEFAULT_N_BOOT, f"bootstrap resamples for the CIs (default {DEFAULT_N_BOOT}; 0: no CIs)",
                      group="output", metavar="RESAMPLES", check=checks.int_at_least(0))
    seed: int = opt(0, "seed of the bootstrap (default 0)", metavar="INT", check=checks.seed)
    uncertain_below: float = opt(None, "the uncertain-token view keeps tokens with prob below this (default: the "
                                 f"run's manifest value, else {DEFAULT_UNCERTAIN_BELOW})", group="RL objective",
                                 metavar="PROB", check=checks.probability)
    rho: float = opt(None, "the keep fraction the paired differences and the headline quote (default: the run's "
                     f"manifest value, else {DEFAULT_RHO})", group="RL objective", metavar="FRACTION",
                     check=checks.rho)


@dataclass
class RescoreSettings(_Checked):
    """New rewards for a re-scoring (none given: the statistics are recomputed in place)."""

    verifier: str = opt(None, "re-score: new rewards from this verifier (math_boxed, math, a toy domain, or "
                        f"module:function) on the run's response texts; {_RESCORE}", group="inputs", metavar="NAME",
                        check=checks.verifier)
    rewards: str = opt(None, "re-score: new rewards from a JSONL ({answer_id, reward} per line) or CSV (answer_id, "
                       f"reward) file, every answer once; {_RESCORE}", group="inputs", metavar="FILE",
                       check=checks.input_file)
    mask_truncated_completions: bool = opt(False, "re-score: truncated answers get loss weight 0 (TRL's "
                                           f"mask_truncated_completions); {_RESCORE}", group="RL objective")

    @property
    def asked(self) -> bool:
        """Whether any re-scoring was asked for."""
        return self.verifier is not None or self.rewards is not None or self.mask_truncated_completions


@dataclass
class StatsOutput(_Checked):
    """Where the result goes: a stats.json elsewhere, or the re-scored run directory."""

    out: str = opt(None, "write the JSON here instead of RUN_DIR/stats.json (estimators.csv beside it); with "
                   "--verifier, --rewards or --mask-truncated-completions: the new run directory", group="output",
                   metavar="DIR", check=checks.output_path)
    no_figures: bool = opt(False, "re-score: skip the figures and report", group="output")
    overwrite: bool = opt(False, "replace an existing --out file that gmts did not write (default: refuse it)",
                          group="output")
