"""Planned contrasts of a study (gmts_analysis.analysis.planned): read from stats dicts, Holm over the family."""

import math

from gmts_analysis.analysis.planned import Contrast, family, markdown, read_contrast


def _stats(diff, lo, hi, p_le, n_boot=1000):
    e = {"diff": diff, "ci_low": lo, "ci_high": hi, "p_le_0": p_le}
    return {"meta": {"n_boot": n_boot},
            "paired_difference": {"mass_capture": {"gmts": {"entropy_inf": e}}},
            "uncertain": {"paired_difference": {"within_answer": {"one_minus_prob": {"entropy": e}}}}}


C = (Contrast("A", "", "mass_capture", "gmts", "entropy_inf", "0.2"),
     Contrast("B", "uncertain", "within_answer", "one_minus_prob", "entropy", "0.2"),
     Contrast("C", "", "mass_capture", "gmts", "entropy_inf", "0.05"))


def test_two_sided_p_and_holm_decide_what_holds():
    s02 = _stats(0.1, 0.02, 0.2, 0.01)  # p 0.02
    s005 = _stats(0.05, -0.01, 0.1, 0.2)  # p 0.4, CI straddles 0
    res = family({"0.2": s02, "0.05": s005}, C)
    assert [round(r.p, 6) for r in res] == [0.02, 0.02, 0.4]
    # Holm: sorted 0.02, 0.02, 0.4 -> 3*0.02=0.06, max(0.06, 2*0.02)=0.06, max(0.06, 0.4)=0.4
    assert [round(r.p_holm, 6) for r in res] == [0.06, 0.06, 0.4]
    assert [r.holds for r in res] == [False, False, False]
    res = family({"0.2": _stats(0.1, 0.02, 0.2, 0.001), "0.05": s005}, C)
    assert [r.holds for r in res] == [True, True, False]  # 3 * 0.002 = 0.006 < 0.05 and the CI excludes 0


def test_no_interval_is_never_a_finding():
    r = read_contrast(_stats(0.3, None, None, None), C[0])
    assert r.diff == 0.3 and r.p is None
    res = family({"0.2": _stats(0.3, None, None, None), "0.05": _stats(0.3, None, None, None)}, C)
    assert not any(r.holds for r in res) and all(r.p_holm is None for r in res)
    assert "(no interval)" in markdown(res)
    assert math.isnan(read_contrast({"meta": {}}, C[0]).diff)


def test_p_is_floored_at_one_resample():
    r = read_contrast(_stats(0.5, 0.4, 0.6, 0.0, n_boot=200), C[0])
    assert r.p == 1 / 200
