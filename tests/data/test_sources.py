"""Data sources and the split (data/sources.py): folders, globs, JSONL and `hf:` sources, the split by
file name, files that are not text skipped and counted; a source says what it found: a single text file
splits by paragraphs, and an empty split or unreadable JSONL records are explained with the counts, the
field and where each document went.

References are independent of the code under test: token streams are rebuilt from the raw file
bytes (the byte tokenizer's ids are the UTF-8 bytes), the split from sha256 written out here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from blocklab.data import DataConfig, prepare_data
from blocklab.data.sources import paragraphs
from blocklab.util.errors import ConfigError
from tests.data.data_reference import byte_cfg, byte_stream, ref_split, write_files


def test_a_single_text_file_is_split_by_paragraphs_into_both_splits(tmp_path: Path):
    # paragraph i: two lines starting at line 4 i + 1, then one blank line (two after the 5th)
    text, expect = "", {"train": [], "val": []}
    for i in range(40):
        first = len(text.splitlines()) + 1
        para = f"paragraph {i} a\nparagraph {i} b\n"
        text += para + ("\n\n" if i == 5 else "\n")
        expect[ref_split(f"book.txt:{first}", 0.3)].append(para)
    assert expect["train"] and expect["val"]  # the names put paragraphs on both sides
    data = prepare_data(byte_cfg(write_files(tmp_path, {"book.txt": text}) / "book.txt", tmp_path / "c",
                                 val_fraction=0.3))
    assert data.train.tolist() == byte_stream(expect["train"])
    assert data.val.tolist() == byte_stream(expect["val"])


def test_a_text_file_without_blank_lines_splits_by_lines():
    assert list(paragraphs("a\nb\nc")) == [(1, "a\n"), (2, "b\n"), (3, "c")]
    assert list(paragraphs("\n\na\nb\n \nc\n")) == [(3, "a\nb\n"), (6, "c\n")]  # a spaces-only line is blank


def test_the_default_val_fraction_trains_on_one_text_file(tmp_path: Path):
    """The README lists a text file as a source: with the default settings it must train, not be refused."""
    path = write_files(tmp_path, {"notes.txt": "".join(f"line {i}\n" for i in range(400))}) / "notes.txt"
    data = prepare_data(byte_cfg(path, tmp_path / "c"))
    assert data.stats["documents"]["val"] > 0 and data.stats["documents"]["train"] > 300


def test_an_empty_training_split_names_the_files_on_each_side(tmp_path: Path):
    assert ref_split("latin1.txt", 0.05) == "val"
    root = write_files(tmp_path / "d", {"latin1.txt": "readable text\n"})
    with pytest.raises(ConfigError) as err:
        prepare_data(byte_cfg(root, tmp_path / "c"))
    message = str(err.value)
    assert message.startswith("no training documents in files under")
    assert "of 1 readable documents, 0 to training and 1 to validation (latin1.txt)" in message
    assert "give that one file as the source" in message


def test_jsonl_without_the_text_field_names_the_field_and_the_counts(tmp_path: Path):
    lines = [json.dumps({"content": f"x{i}", "id": i}) for i in range(50)] + ["not json"]
    path = write_files(tmp_path, {"recs.jsonl": "\n".join(lines) + "\n"}) / "recs.jsonl"
    with pytest.raises(ConfigError) as err:
        prepare_data(byte_cfg(path, tmp_path / "c"))
    message = str(err.value)
    assert "0 of 51 JSONL records read with a string field 'text'" in message
    assert "50 without it (the first one's fields: ['content', 'id'])" in message
    assert "set data.text_field" in message and "1 not JSON objects" in message


def test_partly_readable_jsonl_says_how_many_records_were_skipped(tmp_path: Path):
    lines = [json.dumps({"text": f"record {i}"}) for i in range(6)]
    lines[1], lines[4] = "{broken", json.dumps({"body": "elsewhere"})
    path = write_files(tmp_path, {"r.jsonl": "\n".join(lines) + "\n"}) / "r.jsonl"
    data = prepare_data(byte_cfg(path, tmp_path / "c", val_fraction=0.0))
    assert data.stats["records"] == ("4 of 6 JSONL records read with a string field 'text'; 1 without it "
                                     "(the first one's fields: ['body']): set data.text_field to the field "
                                     "that holds the text; 1 not JSON objects")


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
