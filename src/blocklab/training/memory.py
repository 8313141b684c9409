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
