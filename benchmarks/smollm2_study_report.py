"""The SmolLM2 study's planned contrasts (docs/studies/smollm2.md section 4) under each condition.

Reads ``<study>/run/stats.json`` (rho 0.2) and ``<study>/stats_rho0.05.json``, and the same pair for the
sensitivity runs (``math/``, ``masked/``, with ``stats_rho0.05.json`` inside them), and writes
``<study>/primary.json`` and ``<study>/primary.md``. Usage::

    python benchmarks/smollm2_study_report.py data/smollm2_study
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gmts_analysis.analysis.planned import Contrast, as_dicts, family, markdown

#: the SmolLM2 study's primary family (docs/studies/smollm2.md section 4), fixed before its run
SMOLLM2_STUDY = (
    Contrast("P1", "uncertain", "cross_answer_informative", "one_minus_prob", "entropy"),
    Contrast("P2", "uncertain", "within_answer", "one_minus_prob", "entropy"),
    Contrast("P3", "", "mass_capture", "gmts", "entropy_inf", "0.2"),
    Contrast("P4", "", "mass_capture", "gmts", "entropy_inf", "0.05"),
)


def main(study: str) -> int:
    root = Path(study)
    conditions = {"primary: math_boxed": (root / "run" / "stats.json", root / "stats_rho0.05.json"),
                  "sensitivity: math (fallback)": (root / "math" / "stats.json", root / "math" / "stats_rho0.05.json"),
                  "sensitivity: truncated masked": (root / "masked" / "stats.json",
                                                    root / "masked" / "stats_rho0.05.json")}
    out, text = {}, []
    for name, (p02, p005) in conditions.items():
        if not (p02.exists() and p005.exists()):
            print(f"{name}: missing {p02 if not p02.exists() else p005}", file=sys.stderr)
            continue
        res = family({"0.2": json.loads(p02.read_text()), "0.05": json.loads(p005.read_text())}, SMOLLM2_STUDY)
        out[name] = as_dicts(res)
        text.append(markdown(res, name))
    (root / "primary.json").write_text(json.dumps(out, indent=1) + "\n")
    (root / "primary.md").write_text("\n\n".join(text) + "\n")
    print("\n\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "data/smollm2_study"))
