"""`LanguageModel.compile_decoding`: `generate` with the decoding step compiled as one graph gives the
tokens of eager decoding, for value paths and trunks whose caches differ (rings, running sums, token
ids, shared values, the smear's last token); with `freeze_weights=True` the folded weights are really
folded (a stale step gives the old logits) and are compiled again after any change."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.runtime.test_cache import build, ids_of

CASES = [
    ("pre-ln", {}),
    ("sas-p+resformer-learnable", {}),
    ("sas+svformer", dict(window_size=3, window_pattern="SL")),  # a ring and running value sums
    ("pre-ln+bov", {}),  # values from cached token ids
    ("pre-ln+cla", dict(positions="rope")),
    ("pre-ln+denseformer", {}),
]


class CountingBackend:
    """A dynamo backend that runs the captured graph as it is and counts the graphs it was given."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> object:  # noqa: ARG002
        self.graphs += 1
        return gm.forward


@pytest.mark.parametrize(("arch", "overrides"), CASES, ids=[a for a, _ in CASES])
def test_compiled_step_gives_the_tokens_of_eager_decoding(arch, overrides):
    model = build(arch, seed=3, **overrides)
    prompt = ids_of(2, 5, seed=4)
    eager = model.generate(prompt, 12, temperature=0.8, seed=0)
    backend = CountingBackend()
    model.compile_decoding(backend=backend, fullgraph=True)  # fullgraph: a graph break is an error
    assert torch.equal(model.generate(prompt, 12, temperature=0.8, seed=0), eager)
    assert 1 <= backend.graphs <= 3  # a static first step, then one graph with a dynamic length


PADDED_CASES = [CASES[2], CASES[3]]  # a ring and running value sums; values from cached token ids


@pytest.mark.parametrize(("arch", "overrides"), PADDED_CASES, ids=[a for a, _ in PADDED_CASES])
def test_compiled_step_decodes_a_padded_batch_as_one_graph(arch, overrides):
    """A padded batch (model/masking.py): the step reads the cache's per-row positions and flags with no
    graph break (fullgraph), and gives eager decoding's tokens."""
    model = build(arch, seed=3, **overrides)
    prompt, mask = ids_of(3, 6, seed=4), torch.ones(3, 6, dtype=torch.long)
    mask[1, :4] = 0  # left padding
    mask[2, 3:] = 0  # right padding: generate runs it left-padded
    eager = model.generate(prompt, 10, temperature=0.8, seed=0, attention_mask=mask)
    backend = CountingBackend()
    model.compile_decoding(backend=backend, fullgraph=True)
    assert torch.equal(model.generate(prompt, 10, temperature=0.8, seed=0, attention_mask=mask), eager)
    assert 1 <= backend.graphs <= 3


@pytest.mark.slow  # two inductor compiles, about a minute: CI's slow tier
@pytest.mark.parametrize("arch", ["pre-ln", "sas-p"])
def test_inductor_compiled_step_decodes_a_padded_batch(arch):
    model = build(arch, seed=9)
    prompt, mask = ids_of(2, 7, seed=10), torch.ones(2, 7, dtype=torch.long)
    mask[1, :4] = 0
    eager = model.generate(prompt, 8, attention_mask=mask, compile=False)
    assert torch.equal(model.generate(prompt, 8, attention_mask=mask, compile=True), eager)


def test_compiled_step_keeps_nanochats_smear_and_trunk():
    model = build("pre-ln", seed=5, embed_norm=True, norm_affine=False, smear=True, residual_scalars=True,
                  backout=True, attn_logit_scale=1.44, qk_norm=True, positions="rope")
    prompt = ids_of(3, 4, seed=6)
    eager = model.generate(prompt, 10)
    model.compile_decoding(backend=CountingBackend(), fullgraph=True)
    assert torch.equal(model.generate(prompt, 10), eager)


def test_inductor_compiled_step_gives_the_tokens_of_eager_decoding():
    model = build("pre-ln", seed=7)
    prompt = ids_of(1, 6, seed=8)
    eager = model.generate(prompt, 10)
    model.compile_decoding()
    assert torch.equal(model.generate(prompt, 10), eager)


def test_a_deep_copy_decodes_with_its_own_weights():
    """The copy's compiled step would run the original model: it compiles its own on first use."""
    model = build("pre-ln", seed=2)
    model.compile_decoding(backend=CountingBackend())
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(-1.5)
    prompt = ids_of(2, 5, seed=3)
    plain = copy.deepcopy(twin)
    plain._decoding = None
    assert torch.equal(twin.generate(prompt, 8), plain.generate(prompt, 8))
    assert not torch.equal(twin.generate(prompt, 8), model.generate(prompt, 8))


@pytest.mark.slow  # about a minute of compiles: CI's slow tier
def test_models_of_many_shapes_each_compile_their_own_step():
    """More models than dynamo's recompile limit (8 per code object): each still compiles one graph
    of its own, which a step shared by all of them would not."""
    prompt = ids_of(1, 3, seed=2)
    for layers in range(1, 11):
        model = build("pre-ln", seed=layers, n_layers=layers)
        eager = model.generate(prompt, 4)
        backend = CountingBackend()
        model.compile_decoding(backend=backend, fullgraph=True)
        assert torch.equal(model.generate(prompt, 4), eager)
        assert backend.graphs >= 1


def eager_copy(model):
    plain = copy.deepcopy(model)
    plain._decoding = None
    return plain


@pytest.mark.slow  # ~25 s each: CI's slow tier
@pytest.mark.parametrize("arch", ["pre-ln+bov", "sas-p+resformer-learnable"])
def test_frozen_weights_give_the_tokens_of_eager_decoding(arch):
    """Folded in: BoV's value tables (looked up by token id), learned lambdas and shaped-attention
    gains (pre-ln itself in the next test)."""
    model = build(arch, seed=11)
    prompt = ids_of(2, 5, seed=12)
    eager = model.generate(prompt, 10)
    model.compile_decoding(freeze_weights=True)
    assert torch.equal(model.generate(prompt, 10), eager)


def _next_logits(step, model, prompt, max_len):
    """Logits after the prompt and its last token again, that token's step run by `step`, in a cache of
    `max_len` positions (the size `generate` made: other sizes would make dynamo compile again)."""
    cache = model.new_cache(prompt.shape[0], max_len)
    with torch.inference_mode():
        model(prompt, cache=cache)
        return step(prompt[:, -1:].clone(), cache)  # an inference tensor, as generate's ids


@pytest.mark.slow  # about a minute of compiles: CI's slow tier
def test_frozen_step_is_compiled_again_once_the_weights_change():
    """Folded weights do not follow in-place updates (the old step gives the old logits); `generate`
    sees the change and compiles the step again, for an optimiser step and for `load_state_dict`."""
    model = build("pre-ln", seed=13)
    prompt = ids_of(2, 5, seed=14)
    model.compile_decoding(freeze_weights=True)
    model.generate(prompt, 6)  # a cache of 5 + 6 - 1 positions
    folded = model.token_step()

    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model(prompt).logsumexp(-1).mean().backward()
    optimizer.step()  # in place, as training updates weights
    trained = eager_copy(model)
    old, new = _next_logits(folded, model, prompt, 10), _next_logits(trained.decode_step, trained, prompt, 10)
    assert not torch.allclose(old, new, atol=1e-3)  # the folded step still holds the old weights
    assert torch.equal(model.generate(prompt, 6), trained.generate(prompt, 6))  # shapes as before
    assert model.token_step() is not folded

    other = build("pre-ln", seed=15)
    model.load_state_dict(other.state_dict())  # copies in place
    assert torch.equal(model.generate(prompt, 6), other.generate(prompt, 6))


def test_freezing_needs_inductor():
    model = build("pre-ln", seed=1)
    with pytest.raises(ValueError, match="freeze_weights=True. needs the inductor backend.*backend='eager'"):
        model.compile_decoding(freeze_weights=True, backend="eager")


@pytest.mark.parametrize("change", ["in place", "assign", "data"])
def test_a_frozen_step_sees_every_way_weights_change(change):
    """`is_current` (read by every `generate`) turns False after an in-place update, a parameter
    replaced (`load_state_dict(assign=True)`) or its tensor swapped (`p.data = ...`); building and
    checking compiles nothing."""
    model = build("pre-ln", seed=4)
    model.compile_decoding(freeze_weights=True)
    step = model._decoding
    assert step.is_current(model)
    weight = model.block(0).mlp.fc.weight
    if change == "in place":
        with torch.no_grad():
            weight.add_(1.0)
    elif change == "assign":
        state = {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(state, assign=True)
    else:
        weight.data = weight.data.clone()
    assert not step.is_current(model)
    assert not step.is_current(copy.deepcopy(model))
