"""blocklab.interop: HF GPT-2 / Llama import (interop/hf.py), export and load, in blocklab's format and as
GPT-2 / Llama classes. Retrofitting value paths: tests/interop/test_retrofitting.py.

References: the HF `transformers` models themselves (a peer implementation, eager attention) for
the imports; hand computations for the config mapping.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from blocklab.util.integrity import fields_sha256, sha256

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()  # tiny vocabularies make HF warn about bos/eos ids

from safetensors import safe_open  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model, LlamaConfig, LlamaForCausalLM  # noqa: E402

from blocklab import ConfigError, LanguageModel, ModelConfig  # noqa: E402
from blocklab.interop import (  # noqa: E402
    config_from_hf,
    from_hf,
    load_pretrained,
    load_tokenizer,
    save_pretrained,
)

VOCAB, CONTEXT = 97, 32
LENGTHS = (1, 7, CONTEXT)  # several sequence lengths, each with a batch of 3
TOL = 1e-4  # float32, max abs difference of logits


def perturb(model: torch.nn.Module, seed: int, scale: float = 0.2) -> torch.nn.Module:
    """Move every weight away from its initialisation (HF zeros biases, sets norm weights to 1) and
    make attention far from uniform, so that a wrong transpose, split or rotation shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return model.eval()


def gpt2(seed=0, **overrides) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=CONTEXT,
                     layer_norm_epsilon=1e-5, attn_implementation="eager", **overrides)
    return perturb(GPT2LMHeadModel(cfg), seed)


def llama(seed=0, **overrides) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    fields = dict(num_hidden_layers=2, hidden_size=32, intermediate_size=48, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=12, vocab_size=VOCAB, max_position_embeddings=CONTEXT,
                  rope_theta=500.0, rms_norm_eps=1e-6, attn_implementation="eager")
    return perturb(LlamaForCausalLM(LlamaConfig(**{**fields, **overrides})), seed)


def ids(batch: int, t: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, t), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def max_diff(ours: LanguageModel, hf, lengths=LENGTHS) -> float:
    worst = 0.0
    for t in lengths:
        x = ids(3, t, seed=t)
        worst = max(worst, (ours.eval()(x) - hf(x).logits).abs().max().item())
    return worst


# -- import: the same logits as HF --------------------------------------------------------------
HF_MODELS = {
    "gpt2-tied-gelu_new": lambda: gpt2(),
    "gpt2-untied-gelu-inner": lambda: gpt2(seed=1, activation_function="gelu", n_inner=40,
                                           tie_word_embeddings=False),
    "llama-gqa-headdim-untied": lambda: llama(),
    "llama-mha-tied-bias": lambda: llama(seed=2, num_key_value_heads=4, head_dim=8, attention_bias=True,
                                         mlp_bias=True, tie_word_embeddings=True, rms_norm_eps=1e-5,
                                         rope_theta=10000.0),
}


@pytest.mark.parametrize("name", HF_MODELS)
def test_import_matches_hf_logits(name):
    hf = HF_MODELS[name]()
    ours = from_hf(hf)
    assert hf(ids(1, 4)).logits.abs().max() > 1.0  # logits far from zero: the comparison has teeth
    assert max_diff(ours, hf) <= TOL
    # copies, not views: training the import leaves the HF model alone
    assert all(p.data_ptr() not in {q.data_ptr() for q in hf.parameters()} for p in ours.parameters())


@pytest.mark.parametrize("name", ["gpt2-untied-gelu-inner", "llama-gqa-headdim-untied"])
def test_import_from_folder(name, tmp_path):
    hf = HF_MODELS[name]()
    hf.save_pretrained(tmp_path / "hf")
    assert max_diff(from_hf(tmp_path / "hf"), hf) <= TOL
    assert max_diff(from_hf(str(tmp_path / "hf")), hf, lengths=(5,)) <= TOL


def _wrong(model: LanguageModel, edit) -> LanguageModel:
    state = {k: v.clone() for k, v in model.state_dict().items()}
    edit(state)
    bad = LanguageModel(model.cfg)
    bad.load_state_dict(state)
    return bad


def _interleave_rows(w: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Reorder each head's rows (x_0, x_{D/2}, x_1, ...): the interleaved RoPE pairing."""
    half = head_dim // 2
    order = torch.stack((torch.arange(half), torch.arange(half) + half), dim=1).flatten()
    return w.view(-1, head_dim, w.shape[-1])[:, order].reshape(w.shape)


def test_import_comparison_catches_convention_errors():
    """Each convention the import gets right changes the logits by far more than TOL when wrong."""
    hf = gpt2()
    ours = from_hf(hf)
    w = "blocks.0.attn.proj.weight"  # square: a missing Conv1D transpose still loads
    assert max_diff(_wrong(ours, lambda s: s.__setitem__(w, s[w].t().contiguous())), hf) > 100 * TOL
    q, k = "blocks.1.attn.q.weight", "blocks.1.attn.k.weight"  # c_attn split in the wrong order
    assert max_diff(_wrong(ours, lambda s: s.update({q: s[k], k: s[q]})), hf) > 100 * TOL
    gelu = LanguageModel(ours.cfg.replace(mlp_act="gelu"))  # exact GELU instead of the tanh form
    gelu.load_state_dict(ours.state_dict())
    assert max_diff(gelu, hf) > TOL

    hf = llama()
    ours = from_hf(hf)
    fc = "blocks.0.mlp.fc.weight"  # SwiGLU halves swapped: silu on the up projection
    swapped = _wrong(ours, lambda s: s.__setitem__(fc, torch.cat(s[fc].chunk(2)[::-1])))
    assert max_diff(swapped, hf) > 100 * TOL
    q, k = "blocks.0.attn.q.weight", "blocks.0.attn.k.weight"  # interleaved instead of half-split RoPE
    inter = _wrong(ours, lambda s: s.update({q: _interleave_rows(s[q], 12), k: _interleave_rows(s[k], 12)}))
    assert max_diff(inter, hf) > 100 * TOL
    theta = LanguageModel(ours.cfg.replace(rope_base=10000.0))  # rope_theta ignored
    theta.load_state_dict(ours.state_dict())
    assert max_diff(theta, hf) > 100 * TOL


def test_import_keeps_dtype():
    hf = llama().to(torch.bfloat16)
    ours = from_hf(hf)
    assert {p.dtype for p in ours.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in from_hf(gpt2()).parameters()} == {torch.float32}


@pytest.mark.parametrize("name", ["gpt2-tied-gelu_new", "llama-gqa-headdim-untied"])
def test_float64_import_is_exact(name):
    """Built in float64 and loaded: every weight bit-identical. GPT-2's logits agree to float64
    rounding (a detour through float32 left them 1e-7 apart); HF Llama computes its rotary angles in
    float32 even in a float64 model (`LlamaRotaryEmbedding` casts with `.float()`), which alone
    leaves about 3e-6, so Llama is held to float32's tolerance."""
    hf = perturb(HF_MODELS[name]().double(), seed=5, scale=1e-3)  # weights float32 cannot hold
    ours = from_hf(hf)
    assert {p.dtype for p in ours.parameters()} == {torch.float64}
    hf_state = hf.state_dict()
    embed = "transformer.wte.weight" if name.startswith("gpt2") else "model.embed_tokens.weight"
    assert torch.equal(ours.tok_emb.weight, hf_state[embed])
    assert max_diff(ours, hf) <= (1e-12 if name.startswith("gpt2") else TOL)


def test_float64_folder_import_is_exact(tmp_path):
    """A folder saved in float64 loads in float64 (transformers < 5 loaded float32 by default)."""
    hf = perturb(HF_MODELS["gpt2-tied-gelu_new"]().double(), seed=6, scale=1e-3)
    hf.save_pretrained(tmp_path)
    ours = from_hf(tmp_path)
    assert {p.dtype for p in ours.parameters()} == {torch.float64}
    assert torch.equal(ours.tok_emb.weight, hf.state_dict()["transformer.wte.weight"])
    assert max_diff(ours, hf) <= 1e-12


@pytest.mark.parametrize(("version", "keyword"), [("4.45.0", "torch_dtype"), ("4.55.4", "torch_dtype"),
                                                  ("4.56.0", "dtype"), ("5.23.0", "dtype")])
def test_folder_loads_ask_for_the_saved_dtype_by_the_keyword_of_each_version(monkeypatch, version, keyword):
    """transformers renamed `torch_dtype` to `dtype` in 4.56; before 5 the default was float32."""
    import transformers

    from blocklab.interop import hf as hf_interop

    monkeypatch.setattr(transformers, "__version__", version)
    assert hf_interop._saved_dtype() == {keyword: "auto"}


def test_config_from_hf_fields():
    """The field mapping, checked against the HF configs by hand."""
    gpt = config_from_hf(GPT2Config(n_layer=3, n_embd=48, n_head=6, vocab_size=300, n_positions=64,
                                    layer_norm_epsilon=1e-6, initializer_range=0.03))
    expect = dict(vocab_size=300, d_model=48, n_layers=3, n_heads=6, n_kv_heads=None, head_dim=None,
                  mlp_hidden=192, context_length=64, norm="layernorm", norm_eps=1e-6, positions="learned",
                  mlp_act="gelu_tanh", bias=True, tie_embeddings=True, block_layout="pre-ln",
                  init_std=0.03, value_path="standard")
    assert {k: getattr(gpt, k) for k in expect} == expect
    lla = config_from_hf(LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=96,
                                     num_attention_heads=8, num_key_value_heads=2, vocab_size=300,
                                     max_position_embeddings=128, rope_theta=5e5, rms_norm_eps=1e-5))
    expect = dict(vocab_size=300, d_model=64, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=None,
                  mlp_hidden=96, context_length=128, norm="rmsnorm", norm_eps=1e-5, positions="rope",
                  rope_base=5e5, mlp_act="swiglu", bias=False, tie_embeddings=False, block_layout="pre-ln")
    assert {k: getattr(lla, k) for k in expect} == expect
    assert config_from_hf(GPT2Config(n_layer=1, n_embd=16, n_head=2), dropout=0.1).dropout == 0.1


UNSUPPORTED = {
    "rope-scaling": (lambda: LlamaConfig(rope_scaling={"rope_type": "linear", "factor": 2.0}), "rope_type"),
    "llama-act": (lambda: LlamaConfig(hidden_act="gelu"), "hidden_act"),
    "llama-bias": (lambda: LlamaConfig(attention_bias=True, mlp_bias=False), "mlp_bias"),
    "gpt2-act": (lambda: GPT2Config(activation_function="silu"), "activation_function"),
    "gpt2-layer-scale": (lambda: GPT2Config(scale_attn_by_inverse_layer_idx=True),
                         "scale_attn_by_inverse_layer_idx"),
    "gpt2-cross": (lambda: GPT2Config(add_cross_attention=True), "add_cross_attention"),
    "model-type": (lambda: transformers.BertConfig(), "model_type"),
}


@pytest.mark.parametrize("name", UNSUPPORTED)
def test_unsupported_hf_config_names_the_field(name):
    make, field = UNSUPPORTED[name]
    with pytest.raises(ConfigError, match=field):
        config_from_hf(make())


def test_from_hf_rejects_bad_inputs(tmp_path):
    with pytest.raises(TypeError, match="LM head"):
        from_hf(GPT2Model(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB)))
    with pytest.raises(FileNotFoundError, match="not a folder"):
        from_hf(tmp_path / "missing")
    with pytest.raises(TypeError, match="GPT2LMHeadModel"):
        from_hf(42)
    hf = llama()
    hf.model.layers[1].self_attn.extra_gate = torch.nn.Parameter(torch.ones(3))  # a weight we cannot place
    with pytest.raises(ConfigError, match="model.layers.1.self_attn.extra_gate"):
        from_hf(hf)


# -- export and load ----------------------------------------------------------------------------
SMALL = dict(n_layers=3, d_model=32, n_heads=4, vocab_size=VOCAB, context_length=CONTEXT, mlp_hidden=64)


def blocklab_model(arch: str, seed: int = 0, **overrides) -> LanguageModel:
    torch.manual_seed(seed)
    model = LanguageModel(ModelConfig.from_preset(arch, "tiny", **{**SMALL, **overrides}))
    return perturb(model, seed + 1, scale=0.05)  # gains and lambdas away from their init too


EXPORTS = {
    "pre-ln-tied": ("pre-ln", {}),
    "sas-p+bov-shared": ("sas-p+bov", dict(value_path_options={"shared": True})),  # reparam buffers
    "llama-like+resformer-plus": ("pre-ln+resformer-learnable-plus",
                                  dict(positions="rope", mlp_act="swiglu", tie_embeddings=False,
                                       n_kv_heads=2, norm="rmsnorm")),
    "svformer-anchors": ("pre-ln+svformer", dict(value_path_options={"anchors": [2]})),
}


@pytest.mark.parametrize("name", EXPORTS)
def test_export_round_trip(name, tmp_path):
    arch, overrides = EXPORTS[name]
    model = blocklab_model(arch, **overrides)
    folder = save_pretrained(model, tmp_path / "run" / "export")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((folder / "config.json").read_text())
    assert config.pop("blocklab_config_sha256") == fields_sha256(config)  # the fields as written
    assert config.pop("blocklab_format_version") == 1 and config.pop("dtype") == "float32"
    assert config.pop("blocklab_sha256") == {"model.safetensors": sha256(folder / "model.safetensors")}
    assert config == json.loads(json.dumps(model.cfg.to_dict()))
    loaded = load_pretrained(folder)
    assert loaded.cfg == model.cfg
    x = ids(2, 9)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(x), model.eval()(x))
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())
    assert not list((tmp_path / "run").glob(".*"))  # no temporary folders left behind


def test_export_saves_tied_weights_once_and_keeps_dtype(tmp_path):
    model = blocklab_model("pre-ln").to(torch.bfloat16)
    save_pretrained(model, tmp_path)  # an empty existing folder is fine
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert "tok_emb.weight" in keys and not any(k.startswith("head") for k in keys)
    assert keys == set(model.state_dict())
    loaded = load_pretrained(tmp_path)
    assert loaded.tok_emb.weight.dtype == torch.bfloat16
    assert torch.equal(loaded.tok_emb.weight, model.tok_emb.weight)


def test_export_of_hf_import_keeps_hf_logits(tmp_path):
    hf = HF_MODELS["llama-mha-tied-bias"]()
    save_pretrained(from_hf(hf), tmp_path / "export")
    assert max_diff(load_pretrained(tmp_path / "export"), hf) <= TOL


def test_export_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["the value residual", "a bank of values", "shaped attention"] * 5,
                            trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]"]))
    model = blocklab_model("pre-ln")
    save_pretrained(model, tmp_path / "a", tokenizer=tok)
    text = "values of the bank"
    assert load_tokenizer(tmp_path / "a").encode(text).ids == tok.encode(text).ids
    save_pretrained(model, tmp_path / "b", tokenizer=tmp_path / "a" / "tokenizer.json")  # a file path
    assert load_tokenizer(tmp_path / "b").encode(text).ids == tok.encode(text).ids
    assert load_tokenizer(tmp_path / "run-without") is None


def test_export_replaces_only_an_earlier_export(tmp_path):
    first, second = blocklab_model("pre-ln", seed=0), blocklab_model("pre-ln", seed=5)
    save_pretrained(first, tmp_path / "export")
    save_pretrained(second, tmp_path / "export")  # an earlier export is replaced
    assert torch.equal(load_pretrained(tmp_path / "export").tok_emb.weight, second.tok_emb.weight)

    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text("step 1")
    with pytest.raises(FileExistsError, match="train.log"):
        save_pretrained(first, run)
    assert (run / "train.log").read_text() == "step 1"
    with pytest.raises(TypeError, match="tokenizer"):  # a failure mid-write leaves nothing behind
        save_pretrained(first, tmp_path / "new", tokenizer=object())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "run"]


def test_load_rejects_other_folders(tmp_path):
    gpt2().save_pretrained(tmp_path / "hf")
    with pytest.raises(ConfigError, match="from_hf"):
        load_pretrained(tmp_path / "hf")
    folder = save_pretrained(blocklab_model("pre-ln"), tmp_path / "future")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "blocklab_format_version": 99}))
    with pytest.raises(ConfigError, match="upgrade"):
        load_pretrained(folder)


# -- export in the Hugging Face format -----------------------------------------------------------
GPT2_LIKE = dict(norm="layernorm", positions="learned", mlp_act="gelu_tanh", bias=True)
LLAMA_LIKE = dict(norm="rmsnorm", positions="rope", mlp_act="swiglu", n_kv_heads=2, tie_embeddings=False)
HF_EXPORTS = {  # name: (overrides of the tiny Pre-LN preset, the HF class it becomes)
    "gpt2-like-tied-bias": (GPT2_LIKE, "GPT2LMHeadModel"),
    "gpt2-like-untied-no-bias-relu": (dict(GPT2_LIKE, mlp_act="relu", bias=False, tie_embeddings=False),
                                      "GPT2LMHeadModel"),
    "llama-like-gqa-untied": (dict(LLAMA_LIKE, rope_base=500.0, norm_eps=1e-6), "LlamaForCausalLM"),
    "llama-like-gqa-tied-bias-headdim": (dict(LLAMA_LIKE, tie_embeddings=True, bias=True, head_dim=12),
                                         "LlamaForCausalLM"),
}


def hf_exportable(name: str, seed: int = 0) -> LanguageModel:
    torch.manual_seed(seed)
    model = LanguageModel(ModelConfig.from_preset("pre-ln", "tiny", **{**SMALL, **HF_EXPORTS[name][0]}))
    return perturb(model, seed + 1)  # norm weights, biases, every matrix away from its init


@pytest.mark.parametrize("name", HF_EXPORTS)
def test_hf_export_loads_in_transformers_with_the_same_logits(name, tmp_path):
    model = hf_exportable(name)
    folder = save_pretrained(model, tmp_path / "hf", format="hf")
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "generation_config.json",
                                                        "model.safetensors"]
    config = json.loads((folder / "config.json").read_text())
    dtype = config.get("dtype", config.get("torch_dtype"))  # transformers 4.x writes `torch_dtype`
    assert config["architectures"] == [HF_EXPORTS[name][1]] and dtype == "float32"
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert type(hf).__name__ == HF_EXPORTS[name][1]
    assert not any(info.values())  # no missing, unexpected or mismatched weights
    assert hf(ids(1, 4)).logits.abs().max() > 1.0
    assert max_diff(model, hf) <= TOL
    back = from_hf(folder)  # and back into blocklab: the same model (GPT-2 has zero biases, not none)
    assert back.cfg == (model.cfg.replace(bias=True) if config["model_type"] == "gpt2" else model.cfg)
    assert max_diff(back, hf) <= TOL


def test_hf_export_keeps_dtype_and_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["the value residual", "a bank of values"] * 5,
                            trainers.BpeTrainer(vocab_size=60, special_tokens=["<|endoftext|>", "[UNK]"]))
    model = hf_exportable("llama-like-gqa-untied").to(torch.bfloat16)
    folder = save_pretrained(model, tmp_path / "hf", tokenizer=tok, format="hf")
    from blocklab.interop import hf as hf_interop

    # the saved dtype: transformers 5's default; 4.x loads float32 unless asked for "auto" (by its keyword)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, **hf_interop._saved_dtype())
    assert hf.dtype == torch.bfloat16 and hf.config.eos_token_id == 0
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert hf_tok("bank of values").input_ids == tok.encode("bank of values").ids
    assert hf_tok.eos_token == "<|endoftext|>"
    assert load_tokenizer(folder).encode("the value").ids == tok.encode("the value").ids


HF_REFUSED = {  # name: (arch, overrides, text the message must hold)
    "sas-p": ("sas-p", {}, ["block_layout = 'parallel'", "attn_skip_gain = 0.0", "mlp_branch_gain = 0.1",
                            "trainable_block_gains = True", "attn_matrix = 'shaped'",
                            "value_form = 'identity'", "proj_form = 'identity'",
                            "first_value_form = 'reparam'"]),
    "pre-ln+bov": ("pre-ln+bov", LLAMA_LIKE, ["value_path = 'bov'"]),
    "nanochat-bits": ("pre-ln", dict(LLAMA_LIKE, qk_norm=True, logit_softcap=15.0, window_size=8,
                                     window_pattern="SL"),
                      ["qk_norm = True", "logit_softcap = 15.0", "window_size = 8"]),
    "gpt2-gqa-sinusoidal": ("pre-ln", dict(GPT2_LIKE, n_kv_heads=2, positions="sinusoidal"),
                            ["n_kv_heads = 2", "positions = 'sinusoidal' (needs 'learned')"]),
    "default-tiny": ("pre-ln", {}, ["norm = 'rmsnorm' (needs 'layernorm')",
                                    "mlp_act = 'relu' (needs 'swiglu')"]),
}


@pytest.mark.parametrize("name", HF_REFUSED)
def test_native_hf_export_names_what_gpt2_and_llama_cannot_express(name, tmp_path):
    """hf_target names every field neither native model expresses; format="hf" then writes the
    remote-code export (tests/interop/test_hf_model.py checks what it computes)."""
    from blocklab.interop.hf_export import hf_target

    arch, overrides, expected = HF_REFUSED[name]
    model = LanguageModel(ModelConfig.from_preset(arch, "tiny", **{**SMALL, **overrides}))
    with pytest.raises(ConfigError) as err:
        hf_target(model.cfg)
    for text in expected:
        assert text in str(err.value)
    folder = save_pretrained(model, tmp_path / "hf", format="hf")
    assert json.loads((folder / "config.json").read_text())["model_type"] == "blocklab"


def test_hf_export_errors(tmp_path, monkeypatch):
    model = hf_exportable("gpt2-like-tied-bias")
    with pytest.raises(ConfigError, match="'hf'"):
        save_pretrained(model, tmp_path / "x", format="gguf")
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if the hf extra were not installed
    with pytest.raises(ImportError, match=r'pip install "blocklab\[hf\]"'):
        save_pretrained(model, tmp_path / "x", format="hf")
    assert not list(tmp_path.iterdir())


def test_each_format_points_to_the_other_loader(tmp_path):
    model = hf_exportable("llama-like-gqa-untied")
    save_pretrained(model, tmp_path / "hf", format="hf")
    with pytest.raises(ConfigError, match=r"Hugging Face llama checkpoint.*from_hf"):
        load_pretrained(tmp_path / "hf")
    save_pretrained(model, tmp_path / "ours")
    with pytest.raises(ConfigError, match=r"blocklab export.*load_pretrained"):
        from_hf(tmp_path / "ours")
    save_pretrained(model, tmp_path / "hf")  # each format replaces an earlier export of the other
    save_pretrained(model, tmp_path / "ours", format="hf")
    x = ids(2, 5)
    with torch.no_grad():
        assert torch.equal(load_pretrained(tmp_path / "hf")(x), from_hf(tmp_path / "ours")(x))


def test_interop_is_an_attribute_of_blocklab():
    code = ("import sys, blocklab; blocklab.interop.from_hf, blocklab.interop.save_pretrained; "
            "sys.exit('transformers' in sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)
