"""Multi-process training under `torchrun`: DDP, or FSDP2 (`fully_shard`) per block.

Each process reads its own rows of the same global batch (the data is a pure function of the step),
so a run on W processes sees exactly the batches of a single-process run. The model code knows
nothing of this: blocks pass their cross-layer state explicitly, so FSDP can wrap each block.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn


@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


def launch_rank() -> int:
    """This process's rank as torchrun set it (0 when run alone), readable before and after training."""
    return int(os.environ.get("RANK", "0"))


def setup(device: torch.device) -> DistEnv:
    """Join the process group torchrun describes (gloo on CPU, nccl on CUDA); no-op when run alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistEnv()
    env = DistEnv(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return env


def teardown(env: DistEnv) -> None:
    if env.active and dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: nn.Module, env: DistEnv, parallel: str, device: torch.device) -> nn.Module:
    """DDP (default) or FSDP2: each block sharded on its own, then the rest of the model."""
    if not env.active:
        return model
    if parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") and isinstance(model.module, nn.Module) else model


def is_sharded(model: nn.Module) -> bool:
    return any(hasattr(p, "full_tensor") for p in model.parameters())


def full_states(model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> tuple[dict, list[dict]]:
    """Unsharded model and optimizer state dicts on the CPU (every rank must call this under FSDP)."""
    if not is_sharded(model):
        return unwrap(model).state_dict(), [opt.state_dict() for opt in optimizers]
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=options)
    return weights, [get_optimizer_state_dict(model, opt, options=options) for opt in optimizers]


def load_full_states(model: nn.Module, optimizers: list[torch.optim.Optimizer], weights: dict,
                     optim_states: list[dict]) -> None:
    if not is_sharded(model):
        unwrap(model).load_state_dict(weights)
        for opt, state in zip(optimizers, optim_states, strict=False):
            opt.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
    set_model_state_dict(model, weights, options=options)
    for opt, state in zip(optimizers, optim_states, strict=False):
        set_optimizer_state_dict(model, opt, state, options=options)


def mean_across(value: Tensor, env: DistEnv) -> Tensor:
    if env.active:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.AVG if dist.get_backend() == "nccl" else dist.ReduceOp.SUM)
        if dist.get_backend() != "nccl":
            value /= env.world_size
    return value


def barrier(env: DistEnv) -> None:
    if env.active:
        dist.barrier()
