"""Fused projections (runtime/fused_projections.py): the maps that read one input run as one GEMM.

References: `fused_linear` against x W_i^T + b_i written per map; a fused model against the same
weights with fusion off (each map on its own, as the model's definition computes them), forward and
every gradient, in float64 with every parameter moved away from its init (many variants are the
identity there); F.linear called with a map's own weight, which happens only when the map runs on its
own, says which maps a block fused; a state dict of the unfused model, loaded into a fused one;
decoding with the KV cache against the full forward pass. On CUDA, where "auto" fuses, tests/test_cuda.py
runs the fused model against float64 (`test_training_step_matches_float64`).
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

from blocklab import LanguageModel, ModelConfig, Transformer
from blocklab.model.attention import Attention
from blocklab.model.block import Block
from blocklab.model.presets import BLOCK_PRESETS
from blocklab.model.value_paths import VALUE_PATHS, LayerValues, Registered, ValuePath
from blocklab.runtime import kernels
from blocklab.runtime.fused_projections import (
    FusedLinear,
    fused_linear,
    plain_linear,
    projection_fusion,
    set_fused_projections,
)
from helpers import make_model, tokens

SOFTMAX_ONLY = {"cross-layer-attn"}  # value paths that need attn_matrix="softmax"
ARCHS = [f"{b}+{v}" for b in BLOCK_PRESETS for v in VALUE_PATHS
         if not (v in SOFTMAX_ONLY and BLOCK_PRESETS[b].fields.get("attn_matrix", "softmax") != "softmax")]
# the default suite takes every value path on the three ways a block fuses (pre-ln: Q, K, V; parallel:
# Q, K, V and W_fc; sas-p: Q, K and W_fc around identity values); the slow tier takes every block preset
FUSING_LAYOUTS = ("pre-ln", "parallel", "sas-p")
ARCH_PARAMS = [a if a.split("+")[0] in FUSING_LAYOUTS else pytest.param(a, marks=pytest.mark.slow)
               for a in ARCHS]
# options and shapes the presets do not reach: biases on some maps only, GQA, a gated MLP, one more
# layer of every kind (x0-value's additive targets, query/key residuals, CLA groups of 3, U-net tables)
VARIANTS = {
    "pre-ln qk_bias": ("pre-ln", {}, dict(qk_bias=True)),
    "parallel qk_bias": ("parallel", {}, dict(qk_bias=True)),
    "sas-p qk_bias": ("sas-p", {}, dict(qk_bias=True)),
    "parallel bias": ("parallel", {}, dict(bias=True)),
    "post-ln bias": ("post-ln", {}, dict(bias=True)),
    "pre-ln gqa": ("pre-ln", {}, dict(n_kv_heads=2)),
    "parallel gqa+cla": ("parallel+cla", dict(group=3), dict(n_kv_heads=1)),
    "parallel swiglu": ("parallel", {}, dict(mlp_act="swiglu")),
    "sas-p geglu rope qk-norm": ("sas-p", {}, dict(mlp_act="geglu", positions="rope", qk_norm=True)),
    "pre-ln rope logit-scale": ("pre-ln", {}, dict(positions="rope", attn_logit_scale=1.44)),
    "parallel x0-value add": ("parallel+x0-value", dict(add=True, layers="all"), {}),
    "pre-ln x0-value stream": ("pre-ln+x0-value", dict(x0="stream"), {}),
    "parallel resformer query": ("parallel+resformer", dict(residual_on="query"), {}),
    "pre-ln resformer key": ("pre-ln+resformer", dict(residual_on="key"), {}),
    "parallel resformer neutreno": ("parallel+resformer", dict(neutreno=0.2), {}),
    "parallel bov shared": ("parallel+bov", dict(shared=True), {}),
    "parallel value-embed unet": ("parallel+value-embed", dict(shared_tables=1, gate="lambda"), {}),
    "parallel svformer anchor": ("parallel+svformer", dict(anchors=[2]), {}),
    "pre-ln window": ("pre-ln", {}, dict(window_size=4, window_pattern="SL")),
    "sas-p bidirectional": ("sas-p", {}, dict(causal=False)),
    "parallel reparam values": ("parallel", {}, dict(value_form="reparam")),
}
GRAD_TOL = 1e-10  # relative to the whole gradient's norm: float64 GEMMs of other widths round differently


def pair(arch: str, options: dict | None = None, seed: int = 0,
         **overrides) -> tuple[LanguageModel, LanguageModel]:
    """(unfused, fused): one perturbed float64 model and its copy."""
    unfused = make_model(arch, seed=seed, value_path_options=options or {}, **overrides)
    fused = copy.deepcopy(unfused)
    set_fused_projections(unfused, "off")
    set_fused_projections(fused, "on")
    return unfused, fused


def loss_of(model: LanguageModel, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())


def assert_same_forward_and_gradients(unfused: LanguageModel, fused: LanguageModel) -> None:
    ids = tokens(batch=2, t=13, seed=3)
    with torch.no_grad():
        assert_close(fused(ids), unfused(ids), rtol=1e-12, atol=1e-12)
    for model in (unfused, fused):
        loss_of(model, ids).backward()
    grads = {name: p.grad for name, p in unfused.named_parameters() if p.grad is not None}
    fused_grads = {name: p.grad for name, p in fused.named_parameters() if p.grad is not None}
    assert grads.keys() == fused_grads.keys()
    total = torch.cat([g.flatten() for g in grads.values()]).norm()
    for name, g in grads.items():
        assert (fused_grads[name] - g).norm() <= GRAD_TOL * total, name


class Calls:
    """Which of a model's linear maps ran on their own: F.linear called with the map's own weight (a
    fused GEMM runs on a concatenated copy of the weights)."""

    def __init__(self, model: nn.Module):
        self.names = {id(m.weight): name for name, m in model.named_modules() if isinstance(m, nn.Linear)}
        self.ran: set[str] = set()
        self.linear = F.linear

    def spy(self, x, weight, bias=None):
        if id(weight) in self.names:
            self.ran.add(self.names[id(weight)])
        return self.linear(x, weight, bias)


def ran_maps(model: nn.Module, ids: torch.Tensor, **kwargs) -> set[str]:
    calls = Calls(model)
    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        patch.setattr(F, "linear", calls.spy)
        model(ids, **kwargs)
    return calls.ran


def block_maps(model: LanguageModel, layer: int) -> set[str]:
    """The names of block `layer`'s fusable maps: what a fused forward must not run as modules."""
    attn = model.block(layer).attn
    fusion = projection_fusion(attn)
    assert fusion is not None
    maps = fusion.maps(attn)
    names = {id(m): n for n, m in model.named_modules()}
    return {names[id(m)] for m in maps}


# -- the fused GEMM ---------------------------------------------------------------------------
def test_fused_linear_is_each_map_on_its_own():
    """[x W_1^T + b_1, x W_2^T, x W_3^T + b_3] by hand; the gradients reach each map's parameters."""
    g = torch.Generator().manual_seed(0)
    maps = [nn.Linear(6, 4, bias=True), nn.Linear(6, 3, bias=False), nn.Linear(6, 5, bias=True)]
    for m in maps:
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
    maps = [m.double() for m in maps]
    x = torch.randn(2, 7, 6, generator=g, dtype=torch.float64, requires_grad=True)
    outs = fused_linear(x, maps)
    expected = [x @ m.weight.T + (m.bias if m.bias is not None else 0) for m in maps]
    assert [o.shape for o in outs] == [(2, 7, 4), (2, 7, 3), (2, 7, 5)]
    for out, ref in zip(outs, expected, strict=True):
        assert_close(out, ref, rtol=1e-13, atol=1e-13)
    weights = torch.randn(2, 7, 12, generator=g, dtype=torch.float64)
    inputs = [x, *(p for m in maps for p in m.parameters())]
    grads = torch.autograd.grad((torch.cat(outs, -1) * weights).sum(), inputs)
    refs = torch.autograd.grad((torch.cat(expected, -1) * weights).sum(), inputs)
    for got, ref in zip(grads, refs, strict=True):
        assert_close(got, ref, rtol=1e-12, atol=1e-12)


def test_plain_linear_only_takes_nn_linear_itself():
    class Wrapped(nn.Linear):
        pass

    lin = nn.Linear(2, 2)
    assert plain_linear(lin) is lin
    assert plain_linear(Wrapped(2, 2)) is None and plain_linear(nn.Identity()) is None
    assert plain_linear(None) is None


def test_a_fused_linear_returns_its_output_only_for_the_input_it_was_handed():
    """`FusedLinear` holds the map's own parameters; it returns a handed output once, for that very
    tensor, and is x W^T + b for any other input (a stale output is never read)."""
    lin = nn.Linear(3, 2).double()
    member = FusedLinear(lin)
    assert member.weight is lin.weight and member.bias is lin.bias
    assert dict(member.named_parameters()).keys() == {"weight", "bias"}
    x, other = torch.ones(1, 3, dtype=torch.float64), torch.ones(1, 3, dtype=torch.float64)
    handed = torch.full((1, 2), 7.0, dtype=torch.float64)
    member.hand(x, handed)
    assert_close(member(other), x @ lin.weight.T + lin.bias)  # equal values, another tensor
    assert member(x) is handed
    assert_close(member(x), x @ lin.weight.T + lin.bias)  # only once


def test_the_definition_runs_each_map_and_language_model_fuses_in_auto_mode():
    """`Transformer` (the reference) has no fusion; `LanguageModel` applies "auto" when built, with the
    same parameter names and values."""
    cfg = ModelConfig.from_preset("parallel", "tiny", n_layers=2)
    torch.manual_seed(0)
    reference = Transformer(cfg)
    torch.manual_seed(0)
    model = LanguageModel(cfg)
    assert all(type(m) is not FusedLinear for m in reference.modules())
    assert all(projection_fusion(b.attn) is None for b in reference.block_list())
    assert [projection_fusion(b.attn).mode for b in model.block_list()] == ["auto", "auto"]
    assert {type(m) for m in (model.block(0).attn.q, model.block(0).mlp.fc)} == {FusedLinear}
    state, ref_state = model.state_dict(), reference.state_dict()
    assert state.keys() == ref_state.keys()
    assert all(torch.equal(state[k], ref_state[k]) for k in state)
    set_fused_projections(reference, "on")  # applied to a built definition, it fuses it
    ids = tokens(batch=1, t=5)
    assert not ran_maps(reference, ids) & {"blocks.0.attn.q", "blocks.0.mlp.fc"}


# -- fused and unfused models agree --------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCH_PARAMS)
def test_fused_forward_and_gradients_match_unfused(arch):
    """Every block preset with every value path (3 layers: layer 0, a middle and the last layer)."""
    assert_same_forward_and_gradients(*pair(arch, seed=len(arch)))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_fused_forward_and_gradients_match_unfused_variants(name):
    arch, options, overrides = VARIANTS[name]
    assert_same_forward_and_gradients(*pair(arch, options, seed=len(name), **overrides))


def test_fused_matches_unfused_with_dropout():
    """Dropout draws its masks in the same order either way: the same seed gives the same step."""
    unfused, fused = pair("parallel", dropout=0.3)
    ids = tokens(batch=2, t=13, seed=4)
    outs = []
    for model in (unfused, fused):
        model.train()
        torch.manual_seed(5)
        outs.append(model(ids))
    assert_close(outs[1], outs[0], rtol=1e-12, atol=1e-12)
    assert not torch.equal(outs[0], pair("parallel", dropout=0.3)[0].eval()(ids))  # dropout acted


def test_explicit_attention_matrix_is_unchanged_by_fusion():
    unfused, fused = pair("sas-p+resformer")
    for model in (unfused, fused):
        for m in model.modules():
            if isinstance(m, Attention):
                m.explicit = True
    assert_same_forward_and_gradients(unfused, fused)


# -- which maps a block fuses ---------------------------------------------------------------------
@pytest.mark.parametrize("arch, expected", [
    ("pre-ln", [{"q", "k", "values.w_v"}] * 3),
    ("post-ln", [{"q", "k", "values.w_v"}] * 3),
    ("parallel", [{"q", "k", "values.w_v", "fc"}] * 3),
    # layer 0 keeps a reparameterised W_V (no nn.Linear), the others have identity values
    ("sas", [{"q", "k"}] * 3),
    ("sas-p", [{"q", "k", "fc"}] * 3),
    ("pre-ln+cla", [{"q", "k", "values.w_v"}, set(), {"q", "k", "values.w_v"}]),  # a follower has W_Q only
    ("parallel+cla", [{"q", "k", "values.w_v", "fc"}, {"q", "fc"}, {"q", "k", "values.w_v", "fc"}]),
    ("pre-ln+svformer", [{"q", "k", "values.w_v"}, {"q", "k"}, {"q", "k"}]),
    ("pre-ln+bov", [{"q", "k", "values.w_v"}] * 2 + [{"q", "k"}]),  # the last third looks values up
    ("pre-ln+x0-value", [{"q", "k", "values.w_v"}] * 2 + [{"q", "k"}]),  # its W_V reads x0, not x
    ("pre-ln+v1-value", [{"q", "k", "values.w_v"}] * 2 + [{"q", "k"}]),
])
def test_blocks_fuse_the_maps_that_read_one_input(arch, expected):
    """The maps a fused forward does not run as modules are exactly the ones expected; an unfused
    forward runs them all."""
    unfused, fused = pair(arch)
    ids = tokens(batch=1, t=5)
    ran_fused, ran_unfused = ran_maps(fused, ids), ran_maps(unfused, ids)
    for layer, maps in enumerate(expected):
        prefix = f"blocks.{layer}."
        fused_here = {n[len(prefix):].removeprefix("attn.").removeprefix("mlp.")
                      for n in ran_unfused - ran_fused if n.startswith(prefix)}
        assert fused_here == maps, layer
        assert block_maps(fused, layer) == {prefix + ("mlp." if n == "fc" else "attn.") + n for n in maps}


def test_a_wrapped_map_runs_as_itself():
    """A map that is no plain nn.Linear (a LoRA layer, a subclass) is not fused: its forward runs."""

    class Scaled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    unfused, fused = pair("parallel")
    for model in (unfused, fused):
        old = model.block(1).attn.q
        new = Scaled(old.in_features, old.out_features, bias=old.bias is not None).double()
        new.load_state_dict(old.state_dict())
        model.block(1).attn.q = new
    attn = fused.block(1).attn
    assert projection_fusion(attn).maps(attn) == []
    assert_same_forward_and_gradients(unfused, fused)


class OwnMapValues(ValuePath):
    """A value path that calls its W^V itself (not through `value_projection`), so it sets
    `fuses_values = False`: the block must not compute x W^V for it."""

    fuses_values = False

    def layer_values(self, x, carry):
        return LayerValues(0.5 * self.w_v(x)), carry


def test_a_value_path_that_does_not_declare_fusion_keeps_its_own_w_v(monkeypatch):
    """A path with `fuses_values = False` keeps its W^V as it is; Q and K still fuse."""
    monkeypatch.setitem(VALUE_PATHS, "old-style", Registered(OwnMapValues, "V = x W^V / 2"))
    unfused, fused = pair("parallel+old-style")
    ids = tokens(batch=1, t=5)
    assert ran_maps(unfused, ids) - ran_maps(fused, ids) == {
        f"blocks.{i}.{n}" for i in range(3) for n in ("attn.q", "attn.k", "mlp.fc")}
    assert_same_forward_and_gradients(unfused, fused)


# -- when "auto" fuses --------------------------------------------------------------------------
def test_auto_fuses_on_the_listed_devices_and_never_while_decoding():
    model = make_model("pre-ln")
    ids = tokens(batch=1, t=6)
    everything = ran_maps(pair("pre-ln")[0], ids)
    with kernels.kernel_choice(fused_projections=frozenset()):
        assert ran_maps(model, ids) == everything
    with kernels.kernel_choice(fused_projections=frozenset({"cpu"})):
        assert ran_maps(model, ids) == everything - {f"blocks.{i}.attn.{n}" for i in range(3)
                                                     for n in ("q", "k", "values.w_v")}
        cache = model.new_cache(1, 8)
        assert ran_maps(model, ids, cache=cache) == everything  # decoding: no fusion
    set_fused_projections(model, "on")
    assert ran_maps(model, ids[:, :1], cache=cache) == everything - {f"blocks.{i}.attn.{n}" for i in range(3)
                                                                     for n in ("q", "k", "values.w_v")}


def test_fused_projections_mode_is_checked():
    model = make_model("pre-ln")
    with pytest.raises(ValueError, match="'auto', 'on', 'off'"):
        set_fused_projections(model, "yes")  # type: ignore[arg-type]
    set_fused_projections(model, "off")
    assert all(projection_fusion(b.attn).mode == "off" for b in model.modules() if isinstance(b, Block))


# -- checkpoints and decoding ---------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["pre-ln", "sas-p", "parallel+resformer", "sas+bov", "post-ln+cla"])
def test_unfused_state_dict_loads_into_a_fused_model(arch):
    """The parameter names are unchanged: a checkpoint written without fusion loads strictly into a
    fused model, which gives its logits."""
    unfused, _ = pair(arch, seed=7)
    buffer = io.BytesIO()
    torch.save(unfused.state_dict(), buffer)
    buffer.seek(0)
    fused = make_model(arch, seed=99)
    set_fused_projections(fused, "on")
    assert fused.state_dict().keys() == unfused.state_dict().keys()
    fused.load_state_dict(torch.load(buffer), strict=True)
    ids = tokens(batch=2, t=11, seed=8)
    with torch.no_grad():
        assert_close(fused(ids), unfused(ids), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("arch", ["pre-ln", "sas-p", "parallel+svformer", "parallel+cla", "sas-p+bov",
                                  "parallel+x0-value", "pre-ln+value-embed"])
def test_cached_decoding_matches_the_full_forward_when_fused(arch):
    """Prefill, a chunk and single tokens with fusion on (also while decoding) give the full forward
    pass's logits, which equal the unfused model's."""
    unfused, fused = pair(arch, seed=11)
    ids = tokens(batch=2, t=12, seed=12)
    with torch.no_grad():
        full = fused(ids)
        assert_close(full, unfused(ids), rtol=1e-12, atol=1e-12)
        cache = fused.new_cache(2, 12)
        pieces = [fused(ids[:, :5], cache=cache), fused(ids[:, 5:8], cache=cache)]
        pieces += [fused(ids[:, i:i + 1], cache=cache) for i in range(8, 12)]
    assert_close(torch.cat(pieces, dim=1), full, rtol=1e-10, atol=1e-10)
    prompt = ids[:, :4]
    assert torch.equal(fused.generate(prompt, 6), unfused.generate(prompt, 6))


# -- identity values reach attention as a contiguous copy -------------------------------------------
@pytest.mark.parametrize("arch, contiguous", [("sas", [False, True, True]), ("sas-p", [False, True, True]),
                                              ("pre-ln", [False] * 3)])
def test_identity_values_are_contiguous_heads(arch, contiguous, monkeypatch):
    """SAS and SAS-P (identity W_V after layer 0) give attention (B, H, T, D) values in their own
    contiguous memory, not a transposed view of the norm's output (the inductor crash on CUDA)."""
    model = make_model(arch)
    set_fused_projections(model, "on")
    seen = []
    attend = Attention.attend

    def spy(self, q, k, v, *args):
        seen.append(v.is_contiguous())
        return attend(self, q, k, v, *args)

    monkeypatch.setattr(Attention, "attend", spy)
    with torch.no_grad():
        model(tokens(batch=2, t=7))
    assert [b.attn.contiguous_values for b in model.block_list()] == contiguous
    assert seen == contiguous


# -- compile -----------------------------------------------------------------------------------
@pytest.mark.parametrize("arch, mode", [("pre-ln", "on"), ("sas-p", "on"), ("parallel+cla", "on"),
                                        ("pre-ln+resformer", "on"), ("sas-p", "auto"), ("pre-ln", "auto")])
def test_fused_block_traces_as_one_graph(arch, mode, monkeypatch):
    """torch.compile(fullgraph=True) of a fused block: the fusion adds no graph break (dynamo's eager
    backend: tracing only, the same graph inductor would compile); "auto" on a device it fuses on."""
    monkeypatch.setattr(kernels, "KERNELS", kernels.KernelChoice(fused_projections=frozenset({"cpu"})))
    torch._dynamo.reset()
    unfused, fused = pair(arch)
    set_fused_projections(fused, mode)
    fused.compile_blocks(fullgraph=True, backend="eager")  # raises dynamo's recompile limit per layer
    assert_same_forward_and_gradients(unfused, fused)
    assert ran_maps(fused, tokens(batch=1, t=4)) == ran_maps(unfused, tokens(batch=1, t=4)) - {
        n for i in range(3) for n in block_maps(fused, i)}
