"""Ladder files: a ladder written as YAML (`blocklab scaling --ladder FILE.yaml`), read and checked into a
`Ladder`. The shipped ladders (cpu, gpu-resformer, toy) are files of this format in
blocklab/recipes/ladders; docs/scaling.md shows one to copy.

A file is a mapping of these keys (the required ones: rungs, steps or tokens_per_parameter, batch_size,
seq_len):

- rungs: a list, each a size preset's name (``small``) or a mapping of ModelConfig fields over the
  ladder's `size` (d_model, n_layers, n_heads, mlp_hidden, and any other under ``model:``), with an
  optional ``name`` (default ``d<d_model>-l<n_layers>``, or the preset's name), ``size`` (that rung's
  preset) and ``lr`` (that rung's peak rate, with ``lr: per-rung``);
- steps (the same at every rung) or tokens_per_parameter (steps per rung from the parameters of the
  ladder's first architecture at that rung: round(rule x parameters / (batch_size x seq_len)));
- lr: ``recipe`` (each architecture's recipe rate, the same at every rung: the default), a number (every
  architecture and rung), ``per-rung`` (each rung's ``lr``), or a short sweep per rung,
  ``{sweep: [0.333, 1, 3], steps: 100, seed: 0, seeds: 1}``: factors of each architecture's recipe rate,
  two or more, distinct and positive, each tried for ``steps`` steps (at most the ladder's) at ``seeds``
  seeds from ``seed`` (default 1 from 0; with more, the mean loss chooses) at every rung (`LrSweep`,
  `scaling.sweeps`);
- shorter_runs: fractions of the largest rung's steps, e.g. ``[0.25, 0.5, 0.75]``: each architecture also
  trains that rung for each fraction of its steps, and the data equivalence reads the final losses of
  these runs instead of the full run's mid-run evaluations (`scaling.shorter_runs`);
- batch_size, seq_len, eval_every (default 50), seeds (3), archs, size (tiny), train (other TrainConfig
  fields for every run), trains_on (cpu or gpu), description, lr_rule and notes (the report's words).

Every mistake is one ConfigError line naming the file, the key and what is allowed.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from blocklab.scaling.rungs import DEFAULT_ARCHS, Ladder, LrSweep, Rung, check_archs
from blocklab.scaling.shorter_runs import check_fractions, shorter_steps
from blocklab.util.configbase import is_count
from blocklab.util.errors import ConfigError

KEYS = ("description", "size", "rungs", "steps", "tokens_per_parameter", "batch_size", "seq_len",
        "eval_every", "lr", "lr_rule", "seeds", "archs", "train", "trains_on", "notes", "shorter_runs")
RUNG_KEYS = ("name", "size", "lr", "d_model", "n_layers", "n_heads", "mlp_hidden", "model")
SHAPE_KEYS = ("d_model", "n_layers", "n_heads", "mlp_hidden")
LR_RULES = ("recipe", "per-rung")
SWEEP_KEYS = ("sweep", "steps", "seed", "seeds")
SWEEP_EXAMPLE = "e.g. lr: {sweep: [0.333, 1, 3], steps: 100}"


def read_ladder_file(path: str | Path) -> Ladder:
    """The ladder a YAML file describes, checked (`ladder_from_dict`)."""
    path = Path(path)
    where = f"ladder file {str(path)!r}"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{where} does not exist: give a YAML ladder file, or a shipped ladder "
                          "(`blocklab scaling --list`)") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{where} cannot be read ({err}): save it as UTF-8 text") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeys)  # noqa: S506 - a SafeLoader that refuses duplicate keys
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{where} is not valid YAML{at}: {getattr(err, 'problem', None) or err}") from None
    return ladder_from_dict(data, where)


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (the second would win silently)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice (lines {seen[key]} and {line}); keep one",
                    key_node.start_mark)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def ladder_from_dict(data: Any, where: str = "ladder") -> Ladder:
    """A `Ladder` from the plain data of a ladder file (see the module docstring), every key checked."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must hold a mapping of {', '.join(KEYS)}")
    _known(data, KEYS, where)
    for key in ("rungs", "batch_size", "seq_len"):
        if key not in data:
            raise ConfigError(f"{where} has no {key}: a ladder needs rungs, batch_size, seq_len and steps "
                              "or tokens_per_parameter")
    size = _text(data, "size", where, "tiny")
    _check_size(size, f"{where}: size")
    steps, per_parameter = _budget(data, where)
    lr, lr_text = _lr(data.get("lr", "recipe"), where, steps)
    rungs = _rungs(data["rungs"], where, per_rung_lr=lr == "per-rung")
    archs = _archs(data.get("archs"), where)
    train = data.get("train") or {}
    if not isinstance(train, dict):
        raise ConfigError(f"{where}: train = {train!r} is not allowed: give a mapping of TrainConfig fields, "
                          "e.g. {data: {vocab_size: 8192}}")
    trains_on = _text(data, "trains_on", where, "cpu")
    if trains_on not in ("cpu", "gpu"):
        raise ConfigError(f"{where}: trains_on = {trains_on!r} is not allowed: choose cpu or gpu")
    batch, seq = _count(data, "batch_size", where), _count(data, "seq_len", where)
    shorter = check_fractions(data["shorter_runs"], where) if "shorter_runs" in data else ()
    if shorter and steps is not None:  # with tokens_per_parameter, checked when the ladder is planned
        try:
            shorter_steps(shorter, steps, rungs[-1].name)
        except ConfigError as err:
            raise ConfigError(f"{where}: {err}") from None
    return Ladder(
        _text(data, "description", where, _describe(rungs, steps, per_parameter, batch, seq)),
        size, rungs, steps, batch, seq,
        _text(data, "lr_rule", where, lr_text),
        seeds=_count(data, "seeds", where, 3),
        eval_every=_count(data, "eval_every", where, 50, low=0),
        lr=lr if isinstance(lr, float) else None,
        train=train,
        archs=archs,
        trains_on=trains_on,
        notes=_text(data, "notes", where, ""),
        tokens_per_parameter=per_parameter,
        lr_sweep=lr if isinstance(lr, LrSweep) else None,
        shorter_runs=shorter,
    )


def _known(data: dict, allowed: tuple[str, ...], where: str) -> None:
    unknown = [k for k in data if k not in allowed]
    if unknown:
        raise ConfigError(f"{where}: key {unknown[0]!r} is not allowed: the keys are {', '.join(allowed)}")


def _text(data: dict, key: str, where: str, default: str) -> str:
    value = data.get(key, default)
    if not isinstance(value, str) or (key in ("size", "trains_on") and not value):
        raise ConfigError(f"{where}: {key} = {value!r} is not allowed: give text")
    return value


def _count(data: dict, key: str, where: str, default: int | None = None, low: int = 1) -> int:
    value = data.get(key, default)
    if not is_count(value, low):
        raise ConfigError(f"{where}: {key} = {value!r} is not allowed: give an integer >= {low}")
    return int(value)


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


def _check_size(size: str, where: str) -> None:
    from blocklab.model.presets import SIZE_PRESETS

    if size not in SIZE_PRESETS:
        raise ConfigError(f"{where} = {size!r} is not a size preset: choose one of {', '.join(SIZE_PRESETS)}")


def _lr(value: Any, where: str, steps: int | None) -> tuple[float | str | LrSweep, str]:
    """The learning-rate rule (a rate, "recipe", "per-rung" or a sweep per rung) and its words for the
    report."""
    if isinstance(value, dict):
        sweep = _sweep(value, f"{where}: lr", steps)
        return sweep, sweep.describe()
    if value in LR_RULES:
        return value, ("each architecture's recipe rate at the ladder's size, the same at every rung"
                       if value == "recipe" else "each rung's own rate, the same for every architecture")
    if _positive(value):
        return float(value), f"{value:g} for every architecture and rung"
    raise ConfigError(f"{where}: lr = {value!r} is not allowed: give recipe, a positive rate (e.g. 6e-4), "
                      f"per-rung (each rung's lr) or a sweep per rung ({SWEEP_EXAMPLE})")


def _sweep(value: dict, where: str, ladder_steps: int | None) -> LrSweep:
    """`lr: {sweep: [factors], steps: N, seed: S, seeds: K}`, every key checked: two or more distinct
    positive factors, a positive count of steps no larger than the ladder's, a seed >= 0, seeds >= 1."""
    _known(value, SWEEP_KEYS, where)
    for key in ("sweep", "steps"):
        if key not in value:
            raise ConfigError(f"{where} has no {key}: a sweep gives its factors of each architecture's "
                              f"recipe rate and the steps of its runs, {SWEEP_EXAMPLE}")
    factors = value["sweep"]
    if not isinstance(factors, list) or len(factors) < 2:
        raise ConfigError(f"{where}: sweep = {factors!r} is not allowed: give a list of two or more factors "
                          f"of each architecture's recipe rate, {SWEEP_EXAMPLE}")
    for factor in factors:
        if not _positive(factor):
            raise ConfigError(f"{where}: sweep factor {factor!r} is not allowed: every factor is a positive "
                              "number (it multiplies the recipe rate)")
    names = [f"{float(f):g}" for f in factors]  # a factor's run folder: <arch>-x<factor>
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise ConfigError(f"{where}: sweep factor {twice} is given twice: give distinct factors")
    steps = _count(value, "steps", where)
    if ladder_steps is not None and steps > ladder_steps:
        raise ConfigError(f"{where}: steps = {steps} is not allowed: a sweep run is a short run, no longer "
                          f"than the ladder's {ladder_steps} steps; give at most {ladder_steps}")
    return LrSweep(tuple(float(f) for f in factors), steps, _count(value, "seed", where, 0, low=0),
                   _count(value, "seeds", where, 1))


def _budget(data: dict, where: str) -> tuple[int | None, float | None]:
    """steps, or tokens_per_parameter: exactly one."""
    if ("steps" in data) == ("tokens_per_parameter" in data):
        raise ConfigError(f"{where}: give exactly one of steps (the same at every rung) and "
                          "tokens_per_parameter (e.g. 20: steps per rung from its parameters)")
    if "steps" in data:
        return _count(data, "steps", where), None
    rule = data["tokens_per_parameter"]
    if not _positive(rule):
        raise ConfigError(f"{where}: tokens_per_parameter = {rule!r} is not allowed: give a positive number, "
                          "e.g. 20")
    return None, float(rule)


def _archs(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return DEFAULT_ARCHS
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value) or len(value) < 2:
        raise ConfigError(f"{where}: archs = {value!r} is not allowed: give a list of two or more "
                          "architectures, the baseline first, e.g. [pre-ln, resformer]")
    try:
        check_archs(value)
    except ConfigError as err:
        raise ConfigError(f"{where}: archs: {err}") from None
    return tuple(value)


def _rungs(value: Any, where: str, per_rung_lr: bool) -> tuple[Rung, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: rungs = {value!r} is not allowed: give a list of one or more rungs, "
                          "each a size preset or a mapping such as {d_model: 64, n_layers: 2, n_heads: 2}")
    rungs = tuple(_rung(item, f"{where}: rung {k + 1}", per_rung_lr) for k, item in enumerate(value))
    names = [r.name for r in rungs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{where}: rung name {twice[0]!r} is given twice: each rung is a folder of its "
                          "own; give each a distinct name")
    return rungs


def _rung(item: Any, where: str, per_rung_lr: bool) -> Rung:
    if isinstance(item, str):
        item = {"size": item}
    if not isinstance(item, dict):
        raise ConfigError(f"{where} = {item!r} is not allowed: give a size preset's name or a mapping of "
                          f"{', '.join(RUNG_KEYS)}")
    _known(item, RUNG_KEYS, where)
    model = item.get("model") or {}
    if not isinstance(model, dict):
        raise ConfigError(f"{where}: model = {model!r} is not allowed: give a mapping of ModelConfig fields")
    shape = {k: item[k] for k in item if k in SHAPE_KEYS}  # in the file's order (the report's)
    for key, value in shape.items():
        if not is_count(value, 1):
            raise ConfigError(f"{where}: {key} = {value!r} is not allowed: give a positive integer")
    size = item.get("size")
    if size is not None:
        _check_size(size if isinstance(size, str) else repr(size), f"{where}: size")
    if not shape and not model and size is None:
        raise ConfigError(f"{where} sets nothing: give a size preset or its shape (d_model, n_layers, "
                          "n_heads, mlp_hidden)")
    lr = item.get("lr")
    if per_rung_lr != (lr is not None):
        raise ConfigError(f"{where}: " + ("each rung needs its lr with `lr: per-rung`" if per_rung_lr else
                                          "a rung's lr is read only with `lr: per-rung` at the top"))
    if lr is not None and not _positive(lr):
        raise ConfigError(f"{where}: lr = {lr!r} is not allowed: give a positive rate, e.g. 1e-3")
    name = item.get("name", _default_name(shape, size))
    if not isinstance(name, (str, int)) or not _folder_name(str(name)):
        raise ConfigError(f"{where}: name = {name!r} is not allowed: a rung's name is its folder: letters, "
                          "digits, '-', '_', '.', not '.' or '..'" + ("" if name else
                                                                      " (give one: no d_model and n_layers)"))
    return Rung(str(name), {**model, **shape}, size=size, lr=float(lr) if lr is not None else None)


def _default_name(shape: dict[str, int], size: str | None) -> str:
    if "d_model" in shape and "n_layers" in shape:
        return f"d{shape['d_model']}-l{shape['n_layers']}"
    return size or ""


def _folder_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and all(c.isalnum() or c in "-_." for c in name)


def _describe(rungs: tuple[Rung, ...], steps: int | None, per_parameter: float | None, batch: int,
              seq: int) -> str:
    """A ladder file's description when it gives none: its rungs and its tokens."""
    tokens = (f"{steps} steps of {batch} x {seq} tokens at every rung" if steps is not None else
              f"{per_parameter:g} tokens per parameter, in steps of {batch} x {seq} tokens")
    return f"rungs {', '.join(r.name for r in rungs)}; {tokens}"
