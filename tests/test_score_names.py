"""No name of a registered score outside core/ (issue 29 item 3): the live diagnostics, the trainer, the
RL plots and the run figures iterate over the registry (core/scores.py) using its flags; a diagnostic
score that needs log-probs is computed, and one the diagnostics cannot compute is never skipped silently."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch

from gmts_analysis.core import scores
from gmts_analysis.core.scores import QUANTITIES, SCALES, Score
from gmts_analysis.errors import GmtsError

PKG = Path(__file__).resolve().parent.parent / "gmts_analysis"
#: names that are also words of other vocabularies: the tokens table's gmts column (SPEC), the keep-all
#: arm "all" (also the normalizer all) and "random" (the seeded chance arm, also plain English)
VOCABULARY = {"gmts", "all", "random"}
#: a study's contrasts, fixed before its run, name the scores they test: they live beside the study
#: (benchmarks/smollm2_study_report.py), so no module of the package is exempt
STUDY_PLANS: tuple[str, ...] = ()


def _score_names() -> set[str]:
    return {s for s in scores._REGISTRY} - set(QUANTITIES) - set(SCALES) - VOCABULARY


def test_no_registered_score_name_outside_core():
    names = _score_names()
    assert {"gmts_lgn", "entropy_inf", "one_minus_prob_inf", "surprisal"} <= names
    pattern = re.compile(r"""["'](%s)["']""" % "|".join(sorted(map(re.escape, names))))
    found = []
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG).as_posix()
        if rel.startswith("core/") or rel in STUDY_PLANS:
            continue
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{rel}:{i}: {m.group(1)}" for m in pattern.finditer(line)]
    assert not found, "score names written outside core/ (use the registry's flags): " + "; ".join(found)


def test_the_summarys_uncertain_contrast_is_a_registry_flag():
    from gmts_analysis.core.scores import UNCERTAIN_CONTRAST_SCORES

    assert tuple(UNCERTAIN_CONTRAST_SCORES) == ("one_minus_prob",)
    with scores.registered(Score("t_unc", ("prob",), lambda q: q["prob"], "test", uncertain_contrast=True)):
        assert tuple(UNCERTAIN_CONTRAST_SCORES) == ("one_minus_prob", "t_unc")
    assert "t_unc" not in UNCERTAIN_CONTRAST_SCORES


def test_figure_lists_are_registry_views():
    from gmts_analysis.views import plots

    assert tuple(plots.WITHIN_CROSS_ESTIMATORS) == ("entropy", "entropy_inf", "gmts", "one_minus_prob", "gmts_lgn")
    assert tuple(plots.MASS_ESTIMATORS) == ("entropy", "entropy_inf", "gmts", "one_minus_prob", "one_minus_prob_inf",
                                            "gmts_lgn")
    assert tuple(plots.DECOMPOSITION_ESTIMATORS) == ("entropy", "entropy_inf", "gmts", "abs_omega", "surprisal",
                                                     "logit_grad_norm")
    with scores.registered(Score("t_fig", ("entropy",), lambda q: q["entropy"], "test", figures=("mass_capture",))):
        assert tuple(plots.MASS_ESTIMATORS)[-1] == "t_fig"
    assert "t_fig" not in plots.MASS_ESTIMATORS


def _batch():
    g = torch.Generator().manual_seed(0)
    ent = torch.rand(4, 6, generator=g, dtype=torch.float64)
    lp = -torch.rand(4, 6, generator=g, dtype=torch.float64)
    omega = torch.tensor([1.0, -1.0, 0.0, 0.5], dtype=torch.float64)[:, None].expand(4, 6).clone()
    mask = torch.ones(4, 6)
    return ent, lp, omega, mask


def test_a_diagnostic_score_that_needs_log_probs_is_computed():
    from gmts_analysis.integrations.diagnostics import diagnostic_scores, selection_diagnostics

    ent, lp, omega, mask = _batch()
    s = Score("t_surprisal", ("logprob",), lambda q: -q["logprob"], "test", diagnostic=True)
    with scores.registered(s):
        got = diagnostic_scores(ent, omega, mask, logprob=lp)
        torch.testing.assert_close(got["t_surprisal"], -lp, rtol=0, atol=0)
        d = selection_diagnostics(ent, omega, mask, rho=0.5, logprob=lp)
        assert "gmts/selection_waste/t_surprisal" in d and "gmts/overlap/gmts_t_surprisal" in d


def test_a_diagnostic_score_is_never_skipped_silently(caplog):
    from gmts_analysis.integrations.diagnostics import diagnostic_scores

    ent, lp, omega, mask = _batch()
    with scores.registered(Score("t_lp2", ("logprob",), lambda q: q["logprob"] ** 2, "test", diagnostic=True)):
        with caplog.at_level(logging.WARNING, logger="gmts"):
            got = diagnostic_scores(ent, omega, mask)  # this caller gives no log-probs
        assert "t_lp2" not in got and "score 't_lp2' left out" in caplog.text and "logprob" in caplog.text
    with scores.registered(Score("t_head", ("head_grad_norm",), lambda q: q["head_grad_norm"], "test",
                                 diagnostic=True)):
        with pytest.raises(GmtsError, match="t_head.*diagnostic=True.*head_grad_norm"):
            diagnostic_scores(ent, omega, mask)


def test_rl_plots_follow_the_registry():
    from gmts_analysis.rl.plots import _sparse

    names = [n for _, _, ns, _ in _sparse() for n in ns]
    assert names[:4] == ["entropy", "gmts", "gmts_lgn", "random"]
    with scores.registered(Score("t_diag", ("entropy",), lambda q: q["entropy"], "test", diagnostic=True,
                                 arm=True, color="#010203")):
        assert "t_diag" in _sparse()[0][2] and "cross_answer_t_diag" in _sparse()[2][2]
