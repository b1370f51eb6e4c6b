"""One probe job's settings, checked once where the job is made: :class:`ProbeJob`.

``gmts probe``, ``gmts run``, ``gmts merge`` and a checkpoint series each make their job with
:meth:`ProbeJob.of`: the one check of the options, where they are split into parts
(:meth:`gmts_analysis.probing.settings.ProbeSettings.of`). The job hands each layer its own part:
the readers, the kernel and the engine get :attr:`ProbeJob.probe`'s parts; the run directory's
state and manifest get :attr:`ProbeJob.config`, the record of every option and job setting as
given (``manifest.json`` ``config``, the run's fingerprint, ``run.json`` for ``gmts merge``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gmts_analysis.options.config import ProbeConfig, ProbeOptions
from gmts_analysis.probing.settings import ProbeSettings


@dataclass(frozen=True)
class ProbeJob:
    """A checked probe job: ``config``, the record (every field of :class:`ProbeConfig`: job settings
    and probe options as given), and ``probe``, its probe options in the parts each layer reads."""

    config: ProbeConfig
    probe: ProbeSettings

    @classmethod
    def of(cls, cfg: ProbeConfig) -> "ProbeJob":
        """Check ``cfg`` (each option in its domain and the options together) and split it, once.
        Raises :class:`~gmts_analysis.errors.GmtsError` naming the flag at fault."""
        return cls(config=cfg, probe=ProbeSettings.of(cfg, strict=cfg.strict))

    def recorded(self, **changes: object) -> "ProbeJob":
        """This job with job settings of the record changed (``rollouts`` once ``gmts run`` sampled them,
        ``answers_per_chunk`` once resolved); the probe's options, checked and split, stay as they are."""
        options = {f.name for f in dataclasses.fields(ProbeOptions)}
        if options & set(changes):
            raise ValueError(f"{sorted(options & set(changes))}: probe options; make a new job (ProbeJob.of)")
        return ProbeJob(config=dataclasses.replace(self.config, **changes), probe=self.probe)
