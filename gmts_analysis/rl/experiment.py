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

import logging
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from gmts_analysis.errors import GmtsError
from gmts_analysis.rl.trainer import RLConfig, evaluate, train

log = logging.getLogger(__name__)

# fields that may differ between the runs of one experiment
RUN_FIELDS = ("selection", "seed")


def run_path(out: Path, selection: str, seed: int) -> Path:
    return out.with_suffix("").with_name(out.stem + ".runs") / f"{selection}-s{seed}.json"


def to_json(obj):
    """A JSON-ready copy (tuples as lists, NaN as None), so records compare equal after a round trip."""
    import json

    from gmts_analysis.io import to_json as _text

    return json.loads(_text(obj))


def _shared(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k not in RUN_FIELDS}


def _versions() -> dict[str, str]:
    import torch
    import transformers

    from gmts_analysis import __version__

    return {"gmts_analysis": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


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
) -> dict:
    """Run every (selection, seed) not already on disk, then write and return the experiment JSON.

    load: returns a fresh ``(model, tokenizer)`` (default: :func:`gmts_analysis.models.load_model`
    of ``base.policy`` on ``base.device``); every run starts from the same weights.
    """
    from gmts_analysis.io import atomic_write_json, read_json

    out = Path(out)
    if load is None:
        from gmts_analysis.models import load_model

        def load():
            model, tok = load_model(base.policy, base.device)
            if tok is None:
                raise GmtsError(f"--policy {base.policy}: the checkpoint ships no tokenizer")
            return model, tok

    for sel in selections:
        replace(base, selection=sel).check()
    t0 = time.perf_counter()
    shared = to_json(_shared(asdict(base)))
    init_path = out.with_suffix("").with_name(out.stem + ".runs") / "initial.json"
    initial = None
    if init_path.exists():
        rec = read_json(init_path)
        if rec.get("config") == shared:
            initial = rec["pass1"]
    if initial is None:
        model, tok = load()
        te = time.perf_counter()
        initial = evaluate(model, tok, base)
        atomic_write_json(init_path, to_json({"config": shared, "pass1": initial, "eval_s": time.perf_counter() - te}))
        del model
    runs = []
    for seed in seeds:
        for sel in selections:
            cfg = replace(base, selection=sel, seed=int(seed))
            p = run_path(out, sel, int(seed))
            if p.exists():
                rec = read_json(p)
                if rec.get("config") == to_json(asdict(cfg)):
                    log.info("run %s seed %d: found %s, kept", sel, seed, p)
                    runs.append(rec)
                    continue
                log.warning("run %s seed %d: %s has another configuration; redoing it", sel, seed, p)
            model, tok = load()
            log.info("run %s seed %d: %d steps", sel, seed, cfg.steps)
            rec = train(model, tok, cfg, initial_eval=initial, progress=progress, reward_fn=reward_fn)
            rec["versions"] = _versions()
            rec = to_json(rec)
            atomic_write_json(p, rec)
            runs.append(rec)
            del model
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
        "versions": _versions(),
    }
    result = to_json(result)
    atomic_write_json(out, result)
    return result
