"""The kernel choice: where two kernels compute the same thing, which one a built model runs.
Runtime policy, per device: the model's definition computes the reference and reads none of this;
the kernels swapped into it (runtime/fused_projections.py, runtime/shaped_mix.py, runtime/prefix_sums.py)
and the compiled paths do. One place decides (`KERNELS`); a benchmark or a test changes it for a block
of code with `kernel_choice`, never by setting a module's flags."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Literal


@dataclass(frozen=True)
class KernelChoice:
    """Which kernel an op runs where there are two that compute the same thing: `KERNELS` holds the
    one in force.

    scan_t_innermost: device types whose prefix sums along T run with T as the innermost (contiguous)
        axis, after one transposing copy that also casts to float32. CUDA's cumsum over an outer axis
        runs one thread per column, sequentially along the axis (pytorch/pytorch#122170), while the
        innermost-axis kernel scans each row with a whole block; on the CPU the strided scan is the
        faster (benchmarks/bench_centering.py times both layouts: its "other scan" rows).
    compiled_mix: under torch.compile, shaped attention's fused mix (`shaped_mix.shaped_mix`) as
        "plain" ops (inductor derives and fuses the backward itself) or as the autograd "function"
        `ShapedMix` that eager runs.
    fused_projections: device types where the "auto" mode of `fused_projections.set_fused_projections`
        runs the maps that read one input as one GEMM outside decoding: CUDA, where one bigger GEMM in
        place of two to four means fewer launches and better tile use; not the CPU, where the weights'
        copy costs about what the merge saves (docs/design.md, "The training step on a GPU").
    compiled_shaped: device types where a compiled training graph (`compile_model`, `compile_blocks`)
        of shaped attention (alpha I + beta A - gamma C) is trusted. Not CUDA: on an H200 with torch
        2.11 its compiled gradients at sequence 1024 were far from eager's (benchmarks/RESULTS.md,
        2026-11-28), so compiling it there is refused (`runtime.compiled_trunk.check_compile_trusted`)
        until a GPU test (tests/test_cuda.py, which adds "cuda" here) passes.
    """

    scan_t_innermost: frozenset[str] = frozenset({"cuda"})
    compiled_mix: Literal["plain", "function"] = "plain"
    fused_projections: frozenset[str] = frozenset({"cuda"})
    compiled_shaped: frozenset[str] = frozenset({"cpu"})


KERNELS = KernelChoice()


@contextmanager
def kernel_choice(**changes: Any) -> Iterator[KernelChoice]:
    """Within the block, `KERNELS` with `changes` (fields of `KernelChoice`); the choice before after."""
    global KERNELS
    saved = KERNELS
    KERNELS = replace(saved, **changes)
    try:
        yield KERNELS
    finally:
        KERNELS = saved
