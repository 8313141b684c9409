"""`TrainConfig`: everything a training run needs, read from YAML plus ``key=value`` overrides.

The model is named by an architecture and a size preset plus `model` field overrides, so a run's
config stays short and the resolved `ModelConfig` is written beside it in the run directory.
Nested sections (`data`, `optim`, `model`) take dotted overrides: ``optim.lr=3e-4``,
``model.n_layers=4``, ``data.tokenizer=byte``.

Continued pretraining starts from existing weights instead: ``init_from`` (a run directory or a
`blocklab.interop.save_pretrained` export) and, optionally, ``retrofit`` (a value path applied
with `blocklab.interop.retrofit`, e.g. ``resformer-learnable``). The source then fixes the model
and its tokenizer: ``model`` overrides are refused, and ``arch`` and ``size`` become the source's
(`init_from.with_source_preset`; ``size`` is UNNAMED_SIZE when no size preset matches); an arch or
size given that differs from the source's is refused, the defaults' names too: left out (None), they
are DEFAULT_ARCH and DEFAULT_SIZE without init_from and the source's with it.
"""

from __future__ import annotations

import os
from dataclasses import field
from pathlib import Path
from typing import Any

import yaml

from blocklab.data import DataConfig
from blocklab.model.config import ModelConfig
from blocklab.training.optim import OptimConfig
from blocklab.util import yamltext
from blocklab.util.configbase import ConfigBase, config_dataclass, is_count
from blocklab.util.errors import ConfigError
from blocklab.util.pathtext import require_text

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
# The budget kinds (compare's --steps, --tokens, --flops, --time) and the field each one sets: the one
# list of budgets that the trainer, compare and the reports read.
BUDGETS = {"steps": "max_steps", "tokens": "max_tokens", "flops": "max_flops", "time": "max_time"}
BUDGET_FIELDS = tuple(BUDGETS.values())
DEVICES = ("auto", "cpu", "cuda", "mps")
PRECISIONS = ("auto", "float32", "bfloat16")
PARALLELISMS = ("auto", "ddp", "fsdp")
# Fields that change how a run is watched or stored, not what it computes, so a saved run is reused
# across them (compare, reproduce). Training is a pure function of the config minus these: progress
# bars and the trackers (logger, tensorboard, wandb_project, wandb_group) only display; log_every only
# decides which train rows are written (the loss and weights at every step are the same); ckpt_every and
# keep_checkpoints only decide which states are saved (a resumed run equals an uninterrupted one);
# data.cache_dir is where the same shards are cached; out_dir is where the run lives (a directory of runs
# may be moved) and overwrite whether a new run may replace one there; threads is how many CPU threads
# compute the same steps (as on another machine, a float sum may round differently in its last bits).
# Everything else counts, eval_every and eval_batches included: they decide which validation losses are
# recorded.
NOT_RESULTS = frozenset({"progress", "tensorboard", "logger", "wandb_project", "wandb_group", "log_every",
                         "ckpt_every", "keep_checkpoints", "data.cache_dir", "out_dir", "overwrite",
                         "threads"})
# What a resumed run may change: those, the budget (extending a run) and eval_every (the validations
# still to come). The rest fixes the steps already taken (data, model, optimiser, batch, schedule so
# far, precision).
RESUMABLE = NOT_RESULTS | {*BUDGET_FIELDS, "eval_every"}


@config_dataclass
class TrainConfig(ConfigBase):
    # -- model -----------------------------------------------------------------------------------
    # block preset, optionally "+value-path" (see `blocklab presets`), and size preset; None (left out):
    # DEFAULT_ARCH and DEFAULT_SIZE, or with init_from the source's (see the module docstring)
    arch: str | None = None
    size: str | None = None
    model: dict[str, Any] = field(default_factory=dict)  # ModelConfig field overrides
    init_from: str | None = None  # continue from a run directory or a save_pretrained export
    retrofit: str | None = None  # value path given to interop.retrofit after loading init_from
    # -- data and optimisation ---------------------------------------------------------------------
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    batch_size: int = 16  # global batch in sequences, split over processes and accumulation steps
    seq_len: int = 128
    grad_accum: int = 1
    # -- budget: training stops at whichever limit comes first; the lr schedule follows it -------
    max_steps: int | None = None
    max_tokens: int | None = None
    max_flops: float | None = None  # analytic training FLOPs (FLOPs per token x tokens)
    max_time: float | None = None  # wall-clock seconds of training (evaluation excluded)
    # -- evaluation, logging, checkpoints ----------------------------------------------------------
    eval_every: int = 100  # steps, and once at step 0; 0 turns periodic validation off (the final one runs)
    eval_batches: int | None = 16  # None: the whole validation split
    log_every: int = 10
    ckpt_every: int = 200  # steps; 0 keeps only the final checkpoint
    keep_checkpoints: int = 2
    tensorboard: bool = False
    # experiment trackers beside metrics.jsonl (training.trackers): "none", "tensorboard", "wandb" or a
    # list of them; the wandb run's project and group (compare sets it to the comparison's folder)
    logger: str | list[str] = "none"
    wandb_project: str = "blocklab"
    wandb_group: str | None = None
    progress: bool = True
    # -- execution -------------------------------------------------------------------------------
    seed: int = 0
    device: str = "auto"
    precision: str = "auto"  # auto: bf16 autocast on CUDA with bf16, float32 elsewhere (CPU bf16 is slow)
    # torch.compile: true or "model", the forward pass as one graph (per block if inductor fails on the
    # architecture); "blocks", each block as its own graph; false, eager
    compile: bool | str = False
    parallel: str = "auto"  # under torchrun: ddp, or fsdp (FSDP2 fully_shard per block)
    threads: int | None = None  # torch.set_num_threads for the run (per process); None: torch's default
    out_dir: str = "runs/run"
    overwrite: bool = False  # a new run into an out_dir holding a run first removes that run's files

    def __post_init__(self) -> None:
        if isinstance(self.init_from, os.PathLike):
            self.init_from = os.fspath(self.init_from)
        # first: a path that is not valid text (data.source, out_dir, init_from ...) would fail in YAML
        require_text(flat(self.to_dict()).items())
        if self.init_from is None:  # with init_from, left to the Trainer: the source's
            self.arch = DEFAULT_ARCH if self.arch is None else self.arch
            self.size = DEFAULT_SIZE if self.size is None else self.size
        for name, cls in (("data", DataConfig), ("optim", OptimConfig)):
            value = getattr(self, name)
            if isinstance(value, dict):
                setattr(self, name, cls.from_dict(value))
            elif not isinstance(value, cls):  # optim=5, data=[1]: not a section
                self.fail(name, value, f"it is a section of {cls.__name__} fields: give them dotted "
                                       f"({name}.<field>=...) or as a mapping ({name}={{<field>: ...}}).")
        _validate(self)

    # -- derived -----------------------------------------------------------------------------------
    def model_config(self, vocab_size: int) -> ModelConfig:
        """The resolved ModelConfig: presets, then the vocabulary and context, then `model` overrides.
        A `model.vocab_size` below the tokenizer's `vocab_size` is refused: ids past it have no row."""
        fields = dict(vocab_size=vocab_size, context_length=self.seq_len,
                      causal=self.data.objective == "clm")
        fields.update(self.model)
        if fields["vocab_size"] < vocab_size:
            raise ConfigError(f"TrainConfig.model.vocab_size = {fields['vocab_size']} is not allowed: the "
                              f"tokenizer has {vocab_size} ids; drop model.vocab_size (it follows the "
                              f"tokenizer) or give at least {vocab_size}.")
        assert self.arch is not None and self.size is not None, "set by __post_init__ or with_source_preset"
        return ModelConfig.from_preset(self.arch, self.size, **fields)

    def budgets(self) -> dict[str, int | float]:
        """The budget fields that are set, e.g. {"max_steps": 400}."""
        return {name: getattr(self, name) for name in BUDGET_FIELDS if getattr(self, name) is not None}

    # -- serialisation (from_dict, to_dict and replace come from ConfigBase) --------------------------
    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: list[str] | dict | None = None) -> TrainConfig:
        """Read a YAML file (or start from defaults), then apply ``key=value`` overrides."""
        return cls.from_dict(apply_overrides(read_yaml(path) if path is not None else {}, overrides))


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The fields of a YAML training config or of a shipped recipe (e.g. "crammed-bert")."""
    path = Path(path)
    if not path.is_file() and (RECIPES / f"{path}.yaml").is_file():
        path = RECIPES / f"{path}.yaml"
    if not path.is_file():
        raise ConfigError(f"training config {str(path)!r} does not exist: give a YAML file or a "
                          f"recipe ({', '.join(list_recipes())}).")
    try:
        data = yamltext.load(path.read_text(encoding="utf-8")) or {}
    except yamltext.DuplicateKey as err:
        raise ConfigError(f"training config {str(path)!r} gives {err.key!r} twice, at line {err.first} and "
                          f"line {err.second} (in the same section): YAML would keep the last silently. "
                          "Keep one of them.") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"training config {str(path)!r} is not UTF-8 text (byte {err.start}: "
                          f"{err.object[err.start:err.start + 1]!r}); save it as UTF-8.") from None
    except RecursionError:  # PyYAML recurses once per level: thousands of nested [ or {
        raise ConfigError(f"training config {str(path)!r} is nested too deeply for YAML to read: a config "
                          "holds fields, sections and short lists, a few levels deep.") from None
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        raise ConfigError(f"training config {str(path)!r} is not valid YAML{at}: "
                          f"{getattr(err, 'problem', None) or err}.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"training config {str(path)!r} must hold a YAML mapping of fields.")
    return data


def resolve_config(config: TrainConfig | dict | str | Path | None = None,
                   overrides: list[str] | dict | None = None, resume: bool = False) -> TrainConfig:
    """The config of a run: `config` (a TrainConfig, a dict, a YAML path or None for the defaults),
    then `overrides`. With `resume`, the run's own ``out_dir/config.yaml`` comes first, so
    ``blocklab train --resume --out DIR`` needs nothing else; the Trainer then refuses changes
    outside RESUMABLE."""
    data: dict[str, Any] = {}
    if isinstance(config, TrainConfig):
        config = config.to_dict()
    if isinstance(config, dict):
        for key, value in config.items():
            _set_dotted(data, key, value)
    elif config is not None:
        data = read_yaml(config)
    pairs = list(_pairs(overrides))
    if resume:
        out_dir = dict(pairs).get("out_dir", data.get("out_dir", TrainConfig.out_dir))
        saved = Path(out_dir) / "config.yaml"
        if saved.is_file():
            data = {**read_yaml(saved), **data}  # given fields replace saved ones whole
        elif not any(data.get(f) is not None or f in dict(pairs) for f in BUDGET_FIELDS):
            raise ConfigError(f"--resume: {str(out_dir)!r} holds no run to continue (no config.yaml); give "
                              "the out_dir of an earlier run, or start a new run without --resume.")
    for key, value in pairs:
        _set_dotted(data, key, value)
    return TrainConfig.from_dict(data)


def apply_overrides(data: dict[str, Any], overrides: list[str] | dict | None) -> dict[str, Any]:
    """`data` (TrainConfig fields, changed in place and returned) with `overrides` set on it: ``key=value``
    strings (values read as YAML) or a dict, dotted for the nested sections (``optim.lr``)."""
    for key, value in _pairs(overrides):
        _set_dotted(data, key, value)
    return data


def changed_text(old: dict[str, Any], new: dict[str, Any], ignore: frozenset[str] = frozenset(),
                 most: int | None = None) -> str:
    """The keys whose values differ between two flat mappings, outside `ignore`, as "key: old -> new, ..."
    (sorted; the first `most`, then " ..."; "" when none differ)."""
    keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k) and k not in ignore)
    shown = keys if most is None else keys[:most]
    return ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in shown) + (
        " ..." if len(shown) < len(keys) else "")


def changed_fields(old: TrainConfig, new: TrainConfig, ignore: frozenset[str] = frozenset()) -> str:
    """The dotted fields that differ between two configs, outside `ignore`, as "key: old -> new, ..."
    ("" when none do)."""
    return changed_text(flat(old.to_dict()), flat(new.to_dict()), ignore)


def check_saved_config(run_dir: str | Path, cfg: TrainConfig, ignore: frozenset[str], what: str,
                       remedy: str) -> None:
    """The one check of a saved run against the config it is to go on with (resume, compare's reuse):
    refuse when the run's ``config.yaml`` cannot be read or differs from `cfg` in a field outside
    `ignore` (dotted names: RESUMABLE, NOT_RESULTS). The ConfigError reads
    "<what> with a different config (<field>: old -> new, ...); <remedy>"."""
    path = Path(run_dir) / "config.yaml"
    try:  # through TrainConfig, so that a field added since the run was saved takes its default
        if not path.is_file():
            raise ConfigError("it is missing")
        saved = TrainConfig.from_dict(read_yaml(path))
    except (ConfigError, OSError, TypeError, ValueError) as err:
        raise ConfigError(f"{what}: its config.yaml cannot be read ({err}); {remedy}") from None
    changes = changed_fields(saved, cfg, ignore)
    if changes:
        raise ConfigError(f"{what} with a different config ({changes}); {remedy}")


def check_trained_config(checkpoint: str | Path, trained: dict[str, Any], cfg: TrainConfig) -> None:
    """Refuse a resume whose config (config.yaml as it is now, then the overrides) differs outside
    RESUMABLE from `trained`, the config the checkpoint's steps were taken with (its state.json): a
    config.yaml edited by hand changes a run as surely as an override would."""
    what = f"cannot resume from {str(checkpoint)!r}"
    try:
        saved = TrainConfig.from_dict(trained)
    except (ConfigError, TypeError, ValueError) as err:
        raise ConfigError(f"{what}: the config it was trained with cannot be read ({err}).") from None
    changes = changed_fields(saved, cfg, RESUMABLE)
    if changes:
        raise ConfigError(f"{what}: config.yaml (with the overrides given) differs from the config the "
                          f"checkpoint was trained with ({changes}); {resume_rule()}. Restore those fields "
                          "in config.yaml (the checkpoint's state.json holds them under train_config), or "
                          "train a new out_dir.")


def resume_rule() -> str:
    """What a resume may change, written from RESUMABLE itself so that the two never disagree."""
    return (f"a resume may change only {', '.join(sorted(RESUMABLE))}; anything else would change the "
            "steps already taken, so the run would no longer be one curve")


def check_resumable(cfg: TrainConfig, run_dir: str | Path) -> None:
    """Refuse a resume whose config differs from the one saved in `run_dir` outside RESUMABLE."""
    check_saved_config(run_dir, cfg, RESUMABLE, f"cannot resume {str(run_dir)!r}",
                       f"{resume_rule()}. Train a new out_dir instead.")


def flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested sections of plain data (a `to_dict`) as dotted keys (``optim.lr``)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):  # an empty section adds no key
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def list_recipes() -> list[str]:
    """Names of the shipped training recipes (YAML files in blocklab/recipes)."""
    return sorted(p.stem for p in RECIPES.glob("*.yaml"))


def _pairs(overrides: list[str] | dict | None):
    return overrides.items() if isinstance(overrides, dict) else map(_split_override, overrides or [])


def _split_override(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {text!r} is not allowed: write key=value, e.g. optim.lr=3e-4.")
    require_text([("the key of an override", key), (key.strip(), raw)])
    try:
        value = yamltext.load(raw) if raw.strip() else None
    except RecursionError:  # PyYAML recurses once per level: thousands of nested [ or {
        raise ConfigError(f"override {key.strip()} is not allowed: its value is nested too deeply for YAML "
                          "to read; give a value a few levels deep, e.g. [1, 2] or {a: 1}.") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"override {key.strip()} = {raw!r} is not allowed: its value is not valid YAML "
                          f"({getattr(err, 'problem', None) or err}); quote a string, e.g. "
                          f"{key.strip()}='...', or write a list [1, 2] or a mapping {{a: 1}}.") from None
    if isinstance(value, str):  # YAML 1.1 reads 3e-4 as a string
        try:
            value = float(value)
        except ValueError:
            pass
    return key.strip(), value


def _set_dotted(data: dict, key: str, value: Any) -> None:
    head, _, rest = key.partition(".")
    if not rest:
        data[head] = value
        return
    if head not in ("data", "optim", "model"):
        raise ConfigError(f"override {key!r} is not allowed: only data.*, optim.* and model.* are nested.")
    section = data.setdefault(head, {})
    if not isinstance(section, dict):  # a DataConfig/OptimConfig object given in Python
        section = data[head] = section.to_dict()
    name, _, key = rest.partition(".")
    if not key:
        section[name] = value
        return
    # a key inside a dict-valued field: model.value_path_options.layers=[9,10,11]
    inner = section.setdefault(name, {})
    if not isinstance(inner, dict):
        raise ConfigError(f"override {head}.{rest} is not allowed: {head}.{name} is not a dict. Dotted keys "
                          f"reach one level into dict fields (model.value_path_options.layers=[1,2], "
                          f"data.hf_kwargs.split=train); or give the whole dict: {head}.{name}={{...}}.")
    _set_nested(inner, key, value)


def _set_nested(target: dict, key: str, value: Any) -> None:
    name, _, rest = key.partition(".")
    if rest:
        inner = target.setdefault(name, {})
        if not isinstance(inner, dict):
            raise ConfigError(f"override key {key!r}: {name!r} is not a dict.")
        _set_nested(inner, rest, value)
    else:
        target[name] = value


COMPILE_CHOICES = (False, True, "model", "blocks")
UNNAMED_SIZE = "custom"  # the size an init_from run records when its source matches no size preset
DEFAULT_ARCH, DEFAULT_SIZE = "pre-ln", "tiny"  # TrainConfig's arch and size when none is given
MAX_SEED = 2**63 - 1


def _validate(cfg: TrainConfig) -> None:
    for name in ("batch_size", "seq_len", "grad_accum", "keep_checkpoints", "log_every"):
        value = getattr(cfg, name)
        if not is_count(value, 1):
            cfg.fail(name, value, "it must be a positive integer.")
    for name in ("eval_every", "ckpt_every"):
        value = getattr(cfg, name)
        if not is_count(value, 0):
            cfg.fail(name, value, "it must be an integer >= 0 (0 turns it off).")
    if not is_count(cfg.seed, 0) or cfg.seed > MAX_SEED:  # what torch.manual_seed takes, and numpy
        cfg.fail("seed", cfg.seed, f"it must be an integer from 0 to {MAX_SEED} (2**63 - 1).")
    if cfg.threads is not None and not is_count(cfg.threads, 1):
        cfg.fail("threads", cfg.threads, "it must be a positive integer, or None for torch's default "
                                         "(one per core, or OMP_NUM_THREADS when it is set).")
    if cfg.eval_batches is not None and (not isinstance(cfg.eval_batches, int) or cfg.eval_batches < 1):
        cfg.fail("eval_batches", cfg.eval_batches, "it must be a positive integer or None (the whole split).")
    if cfg.batch_size % cfg.grad_accum:
        cfg.fail("batch_size", cfg.batch_size, f"it must be divisible by grad_accum={cfg.grad_accum}.")
    for name, choices in (("device", DEVICES), ("precision", PRECISIONS), ("parallel", PARALLELISMS)):
        if getattr(cfg, name) not in choices:
            cfg.fail(name, getattr(cfg, name), f"choose one of {', '.join(map(repr, choices))}.")
    if not isinstance(cfg.model, dict):
        cfg.fail("model", cfg.model, "it must be a mapping of ModelConfig field overrides.")
    if not isinstance(cfg.overwrite, bool):
        cfg.fail("overwrite", cfg.overwrite, "it must be true or false.")
    if cfg.compile not in COMPILE_CHOICES:
        cfg.fail("compile", cfg.compile, "choose true (or 'model': the whole forward pass as one graph), "
                                         "'blocks' (one graph per block) or false.")
    _validate_trackers(cfg)
    if cfg.init_from is not None:  # the source fixes the model: arch and size are checked against it
        _check_preset_names(cfg)
    else:
        model = cfg.model_config(vocab_size=1)  # a bad arch, size or model field fails now, not after data
        if "context_length" in cfg.model and model.context_length < cfg.seq_len:
            cfg.fail("seq_len", cfg.seq_len, f"it exceeds model.context_length={model.context_length}: "
                                             "lower seq_len or raise model.context_length (it follows "
                                             "seq_len by default).")
    # the budget last: a misspelt arch or size is the first thing to fix
    budgets = cfg.budgets()
    if not budgets:
        raise ConfigError("TrainConfig has no budget: set at least one of "
                          f"{', '.join(BUDGET_FIELDS)} (e.g. max_steps=200 or max_time=300).")
    for name, value in budgets.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            cfg.fail(name, value, "a budget must be a positive number or None.")
        if name in ("max_steps", "max_tokens") and not isinstance(value, int):
            if not float(value).is_integer():
                cfg.fail(name, value, "steps and tokens are counted whole: give a positive integer.")
            setattr(cfg, name, int(value))  # 5e6 from YAML or a key=value override
    _validate_init(cfg)


def _validate_trackers(cfg: TrainConfig) -> None:
    """logger and the wandb fields; whether a tracker's package is installed is checked when a run starts
    (`trackers.require_installed`), so that a saved run's config reads on a machine without it."""
    from blocklab.training.tracking import logger_names

    names = logger_names(cfg.logger)
    if isinstance(names, str):
        cfg.fail("logger", cfg.logger, names)
    if not isinstance(cfg.wandb_project, str) or not cfg.wandb_project.strip():
        cfg.fail("wandb_project", cfg.wandb_project, "give the wandb project's name (default 'blocklab').")
    if cfg.wandb_group is not None and (not isinstance(cfg.wandb_group, str) or not cfg.wandb_group):
        cfg.fail("wandb_group", cfg.wandb_group, "give a group name, or None for no group.")


def _check_preset_names(cfg: TrainConfig) -> None:
    """With init_from: arch and size must be names (the Trainer then checks them against the source,
    `init_from.with_source_preset`); size may be UNNAMED_SIZE, what a source of no size preset records."""
    from blocklab.model.presets import SIZE_PRESETS, resolve

    if cfg.arch is not None:  # an unknown architecture: the presets' own message
        resolve(cfg.arch, next(iter(SIZE_PRESETS)))
    if cfg.size is not None and cfg.size != UNNAMED_SIZE and cfg.size not in SIZE_PRESETS:
        resolve(cfg.arch or DEFAULT_ARCH, cfg.size)


def _validate_init(cfg: TrainConfig) -> None:
    """init_from / retrofit; whether init_from exists is checked when the Trainer loads it."""
    if cfg.init_from is not None and (not isinstance(cfg.init_from, str) or not cfg.init_from):
        cfg.fail("init_from", cfg.init_from, "give a run directory or a save_pretrained export folder.")
    if cfg.init_from is not None and cfg.model:
        cfg.fail("model", cfg.model, "with init_from the model (and its config) comes from the source; "
                                     "drop the model.* overrides.")
    if cfg.retrofit is None:
        return
    if cfg.init_from is None:
        cfg.fail("retrofit", cfg.retrofit, "it retrofits a pretrained baseline: set init_from too (a run "
                                           "directory or a save_pretrained export).")
    from blocklab.model.value_paths import VALUE_PATHS

    allowed = [v for v in VALUE_PATHS if v != "standard"]
    if not isinstance(cfg.retrofit, str) or cfg.retrofit.rpartition("+")[2] not in allowed:
        cfg.fail("retrofit", cfg.retrofit, f"name a value path ({', '.join(allowed)}), optionally after the "
                                           "baseline's block preset (pre-ln+resformer).")
