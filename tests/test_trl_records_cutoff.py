"""TRL run records say which selection cut-off ran (gmts/selection/cutoff_quantile in the run's log)."""

from __future__ import annotations

import pytest

from gmts_analysis.errors import GmtsError
from gmts_analysis.rl.trl_records import logged_cutoff, record_config


def test_logged_cutoff_and_record_config():
    quantile = [{"step": 1, "reward": 0.5, "gmts/selection/cutoff_quantile": 1.0}, {"step": 2, "reward": 0.4}]
    top_k = [{"step": 1, "gmts/selection/cutoff_quantile": 0.0, "gmts/cutoff_quantile": 0.0}]
    assert logged_cutoff(quantile) == "quantile" and logged_cutoff(top_k) == "top_k"
    assert logged_cutoff([{"step": 1, "reward": 0.5}]) is None  # keep-all arm, or a run from before the flag
    with pytest.raises(GmtsError, match="both selection cut-offs"):
        logged_cutoff(quantile + top_k)
    cfg = {"selection": "entropy", "seed": 0}
    assert record_config(cfg, quantile) == {**cfg, "domains": ["word"], "trainer": "trl",
                                            "selection_cutoff": "quantile"}
    assert record_config(cfg, []) == {**cfg, "domains": ["word"], "trainer": "trl"}  # old records: unchanged keys
    with pytest.raises(GmtsError, match="plan says selection_cutoff='top_k'"):
        record_config({**cfg, "selection_cutoff": "top_k"}, quantile, "run-dir")


def test_a_trained_run_logs_its_cutoff(tmp_path):
    pytest.importorskip("trl")
    from test_rl_trl import _args, _train

    from gmts_analysis.integrations.trl_trainer import SelectiveGRPOTrainer

    for cutoff in ("quantile", "top_k"):
        tr = _train(SelectiveGRPOTrainer, _args(tmp_path / cutoff, token_selection="entropy",
                                                selection_cutoff=cutoff, max_steps=1))
        assert logged_cutoff(tr.state.log_history) == cutoff
