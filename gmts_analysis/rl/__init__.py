"""RLVR training with token selection: GMTS vs entropy vs all vs random.

- :mod:`gmts_analysis.rl.trainer`: the home-made on-policy GRPO loop behind ``gmts rl``
  (toy domains, no TRL needed), with per-step diagnostics.
- :mod:`gmts_analysis.rl.experiment`: runs arms x seeds, results JSON, summary.
- :mod:`gmts_analysis.rl.plots`: learning curves with seed bands.
- :mod:`gmts_analysis.rl.arms_report`: comparing training arms over seeds (``gmts rl-report``): paired
  contrasts over seeds, Holm, the word rule, mechanism; reads run records only (no torch).
- :mod:`gmts_analysis.integrations.trl_trainer`: ``SelectiveGRPOTrainer``, a drop-in subclass of TRL's
  ``GRPOTrainer`` (optional extra ``[trl]``).
- :mod:`gmts_analysis.integrations.verl_recipe`: the selection mask for verl batches (verl not needed).

The selection itself (pure tensor functions) is in :mod:`gmts_analysis.core.selection`.
Nothing heavy is imported here.
"""
