"""Paired contrasts over seeds: the tests of a difference ``a_s - b_s`` measured on the same seeds.

- :func:`paired_t`: mean, SD (ddof 1), 95% t confidence interval and two-sided paired t-test p;
- :func:`sign_test`: exact two-sided sign test (zero differences dropped);
- :func:`wilcoxon_signed_rank`: two-sided Wilcoxon signed-rank p (zeros dropped, tied magnitudes
  given their average rank), exact from the permutation distribution up to :data:`WILCOXON_EXACT_MAX`
  non-zero differences, normal approximation with the tie correction beyond;
- :func:`holm`: Holm's step-down adjustment of a family of p-values;
- :func:`paired_contrast`: all of the above for one pair of per-seed arrays;
- :func:`welch_difference`: the difference of two experiments' mean paired differences (Welch's t interval);
- :func:`heterogeneity`: Cochran's Q, its p and I^2 of several experiments' means with their SEs, and the
  fixed-effect (inverse-variance) pooled mean.

Only numpy and (for the t distribution) scipy; every function takes plain sequences of floats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from gmts_analysis.core.rank import average_ranks

#: the most non-zero differences for which the Wilcoxon p is computed exactly (beyond: normal approximation)
WILCOXON_EXACT_MAX = 50


def _diffs(d: Sequence[float]) -> np.ndarray:
    x = np.asarray(d, dtype=np.float64).reshape(-1)
    if not np.isfinite(x).all():
        raise ValueError("paired differences must be finite")
    return x


def paired_t(d: Sequence[float], level: float = 0.95) -> dict[str, float]:
    """``{n, mean, sd, se, t, df, p, ci_low, ci_high}`` of the differences ``d`` (one per seed):
    sd with ddof 1, the two-sided one-sample t-test of mean 0 and the ``level`` t interval.
    With fewer than 2 seeds sd, t, p and the interval are NaN; with sd = 0 the interval is the
    point and p is 0 (mean != 0) or 1 (mean = 0)."""
    from scipy.stats import t as t_dist

    x = _diffs(d)
    n = int(x.size)
    mean = float(x.mean()) if n else float("nan")
    if n < 2:
        nan = float("nan")
        return {"n": n, "mean": mean, "sd": nan, "se": nan, "t": nan, "df": nan, "p": nan, "ci_low": nan,
                "ci_high": nan}
    sd = float(x.std(ddof=1))
    se = sd / math.sqrt(n)
    df = n - 1
    if se == 0.0:
        t = math.copysign(math.inf, mean) if mean != 0 else 0.0
        p = 0.0 if mean != 0 else 1.0
        lo = hi = mean
    else:
        t = mean / se
        p = float(2.0 * t_dist.sf(abs(t), df))
        q = float(t_dist.ppf(0.5 + level / 2.0, df))
        lo, hi = mean - q * se, mean + q * se
    return {"n": n, "mean": mean, "sd": sd, "se": se, "t": float(t), "df": float(df), "p": min(1.0, p),
            "ci_low": float(lo), "ci_high": float(hi)}


def sign_test(d: Sequence[float]) -> float:
    """Exact two-sided sign test p of the differences ``d``: zeros dropped, ``k`` of the ``n`` others
    positive, ``p = min(1, 2 P(Binomial(n, 1/2) <= min(k, n - k)))``; 1.0 when every difference is 0."""
    x = _diffs(d)
    x = x[x != 0]
    n = int(x.size)
    if n == 0:
        return 1.0
    k = int((x > 0).sum())
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1))
    return min(1.0, 2.0 * tail / 2.0**n)


def wilcoxon_signed_rank(d: Sequence[float]) -> float:
    """Two-sided Wilcoxon signed-rank p of the differences ``d``.

    Zero differences are dropped (Wilcoxon's rule), tied magnitudes take their average rank. The
    statistic is ``T+`` (the rank sum of the positive differences); under the null each rank's sign is
    + or - with probability 1/2, so its distribution is symmetric about half the rank total and
    ``p = P(|T+ - E| >= |t - E|)``. Exact (the whole permutation distribution, ties included) up to
    :data:`WILCOXON_EXACT_MAX` non-zero differences, the normal approximation with the tie correction
    beyond; 1.0 when every difference is 0."""
    x = _diffs(d)
    x = x[x != 0]
    n = int(x.size)
    if n == 0:
        return 1.0
    ranks = average_ranks(np.abs(x))
    w = np.rint(2.0 * ranks).astype(np.int64)  # average ranks are multiples of 1/2: twice them are integers
    t_obs = int(w[x > 0].sum())
    total = int(w.sum())
    if n <= WILCOXON_EXACT_MAX:
        counts = [0] * (total + 1)  # counts[s]: sign patterns with doubled T+ = s (exact integers)
        counts[0] = 1
        for wi in w.tolist():
            for s in range(total - wi, -1, -1):
                if counts[s]:
                    counts[s + wi] += counts[s]
        dev = abs(2 * t_obs - total)  # |T+ - E| doubled twice, in integers
        extreme = sum(c for s, c in enumerate(counts) if abs(2 * s - total) >= dev)
        return min(1.0, extreme / 2**n)
    from scipy.stats import norm

    mean = total / 2.0  # doubled T+: E = sum(2 r) / 2, Var = sum((2 r)^2) / 4 (ties included)
    var = float((w.astype(np.float64) ** 2).sum()) / 4.0
    z = abs(t_obs - mean) / math.sqrt(var) if var > 0 else 0.0
    return min(1.0, float(2.0 * norm.sf(z)))


def holm(p: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: sorted ascending, the ``i``-th (from 0)
    becomes ``max_{j <= i} min(1, (m - j) p_(j))``. NaN counts as 1 (a test that could not be run
    rejects nothing)."""
    v = [1.0 if (x is None or math.isnan(x)) else float(x) for x in p]
    m = len(v)
    out = [1.0] * m
    running = 0.0
    for j, i in enumerate(sorted(range(m), key=lambda i: v[i])):
        running = max(running, min(1.0, (m - j) * v[i]))
        out[i] = running
    return out


def paired_contrast(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict[str, float]:
    """Every statistic of the paired differences ``a - b`` (same seeds, same order):
    :func:`paired_t`'s fields, ``p_sign``, ``p_wilcoxon``, and ``wins_a`` / ``wins_b`` / ``ties``
    (seeds where ``a`` is above, below, equal to ``b``)."""
    x, y = _diffs(a), _diffs(b)
    if x.shape != y.shape:
        raise ValueError(f"paired contrast of {x.size} and {y.size} values")
    d = x - y
    out = paired_t(d, level)
    out.update({"p_sign": sign_test(d), "p_wilcoxon": wilcoxon_signed_rank(d), "wins_a": int((d > 0).sum()),
                "wins_b": int((d < 0).sum()), "ties": int((d == 0).sum())})
    return out


def welch_difference(x: Sequence[float], y: Sequence[float], level: float = 0.95) -> dict[str, float]:
    """``mean(x) - mean(y)`` of two independent samples (e.g. the per-seed paired differences of two
    experiments) with Welch's SE, Welch-Satterthwaite df, two-sided p and ``level`` t interval:
    ``{diff, se, df, p, ci_low, ci_high}``. NaN fields when either sample has fewer than 2 values."""
    from scipy.stats import t as t_dist

    a, b = _diffs(x), _diffs(y)
    nan = float("nan")
    if a.size < 2 or b.size < 2:
        return {"diff": float(a.mean() - b.mean()) if a.size and b.size else nan, "se": nan, "df": nan, "p": nan,
                "ci_low": nan, "ci_high": nan}
    va, vb = float(a.var(ddof=1)) / a.size, float(b.var(ddof=1)) / b.size
    diff = float(a.mean() - b.mean())
    se = math.sqrt(va + vb)
    if se == 0.0:
        return {"diff": diff, "se": 0.0, "df": nan, "p": 0.0 if diff != 0 else 1.0, "ci_low": diff, "ci_high": diff}
    df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    p = float(2.0 * t_dist.sf(abs(diff) / se, df))
    q = float(t_dist.ppf(0.5 + level / 2.0, df))
    return {"diff": diff, "se": se, "df": float(df), "p": min(1.0, p), "ci_low": diff - q * se, "ci_high": diff + q * se}


def heterogeneity(means: Sequence[float], ses: Sequence[float]) -> dict[str, float]:
    """Cochran's Q of ``k`` estimates ``means`` with standard errors ``ses`` (inverse-variance weights
    ``w = 1 / se^2``): ``Q = sum w (m - m_fe)^2`` about the fixed-effect mean ``m_fe = sum w m / sum w``,
    ``df = k - 1``, ``p = P(chi2_df >= Q)``, ``I2 = max(0, (Q - df) / Q)`` (0 when Q = 0):
    ``{q, df, p, i2, fixed_mean, fixed_se}``. A zero SE makes every field NaN (no weight exists)."""
    from scipy.stats import chi2

    m, s = _diffs(means), _diffs(ses)
    k = int(m.size)
    nan = float("nan")
    if k != s.size or k < 2 or (s <= 0).any():
        return {"q": nan, "df": float(max(k - 1, 0)), "p": nan, "i2": nan, "fixed_mean": nan, "fixed_se": nan}
    w = 1.0 / s**2
    fe = float((w * m).sum() / w.sum())
    q = float((w * (m - fe) ** 2).sum())
    df = k - 1
    return {"q": q, "df": float(df), "p": float(chi2.sf(q, df)), "i2": max(0.0, (q - df) / q) if q > 0 else 0.0,
            "fixed_mean": fe, "fixed_se": float(1.0 / math.sqrt(w.sum()))}
