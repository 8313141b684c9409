"""The lean decoding loop and the choice of decoding step (runtime/generate.py, runtime/compiled_step.py).

References: argmax decoding by repeated full forward passes in float64 (greedy tokens), a sampling
loop written here from `sample_next` and full forward passes (seeded sampling and stop tokens),
and counting backends that record whether the compiled step ran. The CUDA default is tested on the CPU
by adding "cpu" to the device types that compile by default (`COMPILED_BY_DEFAULT`).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from blocklab.runtime import compiled_step
from blocklab.runtime.compiled_step import COMPILE_ENV, FallbackStep, wants_compiled
from blocklab.runtime.generate import generate, sample_next
from tests.runtime.test_cache import build, greedy_by_full_forward, ids_of
from tests.runtime.test_compile_decoding import CountingBackend


class FailingBackend:
    """A dynamo backend that cannot compile anything (as inductor failed for SAS on CUDA)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> object:  # noqa: ARG002
        self.calls += 1
        raise TypeError("list indices must be integers or slices, not NoneType")


@pytest.fixture
def compile_on_cpu(monkeypatch):
    """The CUDA default on the CPU: "cpu" compiles by default, with a backend the test gives."""
    monkeypatch.delenv(COMPILE_ENV, raising=False)
    monkeypatch.setattr(compiled_step, "COMPILED_BY_DEFAULT", frozenset({"cpu", "cuda"}))

    def use(backend) -> None:
        monkeypatch.setattr(compiled_step, "DEFAULT_COMPILE_KWARGS", dict(backend=backend, fullgraph=True))

    return use


# -- which step -----------------------------------------------------------------------------------
def test_compiled_by_default_on_cuda_only_and_forced_either_way(monkeypatch):
    monkeypatch.delenv(COMPILE_ENV, raising=False)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert (wants_compiled(cpu), wants_compiled(cuda)) == (False, True)
    assert (wants_compiled(cpu, True), wants_compiled(cuda, False)) == (True, False)
    for text, expected in (("1", True), ("on", True), ("0", False), ("False", False), ("auto", None)):
        monkeypatch.setenv(COMPILE_ENV, text)
        assert wants_compiled(cpu) == (False if expected is None else expected)
        assert wants_compiled(cuda) == (True if expected is None else expected)
        assert wants_compiled(cpu, compile=False) is False  # the argument wins over the environment
    monkeypatch.setenv(COMPILE_ENV, "yes please")
    with pytest.raises(ValueError, match="BLOCKLAB_COMPILE_DECODING='yes please' is not allowed"):
        wants_compiled(cpu)
    with pytest.raises(ValueError, match="compile = 'fast' is not allowed: True .* False .* None"):
        wants_compiled(cpu, "fast")  # type: ignore[arg-type]


@pytest.mark.parametrize(("arch", "overrides"), [("pre-ln", {}),
                                                 ("sas+svformer", dict(window_size=3, window_pattern="SL"))])
def test_the_default_compiled_step_gives_the_eager_tokens_and_compiles_once(compile_on_cpu, arch, overrides):
    model = build(arch, seed=21, **overrides)
    prompt = ids_of(2, 5, seed=22)
    eager = generate(model, prompt, 10, compile=False)
    backend = CountingBackend()
    compile_on_cpu(backend)
    assert torch.equal(model.generate(prompt, 10), eager)  # LanguageModel.generate: compile=None
    graphs = backend.graphs
    assert 1 <= graphs <= 3  # a static first step, then one graph with a dynamic length
    assert torch.equal(generate(model, prompt, 10), eager)
    assert backend.graphs == graphs  # kept on the model: nothing compiled again
    sampled = generate(model, prompt, 10, temperature=0.9, seed=3, compile=False)
    assert torch.equal(generate(model, prompt, 10, temperature=0.9, seed=3), sampled)


def test_a_model_with_a_default_step_pickles_and_copies(compile_on_cpu):
    """Compiled code does not pickle: the step becomes None in a pickled or copied model, which then
    compiles its own on its first `generate`."""
    import copy
    import io

    model = build("pre-ln", seed=37)
    prompt = ids_of(1, 4, seed=38)
    backend = CountingBackend()
    compile_on_cpu(backend)
    tokens = generate(model, prompt, 5)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    twin = copy.deepcopy(model)
    for other in (loaded, twin):
        assert other.__dict__["_default_decoding"] is None
        graphs = backend.graphs
        assert torch.equal(generate(other, prompt, 5), tokens)
        assert backend.graphs > graphs


def test_compile_false_decodes_eagerly_and_true_compiles_on_a_cpu(monkeypatch):
    monkeypatch.delenv(COMPILE_ENV, raising=False)
    backend = CountingBackend()
    monkeypatch.setattr(compiled_step, "DEFAULT_COMPILE_KWARGS", dict(backend=backend, fullgraph=True))
    model = build("pre-ln", seed=23)
    prompt = ids_of(1, 4, seed=24)
    eager = generate(model, prompt, 6)  # a CPU: eager by default
    assert backend.graphs == 0
    assert torch.equal(generate(model, prompt, 6, compile=True), eager)
    assert backend.graphs >= 1
    monkeypatch.setenv(COMPILE_ENV, "1")  # the environment forces it too, on a fresh model
    fresh = build("pre-ln", seed=23)
    before = backend.graphs
    assert torch.equal(generate(fresh, prompt, 6), eager)
    assert backend.graphs > before


def test_compile_false_skips_a_step_given_by_compile_decoding(monkeypatch):
    monkeypatch.delenv(COMPILE_ENV, raising=False)
    model = build("pre-ln", seed=25)
    prompt = ids_of(2, 3, seed=26)
    eager = generate(model, prompt, 5)
    own = CountingBackend()
    model.compile_decoding(backend=own, fullgraph=True)
    assert torch.equal(generate(model, prompt, 5, compile=False), eager)
    assert own.graphs == 0
    assert torch.equal(generate(model, prompt, 5), eager)  # an explicit compile_decoding wins
    assert own.graphs >= 1


def test_a_failed_compilation_warns_once_and_decodes_eagerly(compile_on_cpu):
    model = build("sas-p+resformer-learnable", seed=27)  # running value sums: a token decoded twice shows
    prompt = ids_of(2, 4, seed=28)
    eager = generate(model, prompt, 8, compile=False)
    backend = FailingBackend()
    compile_on_cpu(backend)
    failed = "compiling the decoding step failed .*TypeError: list indices.*eagerly"
    with pytest.warns(RuntimeWarning, match=failed) as caught:
        out = generate(model, prompt, 8)
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1
    assert torch.equal(out, eager)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning, no second try
        assert torch.equal(generate(model, prompt, 8), eager)
    assert backend.calls == 1


def test_a_step_that_failed_after_the_cache_moved_is_not_retried():
    """Only a failure before the step ran anything may be decoded again eagerly (a cache whose sums or
    length moved would count the token twice)."""
    from torch._dynamo.exc import Unsupported

    model = build("pre-ln", seed=29)
    cache = model.new_cache(1, 8)

    class HalfRun:
        compile_kwargs: dict = {}

        def __call__(self, ids, cache):
            cache.begin(ids)
            raise Unsupported("failed half-way")

    step = FallbackStep(HalfRun(), model.decode_step)  # type: ignore[arg-type]
    with torch.inference_mode():
        model(ids_of(1, 3, seed=1), cache=cache)
        with pytest.raises(Unsupported, match="half-way"):
            step(ids_of(1, 1, seed=2), cache)
    assert step.error is None


# -- the lean loop gives what the plain loop gave ---------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.long, torch.int32])
def test_greedy_tokens_equal_argmax_of_full_forward_passes(dtype):
    model = build("pre-ln", seed=31).double()
    prompt = ids_of(3, 5, seed=32).to(dtype)
    out = generate(model, prompt, 12, compile=False)
    assert out.dtype == dtype and not out.is_inference()
    assert torch.equal(out.long(), greedy_by_full_forward(model, prompt.long(), 12))


def sample_by_full_forward(model, prompt, n, temperature, top_k, seed, stops, pad):
    """The sampling loop of `generate` written plainly: a full forward pass per token, `sample_next`
    with one generator, rows that stopped padded, the end once every row stopped."""
    g = torch.Generator().manual_seed(seed)
    ids, done = prompt, torch.zeros(prompt.shape[0], dtype=torch.bool)
    with torch.no_grad():
        for _ in range(n):
            nxt = sample_next(model(ids)[:, -1], temperature, top_k, None, g)
            nxt = torch.where(done, torch.tensor(pad), nxt)
            done = done | torch.isin(nxt, torch.tensor(stops))
            ids = torch.cat((ids, nxt[:, None]), dim=1)
            if done.all():
                break
    return ids


def test_sampling_with_stop_tokens_equals_the_plain_loop():
    model = build("pre-ln+svformer", seed=33).double()
    prompt = ids_of(3, 4, seed=34)
    free = generate(model, prompt, 14, temperature=1.3, top_k=20, seed=5)
    stops = [int(free[0, 6]), int(free[1, 9])]  # tokens the rows really draw: rows stop at different steps
    out = generate(model, prompt, 14, temperature=1.3, top_k=20, seed=5, stop_tokens=stops, pad_token=0)
    assert torch.equal(out, sample_by_full_forward(model, prompt, 14, 1.3, 20, 5, stops, 0))
    assert out.shape[1] < free.shape[1] or (out[:, 4:] == 0).any()


# -- on a GPU (skipped without CUDA) ----------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: the default compiles there")
@pytest.mark.parametrize("arch", ["pre-ln", "sas-p", "sas+svformer", "pre-ln+bov"])
def test_generate_on_cuda_compiles_by_default_and_gives_the_eager_tokens(monkeypatch, arch):
    """The default step on CUDA is inductor's, with no fallback (a warning would say inductor failed),
    and gives the eager step's greedy tokens (float64: no near ties between the two kernels' logits)."""
    monkeypatch.delenv(COMPILE_ENV, raising=False)
    model = build(arch, seed=41).double().cuda()
    prompt = ids_of(2, 6, seed=42).cuda()
    eager = generate(model, prompt, 16, compile=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        out = model.generate(prompt, 16)
    step = model.__dict__["_default_decoding"]
    assert step.error is None
    assert torch.equal(out, eager)
