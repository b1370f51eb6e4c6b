"""Execute every notebook against the example run and store its outputs, stripped of what changes per run.

From the repository root::

    python notebooks/execute.py [NOTEBOOK ...]
    GMTS_SERIES_DIR=my_series python notebooks/execute.py notebooks/06_training_series.ipynb --out my_notebooks

Without ``--out`` it refreshes the committed notebooks in place, on the shipped runs. With ``--out DIR`` it
runs them on what the environment names (``GMTS_RUN_DIR``, ``GMTS_SERIES_DIR``, ... : notebooks/README.md)
and writes the executed copies into DIR, leaving the committed ones alone.

Runs each notebook top to bottom with nbclient (the environment of tests/test_notebooks.py:
``GMTS_RUN_DIR=data/example_run``, or the run a notebook opens on by default (:data:`RUN_DIRS`: 01 the SmolLM2
study), one thread, the inline matplotlib backend) and writes it back
with its outputs, so a reader on the web sees the tables and figures without running anything.
Stripped: execution counts, per-cell execution timings and other metadata nbclient adds, and
stderr streams (progress bars, warnings with local paths), so that
re-executing an unchanged notebook on an unchanged run changes nothing but what the code prints.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the run each notebook is stored with (relative to ROOT: no local path stored); default data/example_run
RUN_DIRS = {"01_within_vs_cross_answer.ipynb": "data/smollm2_study/run"}


def strip(nb) -> None:
    """Drop what changes from one execution to the next (in place)."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.execution_count = None
        for k in ("execution", "collapsed", "scrolled"):
            cell.metadata.pop(k, None)
        # stderr (progress bars, warnings naming local paths) is run noise, not a result
        cell.outputs = [o for o in cell.outputs if not (o.get("output_type") == "stream" and o.get("name") == "stderr")]
        for out in cell.outputs:
            if "execution_count" in out:
                out["execution_count"] = None
            out.get("metadata", {}).pop("execution", None)
    for k in ("widgets",):
        nb.metadata.pop(k, None)


def execute(path: Path, out: "Path | None" = None) -> Path:
    """Run ``path`` top to bottom and write it with its outputs: back in place on the shipped runs (``out``
    None), or into the folder ``out`` on the runs the environment names. Returns the path written."""
    import nbformat
    from nbclient import NotebookClient

    env = {"MPLBACKEND": "module://matplotlib_inline.backend_inline",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1") if out else "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    if out is not None:  # a relative path the user set means from where they ran this, not from ROOT
        for name in ("GMTS_RUN_DIR", "GMTS_SERIES_DIR", "GMTS_AUDIT_MODEL", "GMTS_AUDIT_ROLLOUTS", "GMTS_RL_RESULTS"):
            if os.environ.get(name):  # a model name such as "tiny" is no path here: kept as it is
                env[name] = ",".join(os.path.abspath(v) if os.path.exists(v) else v
                                     for v in os.environ[name].split(","))
    if out is None:  # the committed outputs: the shipped runs, relative to ROOT (the kernel's working directory)
        env["GMTS_RUN_DIR"] = RUN_DIRS.get(path.name, "data/example_run")
        os.environ.pop("GMTS_SERIES_DIR", None)
    os.environ.update(env)
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    strip(nb)
    target = path if out is None else out / path.name
    tmp = target.with_suffix(".ipynb.tmp")
    nbformat.write(nb, tmp)
    os.replace(tmp, target)
    return target


def parse_args(argv: "list[str] | None" = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python notebooks/execute.py",
        description="Execute the notebooks top to bottom and store them with their outputs. Without --out: "
                    "the committed notebooks, refreshed in place on the shipped runs. With --out: executed copies "
                    "on your own run or series (set GMTS_RUN_DIR, GMTS_SERIES_DIR, ...: notebooks/README.md).")
    p.add_argument("notebooks", nargs="*", metavar="NOTEBOOK",
                   help="notebook files to execute (default: every notebooks/*.ipynb)")
    p.add_argument("--out", metavar="DIR", type=Path, default=None,
                   help="write the executed notebooks into DIR (created), on the runs the environment names, "
                        "instead of overwriting the committed ones")
    args = p.parse_args(argv)
    for name in args.notebooks:
        if not Path(name).is_file():
            p.error(f"{name}: no such notebook (give paths such as notebooks/06_training_series.ipynb)")
    return args


def main(argv: "list[str] | None" = None) -> int:
    args = parse_args(argv)
    paths = [Path(p).resolve() for p in args.notebooks] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        args.out = args.out.resolve()
    for p in paths:
        print(f"executing {p.name}", file=sys.stderr, flush=True)
        written = execute(p, args.out)
        print(f"wrote {written}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
