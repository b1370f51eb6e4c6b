"""Configuration of one ``gmts rl`` training run (no heavy imports: the CLI reads it for --help)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from gmts_analysis import __version__
from gmts_analysis.core.scores import DEFAULT_ARMS, MASKED_ARMS, SELECTION_ARMS  # noqa: F401 - live views
from gmts_analysis.core.seeding import derive_seed
from gmts_analysis.core.vocabulary import DEFAULT_RHO, NORMALIZERS, SCOPES, check_rho
from gmts_analysis.errors import GmtsError
from gmts_analysis.options import checks
from gmts_analysis.options.config import OFFLINE_HELP, QUIET_HELP
from gmts_analysis.options.fields import opt
from gmts_analysis.toy.domains import DOMAINS as TOY_DOMAINS

ALL_DOMAINS = tuple(TOY_DOMAINS)  # the training domains: every toy domain


@dataclass
class RLConfig:
    """Everything one training run depends on (recorded in the results JSON by :func:`record_config`).

    Each setting has one name from the flag of ``gmts rl`` to here, TRL's where TRL has one (``model``,
    ``max_steps``, ``num_generations``, ``max_completion_length``); the run records keep the keys they have
    always had (:data:`RECORD_KEYS`)."""

    model: str = "small"
    selection: str = "gmts"  # an arm of gmts_analysis.core.scores (SELECTION_ARMS)
    seed: int = 0
    max_steps: int = 100
    domains: tuple[str, ...] = ALL_DOMAINS
    rho: float = DEFAULT_RHO
    scope: str = "batch"  # batch | group
    normalizer: str = "all"  # all | selected
    loss_agg: str = "token-mean"
    advantage: str = "group"
    prompts_per_domain: int = 4
    num_generations: int = 8  # answers per prompt G
    lr: float = 3e-4
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    temperature: float = 1.0
    max_completion_length: int = 96  # generation budget in tokens
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
        if self.selection not in SELECTION_ARMS:
            raise GmtsError(f"selection: unknown '{self.selection}' (choose from {', '.join(SELECTION_ARMS)})")
        for d in self.domains:
            if d not in TOY_DOMAINS:
                raise GmtsError(f"domains: unknown domain '{d}' (choose from {', '.join(TOY_DOMAINS)})")
        check_rho(self.rho, f"rho={self.rho}:", error=GmtsError)
        if self.scope not in SCOPES:
            raise GmtsError(f"scope={self.scope}: must be {' or '.join(SCOPES)}")
        if self.normalizer not in NORMALIZERS:
            raise GmtsError(f"normalizer={self.normalizer}: must be {' or '.join(NORMALIZERS)}")
        for name, least in (("max_steps", 0), ("num_generations", 2), ("prompts_per_domain", 1), ("eval_every", 1),
                            ("eval_prompts", 1), ("diag_every", 0), ("final_eval_prompts", 0)):
            if getattr(self, name) < least:
                raise GmtsError(f"{name}={getattr(self, name)}: must be >= {least}")
        if self.lr <= 0:
            raise GmtsError(f"lr={self.lr}: must be > 0")

    @property
    def final_prompts(self) -> int:
        """Held-out prompts per domain of the final evaluation."""
        return self.final_eval_prompts or self.eval_prompts


#: RLConfig field -> the key a run record (``<out stem>.runs/*.json``, ``initial.json``, the results JSON's
#: ``config``) stores it under. The committed records of data/rl and the plans and reports of ``gmts rl-report``
#: use these keys, so new records keep them: a rerun of a committed experiment finds its runs and writes the
#: same keys. Every other field is stored under its own name.
RECORD_KEYS = {"model": "policy", "max_steps": "steps", "num_generations": "group_size",
               "max_completion_length": "max_new_tokens"}


def record_config(cfg: RLConfig) -> dict:
    """``cfg`` as a run record's ``config`` (field order kept, :data:`RECORD_KEYS` renamed)."""
    return {RECORD_KEYS.get(k, k): v for k, v in asdict(cfg).items()}


def record_versions() -> dict[str, str]:
    """A run record's ``versions``: gmts_analysis, torch, transformers and Python (the training loaded torch and
    transformers already; this module does not import them until asked)."""
    import platform

    import torch
    import transformers

    return {"gmts_analysis": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


def config_of_record(config: dict) -> RLConfig:
    """The :class:`RLConfig` of a run record's ``config`` (the keys of :func:`record_config`, or a field's own
    name); a key that is neither is refused."""
    names = {v: k for k, v in RECORD_KEYS.items()}
    kw = {names.get(k, k): v for k, v in config.items()}
    unknown = sorted(set(kw) - set(RLConfig.__dataclass_fields__))
    if unknown:
        raise GmtsError(f"config.{unknown[0]}: not a field of a gmts rl run")
    if "domains" in kw:
        kw["domains"] = tuple(kw["domains"])
    return RLConfig(**kw)


_D = RLConfig


@dataclass
class RLOptions:
    """The flags of ``gmts rl`` (defaults: :class:`RLConfig`'s, whose fields have the same names)."""

    model: str = opt(_D.model, "shipped policy tiny | small, a checkpoint directory or a hub id", group="inputs",
                     metavar="PATH|FILE.gguf|HUB_ID|tiny|small|smollm2", check=checks.model)
    offline: bool = opt(False, OFFLINE_HELP + "; without it a hub id is downloaded as transformers does",
                        group="inputs")
    selection: list = opt(list(DEFAULT_ARMS), f"one or more arms; {' and '.join(MASKED_ARMS)} are the masked "
                          f"baselines (score x 1[omega != 0]) (default: {' '.join(DEFAULT_ARMS)})", nargs="+",
                          choices=SELECTION_ARMS, group="RL objective")
    seed: list = opt([0, 1, 2], "one or more seeds (default: 0 1 2)", nargs="+", type=int, metavar="INT",
                     check=checks.seed)
    max_steps: int = opt(_D.max_steps, "optimizer steps per run (TRL's max_steps)", group="RL objective",
                         metavar="STEPS", check=checks.int_at_least(0))  # 0: evaluate the start only
    domains: list = opt(list(ALL_DOMAINS), "toy domains, space- or comma-separated (default: all three)", nargs="+",
                        group="inputs", metavar="DOMAIN", check=checks.toy_domains)
    rho: float = opt(_D.rho, "fraction of tokens kept", group="RL objective", metavar="FRACTION", check=checks.rho)
    scope: str = opt(_D.scope, "selection scope", choices=SCOPES, group="RL objective")
    normalizer: str = opt(_D.normalizer, "loss divided by all response tokens (TRL, GMTS code) or by the selected "
                          "ones (80/20 code)", choices=NORMALIZERS, group="RL objective")
    lr: float = opt(_D.lr, "AdamW learning rate", group="RL objective", metavar="LR", check=checks.positive_finite)
    prompts_per_domain: int = opt(_D.prompts_per_domain, "training prompts per domain per step", group="inputs",
                                  metavar="PROMPTS", check=checks.int_at_least(1))
    num_generations: int = opt(_D.num_generations, "answers per prompt G (TRL's num_generations)", group="inputs",
                               metavar="G", check=checks.int_at_least(2, "a group needs a baseline"))
    max_completion_length: int = opt(_D.max_completion_length, "generation budget in tokens (TRL's max_completion_length)",
                                     group="inputs", metavar="TOKENS", check=checks.int_at_least(1))
    eval_every: int = opt(_D.eval_every, "steps between evaluations", metavar="STEPS", check=checks.int_at_least(1))
    eval_prompts: int = opt(_D.eval_prompts, "held-out prompts per domain for pass@1", group="inputs",
                            metavar="PROMPTS", check=checks.int_at_least(1))
    final_eval_prompts: int = opt(_D.final_eval_prompts, "held-out prompts per domain for the final pass@1 only (the "
                                  "learning curve keeps --eval-prompts); 0 = --eval-prompts", group="inputs",
                                  metavar="PROMPTS", check=checks.int_at_least(0))
    eval_seed: int = opt(_D.eval_seed, "seed of the evaluation: which held-out prompts are drawn and their sampling "
                         f"noise, the same for every arm and checkpoint ({_D.eval_seed}: every run in data/rl up to "
                         "the replication of docs/rl.md section 9)", metavar="INT", check=checks.seed)
    dynamic_sampling: bool = opt(False, "drop groups whose rewards are all equal before each update (DAPO's dynamic "
                                 "sampling; the batch is not refilled, the number kept is logged per step)",
                                 group="RL objective")
    diag_every: int = opt(_D.diag_every, "steps between grad-norm diagnostics, 0 = never", metavar="STEPS",
                          check=checks.int_at_least(0))
    diag_answers: int = opt(_D.diag_answers, "answers per grad-norm diagnostic", metavar="ANSWERS",
                            check=checks.int_at_least(1))
    device: str = opt("auto", "auto | cpu | cuda[:N]; auto = cuda if available, else cpu (the results in data/rl "
                      "were trained on cpu: give --device cpu to reproduce them on a GPU machine)",
                      group="gradient engine", metavar="DEVICE", check=checks.device)
    threads: int = opt(1, "torch CPU threads; the toy policies run fastest on one, and two processes with disjoint "
                       "--seed lists use two cores", metavar="THREADS", check=checks.int_at_least(1))
    out: str = opt("data/rl/rl.json", "results JSON (default: data/rl/rl.json); runs are kept beside it in "
                   "<stem>.runs/ and reused when the configuration matches", group="output", metavar="DIR",
                   check=checks.output_path)
    figures: str = opt("figures", "directory for rl_<stem>_curves.png and rl_<stem>_diagnostics.png ('none' to "
                       "skip)", group="output", check=checks.output_path)
    quiet: bool = opt(False, QUIET_HELP, short="-q")

    def config(self, device: str) -> RLConfig:
        """The :class:`RLConfig` of one run of these options (``device``: resolved)."""
        return RLConfig(
            model=self.model, max_steps=self.max_steps,
            domains=tuple(d for x in self.domains for d in x.split(",") if d.strip()), rho=self.rho,
            scope=self.scope, normalizer=self.normalizer, lr=self.lr, prompts_per_domain=self.prompts_per_domain,
            num_generations=self.num_generations, max_completion_length=self.max_completion_length, eval_every=self.eval_every,
            eval_prompts=self.eval_prompts, final_eval_prompts=self.final_eval_prompts, eval_seed=self.eval_seed,
            dynamic_sampling=self.dynamic_sampling, diag_every=self.diag_every, diag_answers=self.diag_answers,
            device=device)


def stable_seed(*key: object) -> int:
    """A 31-bit seed from a key (:func:`gmts_analysis.core.seeding.derive_seed` with ``bits=31``)."""
    return derive_seed(*key, bits=31)


def runs_dir(out: Path) -> Path:
    """The folder of the run records of the experiment ``out`` (``<out stem>.runs`` beside it)."""
    return out.with_suffix("").with_name(out.stem + ".runs")


def run_path(out: Path, selection: str, seed: int) -> Path:
    """The run record of ``selection`` and ``seed`` of the experiment ``out`` (``<out stem>.runs/<selection>-s<seed>.json``)."""
    return runs_dir(out) / f"{selection}-s{seed}.json"
