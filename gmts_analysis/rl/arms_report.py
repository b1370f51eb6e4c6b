"""Training arms compared over seeds (``gmts rl-report``; docs/studies/referee.md sections 7 and 7.1): the analysis, from the run records on disk.

Input: a data directory holding ``plan.json`` (settings, arms, seeds, contrasts, alpha) and, for every
setting, the run records of ``gmts rl --out DIR/<file>`` in ``DIR/<file stem>.runs/<arm>-s<seed>.json``.
No training, no torch: this reads JSON and computes.

- :func:`load_plan`: the plan, checked (one-line :class:`GmtsError` naming the file and field).
- :func:`run_final_pass1` / :func:`run_eval_se`: a run's final pass@1 (mean over domains) and the
  binomial evaluation SE of that mean, ``sqrt(sum_d p_d (1 - p_d) / n_d) / D``.
- :func:`build_report`: completeness per setting (a setting missing any run of any arm and plan seed is
  *cut*, listed with the missing files, and never reported on fewer seeds), the per-arm results, every
  planned paired contrast (``"*"`` expanded to every other pair of a complete setting, exploratory and
  unadjusted) with its t interval, t / sign / Wilcoxon p, Holm over the family ``primary``, and the
  verdict of the word rule (:func:`verdict`), the mechanism per setting and arm
  (:func:`mechanism`), and per complete setting the learning phase (``trajectory``:
  :func:`learning_phase`; exploratory and unadjusted).
- :func:`report_markdown`: the generated text (tables and sentences).

The pieces live by what they own: the plan and run records (:mod:`~gmts_analysis.rl.arms_plan`), the
analysis (:mod:`~gmts_analysis.rl.arms_stats`) and the words and tables
(:mod:`~gmts_analysis.rl.arms_text`); this module re-exports their names.

A run whose configuration disagrees with the plan (policy, steps, rho, scope, group size, dynamic
sampling, lr, normalizer, evaluation sizes, domains, prompts per domain, ...) is refused in one line
naming the file and field.
"""

from __future__ import annotations

from gmts_analysis.rl.arms_plan import (  # noqa: F401 - re-exported
    BLOCK_TAG,
    FAMILIES,
    GENERATOR,
    SETTING_FIELDS,
    check_run,
    expected_config,
    final_prompts,
    load_plan,
    repeats_of,
    run_eval_se,
    run_final_pass1,
    run_trajectory,
    setting_arms,
)
from gmts_analysis.rl.arms_stats import (  # noqa: F401 - re-exported
    build_report,
    check_data_dir,
    held_on_replication,
    learning_phase,
    mechanism,
    pooled_view,
    run_mechanism,
    run_pass1_at,
    run_reward_mean,
    shared_eval_steps,
    verdict,
)
from gmts_analysis.rl.arms_text import (  # noqa: F401 - re-exported
    SE_MEAN_DIFF,
    SE_ONE_DIFF,
    contrast_sentence,
    crn_sentence,
    evidence_words,
    held_sentence,
    provenance_sentence,
    report_markdown,
)
