"""What a run was made with, read from its manifest.json: :class:`RunSettings`.

A run directory's ``manifest.json`` records ``config`` (every field of the job's
:class:`~gmts_analysis.options.config.ProbeConfig`). Runs written by older versions lack the
fields added since (``rho``, ``uncertain_below``, ...), and a hand-edited manifest may hold a
value of the wrong type. :meth:`RunSettings.from_manifest` applies, in this one place, the
declared default of every field the manifest does not record as a value of the field's type:
the same default a new run gets.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from gmts_analysis.options.config import ProbeConfig

_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,), "dict": (dict,)}


def _typed(f: dataclasses.Field, v: Any) -> bool:
    """``v`` is a value of field ``f``'s declared type (None counts when the default is None)."""
    if v is None:
        return f.default is None
    want = _TYPES.get(str(f.type))
    if want is None:
        return True
    return isinstance(v, want) and (bool in want or not isinstance(v, bool))


@dataclass
class RunSettings(ProbeConfig):
    """A run's options and job settings as recorded in its manifest, old runs' defaults applied."""

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any] | None) -> "RunSettings":
        """The settings of the run whose manifest.json is ``manifest`` (any value: a missing or
        malformed manifest gives the defaults)."""
        cfg = manifest.get("config") if isinstance(manifest, Mapping) else None
        cfg = cfg if isinstance(cfg, Mapping) else {}
        kw = {}
        for f in dataclasses.fields(cls):
            if f.name in cfg and _typed(f, cfg[f.name]):
                v = cfg[f.name]
                kw[f.name] = float(v) if str(f.type) == "float" and v is not None else v
        return cls(**kw)
