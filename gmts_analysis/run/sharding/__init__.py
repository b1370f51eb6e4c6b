"""Scale-out of the probe: torchrun sharding, chunk records, resume, parts and merge.

- :class:`ProbeJob` is a probe job's settings, checked once and split into the parts each layer reads.
- :func:`run_sharded` runs a probe on one process or on every rank of a torchrun job
  (``torchrun --nproc-per-node N -m gmts_analysis probe ...``); rank 0 merges.
- :func:`merge_run` finishes a run whose answers are all probed (``gmts merge RUN_DIR``).
- :func:`shard_answers` gives each rank a length-balanced share of whole groups.

See ``docs/scaling.md`` for the user's view and :mod:`gmts_analysis.run.sharding.state` for the
files of an unfinished run.
"""

from gmts_analysis.run.sharding.context import DistContext, context_from_env
from gmts_analysis.run.sharding.job import ProbeJob
from gmts_analysis.run.sharding.run import merge_run, run_sharded
from gmts_analysis.run.sharding.shard import shard_answers
from gmts_analysis.run.sharding.state import Fingerprint, run_fingerprint

__all__ = ["DistContext", "Fingerprint", "ProbeJob", "context_from_env", "merge_run", "run_fingerprint", "run_sharded",
           "shard_answers"]
