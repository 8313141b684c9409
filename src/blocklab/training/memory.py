"""Peak memory of one run: CUDA's allocator statistics, or the process's RSS high-water mark; the bytes
attributed to one model's training step; and, before a run builds its model, whether the weights,
gradients and optimizer state it will keep can fit at all (`check_training_fits`)."""

from __future__ import annotations

import ctypes
import os
import resource
import sys
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from blocklab.util.errors import ConfigError

if TYPE_CHECKING:
    from blocklab.model import ModelConfig
    from blocklab.training.config import TrainConfig


def reset_peak_memory(device: torch.device) -> None:
    """Start a per-run peak: CUDA's allocator statistics, or (Linux) the process's RSS high-water mark."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    _trim_malloc()
    try:
        Path("/proc/self/clear_refs").write_text("5")  # "5" resets VmHWM to the current RSS
    except OSError:
        pass  # not Linux, or not allowed: the peak is the process's lifetime peak (ru_maxrss)


def _trim_malloc() -> None:
    """Give memory freed by an earlier run in this process back to the OS, so that it does not count."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc


def peak_memory_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # KiB
    except (OSError, ValueError, IndexError):
        pass
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


# -- memory attributed to the model (blocklab compare's report) ------------------------------------------
# The process peak above counts everything the process holds: the Python interpreter, torch's own
# libraries and allocator caches, the data. The functions below count only what one model's training
# step needs, from the tensors themselves, so that two architectures can be compared on any device.
def parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters (each counted once, tied weights too): 4 x count in float32."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def gradient_bytes(model: torch.nn.Module) -> int:
    """Bytes of one gradient per trainable parameter, in the parameter's dtype (as autograd keeps them)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def optimizer_state_bytes(optimizers) -> int:
    """Bytes of the tensors the optimizers keep between steps (AdamW: exp_avg, exp_avg_sq and a step
    count per parameter; Muon: a momentum buffer per matrix), read from their state after a step."""
    seen: set[int] = set()
    total = 0
    for opt in optimizers:
        for state in opt.state.values():
            for value in state.values():
                if torch.is_tensor(value) and value.data_ptr() not in seen:
                    seen.add(value.data_ptr())
                    total += value.numel() * value.element_size()
    return total


class SavedTensorTracker:
    """Counts the bytes autograd keeps for the backward pass while the context is open: every tensor
    saved by an operation (`torch.autograd.graph.saved_tensors_hooks`), each storage once, the
    parameters themselves left out (they are counted as parameters). This is the activation memory of
    a step on any device, CPU included, where no allocator statistics exist."""

    def __init__(self, model: torch.nn.Module):
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.storages: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # a tensor subclass without a storage of its own
            return tensor
        ptr = storage.data_ptr()
        if ptr and ptr not in self.params:
            self.storages[ptr] = max(self.storages.get(ptr, 0), storage.nbytes())
        return tensor

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())

    def __enter__(self) -> SavedTensorTracker:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)


# -- will the training fit? (before the model is built) --------------------------------------------------
# A model too large for the machine otherwise fails deep inside torch's allocator, with a traceback, or
# (CPU, overcommitted memory) after the weights were half initialised and the machine swapped. The trainer
# asks first, from the config alone, and refuses only what cannot work: the estimate is a lower bound.
MEMORY_CHECK_ENV = "BLOCKLAB_MEMORY_CHECK"  # "off" (or 0, false, no): skip the check
MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True)
class TrainingBytes:
    """What one process keeps in memory for the whole of a run, in bytes: the model's weights (its
    parameters, each once, and buffers), one gradient per trainable parameter, and the optimizers'
    state. Activations, autocast's bfloat16 weight copies and allocator slack come on top: a lower bound."""

    parameters: int
    weights: int
    gradients: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer


def training_bytes(model_cfg: ModelConfig, optim_cfg, shards: int = 1) -> TrainingBytes:
    """`TrainingBytes` of training `model_cfg` with `optim_cfg` (an OptimConfig), from the config alone:
    the model is built on the meta device (shapes and dtypes, no storage). The trainer keeps float32
    weights and gradients (bfloat16 is autocast, with no master copy); AdamW keeps two moments
    (exp_avg, exp_avg_sq) in the parameter's dtype and a float32 step count per tensor, Muon one
    momentum buffer per matrix of its group (`optim.named_groups`). `shards`: FSDP's processes, which
    split gradients and optimizer state (each builds the whole model before sharding it)."""
    from blocklab.runtime import LanguageModel
    from blocklab.training.optim import named_groups

    with torch.device("meta"):
        model = LanguageModel(model_cfg)
    weights = sum(t.numel() * t.element_size() for t in chain(model.parameters(), model.buffers()))
    groups = named_groups(model, muon=optim_cfg.name == "muon", nanochat=optim_cfg.name == "nanochat")
    gradients = optimizer = 0
    for group, params in groups.items():
        for _, p in params:
            size = p.numel() * p.element_size()
            gradients += size
            optimizer += size if group == "muon" else 2 * size + 4
    return TrainingBytes(sum(p.numel() for p in model.parameters()), weights,
                         -(-gradients // shards), -(-optimizer // shards))


def available_bytes(device: torch.device) -> tuple[int, str] | None:
    """Memory a run on `device` can still take, and where the number comes from; None where it cannot
    be read (mps, a system without /proc/meminfo or sysconf). CUDA: the device's free memory plus what
    torch holds cached but unused (an earlier run in this process); CPU: MemAvailable plus SwapFree
    (slow, but not impossible), else free pages (os.sysconf)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return free + cached, "torch.cuda.mem_get_info, with torch's unused cache"
    if device.type != "cpu":
        return None
    _trim_malloc()
    info = _meminfo()
    if "MemAvailable" in info:
        return info["MemAvailable"] + info.get("SwapFree", 0), "MemAvailable + SwapFree in /proc/meminfo"
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free pages (os.sysconf)"
    except (ValueError, OSError, AttributeError):  # not POSIX, or the names are unknown
        return None


def _meminfo() -> dict[str, int]:
    """/proc/meminfo's fields in bytes ({} where it cannot be read)."""
    try:
        text = MEMINFO.read_text()
    except OSError:
        return {}
    info = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        words = value.split()
        if words and words[0].isdigit():
            info[name.strip()] = int(words[0]) * (1024 if words[1:] == ["kB"] else 1)
    return info


def check_training_fits(cfg: TrainConfig, model_cfg: ModelConfig, device: torch.device,
                        world_size: int = 1) -> None:
    """Refuse (ConfigError) a run whose weights, gradients and optimizer state (`training_bytes`)
    exceed the memory available on `device`, with the numbers and the largest model that would fit.
    On CPU the processes of one machine (torchrun's LOCAL_WORLD_SIZE) share it. Skipped with
    BLOCKLAB_MEMORY_CHECK=off, or where the available memory cannot be read."""
    if os.environ.get(MEMORY_CHECK_ENV, "").strip().lower() in ("off", "0", "false", "no"):
        return
    available = available_bytes(device)
    if available is None:
        return
    need = training_bytes(model_cfg, cfg.optim, world_size if cfg.parallel == "fsdp" else 1)
    processes = _local_processes() if device.type == "cpu" else 1
    if need.total * processes <= available[0]:
        return
    each = need.total / max(need.parameters, 1)
    allowed = int(available[0] / processes / each)  # parameters
    per = f" per process, x {processes} processes on this machine" if processes > 1 else ""
    given = ", ".join(f"model.{k}={v}" for k, v in cfg.model.items())
    raise ConfigError(
        f"the model does not fit in memory: {cfg.arch} at size {cfg.size}{f' with {given}' if given else ''} "
        f"has {need.parameters:,} parameters, and training keeps at least {_gib(need.total)}{per} for the "
        f"whole run (weights {_gib(need.weights)}, gradients {_gib(need.gradients)}, optimizer state "
        f"{_gib(need.optimizer)} with optim.name={cfg.optim.name}; activations come on top), where {device} "
        f"has {_gib(available[0])} available ({available[1]}). Allowed here: about {allowed:,} "
        f"parameters at {each:.0f} bytes each. Choose a smaller model (model.vocab_size, model.d_model, "
        f"model.n_layers or size), or set {MEMORY_CHECK_ENV}=off to try anyway.")


def _local_processes() -> int:
    try:
        return max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1)
    except ValueError:
        return 1


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"
