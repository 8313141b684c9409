"""Checks of a Hugging Face checkpoint folder made before transformers reads it, so that a damaged or
unusable folder is one `ConfigError` naming the file and what is allowed, not a traceback from
safetensors, json or transformers' config validators.

- weights: ``model.safetensors`` (read by transformers before an index), else
  ``model.safetensors.index.json`` (a JSON object whose ``weight_map`` maps tensor names to shard
  files in the folder, each holding its names). Every file must be a whole safetensors file: its
  header is read (safetensors checks that the header parses and that its tensors cover the file
  exactly), never its data. ``pytorch_model.bin`` is a pickle: refused, with how to convert it.
- config.json: heads that divide the width (GPT-2 ``n_embd`` / ``n_head``; Llama ``hidden_size`` /
  ``num_attention_heads`` unless ``head_dim`` is given, and ``num_key_value_heads`` dividing the
  heads), and a ``dtype`` (``torch_dtype`` before transformers 4.56) that blocklab computes in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from blocklab.interop.export_files import check_dtype
from blocklab.util.errors import ConfigError

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json")


def _damaged(path: Path, why: str) -> ConfigError:
    return ConfigError(f"{path} {why}: the checkpoint is damaged or incomplete; download or copy it again "
                       "from its source.")


def _header(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape, from the header of the safetensors file `path`; a ConfigError when it is
    not a whole safetensors file (empty, truncated, a corrupted header)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {name: list(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError) as err:
        size = path.stat().st_size
        detail = "it is empty (0 bytes)" if size == 0 else f"{size} bytes; {err}"
        raise _damaged(path, f"is not a readable safetensors file ({detail})") from None


def _index_shards(folder: Path) -> dict[str, set[str]]:
    """Shard file name -> the tensor names model.safetensors.index.json places in it."""
    index = folder / INDEX
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise _damaged(index, f"is not valid JSON ({err})") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise _damaged(index, "has no \"weight_map\" (a JSON object of tensor name -> shard file name)")
    shards: dict[str, set[str]] = {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
            raise _damaged(index, f"maps {name!r} to {shard!r}, which is not a file name in the folder")
        shards.setdefault(shard, set()).add(name)
    return shards


def tensor_shapes(folder: Path) -> dict[str, list[int]]:
    """Tensor name -> shape of every weight the folder's safetensors files hold (model.safetensors, or
    the shards its index names), read from their headers."""
    files = [SINGLE] if (folder / SINGLE).exists() else sorted(_index_shards(folder))
    return {name: shape for file in files for name, shape in _header(folder / file).items()}


def check_weight_files(folder: Path) -> None:
    """Refuse weights transformers would fail on (or read from a pickle); see the module docstring."""
    if (folder / SINGLE).exists():
        _header(folder / SINGLE)
        return
    if (folder / INDEX).exists():
        for shard, names in sorted(_index_shards(folder).items()):
            if not (folder / shard).is_file():
                raise _damaged(folder / INDEX, f"names the shard {shard}, which is not in the folder")
            left = sorted(names - set(_header(folder / shard)))
            if left:
                names_text = ", ".join(left[:4]) + (" ..." if len(left) > 4 else "")
                raise _damaged(folder / INDEX, f"places {names_text} "
                               f"in {shard}, which does not hold {'them' if len(left) > 1 else 'it'}")
        return
    pickles = [name for name in PICKLES if (folder / name).exists()]
    if pickles:
        raise ConfigError(f"{folder} holds its weights only as {pickles[0]}, a pickle, which blocklab does "
                          "not read (reading a pickle can run code): blocklab reads safetensors weights. "
                          "Convert the checkpoint to safetensors where you trust its source (transformers' "
                          "save_pretrained writes model.safetensors) and import that folder.")
    raise ConfigError(f"{str(folder)!r} has no weights: expected {SINGLE} or {INDEX} with its shards.")


def _positive_int(config: dict[str, Any], key: str, path: Path) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{path} has {key} = {value!r}: it must be a positive whole number.")
    return value


def _check_divides(path: Path, width_key: str, heads_key: str, config: dict[str, Any]) -> int:
    width, heads = _positive_int(config, width_key, path), _positive_int(config, heads_key, path)
    if width % heads:
        raise ConfigError(f"{path} has {width_key} = {width} and {heads_key} = {heads}: the heads must "
                          f"divide the hidden size (heads of {width / heads:g} dimensions are not possible); "
                          "the config does not belong to these weights.")
    return heads


def check_config(folder: Path, config: dict[str, Any]) -> None:
    """Refuse a config.json (a dict) that transformers would reject with a traceback, or that gives a
    dtype blocklab does not compute in; see the module docstring."""
    path = folder / "config.json"
    model_type = config.get("model_type")
    if model_type == "gpt2":
        _check_divides(path, "n_embd", "n_head", config)
    elif model_type == "llama":
        if config.get("head_dim") is None:
            heads = _check_divides(path, "hidden_size", "num_attention_heads", config)
        else:
            heads = _positive_int(config, "num_attention_heads", path)
        kv_heads = config.get("num_key_value_heads")
        if kv_heads is not None and (_positive_int(config, "num_key_value_heads", path) > heads
                                     or heads % kv_heads):
            raise ConfigError(f"{path} has num_attention_heads = {heads} and num_key_value_heads = "
                              f"{kv_heads}: the key/value heads must divide the attention heads.")
    for key in ("dtype", "torch_dtype"):
        if config.get(key) is not None:
            check_dtype(config[key], f"{path} has {key}")
