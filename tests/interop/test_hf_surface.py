"""The standard Hugging Face `PreTrainedModel` surface of blocklab's HF classes (interop/hf_model.py,
hf_surface.py): resize_token_embeddings, gradient checkpointing, output_hidden_states and
output_attentions, attn_implementation, the config's size fields, generate's length check and
save_pretrained of a model loaded as remote code. The references are HF's own GPT-2 (hidden states
and attention matrices of an imported checkpoint), the naive float64 model of tests/reference.py,
the model run without the feature, hand-computed rows, and blocklab's own `generate` (its length
check)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

pytest.importorskip("transformers")

import reference as R  # noqa: E402
from blocklab import LanguageModel, ModelConfig  # noqa: E402
from blocklab.interop import from_hf, save_pretrained  # noqa: E402
from blocklab.interop.hf_model import CACHE_NAME, BlocklabConfig, hf_model  # noqa: E402
from blocklab.model.value_paths import VALUE_PATHS, is_value_table  # noqa: E402
from helpers import PRESETS, TOL, make_model, tokens  # noqa: E402

SMALL = dict(n_layers=3, d_model=32, n_heads=2, mlp_hidden=64, vocab_size=96, context_length=32)


def hf_takes(method: str, keyword: str) -> bool:
    """Whether this transformers' `PreTrainedModel.method` takes `keyword` (transformers 4.45 lacks some
    of the newer ones: the floors tier, .ci/floors.sh)."""
    import inspect

    from transformers import PreTrainedModel

    return keyword in inspect.signature(getattr(PreTrainedModel, method)).parameters


def _needs_set_attn_implementation():
    from transformers import PreTrainedModel

    return pytest.mark.skipif(not hasattr(PreTrainedModel, "set_attn_implementation"),
                              reason="this transformers has no set_attn_implementation (4.45 had none)")


def small(arch: str = "pre-ln", seed: int = 0, **fields) -> LanguageModel:
    """A float32 model of SMALL's sizes with every parameter moved off its initialisation."""
    torch.manual_seed(seed)
    model = LanguageModel(ModelConfig.from_preset(arch, size="tiny", **{**SMALL, **fields}))
    with torch.no_grad():
        R.perturb(model, seed=seed + 100, scale=0.3)
    return model.eval()


def ids_of(batch: int, t: int, vocab: int = 96, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, t), generator=torch.Generator().manual_seed(seed))


def remote(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()


# -- 1. resize_token_embeddings ---------------------------------------------------------------------
def test_resize_of_a_remote_code_export_saves_and_reloads(tmp_path):
    """The reported case: an export loaded with trust_remote_code, resized, saved by HF and loaded again:
    new ids run, the old ids' logits are unchanged, the reload gives the resized model's logits."""
    model = small("pre-ln+bov")
    hf = remote(save_pretrained(model, tmp_path / "export", format="hf"))
    ids = ids_of(2, 9)
    with torch.no_grad():
        before = hf(ids).logits
    with pytest.raises(ValueError, match="vocab_size=96"):
        hf(torch.tensor([[97]]))
    hf.resize_token_embeddings(101)
    assert hf.config.vocab_size == hf.config.blocklab["vocab_size"] == hf.model.cfg.vocab_size == 101
    longer = torch.cat([ids, torch.tensor([[100], [97]])], dim=1)
    with torch.no_grad():
        after = hf(longer).logits
    assert after.shape == (2, 10, 101)
    torch.testing.assert_close(after[:, :9, :96], before, rtol=0, atol=1e-5)
    hf.save_pretrained(tmp_path / "resized")
    assert json.loads((tmp_path / "resized" / "config.json").read_text())["blocklab"]["vocab_size"] == 101
    with torch.no_grad():
        torch.testing.assert_close(remote(tmp_path / "resized")(longer).logits, after, rtol=0, atol=1e-6)


RESIZED = {**{p: dict(arch="pre-ln" if p == "standard" else f"pre-ln+{p}") for p in VALUE_PATHS},
           "untied-head": dict(arch="pre-ln", tie_embeddings=False),
           "bov-shared-table": dict(arch="pre-ln+bov", value_path_options={"shared": True}),
           "value-embed-shared-tables": dict(arch="pre-ln+value-embed",
                                             value_path_options={"shared_tables": 1})}


@pytest.mark.parametrize("name", RESIZED)
def test_resize_keeps_old_logits_and_resizes_every_token_table(name):
    """Every value path: the token-indexed tables grow with the embedding, their new rows the mean of
    the old ones (computed here by hand); the old ids' logits are unchanged; the state dict loads into
    a Transformer of the HF config's blocklab config, which gives the same logits."""
    fields = dict(RESIZED[name])
    model = small(fields.pop("arch"), **fields)
    hf = hf_model(model).eval()
    ids = ids_of(2, 8)
    tables = {n: p.detach().clone() for n, p in model.named_parameters() if is_value_table(n)}
    with torch.no_grad():
        before = hf(ids).logits
        hf.resize_token_embeddings(100)
        after = hf(torch.cat([ids, torch.tensor([[99], [96]])], dim=1)).logits
    torch.testing.assert_close(after[:, :8, :96], before, rtol=0, atol=1e-5)
    resized = dict(model.named_parameters())
    mean = hf_takes("resize_token_embeddings", "mean_resizing")  # HF's default since 4.46; zeros before
    for n, old in tables.items():
        assert resized[n].shape == (100, old.shape[1])
        assert torch.equal(resized[n][:96], old)
        torch.testing.assert_close(resized[n][96:], (old.mean(0) if mean else 0 * old[0]).expand(4, -1))
    if name.startswith("bov") or name.startswith("value-embed"):
        assert tables, "this value path looks values up by token id"
    again = LanguageModel(ModelConfig.from_dict(hf.config.blocklab)).eval()
    again.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(again(torch.tensor([[99, 3, 96]])), hf(torch.tensor([[99, 3, 96]])).logits)


@pytest.mark.skipif(not hf_takes("resize_token_embeddings", "mean_resizing"),
                    reason="this transformers' resize_token_embeddings has no mean_resizing (4.45 had none)")
def test_resize_without_mean_shrinking_and_padding_to_a_multiple():
    model = small("pre-ln+value-embed", tie_embeddings=False)
    hf = hf_model(model).eval()
    table = model.block(0).attn.values.value_table
    with torch.no_grad():
        first = table[:90].clone()
        logits = hf(ids_of(1, 6, vocab=90)).logits
        hf.resize_token_embeddings(120, mean_resizing=False)
    assert torch.equal(table[96:], torch.zeros(24, table.shape[1]))  # new tokens add no value
    std = model.cfg.init_std
    for rows in (model.tok_emb.weight[96:], model.head.weight[96:]):  # N(0, init_std), as at init
        assert abs(rows.std().item() - std) < 0.25 * std and abs(rows.mean().item()) < 0.25 * std
    hf.resize_token_embeddings(90)
    assert hf.model.cfg.vocab_size == 90 and torch.equal(table, first) and model.head.weight.shape[0] == 90
    with torch.no_grad():
        torch.testing.assert_close(hf(ids_of(1, 6, vocab=90)).logits, logits[..., :90], rtol=0, atol=1e-6)
    hf.resize_token_embeddings(91, pad_to_multiple_of=8)
    assert hf.config.blocklab["vocab_size"] == 96 and table.shape[0] == 96


# -- 2. gradient checkpointing ---------------------------------------------------------------------
def _loss_grads_and_recomputed(hf, ids: torch.Tensor) -> tuple[torch.Tensor, dict, int]:
    """Loss and gradients of one step (dropout drawn from a fixed seed), and how many blocks started
    their MLP again during the backward pass (a pre-hook: the recomputation stops once it has what the
    backward pass needs, which may be inside the MLP)."""
    calls = []
    handles = [b.mlp.register_forward_pre_hook(lambda *_: calls.append(1)) for b in hf.model.block_list()]
    hf.zero_grad(set_to_none=True)
    torch.manual_seed(5)
    loss = hf(ids, labels=ids).loss
    forward_calls = len(calls)
    loss.backward()
    for h in handles:
        h.remove()
    grads = {n: p.grad.clone() for n, p in hf.named_parameters() if p.grad is not None}
    return loss.detach(), grads, len(calls) - forward_calls


def _enable(hf, **kwargs) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers 5 renames it activation_checkpointing
        hf.gradient_checkpointing_enable(**kwargs)


@pytest.mark.parametrize("arch", ["pre-ln+resformer", "sas-p+bov", "pre-ln+denseformer"])
def test_gradient_checkpointing_recomputes_blocks_with_equal_loss_and_gradients(arch):
    """float64, training mode with dropout: the same loss and gradients with and without, and the
    blocks really run again in the backward pass (none do without)."""
    model = make_model(arch, dropout=0.1)
    hf = hf_model(model).train()
    ids = tokens()
    loss, grads, recomputed = _loss_grads_and_recomputed(hf, ids)
    assert recomputed == 0
    keys = set(hf.state_dict())
    _enable(hf)
    assert hf.is_gradient_checkpointing and set(hf.state_dict()) == keys
    loss_ckpt, grads_ckpt, recomputed = _loss_grads_and_recomputed(hf, ids)
    assert recomputed == model.cfg.n_layers
    assert loss_ckpt.item() == loss.item()
    assert grads_ckpt.keys() == grads.keys() and len(grads) == len(list(hf.parameters()))
    for name, grad in grads.items():
        torch.testing.assert_close(grads_ckpt[name], grad, rtol=1e-12, atol=1e-12, msg=name)
    hf.gradient_checkpointing_disable()
    assert not hf.is_gradient_checkpointing and all("forward" not in b.__dict__ for b in model.block_list())
    assert _loss_grads_and_recomputed(hf, ids)[2] == 0


def test_gradient_checkpointing_every_n_layers_picks_the_blocks():
    import inspect

    from transformers import PreTrainedModel

    # transformers 5 passes its **kwargs on to the model's _set_gradient_checkpointing; 4.x takes none
    takes = inspect.signature(PreTrainedModel.gradient_checkpointing_enable).parameters.values()
    if not any(p.kind is p.VAR_KEYWORD or p.name == "every_n_layers" for p in takes):
        pytest.skip("this transformers' gradient_checkpointing_enable passes no every_n_layers (4.x)")
    hf = hf_model(make_model("pre-ln+resformer")).train()
    _enable(hf, every_n_layers=2)
    assert _loss_grads_and_recomputed(hf, tokens())[2] == 2  # blocks 0 and 2 of 3


def test_gradient_checkpointing_reentrant_request_and_eval():
    """A reentrant request is run non-reentrant (it would drop the gradients that flow through
    ResFormer's V_1 in the carry), with a warning; eval and no_grad passes do not checkpoint."""
    model = make_model("pre-ln+resformer")
    hf = hf_model(model).train()
    ids = tokens()
    _, grads, _ = _loss_grads_and_recomputed(hf, ids)
    with pytest.warns(UserWarning, match="use_reentrant=False"):
        _enable(hf, gradient_checkpointing_kwargs={"use_reentrant": True})
    _, grads_ckpt, recomputed = _loss_grads_and_recomputed(hf, ids)
    assert recomputed == 3
    for name, grad in grads.items():
        torch.testing.assert_close(grads_ckpt[name], grad, rtol=1e-12, atol=1e-12, msg=name)
    hf.eval()
    assert _loss_grads_and_recomputed(hf, ids)[2] == 0


def test_gradient_checkpointing_with_hidden_states_and_attentions_in_the_loss():
    """The recorded outputs are read outside the checkpointed blocks: a loss on them has the same value
    and gradients with and without checkpointing (a matrix built inside a block would break its
    recomputation)."""
    hf = hf_model(make_model("pre-ln+resformer", dropout=0.1)).train()
    ids = tokens()

    def step() -> tuple[float, dict]:
        hf.zero_grad(set_to_none=True)
        torch.manual_seed(3)
        out = hf(ids, labels=ids, output_attentions=True, output_hidden_states=True)
        loss = out.loss + out.attentions[1].square().sum() + out.hidden_states[2].square().mean()
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in hf.named_parameters()}

    loss, grads = step()
    _enable(hf)
    loss_ckpt, grads_ckpt = step()
    assert loss_ckpt == loss
    for name, grad in grads.items():
        torch.testing.assert_close(grads_ckpt[name], grad, rtol=1e-12, atol=1e-12, msg=name)


# -- 3. output_hidden_states and output_attentions ------------------------------------------------
def _reference_attention(cfg, p, layer: int, x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, T): the matrix layer `layer` applies to its values, for block input `x`, from the
    float64 reference's own pieces (its Q, K, RoPE, masks and Eqs. 2, 4, 5)."""
    pre = f"blocks.{layer}.attn"
    if cfg.block_layout != "post-ln":
        x = R.norm(cfg, p, f"blocks.{layer}.norm1",
                   cfg.norm if (cfg.norm_layers == "all" or layer == 0) else "none", x)
    n_heads, n_kv, d = R.sizes(cfg)
    q = R.split_heads(R.linear(p, f"{pre}.q", x), n_heads, d)
    k = R.split_heads(R.linear(p, f"{pre}.k", x), n_kv, d)
    positions = torch.arange(x.shape[1])
    if cfg.positions == "rope":
        q, k = R.rope(q, positions, cfg.rope_base), R.rope(k, positions, cfg.rope_base)
    allowed = R.mask_matrix(x.shape[1], x.shape[1], cfg.causal, R.layer_window(cfg, layer))
    gains = [None, None, None]
    if cfg.attn_matrix != "softmax":
        size = n_heads if cfg.headwise_gains else 1
        names = ("alpha", "beta", "gamma") if cfg.attn_matrix == "shaped" else ("alpha", "beta")
        inits = (cfg.attn_alpha, cfg.attn_beta, cfg.attn_gamma)
        for i, name in enumerate(names):
            gains[i] = p.gain(f"{pre}.{name}.gain", inits[i], cfg.trainable_attn_gains, size)
    return torch.stack([R.attention_matrix(q[:, h], k[:, h // (n_heads // n_kv)], allowed, cfg.attn_matrix,
                                           *gains, h) for h in range(n_heads)], dim=1)


@pytest.mark.parametrize("arch", PRESETS)
def test_hidden_states_and_attentions_match_the_float64_reference(arch):
    """Every block preset: n_layers + 1 hidden states (the embedding output, each block's output, the
    last after the final norm) and each layer's matrix, against tests/reference.py."""
    model = make_model(arch)
    ids = tokens()
    cfg, p = model.cfg, R.Params(model)
    x = R.embed(cfg, p, ids)
    hidden, attentions = [x], []
    for layer in range(cfg.n_layers):
        attentions.append(_reference_attention(cfg, p, layer, x))
        x = R.block(cfg, p, layer, x, torch.arange(ids.shape[1]))
        hidden.append(x)
    hidden[-1] = R.norm(cfg, p, "norm", cfg.norm if cfg.final_norm else "none", x)
    with torch.no_grad():
        out = hf_model(model)(ids, output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == cfg.n_layers + 1 and len(out.attentions) == cfg.n_layers
    for ours, ref in zip(out.hidden_states, hidden, strict=True):
        torch.testing.assert_close(ours, ref, **TOL)
    for ours, ref in zip(out.attentions, attentions, strict=True):
        torch.testing.assert_close(ours, ref, **TOL)


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=97, n_positions=32,
                                    layer_norm_epsilon=1e-5, attn_implementation="eager"))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in hf.parameters():
            param.add_(0.2 * torch.randn(param.shape, generator=g))
    return hf.eval()


def test_hidden_states_and_attentions_match_hf_gpt2():
    """A tiny random GPT-2 imported with from_hf: HF's hidden states and eager attention matrices; ours
    under both attention implementations (where transformers can switch them; its default otherwise)."""
    gpt2 = _gpt2()
    ours = hf_model(from_hf(gpt2)).eval()
    ids = ids_of(3, 11, vocab=97)
    switch = hasattr(ours, "set_attn_implementation")  # 4.45 had none
    with torch.no_grad():
        ref = gpt2(ids, output_hidden_states=True, output_attentions=True)
        for implementation in ("sdpa", "eager") if switch else (None,):
            if implementation is not None:
                ours.set_attn_implementation(implementation)
            out = ours(ids, output_hidden_states=True, output_attentions=True)
            assert len(out.hidden_states) == len(ref.hidden_states) == 3 and len(out.attentions) == 2
            for a, b in zip(out.hidden_states, ref.hidden_states, strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
            for a, b in zip(out.attentions, ref.attentions, strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
            torch.testing.assert_close(out.logits, ref.logits, rtol=0, atol=1e-4)
            assert ours(ids).hidden_states is None and ours(ids).attentions is None


def test_hidden_states_of_the_nanochat_trunk_match_the_analysis_trace():
    """Smear, residual scalars, backout and DenseFormer's averages act outside the blocks: each hidden
    state is what the next block reads (blocklab.analysis.trace), the last one the head's input."""
    from blocklab.analysis import trace

    model = small("pre-ln+denseformer", smear=True, residual_scalars=True, backout=True, embed_norm=True)
    ids = ids_of(2, 10)
    with torch.no_grad():
        out = hf_model(model)(ids, output_hidden_states=True)
        traced = trace(model, ids)
        torch.testing.assert_close(model.head_logits(out.hidden_states[-1]), out.logits)
    for i, layer in enumerate(traced[:-1]):
        torch.testing.assert_close(out.hidden_states[i + 1], layer.hidden)
    torch.testing.assert_close(out.hidden_states[-1], model.norm(traced[-1].hidden))


def test_hidden_states_in_generate_and_the_refusals_of_attentions():
    model = small("svformer")
    hf = hf_model(model).eval()
    ids = ids_of(1, 6)
    with torch.no_grad():
        gen = hf.generate(ids, max_new_tokens=3, do_sample=False, output_hidden_states=True,
                          return_dict_in_generate=True)
        prompt = hf(ids, output_hidden_states=True).hidden_states
    assert len(gen.hidden_states) == 3 and len(gen.hidden_states[1]) == 4  # steps; embeddings + 3 layers
    for a, b in zip(gen.hidden_states[0], prompt, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert gen.hidden_states[1][0].shape == (1, 1, 32)
    with pytest.raises(ValueError, match="KV cache"):
        hf.generate(ids, max_new_tokens=2, output_attentions=True, return_dict_in_generate=True)
    cross = hf_model(small("pre-ln+cross-layer-attn"))
    with pytest.raises(ValueError, match=r"cross-layer-attn.*layers \[1, 2\]"):
        cross(ids, output_attentions=True)
    assert len(cross(ids, output_hidden_states=True).hidden_states) == 4


def test_masked_lm_hidden_states_and_bidirectional_attentions():
    model = small("pre-ln", causal=False)
    with torch.no_grad():
        out = hf_model(model)(ids_of(2, 7), output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == 4 and out.logits.shape == (2, 7, 96)
    torch.testing.assert_close(model.head_logits(out.hidden_states[-1]), out.logits)
    matrix = out.attentions[0]
    torch.testing.assert_close(matrix.sum(-1), torch.ones(2, 2, 7))
    assert bool((matrix[..., 0, 1:] > 0).all())  # the first token sees the later ones


# -- 4. attn_implementation -------------------------------------------------------------------------
@_needs_set_attn_implementation()
@pytest.mark.parametrize("arch", ["shaped", "sas-p+svformer", "pre-ln+cla"])
def test_attn_implementation_sdpa_by_default_and_eager_builds_the_matrices(arch, tmp_path):
    """Loaded with "sdpa" (the default) or "eager": both reported; eager runs the explicit matrices
    (the blocks' `explicit` flag) and gives sdpa's logits and generated tokens; flash attention is
    refused."""
    from transformers import AutoModelForCausalLM

    import blocklab.interop.hf_model  # noqa: F401 (registers model_type "blocklab")

    folder = save_pretrained(small(arch), tmp_path / "hf", format="hf")
    default = AutoModelForCausalLM.from_pretrained(folder).eval()
    sdpa = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
    eager = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    assert default.config._attn_implementation == sdpa.config._attn_implementation == "sdpa"
    assert eager.config._attn_implementation == "eager"
    ids = ids_of(2, 9)
    with torch.no_grad():
        torch.testing.assert_close(eager(ids).logits, sdpa(ids).logits, rtol=0, atol=1e-5)
        assert torch.equal(eager.generate(ids, max_new_tokens=5, do_sample=False),
                           sdpa.generate(ids, max_new_tokens=5, do_sample=False))
    assert all(b.attn.explicit for b in eager.model.block_list())
    assert not any(b.attn.explicit for b in sdpa.model.block_list())
    eager.set_attn_implementation("sdpa")
    with torch.no_grad():
        eager(ids)
    assert not any(b.attn.explicit for b in eager.model.block_list())
    with pytest.raises((ValueError, ImportError)):
        AutoModelForCausalLM.from_pretrained(folder, attn_implementation="flash_attention_2")


# -- 5. the config's size fields --------------------------------------------------------------------
def test_config_size_fields_match_transformers_own_llama_config(tmp_path):
    """A Llama-shaped model with grouped-query attention is exported natively as LlamaConfig
    (hf_export.py): our config reports the same sizes for the same model."""
    from transformers import AutoConfig

    model = small("pre-ln", mlp_act="swiglu", n_heads=4, n_kv_heads=2, head_dim=12, mlp_hidden=40)
    llama = AutoConfig.from_pretrained(save_pretrained(model, tmp_path / "llama", format="hf"))
    assert llama.model_type == "llama"
    ours = BlocklabConfig(blocklab=model.cfg.to_dict())
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "intermediate_size", "max_position_embeddings",
                 "tie_word_embeddings"):
        assert getattr(ours, name) == getattr(llama, name), name
    assert ours.use_cache is True and ours.pad_token_id is None
    assert (ours.num_key_value_heads, ours.head_dim, ours.intermediate_size) == (2, 12, 40)
    again = BlocklabConfig.from_dict(ours.to_dict())
    assert again.use_cache is True and again.num_key_value_heads == 2


# -- 6. generate: the length checked up front ------------------------------------------------------
def _blocklab_refuses(model, ids, new, cache=None) -> bool:
    try:
        model.generate(ids, new, cache=cache)
    except ValueError:
        return True
    return False


def test_generate_checks_prompt_and_new_tokens_fit_before_decoding():
    """The issue's case (a 120-token prompt + 20 new tokens at context 128) fails before any block runs;
    the boundary is blocklab's own generate's (prompt + new - 1 positions), also under max_length and
    for a cache of a given max_len."""
    model = small("svformer", context_length=128)
    hf = hf_model(model).eval()
    runs = []
    model.block(0).register_forward_pre_hook(lambda *_: runs.append(1))
    with pytest.raises(ValueError, match=r"120-token prompt \+ 20 new tokens.*context_length = 128"):
        hf.generate(ids_of(1, 120), max_new_tokens=20, do_sample=False)
    assert not runs
    with pytest.raises(ValueError, match=r"130 positions \(max_length 131"):
        hf.generate(ids_of(1, 120), max_length=131, do_sample=False)
    assert not runs
    with torch.no_grad():
        for prompt, new, cache_len in ((120, 9, None), (120, 10, None), (20, 5, 24), (20, 6, 24)):
            ids = ids_of(1, prompt)
            cache = None if cache_len is None else model.new_cache(1, cache_len)
            refused = _blocklab_refuses(model, ids, new, cache)
            assert refused == (prompt + new - 1 > (cache_len or 128))
            kwargs = {} if cache_len is None else {CACHE_NAME: hf.new_cache(cache_len)}
            where = "cache's max_len = 24" if cache_len else "context_length = 128"
            if refused:
                with pytest.raises(ValueError, match=where):
                    hf.generate(ids, max_new_tokens=new, do_sample=False, **kwargs)
            else:
                out = hf.generate(ids, max_new_tokens=new, do_sample=False, **kwargs)
                assert torch.equal(out, model.generate(ids, new))


# -- 7. save_pretrained of a model loaded as remote code ------------------------------------------
@pytest.mark.parametrize("marked", ["config", "config-and-model"])
def test_hf_save_pretrained_of_a_remote_code_load_keeps_the_exported_modules(marked, tmp_path, monkeypatch):
    """export -> trust_remote_code load -> HF's save_pretrained, twice: the same two modules and auto_map
    as the export (no copy of hf_model.py), HF's mark kept, and the folder loads again with the same
    logits. In a process that had not imported blocklab, HF's remote-code load marks the config class
    (``register_for_auto_class``), which makes save_pretrained copy the module defining it; the
    model class is marked where HF also loads it as remote code. Here both marks are set as HF sets them."""
    from blocklab.interop.hf_model import BlocklabForCausalLM

    model = small("sas-p+svformer")
    export = save_pretrained(model, tmp_path / "export", format="hf")
    hf = remote(export)
    monkeypatch.setattr(BlocklabConfig, "_auto_class", None)  # put back as it was after the test
    monkeypatch.setattr(BlocklabForCausalLM, "_auto_class", None)
    BlocklabConfig.register_for_auto_class()
    if marked == "config-and-model":
        BlocklabForCausalLM.register_for_auto_class("AutoModelForCausalLM")
    ids = ids_of(2, 12)
    for folder in (tmp_path / "again", tmp_path / "twice"):
        hf.save_pretrained(folder)
        modules = {p.name: p.read_text() for p in folder.glob("*.py")}
        assert modules == {p.name: p.read_text() for p in export.glob("*.py")}
        assert set(modules) == {"configuration_blocklab.py", "modeling_blocklab.py"}
        config = json.loads((folder / "config.json").read_text())
        assert config["auto_map"] == json.loads((export / "config.json").read_text())["auto_map"]
        with torch.no_grad():
            torch.testing.assert_close(remote(folder)(ids).logits, model(ids), rtol=0, atol=1e-5)
    assert BlocklabConfig._auto_class == "AutoConfig"
    model_mark = "AutoModelForCausalLM" if marked == "config-and-model" else None
    assert BlocklabForCausalLM._auto_class == model_mark
