"""Registry of per-token scores (estimators of a token's gradient magnitude).

Each estimator is a function of the tokens table (a pandas DataFrame with the
tokens-table columns of docs/definitions.md) that returns one float per row. Adding one is a function
and a line in ``ESTIMATORS``. Statistics loop over :func:`available` estimators.

The one home of GMTS, ``entropy * |omega|`` (:func:`gmts_score`), and of every other
"magnitude times ``|omega|``" (:func:`times_abs_omega`: ``grad_norm = |omega| grad_norm_logp``,
``gmts_lgn``, ``gmts_head``); both take tensors, arrays or Series alike, so the kernel (numpy),
the selection and RL code (torch) and this table registry call the same function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

Estimator = Callable[["pd.DataFrame"], "pd.Series"]


def times_abs_omega(x: Any, omega: Any) -> Any:
    """``x * |omega|`` elementwise (torch tensors, numpy arrays or pandas Series): a per-token
    magnitude scaled by the token's coefficient in the loss gradient (docs/definitions.md section 4)."""
    return x * abs(omega)


def gmts_score(entropy: Any, omega: Any) -> Any:
    """GMTS, ``entropy * |omega|`` (entropy in nats; tensors, arrays or Series)."""
    return times_abs_omega(entropy, omega)


def _abs_omega(df: pd.DataFrame) -> pd.Series:
    return df["omega"].abs()


def informative_only(x: Any, omega: Any) -> Any:
    """``x * 1[omega != 0]`` elementwise (tensors, arrays or Series; a missing omega counts as 0):
    a score masked to the tokens that carry gradient. The baseline that separates "skip the tokens
    without signal" from "weight by ``|omega|``" (docs/definitions.md, estimators)."""
    return x * ((omega != 0) & (omega == omega))


def _masked(col: str, fn: Callable[[pd.DataFrame], Any] | None = None) -> Estimator:
    return lambda df: informative_only(df[col] if fn is None else fn(df), df["omega"])


ESTIMATORS: dict[str, tuple[tuple[str, ...], Estimator]] = {
    # name: (columns it needs, function)
    "entropy": (("entropy",), lambda df: df["entropy"]),
    # masked baseline: entropy on tokens with omega != 0, 0 elsewhere
    "entropy_inf": (("entropy", "omega"), _masked("entropy")),
    "gmts": (("entropy", "omega"), lambda df: gmts_score(df["entropy"], df["omega"])),
    # baseline: the token's coefficient alone (constant inside an answer on-policy); how much of a
    # ranking comes from |omega| = |w A| without any per-token information
    "abs_omega": (("omega",), _abs_omega),
    "surprisal": (("logprob",), lambda df: -df["logprob"]),
    "one_minus_prob": (("prob",), lambda df: 1.0 - df["prob"]),
    "one_minus_prob_inf": (("prob", "omega"), _masked("prob", lambda df: 1.0 - df["prob"])),
    "rsi": (("logprob", "entropy"), lambda df: -df["logprob"] / df["entropy"].where(df["entropy"] > 0, np.nan)),
    "logit_grad_norm": (("logit_grad_norm",), lambda df: df["logit_grad_norm"]),
    "gmts_lgn": (("logit_grad_norm", "omega"), lambda df: times_abs_omega(df["logit_grad_norm"], df["omega"])),
    "head_grad_norm": (("head_grad_norm",), lambda df: df["head_grad_norm"]),
    "gmts_head": (("head_grad_norm", "omega"), lambda df: times_abs_omega(df["head_grad_norm"], df["omega"])),
}

#: estimators that are 0 wherever omega = 0 (a top-k by them picks such a token only when it runs
#: out of tokens with a positive score)
ZERO_WHERE_OMEGA_ZERO = ("entropy_inf", "gmts", "abs_omega", "one_minus_prob_inf", "gmts_lgn", "gmts_head")
#: estimators that, inside one answer with |omega| constant and non-zero, rank like another one
SAME_WITHIN_ANSWER = {"entropy_inf": "entropy", "gmts": "entropy", "one_minus_prob_inf": "one_minus_prob",
                      "gmts_lgn": "logit_grad_norm", "gmts_head": "head_grad_norm"}


def add_estimator_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Add every derivable estimator column that is missing; returns ``df`` (modified in place)."""
    for name, (needs, fn) in ESTIMATORS.items():
        if name not in df.columns and all(c in df.columns for c in needs):
            df[name] = fn(df).astype("float64")
    return df


def available(df: pd.DataFrame) -> list[str]:
    """Estimator names whose column is present and not all null, in registry order."""
    return [n for n in ESTIMATORS if n in df.columns and df[n].notna().any()]
