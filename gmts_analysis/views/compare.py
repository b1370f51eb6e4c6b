"""Compare runs across training: every statistic of stats.json against step or checkpoint.

``compare_runs(paths)`` reads each run directory's ``stats.json`` and ``manifest.json``
(docs/definitions.md sections 6 and 8) and returns a :class:`Comparison`:

- ``table``: one row per (run, statistic) with ``run``, ``x`` (the step), ``statistic``
  (the dotted path into stats.json, e.g. ``cross_answer_informative.gmts.spearman``),
  ``block`` (its first component), ``estimator`` (the component naming an estimator, or
  empty), ``series`` (the path with the estimator replaced by ``*``: one figure per series,
  one line per estimator), ``value``, ``ci_low``, ``ci_high``, ``settings`` (the run's
  settings group). stats.json is read generically, whatever blocks and estimators it has:
  every numeric leaf is a statistic; a ``ci_low``/``ci_high`` pair belongs to the primary
  value of its dictionary (``spearman``, else ``mean``, else ``value``), and a block named
  ``<name>_ci`` holds the CIs of the same path under ``<name>``.
- ``runs``: per run its directory, ``x``, where ``x`` came from (``x_source``), the model and its
  ``inputs`` (the rollouts by content, :func:`inputs_of`).
- ``mismatches``: settings that differ between runs: ``{key, values: {run: value}}``.

The step of a run, in this order: ``manifest["step"]`` (written by ``gmts probe`` over
checkpoints); a number in the checkpoint path (``checkpoint-100``, ``ckpt_200``,
``step300``, ``global_step400``); else the run's position in the given order (and the
axis is labelled ``run``). Runs are sorted by step.

Settings: every key of ``manifest["config"]`` except bookkeeping that cannot change a
statistic (:data:`IGNORED_SETTINGS`: the model and step being compared, output paths,
progress and resource knobs, and the rollouts file: an input, told apart by its content
in ``runs[i]["inputs"]`` and logged, not a setting). Runs whose settings differ (temperature,
advantage, loss_agg, clips, grad_norm method, ...) are *flagged*: listed in
``mismatches``, in ``compare.json``, on the first page of ``compare.html`` and as a
warning on stderr, and each run carries a ``settings`` group label (``A``, ``B``, ...)
that the figures show as marker shapes. Nothing is averaged across runs.

``write_comparison`` writes ``compare.parquet``, ``compare.json``, ``figures/*.png`` and a
self-contained ``compare.html`` (:mod:`gmts_analysis.views.compare_page`: figures inlined as data URIs,
every text escaped, no external fetch). The figures draw the headline estimators (``Score.headline``),
every point with its 95% CI where stats.json has one; the table holds every estimator. A run whose own
summary says "Too small to compare" (fewer informative groups than ``meta.min_groups``: no interval)
is named in ``runs[i]["too_small"]``, on a banner of ``compare.html``, in its table cells and figures
(hollow points), and in a warning on stderr.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from gmts_analysis.analysis.stats_types import Statistics
from gmts_analysis.analysis.summary import too_small_caution
from gmts_analysis.core.scores import HEADLINE_SCORES, score_color
from gmts_analysis.errors import GmtsError
from gmts_analysis.options.config import JobSettings
from gmts_analysis.options.settings import RunSettings
from gmts_analysis.util.io import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_parquet,
    atomic_write_text,
    read_json,
)
from gmts_analysis.views.compare_page import render_page

log = logging.getLogger(__name__)

def _job_fields() -> frozenset:
    import dataclasses

    return frozenset(f.name for f in dataclasses.fields(JobSettings))


# job settings never change a number (gmts_analysis.options.config.JobSettings); the rollouts probed are an
# input, not a setting: told apart by content (inputs_of), never by the path they were read from
IGNORED_SETTINGS = _job_fields() | frozenset({
    "model_path", "step", "checkpoint", "chunk_size", "max_memory", "device", "format", "debug", "threads",
    "func", "command",
})
#: compare.json's ``format``: with the directory's listing, what proves a comparison is ours (util.io)
COMPARE_FORMAT = "gmts-compare/1"
PRIMARY_KEYS = ("spearman", "mean", "value")
CI_KEYS = ("ci_low", "ci_high")
STEP_PATTERN = re.compile(r"(?:checkpoint|ckpt|global_step|step|iter)[-_]?(\d+)", re.IGNORECASE)
FIGURE_LEAVES = ("spearman", "mean", "cosine", "norm_ratio", "token_share")
FIGURE_RHOS = ("0.05", "0.2")
SKIP_BLOCKS = ("meta", "by_domain", "by_step")
COLUMNS = ["run", "x", "statistic", "block", "estimator", "series", "value", "ci_low", "ci_high", "settings"]


@dataclass
class Comparison:
    """The result of :func:`compare_runs` (see the module docstring)."""

    table: pd.DataFrame
    runs: list[dict]
    mismatches: list[dict]
    x_label: str
    estimators: list[str] = field(default_factory=list)

    @property
    def too_small(self) -> dict[str, str]:
        """``{run: caution}`` of the runs whose own summary says "Too small to compare" (no interval)."""
        return {r["run"]: r["too_small"] for r in self.runs if r.get("too_small")}

    @property
    def figure_estimators(self) -> list[str]:
        """The estimators the figures draw: the headline scores (``Score.headline``); the rest are in the table."""
        return [e for e in self.estimators if e in HEADLINE_SCORES]

    def to_json(self) -> dict:
        return {
            "format": COMPARE_FORMAT,
            "x_label": self.x_label,
            "runs": self.runs,
            "settings_mismatch": self.mismatches,
            "too_small": self.too_small,
            "estimators": self.estimators,
            "figure_estimators": self.figure_estimators,
            "rows": self.table.to_dict(orient="records"),
        }


# ----------------------------------------------------------------------------- reading


def find_runs(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """Run directories from the arguments: each path is a run (has stats.json) or a directory
    whose immediate subdirectories with a stats.json are runs (taken in name order)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise GmtsError(f"{p}: no such run directory")
        if (p / "stats.json").is_file():
            out.append(p)
            continue
        if not p.is_dir():
            raise GmtsError(f"{p}: not a run directory (no stats.json)")
        # hidden directories (a job's staging or work area, .git) are never runs of the comparison
        subs = sorted((d for d in p.iterdir() if not d.name.startswith(".") and d.is_dir() and not d.is_symlink()
                       and (d / "stats.json").is_file()), key=_natural)
        if not subs:
            raise GmtsError(f"{p}: neither a run (no stats.json) nor a directory of runs")
        out.extend(subs)
    if not out:
        raise GmtsError("compare: no runs given")
    seen: set = set()
    dup = [str(d) for d in out if d.resolve() in seen or seen.add(d.resolve())]
    if dup:
        raise GmtsError(f"compare: run given twice: {dup[0]}")
    return out


def _natural(p: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]


def _read(path: Path, name: str) -> dict:
    f = path / name
    if not f.is_file():
        raise GmtsError(f"{f}: missing (a run directory has stats.json and manifest.json)")
    try:
        obj = read_json(f)
    except GmtsError:
        raise
    except Exception as e:  # noqa: BLE001 - one line naming the file
        raise GmtsError(f"{f}: not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise GmtsError(f"{f}: expected a JSON object, got {type(obj).__name__}")
    if name == "manifest.json" and "config" in obj and not isinstance(obj["config"], dict):
        raise GmtsError(f"{f}: field 'config' must be an object, got {type(obj['config']).__name__}")
    return obj


def _statistics(path: Path) -> Statistics:
    """The run's stats.json, typed (a field of the wrong shape is one line naming the file)."""
    f = path / "stats.json"
    if not f.is_file():
        raise GmtsError(f"{f}: missing (a run directory has stats.json and manifest.json)")
    return Statistics.read(f)


def run_step(manifest: Mapping) -> tuple[int | None, str]:
    """``(step, source)``: ``manifest["step"]``, else a number in the checkpoint path, else ``(None, "order")``."""
    step = manifest.get("step")
    if step is None and isinstance(manifest.get("config"), Mapping):
        step = manifest["config"].get("step")
    if step is not None:
        try:
            return int(step), "manifest"
        except (TypeError, ValueError):
            raise GmtsError(f"manifest step {step!r} is not an integer") from None
    cfg = manifest.get("config") if isinstance(manifest.get("config"), Mapping) else {}
    for key in ("model_path", "model"):
        v = manifest.get(key) if key == "model_path" else cfg.get(key)
        step = last_step(v) if isinstance(v, str) else None
        if step is not None:
            return step, "checkpoint path"
    return None, "order"


def base_at_step_0(steps: Sequence[int | None]) -> list[int | None]:
    """``steps`` with the one model without a step among checkpoints that all have one (>= 1) at step 0: the
    base model of the series, wherever it was listed; unchanged otherwise."""
    out = list(steps)
    if out.count(None) == 1 and len(out) > 1 and all(x >= 1 for x in out if x is not None):
        out[out.index(None)] = 0
    return out


def last_step(text: str) -> int | None:
    """The number of the last ``checkpoint-N`` / ``ckpt_N`` / ``stepN`` / ``global_stepN`` in ``text``."""
    found = list(STEP_PATTERN.finditer(text))
    return int(found[-1].group(1)) if found else None


def flatten_stats(stats: Mapping, prefix: tuple = ()) -> dict[tuple, float]:
    """``{key path (tuple of keys): float}`` of every numeric leaf (bools and strings skipped;
    None -> NaN). Paths are tuples because keys such as rho ``"0.2"`` contain dots."""
    out: dict[tuple, float] = {}
    for k, v in stats.items():
        path = prefix + (str(k),)
        if isinstance(v, Mapping):
            out.update(flatten_stats(v, path))
        elif isinstance(v, bool) or isinstance(v, str):
            continue
        elif v is None:
            out[path] = math.nan
        elif isinstance(v, (int, float)):
            out[path] = float(v)
    return out


def stat_rows(stats: Statistics | Mapping, estimators: Sequence[str]) -> list[dict]:
    """Rows ``{statistic, block, estimator, series, value, ci_low, ci_high}`` of one stats.json
    (typed, or its JSON object): every numeric leaf of the file's layout, generically."""
    flat = flatten_stats(Statistics.coerce(stats).to_dict())
    ci: dict[tuple, dict[str, float]] = {}
    values: dict[tuple, float] = {}
    for path, v in flat.items():
        leaf = path[-1]
        if leaf in CI_KEYS:
            parent = path[:-1]
            if path[0].endswith("_ci"):
                target = (path[0][: -len("_ci")],) + path[1:-1]
            else:
                target = next((parent + (p,) for p in PRIMARY_KEYS if parent + (p,) in flat), parent)
            ci.setdefault(target, {})[leaf] = v
            continue
        if path[0].endswith("_ci"):
            continue
        values[path] = v
    est = set(estimators)
    rows = []
    for path, v in values.items():
        e = next((p for p in path[1:] if p in est), "")
        series = ".".join("*" if p == e and e else p for p in path)
        c = ci.get(path, {})
        rows.append({"statistic": ".".join(path), "block": path[0], "estimator": e, "series": series, "value": v,
                     "ci_low": c.get("ci_low", math.nan), "ci_high": c.get("ci_high", math.nan)})
    return rows


def estimators_of(stats: Statistics | Mapping) -> list[str]:
    """Estimator names: the keys of the per-estimator blocks (``cross_answer``, ``within_answer``, ...;
    ``update_fidelity``'s selections too), in the order the file lists them."""
    st = Statistics.coerce(stats)
    names: list[str] = []
    for block in (st.cross_answer, st.cross_answer_informative, st.within_answer, st.within_group, st.update_fidelity):
        names += [k for k in block if k not in names]
    return names


#: what a run records of its model's identity: checkpoints of one model share them, other models do not
MODEL_IDENTITY = ("model_class", "model_type", "n_parameters", "tied_embeddings")


def settings_of(manifest: Mapping) -> dict[str, Any]:
    """The run's settings: ``manifest["config"]`` without :data:`IGNORED_SETTINGS`, and the model's
    identity (:data:`MODEL_IDENTITY`, where the manifest records it): runs of different models are
    flagged as different settings, never mixed (checkpoints of one model are what is compared).
    A setting an older run does not record is the default it was made with
    (:class:`~gmts_analysis.options.settings.RunSettings`), so it matches a newer run that records it."""
    cfg = manifest.get("config")
    out = {k: v for k, v in cfg.items() if k not in IGNORED_SETTINGS} if isinstance(cfg, Mapping) else {}
    if out:
        defaults = RunSettings.from_manifest(manifest)
        out.update({f.name: getattr(defaults, f.name) for f in dataclasses.fields(RunSettings)
                    if f.name not in cfg and f.name not in IGNORED_SETTINGS})
    out.update({k: manifest[k] for k in MODEL_IDENTITY if k in manifest})
    return out


def inputs_of(manifest: Mapping) -> dict[str, Any]:
    """What the run probed, by content: ``{"rollouts_sha256": ...}`` from its fingerprint (or the
    API's rollouts record), else the path as given; ``{}`` when the manifest says nothing."""
    fp = manifest.get("run_fingerprint")
    if isinstance(fp, Mapping) and fp.get("rollouts_sha256"):
        return {"rollouts_sha256": fp["rollouts_sha256"]}
    src = manifest.get("rollouts")
    if isinstance(src, Mapping) and src.get("sha256"):
        return {"rollouts_sha256": src["sha256"]}
    cfg = manifest.get("config")
    path = cfg.get("rollouts") if isinstance(cfg, Mapping) else None
    return {"rollouts": path} if path else {}


def compare_runs(paths: Sequence[str | os.PathLike]) -> Comparison:
    """Read the runs (see :func:`find_runs`) and build the comparison (module docstring)."""
    recs = _read_runs(find_runs(paths))
    by_step = _place_runs_on_x(recs)
    names = _run_names([r["dir"] for r in recs])
    sets = [settings_of(r["manifest"]) for r in recs]
    mismatches, labels = _settings_mismatches(names, sets), _settings_groups(sets)
    if mismatches:
        log.warning("compare: runs made with different settings (not mixed; groups %s): %s",
                    ", ".join(f"{n}={g}" for n, g in zip(names, labels)),
                    "; ".join(f"{m['key']}: " + ", ".join(f"{n}={v!r}" for n, v in m["values"].items())
                              for m in mismatches))
    inputs = [inputs_of(r["manifest"]) for r in recs]
    if len({_canon(i) for i in inputs}) > 1:  # an input, not a setting: expected across a training run
        log.info("compare: the runs probed different rollouts (by content): %s",
                 ", ".join(f"{n}={str(next(iter(i.values()), '?'))[:12]}" for n, i in zip(names, inputs)))
    estimators: list[str] = []
    for r in recs:
        estimators += [e for e in estimators_of(r["stats"]) if e not in estimators]
    rows = []
    runs = []
    for r, name, g, inp in zip(recs, names, labels, inputs):
        runs.append(_run_entry(r, name, g, inp))
        for row in stat_rows(r["stats"], estimators):
            rows.append({"run": name, "x": r["x"], **row, "settings": g})
    return Comparison(table=_comparison_table(rows), runs=runs, mismatches=mismatches,
                      x_label="step" if by_step else "run", estimators=estimators)


def _read_runs(dirs: Sequence[Path]) -> list[dict]:
    """Each run's stats, manifest and step (the one run without a step among checkpoints: the base, step 0)."""
    recs = []
    for i, d in enumerate(dirs):
        stats, manifest = _statistics(d), _read(d, "manifest.json")
        step, src = run_step(manifest)
        recs.append({"dir": d, "stats": stats, "manifest": manifest, "step": step, "source": src, "order": i})
    for r, step in zip(recs, base_at_step_0([r["step"] for r in recs])):
        if step != r["step"]:
            r["step"], r["source"] = step, "base model (the one run without a step)"
            log.info("compare: %s has no step; the base model of the series, step 0", r["dir"])
    return recs


def _place_runs_on_x(recs: list[dict]) -> bool:
    """Give each run its ``x`` (its step when every run has one, else its given order) and sort ``recs`` by it,
    in place; whether the axis is the step."""
    by_step = all(r["step"] is not None for r in recs)
    if not by_step and any(r["step"] is not None for r in recs):
        log.warning("compare: some runs have no step (manifest or checkpoint path); using the given order for all")
    for r in recs:
        r["x"] = r["step"] if by_step else r["order"]
        r["x_source"] = r["source"] if by_step else "order"
    recs.sort(key=lambda r: (r["x"], r["order"]))
    xs = [r["x"] for r in recs]
    if len(set(xs)) < len(xs):
        log.warning("compare: several runs share a step (%s); they are kept apart by run name",
                    sorted({x for x in xs if xs.count(x) > 1}))
    return by_step


def _settings_mismatches(names: Sequence[str], sets: Sequence[Mapping]) -> list[dict]:
    """``{key, values: {run: value}}`` of every setting whose value differs between the runs."""
    keys = sorted(set().union(*sets)) if sets else []
    mismatches = []
    for k in keys:
        vals = {n: s.get(k) for n, s in zip(names, sets)}
        if len({_canon(v) for v in vals.values()}) > 1:
            mismatches.append({"key": k, "values": vals})
    return mismatches


def _settings_groups(sets: Sequence[Mapping]) -> list[str]:
    """Each run's settings group label (``A``, ``B``, ...): runs with the same settings share one."""
    groups: dict[str, str] = {}
    labels = []
    for s in sets:
        c = _canon(s)
        if c not in groups:
            groups[c] = _group_label(len(groups))
        labels.append(groups[c])
    return labels


def _run_entry(r: dict, name: str, group: str, inputs: dict[str, Any]) -> dict:
    """The run's entry of :attr:`Comparison.runs`; a run too small to compare is warned about."""
    cfg = r["manifest"].get("config") if isinstance(r["manifest"].get("config"), Mapping) else {}
    za, meta = r["stats"].zero_advantage, r["stats"].meta
    caution = too_small_caution(r["stats"])
    entry = {"run": name, "dir": str(r["dir"]), "x": r["x"], "x_source": r["x_source"], "settings": group,
             "model": r["manifest"].get("model_path") or cfg.get("model"),
             "inputs": inputs, "too_small": caution,
             "informative_units": za.informative_units if za is not None else None,
             "units": meta.units, "min_groups": meta.min_groups}
    if caution:
        log.warning("compare: %s: %s; its values are point estimates, with no interval", name, caution)
    return entry


def _comparison_table(rows: list[dict]) -> pd.DataFrame:
    """:attr:`Comparison.table` of the rows: the :data:`COLUMNS`, ``x`` int64 and the values float64."""
    table = pd.DataFrame(rows, columns=COLUMNS)
    table["x"] = table["x"].astype("int64")
    for c in ("value", "ci_low", "ci_high"):
        table[c] = table[c].astype("float64")
    return table


def _canon(v: Any) -> str:
    import json

    return json.dumps(v, sort_keys=True, default=str)


def _group_label(i: int) -> str:
    s = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        s = chr(65 + r) + s
    return s


def _run_names(dirs: Sequence[Path]) -> list[str]:
    """Directory names, made unique with their parents when two runs share a name."""
    names = [d.name for d in dirs]
    if len(set(names)) == len(names):
        return names
    return [str(Path(d.parent.name) / d.name) if names.count(d.name) > 1 else d.name for d in dirs]


# ----------------------------------------------------------------------------- figures and files


def figure_series(table: pd.DataFrame) -> list[str]:
    """Series drawn as figures: main leaves (Spearman, mean, cosine, norm ratio, zero-advantage
    share) and top-k / waste at rho 0.05 and 0.2; never meta, by_domain, by_step or counts."""
    out = []
    for s, block in table[["series", "block"]].drop_duplicates("series").itertuples(index=False):
        if block in SKIP_BLOCKS:
            continue
        if block in ("topk_overlap", "selection_waste"):
            if s.endswith(tuple("." + r for r in FIGURE_RHOS)):
                out.append(s)
        elif s.rsplit(".", 1)[-1] in FIGURE_LEAVES:
            out.append(s)
    return out


def series_figure(table: pd.DataFrame, series: str, x_label: str, estimators: Sequence[str] | None = None,
                  too_small: Sequence[str] = ()):
    """statistic vs step (or run number) for one series: one line per estimator in its registry colour (only
    ``estimators`` when given and present, else all), markers per settings group, the 95% CI as a bar at each
    point and a band between points where stats.json has it; the points of the ``too_small`` runs hollow (no
    interval: their own summary says "Too small to compare"). A line identical to one drawn before it (the same
    value at every x) is drawn dashed with hollow square markers and labelled "identical to ...", so both show.
    x ticks sit only at the runs' x (the checkpoints; at most :data:`MAX_X_TICKS` labelled). The title wraps to
    fit the figure. A Figure (no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    xs = sorted({float(x) for x in table["x"].dropna()})  # every run's x, whether or not it has this value
    sub = table[table["series"] == series]
    shown = [e for e in (estimators or ()) if e in set(sub["estimator"])]
    left_out = sub["estimator"].nunique() - len(shown) if shown else 0
    if shown:
        sub = sub[sub["estimator"].isin(shown)]
    fig = Figure(figsize=(7.6, 3.6))  # no pyplot, no global backend switch
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    markers = "osD^vP*X"
    groups = sorted(pd.unique(sub["settings"]))
    alpha = 0.15 if sub["estimator"].nunique() <= 4 else 0.06  # many overlapping bands stay readable
    small = set(too_small)
    has_ci = False
    drawn: list[tuple[str, pd.Series]] = []
    for i, (e, d) in enumerate(sub.groupby("estimator", sort=False)):
        d = d.sort_values("x")
        values = d.set_index("x")["value"].astype(float)
        twin = next((name for name, v in drawn if _same_values(v, values)), None) if e else None
        drawn.append((e, values))
        label = (e or series) + (f" (identical to {twin})" if twin else "")
        line = ax.plot(d["x"], d["value"], "--" if twin else "-", lw=1.4 if not twin else 1.8, label=label,
                       color=score_color(e, i) if e else "black", zorder=3 if twin else 2)[0]
        colour = line.get_color()
        for gi, g in enumerate(groups):
            for hollow in (False, True):
                dg = d[(d["settings"] == g) & (d["run"].isin(small) == hollow)]
                ax.plot(dg["x"], dg["value"], "s" if twin else markers[gi % len(markers)], color=colour,
                        ms=7 if twin else 4.5, markerfacecolor="none" if twin else ("white" if hollow else colour),
                        zorder=3 if twin else 2)
        ci = d[d["ci_low"].notna() & d["ci_high"].notna()]
        if not ci.empty:
            has_ci = True
            ax.errorbar(ci["x"], ci["value"], yerr=[ci["value"] - ci["ci_low"], ci["ci_high"] - ci["value"]],
                        fmt="none", ecolor=colour, elinewidth=1.0, capsize=3, alpha=0.8)
            ax.fill_between(d["x"], d["ci_low"], d["ci_high"], color=colour, alpha=alpha, lw=0)
    title = series + ("   [MIXED SETTINGS: markers = groups " + ", ".join(groups) + "]" if len(groups) > 1 else "")
    notes = []
    if small & set(sub["run"]):
        notes.append("hollow: too small for an interval (" + ", ".join(sorted(small & set(sub["run"]))) + ")")
    if left_out:
        notes.append(f"headline estimators; {left_out} more in compare.html's table")
    ax.set_xlabel(x_label)
    _checkpoint_ticks(ax, xs)
    ax.set_ylabel("value (bars, band: 95% CI)" if has_ci else "value (no interval)")
    ax.grid(alpha=0.3)
    if sub["estimator"].astype(bool).any():
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)  # beside, never on the data
    _fitted_title(fig, ax, [title, "; ".join(notes)] if notes else [title], fontsize=9)
    return fig


#: most x tick labels a comparison figure shows (every checkpoint gets a minor tick)
MAX_X_TICKS = 12


def _same_values(a: "pd.Series", b: "pd.Series") -> bool:
    """Two lines of a figure hold the same value at every x (NaN where the other is NaN; 1e-12 apart at most)."""
    import numpy as np

    if len(a) != len(b) or list(a.index) != list(b.index) or a.isna().all():
        return False
    av, bv = a.to_numpy(float), b.to_numpy(float)
    return bool(np.array_equal(np.isnan(av), np.isnan(bv)) and np.allclose(av[~np.isnan(av)], bv[~np.isnan(bv)],
                                                                           rtol=0, atol=1e-12))


def _checkpoint_ticks(ax: Any, xs: Sequence[float]) -> None:
    """x ticks only at ``xs`` (the runs' steps or numbers): each a minor tick, at most :data:`MAX_X_TICKS` of
    them labelled (evenly picked, the first and last always); the axis spans every run, a margin either side."""
    if not xs:
        return
    major = list(xs[::math.ceil(len(xs) / MAX_X_TICKS)])
    major[-1] = xs[-1]  # the first and the last run always labelled
    ax.set_xticks(major, [f"{x:g}" for x in major])
    ax.set_xticks(xs, minor=True)
    pad = (xs[-1] - xs[0]) * 0.05 or 0.5
    ax.set_xlim(xs[0] - pad, xs[-1] + pad)


def _fitted_title(fig: Any, ax: Any, lines: Sequence[str], fontsize: float) -> None:
    """``lines`` as the axes' title, each wrapped (at spaces) until the title lies inside the figure; the layout
    made tight around it."""
    import textwrap

    width = max(len(t) for t in lines)
    renderer = fig.canvas.get_renderer()
    while True:
        text = "\n".join(textwrap.fill(t, width, break_long_words=False, break_on_hyphens=False) for t in lines)
        title = ax.set_title(text, fontsize=fontsize)
        fig.tight_layout()
        box, page = title.get_window_extent(renderer), fig.bbox
        if (box.x0 >= page.x0 and box.x1 <= page.x1 and box.y1 <= page.y1) or width <= 20:
            return
        width = max(20, int(width * 0.85))


def plot_series(table: pd.DataFrame, series: str, path: Path, x_label: str, estimators: Sequence[str] | None = None,
                too_small: Sequence[str] = ()) -> Path:
    """:func:`series_figure` written as a PNG at ``path`` (atomically)."""
    import io

    buf = io.BytesIO()
    series_figure(table, series, x_label, estimators, too_small).savefig(buf, format="png", dpi=110)
    return atomic_write_bytes(path, buf.getvalue())


def figure_name(series: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", series.replace("*", "all")).strip("_") + ".png"


def render_html(cmp: Comparison, figs: Sequence[tuple[str, Path]] = ()) -> str:
    """The self-contained compare.html (:func:`gmts_analysis.views.compare_page.render_page`)."""
    return render_page(cmp, figure_series(cmp.table), figs)


def write_comparison(cmp: Comparison, out: str | os.PathLike, figures: bool = True) -> list[Path]:
    """``compare.parquet``, ``compare.json``, ``figures/*.png`` and ``compare.html`` under ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = [atomic_write_parquet(out / "compare.parquet", cmp.table), atomic_write_json(out / "compare.json", cmp.to_json())]
    figs: list[tuple[str, Path]] = []
    if figures:
        for s in figure_series(cmp.table):
            figs.append((s, plot_series(cmp.table, s, out / "figures" / figure_name(s), cmp.x_label,
                                        cmp.figure_estimators, list(cmp.too_small))))
        written += [p for _, p in figs]
    written.append(atomic_write_text(out / "compare.html", render_html(cmp, figs)))
    return written
