"""Weights saved by an older blocklab, read under today's names: the one converter of old layouts.

Every loader applies it before `load_state_dict`: model folders (`checkpoint.load_pretrained`), training
checkpoints (`training.checkpoint.load_weights_file`: resuming, `load_run`) and Hugging Face exports
(`hf_model.BlocklabPreTrainedModel.from_pretrained`, which `from_hf` and the Auto classes use). The
model itself knows no old layout: `Transformer.load_state_dict` of an old state dict fails, naming
`upgrade_state_dict`.

The layouts (blocklab names; the Hugging Face classes' export names, interop/export_names.py, on top):

    DenseFormer's depth weights   blocks.<i>.attn.values.dwa.gain  ->  value_shared.dwa.<i>.gain
                                  (until b87e6e3, issue 12: they moved out of the blocks)
    Hugging Face exports          blocklab's names  ->  export names, attn.beta -> attn.gain_a,
                                  attn.gamma -> attn.gain_c (until issue 50)

It keys on the tensor names, because no file records which of these layouts it holds: a model
folder's config.json says ``blocklab_format_version`` 1 before and after both renames, and a training
checkpoint (state.json) or a Hugging Face export (config.json's ``blocklab``, the safetensors metadata
``blocklab_export``) records no version of its names at all. Each old name matches one pattern that no
name of today's layout matches, so a state dict of today's layout passes unchanged.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from blocklab.interop.export_names import EXPORT_PARTS, export_name, takes_key_mapping, weight_files

# old name (a regular expression; any prefix before it is kept) -> today's, as re.sub writes it
RENAMES: dict[str, str] = {
    r"\bblocks\.(\d+)\.attn\.values\.dwa\.gain$": r"value_shared.dwa.\1.gain",  # DenseFormer, issue 12
}
# what older Hugging Face exports hold under blocklab's names: the export names' parts (issue 50)
EXPORT_RENAMES = {re.escape(f".{own}."): f".{export}." for own, export in EXPORT_PARTS.items()}


def upgrade_name(name: str) -> str:
    """Today's blocklab name of tensor `name`, saved under any older layout."""
    for old, new in RENAMES.items():
        name = re.sub(old, new, name)
    return name


def upgrade_state_dict(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A state dict of any older layout under today's blocklab names (a new dict, in the same order)."""
    return {upgrade_name(name): tensor for name, tensor in state.items()}


def load_upgraded(model: nn.Module, state: dict[str, Tensor]) -> None:
    """Load `state`, of any layout, into `model`, strictly: every tensor placed, none left over. A file
    stores a tensor that two of the model's names share once (safetensors' `save_model`): the other
    name takes it from the first."""
    state = upgrade_state_dict(state)
    own = model.state_dict()
    stored = {own[name].data_ptr(): name for name in state if name in own and own[name].numel()}
    for name in own.keys() - state.keys():
        twin = stored.get(own[name].data_ptr()) if own[name].numel() else None
        if twin is not None:
            state[name] = state[twin]
    model.load_state_dict(state, strict=True)


# -- Hugging Face exports ----------------------------------------------------------------------------
def hf_load_kwargs(path: Any) -> dict[str, Any]:
    """What transformers' `from_pretrained` of `path` needs to read an export of an older layout under
    today's export names: a transformers that renames keys itself (``key_mapping``, regular expressions,
    the first that matches a key applies: 4.57 and 5 here; they refuse a ``state_dict`` beside a folder)
    gets the renames; an older one (4.45) the renamed weights as ``state_dict``."""
    if takes_key_mapping():
        return {"key_mapping": {**RENAMES, **EXPORT_RENAMES}}
    state = hf_upgraded_state(path) if isinstance(path, (str, os.PathLike)) else None
    return {} if state is None else {"state_dict": state}


def hf_upgraded_state(path: str | os.PathLike) -> dict[str, Tensor] | None:
    """The weights of a local export of an older layout, under today's export names; None for a folder
    already written with them, or anything else (a hub id, a folder without safetensors weights),
    which transformers loads as it is."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    folder = Path(path)
    files = weight_files(folder) if folder.is_dir() else []
    old = False
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            old = old or any(export_name(upgrade_name(key)) != key for key in f.keys())  # noqa: SIM118
    if not old:
        return None
    state: dict[str, Tensor] = {}
    for file in files:
        state.update((export_name(upgrade_name(key)), value) for key, value in load_file(str(file)).items())
    return state
