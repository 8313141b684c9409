"""The token cache's entries (data/cache_entry.py, filled by data/prepare.py): reused, tokenised again
when a file changes, and their manifest, with the bytes each token stands for.

References are independent of the code under test: token
streams are rebuilt from the raw file bytes, byte counts by hand. Damage to an entry:
tests/data/test_token_cache.py."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from blocklab.data import DataConfig, byte_tokenizer, load_tokenizer, prepare_data
from blocklab.data import prepare as prepare_module
from blocklab.data.prepare import token_dtype
from blocklab.data.tokenizer import Tokenizer
from tests.data.data_reference import EOS, MASK, byte_cfg, write_files


def test_shard_cache_is_reused(code_dir: Path, cache: Path, monkeypatch):
    cfg = DataConfig(source=str(code_dir), vocab_size=300, val_fraction=0.3, cache_dir=str(cache))
    first = prepare_data(cfg)
    assert first.stats["tokenised"]

    def refuse(*args, **kwargs):
        raise AssertionError("tokenised again")

    monkeypatch.setattr(Tokenizer, "encode_batch", refuse)
    monkeypatch.setattr(Tokenizer, "encode", refuse)
    monkeypatch.setattr(prepare_module, "train_bpe", refuse)
    second = prepare_data(cfg)
    assert not second.stats["tokenised"] and not second.stats["tokenizer_trained"]
    assert isinstance(second.train, np.memmap) and second.path == first.path
    assert np.array_equal(second.train, first.train) and np.array_equal(second.val, first.val)
    assert second.bytes_per_token == first.bytes_per_token
    # $BLOCKLAB_CACHE is the fallback location.
    monkeypatch.setenv("BLOCKLAB_CACHE", str(cache))
    assert prepare_data(cfg.replace(cache_dir=None)).path == first.path


def test_a_file_edited_with_its_old_size_and_time_is_tokenised_again(code_dir: Path, cache: Path):
    """A copy that keeps name, size and modification time (cp -p, rsync -a, tar) over an edited file:
    the cache must see the new bytes, not serve the old tokens."""
    cfg = byte_cfg(code_dir, cache, val_fraction=0.3)
    first = prepare_data(cfg)
    path = next(iter(sorted(code_dir.rglob("*.py"))))
    st = path.stat()
    text = path.read_bytes()
    path.write_bytes(text.upper())  # the same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the same modification time
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    second = prepare_data(cfg)
    assert second.stats["tokenised"] and second.path != first.path
    tokens = [np.concatenate([d.train, d.val]) for d in (first, second)]
    assert not np.array_equal(*tokens)


def test_manifest_contents(code_dir: Path, cache: Path):
    data = prepare_data(byte_cfg(code_dir, cache, val_fraction=0.3))
    m = data.manifest
    assert sorted(p.name for p in data.path.iterdir()) == ["manifest.json", "tokenizer.json", "train.bin",
                                                           "val.bin"]
    assert [p.name for p in data.path.parent.iterdir()] == [data.path.name]  # no temporary leftovers
    assert m["dtype"] == "uint16" and data.train.dtype == np.uint16
    assert m["tokenizer"] == {"hash": data.tokenizer.hash, "vocab_size": 258, "eos_id": EOS,
                              "mask_id": MASK, "file": "tokenizer.json"}
    assert m["source"]["files"] == 20 and m["source"]["skipped_count"] == 0
    assert m["settings"]["val_fraction"] == 0.3 and m["settings"]["tokenizer"] == "byte"
    files = [p for p in code_dir.rglob("*.py")]
    total_bytes = sum(p.stat().st_size for p in files)
    s = m["splits"]
    assert s["train"]["bytes"] + s["val"]["bytes"] == total_bytes
    assert s["train"]["documents"] + s["val"]["documents"] == 20
    assert s["train"]["tokens"] == s["train"]["bytes"] + s["train"]["documents"]  # bytes + separators
    assert load_tokenizer(data.path).hash == data.tokenizer.hash
    assert token_dtype(65535) == np.uint16 and token_dtype(65536) == np.uint32


def test_bytes_per_token_hand_count(tmp_path: Path, cache: Path):
    root = write_files(tmp_path / "d", {"a.txt": "héllo", "b.txt": "ab\n"})  # 6 + 3 bytes
    data = prepare_data(byte_cfg(root, cache, val_fraction=0.0))
    assert data.bytes_per_token["train"] == pytest.approx(9 / 11)  # 9 bytes, 9 + 2 separator tokens
    bpe = prepare_data(DataConfig(source=str(root), vocab_size=262, val_fraction=0.0, bpe_min_frequency=1,
                                  cache_dir=str(cache)))
    n_tokens = len(bpe.tokenizer.encode("héllo")) + len(bpe.tokenizer.encode("ab\n")) + 2
    assert n_tokens < 11 and bpe.bytes_per_token["train"] == pytest.approx(9 / n_tokens)


def test_token_bytes_sum_to_the_text_bytes(code_dir: Path, cache: Path):
    byte = byte_tokenizer().token_bytes
    assert byte[:256].tolist() == [1] * 256 and byte[EOS] == byte[MASK] == 0  # separators carry no text
    data = prepare_data(DataConfig(source=str(code_dir), vocab_size=300, val_fraction=0.3,
                                   cache_dir=str(cache)))
    table = data.tokenizer.token_bytes
    for text in ["déf f(x):\n    return 'é' * 3\n", (code_dir / "pkg1/mod_04.py").read_text(), "中文 ok"]:
        ids = data.tokenizer.encode(text)
        assert table[ids].sum() == len(text.encode("utf-8"))
    for split in ("train", "val"):  # summed over a shard: the split's bytes in the manifest
        assert table[np.asarray(data.split(split))].sum() == data.manifest["splits"][split]["bytes"]
