"""The domains of option values: ``check(flag, value)`` functions named in the options' declarations.

Each raises :class:`~gmts_analysis.errors.GmtsError` with one line naming the flag (``--rho: must be a
keep fraction in (0, 1], got 2``). An option declares its check once (``opt(..., check=checks.rho)``,
:mod:`gmts_analysis.options.fields`); :func:`check_fields` runs them over parsed flags or API keywords.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from gmts_analysis.core.sizes import parse_chunk_size
from gmts_analysis.core.vocabulary import check_rho, is_probability
from gmts_analysis.errors import GmtsError
from gmts_analysis.options.fields import flag
from gmts_analysis.readers import models
from gmts_analysis.readers.gguf import check_gguf_file, find_gguf
from gmts_analysis.readers.models import ALIASES, DTYPE_NAMES, REAL_MODELS, resolve_device, resolve_model_path
from gmts_analysis.readers.sources import parse_steps
from gmts_analysis.readers.verifiers import resolve_verifier
from gmts_analysis.sampling.names import domain_list
from gmts_analysis.toy.domains import DOMAINS
from gmts_analysis.util.io import require_regular, special_kind

SEED_MAX = 2**63 - 1
#: the most sketch directions --probes takes (K forward-mode passes per answer)
MAX_PROBES = 4096


def int_value(flag: str, v: Any) -> int:
    if isinstance(v, bool) or isinstance(v, float) and not v.is_integer():
        raise GmtsError(f"{flag}: expected an integer, got {v!r}")
    try:
        return int(str(v).strip()) if not isinstance(v, (int, float)) else int(v)
    except (TypeError, ValueError):
        raise GmtsError(f"{flag}: expected an integer, got {v!r}") from None


def float_value(flag: str, v: Any) -> float:
    if isinstance(v, bool):
        raise GmtsError(f"{flag}: expected a number, got {v!r}")
    try:
        return float(v)
    except (TypeError, ValueError):
        raise GmtsError(f"{flag}: expected a number, got {v!r}") from None


def int_at_least(k: int, why: str = "") -> Any:
    def check(flag: str, v: Any) -> None:
        for x in (v if isinstance(v, (list, tuple)) else [v]):
            n = int_value(flag, x)
            if n < k:
                raise GmtsError(f"{flag}: must be an integer >= {k}{f' ({why})' if why else ''}, got {x}")
    return check


def seed(flag: str, v: Any) -> None:
    for x in (v if isinstance(v, (list, tuple)) else [v]):
        n = int_value(flag, x)
        if not 0 <= n <= SEED_MAX:
            raise GmtsError(f"{flag}: must be an integer in [0, {SEED_MAX}], got {x}")


def positive_finite(flag: str, v: Any) -> None:
    x = float_value(flag, v)
    if not (math.isfinite(x) and x > 0):
        raise GmtsError(f"{flag}: must be a finite number > 0, got {v}")


def nonneg_finite(flag: str, v: Any) -> None:
    x = float_value(flag, v)
    if not (math.isfinite(x) and x >= 0):
        raise GmtsError(f"{flag}: must be a finite number >= 0, got {v}")


def difficulty(flag: str, v: Any) -> None:
    n = int_value(flag, v)
    if not 1 <= n <= 3:
        raise GmtsError(f"{flag}: must be a difficulty level 1, 2 or 3, got {v}")


def rho(flag: str, v: Any) -> None:
    """A keep fraction: the domain of :func:`gmts_analysis.core.vocabulary.check_rho`, in the flags' wording."""
    try:
        check_rho(float_value(flag, v), flag)
    except ValueError:
        raise GmtsError(f"{flag}: must be a keep fraction in (0, 1], got {v}") from None


def probability(flag: str, v: Any) -> None:
    x = float_value(flag, v)
    if not is_probability(x):
        raise GmtsError(f"{flag}: must be a probability in (0, 1], got {v}")


def device(flag: str, v: Any) -> None:
    try:
        resolve_device(str(v))
    except GmtsError as e:
        msg = str(e)
        raise GmtsError(msg if msg.startswith(flag) else f"{flag}: {msg.split(': ', 1)[-1]}") from None


def dtype(flag: str, v: Any) -> None:
    if v not in DTYPE_NAMES:
        raise GmtsError(f"{flag}: unknown dtype '{v}' (choose from {', '.join(DTYPE_NAMES)})")


def domains(flag: str, v: Any) -> None:
    """Sampling domains: the toy domains and the word problems (gmts run, gmts sample)."""
    domain_list(v, flag=flag)


def toy_domains(flag: str, v: Any) -> None:
    """Training domains: the toy domains only (gmts rl)."""
    domain_list(v, tuple(DOMAINS), flag)


def verifier(flag: str, v: Any) -> None:
    resolve_verifier(v)


def int_list(flag: str, v: Any) -> None:
    items = [x.strip() for x in str(v).split(",")]
    try:
        vals = [int(x) for x in items]
    except ValueError:
        raise GmtsError(f"{flag}: expected integers separated by commas, got '{v}'") from None
    if not vals or min(vals) < 1:
        raise GmtsError(f"{flag}: every value must be an integer >= 1, got '{v}'")


def step_spec(flag: str, v: Any) -> None:
    """Training steps: ``'10,20'`` or ranges ``'10-30'`` (:func:`gmts_analysis.readers.sources.parse_steps`)."""
    try:
        parse_steps(v)
    except GmtsError as e:
        raise GmtsError(f"{flag}: {str(e).split(': ', 1)[-1]}") from None


def output_path(flag: str, v: Any) -> None:
    """Something can be created at ``v``: no existing ancestor is a file, no part is a dangling link."""
    from pathlib import Path

    p = Path(str(v)).expanduser()
    for q in (p, *p.parents):
        if q.is_symlink() and not q.exists():
            raise GmtsError(f"{flag} {v}: {q} is a symbolic link to {q.readlink()}, which does not exist")
        if q != p and q.exists() and not q.is_dir():
            raise GmtsError(f"{flag} {v}: {q} is a file, so nothing can be created under it")
    if ".." in p.parts:  # `nope/../run` would create nope/ first: resolved lexically, refused if nope/ is absent
        anc = Path(*p.parts[:p.parts.index("..")])
        if not anc.is_dir():
            raise GmtsError(f"{flag} {v}: {anc} does not exist (write the path without '..')")


def input_file(flag: str, v: Any) -> None:
    from pathlib import Path

    for x in (v if isinstance(v, (list, tuple)) else [v]):
        p = Path(str(x))
        if not p.exists():
            raise GmtsError(f"{flag} {x}: no such file")
        if p.is_dir():
            raise GmtsError(f"{flag} {x}: is a directory, not a file")
        require_regular(p, f"{flag} {x}")


def input_path(flag: str, v: Any) -> None:
    from pathlib import Path

    for x in (v if isinstance(v, (list, tuple)) else [v]):
        if not Path(str(x)).exists():
            raise GmtsError(f"{flag} {x}: no such file or directory")
        require_regular(str(x), f"{flag} {x}")


def model(flag: str, v: Any) -> None:
    """A shipped policy or real-model name, a hub id, a model directory, a ``.gguf`` file (or a folder holding
    one: checked whole) or a checkpoint list; another existing file is refused, and a near-miss of a shipped
    name gets a did-you-mean instead of a hub download."""
    from pathlib import Path

    p = Path(str(v))
    if (p.suffix.lower() == ".gguf" and (p.is_file() or p.is_symlink() or special_kind(p))) or \
            (p.is_dir() and find_gguf(p) is not None):  # a GGUF file, or the one in a folder: checked whole
        check_gguf_file(find_gguf(p) or p, flag)
        return
    if p.exists() and not p.is_dir():
        raise GmtsError(f"{flag} {v}: is a file; give a model directory, a .gguf file, a hub id, or "
                        "tiny | small | smollm2")
    s = str(v)
    if not p.exists() and "/" not in s and "," not in s and s not in ALIASES + REAL_MODELS:
        import difflib

        close = difflib.get_close_matches(s.lower(), ALIASES + REAL_MODELS, n=2, cutoff=0.6)
        close += [n for n in ALIASES + REAL_MODELS if s and n.startswith(s.lower()) and n not in close]
        if close and not models.hub_cached(s):  # a typo of a shipped name, not a hub id to download
            raise GmtsError(f"{flag} {v}: not a shipped model, a local directory or a cached hub id; did you "
                            f"mean {' or '.join(close[:2])}? (a hub id is written org/name)")
    resolve_model_path(s)


def probes(flag: str, v: Any) -> None:
    n = int_value(flag, v)
    if not 2 <= n <= MAX_PROBES:
        raise GmtsError(f"{flag}: must be an integer in [2, {MAX_PROBES}] (a sketch needs two directions for "
                        f"its error bar; past a few thousand, --grad-norm exact costs less and is exact), got {n}")


def chunk_size(flag: str, v: Any) -> None:
    parse_chunk_size(v, flag)


def number_in(low: float, high: float | None = None, low_open: bool = False, high_open: bool = True,
              domain: str = "") -> Any:
    """A finite number in the interval from ``low`` to ``high`` (None: no upper bound)."""
    def check(flag: str, v: Any) -> None:
        x = float_value(flag, v)
        ok = math.isfinite(x) and (x > low if low_open else x >= low)
        if high is not None:
            ok = ok and (x < high if high_open else x <= high)
        if not ok:
            raise GmtsError(f"{flag}: must be {domain}, got {x}")
    return check


def check_fields(fields: Mapping[str, dataclasses.Field], values: Mapping[str, Any]) -> None:
    """Every value of ``values`` whose field declares a ``check``, in field order (None: not given)."""
    for name, f in fields.items():
        check = f.metadata.get("check")
        v = values.get(name)
        if check is None or v is None:
            continue
        check(flag(name), v)
