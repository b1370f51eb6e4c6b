"""The registry of per-token scores: every estimator column and every selection arm, registered once.

A :class:`Score` is a name, the per-token quantities it needs, and one function of them. The
function receives a mapping ``q`` from quantity name to values and returns one score per token;
it is written with plain arithmetic (or the helpers below) so that the same function runs on
the tokens table (``q`` is the DataFrame: pandas Series, the estimator columns of
:mod:`gmts_analysis.core.estimators`) and on training tensors (``q`` holds ``(B, T)`` float64
tensors: the selection of :func:`gmts_analysis.core.selection_tensor.token_scores`, ``gmts rl``,
the TRL and verl drop-ins, the live diagnostics). Like inseq's step functions or Opacus' grad
samplers, adding a score is a function and one :func:`register` call; every consumer reads the
registry (its keys are the list of names).

Quantities (:data:`QUANTITIES`; the tokens-table columns of docs/definitions.md section 2 share
these names): ``entropy`` (nats), ``logprob`` and ``prob`` of the sampled token, ``omega`` (the
token's coefficient in the loss gradient, section 4), ``logit_grad_norm``, ``head_grad_norm``, and
``uniform`` (a seeded uniform draw: selection only, no table column).

Fields beyond the function: ``arm`` (a selection arm: ``gmts rl --selection``, TRL's
``token_selection``, verl's ``selection``), ``default_arm`` (run by ``gmts rl`` unless asked
otherwise), ``diagnostic`` (logged by the live diagnostics and ``gmts rl``'s per-step records: its
selection waste, its overlaps with the other diagnostic scores, its update fidelity and grad-norm
correlations, and their RL figures), ``color`` (its colour in every figure; distinct per score), ``figures`` (the run
figures whose estimator list includes it: ``within_vs_cross``, ``mass_capture``, ``decomposition``),
``headline`` (drawn bold, with its interval, where a figure draws every estimator),
``answer_constant`` (constant inside an answer on-policy: a baseline the paired-difference axis leaves
out of its range), ``base`` and ``scale`` (``base`` times ``|omega|`` (``scale="abs_omega"``) or times
``1[omega != 0]`` (``scale="informative"``): what the statistics know by construction about it).

The formulas of GMTS, ``entropy * |omega|`` (:func:`gmts_score`), of every "magnitude times
``|omega|``" (:func:`times_abs_omega`) and of the masked baselines (:func:`informative_only`) live
here; they take tensors, arrays or Series alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gmts_analysis.errors import GmtsError
from gmts_analysis.util.style import FALLBACK_COLORS, REFERENCE_COLORS

#: per-token quantities a score may need -> what it is (docs/definitions.md section 2)
QUANTITIES = {
    "entropy": "entropy of the next-token distribution softmax(z / tau), in nats",
    "logprob": "log-probability of the sampled token",
    "prob": "probability of the sampled token",
    "omega": "the token's coefficient in the loss gradient (docs/definitions.md section 4)",
    "logit_grad_norm": "||d logprob / d z||_2, the closed form sqrt(1 - 2 p + sum_v p_v^2) / tau",
    "head_grad_norm": "the exact norm of the output head's part of the token's gradient",
    "uniform": "a seeded uniform [0, 1) draw per token (selection only: the tokens table has none)",
}
#: the quantities a tokens table holds as columns
TABLE_QUANTITIES = frozenset(QUANTITIES) - {"uniform"}
SCALES = ("abs_omega", "informative")
#: rank of a newly registered arm among the arms (after the built-in ones, in registration order)
LATE_ARM = 100


# --- the formulas -----------------------------------------------------------------------------

def times_abs_omega(x: Any, omega: Any) -> Any:
    """``x * |omega|`` elementwise (torch tensors, numpy arrays or pandas Series): a per-token
    magnitude scaled by the token's coefficient in the loss gradient (docs/definitions.md section 4)."""
    return x * abs(omega)


def gmts_score(entropy: Any, omega: Any) -> Any:
    """GMTS, ``entropy * |omega|`` (entropy in nats; tensors, arrays or Series)."""
    return times_abs_omega(entropy, omega)


def informative_only(x: Any, omega: Any) -> Any:
    """``x * 1[omega != 0]`` elementwise (tensors, arrays or Series; a missing omega counts as 0):
    a score masked to the tokens that carry gradient. The baseline that separates "skip the tokens
    without signal" from "weight by ``|omega|``" (docs/definitions.md, estimators)."""
    return x * ((omega != 0) & (omega == omega))


def positive_or_nan(x: Any) -> Any:
    """``x`` where ``x > 0``, NaN elsewhere (tensors, Series or arrays): a safe denominator."""
    if hasattr(x, "masked_fill"):  # torch
        return x.masked_fill(~(x > 0), float("nan"))
    if hasattr(x, "where"):  # pandas
        return x.where(x > 0, float("nan"))
    import numpy as np

    return np.where(x > 0, x, np.nan)


# --- the registry -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Score:
    """One per-token score (module docstring). ``fn`` is ``None`` only for the keep-all arm.

    Attributes:
        name: the score's name: a tokens-table column, ``gmts rl --selection`` and TRL's ``token_selection``.
        needs: the quantities ``fn`` reads (:data:`QUANTITIES`: ``entropy`` in nats, ``logprob``, ``prob``,
            ``omega``, ``logit_grad_norm``, ``head_grad_norm``, ``uniform``).
        fn: ``q -> scores``: ``q`` maps each needed quantity to a pandas Series (the tokens table, one value per
            token) or a ``(B, T)`` float64 tensor (training); returns one score per token, the same shape.
            Higher means "keep first".
        doc: one line for the docs and ``--help``.
        arm: a selection arm (``gmts rl``, the TRL and verl drop-ins).
        scale: ``"abs_omega"`` (``base`` times ``|omega|``) or ``"informative"`` (``base`` times
            ``1[omega != 0]``), which the statistics know by construction.
    """

    name: str
    needs: tuple[str, ...]
    fn: Callable[[Mapping[str, Any]], Any] | None
    doc: str
    arm: bool = False
    arm_rank: int = LATE_ARM
    default_arm: bool = False
    diagnostic: bool = False
    color: str | None = None
    base: str | None = None
    scale: str | None = None
    figures: tuple[str, ...] = ()
    headline: bool = False
    answer_constant: bool = False
    may_be_nan: bool = False  #: undefined on some tokens (NaN there), never a sign of a broken table
    #: the summary pits it against entropy inside answers on the uncertain tokens (prob < uncertain_below)
    uncertain_contrast: bool = False

    @property
    def column(self) -> bool:
        """Whether the score is an estimator column of the tokens table (derivable from its columns)."""
        return self.fn is not None and set(self.needs) <= TABLE_QUANTITIES


_REGISTRY: dict[str, Score] = {}


def register(score: Score, *, replace_existing: bool = False) -> Score:
    """Add ``score`` to the registry, after the others: every consumer (tables, statistics, figures, arms)
    reads it from then on.

    Args:
        score: the entry.
        replace_existing: replace a score of the same name instead of refusing it.

    Returns:
        ``score``.

    Raises:
        GmtsError: a name in use (without ``replace_existing``), a quantity not in :data:`QUANTITIES`, an
            unknown ``scale``, or no function on a score that is not the keep-all arm.
    """
    if score.name in _REGISTRY and not replace_existing:
        raise GmtsError(f"score '{score.name}' is already registered")
    unknown = [q for q in score.needs if q not in QUANTITIES]
    if unknown:
        raise GmtsError(f"score '{score.name}': unknown quantity '{unknown[0]}' (choose from {', '.join(QUANTITIES)})")
    if score.scale is not None and score.scale not in SCALES:
        raise GmtsError(f"score '{score.name}': unknown scale '{score.scale}' (choose from {', '.join(SCALES)})")
    if score.fn is None and not score.arm:
        raise GmtsError(f"score '{score.name}' has no function (only the keep-all arm may have none)")
    _REGISTRY[score.name] = score
    return score


def unregister(name: str) -> Score:
    """Remove a score from the registry.

    Args:
        name: the score's name.

    Returns:
        The removed :class:`Score`.

    Raises:
        KeyError: no score of that name.
    """
    return _REGISTRY.pop(name)


@contextlib.contextmanager
def registered(score: Score) -> Iterator[Score]:
    """Register ``score`` for the duration of a ``with`` block (tests, notebooks).

    Args:
        score: the entry, registered on entering and removed on leaving (also after an error).

    Returns:
        A context manager yielding ``score``.
    """
    register(score)
    try:
        yield score
    finally:
        _REGISTRY.pop(score.name, None)


def get_score(name: str) -> Score:
    """The registered score ``name``.

    Args:
        name: the score's name (e.g. ``entropy``, ``gmts``, ``one_minus_prob``).

    Returns:
        Its :class:`Score`.

    Raises:
        KeyError: no score of that name.
    """
    return _REGISTRY[name]


def scaled(name: str, base: str, scale: str, doc: str, **fields: Any) -> Score:
    """A score ``base * |omega|`` (``scale="abs_omega"``) or ``base * 1[omega != 0]``
    (``"informative"``), built from the registered ``base`` (its function and needs)."""
    b = get_score(base)
    f = times_abs_omega if scale == "abs_omega" else informative_only
    bf = b.fn
    return Score(name, b.needs + ("omega",), lambda q: f(bf(q), q["omega"]), doc, base=base, scale=scale, **fields)


class NameView(Sequence):
    """The names of the registered scores that satisfy ``keep``, read from the registry at each use
    (a live tuple: ``in``, iteration, ``len``, indexing, ``==`` with a tuple)."""

    def __init__(self, keep: Callable[[Score], bool], order: Callable[[Score], Any] | None = None):
        self._keep, self._order = keep, order

    def _names(self) -> tuple[str, ...]:
        ss = [s for s in _REGISTRY.values() if self._keep(s)]
        if self._order is not None:
            ss = sorted(ss, key=self._order)  # stable: registration order breaks ties
        return tuple(s.name for s in ss)

    def __getitem__(self, i):  # type: ignore[override]
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())

    def __contains__(self, x: object) -> bool:
        return x in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __eq__(self, other: object) -> bool:
        return tuple(self) == tuple(other) if isinstance(other, (tuple, list, NameView)) else NotImplemented

    def __hash__(self) -> int:
        return hash(self._names())

    def __add__(self, other: Sequence) -> tuple:
        return self._names() + tuple(other)

    def __radd__(self, other: Sequence) -> tuple:
        return tuple(other) + self._names()

    def __repr__(self) -> str:
        return repr(self._names())


class FieldView(Mapping):
    """``{name: value(score)}`` over the registered scores that satisfy ``keep`` (live, like :class:`NameView`)."""

    def __init__(self, keep: Callable[[Score], bool], value: Callable[[Score], Any],
                 order: Callable[[Score], Any] | None = None):
        self._names = NameView(keep, order)
        self._value = value

    def __getitem__(self, k: str) -> Any:
        if k not in self._names:
            raise KeyError(k)
        return self._value(_REGISTRY[k])

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return repr(dict(self))


def _arm_order(s: Score) -> int:
    return s.arm_rank


#: every selection arm, ``all`` first (``gmts rl --selection``, TRL ``token_selection``, verl ``selection``)
SELECTION_ARMS = NameView(lambda s: s.arm, _arm_order)
#: the arms ``gmts rl`` runs when none is named
DEFAULT_ARMS = NameView(lambda s: s.arm and s.default_arm, _arm_order)
#: the estimator columns of the tokens table, in table order
ESTIMATOR_NAMES = NameView(lambda s: s.column)
#: the scores the live diagnostics log (when their quantities are known)
DIAGNOSTIC_SCORES = NameView(lambda s: s.diagnostic)
#: the chance arms: selections drawn from the seeded uniform (the trainer's fidelity baseline)
CHANCE_ARMS = NameView(lambda s: s.arm and "uniform" in s.needs, _arm_order)
#: the masked baselines (``base * 1[omega != 0]``), drawn dashed
MASKED_SCORES = NameView(lambda s: s.scale == "informative")
#: the scores drawn bold (with their intervals) where a figure draws every estimator
HEADLINE_SCORES = NameView(lambda s: s.headline)
#: score columns that may hold NaN in a sound table (their value is undefined on some tokens)
NAN_SCORES = NameView(lambda s: s.may_be_nan)
#: the scores the summary compares with entropy inside answers on the uncertain tokens
UNCERTAIN_CONTRAST_SCORES = NameView(lambda s: s.uncertain_contrast)
#: the scores constant inside an answer on-policy (baselines left out of the paired-difference axis)
ANSWER_CONSTANT_SCORES = NameView(lambda s: s.answer_constant)


def figure_scores(figure: str) -> NameView:
    """The scores whose ``figures`` name ``figure`` (its estimator list), in registry order."""
    return NameView(lambda s: figure in s.figures)


def diagnostic_pairs(names: Sequence[str] | None = None) -> list[tuple[str, str]]:
    """Every pair ``(a, b)`` of the diagnostic scores (or ``names``), ``a`` registered before ``b``:
    the selection overlaps the live diagnostics and ``gmts rl`` log (``overlap_<a>_<b>``)."""
    names = list(DIAGNOSTIC_SCORES if names is None else names)
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
#: the masked baselines among the arms (a score times 1[omega != 0])
MASKED_ARMS = NameView(lambda s: s.arm and s.scale == "informative", _arm_order)
#: ``{arm: colour}`` of the RL figures
ARM_COLORS = FieldView(lambda s: s.arm and s.color is not None, lambda s: s.color, _arm_order)
#: ``{score: colour}`` of every score with one: its colour in every figure (run, RL, compare)
SCORE_COLORS = FieldView(lambda s: s.color is not None, lambda s: s.color)


def score_color(name: str, i: int = 0) -> str:
    """The colour of ``name`` in any figure: its registry entry's, a reference's (``oracle``), or, for a
    score registered without one, the ``i``-th colour of a cycle no built-in score uses."""
    if name in SCORE_COLORS:
        return SCORE_COLORS[name]
    return REFERENCE_COLORS.get(name) or FALLBACK_COLORS[i % len(FALLBACK_COLORS)]


# --- the built-in scores (registered once, at import) ---------------------------------------------

#: the run figures with an estimator list (``Score.figures``; views/plots.py draws them)
WITHIN, MASS, DECOMPOSITION = "within_vs_cross", "mass_capture", "decomposition"


def _register_builtins() -> None:
    r = register
    r(Score("all", (), None, "keep every response token (stock GRPO)", arm=True, arm_rank=0, default_arm=True,
            color="#4d4d4d"))
    r(Score("entropy", ("entropy",), lambda q: q["entropy"], "entropy of the next-token distribution (nats)",
            arm=True, arm_rank=1, default_arm=True, diagnostic=True, color="#1f77b4", headline=True,
            figures=(WITHIN, MASS, DECOMPOSITION)))
    r(scaled("entropy_inf", "entropy", "informative", "masked baseline: entropy on tokens with omega != 0, 0 elsewhere",
             arm=True, arm_rank=5, color="#17becf", headline=True, figures=(WITHIN, MASS, DECOMPOSITION)))
    r(scaled("gmts", "entropy", "abs_omega", "GMTS: entropy * |omega|", arm=True, arm_rank=2, default_arm=True,
             diagnostic=True, color="#d62728", headline=True, figures=(WITHIN, MASS, DECOMPOSITION)))
    # baseline: the token's coefficient alone (constant inside an answer on-policy); how much of a
    # ranking comes from |omega| = |w A| without any per-token information
    r(Score("abs_omega", ("omega",), lambda q: abs(q["omega"]), "baseline: |omega| alone", scale="abs_omega",
            answer_constant=True, color="#969696", figures=(DECOMPOSITION,)))
    r(Score("surprisal", ("logprob",), lambda q: -q["logprob"], "surprisal -log p of the sampled token (nats)",
            color="#393b79", figures=(DECOMPOSITION,)))
    r(Score("one_minus_prob", ("prob",), lambda q: 1.0 - q["prob"], "1 - p of the sampled token",
            color="#e377c2", figures=(WITHIN, MASS), uncertain_contrast=True))
    r(scaled("one_minus_prob_inf", "one_minus_prob", "informative",
             "masked baseline: 1 - p on tokens with omega != 0, 0 elsewhere", arm=True, arm_rank=6, color="#ff7f0e",
             figures=(MASS,)))
    r(Score("rsi", ("logprob", "entropy"), lambda q: -q["logprob"] / positive_or_nan(q["entropy"]),
            "surprisal / entropy (NaN where the entropy is 0)", may_be_nan=True,
            color="#bcbd22"))
    r(Score("logit_grad_norm", ("logit_grad_norm",), lambda q: q["logit_grad_norm"],
            "||d logprob / d z||_2 (closed form)", color="#637939",
            figures=(DECOMPOSITION,)))
    r(scaled("gmts_lgn", "logit_grad_norm", "abs_omega", "logit_grad_norm * |omega|", arm=True, arm_rank=3,
             default_arm=True, diagnostic=True, color="#9467bd", figures=(WITHIN, MASS)))
    r(Score("head_grad_norm", ("head_grad_norm",), lambda q: q["head_grad_norm"],
            "exact norm of the output head's part of the token's gradient", color="#8c6d31"))
    r(scaled("gmts_head", "head_grad_norm", "abs_omega", "head_grad_norm * |omega|", color="#7b4173"))
    r(Score("random", ("uniform",), lambda q: q["uniform"], "uniform random scores (seeded): the chance baseline",
            arm=True, arm_rank=4, default_arm=True, color="#2ca02c"))


_register_builtins()
