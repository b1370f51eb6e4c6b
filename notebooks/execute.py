"""Execute every notebook against the example run and store its outputs, stripped of what changes per run.

From the repository root::

    python notebooks/execute.py [NOTEBOOK ...]

Runs each notebook top to bottom with nbclient (the environment of tests/test_notebooks.py:
``GMTS_RUN_DIR=data/example_run``, or the run a notebook opens on by default (:data:`RUN_DIRS`: 01 the SmolLM2
study), one thread, the inline matplotlib backend) and writes it back
with its outputs, so a reader on the web sees the tables and figures without running anything.
Stripped: execution counts, per-cell execution timings and other metadata nbclient adds, and
stderr streams (progress bars, warnings with local paths), so that
re-executing an unchanged notebook on an unchanged run changes nothing but what the code prints.
"""

from __future__ import annotations

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


def execute(path: Path) -> None:
    import nbformat
    from nbclient import NotebookClient

    env = {"GMTS_RUN_DIR": RUN_DIRS.get(path.name, "data/example_run"),  # relative to ROOT, the kernel's working
           # directory: no local path stored
           "MPLBACKEND": "module://matplotlib_inline.backend_inline",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    os.environ.update(env)
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    strip(nb)
    tmp = path.with_suffix(".ipynb.tmp")
    nbformat.write(nb, tmp)
    os.replace(tmp, path)


if __name__ == "__main__":
    paths = [Path(p) for p in sys.argv[1:]] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    for p in paths:
        print(f"executing {p.name}", file=sys.stderr, flush=True)
        execute(p)
