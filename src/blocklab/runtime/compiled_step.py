"""The decoding step compiled as one `torch.compile` graph for one model (`LanguageModel.compile_decoding`).

Two facts of dynamo and inductor shape it:

- dynamo keeps compiled code, and its recompile limit (8), per code object. One `decode_step` code
  object shared by every model would let the ninth model of another shape in a process fail to
  compile, so each step compiles its own copy of the code (`own_code`).
- inductor's weight freezing (``torch._inductor.config.freezing``) folds the parameters into the
  compiled code as constants (on CPU, linear weights prepacked for MKL), which is what lets the
  compiled step pass a hand-written eager loop (benchmarks/RESULTS.md). Dynamo reads the flag when it
  traces (parameters become graph constants) and inductor when it compiles, and both happen inside a
  call of the step, so the flag is set around every call rather than once. Folded weights do not see
  later in-place changes; the step records what its weights were and `is_current` tells the model to
  compile again once they changed.

`generate` compiles the step by default on the device types in `COMPILED_BY_DEFAULT` (CUDA, where an
eager step at batch 1 is bound by Python and kernel launches, and the compiled one ran 1.27x the
hand-written loop on an H200; benchmarks/RESULTS.md) through `default_step`, which falls back to the
eager step, with one warning, when dynamo or inductor fails. It is a plain `torch.compile` of the whole
step with dynamic shapes after the first steps, not a CUDA-graph capture (``mode="reduce-overhead"``):
the cache's length grows by one each step, and CUDA graphs record one graph per distinct shape, so a
capture would need a step of static shape (attention over the whole preallocated cache, masked by
length), which the cache does not offer.
"""

from __future__ import annotations

import itertools
import os
import types
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from blocklab.runtime.cache import KVCache

Step = Callable[[Tensor, "KVCache"], Tensor]


def own_code(method: Callable[..., Any]) -> types.MethodType:
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
        self._step = torch.compile(own_code(step), **compile_kwargs)
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


COMPILE_ENV = "BLOCKLAB_COMPILE_DECODING"  # "1" / "0" force; unset, "" or "auto": by device type
COMPILED_BY_DEFAULT = frozenset({"cuda"})  # device types whose `generate` compiles the step by default
_ENV_VALUES = {"1": True, "true": True, "on": True, "0": False, "false": False, "off": False,
               "": None, "auto": None}


def wants_compiled(device: torch.device, compile: bool | None = None) -> bool:
    """Whether `generate` decodes on `device` with the compiled step: `compile` when it is a bool, else
    the environment variable BLOCKLAB_COMPILE_DECODING when it says 1 or 0, else whether the device's
    type is in `COMPILED_BY_DEFAULT`."""
    if compile is not None and not isinstance(compile, bool):
        raise ValueError(f"compile = {compile!r} is not allowed: True (compile the decoding step), False "
                         "(decode eagerly) or None (by device type and BLOCKLAB_COMPILE_DECODING).")
    if compile is None:
        text = os.environ.get(COMPILE_ENV, "")
        if text.strip().lower() not in _ENV_VALUES:
            raise ValueError(f"{COMPILE_ENV}={text!r} is not allowed: 1 / true / on, 0 / false / off, or "
                             "auto (or unset): compile on the device types in COMPILED_BY_DEFAULT.")
        compile = _ENV_VALUES[text.strip().lower()]
    return device.type in COMPILED_BY_DEFAULT if compile is None else compile


def compile_errors() -> tuple[type[BaseException], ...]:
    """What a failed compilation raises: dynamo's own errors (Unsupported: a graph break under
    fullgraph) and the backend's (BackendCompilerFailed, of which inductor's InductorError is one), all
    before the step runs any op. Imported here: dynamo takes seconds to import."""
    from torch._dynamo.exc import TorchDynamoException

    return (TorchDynamoException,)


DEFAULT_COMPILE_KWARGS: dict[str, Any] = dict(fullgraph=True)  # a graph break fails before any op runs
_DEFAULT_ATTR = "_default_decoding"  # where `default_step` keeps a model's step (in its __dict__)


class FallbackStep:
    """A compiled step that turns into the eager step for good, with one warning naming the error, the
    first time compiling fails (on a call: dynamo compiles lazily, and again when shapes change).

    With ``fullgraph=True`` dynamo and inductor fail before the step runs any op, so the cache is as
    it was and the eager step decodes the same token; a failure after the cache moved is raised."""

    def __init__(self, compiled: CompiledStep, eager: Step):
        self.compiled, self.eager = compiled, eager
        self.error: BaseException | None = None  # the compile error, once it failed

    def __reduce__(self) -> tuple[Callable[[], None], tuple[()]]:
        """Pickled or deep-copied with its model, it becomes None: compiled code does not pickle, and a
        copy compiles its own step (`default_step`) on its first `generate`."""
        return _nothing, ()

    def __call__(self, input_ids: Tensor, cache: KVCache) -> Tensor:
        if self.error is not None:
            return self.eager(input_ids, cache)
        before = cache.progress()
        try:
            return self.compiled(input_ids, cache)
        except compile_errors() as error:
            if cache.progress() != before:  # ran part-way: the eager step cannot take over
                raise
            self.error = error
            warnings.warn(f"compiling the decoding step failed ({describe_compile_error(error)}); decoding "
                          f"eagerly from now on. Pass compile=False to generate (or set {COMPILE_ENV}=0) "
                          "to skip compiling.", RuntimeWarning, stacklevel=4)
            return self.eager(input_ids, cache)


def _nothing() -> None:
    return None


def describe_compile_error(error: BaseException) -> str:
    """The error and the one that caused it (a backend's own error inside BackendCompilerFailed), each
    with the first line of its message."""
    inner = getattr(error, "inner_exception", None) or error.__cause__
    parts = [error] if inner is None or inner is error else [error, inner]
    return ": ".join(f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}" for e in parts)


def default_step(model: nn.Module, eager: Step) -> FallbackStep:
    """`model`'s decoding step (`decode_step`) compiled with `DEFAULT_COMPILE_KWARGS` (one full graph,
    weights not frozen: it follows training), falling back to eager (`FallbackStep`). Made once per
    model and kept in its ``__dict__`` (a deep copy makes its own, as `CompiledStep.is_current` says),
    so `generate` compiles once per model and batch size, not once per call. `eager`: the model's
    `decode_step`, which is compiled and is the fallback."""
    step = model.__dict__.get(_DEFAULT_ATTR)
    kwargs = DEFAULT_COMPILE_KWARGS
    if (not isinstance(step, FallbackStep) or step.compiled.compile_kwargs != kwargs
            or not step.compiled.is_current(model)):
        step = FallbackStep(CompiledStep(model, eager, freeze_weights=False, compile_kwargs=dict(kwargs)),
                            eager)
        model.__dict__[_DEFAULT_ATTR] = step
    return step
