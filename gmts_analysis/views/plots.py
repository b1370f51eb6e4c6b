"""Figures of a probe: plain matplotlib functions of the tables, one figure each.

Every ``fig_*`` function takes the tokens table and/or the stats dict and returns a
:class:`matplotlib.figure.Figure` built without pyplot (no global state, any backend;
files are written with Agg). The figures of a run as entries (name, draw function, caption, which
runs) and writing them (``render_all``, ``save_figure``) are :mod:`gmts_analysis.views.figures`; the
token strip is :mod:`gmts_analysis.views.token_strip` (both re-exported here). The figures live by what
they show: correlations (:mod:`~gmts_analysis.views.plots_correlation`), selections
(:mod:`~gmts_analysis.views.plots_selection`), tokens (:mod:`~gmts_analysis.views.plots_tokens`), with
their shared parts in :mod:`~gmts_analysis.views.plot_parts`; all are importable from here.

- ``within_vs_cross``: per-answer Spearman(s, grad_norm_logp) (zoomed) beside the pooled
  cross-answer Spearman(s, grad_norm), with 95% CIs, for entropy, the masked baseline
  entropy_inf, gmts, 1 - p and gmts_lgn; a second row over the uncertain tokens.
- ``decomposition``: cross-answer Spearman over all vs informative tokens (omega != 0) and the
  selection waste, for entropy, gmts, abs_omega, surprisal and logit_grad_norm, with CIs.
- ``decomposition_slices``: the same per domain (or step), beside each slice's zero-advantage share.
- ``estimators``: every estimator ranked (ties by paired CI), as paired differences with
  entropy on the within-answer mean, informative cross-answer Spearman and mass capture.
- ``group_answers``: one group's answers, log entropy vs log grad_norm, one colour per
  answer, marker by advantage sign.
- ``pooled_hexbin``: entropy vs grad_norm next to gmts vs grad_norm (log-log hexbins, zero-gradient
  tokens as a rug), with Spearman over all and over informative tokens.
- ``topk_overlap``: overlap with the top-rho tokens by grad_norm vs rho, every estimator.
- ``mass_capture``: the grad_norm mass a top-rho selection captures over the best possible, vs rho.
- ``update_fidelity``: cosine and norm ratio of the selected tokens' update vs the full one.
- ``token_strip``: one answer's tokens coloured by entropy and by grad_norm, with the
  entropy and GMTS selections under them.
- ``token_strings``: the token strings carrying the most gradient mass beside those entropy
  and GMTS select most, overall and per domain (the table: :mod:`gmts_analysis.analysis.token_strings`).

Selections use the run's keep fraction (:func:`gmts_analysis.views.figures.run_rho`).
"""

from __future__ import annotations

import logging
from typing import Any

from gmts_analysis.analysis.runs import RunTables, default_run_dir, load_run  # noqa: F401 - re-exported (their home)
from gmts_analysis.util.style import display_token  # noqa: F401 - display_token re-exported

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------ run directory


Run = RunTables  # a run's tables; the one home is gmts_analysis.analysis.runs


from gmts_analysis.views.plot_parts import StatsLike, _color, _empty, _errbar, _num  # noqa: E402,F401
from gmts_analysis.views.plots_correlation import (  # noqa: E402,F401
    DECOMPOSITION_ESTIMATORS,
    PAIRED_PANELS,
    WITHIN_CROSS_ESTIMATORS,
    fig_decomposition,
    fig_decomposition_slices,
    fig_estimators,
    fig_within_vs_cross,
)
from gmts_analysis.views.plots_selection import (  # noqa: E402,F401
    MASS_ESTIMATORS,
    fig_mass_capture,
    fig_topk_overlap,
    fig_update_fidelity,
)
from gmts_analysis.views.plots_tokens import fig_group_answers, fig_pooled_hexbin, fig_token_strings, pick_group  # noqa: E402,F401,E501

#: names moved to views/figures.py and views/token_strip.py, still importable from here
_MOVED = {"FIGURES": "figures", "FIGURE_ENTRIES": "figures", "FIGURE_CAPTIONS": "figures", "CREATOR": "figures",
          "run_rho": "figures", "save_figure": "figures", "png_metadata": "figures", "render_all": "figures",
          "pick_answer": "token_strip", "STRIP_ROWS": "token_strip", "fig_token_strip": "token_strip"}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        import importlib

        return getattr(importlib.import_module(f"gmts_analysis.views.{_MOVED[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
