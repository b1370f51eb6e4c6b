"""A probe's settings, split once into the typed parts each layer reads.

:class:`ProbeSettings` is built from the probe's options (:class:`~gmts_analysis.options.config.ProbeOptions`,
the flags of ``gmts probe`` and the keywords of :func:`gmts_analysis.probe`) in one place,
:meth:`ProbeSettings.of`, which is also where they are checked, once
(:func:`gmts_analysis.probing.validate.validate_options`, then the loss options while the loss is
resolved). From there each layer is handed its own part
and never the whole options object:

- the readers: :class:`~gmts_analysis.readers.rollouts.ReaderOptions` (how rollouts are read), the
  verifier's name, and where and how the model is loaded (``device``, ``dtype``);
- the kernel (:mod:`gmts_analysis.probing.kernel`): :class:`KernelSettings`, the objective (temperature,
  advantage estimator, the resolved :class:`~gmts_analysis.core.objective.LossSettings`, TRL's
  truncated-completion mask) and the engine's part, :class:`EngineSettings`;
- the pre-flight checks and update fidelity (:mod:`gmts_analysis.probing.preflight`): :class:`EngineSettings`;
- the run's statistics (:mod:`gmts_analysis.run.finalize`): :class:`StatisticsSettings`.

The options object itself travels on only as the record of what the run was made with
(``manifest.json`` ``config``, the run's fingerprint).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gmts_analysis.core.objective import LossSettings, settings_of
from gmts_analysis.core.sizes import parse_chunk_size
from gmts_analysis.options.config import ProbeOptions
from gmts_analysis.probing import validate
from gmts_analysis.readers.rollouts import ReaderOptions


@dataclass(frozen=True)
class EngineSettings:
    """How the per-token gradient norms are computed (``--grad-norm`` and the flags beside it).

    method: exact | sketch | loop | none (``--grad-norm``); chunk_size: tokens per batched VJP, an
    int or ``auto`` (parsed); max_memory: the budget of ``auto`` in MiB (None: the device's);
    probes: sketch directions K; seed: the sketch's and the random selections' seed; groups:
    ``layer`` | ``module`` | None (``--grad-groups``); strict: refuse an answer the exact engine
    refuses instead of sending it to the per-token loop; fidelity: auto | on | off (update fidelity).
    """

    method: str
    chunk_size: int | str
    max_memory: int | None
    probes: int
    seed: int
    groups: str | None
    strict: bool
    fidelity: str

    @property
    def max_memory_bytes(self) -> int | None:
        """``max_memory`` in bytes (None when unset)."""
        return None if self.max_memory is None else int(self.max_memory) * 2**20

    @classmethod
    def of(cls, opts: ProbeOptions, strict: bool = False) -> "EngineSettings":
        """The engine's part of checked probe options (``strict``: the job setting)."""
        return cls(method=opts.grad_norm, chunk_size=parse_chunk_size(opts.chunk_size),
                   max_memory=None if opts.max_memory is None else int(opts.max_memory), probes=int(opts.probes),
                   seed=int(opts.seed), groups=opts.grad_groups, strict=bool(strict), fidelity=opts.fidelity)


@dataclass(frozen=True)
class KernelSettings:
    """What the per-answer kernel reads: the objective and the engine.

    temperature: tau of ``softmax(z / tau)``; advantage: the estimator (docs/definitions.md section 3);
    loss: the objective omega is computed under (TRL's ``loss_type`` and the aliases resolved:
    :func:`gmts_analysis.core.objective.settings_of`); mask_truncated_completions: TRL's flag (answers
    without a stop token get loss weight 0); engine: :class:`EngineSettings`.
    """

    temperature: float
    advantage: str
    loss: LossSettings
    mask_truncated_completions: bool
    engine: EngineSettings

    @classmethod
    def of(cls, opts: ProbeOptions, strict: bool = False) -> "KernelSettings":
        """The kernel's part of checked probe options; resolves the loss (refused here, in one
        line, when the options do not describe an objective omega models)."""
        return cls(temperature=float(opts.temperature), advantage=opts.advantage, loss=settings_of(opts),
                   mask_truncated_completions=bool(opts.mask_truncated_completions),
                   engine=EngineSettings.of(opts, strict))


@dataclass(frozen=True)
class StatisticsSettings:
    """What the run's statistics read besides the tables (stats.json, docs/definitions.md section 5).

    rho: the keep fraction of the headline selections and update fidelity; uncertain_below: the
    probability under which a token belongs to the uncertain-token view; seed: the bootstrap's and
    the random selections' seed.
    """

    rho: float
    uncertain_below: float
    seed: int


@dataclass(frozen=True)
class ProbeSettings:
    """A probe's settings in the parts the layers read (module docstring).

    reader: how the rollouts are read (format, steps, reward columns, groups, chat template, completion
    limit, ``--truncate``; ``max_tokens``, the model's context, is filled in once the model is loaded);
    verifier: the reward function's name (None: the rollouts' rewards); device, dtype: where and in
    what the model is loaded (for a loaded model: its own); kernel: :class:`KernelSettings`;
    statistics: :class:`StatisticsSettings`.
    """

    reader: ReaderOptions
    verifier: str | None
    device: str
    dtype: str
    kernel: KernelSettings
    statistics: StatisticsSettings

    @classmethod
    def of(cls, opts: ProbeOptions, strict: bool = False) -> "ProbeSettings":
        """Check probe options once (:func:`gmts_analysis.probing.validate.validate_options`, then the loss
        options together while the loss is resolved) and split them into their parts (``strict``: the job
        setting). Raises :class:`~gmts_analysis.errors.GmtsError` naming the flag at fault."""
        validate.validate_options(opts)  # through the module: tests count its calls there
        return cls(reader=ReaderOptions.from_config(opts), verifier=opts.verifier, device=opts.device, dtype=opts.dtype,
                   kernel=KernelSettings.of(opts, strict),
                   statistics=StatisticsSettings(rho=float(opts.rho), uncertain_below=float(opts.uncertain_below),
                                                 seed=int(opts.seed)))

    def on_model(self, device: str, dtype: str) -> "ProbeSettings":
        """These settings for a model given loaded: its device and dtype recorded."""
        return dataclasses.replace(self, device=device, dtype=dtype)
