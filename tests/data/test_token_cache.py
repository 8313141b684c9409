"""The token cache checks itself: a shard or manifest changed after it was written (bits flipped, a
file cut short, ids beyond the vocabulary, a manifest that is not JSON, has the wrong fields or
points a split at another file, a manifest deleted) is named on stderr and rebuilt, and the rebuilt
entry equals a fresh build. Files are read once per process; a changed file is read again.

Every damage is done in place, then the file's time is moved a second on, as a later process would
find it: file times tick at the kernel's clock (a few ms), so an edit right after the write could
otherwise keep the time this process saw.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from blocklab.data import DataConfig, cache_entry, digests, open_source, prepare_data
from blocklab.data import prepare as prepare_module
from timeouts import patient


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """20 small files, both splits non-empty at val_fraction 0.3."""
    root = tmp_path / "code"
    for i in range(20):
        path = root / f"pkg{i % 3}" / f"mod_{i:02d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"def f{i}(x):\n    return x * {i} + 'é{i}'\n" * (3 + i % 4), encoding="utf-8")
    return root


def cfg(corpus: Path, cache: Path, **kw) -> DataConfig:
    return DataConfig(source=str(corpus), tokenizer="byte", val_fraction=0.3, cache_dir=str(cache), **kw)


@pytest.fixture
def fresh(corpus: Path, tmp_path: Path):
    return prepare_data(cfg(corpus, tmp_path / "fresh"))


def later(path: Path) -> None:
    """Move `path`'s modification time a second on (see the module docstring)."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def edit_manifest(entry: Path, edit) -> None:
    path = entry / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))
    later(path)


def without_time(manifest: dict) -> dict:
    return {k: v for k, v in manifest.items() if k != "created"}


def assert_like_fresh(data, fresh) -> None:
    assert np.array_equal(data.train, fresh.train) and np.array_equal(data.val, fresh.val)
    assert data.train.dtype == fresh.train.dtype
    assert without_time(data.manifest) == without_time(fresh.manifest)
    assert without_time(json.loads((data.path / "manifest.json").read_text())) == without_time(fresh.manifest)


def rebuilt(corpus: Path, cache: Path, capsys, damage) -> tuple:
    """Build the entry, damage it, prepare again: the data and the lines said on stderr."""
    first = prepare_data(cfg(corpus, cache))
    damage(first.path)
    capsys.readouterr()
    data = prepare_data(cfg(corpus, cache))
    said = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert data.stats["tokenised"] and data.path == first.path
    assert not [p.name for p in cache.joinpath("shards").iterdir() if p.name.startswith((".tmp-", ".bad-"))]
    return data, said


def test_flipped_low_bits_are_found_and_rebuilt(corpus, tmp_path, fresh, capsys):
    def flip(entry: Path) -> None:
        path = entry / "train.bin"
        ids = np.fromfile(path, dtype=np.uint16)
        ids[::97] ^= 1  # ids stay in range: only the checksum can tell
        with open(path, "r+b") as fh:
            fh.write(ids.tobytes())
        later(path)

    data, said = rebuilt(corpus, tmp_path / "cache", capsys, flip)
    assert len(said) == 1 and "train.bin sha256 differs from its manifest" in said[0], said
    assert str(data.path) in said[0] and "rebuilding it" in said[0]
    assert_like_fresh(data, fresh)


def test_manifest_pointing_train_at_val_is_not_trained_on(corpus, tmp_path, fresh, capsys):
    def point(entry: Path) -> None:
        edit_manifest(entry, lambda m: m["splits"].update(train=dict(m["splits"]["val"])))

    data, said = rebuilt(corpus, tmp_path / "cache", capsys, point)
    assert len(said) == 1 and "'val.bin'" in said[0] and "train" in said[0], said
    assert_like_fresh(data, fresh)
    assert data.train.size > data.val.size


def test_out_of_range_id_is_found(corpus, tmp_path, fresh, capsys):
    def beyond(entry: Path) -> None:
        path = entry / "val.bin"
        ids = np.fromfile(path, dtype=np.uint16)
        ids[3] = 300  # the byte tokenizer has 258 ids
        ids.tofile(path)
        later(path)
        # The checksum made to match, so that only the range check can tell.
        import hashlib

        sha = hashlib.sha256(ids.tobytes()).hexdigest()
        edit_manifest(entry, lambda m: m.get("checksums", {}).get("val.bin", {}).update(sha256=sha))

    data, said = rebuilt(corpus, tmp_path / "cache", capsys, beyond)
    assert len(said) == 1 and "val.bin holds token id 300" in said[0] and "258" in said[0], said
    assert_like_fresh(data, fresh)


@pytest.mark.parametrize("cut", [1, 20])
def test_truncated_shard_is_found(corpus, tmp_path, fresh, capsys, cut):
    def truncate(entry: Path) -> None:
        path = entry / "train.bin"
        os.truncate(path, path.stat().st_size - cut)  # 1: half an id; 20: ten whole ids
        later(path)

    data, said = rebuilt(corpus, tmp_path / "cache", capsys, truncate)
    assert len(said) == 1 and "train.bin holds" in said[0] and "cut short" in said[0], said
    assert_like_fresh(data, fresh)


@pytest.mark.parametrize("text, reason", [
    ("{\"format\": 2, ", "not valid JSON"),
    ("[1, 2]", "not a JSON object"),
    ("", "not valid JSON"),
])
def test_unreadable_manifest_is_found(corpus, tmp_path, fresh, capsys, text, reason):
    def spoil(entry: Path) -> None:
        (entry / "manifest.json").write_text(text)
        later(entry / "manifest.json")

    data, said = rebuilt(corpus, tmp_path / "cache", capsys, spoil)
    assert len(said) == 1 and "manifest.json" in said[0] and reason in said[0], said
    assert_like_fresh(data, fresh)


@pytest.mark.parametrize("edit, reason", [
    (lambda m: m.pop("splits"), "splits"),
    (lambda m: m["splits"].pop("val"), "val"),
    (lambda m: m["splits"]["train"].update(tokens="12"), "tokens"),
    (lambda m: m["splits"]["val"].update(documents=-1), "documents"),
    (lambda m: m.update(dtype="float32"), "dtype"),
    (lambda m: m.update(dtype="uint32"), "dtype"),
    (lambda m: m["tokenizer"].update(hash="0" * 64), "tokenizer"),
    (lambda m: m["splits"]["val"].update(file="../val.bin"), "val.bin"),
    (lambda m: m.pop("source"), "source"),
    (lambda m: m.update(format=1), "format"),
])
def test_manifest_of_the_wrong_schema_is_found(corpus, tmp_path, fresh, capsys, edit, reason):
    data, said = rebuilt(corpus, tmp_path / "cache", capsys, lambda entry: edit_manifest(entry, edit))
    assert len(said) == 1 and "manifest.json" in said[0] and reason in said[0], said
    assert_like_fresh(data, fresh)


def test_deleted_manifest_is_rebuilt(corpus, tmp_path, fresh, capsys):
    data, said = rebuilt(corpus, tmp_path / "cache", capsys, lambda entry: (entry / "manifest.json").unlink())
    assert len(said) == 1 and "no manifest.json" in said[0], said
    assert_like_fresh(data, fresh)
    # And again: the entry is whole now, so nothing is said and nothing tokenised.
    again = prepare_data(cfg(corpus, tmp_path / "cache"))
    assert not again.stats["tokenised"] and not capsys.readouterr().err


def test_missing_shard_is_rebuilt(corpus, tmp_path, fresh, capsys):
    data, said = rebuilt(corpus, tmp_path / "cache", capsys, lambda entry: (entry / "val.bin").unlink())
    assert len(said) == 1 and "val.bin is missing" in said[0], said
    assert_like_fresh(data, fresh)


def test_files_are_read_once_per_process(corpus, tmp_path, monkeypatch, capsys):
    reads: list[str] = []
    real = cache_entry.shard_digest
    monkeypatch.setattr(cache_entry, "shard_digest", lambda path, dtype: reads.append(path.name)
                        or real(path, dtype))
    config = cfg(corpus, tmp_path / "cache")
    first = prepare_data(config)
    assert sorted(reads) == ["train.bin", "val.bin"]  # the new entry is checked once
    for _ in range(3):
        assert np.array_equal(prepare_data(config).train, first.train)
    assert len(reads) == 2  # not read again
    later(first.path / "train.bin")  # the same bytes at a new time: read again, found whole
    again = prepare_data(config)
    assert sorted(reads) == ["train.bin", "train.bin", "val.bin"] and not again.stats["tokenised"]
    assert not capsys.readouterr().err


def test_processes_finding_the_same_damage_rebuild_it_once(corpus, tmp_path, fresh, capsys):
    cache = tmp_path / "cache"
    first = prepare_data(cfg(corpus, cache))
    (first.path / "manifest.json").unlink()
    capsys.readouterr()
    start = threading.Barrier(4)
    results: list = []
    errors: list[BaseException] = []

    def worker() -> None:
        start.wait()
        try:
            results.append(prepare_data(cfg(corpus, cache)))
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for data in results:
        assert_like_fresh(data, fresh)
    said = [line for line in capsys.readouterr().err.splitlines() if "rebuilding" in line]
    assert len(said) == 1, said
    assert sorted(p.name for p in (cache / "shards").iterdir()) == sorted([first.path.name,
                                                                           f".{first.path.name}.lock"])


def test_stale_temporary_entries_are_removed(corpus, tmp_path, fresh):
    cache = tmp_path / "cache"
    shards = cache / "shards"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    here = cache_entry._where()  # this host and pid namespace
    stale = shards / f".tmp-{fresh.path.name}-{int(dead.stdout)}-0badc0de@{here}"
    bad = shards / f".bad-{fresh.path.name}-{int(dead.stdout)}-0badc0de@{here}"
    alive = shards / f".tmp-{fresh.path.name}-{os.getpid()}-0000beef@{here}"
    elsewhere = shards / f".tmp-{fresh.path.name}-{int(dead.stdout)}-0badc0de@{socket.gethostname()}-2"
    for path in (stale, bad, alive, elsewhere):
        path.mkdir(parents=True)
        (path / "train.bin").write_bytes(b"\0" * 10)
    data = prepare_data(cfg(corpus, cache))
    assert_like_fresh(data, fresh)
    assert not stale.exists() and not bad.exists()
    assert alive.exists() and elsewhere.exists()  # a live pid, or a pid of another host, is left alone


def bpe_config(corpus: Path, cache: Path) -> DataConfig:
    return DataConfig(source=str(corpus), vocab_size=300, val_fraction=0.3, cache_dir=str(cache))


def retrained(config: DataConfig, capsys, damage) -> tuple:
    """Train and cache a BPE, damage its cache entry, prepare again: the first and second data, the
    entry, the first tokenizer.json's bytes and the lines said on stderr."""
    first = prepare_data(config)
    [entry] = Path(config.cache_dir, "tokenizers").glob("bpe-*")
    original = (entry / "tokenizer.json").read_bytes()
    damage(entry)
    capsys.readouterr()
    data = prepare_data(config)
    said = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert data.stats["tokenizer_trained"] and data.tokenizer.hash == first.tokenizer.hash
    assert (entry / "tokenizer.json").read_bytes() == original  # rebuilt identically
    # the same tokenizer names the same shards: found whole, not tokenised again
    assert np.array_equal(data.train, first.train) and not data.stats["tokenised"]
    assert not [p.name for p in entry.parent.iterdir() if p.name.startswith((".tmp-", ".bad-"))]
    return first, data, entry, said


def test_damaged_bpe_file_is_trained_again(corpus, tmp_path, capsys):
    def cut(entry: Path) -> None:
        path = entry / "tokenizer.json"
        path.write_text(path.read_text()[:100])

    first, data, entry, said = retrained(bpe_config(corpus, tmp_path / "c"), capsys, cut)
    assert len(said) == 1 and f"cached tokenizer {entry}: tokenizer.json holds 100 bytes" in said[0], said
    assert "training it again" in said[0]
    assert prepare_module.load_tokenizer(entry / "tokenizer.json").hash == first.tokenizer.hash


def swap_two_ids(entry: Path) -> None:
    """Edit the cached tokenizer.json into another valid tokenizer of the same size: two merged tokens
    trade ids (270 and 280) in place, so that only the sha256 can tell."""
    path = entry / "tokenizer.json"
    text = path.read_text()
    by_id = {i: token for token, i in json.loads(text)["model"]["vocab"].items()}
    a, b = (json.dumps(by_id[i], ensure_ascii=False) for i in (270, 280))
    assert text.count(f"{a}:270") == 1 and text.count(f"{b}:280") == 1
    path.write_text(text.replace(f"{a}:270", "\0").replace(f"{b}:280", f"{b}:270").replace("\0", f"{a}:280"))
    assert path.stat().st_size == len(text.encode("utf-8"))


def test_a_cached_bpe_edited_into_another_valid_one_is_named_and_trained_again(corpus, tmp_path, capsys):
    sample = (corpus / "pkg0" / "mod_00.py").read_text()
    reference = prepare_data(bpe_config(corpus, tmp_path / "reference")).tokenizer  # in a cache of its own

    def edit(entry: Path) -> None:
        swap_two_ids(entry)
        edited = prepare_module.load_tokenizer(entry / "tokenizer.json")  # a valid tokenizer ...
        assert edited.vocab_size == reference.vocab_size and edited.hash != reference.hash
        assert edited.encode(sample) != reference.encode(sample)  # ... that tokenises otherwise

    config = bpe_config(corpus, tmp_path / "c")
    _, data, entry, said = retrained(config, capsys, edit)
    assert said == [f"blocklab: cached tokenizer {entry}: tokenizer.json sha256 differs from its manifest "
                    "(the file was changed after it was written); training it again"]
    assert data.tokenizer.hash == reference.hash and data.tokenizer.encode(sample) == reference.encode(sample)
    # and again: the entry is whole now, so nothing is said and nothing trained
    again = prepare_data(config)
    assert not again.stats["tokenizer_trained"] and not capsys.readouterr().err


@pytest.mark.parametrize("damage, reason", [
    (lambda entry: (entry / "manifest.json").unlink(), "no manifest.json"),
    (lambda entry: (entry / "tokenizer.json").unlink(), "tokenizer.json is missing"),
    (lambda entry: (entry / "manifest.json").write_text("{}"), "manifest.json has format None"),
    (lambda entry: edit_manifest(entry, lambda m: m["checksums"].pop("tokenizer.json")),
     "manifest.json lacks the size and sha256 of tokenizer.json"),
])
def test_a_cached_bpe_without_its_record_is_trained_again(corpus, tmp_path, capsys, damage, reason):
    _, _, entry, said = retrained(bpe_config(corpus, tmp_path / "c"), capsys, damage)
    assert len(said) == 1 and f"cached tokenizer {entry}: {reason}" in said[0], said


# -- the corpus's fingerprint at stat cost (digests.DigestRecord) ------------------------------------


@pytest.fixture
def recorded(monkeypatch):
    """A record made now trusts files written now (RACY_NS 0: the racy rule has its own test), and a
    fresh process's memo: what a later start finds is only the record on disk."""
    monkeypatch.setattr(digests, "RACY_NS", 0)
    digests._SEEN.clear()
    yield
    digests._SEEN.clear()


def opened_under(monkeypatch, root: Path) -> list[str]:
    """The files under `root` that this process opens from now on (builtins.open and io.open: every
    Python read of a file), relative to `root`."""
    seen: list[str] = []
    for owner in (builtins, io):
        real = owner.open

        def spy(file, *args, _real=real, **kwargs):
            if isinstance(file, (str, os.PathLike)) and Path(file).is_relative_to(root):
                seen.append(Path(file).relative_to(root).as_posix())
            return _real(file, *args, **kwargs)

        monkeypatch.setattr(owner, "open", spy)
    return seen


def next_start(config: DataConfig):
    """prepare_data as a new process would run it: nothing memoised but what is on disk."""
    digests._SEEN.clear()
    return prepare_data(config)


def rchar() -> int:
    """The bytes this process has read through read(2) so far (Linux's /proc/self/io)."""
    text = Path("/proc/self/io").read_text()
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith("rchar:")))


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux's /proc/self/io")
def test_an_unchanged_folder_is_keyed_at_a_second_start_without_reading_it(corpus, tmp_path, recorded):
    (corpus / "big.txt").write_bytes(b"x = 1\n" * (1 << 20))  # 6 MiB: its read is plain in rchar
    source = open_source(cfg(corpus, tmp_path / "c"))
    before = rchar()
    first = source.fingerprint(record := digests.DigestRecord.for_source(tmp_path / "c", str(corpus)))
    first_read = rchar() - before
    record.save()
    digests._SEEN.clear()
    before = rchar()
    second = source.fingerprint(digests.DigestRecord.for_source(tmp_path / "c", str(corpus)))
    second_read = rchar() - before
    assert second == first and source.digests_read == 0
    assert first_read >= 6 << 20 and second_read < 256 << 10, (first_read, second_read)  # the record only


def test_a_second_start_reuses_the_entry_without_opening_a_corpus_file(corpus, tmp_path, recorded,
                                                                       monkeypatch):
    config = cfg(corpus, tmp_path / "c")
    first = prepare_data(config)
    opened = opened_under(monkeypatch, corpus)
    again = next_start(config)
    assert opened == [] and again.path == first.path and not again.stats["tokenised"]


def test_a_touched_file_is_read_again_and_the_entry_reused(corpus, tmp_path, recorded, monkeypatch):
    config = cfg(corpus, tmp_path / "c")
    first = prepare_data(config)
    later(corpus / "pkg1" / "mod_04.py")  # touch: a new modification time, the same bytes
    opened = opened_under(monkeypatch, corpus)
    again = next_start(config)
    assert opened == ["pkg1/mod_04.py"] and again.path == first.path and not again.stats["tokenised"]
    opened.clear()
    assert next_start(config).path == first.path and opened == []  # its new stat recorded


def test_an_edit_with_size_and_modification_time_restored_is_caught_by_the_change_time(corpus, tmp_path,
                                                                                       recorded):
    config = cfg(corpus, tmp_path / "c")
    first = prepare_data(config)
    path = corpus / "pkg1" / "mod_04.py"
    [record] = (tmp_path / "c" / digests.FOLDER).iterdir()
    assert str(path.absolute()) in json.loads(record.read_text())["files"]  # trusted at the next start ...
    st = path.stat()
    time.sleep(0.05)  # past the clock's tick (a few ms), as any edit after a start is
    path.write_bytes(path.read_bytes().upper())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = path.stat()
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    assert now.st_ctime_ns != st.st_ctime_ns  # ... but for the change time, which no user call sets
    again = next_start(config)
    assert again.stats["tokenised"] and again.path != first.path
    tokens = [np.concatenate([data.train, data.val]) for data in (first, again)]
    assert not np.array_equal(*tokens)


@pytest.mark.parametrize("record", [
    "not json", "[]", '{"format": 99, "files": {}}', '{"format": 1, "files": []}',
    '{"format": 1, "files": {"PATH": [1, 2, 3, 4, "beef"]}}',
    '{"format": 1, "files": {"PATH": [-1, 0, 0, 0, "' + "0" * 64 + '"]}}',
    "directory",  # a record that cannot be read, nor written
])
def test_a_damaged_or_foreign_record_is_passed_over(corpus, tmp_path, recorded, monkeypatch, record):
    config = cfg(corpus, tmp_path / "c")
    first = prepare_data(config)
    [path] = (tmp_path / "c" / digests.FOLDER).iterdir()
    path.unlink()
    if record == "directory":
        path.mkdir()
    else:
        path.write_text(record.replace("PATH", str((corpus / "pkg0" / "mod_00.py").absolute())))
    opened = opened_under(monkeypatch, corpus)
    again = next_start(config)
    assert again.path == first.path and not again.stats["tokenised"] and len(opened) == 20  # all read again
    if record != "directory":  # written afresh: the next start reads nothing
        opened.clear()
        assert next_start(config).path == first.path and opened == []


def test_a_file_changed_just_now_is_not_recorded(corpus, tmp_path, monkeypatch):
    """A record taken within RACY_NS of a file's change could miss a second change in the same clock
    tick: the file is read again at the next start instead. (RACY_NS raised to 1,000 s, so that the
    corpus written just now counts as recent however slowly a loaded machine gets here.)"""
    monkeypatch.setattr(digests, "RACY_NS", 10**12)
    digests._SEEN.clear()
    config = cfg(corpus, tmp_path / "c")
    prepare_data(config)  # the corpus was written just now: nothing recorded
    opened = opened_under(monkeypatch, corpus)
    next_start(config)
    assert len(opened) == 20
    digests._SEEN.clear()


@pytest.mark.slow
def test_kill_during_tokenisation_leaves_a_cache_that_trains(tmp_path):
    """kill -9 `blocklab train` while it tokenises (its temporary shard folder exists), then run again:
    the run finishes, the dead process's leftovers are gone and the cached arrays equal a clean cache's."""
    import numpy as np

    from blocklab.data import DataConfig, prepare_data

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(40):  # 16 MB: a few seconds of tokenising, with a 4 MB chunk written at a time
        lines = (f"v{j % 97} = {i} * {j} - {j % 13}\n" for j in range(20_000))
        (corpus / f"f{i}.py").write_text("".join(lines))
    cache, out = tmp_path / "cache", tmp_path / "run"
    args = [sys.executable, "-m", "blocklab.cli", "train", f"data.source={corpus}", "data.tokenizer=byte",
            f"data.cache_dir={cache}", "model.d_model=32", "model.n_layers=2", "model.n_heads=2",
            "batch_size=4", "seq_len=32", "max_steps=3", "eval_every=3", "eval_batches=1",
            "progress=false", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + patient(120)
    while proc.poll() is None and time.monotonic() < deadline and not list(cache.glob("shards/.tmp-*")):
        time.sleep(0.005)
    time.sleep(0.2)  # into the tokenising
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed while tokenising"
    shards = cache / "shards"
    assert [p.name.startswith(".tmp-") for p in shards.iterdir()] == [True], "killed before the rename"
    done = subprocess.run(args[:-2] + ["overwrite=true", *args[-2:]], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "summary.json").is_file()
    assert not [p for p in shards.iterdir() if p.name.startswith(".")], "the killed run's leftovers stay"
    cfg = DataConfig(source=str(corpus), tokenizer="byte", cache_dir=str(cache))
    ours, clean = prepare_data(cfg), prepare_data(cfg.replace(cache_dir=str(tmp_path / "clean")))
    assert not ours.stats["tokenised"] and ours.path.name == clean.path.name
    assert np.array_equal(ours.train, clean.train) and np.array_equal(ours.val, clean.val)
