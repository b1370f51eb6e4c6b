"""Every notebook runs top to bottom (nbclient) against the example run, and is stored with its
outputs (notebooks/execute.py) but without execution counts or timings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXAMPLE = ROOT / "data" / "example_run"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    if (EXAMPLE / "tokens.parquet").exists():
        return EXAMPLE
    from _synthetic import make_run_dir

    return make_run_dir(tmp_path_factory.mktemp("nb") / "run", domains=("math", "logic"), n_boot=100)


def test_notebooks_present():
    names = {p.name for p in NOTEBOOKS}
    assert {"01_within_vs_cross_answer.ipynb", "02_estimators.ipynb", "03_audit_a_checkpoint.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_with_outputs_without_run_noise(path):
    """Committed with their outputs (a reader on the web sees the figures; notebooks/execute.py
    writes them), without execution counts or timings."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    for cell in code:
        assert cell.execution_count is None and "execution" not in cell.metadata, f"{path.name}: run noise stored"
        assert all(o.get("execution_count") is None for o in cell.outputs)
        assert not any(o.output_type == "error" for o in cell.outputs), f"{path.name}: stored with an error"
    assert any(c.outputs for c in code), f"{path.name}: stored without outputs (run notebooks/execute.py)"
    n_images = sum(1 for c in code for o in c.outputs if "image/png" in o.get("data", {}))
    if path.name[:3] in ("01_", "02_", "03_"):
        assert n_images >= 2, f"{path.name}: expected stored figures, got {n_images}"
    if path.name[:3] in ("01_", "02_"):
        assert "GMTS_RUN_DIR" in path.read_text()


#: images each notebook shows against the example run (its figure cells; 04: at least the final pass@1)
MIN_IMAGES = {"06_": 3, "01_": 7, "02_": 4, "03_": 2, "04_": 1, "05_": 1}


def _kernel_env(monkeypatch) -> None:
    """A fresh kernel as a user gets it: no MPLBACKEND, no %matplotlib magic, no widgets needed."""
    monkeypatch.delenv("MPLBACKEND", raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # tiny models on a shared CPU: one thread is fastest


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, run_dir, monkeypatch):
    """Each notebook runs from its own folder (notebooks/), as a user opens it, and shows its figures."""
    import nbformat
    from nbclient import NotebookClient

    _kernel_env(monkeypatch)
    if run_dir != EXAMPLE:  # no shipped example run here: point the notebooks at a synthetic one
        monkeypatch.setenv("GMTS_RUN_DIR", str(run_dir))
    else:
        monkeypatch.delenv("GMTS_RUN_DIR", raising=False)  # the notebook finds the package's example run
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    errors = [o for o in outputs if o.output_type == "error"]
    assert not errors
    stderr = "".join(o.get("text", "") for o in outputs if o.get("name") == "stderr")
    assert "IProgress" not in stderr and "TqdmWarning" not in stderr
    n_images = sum(1 for o in outputs if "image/png" in o.get("data", {}))
    want = MIN_IMAGES.get(path.name[:3], 0)
    if path.name[:3] == "04_" and not (ROOT / "data" / "rl").is_dir():
        want = 0
    assert n_images >= want, f"{path.name}: expected at least {want} figures, got {n_images}"


def test_fresh_kernel_shows_figures_and_one_line_bars(run_dir, monkeypatch, tmp_path):
    """Without %matplotlib inline, Run.figure and plots.fig_* display as PNG; a progress bar in a kernel
    without ipywidgets is one line, with no IProgress warning."""
    import nbformat
    from nbclient import NotebookClient

    _kernel_env(monkeypatch)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (
        f"import gmts_analysis as gmts\nrun = gmts.load_run({str(run_dir)!r})",
        "run.figure('within_vs_cross')",
        "from gmts_analysis.views import plots\nplots.fig_decomposition(run.stats)",
        "from gmts_analysis.util.progress import tqdm\nfor _ in tqdm(range(50), desc='work', mininterval=0): pass",
        "import transformers  # imports tqdm.auto: no IProgress warning after import gmts_analysis",
    )]
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    out = [c.outputs for c in nb.cells]
    assert not [o for os_ in out for o in os_ if o.output_type == "error"]
    for i in (1, 2):
        assert any("image/png" in o.get("data", {}) for o in out[i]), out[i]
    text = "".join(o.get("text", "") for o in out[3])
    assert "IProgress" not in text and text.count("work:") == 1 and "100%" in text, text
    assert not any("IProgress" in o.get("text", "") for os_ in out for o in os_)


NB01 = ROOT / "notebooks" / "01_within_vs_cross_answer.ipynb"


def test_within_vs_cross_notebook_opens_on_the_real_model(monkeypatch):
    """#36: notebook 01 opened on the toy run (median token probability 0.99993). It opens on the SmolLM2 study
    (stored so, and by default), with the toy run one call away: open_run(toy=True)."""
    import nbformat

    nb = nbformat.read(NB01, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    shown = "".join(o.get("text", "") for o in first.outputs if o.get("output_type") == "stream")
    assert shown.startswith("data/smollm2_study/run: 384 answers in 96 groups"), shown
    assert "LlamaForCausalLM" in shown
    assert "open_run(toy=True)" in first.source and "open_run(toy=True)" in nb.cells[0].source
    from gmts_analysis.util.resources import example_run_dir, study_run_dir

    study = study_run_dir()
    if study is None:
        pytest.skip("the repository's data/smollm2_study/run is not here")
    monkeypatch.delenv("GMTS_RUN_DIR", raising=False)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    ns: dict = {}
    exec(compile(first.source, str(NB01), "exec"), ns)  # the cell as a user runs it: the study by default
    assert ns["RUN_DIR"] == study and ns["meta"]["n_groups"] == 96
    toy_dir, toy = ns["open_run"](toy=True)
    assert toy_dir == example_run_dir() and toy.stats["meta"]["n_groups"] != 96


EXECUTE = ROOT / "notebooks" / "execute.py"
NB06 = ROOT / "notebooks" / "06_training_series.ipynb"
PILOT = ROOT / "data" / "trl_pilot_series"


def test_execute_help_and_bad_notebook():
    """Issue 46: ``notebooks/execute.py --help`` crashed with FileNotFoundError (it took --help for a notebook)."""
    import subprocess
    import sys

    ok = subprocess.run([sys.executable, str(EXECUTE), "--help"], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0 and "--out" in ok.stdout and "GMTS_SERIES_DIR" in ok.stdout, ok.stderr
    bad = subprocess.run([sys.executable, str(EXECUTE), "no_such.ipynb"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1].endswith("no_such.ipynb: no such notebook "
                                                        "(give paths such as notebooks/06_training_series.ipynb)")


def test_notebook_readme_names_every_notebook_and_its_variable():
    text = (ROOT / "notebooks" / "README.md").read_text()
    for nb in NOTEBOOKS:
        assert nb.name in text
    for var in ("GMTS_RUN_DIR", "GMTS_SERIES_DIR", "GMTS_AUDIT_MODEL", "GMTS_AUDIT_ROLLOUTS", "GMTS_RL_RESULTS"):
        assert var in text
    assert "notebooks/README.md" in (ROOT / "docs" / "training_real.md").read_text()


def _other_series(dest: Path) -> Path:
    """A series that is not the committed pilot: its copy, with mixed rewards at every step, intervals, and the
    reward audit's modal answer (what a newer, larger audit records)."""
    import json
    import shutil

    import pandas as pd

    shutil.copytree(PILOT, dest)
    (dest / "README.md").unlink()
    cmp = pd.read_parquet(dest / "compare" / "compare.parquet")
    cmp.loc[cmp["statistic"] == "zero_advantage.token_share", "value"] = 0.5
    has = cmp["value"].notna() & cmp["statistic"].str.endswith((".spearman", ".median", ".token_share"))
    cmp.loc[has, "ci_low"] = cmp.loc[has, "value"] - 0.1
    cmp.loc[has, "ci_high"] = cmp.loc[has, "value"] + 0.1
    cmp.to_parquet(dest / "compare" / "compare.parquet")
    series = json.loads((dest / "series.json").read_text())
    for c in series["checkpoints"]:
        c["modal_answer"], c["modal_answer_share"] = "12", 0.25
    (dest / "series.json").write_text(json.dumps(series))
    return dest


@pytest.mark.slow
def test_notebook_06_text_follows_the_series_it_shows(tmp_path):
    """Issue 46: notebook 06's prose described the committed pilot (its collapse, 'at step 0 no prompt got mixed
    rewards', 'no intervals') whatever series it was shown. Its markdown is now neutral and what it says about the
    series is computed; executed on another series (through ``execute.py --out``) it says that series' facts."""
    import subprocess
    import sys

    import nbformat

    if not PILOT.is_dir():
        pytest.skip("the repository's data/trl_pilot_series is not here")
    prose = "\n".join(c.source for c in nbformat.read(NB06, as_version=4).cells if c.cell_type == "markdown")
    for pilot_fact in ("64%", "boxed{8}", "At step 0 no prompt", "SmolLM2", "steps 0 and 10", "2 held-out prompts"):
        assert pilot_fact not in prose, pilot_fact
    series = _other_series(tmp_path / "my_series")
    env = {**os.environ, "GMTS_SERIES_DIR": str(series), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    done = subprocess.run([sys.executable, str(EXECUTE), str(NB06), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    nb = nbformat.read(tmp_path / "out" / NB06.name, as_version=4)
    shown = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert str(series) in shown
    assert "pilot" not in shown and "collapse to a constant answer (" not in shown
    assert "steps where no prompt got mixed rewards (correlations undefined): none" in shown
    import re

    assert re.search(r"^[1-9]\d* of \d+ values below carry a 95% interval$", shown, re.M), shown
    assert "step 0: '12' in 25%; step 10: '12' in 25%" in shown
    assert nbformat.read(NB06, as_version=4).cells[1].outputs[0]["text"].startswith("data/trl_pilot_series |")


def test_notebook_06_stored_output_names_the_pilot_caveat():
    """The committed pilot still carries its caveat, now as the output of the cell that found it is the pilot."""
    import nbformat

    first = nbformat.read(NB06, as_version=4).cells[1]
    text = "".join(o.get("text", "") for o in first.outputs)
    assert "collapse to a constant answer" in text and "no modal_answer_share" in text
