"""The domain of a keep fraction rho, (0, 1], is checked by one function (core.vocabulary.check_rho)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

import gmts_analysis
from gmts_analysis.core.vocabulary import check_rho
from gmts_analysis.errors import GmtsError


def test_check_rho_domain_and_messages():
    assert check_rho(1) == 1.0 and check_rho("0.25") == 0.25 and check_rho(1e-9) == 1e-9
    for bad in (0, 0.0, -0.1, 1.0000001, math.inf, math.nan):
        with pytest.raises(ValueError, match=r"^selection_rho must be in \(0, 1\], got "):
            check_rho(bad, "selection_rho")
    with pytest.raises(GmtsError, match=r"^--rho must be a number in \(0, 1\], got 'x'$"):
        check_rho("x", "--rho", error=GmtsError)


def test_no_other_module_restates_the_rho_domain():
    """Only check_rho states it (core/vocabulary.py). options/checks.rho, the check of the command-line options,
    keeps its own wording ("--x: must be a keep fraction in (0, 1]", a contract of tests/test_cli_doc.py)."""
    pkg = Path(gmts_analysis.__file__).parent
    pattern = re.compile(r"0(\.0)?\s*<\s*[\w.()\[\]]*rho[\w.()\[\]]*\s*<=\s*1")
    found = sorted(str(p.relative_to(pkg)) for p in pkg.rglob("*.py") if pattern.search(p.read_text(encoding="utf-8")))
    assert found == ["core/vocabulary.py"], found
