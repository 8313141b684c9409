"""`blocklab import-hf`: a local Hugging Face checkpoint folder turned into a blocklab export.

The folder is what transformers' ``save_pretrained`` writes for a GPT-2 or Llama causal LM (one
``model.safetensors`` or shards with an index; a ``pytorch_model.bin`` pickle is refused, see
`blocklab.interop.hf_files`), or what blocklab's own
``save_pretrained(model, folder, format="hf")`` writes (native GPT-2 / Llama, or remote code of
model_type "blocklab", read without running that code). `from_hf` reads the weights; the result is
``save_pretrained(model, out, tokenizer, format="blocklab")``: the folder ``blocklab train
init_from=OUT`` and `load_pretrained` take, with the checkpoint's own tokenizer beside it.

The tokenizer is the folder's tokenizer.json as it is; without one, transformers is asked to convert
the folder's other tokenizer files (vocab.json + merges.txt, a sentencepiece tokenizer.model) into
a fast tokenizer. When neither works the import goes on without a tokenizer and says why, since
the model is still usable with a tokenizer given at training time (``data.tokenizer=PATH``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blocklab.interop import hf_files
from blocklab.runtime import LanguageModel
from blocklab.util.commands import pasteable
from blocklab.util.errors import ConfigError

MODEL_TYPES = ("gpt2", "llama", "blocklab")  # config.json's model_type values blocklab imports
TOKENIZER_FILES = ("tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model")


@dataclass
class Imported:
    """What `import_hf` wrote: the export folder, the source's model_type, the model, and a line on
    the tokenizer (carried, converted, or why there is none)."""

    folder: Path
    model_type: str
    model: LanguageModel
    tokenizer: str


def _config(folder: Path) -> dict[str, Any] | None:
    """The folder's config.json as a dict; None when it has none (or not a readable JSON object)."""
    try:
        data = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_hf_checkpoint(folder: str | os.PathLike) -> bool:
    """True for a folder whose config.json names a transformers model_type (any, supported or not),
    rather than a blocklab-format export; `check_checkpoint` then says whether blocklab imports it."""
    data = _config(Path(folder))
    return data is not None and "model_type" in data and "blocklab_format_version" not in data


def check_checkpoint(folder: Path) -> str:
    """The model_type of `folder`, a Hugging Face checkpoint blocklab imports; otherwise a ConfigError
    naming what is wrong, before transformers is imported."""
    if not folder.is_dir():
        raise ConfigError(f"{str(folder)!r} is not a folder: give a local folder written by transformers' "
                          "save_pretrained (download a hub checkpoint first, e.g. `hf download gpt2 "
                          "--local-dir hf/gpt2`).")
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{str(folder)!r} is not a Hugging Face checkpoint: it has no config.json (a "
                          "save_pretrained folder holds config.json and model.safetensors).")
    data = _config(folder)
    if data is None:
        raise ConfigError(f"{folder / 'config.json'} is not a JSON object: the checkpoint is damaged.")
    if "blocklab_format_version" in data:
        command = pasteable("blocklab", "train", f"init_from={folder}")
        raise ConfigError(f"{str(folder)!r} is already a blocklab export: use it as it is ({command}, or "
                          "blocklab.interop.load_pretrained).")
    model_type = data.get("model_type")
    if model_type not in MODEL_TYPES:
        what = "has no model_type" if model_type is None else f"has model_type = {model_type!r}"
        raise ConfigError(f"cannot import {str(folder)!r}: its config.json {what}; blocklab imports "
                          f"{', '.join(map(repr, MODEL_TYPES))} (GPT-2, Llama, blocklab's own HF exports).")
    hf_files.check_weight_files(folder)  # whole safetensors files, no pickle
    return model_type


def load_hf_checkpoint(folder: str | os.PathLike) -> LanguageModel:
    """The blocklab `LanguageModel` of an HF checkpoint folder (`from_hf`), in the dtype it was saved in."""
    from blocklab.interop.hf import from_hf

    folder = Path(folder)
    check_checkpoint(folder)
    try:
        return from_hf(folder)
    except ImportError as err:  # the hf extra is missing: a usage error
        raise ConfigError(f"reading a Hugging Face checkpoint needs transformers ({err}): "
                          "pip install 'blocklab[hf]'.") from None


def hf_tokenizer(folder: Path) -> tuple[Any, str]:
    """The folder's tokenizer as a `tokenizers.Tokenizer` (None when there is none) and a line saying
    where it came from, or why it could not be carried."""
    from tokenizers import Tokenizer

    if (folder / "tokenizer.json").is_file():
        try:
            return Tokenizer.from_file(str(folder / "tokenizer.json")), "tokenizer.json carried as it is"
        except Exception as err:  # tokenizers raises a bare Exception on a malformed file
            raise ConfigError(f"{folder / 'tokenizer.json'} is not a readable tokenizer ({err}).") from None
    found = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
    if not found:
        return None, (f"no tokenizer carried: {folder} has no tokenizer files; give one when training "
                      "(data.tokenizer=PATH/tokenizer.json)")
    try:
        from transformers import AutoTokenizer

        converted = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        return converted.backend_tokenizer, f"tokenizer converted to tokenizer.json from {', '.join(found)}"
    except Exception as err:  # transformers raises many kinds; each means: no fast tokenizer here
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return None, (f"no tokenizer carried: transformers could not make a tokenizer.json from "
                      f"{', '.join(found)} ({first}); give one when training (data.tokenizer=PATH)")


def _check_tokenizer_fits(tokenizer: Any, model: LanguageModel, folder: Path) -> None:
    """A tokenizer with ids beyond the model's vocabulary belongs to another model."""
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size > model.cfg.vocab_size:
        raise ConfigError(f"the tokenizer of {str(folder)!r} has {size} tokens but its model only "
                          f"{model.cfg.vocab_size}: it is not this model's tokenizer.")


def _eos_note(tokenizer: Any) -> str:
    """A hint when the tokenizer has none of the end-of-text names blocklab looks for: training would
    add a new token, one more than the model has, unless data.eos_token names the tokenizer's own."""
    from blocklab.data.tokenizer import KNOWN_EOS

    vocab = tokenizer.get_vocab(with_added_tokens=True)
    if any(name in vocab for name in KNOWN_EOS):
        return ""
    return (f"; it has none of the end-of-text tokens {', '.join(KNOWN_EOS)}: train with "
            "data.eos_token=<its own end-of-text token>")


def _check_out(src: Path, out: Path, overwrite: bool) -> None:
    if out.resolve() == src.resolve():
        raise ConfigError(f"--out {out} is the checkpoint folder itself: write the import elsewhere.")
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise FileExistsError(f"--out {out} already exists: choose another folder, or pass --overwrite to "
                              "replace an earlier export there (a folder holding anything else is never "
                              "replaced).")


def import_hf(folder: str | os.PathLike, out: str | os.PathLike, overwrite: bool = False) -> Imported:
    """Import the HF checkpoint `folder` into the blocklab export `out` (see the module docstring).
    An existing, non-empty `out` is replaced only with `overwrite`, and only if it is an export."""
    from blocklab.interop.checkpoint import save_pretrained

    src, out = Path(folder), Path(out)
    model_type = check_checkpoint(src)
    _check_out(src, out, overwrite)
    model = load_hf_checkpoint(src)
    tokenizer, note = hf_tokenizer(src)
    if tokenizer is not None:
        _check_tokenizer_fits(tokenizer, model, src)
        note += _eos_note(tokenizer)
    written = save_pretrained(model, out, tokenizer=tokenizer, format="blocklab")
    return Imported(written, model_type, model, note)
