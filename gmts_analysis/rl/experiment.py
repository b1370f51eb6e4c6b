"""Arms x seeds of :func:`gmts_analysis.rl.trainer.train`: run records, summary, results JSON.

Layout of an experiment ``<out>.json`` (``out`` e.g. ``data/rl/small_reduced.json``):

- every run is written as soon as it ends to ``<out stem>.runs/<selection>-s<seed>.json``;
  a run whose file exists (same configuration) is not redone, so an interrupted experiment
  resumes, and two processes with disjoint ``--seed`` lists can share the work;
- ``<out>.json`` holds ``config`` (shared), ``initial_pass1`` (the untrained policy, the
  same for every arm), ``runs`` (every run record), ``summary`` (final pass@1 per arm and
  domain: ``mean``, ``std`` (ddof 1), ``min``, ``max``, ``n_seeds``, ``values``) and ``timing_s``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np

from gmts_analysis.errors import GmtsError
from gmts_analysis.readers import models as model_io  # load_model through its module: tests replace it there
from gmts_analysis.rl.config import SELECTION_ARMS, record_config, record_versions, run_path, runs_dir
from gmts_analysis.rl.trainer import RLConfig, evaluate, train
from gmts_analysis.util.io import atomic_write_json, read_json
from gmts_analysis.util.io import to_json as _text

log = logging.getLogger(__name__)

# fields that may differ between the runs of one experiment
RUN_FIELDS = ("selection", "seed")


def to_json(obj):
    """A JSON-ready copy (tuples as lists, NaN as None), so records compare equal after a round trip."""
    return json.loads(_text(obj))


def _shared(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k not in RUN_FIELDS}


def summarise(runs: list[dict], domains: Sequence[str]) -> dict:
    """``{selection: {domain|"mean": {mean, std, min, max, n_seeds, values}}}`` of final pass@1."""
    out: dict[str, dict] = {}
    for sel in sorted({r["config"]["selection"] for r in runs}):
        rs = sorted((r for r in runs if r["config"]["selection"] == sel), key=lambda r: r["config"]["seed"])
        block = {}
        for d in list(domains) + ["mean"]:
            if d == "mean":
                v = np.array([np.mean([r["final_pass1"][x] for x in domains]) for r in rs])
            else:
                v = np.array([r["final_pass1"][d] for r in rs])
            block[d] = {
                "mean": float(v.mean()),
                "std": float(v.std(ddof=1)) if len(v) > 1 else float("nan"),
                "min": float(v.min()),
                "max": float(v.max()),
                "n_seeds": len(v),
                "values": [float(x) for x in v],
                "seeds": [r["config"]["seed"] for r in rs],
            }
        out[sel] = block
    return out


def run_experiment(
    base: RLConfig,
    selections: Sequence[str],
    seeds: Sequence[int],
    out: str | Path,
    *,
    load: Callable[[], tuple] | None = None,
    progress: bool = False,
    reward_fn: Callable[[dict], float] | None = None,
    offline: bool = False,
) -> dict:
    """Run every (selection, seed) not already on disk, then write and return the experiment JSON.

    load: returns a fresh ``(model, tokenizer)`` (default: :func:`gmts_analysis.readers.models.load_model`
    of ``base.model`` on ``base.device``, no hub download when ``offline``); every run starts from the
    same weights.
    """
    out = Path(out)
    if load is None:
        load = partial(_load_policy, base.model, base.device, offline)
    for sel in selections:
        replace(base, selection=sel).check()
    t0 = time.perf_counter()
    shared = to_json(_shared(record_config(base)))
    initial = _initial_pass1(base, shared, out, load)
    runs = [_one_run(replace(base, selection=sel, seed=int(seed)), out, initial, load, progress, reward_fn)
            for seed in seeds for sel in selections]
    result = {
        "config": shared,
        "selections": list(selections),
        "seeds": [int(s) for s in seeds],
        "initial_pass1": initial,
        "runs": runs,
        "summary": summarise(runs, base.domains),
        "timing_s": {
            "this_invocation": time.perf_counter() - t0,
            "sum_of_runs": float(sum(r["timing_s"]["total"] for r in runs)),
        },
        "versions": record_versions(),
    }
    result = to_json(result)
    atomic_write_json(out, result)
    return result


def _load_policy(model_name: str, device: str, offline: bool = False) -> tuple:
    """``(model, tokenizer)`` of ``model_name`` (a shipped policy name or a checkpoint) on ``device``; refuses a
    checkpoint without a tokenizer."""
    model, tok = model_io.load_model(model_name, device, offline=offline)
    if tok is None:
        raise GmtsError(f"model={model_name}: the checkpoint ships no tokenizer")
    return model, tok


def _initial_pass1(base: RLConfig, shared: dict, out: Path, load: Callable[[], tuple]) -> dict[str, float]:
    """pass@1 of the untrained policy, read from ``<out stem>.runs/initial.json`` when its configuration is
    ``shared``, else measured once and written there."""
    init_path = runs_dir(out) / "initial.json"
    if init_path.exists():
        rec = read_json(init_path)
        if rec.get("config") == shared:
            return rec["pass1"]
    model, tok = load()
    te = time.perf_counter()
    initial = evaluate(model, tok, base)
    atomic_write_json(init_path, to_json({"config": shared, "pass1": initial, "eval_s": time.perf_counter() - te}))
    del model
    return initial


def _one_run(cfg: RLConfig, out: Path, initial: dict[str, float], load: Callable[[], tuple], progress: bool,
             reward_fn: Callable[[dict], float] | None) -> dict:
    """The run record of ``cfg``: its file under ``<out stem>.runs/`` when it holds the same configuration,
    else a fresh training run from ``load()``, written there as soon as it ends."""
    sel, seed = cfg.selection, cfg.seed
    p = run_path(out, sel, seed)
    if p.exists():
        rec = read_json(p)
        if rec.get("config") == to_json(record_config(cfg)):
            log.info("run %s seed %d: found %s, kept", sel, seed, p)
            return rec
        log.warning("run %s seed %d: %s has another configuration; redoing it", sel, seed, p)
    model, tok = load()
    log.info("run %s seed %d: %d steps", sel, seed, cfg.max_steps)
    rec = train(model, tok, cfg, initial_eval=initial, progress=progress, reward_fn=reward_fn)
    rec["versions"] = record_versions()
    rec = to_json(rec)
    atomic_write_json(p, rec)
    del model
    return rec


def load_experiment(out: str | Path) -> dict:
    """The experiment dict of :func:`run_experiment` rebuilt from the run files on disk
    (``<out stem>.runs/*.json``), so a partial or interrupted experiment can be read: ``runs``
    holds every finished run, ``summary`` summarises them, ``complete`` says whether
    ``<out>.json`` (written only when every run ended) exists."""
    out = Path(out)
    rdir = runs_dir(out)
    if not rdir.is_dir():
        raise GmtsError(f"{rdir}: no run directory for experiment {out}")
    init = read_json(rdir / "initial.json") if (rdir / "initial.json").exists() else None
    runs = []
    for p in sorted(rdir.glob("*-s*.json")):
        rec = read_json(p)
        if init is not None and _shared(rec["config"]) != init["config"]:
            log.warning("%s: configuration differs from initial.json; left out", p)
            continue
        runs.append(rec)
    if not runs:
        raise GmtsError(f"{rdir}: no finished run yet")
    cfg = init["config"] if init is not None else to_json(_shared(runs[0]["config"]))
    sels = [s for s in SELECTION_ARMS if any(r["config"]["selection"] == s for r in runs)]
    return {
        "config": cfg,
        "selections": sels,
        "seeds": sorted({r["config"]["seed"] for r in runs}),
        "initial_pass1": init["pass1"] if init is not None else runs[0]["evals"][0]["pass1"],
        "runs": runs,
        "summary": summarise(runs, cfg["domains"]),
        "timing_s": {"sum_of_runs": float(sum(r["timing_s"]["total"] for r in runs))},
        "complete": out.exists(),
    }


def zero_std_share(result: dict, first_step_only: bool = False) -> dict[str, float]:
    """Share of training groups whose rewards are all equal (so A = 0 for every answer):
    ``{"mean", "min", "max", "n_steps"}`` over every logged step of every run (or step 1 only,
    which every arm samples from the same initial policy)."""
    v = [s["frac_groups_zero_std"] for r in result["runs"] for s in r["steps"]
         if not first_step_only or s["step"] == 1]
    a = np.asarray(v, dtype=float)
    return {"mean": float(a.mean()), "min": float(a.min()), "max": float(a.max()), "n_steps": int(a.size)}


def results_table(results: dict[str, dict]) -> list[dict]:
    """Rows ``{condition, arm, n_seeds, mean, std, min, max, delta_vs_all, <domain>: "m ± s"}``
    of final pass@1 (mean over domains; std ddof 1 over seeds), one per condition and arm;
    ``results``: ``{condition label: experiment dict}`` (conditions without an ``all`` arm take
    the ``all`` arm of the first condition that has one, which does not depend on rho or scope)."""
    base = next((r["summary"]["all"]["mean"]["mean"] for r in results.values() if "all" in r["summary"]), None)
    rows = []
    for label, res in results.items():
        for arm, block in res["summary"].items():
            m = block["mean"]
            row = {"condition": label, "arm": arm, "n_seeds": m["n_seeds"], "mean": m["mean"], "std": m["std"],
                   "min": m["min"], "max": m["max"],
                   "delta_vs_all": m["mean"] - base if base is not None else float("nan")}
            for d in res["config"]["domains"]:
                row[d] = f"{block[d]['mean']:.3f} ± {block[d]['std']:.3f}" if block[d]["n_seeds"] > 1 else f"{block[d]['mean']:.3f}"
            rows.append(row)
    return rows

