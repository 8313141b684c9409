"""The decoding step compiled as one `torch.compile` graph for one model (`Transformer.compile_decoding`).

Two facts of dynamo and inductor shape it:

- dynamo keeps compiled code, and its recompile limit (8), per code object. One `decode_step` code
  object shared by every model would let the ninth model of another shape in a process fail to
  compile, so each step compiles its own copy of the code (`_own_code`).
- inductor's weight freezing (``torch._inductor.config.freezing``) folds the parameters into the
  compiled code as constants (on CPU, linear weights prepacked for MKL), which is what lets the
  compiled step pass a hand-written eager loop (benchmarks/RESULTS.md). Dynamo reads the flag when it
  traces (parameters become graph constants) and inductor when it compiles, and both happen inside a
  call of the step, so the flag is set around every call rather than once. Folded weights do not see
  later in-place changes; the step records what its weights were and `is_current` tells the model to
  compile again once they changed.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from blocklab.model.cache import KVCache

Step = Callable[[Tensor, "KVCache"], Tensor]


def _own_code(method: Step) -> types.MethodType:
    """`method` (a bound method) with its own copy of the function's code object."""
    assert isinstance(method, types.MethodType)
    fn = method.__func__
    assert isinstance(fn, types.FunctionType)
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__,
                              fn.__closure__)
    return types.MethodType(copy, method.__self__)


def weights_state(model: nn.Module) -> list[tuple[int, int, int]]:
    """(identity, version counter, storage address) of every parameter and buffer: changes with an
    optimiser step or any other in-place update (the version), `load_state_dict(assign=True)` (the
    identity) and ``p.data = ...`` (the address)."""
    return [(id(t), t._version, t.data_ptr()) for t in itertools.chain(model.parameters(), model.buffers())]


class CompiledStep:
    """`step` (the model's `decode_step`) as one compiled graph: ``step(input_ids, cache)`` gives
    next-token logits."""

    def __init__(self, model: nn.Module, step: Step, freeze_weights: bool,
                 compile_kwargs: dict[str, Any]):
        backend = compile_kwargs.get("backend", "inductor")
        if freeze_weights and backend != "inductor":
            raise ValueError(f"compile_decoding(freeze_weights=True) needs the inductor backend, which folds "
                             f"the weights; got backend={backend!r}. Leave out backend or freeze_weights.")
        self.owner = id(model)
        self.freeze_weights = freeze_weights
        self.compile_kwargs = compile_kwargs
        self._step = torch.compile(_own_code(step), **compile_kwargs)
        self._folded = weights_state(model) if freeze_weights else None

    def is_current(self, model: nn.Module) -> bool:
        """False for a deep copy of the model it was compiled for (it would run the original's weights)
        and, with frozen weights, once the model's weights changed since they were folded."""
        return self.owner == id(model) and (self._folded is None or self._folded == weights_state(model))

    def __call__(self, input_ids: Tensor, cache: KVCache) -> Tensor:
        if not self.freeze_weights:
            return self._step(input_ids, cache)
        return run_frozen(self._step, input_ids, cache)


def run_frozen(compiled: Callable[..., Tensor], *args: Any) -> Tensor:
    """``compiled(*args)`` with inductor's `freezing` flag on, restored after: dynamo reads it when it
    traces and inductor when it compiles, both inside a call."""
    import torch._inductor.config as config  # here: inductor takes a second to import

    before = config.freezing
    config.freezing = True
    try:
        return compiled(*args)
    finally:
        config.freezing = before
