"""Export a blocklab model to a folder and load it back.

    folder/config.json        the ModelConfig dict plus "blocklab_format_version" and "dtype"
    folder/model.safetensors  the state dict (safetensors; a tensor shared by two names is stored once)
    folder/tokenizer.json     when a tokenizer is given

The folder is written into a temporary sibling and renamed into place, so a reader never sees a
half-written export. An existing folder is replaced only when it is empty or holds nothing but a
previous export (so that a run folder with logs or checkpoints is never deleted).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model

from blocklab import integrity
from blocklab.config import ConfigError, ModelConfig
from blocklab.model import Transformer

FORMAT_VERSION = 1
VERSION_KEY = "blocklab_format_version"
CONFIG_NAME, WEIGHTS_NAME, TOKENIZER_NAME = "config.json", "model.safetensors", "tokenizer.json"
SHA_KEY = "blocklab_sha256"  # in config.json: {file: sha256} of the weights and tokenizer
_EXPORT_FILES = {CONFIG_NAME, WEIGHTS_NAME, TOKENIZER_NAME}


def _model_dtype(model: torch.nn.Module) -> torch.dtype:
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def _save_tokenizer(tokenizer: Any, path: Path) -> None:
    """A tokenizer.json path (or a folder holding one), a `tokenizers.Tokenizer` or an HF fast tokenizer."""
    if isinstance(tokenizer, (str, os.PathLike)):
        src = Path(tokenizer)
        src = src / TOKENIZER_NAME if src.is_dir() else src
        if not src.is_file():
            raise FileNotFoundError(f"tokenizer file {src} does not exist")
        shutil.copyfile(src, path)
    elif hasattr(tokenizer, "backend_tokenizer"):  # transformers' PreTrainedTokenizerFast
        tokenizer.backend_tokenizer.save(str(path))
    elif hasattr(tokenizer, "to_str"):  # tokenizers.Tokenizer
        path.write_text(tokenizer.to_str())
    else:
        raise TypeError(f"cannot save a tokenizer of type {type(tokenizer).__name__}: give a tokenizer.json "
                        "path, a tokenizers.Tokenizer or a transformers fast tokenizer.")


def _is_export(folder: Path) -> bool:
    try:
        return VERSION_KEY in json.loads((folder / CONFIG_NAME).read_text())
    except (OSError, ValueError):
        return False


def _check_replaceable(folder: Path) -> None:
    if not folder.exists():
        return
    if not folder.is_dir():
        raise FileExistsError(f"{folder} exists and is not a folder")
    names = {p.name for p in folder.iterdir()}
    if names and (names - _EXPORT_FILES or not _is_export(folder)):
        raise FileExistsError(f"{folder} holds files that are not a blocklab export "
                              f"({', '.join(sorted(names - _EXPORT_FILES) or names)}); "
                              "save_pretrained replaces only an empty folder or an earlier export.")


def _move_into_place(tmp: Path, folder: Path) -> None:
    if not folder.exists():
        os.rename(tmp, folder)
        return
    old = folder.with_name(f".{folder.name}.old-{uuid.uuid4().hex[:8]}")
    os.rename(folder, old)
    try:
        os.rename(tmp, folder)
    except OSError:
        os.rename(old, folder)  # put the earlier export back
        raise
    shutil.rmtree(old)


def save_pretrained(model: Transformer, folder: str | os.PathLike, tokenizer: Any = None) -> Path:
    """Write `model` (and `tokenizer`) to `folder` atomically; returns the folder's path."""
    folder = Path(folder)
    _check_replaceable(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    try:
        save_model(model, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"}, force_contiguous=True)
        if tokenizer is not None:
            _save_tokenizer(tokenizer, tmp / TOKENIZER_NAME)
        meta = {VERSION_KEY: FORMAT_VERSION, "dtype": str(_model_dtype(model)).removeprefix("torch."),
                SHA_KEY: integrity.record(tmp, (WEIGHTS_NAME, TOKENIZER_NAME))}
        (tmp / CONFIG_NAME).write_text(json.dumps({**model.cfg.to_dict(), **meta}, indent=2) + "\n")
        _move_into_place(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def load_pretrained(folder: str | os.PathLike, device: str | torch.device = "cpu", verify: bool = True
                    ) -> Transformer:
    """The `Transformer` saved in `folder` by `save_pretrained`, in its saved dtype, on `device`. With
    `verify`, the weights and tokenizer must match the sha256 recorded in config.json."""
    folder = Path(folder)
    data = json.loads((folder / CONFIG_NAME).read_text())
    sums = data.pop(SHA_KEY, None)
    if verify:
        integrity.verify(folder, sums, str(folder / CONFIG_NAME))
    version = data.pop(VERSION_KEY, None)
    if version is None:
        raise ConfigError(f"{folder / CONFIG_NAME} is not a blocklab export (no {VERSION_KEY!r}); "
                          "for a Hugging Face checkpoint use blocklab.interop.from_hf.")
    if version > FORMAT_VERSION:
        raise ConfigError(f"{folder} has {VERSION_KEY} = {version}; this blocklab reads versions up to "
                          f"{FORMAT_VERSION}: upgrade blocklab.")
    dtype = getattr(torch, data.pop("dtype", "float32"))
    cfg = ModelConfig.from_dict(data)
    with torch.device(device):
        model = Transformer(cfg)
    model.to(dtype)
    load_model(model, str(folder / WEIGHTS_NAME), strict=True, device=str(device))
    return model


def load_tokenizer(folder: str | os.PathLike):
    """The `tokenizers.Tokenizer` saved with an export, or None when it has none."""
    path = Path(folder) / TOKENIZER_NAME
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))
