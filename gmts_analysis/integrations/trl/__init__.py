"""The TRL drop-in (optional extra ``pip install gmts_analysis[trl]``, TRL >= 1.16), config beside trainer:

- :mod:`.config`: :class:`SelectiveGRPOConfig`, TRL's ``GRPOConfig`` plus the selection fields, checked in
  ``__post_init__``;
- :mod:`.trainer`: :class:`SelectiveGRPOTrainer`, TRL's ``GRPOTrainer`` with the selection entering through
  one override (``_compute_loss``);
- :mod:`.selection`: the selection's steps on one micro-batch (gather, select, rescale, log);
- :mod:`.loss`: TRL 1.16's GRPO loss, split where the selection's mask goes in.

``gmts_analysis.integrations.trl_trainer`` re-exports the public names.
"""

from __future__ import annotations

try:
    import trl  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("gmts_analysis.integrations.trl needs TRL: pip install 'gmts_analysis[trl]'") from e

from gmts_analysis.integrations.trl.config import TOKEN_SELECTIONS, SelectiveGRPOConfig
from gmts_analysis.integrations.trl.trainer import SelectiveGRPOTrainer

__all__ = ["TOKEN_SELECTIONS", "SelectiveGRPOConfig", "SelectiveGRPOTrainer"]
