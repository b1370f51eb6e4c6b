"""Rollout readers (docs/definitions.md section 7), in three layers:

- :mod:`~gmts_analysis.readers.sources`: which files (a file, or a directory of per-step
  files as TRL's ``completions/`` and verl's ``rollout_data_dir/`` write them), streamed
  row by row, every bad byte or value named by file, line and field;
- :mod:`~gmts_analysis.readers.formats`: TRL completions tables and verl dumps mapped onto
  the gmts fields (reward columns, groups, logged advantage);
- :mod:`~gmts_analysis.readers.context`: text back to the token ids the policy saw (chat
  template, stop token), bounded before tokenization, with a report of what was restored.

The public entry points stay in :mod:`gmts_analysis.readers.rollouts`.
"""
