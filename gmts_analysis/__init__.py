"""gmts_analysis: which tokens matter in RLVR.

Per-token entropy, log-probs, exact per-token policy-gradient norms, GMTS scores,
statistics, figures and reports. Definitions: SPEC.md (shared with the team).

Nothing heavy is imported here: ``import gmts_analysis`` does no work.
"""

__version__ = "0.1.0"
