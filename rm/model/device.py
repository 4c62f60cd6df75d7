"""The one place that decides CUDA vs CPU, the compute dtype, and the distributed setup.

`--device auto|cpu|cuda|cuda:N`: auto takes CUDA when it is there. On CUDA the forward runs under
bf16 autocast (weights and optimizer stay fp32); on CPU everything is fp32, because bf16 matmuls are
slower than fp32 on CPUs without AMX (shared/ENVIRONMENT.md). Under `torchrun` (WORLD_SIZE > 1 in the
environment) the process group is NCCL on GPUs and gloo on CPU, each rank takes its LOCAL_RANK GPU.

    >>> resolve("cpu").type
    'cpu'
    >>> Dist().is_main, Dist().world_size
    (True, 1)
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

SMALL_MODEL = 2_000_000  # parameters; below this a CPU step runs on one thread


@dataclass(frozen=True)
class Dist:
    """Where this process stands in a (possibly single-process) run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


def resolve(spec: str = "auto", local_rank: int = 0) -> torch.device:
    """A torch device for `auto | cpu | cuda | cuda:N`; ValueError when CUDA is asked for but absent."""
    spec = (spec or "auto").lower()
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cpu":
        return torch.device("cpu")
    if not spec.startswith("cuda"):
        raise ValueError(f"--device {spec!r} is not one of auto, cpu, cuda, cuda:N")
    if not torch.cuda.is_available():
        raise ValueError(f"--device {spec} asked for CUDA but torch sees no GPU; use --device cpu")
    if spec == "cuda":
        spec = f"cuda:{local_rank}"
    device = torch.device(spec)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"--device {spec}: only {torch.cuda.device_count()} GPU(s) are visible")
    return device


def autocast(device: torch.device):
    """bf16 autocast on CUDA, nothing on CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def setup(spec: str = "auto") -> tuple[torch.device, Dist]:
    """Resolve the device and, under torchrun, join the process group (idempotent)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    info = Dist(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0")))
    device = resolve(spec, info.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if info.active and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return device, info


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: torch.nn.Module, device: torch.device, info: Dist) -> torch.nn.Module:
    """DistributedDataParallel around `model` under torchrun; the model itself otherwise."""
    if not info.active:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    # buffers here are fixed (rotary tables); broadcasting them each forward is wasted collectives
    return DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


def barrier(info: Dist) -> None:
    if info.active:
        dist.barrier()


def all_reduce_sum(values: list[float], device: torch.device, info: Dist) -> list[float]:
    """Element-wise sum of `values` over ranks (the values themselves when alone)."""
    if not info.active:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def broadcast_json(obj, info: Dist, device: torch.device):
    """Rank 0's JSON-able `obj` on every rank, sent as UTF-8 bytes (no pickle on the wire)."""
    if not info.active:
        return obj
    data = json.dumps(obj).encode() if info.is_main else b""
    size = torch.tensor([len(data)], dtype=torch.long, device=device)
    dist.broadcast(size, src=0)
    buf = torch.zeros(int(size.item()), dtype=torch.uint8, device=device)
    if info.is_main:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    dist.broadcast(buf, src=0)
    return json.loads(bytes(buf.cpu().tolist()).decode())


def set_threads(device: torch.device, info: Dist, n_params: int | None = None) -> int:
    """Set CPU threads for this rank and return the previous count (to restore it).

    The cores are shared among ranks. A model under SMALL_MODEL parameters gets one thread: its ops
    are too short to split, and thread hand-offs cost more than they save. OMP_NUM_THREADS overrides
    both.
    """
    previous = torch.get_num_threads()
    if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        threads = max(1, (os.cpu_count() or 1) // info.world_size)
        if n_params is not None and n_params < SMALL_MODEL:
            threads = 1
        torch.set_num_threads(threads)
    return previous


def shard(model: torch.nn.Module, device: torch.device, info: Dist) -> torch.nn.Module:
    """FSDP2 (`fully_shard`, Zhao et al. 2023 "PyTorch FSDP"): every transformer block (the classes a
    Hugging Face model names in `_no_split_modules`), then the rest, become units whose parameters,
    gradients and optimizer state are split over the ranks and gathered one unit at a time in the
    forward and backward, so a rank holds 1/world of the model plus one block. In place."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (info.world_size,))
    blocks = {name for m in model.modules() for name in (getattr(m, "_no_split_modules", None) or [])}
    for module in list(model.modules()):
        if type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def gradient_sync(net: torch.nn.Module, sync: bool):
    """A context in which backward passes reduce gradients over ranks only when `sync` (gradient
    accumulation): DDP's no_sync, or FSDP2's requires_gradient_sync."""
    if sync or not (dist.is_available() and dist.is_initialized()):
        return contextlib.nullcontext()
    if hasattr(net, "set_requires_gradient_sync"):
        return _fsdp_no_sync(net)
    return net.no_sync()


@contextlib.contextmanager
def _fsdp_no_sync(net):
    net.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        net.set_requires_gradient_sync(True)


def full_state_dict(module: torch.nn.Module) -> dict | None:
    """`module`'s state as whole CPU tensors on every rank when its parameters are sharded (a
    collective: every rank must call it, in the same order); None when they are not."""
    from torch.distributed.tensor import DTensor

    state = module.state_dict()
    if not any(isinstance(v, DTensor) for v in state.values()):
        return None
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu()
            for k, v in state.items()}


def all_reduce_min(value: int, device: torch.device, info: Dist) -> int:
    if not info.active:
        return value
    t = torch.tensor([value], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
