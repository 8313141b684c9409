"""Tensor names of blocklab's Hugging Face classes: blocklab's own, less two that transformers renames.

transformers 4.x before 4.50 (4.44 and 4.45 measured) renames every checkpoint key containing "beta"
to "bias" and "gamma" to "weight" while it loads (a convention of early TensorFlow ports), so the
gains of shaped attention, alpha I + beta A - gamma C, saved as ``attn.beta.gain`` and
``attn.gamma.gain``, would load into nothing and keep their init. Behind HF's classes
(`hf_model.BlocklabPreTrainedModel`) each tensor therefore goes by its *export name*: blocklab's
name with the path parts in `EXPORT_PARTS` replaced, on every transformers version, in what
`state_dict` gives, `save_pretrained` writes and loading reads. The `Transformer` inside keeps
blocklab's names (its checkpoints, logged gains, analyses).

Exports written before this rename hold blocklab's names: the converter of old layouts
(interop/upgrade.py, `hf_load_kwargs`) has `from_pretrained` load them under the export names.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from torch import Tensor, nn

# a path part of a blocklab tensor name -> the part exported instead (attention-matrix gains, on A and C)
EXPORT_PARTS = {"beta": "gain_a", "gamma": "gain_c"}
_BLOCKLAB_PARTS = {export: own for own, export in EXPORT_PARTS.items()}
# the substrings older transformers rewrite in any checkpoint key
RENAMED_BY_TRANSFORMERS = ("beta", "gamma")


def _replace_parts(name: str, parts: dict[str, str]) -> str:
    return ".".join(parts.get(part, part) for part in name.split("."))


def export_name(name: str) -> str:
    """The exported name of blocklab tensor (or module) `name`: ``blocks.0.attn.beta.gain`` ->
    ``blocks.0.attn.gain_a.gain``."""
    return _replace_parts(name, EXPORT_PARTS)


def blocklab_name(name: str) -> str:
    """The inverse of `export_name`."""
    return _replace_parts(name, _BLOCKLAB_PARTS)


def check_export_names(names) -> None:
    """Refuse to write tensor names that transformers 4.x would rename while loading."""
    bad = sorted(n for n in names if any(word in n for word in RENAMED_BY_TRANSFORMERS))
    if bad:
        raise ValueError(f"tensor names {bad[:4]} hold {' or '.join(RENAMED_BY_TRANSFORMERS)}, which "
                         "transformers 4.x renames while loading: add their parts to "
                         "blocklab.interop.export_names.EXPORT_PARTS")


def renamed_in_place(state: dict[str, Tensor], prefix: str, rename) -> None:
    """Apply `rename` to the part after `prefix` of each key of `state` that starts with it, keeping
    the keys' order (a state_dict hook's destination is shared with the modules around it)."""
    items = list(state.items())
    state.clear()
    for key, value in items:
        state[prefix + rename(key[len(prefix):]) if key.startswith(prefix) else key] = value


def weight_files(folder: Path) -> list[Path]:
    """The safetensors weight files of an export folder (one, or the shards its index names)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return [folder / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    single = folder / "model.safetensors"
    return [single] if single.is_file() else []


def alias_export_names(model: nn.Module) -> None:
    """On a transformers without ``key_mapping`` (4.45), let each module of `model` answer to its
    children's export names as plain attributes (not submodules: the module tree and state_dict stay
    as they are). Its meta-device load (``device_map=...`` or ``low_cpu_mem_usage=True``, as
    lm-evaluation-harness loads) and accelerate's find each tensor by walking attributes named by the
    checkpoint's keys: ``model.blocks.0.attn.gain_a.gain``."""
    if takes_key_mapping():
        return
    for module in model.modules():
        for own, export in EXPORT_PARTS.items():
            child = module._modules.get(own)
            if child is not None and export not in module.__dict__:
                object.__setattr__(module, export, child)  # bypasses nn.Module's registration


@functools.cache
def takes_key_mapping() -> bool:
    """Whether the installed transformers' from_pretrained reads ``key_mapping`` (a keyword it takes
    from ``**kwargs``, so only its source says)."""
    import inspect

    from transformers import PreTrainedModel

    return "key_mapping" in inspect.getsource(PreTrainedModel.from_pretrained)
