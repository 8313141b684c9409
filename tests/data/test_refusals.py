"""Data refusals, each through the command line in this process: a full disk under the token cache
(one `blocklab: error:` line naming the cache, the space free and needed and BLOCKLAB_CACHE; nothing
left behind, nothing saved changed), a cached BPE edited into another valid tokenizer (named, trained
again identically, the run as with the original), and a batch larger than the training split (refused
with the numbers before anything is allocated, a saved run left as it was)."""

from __future__ import annotations

import filecmp
import json
import subprocess
import tracemalloc
from pathlib import Path

import pytest

from blocklab.cli import main
from blocklab.data import DataConfig, prepare_data
from tests.data.test_token_cache import swap_two_ids
from tests.util.test_diskfull import _mount_tmpfs, full_disk_under

SMALL = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "batch_size=4", "seq_len=32",
         "eval_batches=1", "progress=false"]


def cli(args: list[str], capsys) -> tuple[int, str]:
    """The exit status of `blocklab ARGS` and what it wrote on stderr."""
    capsys.readouterr()
    try:
        code = main(args)
    except SystemExit as exit_:
        code = exit_.code
    return code, capsys.readouterr().err


def train_args(corpus: Path, tokenizer: str, out: Path, *extra: str) -> list[str]:
    return ["train", f"data.source={corpus}", f"data.tokenizer={tokenizer}", "data.vocab_size=300", *SMALL,
            "max_steps=1", *extra, "--out", str(out)]


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_one_error_line(code: int, err: str, start: str) -> None:
    assert code != 0 and "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith(f"blocklab: error: {start}"), err


# -- a full disk under the token cache ---------------------------------------------------------------------
@pytest.mark.parametrize("tokenizer, what", [("byte", "the token cache entry"),
                                             ("bpe", "the cached tokenizer")])
def test_a_full_token_cache_is_one_error_line(corpus, tmp_path, monkeypatch, capsys, tokenizer, what):
    """A cache that already holds another entry (a byte-level one) fills while this run writes its own:
    one line, and the entry already there is unchanged."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("BLOCKLAB_CACHE", str(cache))
    prepare_data(DataConfig(source=str(corpus), tokenizer="byte", val_fraction=0.2))  # saved before
    before = files(cache)
    full_disk_under(monkeypatch, cache, 1000)
    code, err = cli(train_args(corpus, tokenizer, tmp_path / "run", "data.val_fraction=0.3"), capsys)
    assert_one_error_line(code, err, f"could not write {what} {cache}")
    assert "No space left on device" in err and "free there, and it needs" in err
    assert f"The token cache is {cache} (set by BLOCKLAB_CACHE)" in err
    assert files(cache) == before and not (tmp_path / "run").exists()


@pytest.mark.parametrize("tokenizer, room, what", [("byte", 16_384, "the token cache entry"),
                                                   ("bpe", 4096, "the cached tokenizer"),
                                                   ("bpe", 16_384, "the token cache entry")])
def test_a_real_full_file_system_under_the_token_cache(corpus, tmp_path, monkeypatch, capsys, tokenizer, room,
                                                       what):
    """The same on a tmpfs too small for the entry: the errors the OS, numpy and tokenizers really give
    (before: "... requested and 30720 written", "[Errno 28] No space left on device" and a
    `.bpe-*.json.<pid>.tmp` left)."""
    cache = tmp_path / "cache"
    if not _mount_tmpfs(cache, room):
        pytest.skip("cannot mount a tmpfs here (needs root, outside a restricted container)")
    try:
        monkeypatch.setenv("BLOCKLAB_CACHE", str(cache))
        code, err = cli(train_args(corpus, tokenizer, tmp_path / "run"), capsys)
        assert_one_error_line(code, err, f"could not write {what} {cache}")
        assert "No space left on device; " in err and "BLOCKLAB_CACHE" in err
        left = [p.name for p in cache.rglob("*") if p.name.startswith(".") or p.name.endswith(".tmp")]
        assert not left, left
    finally:
        subprocess.run(["umount", "--lazy", str(cache)], check=False)


# -- a cached tokenizer edited into another valid one --------------------------------------------------------
def test_an_edited_cached_tokenizer_is_named_and_the_run_trains_as_before(corpus, tmp_path, capsys):
    cache = tmp_path / "cache"
    first = train_args(corpus, "bpe", tmp_path / "first", f"data.cache_dir={cache}")
    assert cli(first, capsys)[0] == 0
    [entry] = (cache / "tokenizers").glob("bpe-*")
    swap_two_ids(entry)
    code, err = cli(train_args(corpus, "bpe", tmp_path / "second", f"data.cache_dir={cache}"), capsys)
    assert code == 0
    assert err == (f"blocklab: cached tokenizer {entry}: tokenizer.json sha256 differs from its manifest "
                   "(the file was changed after it was written); training it again\n")
    # trained again identically: the run's tokenizer and its losses are those of the first run
    assert filecmp.cmp(tmp_path / "first" / "tokenizer.json", tmp_path / "second" / "tokenizer.json",
                       shallow=False)
    assert filecmp.cmp(tmp_path / "first" / "tokenizer.json", entry / "tokenizer.json", shallow=False)
    assert losses(tmp_path / "first") and losses(tmp_path / "first") == losses(tmp_path / "second")


def losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [row[key] for row in rows for key in ("loss", "val_loss") if key in row]


# -- a batch larger than the training split ------------------------------------------------------------------
def test_a_batch_larger_than_the_training_split_is_refused_before_any_allocation(corpus, tmp_path, capsys):
    cache = tmp_path / "cache"
    run = tmp_path / "run"
    assert cli(train_args(corpus, "byte", run, f"data.cache_dir={cache}"), capsys)[0] == 0  # saved before
    before = files(run)
    n_tokens = len(prepare_data(DataConfig(source=str(corpus), tokenizer="byte", cache_dir=str(cache))).train)
    n_windows = (n_tokens - 1) // 32  # windows of 32 inputs and the next token
    tracemalloc.start()
    try:
        code, err = cli(train_args(corpus, "byte", run, f"data.cache_dir={cache}", "batch_size=100000000",
                                   "overwrite=true"), capsys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert_one_error_line(code, err, "batch_size = 100,000,000 is more than the training split holds: ")
    assert f"its {n_tokens:,} tokens make {n_windows:,} windows of 33 tokens (seq_len = 32" in err
    assert f"Allowed: batch_size <= {n_windows:,}" in err
    assert peak < 64 * 2**20, peak  # before: 800 MB for the batch's window offsets alone
    assert files(run) == before  # overwrite=true, yet the run saved before is as it was


def test_the_largest_batch_the_split_holds_is_allowed(corpus, tmp_path):
    from blocklab.data import Batches
    from blocklab.util.errors import ConfigError

    data = prepare_data(DataConfig(source=str(corpus), tokenizer="byte", cache_dir=str(tmp_path / "cache"),
                                   val_fraction=0.3))
    for objective, window in (("clm", 33), ("mlm", 32)):
        fits = Batches(data, "train", 4, 32, objective=objective)
        n = fits.n_windows
        assert n == (len(data.train) - window + 32) // 32  # CLM: (n - 1) // T, MLM: n // T
        batch = Batches(data, "train", n, 32, objective=objective).get(3)  # one epoch, every window once
        assert batch["input_ids"].shape == (n, 32)
        with pytest.raises(ConfigError, match=rf"batch_size = {n + 1:,} is more than the training split "
                                              rf"holds: .* Allowed: batch_size <= {n:,}"):
            Batches(data, "train", n + 1, 32, objective=objective)
        # validation batches are cut at the split's end, so a larger batch_size is fine there ...
        val = Batches(data, "val", n + 1, 32, objective=objective)
        assert sum(len(b["input_ids"]) for b in val.validation()) == len(val.validation_windows()[0])
        with pytest.raises(ConfigError, match="more than the validation split holds"):
            val.get(0)  # ... but never drawn as training batches


# -- a file name that is not UTF-8 inside the data folder ------------------------------------------------
@pytest.mark.parametrize("source", ["folder", "glob"])
def test_a_file_whose_name_is_not_utf8_in_the_data_folder_is_named(source, corpus, tmp_path, capsys):
    """`train data=FOLDER` with `bad\\xff.txt` inside: a UnicodeEncodeError traceback when the split hashed
    the name; now one line naming the file as its bytes, before any token is cached."""
    import os
    import shutil

    data = tmp_path / "data"
    shutil.copytree(corpus, data)
    with open(os.fsencode(data) + b"/bad\xff.txt", "wb") as fh:
        fh.write(b"x = 1\n" * 40)
    spec = str(data) if source == "folder" else f"{data}/*.txt"
    code, err = cli(train_args(Path(spec), "byte", tmp_path / "run", f"data.cache_dir={tmp_path / 'cache'}"),
                    capsys)
    assert_one_error_line(code, err, f"DataConfig.source's file '{data}/bad\\xff.txt' is not valid UTF-8")
    assert code == 2 and "Rename the file" in err
    assert not (tmp_path / "run").exists() and not list(tmp_path.joinpath("cache").rglob("*.bin"))


@pytest.mark.parametrize("kind", ["character device", "named pipe"])
def test_a_source_that_is_no_file_nor_folder_says_what_it_is(kind, tmp_path, capsys):
    """data.source=/dev/null said "no such file or directory", which it plainly is not."""
    import os

    if kind == "named pipe":
        source = str(tmp_path / "pipe")
        os.mkfifo(source)
    else:
        source = "/dev/null"
    code, err = cli(["prepare", f"data.source={source}", f"data.cache_dir={tmp_path / 'cache'}"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"DataConfig.source = {source!r}: it is a {kind}, not a regular file or a directory." in err
    assert "Accepted: 'python-stdlib'" in err and not (tmp_path / "cache").exists()
