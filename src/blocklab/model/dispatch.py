"""Calling submodules on the hot path with less per-call dispatch than `nn.Module.__call__`.

`module(x)` goes through `nn.Module.__call__`: two Python frames that look for compiled code, JIT
tracing and eight hook tables before they reach `module.forward(x)`. A block calls a dozen
submodules, so on one CPU thread that dispatch is a sizeable part of a decoding step's Python time
at small sizes. `call(module, *args)` makes the same checks inline and calls `forward` directly
when none applies, which is exactly what `__call__` would do; otherwise (a forward or backward hook
on the module or a global one, a compiled module, a class with its own `__call__`, JIT tracing, or
under `torch.compile`, which traces module calls itself) it calls `module(*args)`. Hooks
(diagnostics, FSDP2) and compilation behave as before.

It reads private parts of `torch.nn.Module` (the hook tables, `_compiled_call_impl`), which torch
has kept since 2.2; without them every call is the plain `module(*args)`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

_MODULE_CALL = nn.Module.__call__
_compiling = torch.compiler.is_compiling
_tracing = torch._C._get_tracing_state

try:  # the global hook tables, mutated in place by torch.nn.modules.module.register_module_*_hook
    from torch.nn.modules.module import (
        _global_backward_hooks,
        _global_backward_pre_hooks,
        _global_forward_hooks,
        _global_forward_pre_hooks,
    )

    _PRIVATE_API = all(hasattr(nn.Module(), a) for a in ("_forward_hooks", "_forward_pre_hooks",
                                                         "_backward_hooks", "_backward_pre_hooks",
                                                         "_compiled_call_impl"))
except ImportError:  # pragma: no cover - a torch that moved them
    _PRIVATE_API = False


def call(module: nn.Module, *args: Any) -> Any:
    """`module(*args)`, calling `module.forward(*args)` directly when `__call__` would do just that."""
    if (not _PRIVATE_API or _compiling() or _global_forward_hooks or _global_forward_pre_hooks
            or _global_backward_hooks or _global_backward_pre_hooks or _tracing()
            or module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
            or module._backward_pre_hooks or module._compiled_call_impl is not None
            or type(module).__call__ is not _MODULE_CALL):
        return module(*args)
    return module.forward(*args)
