"""``stats.json`` as typed objects (docs/definitions.md section 6; SPEC section 6 is the contract).

:func:`gmts_analysis.analysis.stats.compute_stats` computes the statistics; :class:`Statistics`
is how they are read and written: ``Statistics.from_dict(d)`` (or :meth:`Statistics.from_json`,
:meth:`Statistics.read`) gives attributes in place of string paths, and
:meth:`Statistics.to_dict` / :meth:`Statistics.to_json` give back the same keys in the same
order with the same values (the JSON text of a stats.json read and written again is identical).

Every record keeps the key order of the file. A key an older stats.json does not have is
*absent*: its attribute holds an empty value (``{}``, ``[]``, ``None`` or NaN) and the key is
not written back; keys this module does not know are kept in ``extra`` and written after the
known ones. Undefined statistics (JSON null) read as NaN wherever the value is a float
statistic, so readers test ``math.isnan`` only; counts that may be null (``meta.n_groups``,
``zero_advantage.groups``) read as ``None``.

Shapes: ``Grid`` is scope -> estimator -> rho key ("0.2") -> value (``topk_overlap``,
``selection_waste``, ``mass_capture``); ``CIGrid`` the same with an :class:`Interval`;
``PairedDifferences`` statistic -> estimator -> reference -> :class:`PairedDiff`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from gmts_analysis.errors import GmtsError
from gmts_analysis.util.io import read_json_object, to_json

__all__ = [
    "BLOCK_KEYS", "Block", "CIGrid", "CrossEntry", "Fidelity", "Grid", "Identity", "Interval", "Meta",
    "PairedDiff", "PairedDifferences", "Slice", "Statistics", "Uncertain", "WithinEntry", "ZeroAdvantage",
]

NAN = float("nan")
DEFAULT_RHO_KEY = "0.2"  # the keep fraction of runs written before meta.rho existed

Loader = Callable[[Any, str], Any]
R = TypeVar("R", bound="Record")


def _obj(v: Any, where: str) -> Mapping:
    """``v`` when it is a JSON object, else a one-line error naming the field."""
    if not isinstance(v, Mapping):
        raise GmtsError(f"stats.json field {where}: expected an object, got {type(v).__name__}")
    return v


def _stat(v: Any, where: str) -> Any:
    """A float statistic: null -> NaN; a number is kept as written."""
    if v is None:
        return NAN
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise GmtsError(f"stats.json field {where}: expected a number or null, got {type(v).__name__}")
    return v


def _same(v: Any, where: str) -> Any:
    return v


def _dump(v: Any) -> Any:
    """The JSON value of an attribute (records and typed maps through their ``to_dict``)."""
    if isinstance(v, (Record, NestedMap)):
        return v.to_dict()
    if isinstance(v, dict):
        return {k: _dump(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_dump(x) for x in v]
    return v


def _map(load: Loader) -> Loader:
    """Loader of ``{name: value}`` with each value read by ``load``."""
    return lambda v, w: {str(k): load(x, f"{w}.{k}") for k, x in _obj(v, w).items()}


def _list(load: Loader) -> Loader:
    def read(v: Any, w: str) -> list:
        if not isinstance(v, list):
            raise GmtsError(f"stats.json field {w}: expected a list, got {type(v).__name__}")
        return [load(x, f"{w}[{i}]") for i, x in enumerate(v)]

    return read


@dataclass
class Record:
    """A JSON object with a fixed key order (``KEYS``) and per-key loaders (``LOAD``; default: as is)."""

    KEYS: ClassVar[tuple[str, ...]] = ()
    LOAD: ClassVar[dict[str, Loader]] = {}

    extra: dict = field(default_factory=dict, repr=False, kw_only=True)
    absent: frozenset = field(default=frozenset(), repr=False, compare=False, kw_only=True)

    @classmethod
    def from_dict(cls: type[R], d: Any, where: str = "") -> R:
        """The record of the JSON object ``d`` (``where``: its dotted path, for errors)."""
        d = _obj(d, where or cls.__name__)
        kw = {k: cls.LOAD.get(k, _same)(d[k], f"{where}.{k}".lstrip(".")) for k in cls.KEYS if k in d}
        extra = {k: v for k, v in d.items() if k not in cls.KEYS}
        return cls(**kw, extra=extra, absent=frozenset(k for k in cls.KEYS if k not in d))

    @classmethod
    def make(cls: type[R], **values: Any) -> R:
        """The record of computed ``values`` (typed already: records, typed maps, numbers): the keys
        not given are absent, as in a JSON object without them. An unknown key is a programming error."""
        unknown = [k for k in values if k not in cls.KEYS]
        if unknown:
            raise TypeError(f"{cls.__name__} has no key(s) {', '.join(unknown)}")
        return cls(**values, absent=frozenset(k for k in cls.KEYS if k not in values))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: the known keys in order (absent ones left out), then ``extra``."""
        out = {k: _dump(getattr(self, k)) for k in self.KEYS if k not in self.absent}
        out.update(self.extra)
        return out

    def __bool__(self) -> bool:
        """False for an empty object (``{}``), as the JSON object it reads."""
        return any(k not in self.absent for k in self.KEYS) or bool(self.extra)

    def has(self, key: str) -> bool:
        """Whether ``key`` was written (an older stats.json may lack it)."""
        return key in self.KEYS and key not in self.absent


def _record(cls: type[Record]) -> Loader:
    return lambda v, w: cls.from_dict(v, w)


@dataclass
class Interval(Record):
    """A 95% CI ``{ci_low, ci_high}`` (NaN when undefined)."""

    KEYS: ClassVar = ("ci_low", "ci_high")
    LOAD: ClassVar = {"ci_low": _stat, "ci_high": _stat}
    ci_low: float = NAN
    ci_high: float = NAN


@dataclass
class ZeroAdvantage(Record):
    """``zero_advantage``: answers / groups without an informative token, tokens with omega = 0."""

    KEYS: ClassVar = ("answers", "groups", "tokens", "token_share", "informative_units")
    LOAD: ClassVar = {"token_share": _stat}
    answers: int | None = None
    groups: int | None = None
    tokens: int | None = None
    token_share: float = NAN
    informative_units: int | None = None  #: bootstrap units (groups) with an informative token (version 4)


@dataclass
class RewardAudit(Record):
    """``reward_audit`` (version 4): how far the rewards can be trusted (:mod:`gmts_analysis.analysis.reward_audit`);
    a share is None where the run does not record its facts."""

    KEYS: ClassVar = ("n_answers", "verifier", "truncated_share", "boxed_share", "fallback_share",
                      "copies_prompt_example_share", "positive_share", "fallback_positive_share",
                      "truncated_positive_share", "modal_answer", "modal_answer_share", "modal_solution_share")
    n_answers: int | None = None
    verifier: str | None = None
    truncated_share: float | None = None
    boxed_share: float | None = None
    fallback_share: float | None = None
    copies_prompt_example_share: float | None = None
    positive_share: float | None = None
    fallback_positive_share: float | None = None
    truncated_positive_share: float | None = None
    modal_answer: str | None = None  #: the most common final answer
    modal_answer_share: float | None = None  #: its share of all answers
    modal_solution_share: float | None = None  #: the most common reference answer's share of the same answers


@dataclass
class CrossEntry(Record):
    """``cross_answer.<s>``: pooled Spearman and Kendall tau-b with grad_norm, ``n_tokens``, 95% CI."""

    KEYS: ClassVar = ("spearman", "kendall", "n_tokens", "ci_low", "ci_high")
    LOAD: ClassVar = {"spearman": _stat, "kendall": _stat, "ci_low": _stat, "ci_high": _stat}
    spearman: float = NAN
    kendall: float = NAN
    n_tokens: int | None = None
    ci_low: float = NAN
    ci_high: float = NAN


@dataclass
class WithinEntry(Record):
    """``within_answer.<s>`` (``n_answers``, ``weighted_tau``, ``top1``) or ``within_group.<s>`` (``n_groups``):
    per-cluster Spearman summarised, 95% CI of the mean."""

    KEYS: ClassVar = ("median", "mean", "q25", "q75", "n_answers", "n_groups", "ci_low", "ci_high",
                      "weighted_tau", "top1")
    LOAD: ClassVar = {k: _stat for k in ("median", "mean", "q25", "q75", "ci_low", "ci_high", "weighted_tau", "top1")}
    median: float = NAN
    mean: float = NAN
    q25: float = NAN
    q75: float = NAN
    n_answers: int | None = None
    n_groups: int | None = None
    ci_low: float = NAN
    ci_high: float = NAN
    weighted_tau: float = NAN
    top1: float = NAN


@dataclass
class PairedDiff(Record):
    """``paired_difference.<stat>.<s>.<ref>``: value(s) - value(ref) on the same resamples."""

    KEYS: ClassVar = ("diff", "ci_low", "ci_high", "p_le_0")
    LOAD: ClassVar = {"diff": _stat, "ci_low": _stat, "ci_high": _stat, "p_le_0": _stat}
    diff: float = NAN
    ci_low: float = NAN
    ci_high: float = NAN
    p_le_0: float = NAN


@dataclass
class Fidelity(Record):
    """``update_fidelity.<name>``: cosine and norm ratio of a selection's update vs the full one."""

    KEYS: ClassVar = ("cosine", "norm_ratio")
    LOAD: ClassVar = {"cosine": _stat, "norm_ratio": _stat}
    cosine: float = NAN
    norm_ratio: float = NAN


@dataclass
class Identity(Record):
    """A ``by_construction`` entry: statistic ``key`` is fixed (``equals`` a value) or equal to another."""

    KEYS: ClassVar = ("key", "equals", "why")
    key: str = ""
    equals: Any = None
    why: str = ""


@dataclass
class NestedMap:
    """Three levels of names over a leaf that ``LEAF`` reads (the typed maps below share this)."""

    LEAF: ClassVar[Loader]
    values: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Any, where: str = "") -> Any:
        return cls(_map(_map(_map(cls.LEAF)))(d, where))

    def to_dict(self) -> dict:
        return _dump(self.values)

    def __contains__(self, key: object) -> bool:
        return key in self.values

    def series(self, first: str, second: str) -> dict[str, Any]:
        """``{third level: leaf}`` under ``first`` and ``second`` (empty when absent)."""
        return self.values.get(first, {}).get(second, {})


@dataclass
class Grid(NestedMap):
    """scope -> estimator -> rho key -> value (``topk_overlap``, ``selection_waste``, ``mass_capture``)."""

    LEAF: ClassVar[Loader] = staticmethod(_stat)
    values: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.values)

    def estimators(self, scope: str) -> list[str]:
        """The estimators of ``scope`` (none when the scope is absent)."""
        return list(self.values.get(scope, {}))

    def at(self, scope: str, s: str, rk: str) -> float:
        """The value, NaN when absent."""
        return self.series(scope, s).get(rk, NAN)


@dataclass
class CIGrid(NestedMap):
    """scope -> estimator -> rho key -> :class:`Interval` (``topk_overlap_ci`` and the like)."""

    LEAF: ClassVar[Loader] = staticmethod(_record(Interval))
    values: dict[str, dict[str, dict[str, Interval]]] = field(default_factory=dict)

    def at(self, scope: str, s: str, rk: str) -> Interval:
        """The interval, undefined (NaN, NaN) when absent."""
        return self.series(scope, s).get(rk) or Interval()


@dataclass
class PairedDifferences(NestedMap):
    """statistic -> estimator -> reference -> :class:`PairedDiff` (``paired_difference``)."""

    LEAF: ClassVar[Loader] = staticmethod(_record(PairedDiff))
    values: dict[str, dict[str, dict[str, PairedDiff]]] = field(default_factory=dict)

    def of(self, stat: str) -> dict[str, dict[str, PairedDiff]]:
        """``{s: {ref: PairedDiff}}`` of one statistic (empty when absent)."""
        return self.values.get(stat, {})

    def get(self, stat: str, a: str, b: str) -> PairedDiff | None:
        """value(a) - value(b) of ``stat`` as written (not the negated reverse), or None."""
        return self.of(stat).get(a, {}).get(b)


BLOCK_KEYS = (
    "zero_advantage", "cross_answer", "cross_answer_informative", "within_answer", "within_group", "topk_overlap",
    "topk_overlap_ci", "topk_scopes_excluded", "selection_waste", "selection_waste_ci", "mass_capture",
    "mass_capture_ci", "paired_difference", "paired_leader", "update_fidelity", "uncertain", "by_construction",
)


@dataclass
class Block(Record):
    """The statistics of one token set: the whole run (:class:`Statistics`), a slice or the uncertain tokens."""

    KEYS: ClassVar = BLOCK_KEYS
    zero_advantage: ZeroAdvantage | None = None
    cross_answer: dict[str, CrossEntry] = field(default_factory=dict)
    cross_answer_informative: dict[str, CrossEntry] = field(default_factory=dict)
    within_answer: dict[str, WithinEntry] = field(default_factory=dict)
    within_group: dict[str, WithinEntry] = field(default_factory=dict)
    topk_overlap: Grid = field(default_factory=Grid)
    topk_overlap_ci: CIGrid = field(default_factory=CIGrid)
    topk_scopes_excluded: dict[str, int] = field(default_factory=dict)
    selection_waste: Grid = field(default_factory=Grid)
    selection_waste_ci: CIGrid = field(default_factory=CIGrid)
    mass_capture: Grid = field(default_factory=Grid)
    mass_capture_ci: CIGrid = field(default_factory=CIGrid)
    paired_difference: PairedDifferences = field(default_factory=PairedDifferences)
    paired_leader: dict[str, str | None] = field(default_factory=dict)
    update_fidelity: dict[str, Fidelity] = field(default_factory=dict)
    uncertain: Uncertain | None = None
    by_construction: list[Identity] = field(default_factory=list)

    @property
    def fixed(self) -> set[str]:
        """The keys of the statistics fixed or equal to another by construction (never findings)."""
        return {e.key for e in self.by_construction}


_BLOCK_LOAD: dict[str, Loader] = {
    "zero_advantage": _record(ZeroAdvantage),
    "cross_answer": _map(_record(CrossEntry)),
    "cross_answer_informative": _map(_record(CrossEntry)),
    "within_answer": _map(_record(WithinEntry)),
    "within_group": _map(_record(WithinEntry)),
    "topk_overlap": Grid.from_dict, "selection_waste": Grid.from_dict, "mass_capture": Grid.from_dict,
    "topk_overlap_ci": CIGrid.from_dict, "selection_waste_ci": CIGrid.from_dict, "mass_capture_ci": CIGrid.from_dict,
    "paired_difference": PairedDifferences.from_dict,
    "update_fidelity": _map(_record(Fidelity)),
    "uncertain": lambda v, w: Uncertain.from_dict(v, w),
    "by_construction": _list(_record(Identity)),
}
Block.LOAD = _BLOCK_LOAD


@dataclass
class Uncertain(Block):
    """``uncertain``: the blocks again over the tokens with prob < ``meta.uncertain_below``
    (empty ``{}`` when the tokens table has no prob)."""

    KEYS: ClassVar = ("n_tokens", "token_share", "mass_share", *BLOCK_KEYS)
    LOAD: ClassVar = {**_BLOCK_LOAD, "token_share": _stat, "mass_share": _stat}
    n_tokens: int | None = None
    token_share: float = NAN
    mass_share: float = NAN


@dataclass
class Slice(Block):
    """``by_domain.<d>`` / ``by_step.<k>``: a block with its ``n_answers`` and ``n_tokens``."""

    KEYS: ClassVar = (*BLOCK_KEYS, "n_answers", "n_tokens")
    LOAD: ClassVar = _BLOCK_LOAD
    n_answers: int | None = None
    n_tokens: int | None = None


META_KEYS = (
    "version", "n_answers", "n_tokens", "n_groups", "target", "target_within_answer", "estimators", "informative",
    "n_boot", "n_boot_pooled", "ci_level", "ci_unit", "n_ci_units", "ci_method", "seed", "min_tokens", "within_set",
    "rhos", "rho", "topk_true", "topk_pooling", "selection_waste", "batch_scope", "update_fidelity",
    "uncertain_below", "uncertain", "mass_capture", "paired_difference", "by_construction", "min_groups",
    "rescored_from",
)


@dataclass
class Meta(Record):
    """``meta``: counts and settings of the statistics; the text fields describe each block."""

    KEYS: ClassVar = META_KEYS
    version: int | None = None
    n_answers: int | None = None
    n_tokens: int | None = None
    n_groups: int | None = None
    target: str | None = None
    target_within_answer: str | None = None
    estimators: list[str] = field(default_factory=list)
    informative: str | None = None
    n_boot: int | None = None
    n_boot_pooled: int | None = None
    ci_level: float | None = None
    ci_unit: str | None = None
    n_ci_units: int | None = None
    ci_method: str | None = None
    seed: int | None = None
    min_tokens: int | None = None
    within_set: str | None = None
    rhos: list[str] = field(default_factory=list)
    rho: str | None = None
    topk_true: str | None = None
    topk_pooling: str | None = None
    selection_waste: str | None = None
    batch_scope: str | None = None
    update_fidelity: str | None = None
    uncertain_below: float | None = None
    uncertain: str | None = None
    mass_capture: str | None = None
    paired_difference: str | None = None
    by_construction: str | None = None
    min_groups: int | None = None  #: version 4: fewer informative groups in a block: no interval, no verdict
    rescored_from: dict | None = None  #: version 4: the run these statistics were re-scored from (gmts stats)

    @property
    def rho_key(self) -> str:
        """The stats key of the run's keep fraction (``rho``; "0.2" for older runs)."""
        return str(self.rho) if self.rho is not None else DEFAULT_RHO_KEY

    @property
    def units(self) -> int | None:
        """``n_ci_units`` when it is a count, else None."""
        n = self.n_ci_units
        return int(n) if isinstance(n, (int, float)) and not isinstance(n, bool) else None


@dataclass
class Statistics(Block):
    """A whole ``stats.json``: ``meta``, the run's block, and ``by_domain`` / ``by_step`` slices."""

    KEYS: ClassVar = ("meta", "reward_audit", *BLOCK_KEYS, "by_domain", "by_step")
    LOAD: ClassVar = {**_BLOCK_LOAD, "meta": _record(Meta), "reward_audit": _record(RewardAudit),
                      "by_domain": _map(_record(Slice)), "by_step": _map(_record(Slice))}
    meta: Meta = field(default_factory=Meta)
    reward_audit: RewardAudit = field(default_factory=RewardAudit)
    by_domain: dict[str, Slice] = field(default_factory=dict)
    by_step: dict[str, Slice] = field(default_factory=dict)

    @classmethod
    def coerce(cls, stats: Statistics | Mapping[str, Any] | None) -> Statistics:
        """``stats`` as a :class:`Statistics` (a stats dict is read; None gives an empty one)."""
        if isinstance(stats, Statistics):
            return stats
        return cls.from_dict(stats if stats is not None else {}, "")

    @classmethod
    def from_json(cls, text: str) -> Statistics:
        """The statistics of a stats.json text."""
        import json

        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as e:
            raise GmtsError(f"stats.json: line {e.lineno}: invalid JSON ({e.msg})") from None

    @classmethod
    def read(cls, path: str | Path) -> Statistics:
        """The statistics of a stats.json file (errors name the file)."""
        try:
            return cls.from_dict(read_json_object(path))
        except GmtsError as e:
            raise GmtsError(str(e).replace("stats.json", str(path), 1)) from None

    def to_json(self) -> str:
        """The stats.json text (NaN written as null), as :func:`gmts_analysis.analysis.stats.write_stats` writes it."""
        return to_json(self.to_dict())

    @property
    def rho_key(self) -> str:
        """The stats key of the run's keep fraction (``meta.rho``; "0.2" for older runs)."""
        return self.meta.rho_key

    @property
    def estimators(self) -> list[str]:
        """``meta.estimators``, else the estimators of ``cross_answer``."""
        return list(self.meta.estimators or self.cross_answer)

    def slices(self, section: str) -> dict[str, Slice]:
        """``by_domain`` or ``by_step`` by name (the section a caller picks; empty for another name)."""
        return getattr(self, section) if section in ("by_domain", "by_step") else {}
