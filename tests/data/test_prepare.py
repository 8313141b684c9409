"""`blocklab prepare`: the cache entry `train` reads, filled once, and the data path that
fills it (`data.tokenise`: chunks encoded on a worker thread while the next is read)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer as HFTokenizer

from blocklab.cli import main
from blocklab.data import DataConfig, Tokenizer, prepare_data, tokenise
from blocklab.data import prepare as prepare_module
from helpers import small_run_args, write_code_corpus
from tests.data.data_reference import ref_split


def refuse(*args, **kwargs):
    raise AssertionError("tokenised or trained a tokenizer again")


def test_prepare_then_train_tokenises_nothing(tmp_path: Path, monkeypatch, capsys):
    """prepare trains the BPE and fills the entry (a progress line in a log, the summary on stdout); a second
    prepare is a no-op; train with the same data settings (and other overrides) reads that entry."""
    (tmp_path / "code").mkdir()
    corpus, cache = write_code_corpus(tmp_path / "code"), tmp_path / "cache"
    data_args = [*small_run_args(corpus, cache), "data.tokenizer=bpe", "data.vocab_size=300"]
    assert main(["prepare", *data_args, "progress=true"]) == 0
    out, err = capsys.readouterr()
    assert "training a 300-token BPE tokenizer" in err and "blocklab: tokenizing 100%" in err
    lines = out.splitlines()
    assert lines[0].startswith("prepared ") and " tokens/s; the BPE tokenizer trained first" in lines[0]
    entry = Path(lines[-1].removeprefix("cache entry: "))
    manifest = json.loads((entry / "manifest.json").read_text())
    tokens = sum(s["tokens"] for s in manifest["splits"].values())
    assert entry.parent == cache / "shards" and f"prepared {tokens:,} tokens" in out

    assert main(["prepare", *data_args]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"already prepared: {tokens:,} tokens") and out.endswith(f"cache entry: {entry}\n")

    for name in ("encode_batch", "encode"):
        monkeypatch.setattr(Tokenizer, name, refuse)
    monkeypatch.setattr(prepare_module, "train_bpe", refuse)
    monkeypatch.setattr(prepare_module, "write_documents", refuse)
    run = tmp_path / "run"
    assert main(["train", *data_args, "max_steps=2", "optim.lr=1e-3", "--out", str(run)]) == 0, \
        capsys.readouterr().err
    used = json.loads((run / "data_manifest.json").read_text())
    assert used["checksums"] == manifest["checksums"]
    assert used["tokenizer"]["hash"] == manifest["tokenizer"]["hash"]

    # init_from: the source's tokenizer.json replaces a BPE to train, in prepare as in train
    monkeypatch.undo()
    capsys.readouterr()
    (tmp_path / "more").mkdir()
    more = [f"data.source={write_code_corpus(tmp_path / 'more')}", f"data.cache_dir={cache}", "batch_size=2",
            "seq_len=16", "progress=false", f"init_from={run}"]
    (tmp_path / "more" / "extra.py").write_text("y = 2\n" * 50)  # another corpus than the run's
    assert main(["prepare", *more]) == 0
    out = capsys.readouterr().out
    assert out.startswith("prepared ") and "BPE" not in out
    for name in ("encode_batch", "encode"):
        monkeypatch.setattr(Tokenizer, name, refuse)
    monkeypatch.setattr(prepare_module, "train_bpe", refuse)
    monkeypatch.setattr(prepare_module, "write_documents", refuse)
    assert main(["train", *more, "max_steps=1", "--out", str(tmp_path / "continued")]) == 0, \
        capsys.readouterr().err


def test_prepare_refuses_bad_input_in_one_line(tmp_path: Path, capsys):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("data: [unclosed\n")
    for args, says in ((["data.source=" + str(tmp_path / "absent")], "no such file or directory"),
                       (["nope=1"], "nope"), ([str(bad_yaml)], "is not valid YAML"),
                       (["data.vocab_size=7"], "vocab_size")):
        assert main(["prepare", *args, f"data.cache_dir={tmp_path / 'cache'}"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("blocklab: error: ") and err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "cache").exists()


def test_chunks_on_a_worker_thread_equal_encoding_each_document_alone(tmp_path: Path, monkeypatch):
    """Many small chunks (two in flight), non-ASCII text: the shards equal each record encoded alone by the
    tokenizers library, in file order, split by the rule; the byte counts are the UTF-8 bytes."""
    texts = [f"def f{i}(x):\n    return x * {i}  # é{'ü' * (i % 3)} ✓\n" * (1 + i % 4) for i in range(60)]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    cfg = DataConfig(source=str(corpus), vocab_size=300, val_fraction=0.3, cache_dir=str(tmp_path / "cache"))
    monkeypatch.setattr(tokenise, "CHUNK_CHARS", 300)
    added = []
    original = prepare_module._ShardFiles.add
    monkeypatch.setattr(prepare_module._ShardFiles, "add", lambda self, chunk, tok: (
        added.append(len(chunk)), original(self, chunk, tok)))
    data = prepare_data(cfg)
    assert len(added) > 10 and sum(added) == len(texts)
    hf = HFTokenizer.from_str(data.tokenizer.to_str())
    eos = hf.token_to_id(cfg.eos_token)
    want: dict[str, list[int]] = {"train": [], "val": []}
    sizes = {"train": 0, "val": 0}
    for line, text in enumerate(texts, start=1):
        split = ref_split(f"corpus.jsonl:{line}", cfg.val_fraction)
        want[split] += [*hf.encode(text, add_special_tokens=False).ids, eos]
        sizes[split] += len(text.encode("utf-8"))
    assert want["val"] and want["train"]
    for split in ("train", "val"):
        assert np.array_equal(data.split(split), np.array(want[split])), split
        assert data.manifest["splits"][split]["bytes"] == sizes[split]


def test_an_error_on_the_worker_thread_leaves_no_entry(tmp_path: Path, monkeypatch):
    (tmp_path / "code").mkdir()
    corpus = write_code_corpus(tmp_path / "code")
    cfg = DataConfig(source=str(corpus), tokenizer="byte", cache_dir=str(tmp_path / "cache"))
    monkeypatch.setattr(tokenise, "CHUNK_CHARS", 2000)
    calls = []
    original = Tokenizer.encode_batch

    def second_fails(self, texts):
        calls.append(len(texts))
        if len(calls) == 2:
            raise RuntimeError("the encoder failed")
        return original(self, texts)

    monkeypatch.setattr(Tokenizer, "encode_batch", second_fails)
    with pytest.raises(RuntimeError, match="the encoder failed"):
        prepare_data(cfg)
    assert len(calls) in (2, 3)  # the failing chunk, and at most the one read ahead of it
    assert not any((tmp_path / "cache" / "shards").iterdir())  # no entry, no temporary folder


@pytest.mark.parametrize("bad", [1, 7])
def test_prepare_and_train_name_the_files_they_skip_alike(bad, tmp_path: Path, capsys):
    """prepare dropped a Latin-1 file without a word ("13 documents"), train said "skipped 1 files":
    both now say how many, which and why, in the same words, and where all are listed."""
    (tmp_path / "code").mkdir()
    corpus = write_code_corpus(tmp_path / "code")
    names = [f"latin1-{i}.txt" for i in range(bad)]
    for name in names:
        (corpus / name).write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    args = [*small_run_args(corpus, tmp_path / "cache"), "data.val_fraction=0.3"]
    assert main(["prepare", *args]) == 0
    out, err = capsys.readouterr()
    entry = Path(out.splitlines()[-1].removeprefix("cache entry: "))
    files = "1 file that is" if bad == 1 else f"{bad} files that are"
    shown = ", ".join(names) if bad == 1 else ", ".join(names[:5]) + f" and {bad - 5} more"
    said = f"skipped {files} not UTF-8 text (binary or another encoding): {shown}; all are listed in "
    assert err == f"blocklab: {said}{entry / 'manifest.json'}\n"
    assert json.loads((entry / "manifest.json").read_text())["source"]["skipped_files"] == names
    run = tmp_path / "run"
    assert main(["train", *args, "max_steps=1", "--out", str(run)]) == 0
    err = capsys.readouterr().err
    assert f"blocklab: {said}{run / 'data_manifest.json'}\n" in err and err.count("blocklab: skipped") == 1
    assert json.loads((run / "data_manifest.json").read_text())["source"]["skipped_files"] == names
