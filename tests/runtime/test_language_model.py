"""The trainer's model paths: whole-model compile (with its fallback), the loss from labels, the padded head.

References: the eager model (compiled code must compute what it computes), `F.cross_entropy` of the
model's own float64 logits (the loss from labels), and the unpadded head (padding is a layout, not a
change of the function). Weights are perturbed away from initialisation (`reference.perturb`).

The default suite compiles every block preset with ``backend="aot_eager"`` (dynamo's whole-graph capture
and AOTAutograd's forward and backward graphs, seconds per model); the slow tier runs inductor on them
(about a minute per model on two cores), as ``compile=true`` does.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch._inductor.exc import InductorError

from blocklab.training.config import TrainConfig
from blocklab.training.step import compile_for_training, lm_loss
from helpers import PRESETS, make_model, tokens


def labels_of(ids: torch.Tensor, ignore_every: int = 3) -> torch.Tensor:
    """Next-token labels with some positions ignored (-100), as masked and padded batches have."""
    labels = torch.roll(ids, -1, dims=1)
    labels[:, ::ignore_every] = -100
    return labels


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def loss_and_grads(model, ids, labels):
    model.zero_grad(set_to_none=True)
    loss = model(ids, labels=labels)
    loss.backward()
    return loss.detach(), grads(model)


def assert_same_training_step(eager, compiled, ids, labels, tol=1e-4):
    loss_e, g_e = loss_and_grads(eager, ids, labels)
    loss_c, g_c = loss_and_grads(compiled, ids, labels)
    assert torch.allclose(loss_c, loss_e, rtol=tol, atol=tol)
    assert g_c.keys() == g_e.keys()
    total = torch.cat([g.flatten() for g in g_e.values()]).norm()
    for name, g in g_e.items():
        assert (g_c[name] - g).norm() <= tol * g.norm() + 1e-6 * total, name


# -- the loss from labels ----------------------------------------------------------------------------
@pytest.mark.parametrize("arch,overrides", [("pre-ln", {}), ("sas-p", {}),
                                            ("pre-ln", {"tie_embeddings": False}),
                                            ("pre-ln", {"logit_softcap": 3.0})])
def test_loss_from_labels_is_cross_entropy_of_the_logits(arch, overrides):
    model = make_model(arch, **overrides)  # float64, perturbed
    ids = tokens(seed=2)
    labels = labels_of(ids)
    loss, g = loss_and_grads(model, ids, labels)
    model.zero_grad(set_to_none=True)
    ref = F.cross_entropy(model(ids).flatten(0, 1), labels.flatten(), ignore_index=-100)
    ref.backward()
    assert torch.allclose(loss, ref.detach(), rtol=1e-10, atol=1e-10)
    for name, g_ref in grads(model).items():
        assert torch.allclose(g[name], g_ref, rtol=1e-8, atol=1e-10), name


def test_lm_loss_is_the_cross_entropy_of_the_labelled_positions():
    """The trainer's loss against a hand-computed one: minus the mean log-softmax of the labelled
    tokens, from the model's own float64 logits (masked-LM style labels: most positions ignored)."""
    model = make_model("sas")
    ids = tokens(seed=4)
    labels = labels_of(ids, ignore_every=2)
    with torch.no_grad():
        logp = torch.log_softmax(model(ids), dim=-1)
    kept = labels != -100
    expected = -logp[kept].gather(1, labels[kept][:, None]).mean()
    loss = lm_loss(model, {"input_ids": ids, "labels": labels})
    assert torch.allclose(loss, expected, rtol=1e-10, atol=1e-12)


def test_labels_are_checked():
    model = make_model("pre-ln")
    ids = tokens()
    with pytest.raises(ValueError, match="shape of input_ids"):
        model(ids, labels=ids[:, :-1])
    with pytest.raises(ValueError, match="without a KV cache"):
        model(ids, cache=model.new_cache(2, 16), labels=ids)


# -- the padded head ---------------------------------------------------------------------------------
@pytest.mark.parametrize("tied", [True, False])
def test_padded_head_gives_the_unpadded_logits_loss_and_gradients(monkeypatch, tied):
    """The head runs against W padded with zero rows on CUDA; forced on here, it changes nothing."""
    model = make_model("pre-ln", tie_embeddings=tied, logit_softcap=5.0)  # vocab 50: padded to 64
    ids = tokens(batch=4, seed=7)  # 64 positions: as many as the multiple, so the head pads
    labels = labels_of(ids)
    plain_logits = model(ids).detach()
    plain = loss_and_grads(model, ids, labels)
    monkeypatch.setattr(type(model), "head_padding", lambda self, weight: 64)
    pads = []
    pad = torch.nn.functional.pad
    monkeypatch.setattr(torch.nn.functional, "pad", lambda *a, **k: pads.append(a[0].shape) or pad(*a, **k))
    padded_logits = model(ids)
    assert pads == [(50, model.cfg.d_model)]  # the head's weight, padded once
    with torch.no_grad():  # a decoding step of 4 rows reads W itself: no padded copy
        cache = model.new_cache(4, 16)
        model(ids[:, :15], cache=cache)
        pads.clear()
        step = model(ids[:, 15:], cache=cache)
    assert pads == [] and torch.allclose(step[:, 0], padded_logits[:, -1], rtol=1e-10, atol=1e-12)
    assert padded_logits.shape == plain_logits.shape  # the padded columns never leave the head
    assert torch.allclose(padded_logits, plain_logits, rtol=1e-12, atol=1e-12)
    loss, g = loss_and_grads(model, ids, labels)
    assert torch.allclose(loss, plain[0], rtol=1e-12, atol=1e-12)
    for name, g_ref in plain[1].items():
        assert g[name].shape == g_ref.shape and torch.allclose(g[name], g_ref, rtol=1e-10, atol=1e-12), name
    assert model.tok_emb.weight.shape[0] == 50  # the parameters keep the true vocabulary


def test_head_is_padded_on_cuda_only():
    model = make_model("pre-ln")
    assert model.head_padding(torch.empty(50, 4)) == 1
    assert model.head_padding(torch.empty(50, 4, device="meta")) == 1
    assert model.vocab_pad_multiple == 128


# -- whole-model compile -------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", PRESETS)
def test_every_block_preset_compiles_as_one_graph(arch):
    """Dynamo captures the whole forward pass (and AOTAutograd its backward) with no fallback."""
    eager = make_model(arch, seed=3).float()
    compiled = copy.deepcopy(eager)
    compiled.compile_model(backend="aot_eager", fullgraph=True)
    ids = tokens(seed=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert_same_training_step(eager, compiled, ids, labels_of(ids))
    assert not [w for w in caught if "falling back" in str(w.message)]
    assert compiled._trunk is not None and compiled._trunk.fallback is None
    with torch.no_grad():  # evaluation and plain logits take the compiled graph too
        assert torch.allclose(compiled(ids), eager(ids), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("arch", PRESETS)
def test_every_block_preset_compiles_with_inductor(arch):
    eager = make_model(arch, seed=3).float()
    compiled = copy.deepcopy(eager)
    compiled.compile_model()
    ids = tokens(seed=1)
    assert_same_training_step(eager, compiled, ids, labels_of(ids))
    assert compiled._trunk is not None and compiled._trunk.fallback is None


def test_a_compiler_failure_falls_back_to_per_block_compile(monkeypatch):
    eager = make_model("sas-p", seed=5).float()
    model = copy.deepcopy(eager)
    compiled_blocks = []
    monkeypatch.setattr(type(model), "compile_blocks", lambda self, **kw: compiled_blocks.append(kw))
    model.compile_model(backend="aot_eager")
    trunk = model._trunk
    assert trunk is not None
    def broken(_ids):  # what inductor raised for SAS on CUDA
        raise InductorError(TypeError("list indices must be integers or slices, not NoneType"), None)

    monkeypatch.setattr(trunk, "_compiled", broken)
    ids = tokens(seed=2)
    with pytest.warns(RuntimeWarning, match="falling back to compiling each block") as caught:
        assert_same_training_step(eager, model, ids, labels_of(ids))
        model(ids)  # later calls run the fallback without warning again
    assert len(caught) == 1 and "list indices must be integers" in str(caught[0].message)
    assert compiled_blocks == [{"backend": "aot_eager"}]
    assert trunk.fallback is not None


def test_a_backward_compile_failure_falls_back_at_the_first_call(monkeypatch):
    """AOTAutograd compiles the backward lazily; the compiled calls ask for it with the forward, so a
    failure there is caught (and falls back) before `loss.backward()` could meet it."""
    from torch._dynamo.backends.common import aot_autograd

    def no_backward(gm, example_inputs):
        raise RuntimeError("backward codegen failed")

    eager = make_model("sas", seed=6).float()
    model = copy.deepcopy(eager)
    monkeypatch.setattr(type(model), "compile_blocks", lambda self, **kw: None)  # the same backend would fail
    backend = aot_autograd(fw_compiler=lambda gm, example_inputs: gm, bw_compiler=no_backward)
    model.compile_model(backend=backend)
    ids = tokens(seed=8)
    with pytest.warns(RuntimeWarning, match="backward codegen failed"):
        assert_same_training_step(eager, model, ids, labels_of(ids))


@pytest.mark.slow  # 20-35 s of compiling or a subprocess: CI's slow tier runs it
def test_an_error_of_the_inputs_is_not_a_compiler_failure():
    model = make_model("pre-ln").float()
    model.compile_model(backend="aot_eager")
    with pytest.raises(IndexError):  # an id past the vocabulary, as eager code raises it
        model.final_hidden(torch.full((1, 4), 10_000))
    assert model._trunk is not None and model._trunk.fallback is None


def test_a_deep_copy_compiles_its_own_graph():
    model = make_model("pre-ln", seed=1).float()
    model.compile_model(backend="aot_eager")
    ids = tokens(seed=3)
    model(ids)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.tok_emb.weight.mul_(2.0)
    assert not torch.allclose(twin(ids), model(ids))  # the copy runs its own weights
    assert twin._trunk is not model._trunk


@pytest.mark.parametrize("value,method", [(True, "compile_model"), ("model", "compile_model"),
                                          ("blocks", "compile_blocks"), (False, None)])
def test_train_config_compile_choices(monkeypatch, value, method):
    called = []
    model = make_model("pre-ln")
    for name in ("compile_model", "compile_blocks"):
        monkeypatch.setattr(model, name, lambda name=name: called.append(name))
    compile_for_training(model, TrainConfig(compile=value, max_steps=1).compile)
    assert called == ([method] if method else [])


def test_train_config_refuses_an_unknown_compile_mode():
    from blocklab.util.errors import ConfigError

    with pytest.raises(ConfigError, match="'blocks'"):
        TrainConfig(compile="graph", max_steps=1)


@pytest.mark.parametrize("how", ["model", "blocks", "first-call"])
def test_compiling_shaped_attention_where_it_is_not_trusted_is_refused(how):
    """Shaped attention's compiled gradients were wrong on CUDA (benchmarks/RESULTS.md, 2026-11-28):
    compiling it on a device outside `KernelChoice.compiled_shaped` is a ConfigError naming the way
    out (compile=false), before any step; softmax attention compiles there as before."""
    from blocklab.runtime import kernels
    from blocklab.util.errors import ConfigError

    sas_p, pre_ln = make_model("sas-p", seed=3).float(), make_model("pre-ln", seed=3).float()
    with kernels.kernel_choice(compiled_shaped=frozenset()):  # the CPU stands for CUDA here
        with pytest.raises(ConfigError, match=r"compile=false"):
            if how == "first-call":  # compiled, then the refused device's inputs arrive
                with kernels.kernel_choice(compiled_shaped=frozenset({"cpu"})):
                    sas_p.compile_model(backend="aot_eager")
                sas_p(tokens(seed=1))
            elif how == "model":
                sas_p.compile_model(backend="aot_eager")
            else:
                sas_p.compile_blocks(backend="aot_eager")
        pre_ln.compile_model(backend="aot_eager")
        ids = tokens(seed=1)
        assert torch.allclose(pre_ln(ids), make_model("pre-ln", seed=3).float()(ids), atol=1e-5)
