"""Needs checked before the model runs (gmts_analysis.probing.preflight): update fidelity's memory, the
exact engine's minimum memory, disk for the run directory."""

from __future__ import annotations

import json
import logging
from collections import namedtuple

import pytest
from conftest import make_rollouts

import gmts_analysis as gmts
from gmts_analysis.cli import main
from gmts_analysis.errors import GmtsError
from gmts_analysis.probing import preflight
from gmts_analysis.toy.testing import build_tiny_model


def test_fidelity_need_of_smollm2_is_known_before_any_work():
    """The issue's failure after an hour of probing, computed from the parameter count alone."""
    # all, oracle, 12 estimators (entropy_inf and one_minus_prob_inf among them since stats v3), 5 random
    assert preflight.n_fidelity_selections("exact", has_head=True) == 19
    assert preflight.n_fidelity_selections("none", has_head=False) == 16
    assert "10.22 GB for 19 gradients" in preflight.FidelityNeed(19, 134_515_008, 2 * 1024**3).describe()
    need = preflight.FidelityNeed(17, 134_515_008, 2 * 1024**3)
    assert not need.fits and "9.15 GB for 17 gradients of 134,515,008 parameters (budget 2.15 GB)" in need.describe()


@pytest.fixture()
def rows(tmp_path):
    path = make_rollouts(tmp_path / "r.jsonl", n_groups=2, group_size=2, seed=5, vocab=64)
    return [json.loads(x) for x in path.read_text().splitlines()]


def _no_probing(monkeypatch):
    from gmts_analysis.probing import kernel

    def boom(*a, **k):
        raise AssertionError("the model ran before the resource check")

    monkeypatch.setattr(kernel, "probe_answers", boom)
    monkeypatch.setattr(kernel, "probe_answer", boom)


def test_fidelity_auto_off_when_it_would_not_fit(rows, monkeypatch, caplog):
    import gmts_analysis.engine.fidelity as fid

    model = build_tiny_model("gpt2", seed=11)
    on = gmts.probe(model, rows, quiet=True, device="cpu", figures=False)
    assert on.stats["update_fidelity"]
    monkeypatch.setattr(fid, "DEFAULT_BUDGET", 1000)
    with caplog.at_level(logging.INFO, logger="gmts_analysis"):
        off = gmts.probe(model, rows, quiet=True, device="cpu", figures=False)
    assert not off.stats["update_fidelity"]
    lines = [r.getMessage() for r in caplog.records if "update fidelity off" in r.getMessage()]
    assert len(lines) == 1 and "gradients of" in lines[0], lines


def test_fidelity_on_that_cannot_fit_is_refused_before_the_model_runs(rows, monkeypatch):
    import gmts_analysis.engine.fidelity as fid

    monkeypatch.setattr(fid, "DEFAULT_BUDGET", 1000)
    _no_probing(monkeypatch)
    with pytest.raises(GmtsError, match=r"fidelity=on: update fidelity needs .* use fidelity=off"):
        gmts.probe(build_tiny_model("gpt2", seed=11), rows, quiet=True, device="cpu", fidelity="on")


def test_cli_fidelity_on_refused_before_probing(tiny_model_dirs, tmp_path, monkeypatch, capsys):
    import gmts_analysis.engine.fidelity as fid

    monkeypatch.setattr(fid, "DEFAULT_BUDGET", 1000)
    _no_probing(monkeypatch)
    r = make_rollouts(tmp_path / "r.jsonl", n_groups=2, group_size=2)
    rc = main(["probe", "--model", str(tiny_model_dirs["qwen2"]), "--rollouts", str(r), "--out", str(tmp_path / "o"),
               "--device", "cpu", "--quiet", "--no-figures", "--fidelity", "on"])
    err = capsys.readouterr().err
    assert rc == 2 and "use --fidelity off" in err and "--no-fidelity" not in err and "Traceback" not in err
    assert not (tmp_path / "o" / "chunks").exists() or not any((tmp_path / "o" / "chunks").iterdir())


def test_engine_memory_and_disk_refused_before_the_model_runs(rows, tmp_path, monkeypatch):
    model = build_tiny_model("gpt2", seed=11)
    _no_probing(monkeypatch)
    monkeypatch.setattr(preflight, "available_memory", lambda device: 1)
    with pytest.raises(GmtsError, match="the exact engine needs about .* grad_norm=sketch"):
        gmts.probe(model, rows, quiet=True, device="cpu", fidelity="off")
    monkeypatch.setattr(preflight, "available_memory", lambda device: None)
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda p: Usage(10**6, 10**6 - 1000, 1000))
    with pytest.raises(GmtsError, match="the run needs about .* MB of disk"):
        gmts.probe(model, rows, quiet=True, device="cpu", fidelity="off", out=tmp_path / "o")


def test_sketch_on_short_answers_says_exact_is_cheaper(rows, caplog):
    """The sketch was slower than exact on short answers (59 s exact, 90 s sketch at K = 16 on 35-token answers)
    and nothing said so; now the probe warns, from the answers' lengths, before any work."""
    from gmts_analysis.engine.choice import choose_method

    assert choose_method([35] * 4, 16)[0] == "exact" and choose_method([228] * 4, 16)[0] == "sketch"
    assert choose_method([228] * 4, 64)[0] == "exact"  # more directions: the sketch costs more
    model = build_tiny_model("gpt2", seed=11)
    with caplog.at_level(logging.WARNING, logger="gmts_analysis.probing.preflight"):
        gmts.probe(model, rows, quiet=True, device="cpu", fidelity="off", grad_norm="sketch", probes=8)
    assert any("exact is cheaper here" in r.message for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gmts_analysis.probing.preflight"):
        gmts.probe(model, rows, quiet=True, device="cpu", fidelity="off", grad_norm="exact")
    assert not any("cheaper" in r.message for r in caplog.records)
