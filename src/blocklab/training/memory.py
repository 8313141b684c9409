"""Peak memory of one run: CUDA's allocator statistics, or the process's RSS high-water mark."""

from __future__ import annotations

import ctypes
import resource
import sys
from pathlib import Path

import torch


def reset_peak_memory(device: torch.device) -> None:
    """Start a per-run peak: CUDA's allocator statistics, or (Linux) the process's RSS high-water mark."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:  # give memory freed by an earlier run in this process back to the OS, so it does not count
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc
    try:
        Path("/proc/self/clear_refs").write_text("5")  # "5" resets VmHWM to the current RSS
    except OSError:
        pass  # not Linux, or not allowed: the peak is the process's lifetime peak (ru_maxrss)


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
