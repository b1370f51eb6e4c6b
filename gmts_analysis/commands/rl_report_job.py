"""``gmts rl-report``: what it does (declared in :mod:`gmts_analysis.commands.rl_report`)."""

from __future__ import annotations

import logging
from pathlib import Path

from gmts_analysis.commands.rl_report import MD_HEADER, OUTPUTS, RLReportOptions
from gmts_analysis.errors import GmtsError
from gmts_analysis.options.config import RunControl
from gmts_analysis.rl.arms_report import (
    BLOCK_TAG,
    GENERATOR,
    build_report,
    check_data_dir,
    load_plan,
    report_markdown,
)
from gmts_analysis.rl.plots import FOREST_TITLE, plot_forest
from gmts_analysis.util.io import atomic_write_json, atomic_write_text, check_output_file, read_json, require_regular
from gmts_analysis.util.markers import block_markers, block_note, find_block, replace_body
from gmts_analysis.views.figures import CREATOR, png_metadata


def _is_report_json(path) -> bool:
    j = read_json(path)
    return isinstance(j, dict) and j.get("generator") == GENERATOR


def _is_report_md(path) -> bool:
    with open(path, encoding="utf-8") as f:
        return f.readline().rstrip("\n") == MD_HEADER


def _is_forest_png(path) -> bool:
    meta = png_metadata(path)
    return meta.get("Creator") == CREATOR and meta.get("Title") == FOREST_TITLE


def _check_targets(out, update, tag) -> dict:
    """Refuse, before any work: an output file of ours' name that gmts rl-report did not write, and an
    --update file that is a link, unreadable, or without the markers of ``tag`` (the plan's ``block_tag``,
    default ``gmts-rl-referee``). Returns ``{path: text}`` of the --update files."""
    for name, ours in zip(OUTPUTS, (_is_report_json, _is_report_md, _is_forest_png)):
        check_output_file(out / name, "--out", ours, overwrite=None)
    texts = {}
    begin, end = block_markers(tag)
    for f in update or []:
        p = Path(f)
        if p.is_symlink():
            raise GmtsError(f"--update {f}: is a symbolic link; give the file itself")
        require_regular(p, f"--update {f}")
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise GmtsError(f"--update {f}: not UTF-8 text") from None
        if find_block(text, tag) is None:
            raise GmtsError(f"--update {f}: no {begin} --> ... {end} markers; add them where the report goes")
        texts[p] = text
    return texts


def rl_report(data_dir: str, opts: RLReportOptions, control: RunControl) -> int:
    """Analyse ``data_dir`` (:mod:`gmts_analysis.commands.rl_report`): write the report files, rewrite the --update blocks."""
    log = logging.getLogger("gmts")
    data = check_data_dir(data_dir)
    out = Path(opts.out) if opts.out is not None else data
    if out.exists() and not out.is_dir():
        raise GmtsError(f"--out {out}: is a file; give a directory")
    plan_path = Path(opts.plan) if opts.plan is not None else data / "plan.json"
    tag = load_plan(plan_path).get("block_tag", BLOCK_TAG)
    texts = _check_targets(out, opts.update, tag)
    report = build_report(data, opts.plan)
    body = report_markdown(report)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / OUTPUTS[0], report)
    title = report["plan"].get("title") or "Training arms compared over seeds"
    atomic_write_text(out / OUTPUTS[1], f"{MD_HEADER}\n# {title}\n\n{body}")
    plot_forest(report, out / OUTPUTS[2])
    log.info("wrote %s", ", ".join(str(out / n) for n in OUTPUTS))
    notes = {p: block_note(text, tag) for p, text in texts.items()}  # "short": the contrasts only
    short_body = report_markdown(report, short=True) if "short" in notes.values() else ""
    for p, text in texts.items():
        atomic_write_text(p, replace_body(text, tag, short_body if notes[p] == "short" else body))
        log.info("updated the generated block of %s", p)
    for s in report["settings"]:
        if s["status"] == "cut":
            log.warning("%s: cut (%d of %d runs found); not reported", s["name"], s["n_runs_found"],
                        s["n_runs_expected"])
        else:
            log.info("%s: complete (%d runs)", s["name"], s["n_runs_found"])
    for r in report["contrasts"]:
        if not r["expanded"]:
            log.info("  %s", r["sentence"] if r["status"] == "reported"
                     else f"{r['a']} - {r['b']} ({r['setting']}, {r['family']}): not reported, the setting is cut")
    return 0
