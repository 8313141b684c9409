"""The tokenizers (data/tokenizer.py): bytes, BPE trained, saved, loaded and cached, the special tokens
a loaded one lacks, and the long lines BPE training cuts.

References are independent of the code under test: the byte tokenizer's
ids are the UTF-8 bytes."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from blocklab.data import DataConfig, byte_tokenizer, load_tokenizer, prepare_data
from blocklab.data import prepare as prepare_module
from blocklab.util.errors import ConfigError
from tests.data.data_reference import EOS, MASK, ref_split


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
