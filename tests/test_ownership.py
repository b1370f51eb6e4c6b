"""Reliability, second pass (issue 22): ownership by content, never by name; replace, don't
pre-empty; every writer checks its target; known system errors in plain words."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest
from _adversarial import assert_one_line_error, assert_untouched, probe, run_cli, snapshot
from _sharding_helpers import write_rollouts

from gmts_analysis.run.sharding import state
from gmts_analysis.util import io as gio


@pytest.fixture(scope="module")
def model_dir(tiny_model_dirs):
    return tiny_model_dirs["qwen2"]


@pytest.fixture
def rollouts(tmp_path):
    return write_rollouts(tmp_path / "r.jsonl", sizes=(2, 3))


def _plant(d: Path) -> Path:
    """A directory of the user's with a file and a run-like file in it."""
    d.mkdir()
    (d / "thesis.tex").write_text("years of work")
    (d / "tokens.parquet").write_bytes(b"not ours")
    return d


LOOKALIKES = (".run.AbCd1234.partial", ".run.gmts-old-deadbeef", ".run.old-77", ".run.gmts-work",
              ".run.gmts-next", ".run.gmts-sample")


# ---------------------------------------------------------------- 1. ownership by content


def test_ownership_by_content_lookalike_siblings_are_left_alone(model_dir, rollouts, tmp_path):
    """Directories whose names look like our staging, backup, work or sampling areas, without our
    marker, are neither removed, restored nor moved, whether --out is absent, finished or replaced."""
    for name in LOOKALIKES:
        _plant(tmp_path / name)
    out = tmp_path / "run"
    before = snapshot(tmp_path, skip=out)
    assert run_cli(probe(model_dir, rollouts, out))[0] == 0  # --out absent: nothing is "restored" into it
    assert (out / "manifest.json").is_file() and not (out / "thesis.tex").exists()
    assert_untouched(before, snapshot(tmp_path, skip=out))
    rc, err = run_cli(probe(model_dir, rollouts, out, "--overwrite", "--temperature", "0.5"))
    assert rc == 0, err
    assert_untouched(before, snapshot(tmp_path, skip=out))
    rc, err = run_cli(probe(model_dir, rollouts, out))  # a different configuration: refused, nothing moved
    assert rc == 2
    assert_untouched(before, snapshot(tmp_path, skip=out))


def test_ownership_by_content_work_area_lookalike_is_not_moved_into_out(model_dir, rollouts, tmp_path):
    out = tmp_path / "run"
    work = _plant(state.work_area_sibling(out))
    (work / "run.json").write_text('{"format": "gmts-run-state/1", "run_hash": "x"}')
    before = snapshot(tmp_path, skip=out)
    state.recover_work_area(out)
    assert not out.exists()
    assert_untouched(before, snapshot(tmp_path, skip=out))


def test_ownership_by_content_marker_of_another_out_or_role_is_not_ours(tmp_path):
    d = tmp_path / ".run.AbCd1234.partial"
    d.mkdir()
    gio.mark_ours(d, "staging", tmp_path / "other")
    assert not gio.is_ours(d, "staging", tmp_path / "run")
    assert not gio.is_ours(d, "backup", tmp_path / "other")
    assert gio.is_ours(d, "staging", tmp_path / "other")
    (tmp_path / "link").symlink_to(d)
    assert not gio.is_ours(tmp_path / "link", "staging", tmp_path / "other")  # a link is never ours
    assert gio.clean_stale_siblings(tmp_path / "run") == [] and d.is_dir()


@pytest.mark.parametrize("kind", ["symlink", "user_file", "hardlink", "fifo", "dangling"])
def test_ownership_by_content_lock_is_never_opened_through_what_we_did_not_create(model_dir, rollouts, tmp_path,
                                                                                   kind):
    """A link, a user's file or a FIFO at the lock's name: refused in one line, the user's bytes kept."""
    out = tmp_path / "run"
    victim = tmp_path / "precious.txt"
    victim.write_bytes(b"the user's own bytes\n")
    lock = gio.lock_path(out)
    if kind == "symlink":
        lock.symlink_to(victim)
    elif kind == "user_file":
        lock.write_bytes(b"my notes, not a lock\n")
    elif kind == "hardlink":
        os.link(victim, lock)
    elif kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.symlink_to(tmp_path / "created-through-the-link")
    def snap():  # a FIFO is not read (that would block): its kind is checked instead
        return {"fifo": stat.S_ISFIFO(os.lstat(lock).st_mode)} if kind == "fifo" else snapshot(tmp_path)
    before = snap()
    assert_one_line_error(*run_cli(probe(model_dir, rollouts, out)), "not a gmts lock file")
    assert snap() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([lock.name, "precious.txt", "r.jsonl"])
    assert victim.read_bytes() == b"the user's own bytes\n"
    assert not (tmp_path / "created-through-the-link").exists()


def test_ownership_by_content_a_lock_left_by_a_killed_job_is_reused(tmp_path):
    out = tmp_path / "run"
    lock = gio.lock_path(out)
    lock.write_bytes(gio.LOCK_MAGIC + b"pid 1 on elsewhere")  # killed: the kernel released its flock
    with gio.exclusive_lock(out):
        assert lock.read_bytes().startswith(gio.LOCK_MAGIC + f"pid {os.getpid()}".encode())
    assert not lock.exists()
    lock.write_bytes(b"")  # killed between creating and writing it
    with gio.exclusive_lock(out):
        pass


def test_ownership_by_content_finished_run_lists_its_files(model_dir, rollouts, tmp_path):
    out = tmp_path / "run"
    assert run_cli(probe(model_dir, rollouts, out))[0] == 0
    import json

    listed = set(json.loads((out / gio.RUN_LISTING).read_text()))
    assert listed == {p.name for p in out.iterdir()} - {gio.RUN_LISTING}
    assert not (out / gio.OWNER_MARKER).exists()  # the staging marker does not survive into the run
    (out / "my_notes.md").write_text("mine")  # a file added by the user makes the run not only ours
    assert_one_line_error(*run_cli(probe(model_dir, rollouts, out, "--overwrite")), "did not write", "my_notes.md")


# ---------------------------------------------------------------- 2. replace, don't pre-empty


def _fail(exc: BaseException):
    def boom(*a, **k):
        raise exc
    return boom


@pytest.mark.parametrize("where", ["stats", "figures", "manifest", "swap"])
def test_replace_dont_pre_empty_a_late_failure_keeps_the_old_run(model_dir, rollouts, tmp_path, monkeypatch,
                                                                  where):
    """--overwrite: a disk-full error while the new run's stats, figures or manifest are written, or
    at the swap itself, leaves the previous run byte for byte, and no directory of ours beside it
    but the resumable replacement."""
    out = tmp_path / "run"
    assert run_cli(probe(model_dir, rollouts, out))[0] == 0
    before = snapshot(tmp_path)
    enospc = OSError(errno.ENOSPC, "No space left on device", str(out / "x"))
    if where == "stats":
        monkeypatch.setattr("gmts_analysis.analysis.stats.write_stats", _fail(enospc))
        extra = ()
    elif where == "figures":
        monkeypatch.setattr("gmts_analysis.views.figures.render_all", _fail(enospc))
        extra = ("figures",)
    elif where == "manifest":
        real = gio.atomic_write_json

        def full_on_manifest(path, obj):
            if Path(path).name == "manifest.json":
                raise enospc
            return real(path, obj)
        monkeypatch.setattr(gio, "atomic_write_json", full_on_manifest)
        extra = ()
    else:
        real_replace = os.replace

        def full_on_swap(a, b):
            if Path(b) == out and ".partial" in Path(a).name:
                raise enospc
            return real_replace(a, b)
        monkeypatch.setattr(gio.os, "replace", full_on_swap)
        extra = ()
    argv = probe(model_dir, rollouts, out, "--overwrite", "--temperature", "0.5")
    if "figures" in extra:
        argv.remove("--no-figures")
    line = assert_one_line_error(*run_cli(argv), "no space left")
    assert "unexpected" not in line
    after = snapshot(tmp_path)
    next_area = state.replacement_area(out).name
    assert {k: v for k, v in after.items() if not k.startswith(next_area)} == before
    monkeypatch.undo()
    # the same command again finishes the replacement (resumed from its chunk records)
    rc, err = run_cli(probe(model_dir, rollouts, out, "--overwrite", "--temperature", "0.5"))
    assert rc == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl", "run"]
    import json

    assert json.loads((out / "manifest.json").read_text())["config"]["temperature"] == 0.5


def test_replace_dont_pre_empty_the_old_run_is_in_place_while_the_new_one_is_probed(model_dir, rollouts, tmp_path,
                                                                                   monkeypatch):
    out = tmp_path / "run"
    assert run_cli(probe(model_dir, rollouts, out))[0] == 0
    before = snapshot(out)
    monkeypatch.setenv("GMTS_TEST_FAIL_AFTER_CHUNKS", "1")
    assert_one_line_error(*run_cli(probe(model_dir, rollouts, out, "--overwrite", "--seed", "3",
                                         "--answers-per-chunk", "1")), "InjectedFailure")
    assert snapshot(out) == before
    assert gio.is_ours(state.replacement_area(out), "next", out)
    monkeypatch.delenv("GMTS_TEST_FAIL_AFTER_CHUNKS")
    # without --overwrite the finished run is what --out holds: a different configuration is refused
    assert_one_line_error(*run_cli(probe(model_dir, rollouts, out, "--seed", "3", "--answers-per-chunk", "1")),
                          "--seed 0 -> 3")
    assert snapshot(out) == before


def test_replace_dont_pre_empty_staged_directory_of_a_policy(tmp_path, monkeypatch):
    out = tmp_path / "pol"
    with gio.staged_directory(out, kind="policy") as d:
        (d / "config.json").write_text("{}")
        (d / "card.json").write_text("{}")
    before = snapshot(out)
    with pytest.raises(OSError), gio.staged_directory(out, overwrite=True, kind="policy") as d:
        (d / "config.json").write_text('{"new": 1}')
        raise OSError(errno.ENOSPC, "No space left on device")
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pol"]


# ---------------------------------------------------------------- 8. known system errors in plain words


def test_known_os_errors_are_plain_messages(model_dir, rollouts, tmp_path, monkeypatch):
    from gmts_analysis.cli import os_error_message

    assert os_error_message(OSError(errno.ENOSPC, "x", "/d/f")) .startswith("/d/f: no space left")
    assert os_error_message(OSError(errno.EACCES, "x", "/d/f")) == "/d/f: permission denied"
    assert os_error_message(OSError(errno.EBADF, "x")) is None
    monkeypatch.setattr("gmts_analysis.analysis.stats.write_stats",
                        _fail(PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "run" / "x"))))
    line = assert_one_line_error(*run_cli(probe(model_dir, rollouts, tmp_path / "run")), "permission denied")
    assert "unexpected" not in line
    assert not (tmp_path / "run" / "manifest.json").exists()  # the work area is back, resumable
    assert (tmp_path / "run" / "run.json").is_file()


# ---------------------------------------------------------------- 5. every writer checks its target


@pytest.fixture(scope="module")
def finished(tmp_path_factory, model_dir):
    d = tmp_path_factory.mktemp("fin")
    r = write_rollouts(d / "r.jsonl", sizes=(2, 3))
    assert run_cli(probe(model_dir, r, d / "run"))[0] == 0
    return d / "run"


def _copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_every_writer_checks_its_target_stats_out_writes_only_the_named_file(finished, tmp_path):
    run = _copy_run(finished, tmp_path / "run")
    (tmp_path / "estimators.csv").write_text("the user's own table")
    before = snapshot(tmp_path)
    assert run_cli(["stats", str(run), "--out", str(tmp_path / "s.json"), "--n-boot", "10", "-q"])[0] == 0
    after = snapshot(tmp_path)
    assert set(after) - set(before) == {"s.json"}
    assert {k: after[k] for k in before} == before  # no sibling estimators.csv, nothing else changed
    # a second time: the file is ours (a stats JSON), replaced
    assert run_cli(["stats", str(run), "--out", str(tmp_path / "s.json"), "--n-boot", "10", "-q"])[0] == 0
    # a file of the user's: refused without --overwrite, bytes kept
    (tmp_path / "notes.json").write_text('{"mine": 1}')
    before = snapshot(tmp_path)
    assert_one_line_error(*run_cli(["stats", str(run), "--out", str(tmp_path / "notes.json"), "-q"]),
                          "not written by gmts", "--overwrite")
    assert_one_line_error(*run_cli(["stats", str(run), "--out", str(run / "manifest.json"), "--overwrite", "-q"]),
                          "same file")
    assert_untouched(before, snapshot(tmp_path))
    assert run_cli(["stats", str(run), "--out", str(tmp_path / "notes.json"), "--overwrite", "--n-boot", "10",
                    "-q"])[0] == 0


def test_every_writer_checks_its_target_sample_out_is_never_prompts(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "What is 2+2?", "answer": "4"}\n')
    before = snapshot(tmp_path)
    for extra in ((), ("--overwrite",)):
        assert_one_line_error(*run_cli(["sample", "--model", "tiny", "--prompts", str(prompts), "--out", str(prompts),
                                        "--device", "cpu", "-q", *extra]), "same file", "--prompts")
    (tmp_path / "mine.jsonl").write_text('{"a": 1}\n')
    before = snapshot(tmp_path)
    assert_one_line_error(*run_cli(["sample", "--model", "tiny", "--domains", "arithmetic", "--num-prompts", "1",
                                    "--out", str(tmp_path / "mine.jsonl"), "--device", "cpu", "-q"]),
                          "not written by gmts")
    assert_untouched(before, snapshot(tmp_path))


def test_every_writer_checks_its_target_compare_out_over_user_files(finished, tmp_path):
    a, b = _copy_run(finished, tmp_path / "a"), _copy_run(finished, tmp_path / "b")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "compare.html").write_text("my page")
    (mine / "paper.tex").write_text("mine")
    before = snapshot(tmp_path)
    assert_one_line_error(*run_cli(["compare", str(a), str(b), "--out", str(mine), "--no-figures", "-q"]),
                          "did not write", "paper.tex")
    assert_untouched(before, snapshot(tmp_path))
    out = tmp_path / "cmp"
    for extra in ([], ["--overwrite"]):  # a comparison of ours is replaced whole, with --overwrite
        assert run_cli(["compare", str(a), str(b), "--out", str(out), "--no-figures", "-q", *extra])[0] == 0
    assert (out / "compare.json").is_file() and sorted(p.name for p in tmp_path.iterdir()) == [
        "a", "b", "cmp", "mine"]


def test_every_writer_checks_its_target_figures_to_a_dir_of_user_files(finished, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "holiday.png").write_bytes(b"\x89PNG mine")
    before = snapshot(tmp_path)
    assert_one_line_error(*run_cli(["figures", str(finished), "--to", str(mine), "-q"]), "did not write", "holiday.png")
    assert_untouched(before, snapshot(tmp_path))


def test_figures_to_a_folder_of_ours_replace_only_proven_figures_and_leave_the_rest(finished, tmp_path):
    """A folder gmts drew into (the repository's figures/, with its README and RL figures beside) takes
    new figures; a figure-named file gmts cannot prove it wrote is never replaced; other files stay."""
    figs = tmp_path / "figs"
    assert run_cli(["figures", str(finished), "--to", str(figs), "-q"])[0] == 0
    (figs / "README.md").write_text("notes of mine")
    (figs / "rl_curves.png").write_bytes(b"\x89PNG of mine")
    assert run_cli(["figures", str(finished), "--to", str(figs), "-q"])[0] == 0  # drawn again in place
    assert (figs / "README.md").read_text() == "notes of mine"
    assert (figs / "rl_curves.png").read_bytes() == b"\x89PNG of mine"
    (figs / "estimators.png").write_bytes(b"\x89PNG a user's estimators figure")
    before = snapshot(tmp_path)
    assert_one_line_error(*run_cli(["figures", str(finished), "--to", str(figs), "-q"]),
                          "estimators.png was not written by gmts")
    assert_untouched(before, snapshot(tmp_path))


def test_every_writer_checks_its_target_api_save_refuses_a_directory_not_ours(finished, tmp_path):
    import gmts_analysis as gmts
    from gmts_analysis.errors import GmtsError

    run = gmts.load_run(finished)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("mine")
    before = snapshot(tmp_path)
    for overwrite in (False, True):
        with pytest.raises(GmtsError, match="did not write"):
            run.save(mine, figures=False, overwrite=overwrite)
    assert_untouched(before, snapshot(tmp_path))


# ---------------------------------------------------------------- 8. the smaller points


def test_smaller_points_compare_dir_skips_hidden_staging_directories(finished, tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    _copy_run(finished, root / "r1")
    _copy_run(finished, root / "r2")
    _copy_run(finished, root / ".r3.AbCd1234.partial")  # a job's staging area, not a run of the series
    from gmts_analysis.views.compare import compare_runs

    cmp = compare_runs([str(root)])
    assert len(cmp.runs) == 2


def test_smaller_points_tampered_stats_json_names_the_file(finished, tmp_path):
    import gmts_analysis as gmts
    from gmts_analysis.errors import GmtsError

    run_dir = _copy_run(finished, tmp_path / "run")
    import json

    stats = json.loads((run_dir / "stats.json").read_text())
    stats["meta"]["n_tokens"] = "many"
    stats["headline"] = [1, 2]
    (run_dir / "stats.json").write_text(json.dumps(stats))
    run = gmts.load_run(run_dir)
    with pytest.raises(GmtsError, match="stats.json"):
        run.report()


def test_every_writer_checks_its_target_rl_out_and_its_runs_directory(tmp_path, monkeypatch):
    def no_model(*a, **k):
        raise AssertionError("training started before the target was checked")

    monkeypatch.setattr("gmts_analysis.readers.models.load_model", no_model)
    mine = tmp_path / "mine.json"
    mine.write_text('{"my": "results"}')
    (tmp_path / "exp.runs").mkdir()
    (tmp_path / "exp.runs" / "draft.tex").write_text("mine")
    before = snapshot(tmp_path)
    base = ["rl", "--model", "tiny", "--max-steps", "1", "--device", "cpu", "--figures", "none", "-q"]
    line = assert_one_line_error(*run_cli([*base, "--out", str(mine)]), "not written by gmts")
    assert "--overwrite" not in line  # gmts rl has none
    assert_one_line_error(*run_cli([*base, "--out", str(tmp_path / "exp.json")]), "did not write", "draft.tex")
    assert_untouched(before, snapshot(tmp_path))
