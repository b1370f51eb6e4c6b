"""token_strings: gradient mass and selections per token string, checked by an explicit loop."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from _synthetic import make_tables

from gmts_analysis.analysis.token_strings import COLUMNS, token_strings_table, write_token_strings
from gmts_analysis.errors import GmtsError
from gmts_analysis.views.plots_tokens import fig_token_strings


@pytest.fixture(scope="module")
def tokens():
    t, _ = make_tables(n_groups=6, group_size=4, seed=5, domains=("math", "logic"))
    # few distinct strings so that strings repeat
    t["token"] = np.array(list("abcdefg"))[np.arange(len(t)) % 7]
    return t


def _top_set(t: pd.DataFrame, col: str, rho: float) -> set:
    """Explicit top-ceil(rho n) by col over the whole table, ties by (answer_id, position)."""
    k = math.ceil(rho * len(t) - 1e-9)
    rows = sorted(range(len(t)), key=lambda i: (-t[col].iloc[i], t["answer_id"].iloc[i], t["position"].iloc[i]))
    return set(rows[:k])


@pytest.mark.parametrize("rho", [0.2, 0.1])
def test_matches_explicit_loop(tokens, rho):
    tab = token_strings_table(tokens, rho)
    assert list(tab.columns) == list(COLUMNS)
    assert list(dict.fromkeys(tab["slice"])) == ["all", "logic", "math"]
    sel = {k: _top_set(tokens, c, rho) for k, c in (("entropy", "entropy"), ("gmts", "gmts"), ("oracle", "grad_norm"))}
    for name in ("all", "logic", "math"):
        rows = [i for i in range(len(tokens)) if name == "all" or tokens["domain"].iloc[i] == name]
        total = sum(tokens["grad_norm"].iloc[i] for i in rows)
        s = tab[tab["slice"] == name].set_index("token")
        assert s["grad_mass"].is_monotonic_decreasing
        for string in "abcdefg":
            mine = [i for i in rows if tokens["token"].iloc[i] == string]
            r = s.loc[string]
            assert r["count"] == len(mine)
            assert r["grad_mass"] == pytest.approx(sum(tokens["grad_norm"].iloc[i] for i in mine), rel=1e-12)
            assert r["grad_mass_share"] == pytest.approx(r["grad_mass"] / total, rel=1e-12)
            for k in ("entropy", "gmts", "oracle"):
                n_sel_slice = sum(1 for i in rows if i in sel[k])
                assert r[f"kept_{k}"] == sum(1 for i in mine if i in sel[k])
                assert r[f"kept_{k}_share"] == pytest.approx(r[f"kept_{k}"] / n_sel_slice, rel=1e-12)
        assert s["grad_mass_share"].sum() == pytest.approx(1.0)


def test_write_and_figure(tokens, tmp_path):
    p = write_token_strings(tmp_path, tokens, 0.2)
    back = pd.read_csv(p, keep_default_na=False)
    assert len(back) == len(token_strings_table(tokens)) and set(back["slice"]) == {"all", "logic", "math"}
    fig = fig_token_strings(tokens)
    assert fig is not None and len(fig.axes) == 3 * 3


def test_no_grad_norm(tokens, tmp_path):
    t = tokens.assign(grad_norm=np.nan)
    with pytest.raises(GmtsError, match="grad_norm"):
        token_strings_table(t)
    assert write_token_strings(tmp_path, t) is None and fig_token_strings(t) is None


def test_rendered_with_the_run(tmp_path):
    """The run's figures include token_strings (at the run's rho), and a run directory written by
    finalize has token_strings.csv."""
    from _synthetic import make_tables

    from gmts_analysis.analysis.runs import RunTables
    from gmts_analysis.analysis.stats import compute_stats
    from gmts_analysis.run.finalize import write_run_dir

    t, a = make_tables(n_groups=3, group_size=4, seed=2, domains=("math", "logic"))
    stats = compute_stats(t, a, n_boot=0, rho=0.1)
    run = RunTables(tokens=t, answers=a, stats=stats, manifest={"config": {"rho": 0.1}})
    out = write_run_dir(run, tmp_path / "run", figures=True)
    back = pd.read_csv(out / "token_strings.csv", keep_default_na=False)
    expect = token_strings_table(t, 0.1)
    assert back["kept_gmts"].tolist() == expect["kept_gmts"].tolist()
    assert (out / "figures" / "token_strings.png").exists()
    assert "token_strings" in (out / "report.html").read_text(encoding="utf-8")


def test_one_domain_draws_one_row_named_by_its_domain():
    """The "all" row and the only domain's row were the same bars drawn twice (issue #31)."""
    tokens, _ = make_tables(n_groups=3, group_size=3, seed=5, domains=("logic",))
    fig = fig_token_strings(tokens)
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert len(fig.axes) == 3 and all(t.startswith("logic:") for t in titles), titles
    two, _ = make_tables(n_groups=4, group_size=3, seed=5, domains=("x", "y"))
    assert [ax.get_title(loc="left").split(":")[0] for ax in fig_token_strings(two).axes[::3]] == ["all", "x", "y"]
