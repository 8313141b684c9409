"""The embedded corpus snapshot (data/snapshot.py): pinned, sorted, and sliced to a character budget in
order.

References are independent of the code under test: its sha256 pinned here at build time, the split
from sha256 written out here."""

from __future__ import annotations

import hashlib
import lzma
from pathlib import Path

from blocklab.data import DataConfig, iter_snapshot, prepare_data, snapshot_info
from blocklab.data import prepare as prepare_module
from tests.data.data_reference import ref_split

SNAPSHOT_SHA256 = "6ae4f8656aefe05edb99757cef0d8d5198e820d0f7862e00d450a9c29f2e99cf"  # pinned at build time


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
