"""The one seed scheme: every random stream is derived from ``(seed, purpose, ...)``.

:func:`derive_seed` hashes the key's text (``"/".join(map(str, key))``) with SHA-256 and
keeps the top ``bits`` bits of the first 8 bytes: stable across runs, processes,
platforms and Python versions (no ``hash()``), independent for different keys. Callers put
the user's seed first and then name the purpose (``derive_seed(seed, "bootstrap",
"within_answer")``), so that two uses of one seed never share a stream.

Streams are local generators (:func:`numpy_rng`, :func:`torch_generator`); library code
never seeds the global generators. Where a third-party function can only draw from
torch's global generator (``from_config`` weight init, ``generate``),
:func:`seeded_global_rng` seeds it inside a :func:`torch.random.fork_rng` block, so the
caller's global state is restored on exit.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import torch


def derive_seed(*key: object, bits: int = 63) -> int:
    """A ``bits``-bit seed (1..64) from ``key``: the top bits of SHA-256(``"/".join(map(str, key))``)[:8]."""
    if not 1 <= bits <= 64:
        raise ValueError(f"bits must be in 1..64, got {bits}")
    h = hashlib.sha256("/".join(map(str, key)).encode("utf-8")).digest()
    return int.from_bytes(h[:8], "big") >> (64 - bits)


def numpy_rng(*key: object) -> "np.random.Generator":
    """A numpy Generator seeded with :func:`derive_seed` of ``key``."""
    import numpy as np

    return np.random.default_rng(derive_seed(*key))


def torch_generator(*key: object, device: "str | torch.device" = "cpu") -> "torch.Generator":
    """A torch Generator on ``device`` seeded with :func:`derive_seed` of ``key``."""
    import torch

    return torch.Generator(device=device).manual_seed(derive_seed(*key))


@contextlib.contextmanager
def seeded_global_rng(seed: int, devices: list | None = None) -> Iterator[None]:
    """Seed torch's global generator with ``seed`` for the block, then restore the caller's state.

    For code that can only draw from the global generator (``AutoModelForCausalLM.from_config``
    initialisation, ``model.generate`` sampling). ``devices``: CUDA devices whose state to fork
    too (default: none; pass ``[i]`` when the block draws on ``cuda:i``).
    """
    import torch

    with torch.random.fork_rng(devices=devices or []):
        torch.manual_seed(int(seed))
        yield
