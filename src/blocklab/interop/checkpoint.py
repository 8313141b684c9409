"""Export a blocklab model to a folder and load it back.

    folder/config.json        the ModelConfig dict plus "blocklab_format_version" and "dtype"
    folder/model.safetensors  the state dict (safetensors; a tensor shared by two names is stored once)
    folder/tokenizer.json     when a tokenizer is given

With ``format="hf"`` the folder is a Hugging Face checkpoint instead: a native GPT-2 or Llama one for
the plain Pre-LN models those express (`hf_export`), else remote code that imports blocklab
(`hf_remote`: model_type "blocklab", an auto_map); both with a model card (README.md), a
generation_config.json, and a tokenizer_config.json next to the tokenizer. Both kinds carry a marker
in the safetensors metadata, so that a later export may replace them; only the blocklab format records
sha256s (transformers would not check them).

The folder is written into a temporary sibling and renamed into place, so a reader never sees a
half-written export (and a write the disk refuses leaves nothing behind: a DiskFullError says so).
An existing folder is replaced only when it is empty or holds nothing but a previous export (so
that a run folder with logs or checkpoints is never deleted). The writer holds the folder's lock
(`blocklab.util.locks`, on its real path, the lock file removed afterwards), so that a second export, or
one into a run that is training, is refused naming the holder.
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
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_model

from blocklab.interop import hf_export, hf_remote
from blocklab.interop.export_files import (
    CONFIG_NAME,
    MARKER_KEY,
    TOKENIZER_NAME,
    WEIGHTS_NAME,
    check_dtype,
    export_metadata,
)
from blocklab.interop.upgrade import load_upgraded
from blocklab.model.config import ModelConfig
from blocklab.runtime import LanguageModel
from blocklab.util import diskfull, integrity, locks
from blocklab.util.errors import ConfigError
from blocklab.util.filemodes import as_created

FORMAT_VERSION = 1
VERSION_KEY = "blocklab_format_version"
SHA_KEY = "blocklab_sha256"  # in config.json: {file: sha256} of the weights and tokenizer
# in config.json: the sha256 of its other fields (`integrity.fields_sha256`): a file cannot hold its own
CONFIG_SHA_KEY = "blocklab_config_sha256"
_EXPORT_FILES = {CONFIG_NAME, WEIGHTS_NAME, TOKENIZER_NAME, hf_export.TOKENIZER_CONFIG_NAME, *hf_remote.FILES}
FORMATS = ("blocklab", "hf")


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


def _read_config(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / CONFIG_NAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _is_export(folder: Path) -> bool:
    """True for a folder that save_pretrained wrote, in either format."""
    data = _read_config(folder)
    if data is None:
        return False
    if VERSION_KEY in data:
        return True
    try:
        with safe_open(folder / WEIGHTS_NAME, "pt") as f:
            return (f.metadata() or {}).get(MARKER_KEY) == "hf"
    except Exception:  # no weights, or not a safetensors file: not ours
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


def _write_blocklab(model: LanguageModel, tmp: Path) -> None:
    save_model(model, str(tmp / WEIGHTS_NAME), metadata=export_metadata("blocklab"), force_contiguous=True)
    meta = {VERSION_KEY: FORMAT_VERSION, "dtype": str(_model_dtype(model)).removeprefix("torch."),
            SHA_KEY: integrity.record(tmp, (WEIGHTS_NAME, TOKENIZER_NAME))}
    config = {**model.cfg.to_dict(), **meta}
    config[CONFIG_SHA_KEY] = integrity.fields_sha256(config)
    (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")


def save_pretrained(model: LanguageModel, folder: str | os.PathLike, tokenizer: Any = None,
                    format: str = "blocklab", run: str | os.PathLike | None = None) -> Path:
    """Write `model` (and `tokenizer`) to `folder` atomically; returns the folder's path.

    ``format="blocklab"`` keeps every `ModelConfig` field (read back with `load_pretrained`);
    ``format="hf"`` writes a folder that ``transformers.AutoModelForCausalLM.from_pretrained`` (and
    `from_hf`) loads: a native GPT-2 or Llama checkpoint for the plain Pre-LN baselines those two
    can express, else any model as remote code (``trust_remote_code=True``, blocklab installed); both
    with generation_config.json and a README model card that names the preset and its paper and
    describes `run`, the run folder it was trained in, if given. An exported tokenizer pads with its
    end-of-text token (hf_export.write_tokenizer_config).
    """
    if format not in FORMATS:
        raise ConfigError(f"unknown export format {format!r}: use one of {', '.join(map(repr, FORMATS))}.")
    native = format == "hf" and hf_export.native_target(model.cfg) is not None
    if format == "hf":  # without transformers, fail before touching any folder
        hf_export.require_transformers()
    given = Path(folder)
    # through a symlink, the folder it leads to: the one the lock (and any other writer) names
    folder = Path(os.path.realpath(given))
    with locks.hold(folder, remove=True):  # one writer: not two exports, nor an export into a run training
        _write_folder(model, folder, tokenizer, format, native, run)
    return given


def _write_folder(model: LanguageModel, folder: Path, tokenizer: Any, format: str, native: bool,
                  run: str | os.PathLike | None) -> None:
    """save_pretrained's writing, under the folder's lock: into a temporary sibling, then renamed."""
    _check_replaceable(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    try:
        if tokenizer is not None:
            _save_tokenizer(tokenizer, tmp / TOKENIZER_NAME)
        run_folder = None if run is None else Path(run)
        if native:
            hf_export.write_hf(model, tmp, _model_dtype(model), run_folder)
        elif format == "hf":
            specials = hf_export.write_tokenizer_config(tmp, model.cfg.context_length, model.cfg.causal)
            hf_remote.write_remote_code(model, tmp, _model_dtype(model), specials, run_folder)
        else:
            _write_blocklab(model, tmp)
        for path in [tmp, *tmp.iterdir()]:  # mkdtemp and safetensors make owner-only folders and files
            as_created(path)
        _move_into_place(tmp, folder)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if diskfull.failed_write(err) is None:
            raise
        raise diskfull.disk_full(err, "the export", folder, diskfull.tensor_bytes(model.state_dict()),
                                 "Free some space and export again.") from err


def load_pretrained(folder: str | os.PathLike, device: str | torch.device = "cpu", verify: bool = True
                    ) -> LanguageModel:
    """The `Transformer` saved in `folder` by `save_pretrained`, in its saved dtype, on `device`. With
    `verify`, the weights and tokenizer must match the sha256 recorded in config.json, and config.json's
    own fields the sha256 recorded beside them (an export written before that record passes)."""
    folder = Path(folder)
    try:
        data = json.loads((folder / CONFIG_NAME).read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise ConfigError(f"{folder / CONFIG_NAME} is not valid JSON ({err}): the export is damaged; export "
                          "it again (blocklab export --run DIR --out FOLDER).") from None
    fields = data.pop(CONFIG_SHA_KEY, None)
    written = dict(data)  # the fields the record covers
    sums = data.pop(SHA_KEY, None)
    if verify:
        integrity.verify(folder, sums, str(folder / CONFIG_NAME))
    version = data.pop(VERSION_KEY, None)
    if version is None:
        model_type = data.get("model_type")
        kind = f"a Hugging Face {model_type} checkpoint" if model_type else "not a blocklab export"
        raise ConfigError(f"{folder} is {kind} (config.json has no {VERSION_KEY!r}): load it with "
                          f"blocklab.interop.from_hf({str(folder)!r}).")
    if version > FORMAT_VERSION:
        raise ConfigError(f"{folder} has {VERSION_KEY} = {version}; this blocklab reads versions up to "
                          f"{FORMAT_VERSION}: upgrade blocklab.")
    if verify:  # after the version: a later format may record its fields otherwise
        integrity.verify_fields(folder / CONFIG_NAME, written, fields)
    dtype = getattr(torch, check_dtype(data.pop("dtype", "float32"), f"{folder / CONFIG_NAME} has dtype"))
    cfg = ModelConfig.from_dict(data)
    with torch.device(device):
        model = LanguageModel(cfg)
    model.to(dtype)
    try:
        # read to the host, then copied into the model's device (safetensors' `device=` is 0.4.3's)
        weights = load_file(str(folder / WEIGHTS_NAME))
    except SafetensorError as err:
        raise ConfigError(f"{folder / WEIGHTS_NAME} is not a readable safetensors file ({err}): the export "
                          "is damaged; export it again (blocklab export --run DIR --out FOLDER).") from None
    load_upgraded(model, weights)  # an older layout's names read as today's (interop/upgrade.py)
    return model


def load_tokenizer(folder: str | os.PathLike):
    """The `tokenizers.Tokenizer` saved with an export, or None when it has none."""
    path = Path(folder) / TOKENIZER_NAME
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))
