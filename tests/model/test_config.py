"""ModelConfig: presets, serialisation round trips and validation errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml

from blocklab import ConfigError, ModelConfig
from blocklab.model.presets import BLOCK_PRESETS, SIZE_PRESETS

NON_DEFAULT = dict(n_kv_heads=2, head_dim=16, window_size=4, window_pattern="SSL", logit_softcap=15.0,
                   causal=False, rope_base=500.0, positions="rope", qk_norm=True, mlp_act="swiglu",
                   norm_eps=1e-6, tie_embeddings=False)


def configs():
    yield "sas-tiny", ModelConfig.from_preset("sas", "tiny")
    yield "sas-p-nonorm-codeparrot", ModelConfig.from_preset("sas-p-nonorm", "codeparrot-18l")
    yield "nanochat-d12", ModelConfig.from_preset("pre-ln", "nanochat-d12")
    yield "non-default", ModelConfig.from_preset("pre-ln", "tiny", **NON_DEFAULT)
    yield "reparam-tied", ModelConfig.from_preset(
        "v-skipinit", "tiny", value_form="reparam", proj_form="reparam", reparam_init="orthogonal",
        reparam_tie="ll-tied", value_resid_gain=0.25)


CONFIGS = dict(configs())


@pytest.mark.parametrize("name", list(CONFIGS))
def test_dict_round_trip_through_json(name):
    cfg = CONFIGS[name]
    text = json.dumps(cfg.to_dict())
    back = ModelConfig.from_dict(json.loads(text))
    assert back == cfg
    assert ModelConfig.from_dict(json.loads(cfg.to_json())) == cfg


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_file_round_trip(name, suffix, tmp_path):
    cfg = CONFIGS[name]
    path = tmp_path / f"cfg{suffix}"
    path.write_text(cfg.to_json() if suffix == ".json" else cfg.to_yaml())
    loaded = ModelConfig.load(path)
    assert loaded == cfg
    assert loaded.to_dict() == cfg.to_dict()


def test_yaml_is_plain_data():
    cfg = CONFIGS["non-default"]
    data = yaml.safe_load(cfg.to_yaml())
    assert data["window_pattern"] == "SSL" and data["n_kv_heads"] == 2 and data["logit_softcap"] == 15.0
    assert set(data) == {f.name for f in dataclasses.fields(ModelConfig)}


def test_partial_file_uses_defaults(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text("d_model: 64\nn_heads: 2\nn_layers: 3\n")
    cfg = ModelConfig.load(path)
    assert (cfg.d_model, cfg.n_heads, cfg.n_layers) == (64, 2, 3)
    assert cfg.vocab_size == ModelConfig().vocab_size


def test_yaml_float_without_a_dot(tmp_path):
    """PyYAML reads `1e-5` (no dot, YAML 1.1) as the string '1e-5': a hand-written config must
    load as the float or fail with a ConfigError that names the field, not with a TypeError."""
    path = tmp_path / "eps.yaml"
    path.write_text("norm_eps: 1e-5\n")
    assert yaml.safe_load(path.read_text()) == {"norm_eps": "1e-5"}
    try:
        cfg = ModelConfig.load(path)
    except ConfigError as err:
        assert "norm_eps" in str(err)
    else:
        assert cfg.norm_eps == 1e-5


def test_preset_precedence_defaults_then_size_then_arch_then_overrides():
    cfg = ModelConfig.from_preset("sas-p", "codeparrot-18l", n_layers=5, mlp_branch_gain=0.2)
    assert cfg.n_layers == 5 and cfg.mlp_branch_gain == 0.2  # overrides win
    assert cfg.d_model == 768 and cfg.norm == "rmsnorm"  # from the size preset
    assert cfg.block_layout == "parallel" and cfg.attn_matrix == "shaped"  # from the arch preset
    assert cfg.mlp_skip_gain == 0.0 and cfg.attn_skip_gain == 0.0  # SAS-P has no skips


@pytest.mark.parametrize("size", list(SIZE_PRESETS))
@pytest.mark.parametrize("arch", list(BLOCK_PRESETS))
def test_every_preset_combination_is_valid(arch, size):
    cfg = ModelConfig.from_preset(arch, size)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


# -- errors name the field and what is allowed -----------------------------------------------------
def error_of(fn):
    with pytest.raises(ConfigError) as info:
        fn()
    assert isinstance(info.value, ValueError)
    return str(info.value)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


BAD_CONFIGS = {
    "unknown-arch": (lambda: ModelConfig.from_preset("sass"), ["'sass'", "sas", "sas-p", "pre-ln"]),
    "unknown-size": (lambda: ModelConfig.from_preset("sas", size="huge"),
                     ["'huge'", "size", "tiny", "codeparrot-18l"]),
    "d_model-not-divisible": (lambda: ModelConfig(d_model=30, n_heads=4), ["d_model", "30", "n_heads=4"]),
    "d_model-not-divisible-override": (
        lambda: ModelConfig.from_preset("pre-ln", "tiny", d_model=100, n_heads=3), ["d_model", "n_heads=3"]),
    "window-larger-than-context": (
        lambda: ModelConfig(context_length=16, window_size=32, window_pattern="SL"),
        ["window_size", "32", "context_length=16"]),
    "negative-n_layers": (lambda: ModelConfig(n_layers=-1), ["n_layers", "-1", "positive"]),
    "negative-d_model": (lambda: ModelConfig(d_model=-8), ["d_model", "-8", "positive"]),
    "zero-vocab": (lambda: ModelConfig(vocab_size=0), ["vocab_size", "positive"]),
    "zero-heads": (lambda: ModelConfig(n_heads=0), ["n_heads", "positive"]),
    "negative-context": (lambda: ModelConfig(context_length=-5), ["context_length", "positive"]),
    "negative-n_kv_heads": (lambda: ModelConfig(n_kv_heads=-2), ["n_kv_heads", "positive"]),
    "negative-mlp_hidden": (lambda: ModelConfig(mlp_hidden=-3), ["mlp_hidden", "positive"]),
    "negative-window": (lambda: ModelConfig(window_size=-4), ["window_size", "positive"]),
    "fractional-n_layers": (lambda: ModelConfig(n_layers=2.5), ["n_layers", "positive integer"]),
    "string-norm_eps": (lambda: ModelConfig(norm_eps="tiny"), ["norm_eps", "'tiny'", "a number"]),
    "yaml-word-in-float": (lambda: ModelConfig.from_dict({"dropout": "none"}), ["dropout", "a number"]),
    "bool-as-gain": (lambda: ModelConfig(attn_alpha=True), ["attn_alpha", "a number"]),
    "string-as-bool": (lambda: ModelConfig(causal="no"), ["causal", "True or False"]),
    "int-as-norm": (lambda: ModelConfig(norm=1), ["norm", "1"]),
    "unknown-override": (lambda: ModelConfig.from_preset("sas", n_layer=3), ["n_layer", "n_layers"]),
    "unknown-override-window": (lambda: ModelConfig.from_preset("sas", "tiny", window=4),
                                ["'window'", "window_size"]),
    "unknown-dict-field": (lambda: ModelConfig.from_dict({"d_modle": 64}), ["d_modle", "d_model"]),
    "unknown-keyword": (lambda: ModelConfig(n_layer=3), ["n_layer", "n_layers"]),
    "nan-gain": (lambda: ModelConfig(attn_alpha=float("nan")), ["attn_alpha", "nan", "finite"]),
    "inf-eps": (lambda: ModelConfig(norm_eps=float("inf")), ["norm_eps", "inf", "finite"]),
    "negative-leaky-slope": (lambda: ModelConfig(mlp_act="leaky_relu", leaky_relu_slope=-0.1),
                             ["leaky_relu_slope", "-0.1", ">= 0"]),
    "window-without-s-layers": (lambda: ModelConfig(window_size=4), ["window_size", "'L'", "'SSSL'"]),
    "unknown-replace-field": (lambda: ModelConfig().replace(n_head=3), ["n_head", "n_heads"]),
    "bad-window-pattern": (lambda: ModelConfig(window_size=4, window_pattern="SXL"),
                           ["window_pattern", "'SXL'", "'S'", "'L'"]),
    "empty-window-pattern": (lambda: ModelConfig(window_pattern=""), ["window_pattern", "'S'", "'L'"]),
    "window-pattern-without-size": (
        lambda: ModelConfig(window_pattern="SSSL"), ["window_size", "window_pattern"]),
    "parallel-with-attn-skip": (lambda: ModelConfig.from_preset("parallel", attn_skip_gain=1.0),
                                ["attn_skip_gain", "parallel", "0"]),
    "parallel-layout-default-skip": (lambda: ModelConfig(block_layout="parallel"), ["attn_skip_gain"]),
    "bad-norm": (lambda: ModelConfig(norm="batchnorm"), ["norm", "'batchnorm'", "'layernorm'", "'rmsnorm'"]),
    "bad-mlp_act": (lambda: ModelConfig(mlp_act="tanh"), ["mlp_act", "'tanh'", "'swiglu'"]),
    "bad-positions": (lambda: ModelConfig(positions="alibi"), ["positions", "'alibi'", "'rope'"]),
    "bad-attn_matrix": (lambda: ModelConfig(attn_matrix="sigmoid"), ["attn_matrix", "'shaped'"]),
    "kv-heads-not-dividing": (lambda: ModelConfig(n_heads=4, n_kv_heads=3, d_model=32),
                              ["n_kv_heads", "n_heads=4"]),
    "tie-without-reparam": (lambda: ModelConfig(reparam_tie="all-tied"), ["reparam_tie", "reparam"]),
    "negative-init_std": (lambda: ModelConfig(init_std=-0.5), ["init_std", "-0.5", ">= 0"]),
    "negative-query_init_std": (lambda: ModelConfig(query_init_std=-0.1), ["query_init_std", "-0.1", ">= 0"]),
    "zero-norm_eps": (lambda: ModelConfig(norm_eps=0.0), ["norm_eps", "> 0"]),
    "negative-softcap": (lambda: ModelConfig(logit_softcap=-1.0), ["logit_softcap", "> 0"]),
    "zero-rope_base": (lambda: ModelConfig(positions="rope", rope_base=0.0), ["rope_base", "0.0"]),
    "negative-rope_base": (
        lambda: ModelConfig(positions="rope", rope_base=-10000.0), ["rope_base", "-10000.0"]),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_configs_raise_config_error_naming_the_field(case):
    build, expected = BAD_CONFIGS[case]
    message = error_of(build)
    for text in expected:
        assert text in message, f"{text!r} not in {message!r}"


def test_unknown_field_lists_the_known_fields():
    message = error_of(lambda: ModelConfig.from_dict({"d_model": 64, "colour": "red"}))
    assert "colour" in message and "vocab_size" in message and "window_pattern" in message


def test_validation_runs_on_replace():
    cfg = ModelConfig.from_preset("pre-ln", "tiny")
    with pytest.raises(ConfigError, match="d_model"):
        cfg.replace(d_model=130)


@pytest.mark.parametrize("tie", ["all-tied", "ll-tied"])
def test_reparam_tie_with_a_value_path_that_drops_w_v_names_the_tie_the_path_and_the_layers(tie):
    """The tied inits set W_P,init from W_V,init in each layer; SVFormer has W_V only in layer 0."""
    message = error_of(lambda: ModelConfig(n_layers=3, value_path="svformer", value_form="reparam",
                                           proj_form="reparam", reparam_tie=tie))
    for text in ("reparam_tie", repr(tie), "'svformer'", "layers [1, 2]"):
        assert text in message, f"{text!r} not in {message!r}"


# -- one base for every config class (blocklab.util.configbase) -------------------------------------
def _base_configs():
    from blocklab.data import DataConfig
    from blocklab.finetune.loop import FinetuneConfig
    from blocklab.training import TrainConfig
    from blocklab.training.optim import OptimConfig

    data = DataConfig(tokenizer="byte", hf_kwargs={"split": "train"}, max_chars=1000, objective="mlm")
    optim = OptimConfig(name="muon", betas=(0.8, 0.9), lr_head=1e-2, warmup_steps=3)
    return {  # class: (a non-default instance, a misspelt field, the field it should suggest, a bad value)
        ModelConfig: (CONFIGS["non-default"], "n_layer", "n_layers", {"n_layers": -1}),
        DataConfig: (data, "tokeniser", "tokenizer", {"val_fraction": 2.0}),
        OptimConfig: (optim, "weight_decy", "weight_decay", {"lr": -1.0}),
        TrainConfig: (TrainConfig(max_steps=5, data=data, optim=optim, model={"n_layers": 2}, seq_len=64),
                      "max_step", "max_steps", {"batch_size": 0}),
        FinetuneConfig: (FinetuneConfig(text_columns=("a", "b"), label_names=("x", "y"), betas=(0.9, 0.99),
                                        max_steps=3), "epoch", "epochs", {"dropout": 1.5}),
    }


BASE_CONFIGS = _base_configs()


# (annotation, value, whether it passes): ints pass for floats, bools never for numbers (True == 1),
# tuples pass for lists (JSON reads them back as lists), and unions other than `X | None` pass anything
TYPE_CASES = [
    (int, 3, True), (int, 3.0, False), (int, True, False), (int, "3", False),
    (float, 3, True), (float, 2.5, True), (float, False, False), (float, "1e-5", False), (float, None, False),
    (bool, False, True), (bool, 0, False), (bool, "no", False),
    (str, "x", True), (str, 1, False), (dict[str, Any], {}, True), (dict, [], False),
    (list[int], [1], True), (list, (1, 2), True), (list[int], "1", False),
    (Literal["a", "b"], "b", True), (Literal["a", "b"], "c", False), (Literal[1, 2], True, False),
    (Literal[1, 2], 1, True), (int | None, None, True), (int | None, 2, True), (int | None, 2.5, False),
    (Literal["a"] | None, None, True), (Literal["a"] | None, "b", False),
    (str | list[int], 5, True), (Any, object(), True),
]


@pytest.mark.parametrize(("hint", "value", "passes"), TYPE_CASES)
def test_check_type_passes_exactly_the_values_of_the_annotated_type(hint, value, passes):
    from blocklab.util.configbase import check_type

    if passes:
        check_type("X.f", value, hint)
    else:
        message = error_of(lambda: check_type("X.f", value, hint))
        assert message.startswith(f"X.f = {value!r} is not allowed: ")


def test_check_types_names_the_setting_and_what_it_must_be():
    from blocklab.util.configbase import check_types

    @dataclasses.dataclass
    class Options:
        n: int = 1
        rate: float | None = None
        mode: Literal["value", "key"] = "value"

    assert error_of(lambda: check_types(Options(rate="fast"))) == (
        "Options.rate = 'fast' is not allowed: it must be a number or None.")
    assert error_of(lambda: check_types(Options(mode="query"), "value_path_options[{!r}]")) == (
        "value_path_options['mode'] = 'query' is not allowed: choose one of 'value', 'key'.")
    assert error_of(lambda: check_types(Options(n=True, mode=1))) == (
        "Options.n = True is not allowed: it must be an integer.")  # the first field in order
    check_types(Options(n=2, rate=1))


@pytest.mark.parametrize(("field", "value", "words"), [
    ("causal", "no", "it must be True or False."), ("dropout", "none", "it must be a number."),
    ("norm_eps", "tiny", "it must be a number or None."), ("window_pattern", 4, "it must be a string."),
    ("value_path_options", [], "it must be a dict."),
    ("norm", 1, "choose one of 'layernorm', 'rmsnorm', 'none'."),
    ("first_value_form", "dense", "choose one of 'linear', 'identity', 'reparam' or None."),
])
def test_model_config_type_errors_say_what_the_field_must_be(field, value, words):
    assert error_of(lambda: ModelConfig(**{field: value})) == (
        f"ModelConfig.{field} = {value!r} is not allowed: {words}")


@pytest.mark.parametrize("cls", list(BASE_CONFIGS), ids=lambda c: c.__name__)
def test_unknown_keyword_names_the_class_and_the_close_field(cls):
    cfg, typo, suggestion, _ = BASE_CONFIGS[cls]
    for build in (lambda: cls(**{typo: 1}), lambda: cls.from_dict({typo: 1}),
                  lambda: cfg.replace(**{typo: 1})):
        message = error_of(build)  # a ConfigError, not the TypeError of a bare dataclass
        assert f"unknown {cls.__name__} field {typo!r}" in message and f"Did you mean {suggestion}" in message
    assert f"{cls.__name__} field 'bogus'" in error_of(lambda: cls(bogus=1))


@pytest.mark.parametrize("cls", list(BASE_CONFIGS), ids=lambda c: c.__name__)
def test_dict_round_trip_through_json_and_yaml(cls):
    cfg = BASE_CONFIGS[cls][0]
    data = cfg.to_dict()
    assert cls.from_dict(data) == cfg
    assert cls.from_dict(json.loads(json.dumps(data))) == cfg
    assert cls.from_dict(yaml.safe_load(yaml.safe_dump(data))) == cfg  # plain data: safe_dump takes it


@pytest.mark.parametrize("cls", list(BASE_CONFIGS), ids=lambda c: c.__name__)
def test_replace_validates_and_names_the_class(cls):
    cfg, _, _, bad = BASE_CONFIGS[cls]
    [(name, value)] = bad.items()
    message = error_of(lambda: cfg.replace(**bad))
    assert f"{cls.__name__}.{name} = {value!r} is not allowed" in message


def test_train_config_yaml_keeps_lists_and_nested_sections():
    from blocklab.training import TrainConfig

    cfg = BASE_CONFIGS[TrainConfig][0]
    data = yaml.safe_load(cfg.to_yaml())
    assert data["optim"]["betas"] == [0.8, 0.9] and data["data"]["hf_kwargs"] == {"split": "train"}
    assert TrainConfig.from_dict(data) == cfg


SAVED = sorted((Path(__file__).resolve().parents[2] / "benchmarks").rglob("model_config.json"))


def test_configs_saved_by_earlier_versions_still_load():
    """Runs saved by earlier versions (before the config moved under model/, and before its
    modules merged into one) load and round-trip; no field was renamed, so no alias is needed."""
    import blocklab.model
    from blocklab.model.config import ModelConfig as Defined

    assert ModelConfig is Defined is blocklab.model.ModelConfig and len(SAVED) > 10
    for path in SAVED:
        data = json.loads(path.read_text())
        cfg = Defined.load(path)
        assert cfg.to_dict() == {**cfg.to_dict(), **data}, path  # every saved field read as saved
        assert Defined.from_dict(cfg.to_dict()) == cfg


# A config as `ModelConfig.to_dict` wrote it before the components read their sizes through
# `attention_shape` and `mlp_shape`: the optional sizes saved as None, grouped-query heads given.
SAVED_BEFORE_SHAPES = {
    "vocab_size": 64, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": None,
    "mlp_hidden": None, "context_length": 16, "causal": True, "norm": "layernorm", "norm_eps": 1e-05,
    "rmsnorm_eps": "inside", "norm_layers": "all", "final_norm": True, "qk_norm": False,
    "positions": "learned", "rope_base": 10000.0, "mlp_act": "gelu", "leaky_relu_slope": 0.0,
    "tie_embeddings": True, "bias": False, "qk_bias": False, "window_size": None, "window_pattern": "L",
    "logit_softcap": None, "init_std": 0.02, "embed_init_std": None, "embed_scale": 1.0, "dropout": 0.0,
    "norm_affine": True, "embed_norm": False, "attn_logit_scale": 1.0, "smear": False,
    "residual_scalars": False, "backout": False, "init_scheme": "normal", "block_layout": "pre-ln",
    "attn_skip_gain": 1.0, "attn_branch_gain": 1.0, "mlp_skip_gain": 1.0, "mlp_branch_gain": 1.0,
    "trainable_block_gains": False, "attn_matrix": "softmax", "attn_alpha": 1.0, "attn_beta": 1.0,
    "attn_gamma": 1.0, "trainable_attn_gains": False, "headwise_gains": True, "query_init_std": None,
    "value_form": "linear", "first_value_form": None, "proj_form": "linear", "reparam_init": "orthogonal",
    "reparam_tie": "none", "value_skip_gain": 1.0, "value_resid_gain": 1.0, "proj_skip_gain": 1.0,
    "proj_resid_gain": 1.0, "trainable_reparam_gains": False, "value_path": "resformer",
    "value_path_options": {"layers": "all", "lambda1": 0.5},
}


def test_a_config_saved_before_the_shape_groups_builds_the_same_model():
    """None sizes resolve as before (head_dim d / H, MLP 4 d) and the model equals one built from
    the resolved sizes given explicitly, weight for weight and logit for logit."""
    import torch

    from blocklab import LanguageModel
    from blocklab.model.fields import AttentionShape

    cfg = ModelConfig.from_dict(json.loads(json.dumps(SAVED_BEFORE_SHAPES)))
    assert cfg.to_dict() == SAVED_BEFORE_SHAPES  # saved back as it was, None values included
    assert cfg.attention_shape == AttentionShape(d_model=32, n_heads=4, n_kv_heads=2, head_dim=8)
    assert (cfg.attention_shape.kv_dim, cfg.mlp_shape.hidden) == (16, 128)
    explicit = cfg.replace(head_dim=8, mlp_hidden=128)
    torch.manual_seed(0)
    saved = LanguageModel(cfg)
    torch.manual_seed(0)
    built = LanguageModel(explicit)
    state = saved.state_dict()
    assert {k: v.shape for k, v in state.items()} == {k: v.shape for k, v in built.state_dict().items()}
    assert all(torch.equal(v, built.state_dict()[k]) for k, v in state.items())
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(saved(ids), built(ids), rtol=0, atol=0)


def test_the_fields_keep_their_order_and_the_old_shim_is_gone():
    """`to_dict` writes the fields in the order of a config saved by an earlier version, and
    `blocklab.config`, the shim that re-exported ModelConfig, no longer exists."""
    import importlib.util

    assert list(ModelConfig().to_dict()) == list(SAVED_BEFORE_SHAPES)
    assert importlib.util.find_spec("blocklab.config") is None


def test_the_norm_checks_its_own_settings():
    """The norm's rules live with the norm (`NormShape.check`, model/norms.py), each error named by the
    ModelConfig field it comes from, and ModelConfig raises them on construction."""
    from blocklab.model.norms import NormShape

    with pytest.raises(ConfigError, match=r"ModelConfig.norm_eps = None is not allowed: None \(the dtype"):
        NormShape("layernorm", 8, None, eps_outside=False, bias=False, affine=True).check()
    with pytest.raises(ConfigError, match="ModelConfig.rmsnorm_eps = 'outside' is not allowed"):
        NormShape("layernorm", 8, 1e-5, eps_outside=True, bias=False, affine=True).check()
    with pytest.raises(ConfigError, match="ModelConfig.norm_eps = -1.0 is not allowed: it must be > 0"):
        NormShape("rmsnorm", 8, -1.0, eps_outside=False, bias=False, affine=True).check()
    NormShape("rmsnorm", 8, None, eps_outside=False, bias=False, affine=False).check()  # nanochat's
    with pytest.raises(ConfigError, match="ModelConfig.rmsnorm_eps = 'outside' is not allowed"):
        ModelConfig(norm="layernorm", rmsnorm_eps="outside")
    assert ModelConfig(norm="rmsnorm", rmsnorm_eps="outside").norm_shape.eps_outside


def test_positions_and_the_mlp_check_their_own_configs():
    """Positions and the MLP own a frozen config each (`PositionShape`, `MLPShape`) with its rules,
    checked alone, without a ModelConfig; ModelConfig builds them resolved from its flat fields and
    raises their errors on construction."""
    from blocklab.model.mlp import MLPShape
    from blocklab.model.positions import PositionShape

    with pytest.raises(ConfigError, match="ModelConfig.head_dim = 7 is not allowed: rotary positions need"):
        PositionShape("rope", 64, 7, 10000.0).check()
    PositionShape("learned", 64, 7, 10000.0).check()  # an odd head size is fine without rotations
    with pytest.raises(ConfigError, match="ModelConfig.d_model = 63 is not allowed: sinusoidal positions"):
        PositionShape("sinusoidal", 63, 8, 10000.0).check()
    with pytest.raises(ConfigError, match="ModelConfig.rope_base = -1.0 is not allowed"):
        PositionShape("rope", 64, 8, -1.0).check()
    with pytest.raises(ConfigError, match="ModelConfig.leaky_relu_slope = -0.5 is not allowed"):
        MLPShape(16, 64, "leaky_relu", False, -0.5).check()
    MLPShape(16, 64, "leaky_relu", False, 0.1).check()

    cfg = ModelConfig(d_model=48, n_heads=4, positions="rope", mlp_hidden=96, mlp_act="relu2",
                      rope_base=500.0)
    assert cfg.position_shape == PositionShape("rope", 48, 12, 500.0)
    assert cfg.mlp_shape == MLPShape(48, 96, "relu2", False, 0.0)
    with pytest.raises(ConfigError, match="ModelConfig.head_dim = 11 is not allowed: rotary"):
        ModelConfig(d_model=44, n_heads=4, positions="rope")


def test_each_component_rule_is_called_by_the_config():
    """`ModelConfig.__post_init__` calls every component's rules (model/config.py lists them): one
    config breaking each component's rule, refused with that component's message."""
    broken = {"attention": (dict(n_heads=5), "ModelConfig.d_model = 768 is not allowed: it must be"),
              "windows": (dict(window_pattern="SX"), "ModelConfig.window_pattern = 'SX'"),
              "positions": (dict(positions="sinusoidal", d_model=63, n_heads=7), "sinusoidal positions need"),
              "norm": (dict(norm="layernorm", norm_eps=None), r"ModelConfig.norm_eps = None"),
              "mlp": (dict(mlp_act="leaky_relu", leaky_relu_slope=-1.0), "negative-side slope"),
              "trunk": (dict(backout=True, n_layers=1), "ModelConfig.backout = True"),
              "linear maps": (dict(value_form="identity", n_kv_heads=4), "grouped-query value is narrower"),
              "block layout": (dict(block_layout="parallel"), "ModelConfig.attn_skip_gain = 1.0"),
              "value path": (dict(value_path="nope"), "value_path")}
    for component, (fields, message) in broken.items():
        with pytest.raises(ConfigError, match=message):
            ModelConfig(**fields)
            pytest.fail(f"the {component}'s rule was not called")
