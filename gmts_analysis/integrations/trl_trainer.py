"""TRL drop-in: ``SelectiveGRPOTrainer``, a ``GRPOTrainer`` that updates only selected tokens.

Needs the optional extra ``pip install gmts_analysis[trl]`` (TRL >= 1.16). Use it exactly like
``GRPOTrainer`` with a :class:`SelectiveGRPOConfig`::

    from gmts_analysis.integrations.trl_trainer import SelectiveGRPOConfig, SelectiveGRPOTrainer

    args = SelectiveGRPOConfig(output_dir="out", token_selection="gmts", selection_rho=0.2,
                               selection_scope="group", ...)
    trainer = SelectiveGRPOTrainer(model=..., reward_funcs=..., args=args, train_dataset=...)

This module re-exports the drop-in, which lives in :mod:`gmts_analysis.integrations.trl` (config in
``config.py``, trainer in ``trainer.py``; the fields are documented on :class:`SelectiveGRPOConfig`).
"""

from __future__ import annotations

from gmts_analysis.integrations.trl import TOKEN_SELECTIONS, SelectiveGRPOConfig, SelectiveGRPOTrainer

__all__ = ["TOKEN_SELECTIONS", "SelectiveGRPOConfig", "SelectiveGRPOTrainer"]
