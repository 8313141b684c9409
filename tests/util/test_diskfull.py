"""A full disk while a run writes: one plain error naming the path, the space free and needed and what
to do; no partial checkpoint left; the last good checkpoint resumes to an uninterrupted run's curve."""

from __future__ import annotations

import errno
import io
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from blocklab.training import TrainConfig, train
from blocklab.training import checkpoint as ckpt
from blocklab.training.metrics import MetricsLogger, read_metrics
from blocklab.util import diskfull
from blocklab.util.errors import DiskFullError, TrainingError
from helpers import make_model

# torch.save's own text on a full disk (its zip writer keeps no errno)
TORCH_FULL = "[enforce fail at inline_container.cc:672] . unexpected pos 1234 vs 1200"


def config(corpus: Path, out: Path, cache: Path, **overrides) -> TrainConfig:
    """Six steps of a tiny byte-level model; checkpoints at steps 2 and 4, and the final one at 6."""
    fields = dict(arch="pre-ln", size="tiny", model={"d_model": 32, "n_layers": 2, "n_heads": 2},
                  batch_size=4, seq_len=32, max_steps=6, eval_every=3, eval_batches=2, log_every=1,
                  ckpt_every=2, progress=False, out_dir=str(out), optim={"lr": 3e-3, "warmup_fraction": 0.0},
                  data={"source": str(corpus), "tokenizer": "byte", "cache_dir": str(cache)})
    return TrainConfig.from_dict({**fields, **overrides})


def losses(run: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_metrics(run / "metrics.jsonl", "train") if "loss" in r]


@pytest.fixture(scope="module")
def uninterrupted(corpus, tmp_path_factory) -> list[tuple[int, float]]:
    root = tmp_path_factory.mktemp("full")
    return losses(train(config(corpus, root / "run", root / "cache")).run_dir)


def fail_second_torch_save(monkeypatch, error: BaseException) -> None:
    """torch.save in checkpoint.py writes part of optimizer.pt, then raises `error`, at its second call:
    the checkpoint of step 4 (the one of step 2 is written whole)."""
    real, calls = torch.save, {"n": 0}

    def save(obj, path, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            Path(path).write_bytes(b"PK\x03\x04" + bytes(512))  # what the zip writer got out before failing
            raise error
        return real(obj, path, *args, **kwargs)

    monkeypatch.setattr(ckpt.torch, "save", save)


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"),
                                   RuntimeError(TORCH_FULL)], ids=["ENOSPC", "torch-zip-writer"])
def test_a_full_disk_while_checkpointing_is_said_plainly_and_the_last_checkpoint_resumes(
        corpus, tmp_path, monkeypatch, uninterrupted, error):
    run, cache = tmp_path / "run", tmp_path / "cache"
    fail_second_torch_save(monkeypatch, error)
    with pytest.raises(DiskFullError) as caught:
        train(config(corpus, run, cache))
    assert isinstance(caught.value, TrainingError) and caught.value.__cause__ is error
    message = str(caught.value)
    last = run / "checkpoints" / "step_000002"
    needed = sum(f.stat().st_size for f in last.iterdir())  # the same tensors as the one that failed
    assert message.startswith(f"could not write checkpoint {run / 'checkpoints' / 'step_000004'}: ")
    assert "No space left on device" in message if isinstance(error, OSError) else TORCH_FULL in message
    assert re.search(r"; [\d.]+ (bytes|KiB|MiB|GiB|TiB) free there", message)
    assert f"about {diskfull.plain_size(needed)}" in message
    assert f"The last good checkpoint, {last}, is intact" in message
    assert f"`blocklab train --resume --out {run}` continues from it" in message
    # nothing half-written is left, and the checkpoint before is whole
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000002"]
    ckpt.verify_checkpoint(last, run)

    monkeypatch.undo()  # space freed
    resumed = train(config(corpus, run, cache), resume=True)
    assert losses(resumed.run_dir) == uninterrupted  # bit-identical on CPU


@pytest.mark.parametrize("error", [RuntimeError("CUDA error: an illegal memory access was encountered"),
                                   OSError(errno.EACCES, "Permission denied"), OSError("disk full"),
                                   KeyError("optimizers")], ids=["runtime", "EACCES", "no-errno", "key"])
def test_other_errors_while_checkpointing_pass_unchanged(tmp_path, monkeypatch, error):
    model = torch.nn.Linear(3, 2)
    ckpt.save_checkpoint(tmp_path, model.state_dict(), [], ckpt.TrainState(step=1), {}, keep=2)

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(ckpt.torch, "save", fail)
    with pytest.raises(type(error)) as caught:
        ckpt.save_checkpoint(tmp_path, model.state_dict(), [], ckpt.TrainState(step=2), {}, keep=2)
    assert caught.value is error and not isinstance(caught.value, DiskFullError)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000001"]


def test_the_full_disk_texts_of_torch_and_safetensors_are_told_apart():
    from safetensors import SafetensorError

    assert diskfull.failed_write(OSError(errno.ENOSPC, "...")) == "No space left on device"
    assert diskfull.failed_write(OSError(errno.EDQUOT, "...")) == "Disk quota exceeded"
    saying = "Error while serializing: I/O error: No space left on device (os error 28)"  # safetensors 0.8
    assert diskfull.failed_write(SafetensorError(saying)) == "No space left on device"
    for torch_text in (TORCH_FULL, "basic_ios::clear: iostream error", "PytorchStreamWriter failed writing "
                       "file data/0: file write failed"):
        assert torch_text in diskfull.failed_write(RuntimeError(torch_text))
    for other in (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), OSError(errno.EIO, "I/O error"),
                  ValueError("No space left on device"), DiskFullError("could not write ... No space left")):
        assert diskfull.failed_write(other) is None
    sizes = [diskfull.plain_size(n) for n in (0, 1023, 1536, 5 * 2**30)]
    assert sizes == ["0 bytes", "1023 bytes", "1.5 KiB", "5.0 GiB"]


def test_the_cli_says_a_full_disk_in_one_line(corpus, tmp_path, monkeypatch, capsys):
    from blocklab.cli import main

    run = tmp_path / "run"
    fail_second_torch_save(monkeypatch, OSError(errno.ENOSPC, "No space left on device"))
    args = ["train", f"data.source={corpus}", "data.tokenizer=byte", f"data.cache_dir={tmp_path / 'cache'}",
            "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "batch_size=4", "seq_len=32",
            "max_steps=6", "ckpt_every=2", "eval_every=3", "eval_batches=2", "progress=false",
            "--out", str(run)]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and "Traceback" not in err and err.count("\n") == 1
    target = run / "checkpoints" / "step_000004"
    assert err.startswith(f"blocklab: error: could not write checkpoint {target}: No space left on device; ")
    assert "free there" in err and "continues from it" in err


def test_a_full_disk_while_logging_metrics_or_exporting_is_said_plainly(tmp_path, monkeypatch):
    from blocklab.interop import checkpoint as export

    logger = MetricsLogger(tmp_path)

    class Full(io.StringIO):
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(Path, "open", lambda self, *args, **kwargs: Full())
        with pytest.raises(DiskFullError, match=rf"could not write metrics {re.escape(str(logger.path))}: No "
                                                r"space left on device; .* No checkpoint was saved yet"):
            logger.log({"kind": "train", "step": 1})

    def over_quota(*args, **kwargs):
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    monkeypatch.setattr(export, "save_model", over_quota)
    with pytest.raises(DiskFullError, match=r"could not write the export .*out: Disk quota exceeded; .* "
                                            r"Free some space and export again"):
        export.save_pretrained(make_model(), tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no temporary folder left


# -- a real full file system -------------------------------------------------------------------------------
def _mount_tmpfs(where: Path, size: int) -> bool:
    """A tmpfs of `size` bytes at `where`; False where mounting is not allowed (not root, a container)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True)
    return done.returncode == 0


def test_a_real_full_file_system(corpus, tmp_path, uninterrupted):
    """The run on a tmpfs with room for one checkpoint and not two: the second fails with the error
    the OS, torch and safetensors really give; once the tmpfs grows, the resume ends as if never cut."""
    cache, disk = tmp_path / "cache", tmp_path / "disk"
    probe = train(config(corpus, tmp_path / "probe", cache, max_steps=2)).run_dir
    one = sum(f.stat().st_size for f in probe.rglob("*") if f.is_file())  # the run with one checkpoint
    step = ckpt.latest_checkpoint(probe)
    size = one + sum(f.stat().st_size for f in step.iterdir()) // 2  # half a second checkpoint more
    if not _mount_tmpfs(disk, size):
        pytest.skip("cannot mount a tmpfs here (needs root, outside a restricted container)")
    try:
        run = disk / "run"
        with pytest.raises(DiskFullError, match=r"could not write checkpoint .*step_000004: .* free there, "
                                                r"and it needs about") as caught:
            train(config(corpus, run, cache))
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000002"]
        # the failed write's space is back while the error is still held (torch's writer closed), and
        # the error says what is free
        free = shutil.disk_usage(disk).free
        assert free > size - one - 64 * 1024
        assert f"{diskfull.plain_size(free)} free there" in str(caught.value)
        subprocess.run(["mount", "-o", f"remount,size={4 * size}", str(disk)], check=True)  # space freed
        resumed = train(config(corpus, run, cache), resume=True)
        assert losses(resumed.run_dir) == uninterrupted
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=False)  # even while a file there is open


# -- the token cache ---------------------------------------------------------------------------------------
def full_disk_under(monkeypatch, root: Path, room: int) -> None:
    """Files opened for writing under `root` share `room` bytes, as on a nearly full disk: the write that
    crosses it puts what fits (binary files), then raises OSError(ENOSPC), as the OS does."""
    import builtins

    real_open, left, root = io.open, {"bytes": room}, os.path.abspath(root) + os.sep

    class Full:
        def __init__(self, handle, binary: bool) -> None:
            self._handle, self._binary = handle, binary

        def write(self, data):
            raw = memoryview(data).cast("B") if self._binary else data.encode("utf-8")
            if len(raw) > left["bytes"]:
                if self._binary:
                    self._handle.write(raw[:left["bytes"]])
                left["bytes"] = 0
                raise OSError(errno.ENOSPC, "No space left on device")
            left["bytes"] -= len(raw)
            return self._handle.write(data)

        def __getattr__(self, name):
            return getattr(self._handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._handle.close()

    def fake_open(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        writes = any(c in mode for c in "wax+")
        if writes and isinstance(file, (str, os.PathLike)) and os.path.abspath(file).startswith(root):
            return Full(handle, "b" in mode)
        return handle

    monkeypatch.setattr(io, "open", fake_open)
    monkeypatch.setattr(builtins, "open", fake_open)


def about(message: str) -> float:
    """The bytes a DiskFullError says a write needs ("it needs about 318.4 KiB")."""
    number, unit = re.search(r"it needs (?:more than that \(its data alone is )?about ([\d.]+) "
                             r"(bytes|KiB|MiB|GiB)", message).groups()
    return float(number) * 1024 ** ["bytes", "KiB", "MiB", "GiB"].index(unit)


def entry_bytes(entry: Path) -> int:
    return sum(f.stat().st_size for f in entry.iterdir())


def cache_config(corpus: Path, cache: Path | None, tokenizer: str):
    from blocklab.data import DataConfig

    return DataConfig(source=str(corpus), tokenizer=tokenizer, vocab_size=300,
                      cache_dir=str(cache) if cache is not None else None)


@pytest.mark.parametrize("tokenizer, room, fails", [("byte", 5000, "shards"), ("bpe", 1000, "tokenizer"),
                                                    ("bpe", "tokenizer + 2000", "shards")])
@pytest.mark.parametrize("chosen_by", ["BLOCKLAB_CACHE", "data.cache_dir"])
def test_a_full_disk_under_the_token_cache_is_said_plainly_and_leaves_nothing(
        corpus, tmp_path, monkeypatch, tokenizer, room, fails, chosen_by):
    from blocklab.data import prepare_data

    reference = prepare_data(cache_config(corpus, tmp_path / "reference", tokenizer))  # a disk with room
    [bpe] = (tmp_path / "reference" / "tokenizers").glob("bpe-*") if tokenizer == "bpe" else [None]
    cache = tmp_path / "cache"
    monkeypatch.setenv("BLOCKLAB_CACHE", str(cache) if chosen_by == "BLOCKLAB_CACHE" else "/nowhere")
    config = cache_config(corpus, cache if chosen_by == "data.cache_dir" else None, tokenizer)
    full_disk_under(monkeypatch, cache, room if isinstance(room, int) else entry_bytes(bpe) + 2000)
    with pytest.raises(DiskFullError) as caught:
        prepare_data(config)
    message = str(caught.value)
    if fails == "shards":
        what, path, needed = "the token cache entry", cache / "shards" / reference.path.name, reference.path
    else:
        what, path, needed = "the cached tokenizer", cache / "tokenizers" / bpe.name, bpe
    assert message.startswith(f"could not write {what} {path}: No space left on device; ")
    assert re.search(r"; [\d.]+ (bytes|KiB|MiB|GiB|TiB) free there, and it needs ", message)
    assert about(message) == pytest.approx(entry_bytes(needed), rel=0.05)  # within 5% of the whole entry
    assert "Nothing half-written was left." in message and "BLOCKLAB_CACHE" in message
    assert f"The token cache is {cache}" in message and chosen_by in message
    # nothing half-written: only the complete tokenizer entry when it was the shards that failed
    left = sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file())
    assert left == ([f"tokenizers/{bpe.name}/manifest.json", f"tokenizers/{bpe.name}/tokenizer.json"]
                    if fails == "shards" and tokenizer == "bpe" else [])

    monkeypatch.undo()  # space freed: the cache is built as on a disk with room
    monkeypatch.setenv("BLOCKLAB_CACHE", str(cache))
    data = prepare_data(config)
    assert np.array_equal(data.train, reference.train) and np.array_equal(data.val, reference.val)
    assert data.tokenizer.hash == reference.tokenizer.hash and data.stats["tokenised"]


@pytest.mark.parametrize("free, needed", [(820 * 1024, 815 * 1024), (815 * 1024, 815 * 1024), (100, 5000)])
def test_the_message_never_says_more_is_free_than_the_write_needed(tmp_path, monkeypatch, free, needed):
    """The write failed for want of space, so it needed more than was free: with an estimate at or below
    the free space (it counts the data, not the file system's blocks), the message says so instead of
    "820.0 KiB free there, and it needs about 815.0 KiB"."""
    monkeypatch.setattr(diskfull, "free_bytes", lambda path: free)
    message = str(diskfull.disk_full(OSError(errno.ENOSPC, "No space left on device"), "checkpoint",
                                     tmp_path / "ckpt", needed, "Free some space."))
    said_free = re.search(r"([\d.]+ (?:bytes|KiB)) free there", message).group(1)
    assert said_free == diskfull.plain_size(free)
    if free >= needed:
        assert "it needs about" not in message
        assert f"it needs more than that (its data alone is about {diskfull.plain_size(needed)})" in message
    else:
        assert f"it needs about {diskfull.plain_size(needed)}" in message
