"""The initialisation schemes (model/init_schemes.py), checked against their documented tables rather than
against the code: each tensor's law (its std, zeros, uniform bounds, constants), that `init_weights` sets
every parameter and buffer, and that it writes each of them once."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from blocklab import LanguageModel, ModelConfig
from blocklab.model.presets import BLOCK_PRESETS
from blocklab.model.value_paths import VALUE_PATHS
from blocklab.util.errors import ConfigError


# -- the documented laws ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Normal:
    std: float


@dataclass(frozen=True)
class Uniform:
    low: float
    high: float


@dataclass(frozen=True)
class Const:  # every entry equals one of `values` in order (a constant, or a gain's initial vector)
    values: tuple[float, ...]


@dataclass(frozen=True)
class Orthogonal:  # W W^T = I
    pass


@dataclass(frozen=True)
class Skip:  # checked on its own (the ties)
    pass


Law = Normal | Uniform | Const | Orthogonal | Skip
ZERO, ONE = Const((0.0,)), Const((1.0,))

# each value path's learned scalars at initialisation, from the papers and the paths' docstrings
RESFORMER_LAMBDAS = {"resformer": (0.5, 0.5), "resformer-constant": (2.0, 1.0),
                     "resformer-sparse": (5.0, 1.0), "resformer-learnable": (0.5, 0.5),
                     "resformer-learnable-plus": (None, 0.5)}


def documented_law(name: str, cfg: ModelConfig) -> Law:
    """The law of tensor `name` under `cfg`, from init_schemes.py's tables and the papers."""
    nanochat = cfg.init_scheme == "nanochat"
    std, d = cfg.init_std, cfg.d_model
    s = math.sqrt(3 / d)
    parts = name.split(".")
    last = parts[-1]
    layer = int(parts[1]) if parts[0] == "blocks" else None
    if name == "tok_emb.weight":
        given = cfg.embed_init_std
        return Normal(0.8) if nanochat else Normal(std if given is None else given)
    if name == "pos_emb.weight":
        return Normal(std)
    if name == "head.weight":
        return Normal(0.001 if nanochat else std)
    if name == "smear.gate.weight":
        return Uniform(0.0, 0.02) if nanochat else Normal(std)
    if name in ("smear.strength.gain", "backout.strength.gain"):
        return Const((0.0,)) if parts[0] == "smear" else Const((0.2,))
    if "norm" in name.split(".")[-2]:  # norm1, norm2, embed_norm, norm
        return ONE if last == "weight" else ZERO
    if parts[0] == "blocks" and parts[2] in ("attn_skip", "attn_branch", "mlp_skip", "mlp_branch"):
        return Const((getattr(cfg, parts[2] + "_gain"),))
    if parts[0] == "blocks" and parts[2] == "residual":  # nanochat's per-layer scalars
        depth = layer / (cfg.n_layers - 1)
        return Const((1.15 - 0.10 * depth,) if parts[3] == "resid_lambda" else (0.20 - 0.15 * depth,))
    if parts[0] == "blocks" and parts[2] == "attn":
        return _attention_law(parts[3:], cfg, layer, nanochat, s)
    if parts[0] == "blocks" and parts[2] == "mlp":
        if last == "bias":
            return ZERO
        if parts[3] == "fc":
            return Uniform(-0.4 * s, 0.4 * s) if nanochat else Normal(std)
        return ZERO if nanochat else Normal(std)
    if parts[0] == "value_shared":
        return _shared_law(parts[1:], cfg, nanochat)
    raise AssertionError(f"no documented law for {name}")


def _attention_law(parts: list[str], cfg: ModelConfig, layer: int, nanochat: bool, s: float) -> Law:
    std, last = cfg.init_std, parts[-1]
    if parts[0] in ("alpha", "beta", "gamma"):
        return Const((getattr(cfg, "attn_" + parts[0]),))
    if parts[0] in ("q", "k") or parts[:2] == ["values", "w_v"] or parts[0] == "proj":
        kind = "proj" if parts[0] == "proj" else "v" if parts[0] == "values" else parts[0]
        if last == "bias" or last == "delta":
            return ZERO
        if last == "w_init":  # a reparameterised map: Simplifying Eq. (6)
            return Skip() if kind == "proj" and cfg.reparam_tie != "none" else (
                Orthogonal() if cfg.reparam_init == "orthogonal" else Const(("eye",)))
        if last == "gain":  # its alpha (skip) and beta (resid)
            prefix = "value" if kind == "v" else "proj"
            return Const((getattr(cfg, f"{prefix}_{'skip' if parts[-2] == 'skip' else 'resid'}_gain"),))
        if kind == "q":
            q_std = std if cfg.query_init_std is None else cfg.query_init_std
            return Uniform(-s, s) if nanochat else Normal(q_std)
        if kind in ("k", "v"):
            return Uniform(-s, s) if nanochat else Normal(std)
        return ZERO if nanochat else Normal(std)
    assert parts[0] == "values", parts
    return _value_path_law(parts[1:], cfg, layer, nanochat)


def _value_path_law(parts: list[str], cfg: ModelConfig, layer: int, nanochat: bool) -> Law:
    path, opts, d = cfg.value_path, cfg.value_path_options, cfg.d_model
    if path == "value-embed" and parts[0] in ("lambda0", "lambda1"):  # modded-nanogpt's lambdas
        return Const((0.5,))
    if parts[0] in ("lambda1", "lambda2"):
        lambdas = RESFORMER_LAMBDAS[path]
        return Const((opts.get(parts[0], lambdas[parts[0] == "lambda2"]),))
    if parts[0] == "lambdas":  # Dense-ResFormer starts as Identity-ResFormer
        return Const((0.5,) + (0.0,) * (layer - 1) + (0.5,))
    if parts[0] == "gate" and path == "resformer-mix":  # W_m, b_m: the model's N(0, init_std) and 0
        return ZERO if parts[1] == "bias" else Normal(cfg.init_std)
    if parts[0] == "gate":  # nanochat's value-embedding gate
        return Uniform(0.0, 0.02)
    if parts[0] == "value_table" and path == "value-embed":
        return Normal(d ** -0.5)
    if parts[0] == "value_table":  # RMSNorm(E) W^V with a fresh W^V: entries of std sqrt(d) std(W^V)
        return Normal(1.0 if nanochat else math.sqrt(d) * cfg.init_std)
    if parts[0] == "coef":
        added = path == "x0-value" and opts.get("add")
        return Const((0.0 if added else opts.get("coef", 1.0),))
    if parts[0] == "main":
        return ONE
    raise AssertionError(f"no documented law for the value path's {'.'.join(parts)}")


def _shared_law(parts: list[str], cfg: ModelConfig, nanochat: bool) -> Law:
    if parts[0] == "scale":  # ResFormer Plus: lambda = N, lambda'_n = log(n)
        return Const((float(cfg.n_layers),))
    if parts[0] == "logits":
        return Skip()  # checked in test_resformer_plus_logits
    if parts[0] == "dwa":  # DenseFormer: 1 on the current output, 0 elsewhere
        return Skip()  # checked in test_denseformer_weights
    if parts[0] == "tables":
        return Normal(cfg.d_model ** -0.5)
    if parts[0] == "value_table":
        return Normal(1.0 if nanochat else math.sqrt(cfg.d_model) * cfg.init_std)
    raise AssertionError(f"no documented law for value_shared.{'.'.join(parts)}")


def check_law(name: str, t: torch.Tensor, law: Law) -> None:
    x = t.detach().double().flatten()
    n = x.numel()
    if isinstance(law, Skip):
        return
    if isinstance(law, Const):
        if law.values == ("eye",):
            assert torch.equal(t, torch.eye(t.shape[0], dtype=t.dtype)), name
        else:
            expected = torch.tensor(law.values, dtype=torch.float64).expand(n) if len(law.values) == 1 else \
                torch.tensor(law.values, dtype=torch.float64)
            torch.testing.assert_close(x, expected, atol=1e-6, rtol=0, msg=name)
        return
    if isinstance(law, Orthogonal):
        torch.testing.assert_close(t @ t.T, torch.eye(t.shape[0]), atol=1e-4, rtol=0, msg=name)
        return
    if isinstance(law, Normal) and law.std == 0:
        assert not x.any(), name
        return
    mean, sd = (0.0, law.std) if isinstance(law, Normal) else (
        (law.low + law.high) / 2, (law.high - law.low) / math.sqrt(12))
    if n < 200:  # too few for statistics: the support and a loose spread
        assert 0.4 * sd < x.std() < 1.8 * sd, f"{name}: std {x.std():.4g}, expected {sd:.4g}"
    else:
        assert x.std().item() == pytest.approx(sd, rel=0.06), f"{name}: std {x.std():.4g}, expected {sd:.4g}"
        assert abs(x.mean().item() - mean) < 5 * sd / math.sqrt(n), f"{name}: mean {x.mean():.4g}"
    inner = ((x - mean).abs() < 0.5 * sd).double().mean().item()  # normal: 0.383; uniform: 0.289
    if isinstance(law, Uniform):
        assert law.low <= x.min() and x.max() <= law.high, f"{name}: outside [{law.low}, {law.high}]"
        if n >= 200:
            assert inner == pytest.approx(0.289, abs=0.06), f"{name} does not look uniform"
    elif n >= 200:
        assert inner == pytest.approx(0.383, abs=0.06), f"{name} does not look normal"


# -- configs ----------------------------------------------------------------------------------------
TABLE_CONFIGS = {
    "pre-ln": ("pre-ln", "tiny", {}),
    "gpt2-like": ("pre-ln", "tiny", dict(norm="layernorm", bias=True, tie_embeddings=False,
                                         positions="learned", embed_init_std=0.5, query_init_std=0.05,
                                         smear=True)),
    "sas": ("sas", "tiny", {}),
    "post-ln-qk-bias": ("post-ln", "tiny", dict(qk_bias=True, rmsnorm_eps="outside")),
    "v-skipinit": ("v-skipinit", "tiny", {}),
    "reparam-all-tied": ("pre-ln", "tiny", dict(value_form="reparam", proj_form="reparam",
                                                reparam_tie="all-tied", trainable_reparam_gains=True,
                                                value_skip_gain=0.7, proj_resid_gain=0.3)),
    "reparam-ll-tied": ("pre-ln", "tiny", dict(value_form="reparam", proj_form="reparam",
                                               reparam_tie="ll-tied")),
    "nanochat": ("pre-ln", "nanochat-tiny", {}),
    "nanochat-upstream": ("pre-ln+value-embed", "nanochat-tiny",
                          dict(residual_scalars=True, backout=True, n_kv_heads=2, positions="learned")),
    "nanochat-bov": ("pre-ln+bov", "nanochat-tiny", {}),
    "nanochat-reparam": ("sas", "nanochat-tiny", dict(proj_form="reparam")),
    "bov-shared": ("pre-ln+bov", "tiny", dict(value_path_options=dict(shared=True))),
    "resformer-mix": ("pre-ln+resformer-mix", "tiny", {}),
    "resformer-learnable": ("sas+resformer-learnable", "tiny", {}),
    "resformer-constant": ("pre-ln+resformer-constant", "tiny", {}),
    "resformer-plus": ("pre-ln+resformer-learnable-plus", "tiny", {}),
    "resformer-dense": ("pre-ln+resformer-dense", "tiny", {}),
    "denseformer": ("pre-ln+denseformer", "tiny", {}),
    "x0-add": ("pre-ln+x0-value", "tiny", dict(value_path_options=dict(add=True))),
    "v1-value": ("pre-ln+v1-value", "tiny", {}),
    "value-embed-lambda": ("pre-ln+value-embed", "tiny", dict(value_path_options=dict(gate="lambda",
                                                                                     shared_tables=2))),
    "cla": ("pre-ln+cla", "tiny", {}),
}


def _cfg(key: str) -> ModelConfig:
    arch, size, over = TABLE_CONFIGS[key]
    return ModelConfig.from_preset(arch, size, **over)


def _tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


@pytest.mark.parametrize("key", list(TABLE_CONFIGS))
def test_every_tensor_follows_its_documented_law(key):
    cfg = _cfg(key)
    torch.manual_seed(0)
    model = LanguageModel(cfg)
    for name, t in _tensors(model).items():
        check_law(name, t, documented_law(name, cfg))


def test_tied_reparam_inits_follow_simplifyings_appendix():
    """all-tied: W_O,init = W_V,init^T in every layer; ll-tied: the product over all layers is I."""
    for key in ("reparam-all-tied", "reparam-ll-tied"):
        torch.manual_seed(0)
        model = LanguageModel(_cfg(key))
        v = [b.attn.values.w_v.w_init for b in model.block_list()]
        o = [b.attn.proj.w_init for b in model.block_list()]
        product = torch.eye(v[0].shape[0], dtype=torch.float64)
        for v_init, o_init in zip(v, o, strict=True):  # x -> x V^T O^T: layer by layer, the map O V
            product = o_init.double() @ v_init.double() @ product
        torch.testing.assert_close(product, torch.eye(v[0].shape[0], dtype=torch.float64), atol=1e-4, rtol=0)
        if key == "reparam-all-tied":
            for v_init, o_init in zip(v, o, strict=True):
                assert torch.equal(o_init, v_init.T)
        else:  # the other layers keep their own orthogonal W_O,init
            assert not torch.allclose(o[0], v[0].T, atol=1e-3)
            check_law("w_init", o[0], Orthogonal())


def test_resformer_plus_logits_and_denseformer_weights():
    """ResFormer Plus: lambda'_n = log(n) over the mixing layers (1-based n); DenseFormer: each averaging
    block's weights are 1 on the current output and 0 on every earlier one."""
    torch.manual_seed(0)
    plus = LanguageModel(_cfg("resformer-plus"))
    n_layers = plus.cfg.n_layers
    expected = torch.tensor([math.log(n + 1) for n in range(1, n_layers)])
    torch.testing.assert_close(plus.value_shared.logits.gain.detach(), expected)
    dense = LanguageModel(_cfg("denseformer"))
    gains = {name: p for name, p in dense.named_parameters() if name.startswith("value_shared.dwa.")}
    assert len(gains) == n_layers
    for name, p in gains.items():
        want = torch.zeros_like(p)
        want[-1] = 1.0
        assert torch.equal(p.detach(), want), name


def test_bank_of_values_tables_are_the_embedding_through_a_fresh_value_map():
    """E_v = RMSNorm(E) W^V (Bank of Values Eq. 5) with a W^V of the scheme's law: E_v lies in the span of
    RMSNorm(E)'s columns, d_model of them, so a least-squares fit from RMSNorm(E) leaves nothing."""
    for key in ("nanochat-bov", "bov-shared"):
        torch.manual_seed(0)
        model = LanguageModel(_cfg(key))
        e = F.rms_norm(model.tok_emb.weight.double(), (model.cfg.d_model,))
        tables = [t for n, t in model.named_parameters() if n.endswith("value_table")]
        assert tables
        for table in tables:
            w = torch.linalg.lstsq(e, table.detach().double()).solution  # (d, kv): W^V transposed
            torch.testing.assert_close(e @ w, table.detach().double(), atol=1e-4, rtol=0)
            law = Uniform(-math.sqrt(3 / model.cfg.d_model), math.sqrt(3 / model.cfg.d_model)) \
                if model.cfg.init_scheme == "nanochat" else Normal(model.cfg.init_std)
            check_law(f"{key}: W^V behind the table", w.T.float(), law)


# -- every tensor set, each once ---------------------------------------------------------------------
def _grid() -> list[tuple[str, str, dict]]:
    small = dict(n_layers=4, d_model=48, n_heads=4, mlp_hidden=96, vocab_size=64, context_length=16)
    nano = dict(small, head_dim=12)
    grid = [(f"{block}+{path}", "tiny", small) for block in BLOCK_PRESETS for path in VALUE_PATHS]
    grid += [(f"pre-ln+{path}", "nanochat-tiny", nano) for path in VALUE_PATHS]
    grid += [("pre-ln+value-embed", "nanochat-tiny", dict(nano, residual_scalars=True, backout=True)),
             ("sas", "nanochat-tiny", nano),
             ("pre-ln", "tiny", dict(small, value_form="reparam", proj_form="reparam",
                                     reparam_tie="all-tied")),
             ("pre-ln", "tiny", dict(small, value_form="reparam", proj_form="reparam",
                                     reparam_tie="ll-tied")),
             ("pre-ln", "tiny", dict(small, norm="layernorm", bias=True, positions="learned", smear=True,
                                     tie_embeddings=False, embed_norm=True)),
             ("pre-ln+bov", "tiny", dict(small, value_path_options=dict(shared=True))),
             ("pre-ln+value-embed", "tiny", dict(small, value_path_options=dict(gate="lambda",
                                                                                shared_tables=2)))]
    return grid


def _grid_id(entry: tuple[str, str, dict]) -> str:
    arch, size, over = entry
    extra = {k: v for k, v in over.items() if k not in ("n_layers", "d_model", "n_heads", "mlp_hidden",
                                                        "vocab_size", "context_length", "head_dim")}
    return f"{arch}:{size}" + "".join(f",{k}={v}" for k, v in extra.items())


def _valid(entry: tuple[str, str, dict]) -> bool:
    try:
        ModelConfig.from_preset(entry[0], entry[1], **entry[2])
    except ConfigError:
        return False
    return True


def test_the_grid_leaves_out_only_cross_layer_attention_without_softmax():
    """Cross-layer attention is Eq. (2) of plain softmax attention: the one combination the grid drops."""
    dropped = {_grid_id(e) for e in _grid() if not _valid(e)}
    softmax = {b for b, preset in BLOCK_PRESETS.items()
               if preset.fields.get("attn_matrix", "softmax") == "softmax"}
    assert dropped == {f"{b}+cross-layer-attn:tiny" for b in BLOCK_PRESETS if b not in softmax}


def _meta_model(entry: tuple[str, str, dict]) -> LanguageModel:
    arch, size, over = entry
    cfg = ModelConfig.from_preset(arch, size, **over)
    with torch.device("meta"):
        model = LanguageModel(cfg)
    model.to_empty(device="cpu")
    return model


GRID = [pytest.param(entry, id=_grid_id(entry)) for entry in _grid() if _valid(entry)]


@pytest.mark.parametrize("entry", GRID)
def test_init_weights_sets_every_parameter_and_buffer(entry):
    model = _meta_model(entry)
    with torch.no_grad():
        for t in _tensors(model).values():
            t.fill_(float("nan"))
    model.init_weights()
    unset = [name for name, t in _tensors(model).items() if not torch.isfinite(t).all()]
    assert not unset, f"init_weights left these unset: {unset}"


# what writes a tensor in place during initialisation
INIT_FUNCTIONS = ("normal_", "uniform_", "zeros_", "ones_", "constant_", "orthogonal_", "eye_",
                  "trunc_normal_", "xavier_normal_", "xavier_uniform_", "kaiming_normal_", "kaiming_uniform_",
                  "dirac_", "sparse_")
TENSOR_METHODS = ("copy_", "fill_", "zero_", "normal_", "uniform_", "__setitem__", "mul_", "add_", "clamp_")


def _record_writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Patch every in-place writer to record the address it writes; a writer called inside another (an
    nn.init function filling through Tensor.normal_) counts once, as the outer call."""
    writes: list[int] = []
    depth = [0]

    def wrap(fn: Callable) -> Callable:
        def recording(tensor, *args, **kwargs):
            if depth[0] == 0:
                writes.append(tensor.data_ptr())
            depth[0] += 1
            try:
                return fn(tensor, *args, **kwargs)
            finally:
                depth[0] -= 1
        return recording

    for name in INIT_FUNCTIONS:
        monkeypatch.setattr(torch.nn.init, name, wrap(getattr(torch.nn.init, name)))
    for name in TENSOR_METHODS:
        monkeypatch.setattr(torch.Tensor, name, wrap(getattr(torch.Tensor, name)))
    return writes


def _tied_output_inits(model: LanguageModel) -> set[str]:
    """W_O,init buffers that the reparameterisation ties set after the map's own init (Simplifying App.
    Fig. 14): every layer's when all-tied, the last layer's when ll-tied. These are written twice."""
    mode, n = model.cfg.reparam_tie, model.cfg.n_layers
    layers = range(n) if mode == "all-tied" else [n - 1] if mode == "ll-tied" else []
    return {f"blocks.{i}.attn.proj.w_init" for i in layers}


@pytest.mark.parametrize("entry", GRID)
def test_init_weights_writes_every_tensor_once(entry, monkeypatch):
    model = _meta_model(entry)
    tensors = _tensors(model)
    writes = _record_writes(monkeypatch)
    model.init_weights()
    monkeypatch.undo()
    counts = Counter(writes)
    tied = _tied_output_inits(model)
    wrong = {name: counts[t.data_ptr()] for name, t in tensors.items()
             if counts[t.data_ptr()] != (2 if name in tied else 1)}
    assert not wrong, f"tensors written other than once (name: writes): {wrong}"
