"""Configuration of one ``gmts rl`` training run (no heavy imports: the CLI reads it for --help)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gmts_analysis.core.scores import DEFAULT_ARMS, SELECTION_ARMS  # noqa: F401 - live views of the registry
from gmts_analysis.core.vocabulary import DEFAULT_RHO, NORMALIZERS, SCOPES
from gmts_analysis.errors import GmtsError
from gmts_analysis.toy.domains import DOMAINS as TOY_DOMAINS

ALL_DOMAINS = tuple(TOY_DOMAINS)  # the training domains: every toy domain


@dataclass
class RLConfig:
    """Everything one training run depends on (recorded in the results JSON)."""

    policy: str = "small"
    selection: str = "gmts"  # an arm of gmts_analysis.core.scores (SELECTION_ARMS)
    seed: int = 0
    steps: int = 100
    domains: tuple[str, ...] = ALL_DOMAINS
    rho: float = DEFAULT_RHO
    scope: str = "batch"  # batch | group
    normalizer: str = "all"  # all | selected
    loss_agg: str = "token-mean"
    advantage: str = "group"
    prompts_per_domain: int = 4
    group_size: int = 8
    lr: float = 3e-4
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    temperature: float = 1.0
    max_new_tokens: int = 96
    eval_every: int = 10
    eval_prompts: int = 200
    #: held-out prompts per domain for the final pass@1 only (0: ``eval_prompts``); the curve keeps ``eval_prompts``
    final_eval_prompts: int = 0
    #: drop groups whose rewards are all equal before the update (DAPO's dynamic sampling, not refilled)
    dynamic_sampling: bool = False
    eval_seed: int = 12345
    diag_every: int = 10
    diag_answers: int = 4
    device: str = "cpu"
    batch_size: int = 64  # generation batch size
    extra: dict = field(default_factory=dict)

    def check(self) -> None:
        """Raise :class:`GmtsError` on a bad field."""
        from gmts_analysis.toy.domains import DOMAINS

        if self.selection not in SELECTION_ARMS:
            raise GmtsError(f"selection: unknown '{self.selection}' (choose from {', '.join(SELECTION_ARMS)})")
        for d in self.domains:
            if d not in DOMAINS:
                raise GmtsError(f"domains: unknown domain '{d}' (choose from {', '.join(DOMAINS)})")
        if not 0.0 < self.rho <= 1.0:
            raise GmtsError(f"rho={self.rho}: must be in (0, 1]")
        if self.scope not in SCOPES:
            raise GmtsError(f"scope={self.scope}: must be {' or '.join(SCOPES)}")
        if self.normalizer not in NORMALIZERS:
            raise GmtsError(f"normalizer={self.normalizer}: must be {' or '.join(NORMALIZERS)}")
        for name, least in (("steps", 0), ("group_size", 2), ("prompts_per_domain", 1), ("eval_every", 1),
                            ("eval_prompts", 1), ("diag_every", 0), ("final_eval_prompts", 0)):
            if getattr(self, name) < least:
                raise GmtsError(f"{name}={getattr(self, name)}: must be >= {least}")
        if self.lr <= 0:
            raise GmtsError(f"lr={self.lr}: must be > 0")

    @property
    def final_prompts(self) -> int:
        """Held-out prompts per domain of the final evaluation."""
        return self.final_eval_prompts or self.eval_prompts


def stable_seed(*key: object) -> int:
    """A 31-bit seed from a key (:func:`gmts_analysis.core.seeding.derive_seed` with ``bits=31``)."""
    from gmts_analysis.core.seeding import derive_seed

    return derive_seed(*key, bits=31)


def runs_dir(out: Path) -> Path:
    """The folder of the run records of the experiment ``out`` (``<out stem>.runs`` beside it)."""
    return out.with_suffix("").with_name(out.stem + ".runs")


def run_path(out: Path, selection: str, seed: int) -> Path:
    """The run record of ``selection`` and ``seed`` of the experiment ``out`` (``<out stem>.runs/<selection>-s<seed>.json``)."""
    return runs_dir(out) / f"{selection}-s{seed}.json"
