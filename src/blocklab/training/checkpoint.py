"""Checkpoints: safetensors weights plus optimizer, RNG and progress state, written atomically.

A checkpoint is a directory ``checkpoints/step_000123/`` holding ``model.safetensors``,
``optimizer.pt`` (tensors and plain containers only: it loads with ``weights_only=True``, so
loading never unpickles arbitrary objects) and ``state.json``. It is written into a temporary
sibling directory and renamed into place, so a crash mid-write never leaves a half checkpoint
where a resume would look, and older checkpoints are pruned only after the new one exists. A step
saved again moves its old copy aside first and deletes it only once the new one is in place. A
write the disk refuses (full, or over quota) removes its temporary folder and raises a DiskFullError
naming the space free and needed; the last good checkpoint stays as it was, to resume from.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from blocklab.interop.upgrade import upgrade_state_dict
from blocklab.util import diskfull, integrity
from blocklab.util.commands import pasteable
from blocklab.util.errors import ConfigError
from blocklab.util.filemodes import as_created

PREFIX = "step_"


@dataclass
class TrainState:
    """Where training stands; batches are a pure function of the step, so this is the data position."""

    step: int = 0
    tokens: int = 0
    flops: float = 0.0
    train_time: float = 0.0  # seconds of training so far, over every resume
    # compile=true: the first step after each start compiles; it counts in train_time (the time
    # budget is wall-clock) but not in tokens/s, which measures the compiled model
    warmup_time: float = 0.0
    warmup_tokens: int = 0
    # the steps at which training went on from a checkpoint: its tokens/s then mixes the load of
    # several starts, so reports mark it (speed claims never read it: blocklab.reproduce)
    resumed_at: list[int] = field(default_factory=list)


CHECKPOINT_FILES = ("model.safetensors", "optimizer.pt")
RUN_FILES = ("model_config.json", "tokenizer.json")  # what a checkpoint's weights mean


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"{PREFIX}{step:06d}"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)
             and (p / "state.json").is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def remove_partial_writes(run_dir: str | Path) -> list[Path]:
    """Delete the temporary folders of checkpoint writes that were killed midway (never a complete
    checkpoint: those are renamed into place only once written). Returns what was removed."""
    root = Path(run_dir) / "checkpoints"
    partial = sorted(root.glob(f".tmp-{PREFIX}*")) if root.is_dir() else []
    for path in partial:
        shutil.rmtree(path, ignore_errors=True)
    return partial


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint; a newest step folder without its state.json (deleted: a write
    renames a folder into place only once complete) is reported, not silently passed over."""
    found = list_checkpoints(run_dir)
    root = Path(run_dir) / "checkpoints"
    steps = sorted((int(p.name[len(PREFIX):]), p) for p in root.glob(f"{PREFIX}*")
                   if p.is_dir() and p.name[len(PREFIX):].isdigit()) if root.is_dir() else []
    if steps and (not found or steps[-1][1] != found[-1]):
        raise integrity.IntegrityError(
            f"checkpoint {steps[-1][1]} has no state.json: it was changed after it was written. Restore it, "
            "or remove that folder to resume from " + (f"{found[-1]}." if found else "the start."))
    return found[-1] if found else None


def verify_checkpoint(path: str | Path, run_dir: str | Path | None = None,
                      files: Iterable[str] = CHECKPOINT_FILES) -> None:
    """Check a checkpoint's `files` and its run's model_config.json / tokenizer.json against the sha256
    its state.json recorded (checkpoints written before the records pass unchecked)."""
    path = Path(path)
    _, meta = read_state(path)
    where = str(path / "state.json")
    integrity.verify(path, {k: v for k, v in meta.get("sha256", {}).items() if k in set(files)}, where)
    if run_dir is not None:
        integrity.verify(run_dir, meta.get("run_sha256"), where)


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_weights(weights: dict[str, Tensor], path: str | Path) -> None:
    """safetensors file of a state dict; a tensor shared under several names is stored once."""
    seen: dict[tuple, str] = {}
    unique, aliases = {}, {}
    for name, tensor in weights.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
               tensor.dtype)
        if tensor.device.type != "meta" and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        unique[name] = tensor.detach().to("cpu").contiguous()
    save_file(unique, str(path), metadata={"aliases": json.dumps(aliases)})
    as_created(path)  # safetensors writes 0600; the run's other files follow the umask


def load_weights_file(path: str | Path) -> dict[str, Tensor]:
    """The state dict of a safetensors file, under today's names whatever blocklab wrote it
    (`interop.upgrade`); one that is not a readable safetensors file (damaged, truncated, something
    else under the name) is a ConfigError naming it."""
    from safetensors import SafetensorError, safe_open

    try:
        weights = load_file(str(path))
        with safe_open(str(path), "pt") as f:
            aliases = json.loads((f.metadata() or {}).get("aliases", "{}"))
    except (SafetensorError, ValueError) as err:
        raise ConfigError(f"{path} is not a readable safetensors file ({err}): it is damaged or not a "
                          "weights file. Restore it from the run's checkpoint (blocklab export) or a "
                          "copy.") from None
    for name, target in aliases.items():
        weights[name] = weights[target]
    return upgrade_state_dict(weights)


def save_checkpoint(run_dir: str | Path, weights: dict[str, Tensor], optim_states: list[dict],
                    state: TrainState, meta: dict[str, Any], keep: int) -> Path:
    """Write a checkpoint atomically, then keep only the newest `keep` checkpoints. A write the disk
    refuses (full, or over quota) leaves no temporary folder and every older checkpoint as it was, and
    raises a DiskFullError that says the space free and needed, and where a resume goes on from."""
    final = checkpoint_dir(Path(run_dir), state.step)
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir(parents=True)
        save_weights(weights, tmp / "model.safetensors")
        torch.save({"optimizers": optim_states, "rng": rng_state()}, tmp / "optimizer.pt")
        sums = {"sha256": integrity.record(tmp, CHECKPOINT_FILES),
                "run_sha256": integrity.record(run_dir, RUN_FILES)}
        (tmp / "state.json").write_text(json.dumps({"state": asdict(state), **meta, **sums}, indent=2))
        _put_in_place(tmp, final)
    except BaseException as err:
        # a partial write is never resumed (remove_partial_writes), and on a full disk it holds the space
        shutil.rmtree(tmp, ignore_errors=True)
        if diskfull.failed_write(err) is None:
            raise
        raise diskfull.disk_full(err, "checkpoint", final, _size(run_dir, [weights, optim_states]),
                                 resume_hint(run_dir)) from err
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _put_in_place(tmp: Path, final: Path) -> None:
    if final.exists():  # the same step saved again: set the old copy aside until the new one is in place
        aside = final.with_name(f".old-{final.name}-{os.getpid()}")
        if aside.exists():
            shutil.rmtree(aside)
        final.rename(aside)
        try:
            os.replace(tmp, final)
        except BaseException:
            aside.rename(final)
            raise
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(tmp, final)


def _size(run_dir: str | Path, tensors: Any) -> int:
    """What a checkpoint of `tensors` takes on disk: the last one's size, which holds the same tensors
    with their headers, or before the first, the bytes of the tensors (a few percent less)."""
    last = list_checkpoints(run_dir)[-1:]
    on_disk = sum(f.stat().st_size for f in last[0].iterdir() if f.is_file()) if last else 0
    return max(on_disk, diskfull.tensor_bytes(tensors))


def resume_hint(run_dir: str | Path) -> str:
    """What to do once a full disk has room again: the command that resumes the run, and from where."""
    command = f"`{pasteable('blocklab', 'train', '--resume', '--out', run_dir)}`"
    last = latest_checkpoint(run_dir)
    if last is None:
        return f"No checkpoint was saved yet: free some space, then {command} starts again from step 0."
    return f"The last good checkpoint, {last}, is intact: free some space, then {command} continues from it."


def read_state(path: str | Path) -> tuple[TrainState, dict[str, Any]]:
    """A checkpoint's training state and its record of the model config and tokenizer; a damaged
    state.json (truncated, extended, edited) is a ConfigError naming the file."""
    file = Path(path) / "state.json"
    try:
        meta = json.loads(file.read_text())
        return TrainState(**meta.pop("state")), meta
    except (json.JSONDecodeError, TypeError, KeyError, AttributeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{file} is damaged ({type(err).__name__}: {err}); the checkpoint cannot be "
                          "resumed. Remove that checkpoint folder to resume from the one before it, or "
                          "start a new out_dir.") from None


def load_weights(path: str | Path, model: nn.Module) -> None:
    """Load a checkpoint's `model.safetensors` into `model`; every tensor must match by name and shape."""
    weights = load_weights_file(Path(path) / "model.safetensors")
    check_weights(weights, model.state_dict(), path)
    model.load_state_dict(weights)


def check_weights(weights: dict[str, Tensor], expected: dict[str, Tensor], path: str | Path) -> None:
    """Raise ValueError unless `weights` has exactly the names and shapes of `expected`."""
    missing, unexpected = set(expected) - set(weights), set(weights) - set(expected)
    wrong = [n for n in set(expected) & set(weights) if tuple(expected[n].shape) != tuple(weights[n].shape)]
    if missing or unexpected or wrong:
        raise ValueError(f"checkpoint {str(path)!r} does not match the model: missing {sorted(missing)}, "
                         f"unexpected {sorted(unexpected)}, other shapes {sorted(wrong)}. Was it written "
                         "by a different architecture or model config?")


def load_optimizer_state(path: str | Path) -> dict[str, Any]:
    """The optimizer states and RNG state of a checkpoint (tensors and containers only)."""
    return torch.load(Path(path) / "optimizer.pt", weights_only=True, map_location="cpu")
