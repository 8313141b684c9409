"""Data sources say what they found: a single text file splits by paragraphs, and an empty split or
unreadable JSONL records are explained with the counts, the field and where each document went."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blocklab.data import prepare_data
from blocklab.data.sources import paragraphs
from blocklab.util.errors import ConfigError
from tests.data.test_batches import byte_cfg, byte_stream, ref_split, write_files


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
