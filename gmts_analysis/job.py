"""One probe run, end to end: rollouts in, a run directory out (SPEC section 8).

``run_probe(cfg)`` loads the model, reads the rollouts, probes every answer with
:func:`gmts_analysis.kernel.probe_answer` (sharded across torchrun ranks when launched so,
recorded chunk by chunk so that a killed run resumes), and finishes the directory with
:func:`gmts_analysis.finalize.write_run`. ``gmts probe`` and ``gmts run`` both call it.
"""

from __future__ import annotations

from pathlib import Path

from gmts_analysis.config import ProbeConfig


def run_probe(cfg: ProbeConfig) -> Path:
    """Load, read, probe, compute statistics (and fidelity, figures, report); write ``cfg.out``.

    One process, or every rank of a torchrun job (each takes a share of whole groups; rank 0
    merges). Work is recorded chunk by chunk in ``cfg.out``: the same command run again
    after a crash resumes; the finished files appear only once everything is done (see
    :mod:`gmts_analysis.sharding` and docs/scaling.md).
    """
    from gmts_analysis.sharding import run_sharded

    return run_sharded(cfg)

