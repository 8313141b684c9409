"""blocklab.data: snapshot, sources, split, tokenizers, shard cache, batches, bits per byte.

References are independent of the code under test: token streams are rebuilt from the raw file
bytes (the byte tokenizer's ids are the UTF-8 bytes), the split from sha256 written out here,
batch contents by hand, masking rates against binomial standard deviations.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import math
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from blocklab.data import (
    Batches,
    DataConfig,
    bits_per_byte,
    byte_tokenizer,
    iter_snapshot,
    load_tokenizer,
    prepare_data,
    snapshot_info,
)
from blocklab.data import prepare as prepare_module
from blocklab.data.prepare import token_dtype
from blocklab.data.tokenizer import Tokenizer
from blocklab.util.errors import ConfigError

SNAPSHOT_SHA256 = "6ae4f8656aefe05edb99757cef0d8d5198e820d0f7862e00d450a9c29f2e99cf"  # pinned at build time
EOS, MASK = 256, 257  # byte tokenizer specials


def ref_split(name: str, val_fraction: float) -> str:
    """The split rule, written from its definition: first 64 bits of sha256(name) as a fraction."""
    u = int(hashlib.sha256(name.encode()).hexdigest()[:16], 16)
    return "val" if u < val_fraction * 16**16 else "train"


def write_files(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return root


def byte_stream(texts: list[str]) -> list[int]:
    """Documents joined the way the shards pack them: bytes, then the separator."""
    return [t for text in texts for t in [*text.encode("utf-8"), EOS]]


def byte_cfg(source, cache: Path, **kw) -> DataConfig:
    return DataConfig(source=str(source), tokenizer="byte", cache_dir=str(cache), **kw)


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    """20 small files whose names put both splits non-empty at val_fraction 0.3."""
    files = {f"pkg{i % 3}/mod_{i:02d}.py": f"def f{i}(x):\n    return x * {i} + 'é{i}'\n" * (3 + i % 4)
             for i in range(20)}
    return write_files(tmp_path / "code", files)


# -- embedded snapshot ------------------------------------------------------------------------------


def test_snapshot_is_pinned_and_sorted():
    info = snapshot_info()
    assert info["python_version"] == "3.11.7" and info["sha256"] == SNAPSHOT_SHA256
    corpora = Path(prepare_module.__file__).with_name("corpora")
    packed = (corpora / info["file"]).read_bytes()
    assert len(packed) <= 2_500_000
    assert (corpora / "LICENSE-PSF").read_text().count("PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2") == 1
    raw = lzma.decompress(packed)
    assert hashlib.sha256(raw).hexdigest() == SNAPSHOT_SHA256
    docs = list(iter_snapshot())
    paths = [p for p, _ in docs]
    assert len(docs) == info["documents"] == 612 and paths == sorted(set(paths))
    assert sum(len(t.encode()) for _, t in docs) == info["bytes"]
    assert not any(p.startswith(("test/", "encodings/")) or "/tests/" in p for p in paths)
    assert "json/decoder.py" in paths


def test_snapshot_slice_budget_and_order(cache: Path):
    cfg = DataConfig(tokenizer="byte", max_chars=20_000, val_fraction=0.05, cache_dir=str(cache))
    data = prepare_data(cfg)
    splits = data.manifest["splits"]
    assert splits["val"]["chars"] == 1_000 and splits["train"]["chars"] == 19_000
    # The training stream starts with the first training-split file of the sorted snapshot.
    first = next(text for path, text in iter_snapshot() if ref_split(path, 0.05) == "train")
    head = first[:500].encode()
    assert data.train[: len(head)].tolist() == list(head)
    assert data.manifest["source"]["kind"] == "snapshot"
    assert data.manifest["source"]["fingerprint"]["sha256"] == SNAPSHOT_SHA256


# -- split and sources ------------------------------------------------------------------------------


def test_split_is_by_file_and_deterministic(code_dir: Path, cache: Path):
    data = prepare_data(byte_cfg(code_dir, cache, val_fraction=0.3))
    files = sorted(p.relative_to(code_dir).as_posix() for p in code_dir.rglob("*.py"))
    expect = {s: [f for f in files if ref_split(f, 0.3) == s] for s in ("train", "val")}
    assert expect["train"] and expect["val"]
    for split in ("train", "val"):
        texts = [(code_dir / f).read_text() for f in expect[split]]
        assert data.split(split).tolist() == byte_stream(texts)
        assert data.manifest["splits"][split]["documents"] == len(expect[split])
    # The same files elsewhere, written in another order: the same split, token for token.
    other = write_files(code_dir.parent / "copy", {f: (code_dir / f).read_bytes() for f in reversed(files)})
    again = prepare_data(byte_cfg(other, cache, val_fraction=0.3))
    assert np.array_equal(again.val, data.val) and np.array_equal(again.train, data.train)


def test_jsonl_source_and_bad_records(tmp_path: Path, cache: Path):
    lines = [json.dumps({"content": f"record {i}: é"}) for i in range(6)]
    lines[2] = "{not json"
    lines[4] = json.dumps({"other": "no content field"})
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(lines) + "\n\n")
    data = prepare_data(byte_cfg(path, cache, text_field="content", val_fraction=0.0))
    assert data.train.tolist() == byte_stream([f"record {i}: é" for i in (0, 1, 3, 5)])
    assert data.stats["bad_records"] == 2 and data.stats["documents"] == {"train": 4, "val": 0}
    assert data.val.size == 0


def test_dir_and_glob_sources(tmp_path: Path, cache: Path):
    root = write_files(tmp_path / "d", {"b.py": "b = 2\n", "a.txt": "alpha\n", "sub/c.py": "c = 3\n",
                                        ".hidden/x.py": "hidden\n", ".swp": "hidden\n"})
    data = prepare_data(byte_cfg(root, cache, val_fraction=0.0))
    assert data.train.tolist() == byte_stream(["alpha\n", "b = 2\n", "c = 3\n"])
    assert data.manifest["source"]["files"] == 3
    data = prepare_data(byte_cfg(f"{root}/**/*.py", cache, val_fraction=0.0))
    assert data.train.tolist() == byte_stream(["b = 2\n", "c = 3\n"])  # like the shell, no hidden files
    single = prepare_data(byte_cfg(root / "a.txt", cache, val_fraction=0.0))
    assert single.train.tolist() == byte_stream(["alpha\n"])


def test_undecodable_file_is_skipped_and_counted(tmp_path: Path, cache: Path):
    root = write_files(tmp_path / "d", {"good.txt": "ok\n", "bad.bin": b"\xff\xfe\x00\x81 latin-1 \xe9"})
    data = prepare_data(byte_cfg(root, cache, val_fraction=0.0))
    assert data.stats["skipped_count"] == 1 and data.stats["skipped_files"] == ["bad.bin"]
    assert data.manifest["source"]["skipped_files"] == ["bad.bin"]
    assert data.train.tolist() == byte_stream(["ok\n"])


def test_hf_json_source_on_local_file(tmp_path: Path, cache: Path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pytest.importorskip("datasets")
    texts = [f"row {i} ü" for i in range(5)]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"body": t}) + "\n" for t in texts))
    cfg = DataConfig(source="hf:json", text_field="body", tokenizer="byte", val_fraction=0.0,
                     cache_dir=str(cache),
                     hf_kwargs={"data_files": str(path), "split": "train", "cache_dir": str(tmp_path / "hf")})
    data = prepare_data(cfg)
    assert data.train.tolist() == byte_stream(texts)
    assert data.manifest["source"]["kind"] == "hf"
    with pytest.raises(ConfigError, match="not a column"):
        prepare_data(cfg.replace(text_field="missing"))


# -- errors -------------------------------------------------------------------------------------------


def test_source_errors(tmp_path: Path, cache: Path):
    missing = tmp_path / "nowhere"
    with pytest.raises(ConfigError, match=f"{missing}.*no such file.*python-stdlib"):
        prepare_data(byte_cfg(missing, cache))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no files"):
        prepare_data(byte_cfg(tmp_path / "empty", cache))
    with pytest.raises(ConfigError, match="matches no files"):
        prepare_data(byte_cfg(f"{tmp_path}/*.nothing", cache))
    with pytest.raises(ConfigError, match="Did you mean 'python-stdlib'"):
        prepare_data(byte_cfg("python-stdlb", cache))
    only_bad = write_files(tmp_path / "bad", {"x.bin": b"\xff\xff"})
    with pytest.raises(ConfigError, match="no training documents.*0 readable documents.*skipped 1 file "
                       "that is not UTF-8 text.*: x.bin"):
        prepare_data(byte_cfg(only_bad, cache, val_fraction=0.0))
    one = write_files(tmp_path / "one", {"a.txt": "only one document"})
    assert ref_split("a.txt", 0.05) == "train"
    with pytest.raises(ConfigError, match="validation split.*val_fraction = 0"):
        prepare_data(byte_cfg(one, cache))


@pytest.mark.parametrize("field, value, message", [
    ("vocab_size", 100, ">= 258"),
    ("objective", "xlm", "'clm', 'mlm'"),
    ("mask_prob", 0.0, r"\(0, 1\)"),
    ("val_fraction", 1.0, r"\[0, 1\)"),
    ("max_chars", 0, "positive integer"),
    ("tokenizer", "bpee", "'bpe', 'byte'"),
    ("source", "hf:", "name a dataset"),
    ("mask_token", "<|endoftext|>", "differ"),
    ("random_token_frac", 0.5, "<= 1"),
    ("hf_kwargs", "data.jsonl", "dict"),
])
def test_config_errors(field, value, message):
    with pytest.raises(ConfigError, match=f"DataConfig.{field}.*{message}"):
        DataConfig(**{field: value})


def test_config_round_trip_and_unknown_field():
    cfg = DataConfig(source="x.jsonl", max_chars=10, hf_kwargs={"split": "train"}, objective="mlm")
    assert DataConfig.from_dict(cfg.to_dict()) == cfg
    assert DataConfig(source=Path("corpus"), cache_dir=Path("c")).to_dict()["source"] == "corpus"
    with pytest.raises(ConfigError, match="Did you mean vocab_size"):
        DataConfig.from_dict({"vocab_sise": 300})


# -- tokenizers ---------------------------------------------------------------------------------------


def random_text(rng: random.Random, n: int) -> str:
    ranges = [(0, 0x7F), (0x80, 0x7FF), (0x800, 0xD7FF), (0xE000, 0xFFFF), (0x10000, 0x10FFFF)]
    return "".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(n))


def test_byte_tokenizer_ids_are_bytes():
    tok = byte_tokenizer()
    assert (tok.vocab_size, tok.eos_id, tok.mask_id) == (258, EOS, MASK)
    rng = random.Random(0)
    texts = [random_text(rng, 200) for _ in range(20)] + ["", "\x00\r\n\t", "x <|endoftext|> <|mask|> y"]
    for text in texts:
        expect = list(text.encode("utf-8"))
        assert tok.encode(text) == expect
        assert tok.hf.encode(text, add_special_tokens=False).ids == expect  # the tokenizer.json itself
        assert tok.decode(expect) == text
    assert tok.encode_batch(texts) == [list(t.encode()) for t in texts]


def test_bpe_trains_round_trips_and_is_cached(code_dir: Path, cache: Path, tmp_path: Path, monkeypatch):
    cfg = DataConfig(source=str(code_dir), vocab_size=300, val_fraction=0.3, cache_dir=str(cache))
    calls = []
    real_train = prepare_module.train_bpe
    monkeypatch.setattr(prepare_module, "train_bpe", lambda *a, **k: calls.append(1) or real_train(*a, **k))
    data = prepare_data(cfg)
    tok = data.tokenizer
    assert calls == [1] and data.stats["tokenizer_trained"]
    assert 258 < tok.vocab_size <= 300 and (tok.eos_id, tok.mask_id) == (0, 1)
    rng = random.Random(1)
    for text in [(code_dir / "pkg0/mod_00.py").read_text(), random_text(rng, 300), "<|mask|> as text"]:
        assert tok.decode(tok.encode(text)) == text
    sample = (code_dir / "pkg1/mod_04.py").read_text()
    assert len(tok.encode(sample)) < 0.6 * len(sample.encode())  # the merges compress this code
    # Trained on the training split only: the shard is the encoding of each train document + EOS.
    train_files = sorted(f for f in (p.relative_to(code_dir).as_posix() for p in code_dir.rglob("*.py"))
                         if ref_split(f, 0.3) == "train")
    expect = [t for f in train_files for t in [*tok.encode((code_dir / f).read_text()), tok.eos_id]]
    assert data.train.tolist() == expect
    # Saved and loaded: the same ids and the same hash.
    loaded = load_tokenizer(tok.save(tmp_path / "run"))
    assert (tmp_path / "run" / "tokenizer.json").is_file()
    assert loaded.hash == tok.hash and loaded.encode(sample) == tok.encode(sample)
    assert loaded.eos_id == tok.eos_id and loaded.mask_id == tok.mask_id
    assert prepare_data(cfg.replace(tokenizer=str(tmp_path / "run"))).tokenizer.hash == tok.hash
    # Second run: no training; other BPE settings train again.
    again = prepare_data(cfg)
    assert calls == [1] and not again.stats["tokenizer_trained"] and again.tokenizer.hash == tok.hash
    prepare_data(cfg.replace(vocab_size=280))
    assert calls == [1, 1]


def test_loaded_tokenizer_gets_missing_specials(tmp_path: Path):
    from tokenizers import Tokenizer as HF
    from tokenizers import models, pre_tokenizers

    hf = HF(models.WordLevel({"a": 0, "b": 1, "[SEP]": 2, "[UNK]": 3}, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.add_special_tokens(["[SEP]"])
    hf.save(str(tmp_path / "wl.json"))
    tok = load_tokenizer(tmp_path / "wl.json")
    assert tok.eos_id == 2 and tok.mask_id == 4 and tok.vocab_size == 5  # [SEP] found, <|mask|> added
    assert tok.encode("a b a") == [0, 1, 0]
    with pytest.raises(ConfigError, match="does not exist"):
        load_tokenizer(tmp_path / "absent.json")


# -- shard cache and manifest -------------------------------------------------------------------------


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


def test_bits_per_byte_closed_form():
    assert bits_per_byte(math.log(256), 1.0) == pytest.approx(8.0)  # uniform over bytes: 8 bits
    assert bits_per_byte(3 * math.log(2), 1.5) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="positive"):
        bits_per_byte(1.0, float("nan"))


# -- batches ------------------------------------------------------------------------------------------


def test_clm_labels_are_inputs_shifted_by_one(tmp_path: Path, cache: Path):
    root = write_files(tmp_path / "d", {"a.txt": "0123456789"})
    data = prepare_data(byte_cfg(root, cache, val_fraction=0.0))
    batches = Batches(data, "train", batch_size=2, seq_len=4, seed=0)  # 11 tokens -> windows at 0 and 4
    b = batches.get(0)
    rows = sorted(zip(b["input_ids"].tolist(), b["labels"].tolist(), strict=True))
    assert rows == [([48, 49, 50, 51], [49, 50, 51, 52]), ([52, 53, 54, 55], [53, 54, 55, 56])]
    assert b["input_ids"].dtype == torch.long and b["labels"].dtype == torch.long


def test_batches_are_pure_and_ranks_split_the_global_batch(code_dir: Path, cache: Path):
    for objective in ("clm", "mlm"):
        data = prepare_data(byte_cfg(code_dir, cache, val_fraction=0.3, objective=objective))
        a = Batches(data, "train", batch_size=8, seq_len=16, seed=3)
        for step in (0, 1, 5, a.steps_per_epoch + 2):  # the last one is in the second epoch
            whole = a.get(step)
            fresh = Batches(data, "train", batch_size=8, seq_len=16, seed=3).get(step)  # a resumed run
            for key in ("input_ids", "labels"):
                assert torch.equal(whole[key], fresh[key])
                for world in (2, 4):
                    parts = [a.get(step, rank, world)[key] for rank in range(world)]
                    assert torch.equal(torch.cat(parts), whole[key])
        other_seed = Batches(data, "train", batch_size=8, seq_len=16, seed=4).get(0)
        assert not torch.equal(other_seed["input_ids"], a.get(0)["input_ids"])
    with pytest.raises(ConfigError, match="world_size dividing"):
        a.get(0, rank=0, world_size=3)


def test_epoch_shuffle_visits_every_window_once(code_dir: Path, cache: Path):
    data = prepare_data(byte_cfg(code_dir, cache, val_fraction=0.3))
    b = Batches(data, "train", batch_size=5, seq_len=8, seed=0)
    n = b.n_windows - b.n_windows % 5  # whole steps of the first epoch
    starts = np.concatenate([b.window_starts(s) for s in range(n // 5)])
    assert len(set(starts.tolist())) == n and all(s % 8 == 0 for s in starts)
    assert starts.tolist() != sorted(starts.tolist())  # shuffled
    all_starts = np.concatenate([b.window_starts(s) for s in range(b.n_windows)])
    second_epoch = all_starts[b.n_windows:2 * b.n_windows]
    assert sorted(second_epoch.tolist()) == list(range(0, 8 * b.n_windows, 8))


def test_mlm_masking_rates(tmp_path: Path, cache: Path):
    rng = random.Random(0)
    text = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz \n") for _ in range(40_000))
    data = prepare_data(byte_cfg(write_files(tmp_path / "d", {"a.txt": text}), cache, val_fraction=0.0,
                                 objective="mlm"))
    b = Batches(data, "train", batch_size=64, seq_len=32, seed=0)
    batches = [b.get(step) for step in range(40)]
    inputs = torch.cat([x["input_ids"] for x in batches]).flatten()
    labels = torch.cat([x["labels"] for x in batches]).flatten()
    windows = torch.from_numpy(np.stack([np.asarray(data.train[s:s + 32], dtype=np.int64)
                                         for step in range(40) for s in b.window_starts(step)])).flatten()
    chosen = labels != -100
    assert torch.equal(labels[chosen], windows[chosen])  # labels are the original tokens
    assert torch.equal(inputs[~chosen], windows[~chosen])  # unchosen tokens are untouched
    assert not chosen[windows == EOS].any()  # separators are never masked

    def near(count: int, n: int, p: float) -> None:
        assert abs(count / n - p) < 5 * math.sqrt(p * (1 - p) / n), (count / n, p)

    candidates = int((windows != EOS).sum())
    n_chosen = int(chosen.sum())
    near(n_chosen, candidates, 0.25)
    to_mask = int((inputs[chosen] == MASK).sum())
    unchanged = int((inputs[chosen] == windows[chosen]).sum())
    near(to_mask, n_chosen, 0.8)
    near(unchanged, n_chosen, 0.1 + 0.1 / 256)  # a random token equals the original 1 time in 256
    near(n_chosen - to_mask - unchanged, n_chosen, 0.1 * 255 / 256)
    assert ((inputs[chosen] == MASK) | (inputs[chosen] < 256)).all()
    assert not (inputs == EOS).logical_and(windows != EOS).any()  # random tokens are never specials


def test_validation_covers_the_split(code_dir: Path, cache: Path):
    data = prepare_data(byte_cfg(code_dir, cache, val_fraction=0.3))
    val = data.val.tolist()
    b = Batches(data, "val", batch_size=8, seq_len=16, seed=0)
    assert (len(val) - 1) % 16 != 0  # so the tail window is exercised
    passes = [list(b.validation(3)) for _ in range(2)]
    for x, y in zip(*passes, strict=True):
        assert torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["labels"], y["labels"])
    targets = torch.cat([x["labels"].flatten() for x in passes[0]])
    assert targets[targets != -100].tolist() == val[1:]  # every target once, in order
    assert sum(1 for _ in b.validation(3, max_batches=2)) == 2
    ranks = [list(b.validation(3, rank=r, world_size=2)) for r in range(2)]
    assert len(ranks[0]) + len(ranks[1]) == len(passes[0])
    # Masked LM: each position is scored by exactly one window.
    mlm = Batches(data, "val", batch_size=8, seq_len=16, seed=0, objective="mlm")
    starts, first_new = mlm.validation_windows()
    scored = np.concatenate([np.arange(s + k, s + 16) for s, k in zip(starts, first_new, strict=True)])
    assert scored.tolist() == list(range(len(val)))
    labels = torch.cat([x["labels"] for x in mlm.validation(4)])
    assert (labels[-1, : first_new[-1]] == -100).all() and (labels != -100).any()


def test_bpe_training_cuts_only_long_lines():
    """A line without spaces costs BPE training the square of its length; lines over
    BPE_TRAIN_PIECE characters are cut, and a corpus without them trains exactly as before."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    from blocklab.data.tokenizer import BPE_TRAIN_PIECE, _byte_level, _pieces, train_bpe

    short = ["def f(x):\n    return x + 1\n\n\n  # comment\n", "class A:\n\tpass\n"] * 20
    assert list(_pieces(short)) == short  # whole texts, untouched
    long_line = "ab" * (BPE_TRAIN_PIECE * 3)
    mixed = ["x = 1\ny = 2\n" + long_line + "\nz = 3\n"]
    pieces = list(_pieces(mixed))
    assert "".join(pieces) == mixed[0] and max(map(len, pieces)) <= BPE_TRAIN_PIECE
    assert pieces[0] == "x = 1\ny = 2\n" and pieces[-1] == "z = 3\n"
    # the same tokenizer as training on the raw texts when no line is long
    direct = _byte_level(HFTokenizer(models.BPE()))
    direct.train_from_iterator(short, trainer=trainers.BpeTrainer(
        vocab_size=300, min_frequency=2, special_tokens=["<|endoftext|>", "<|mask|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    assert train_bpe(short, 300).hf.to_str() == direct.to_str()
    tok = train_bpe(["".join(chr(97 + (i * 7) % 11) for i in range(200_000))], 400)  # minutes uncut
    assert tok.vocab_size > 258
