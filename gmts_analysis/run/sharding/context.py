"""Where this process sits in a torchrun job: rank, world size, its device, the process group.

torchrun (``python -m torch.distributed.run``) sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT`` for every process it starts. Without them the probe is
one process of a world of one, and no process group is created.

The probe exchanges only a few small control messages between ranks (rank 0's decision
about the run directory), never tensors: the ``gloo`` backend serves on CPU and GPU alike.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gmts_analysis.errors import GmtsError

# seconds a rank waits in a collective (rank 0 reads the run directory while others wait)
TIMEOUT_ENV = "GMTS_DIST_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 2 * 3600


@dataclass(frozen=True)
class DistContext:
    """This process's place in the job (a single process is rank 0 of 1)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise GmtsError(f"environment variable {name}={v!r}: expected an integer") from None


def context_from_env() -> DistContext:
    """Read ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` (as torchrun sets them)."""
    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local = _env_int("LOCAL_RANK", rank if world > 1 else 0)
    if world < 1 or not 0 <= rank < world:
        raise GmtsError(f"environment: RANK={rank} WORLD_SIZE={world} is not a valid rank")
    return DistContext(rank=rank, world_size=world, local_rank=local)


def rank_device(ctx: DistContext, spec: str) -> str:
    """The device this rank probes on.

    ``auto`` and ``cuda`` give ``cuda:LOCAL_RANK`` when CUDA is available (``auto`` falls
    back to ``cpu``); ``cpu`` stays ``cpu``. An explicit ``cuda:N`` is kept in a
    single process and replaced by ``cuda:LOCAL_RANK`` under torchrun (each rank owns
    the GPU of its local rank).
    """
    import torch

    if spec == "cpu":
        return "cpu"
    if spec == "auto" and not torch.cuda.is_available():
        return "cpu"
    if spec in ("auto", "cuda") or (spec.startswith("cuda:") and ctx.distributed):
        if not ctx.distributed and spec in ("auto", "cuda"):
            return "cuda"
        return f"cuda:{ctx.local_rank}"
    return spec


@contextlib.contextmanager
def process_group(ctx: DistContext) -> Iterator[None]:
    """Create the ``gloo`` process group for a torchrun job (nothing for one process)."""
    if not ctx.distributed:
        yield
        return
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)))
    created = False
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=ctx.rank, world_size=ctx.world_size, timeout=timeout)
        created = True
    try:
        yield
    finally:
        if created and dist.is_initialized():
            dist.destroy_process_group()


def broadcast_from_main(ctx: DistContext, obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (a picklable object; identity for one process)."""
    if not ctx.distributed:
        return obj
    import torch.distributed as dist

    box = [obj if ctx.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
