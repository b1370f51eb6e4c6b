"""Every study's generated report is checked against its committed records in its home (issue 48).

Each training study is a folder under data/ with a ``plan.json`` (its ``block_tag`` names the marker
``gmts rl-report --update`` writes between). Its generated block sits on the study's page under docs/studies/
(the full report) and on docs/studies/index.md (the short one: settings and planned contrasts). Here
``gmts rl-report DIR --update PAGE INDEX`` runs on a copy of both pages: it must leave them byte for byte
as committed, and write the same ``rl_report.md`` as the one the folder holds. The SmolLM2 study's and the
toy run's summary blocks are checked in tests/test_report.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _adversarial import run_cli

ROOT = Path(__file__).resolve().parent.parent

#: (study folder, its page under docs/studies/, the plan's block tag)
STUDIES = [
    ("data/rl/referee", "referee.md", "gmts-rl-referee"),
    ("data/rl/replication", "replication.md", "gmts-rl-replication"),
    ("data/trl_study", "trl.md", "gmts-rl-trl-study"),
]


def _block(text: str, tag: str) -> tuple[str, str]:
    """``(note, body)`` of the block ``tag`` in ``text``."""
    from gmts_analysis.util.markers import block_note, find_block

    span = find_block(text, tag)
    assert span is not None, f"no {tag} block"
    _, b, c, _ = span
    return block_note(text, tag), text[b:c]


@pytest.mark.parametrize("folder,page,tag", STUDIES, ids=[s[1] for s in STUDIES])
def test_study_block_is_the_report_of_its_records(folder, page, tag, tmp_path, monkeypatch):
    from gmts_analysis.rl.arms_report import BLOCK_TAG, load_plan

    data = ROOT / folder
    assert load_plan(data / "plan.json").get("block_tag", BLOCK_TAG) == tag
    pages = [ROOT / "docs" / "studies" / page, ROOT / "docs" / "studies" / "index.md"]
    copies = []
    for i, p in enumerate(pages):
        copy = tmp_path / f"{i}-{p.name}"
        shutil.copyfile(p, copy)
        copies.append(copy)
    assert _block(pages[0].read_text(encoding="utf-8"), tag)[0] == ""  # the page: the full report
    assert _block(pages[1].read_text(encoding="utf-8"), tag)[0] == "short"  # the index: the contrasts
    out = tmp_path / "out"
    monkeypatch.chdir(ROOT)  # the report names its folder as given: data/..., as the documented command does
    rc, err = run_cli(["rl-report", folder, "--out", str(out), "--update", *map(str, copies), "-q"])
    assert rc == 0, err[-3000:]
    for p, copy in zip(pages, copies):
        assert copy.read_text(encoding="utf-8") == p.read_text(encoding="utf-8"), \
            f"{p.relative_to(ROOT)}: its {tag} block is not the report of {folder}: gmts rl-report {folder} --update " \
            f"docs/studies/{page} docs/studies/index.md"
    assert (out / "rl_report.md").read_text(encoding="utf-8") == (data / "rl_report.md").read_text(encoding="utf-8")


def test_the_check_can_fail(tmp_path, monkeypatch):
    """A page whose block differs from the records' report is rewritten, so the comparison above sees it."""
    folder, page, tag = STUDIES[1]
    from gmts_analysis.util.markers import replace_body

    text = (ROOT / "docs" / "studies" / page).read_text(encoding="utf-8")
    tampered = tmp_path / page
    tampered.write_text(replace_body(text, tag, "gmts - entropy: +0.500 (made up)"), encoding="utf-8")
    monkeypatch.chdir(ROOT)
    rc, err = run_cli(["rl-report", folder, "--out", str(tmp_path / "o"), "--update", str(tampered), "-q"])
    assert rc == 0, err[-3000:]
    assert tampered.read_text(encoding="utf-8") == text


def test_every_study_folder_has_its_home():
    """Each study folder has a README that links its page, and each page exists (issue 48 item 2)."""
    homes = {"data/smollm2_study": "smollm2.md", "data/trl_study": "trl.md", "data/rl/referee": "referee.md",
             "data/rl/replication": "replication.md", "data/rl": "toy_rl.md"}
    index = (ROOT / "docs" / "studies" / "index.md").read_text(encoding="utf-8")
    for folder, page in homes.items():
        readme = (ROOT / folder / "README.md").read_text(encoding="utf-8")
        assert f"docs/studies/{page}" in readme, folder
        assert (ROOT / "docs" / "studies" / page).is_file(), page
        assert f"]({page})" in index, page
