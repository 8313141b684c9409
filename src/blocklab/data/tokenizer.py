"""Tokenizers: a trained byte-level BPE, a plain byte tokenizer, or any saved `tokenizer.json`.

All three are Hugging Face `tokenizers` objects behind one small wrapper, so a run saves exactly
one file (`dir/tokenizer.json`) whatever the kind, and the wrapper's `hash` (sha256 of the
canonical JSON) names the tokenizer in cache keys and manifests.

* byte-level BPE (GPT-2 style, Radford et al. 2019): the 256 byte symbols, then merges learned on
  the training split; the special tokens take ids 0 and 1.
* bytes: a ByteLevel BPE with no merges, built so that token id = byte value (0..255) and the
  special tokens follow (256, 257). A text of n UTF-8 bytes is n tokens.

Special tokens: an end-of-text token that separates packed documents and a mask token for masked
LM. Literal occurrences of their strings in the corpus are encoded as ordinary text
(`encode_special_tokens`), so no document can inject a separator.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from functools import cached_property
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from blocklab.util.errors import ConfigError
from blocklab.util.filemodes import atomic_write_text

# Names other tokenizers give their separator and mask tokens, tried when loading a tokenizer.json.
KNOWN_EOS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "[SEP]", "<|eot_id|>")
KNOWN_MASK = ("<|mask|>", "[MASK]", "<mask>")


def byte_symbols() -> list[str]:
    """GPT-2's printable stand-in character for each byte value 0..255 (the ByteLevel alphabet).

    Printable Latin-1 bytes stand for themselves; the other 68 bytes map, in order, to the code
    points 256, 257, ... so that every byte has a visible, non-whitespace symbol.
    """
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)}
    symbols, extra = [], 0
    for b in range(256):
        if b in printable:
            symbols.append(chr(b))
        else:
            symbols.append(chr(256 + extra))
            extra += 1
    return symbols


class Tokenizer:
    """A `tokenizers.Tokenizer` with named separator and mask tokens."""

    def __init__(self, hf: HFTokenizer, eos_token: str, mask_token: str | None = None) -> None:
        self.hf = hf
        # Treat literal special-token strings in the text as text (never as separators).
        self.hf.encode_special_tokens = True
        self.eos_token, self.mask_token = eos_token, mask_token
        self.eos_id = self._id(eos_token)
        self.mask_id = self._id(mask_token) if mask_token is not None else None

    def _id(self, token: str) -> int:
        token_id = self.hf.token_to_id(token)
        if token_id is None:
            raise ConfigError(f"token {token!r} is not in the tokenizer's vocabulary.")
        return token_id

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    @property
    def special_ids(self) -> tuple[int, ...]:
        return tuple(sorted(self.hf.get_added_tokens_decoder()))

    @cached_property
    def ids_are_bytes(self) -> bool:
        """True for the byte tokenizer (id = byte value), whose encoding then skips `tokenizers`."""
        if self.mask_token is None:  # the byte tokenizer has one
            return False
        return self.hash == byte_tokenizer(self.eos_token, self.mask_token).hash

    @cached_property
    def token_bytes(self) -> np.ndarray:
        """UTF-8 bytes of text each token id stands for (int64, one per id); 0 for special tokens.

        A split's tokens sum to the split's bytes (separators carry no text), so bits per byte can
        use the bytes of exactly the tokens scored. In a byte-level vocabulary every alphabet
        symbol is one byte; other tokenizers are measured by decoding each token alone.
        """
        byte_level = "ByteLevel" in json.dumps(json.loads(self.to_str()).get("decoder"))
        alphabet = set(byte_symbols())
        special = set(self.special_ids)
        out = np.zeros(self.vocab_size, dtype=np.int64)
        for i in range(self.vocab_size):
            token = self.hf.id_to_token(i)
            if i in special or token is None:
                continue
            if byte_level and all(c in alphabet for c in token):
                out[i] = len(token)
            else:
                out[i] = len(self.hf.decode([i]).encode("utf-8"))
        return out

    def encode(self, text: str) -> list[int]:
        if self.ids_are_bytes:
            return list(text.encode("utf-8"))
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if self.ids_are_bytes:
            return [list(text.encode("utf-8")) for text in texts]
        # encode_batch_fast (tokenizers >= 0.21) skips the character offsets we never use.
        encode = getattr(self.hf, "encode_batch_fast", self.hf.encode_batch)
        return [e.ids for e in encode(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=False)

    def to_str(self) -> str:
        return self.hf.to_str()

    @cached_property
    def hash(self) -> str:
        """sha256 of the tokenizer's JSON with sorted keys: equal for equal tokenizers."""
        canonical = json.dumps(json.loads(self.to_str()), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def save(self, directory: str | Path) -> Path:
        """Write `directory/tokenizer.json` (atomically) and return its path."""
        path = Path(directory) / "tokenizer.json"
        atomic_write_text(path, self.to_str())
        return path

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, eos_id={self.eos_id}, mask_id={self.mask_id})"


def _byte_level(hf: HFTokenizer) -> HFTokenizer:
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    return hf


def byte_tokenizer(eos_token: str = "<|endoftext|>", mask_token: str = "<|mask|>") -> Tokenizer:
    """Token id = byte value (0..255); the special tokens take ids 256 and 257."""
    vocab = {symbol: b for b, symbol in enumerate(byte_symbols())}
    hf = _byte_level(HFTokenizer(models.BPE(vocab=vocab, merges=[])))
    hf.add_special_tokens([eos_token, mask_token])
    return Tokenizer(hf, eos_token, mask_token)


# BPE training merges inside each pre-tokenized word, at a cost that grows with the square of the
# word's length: one 2 MB line without spaces (minified code, a data dump) never finishes. Training
# therefore sees lines cut into pieces of at most this many characters; merges across a cut are not
# learned, which costs nothing at natural word lengths.
BPE_TRAIN_PIECE = 2048


def _pieces(texts: Iterable[str], size: int = BPE_TRAIN_PIECE) -> Iterator[str]:
    """Each text whole, unless it has a line longer than `size`: then the runs of short lines whole
    and each long line cut into pieces of `size` characters. A corpus without long lines (the
    embedded one: 175 at most) trains exactly the tokenizer it did before the cut existed."""
    for text in texts:
        if all(len(line) <= size for line in text.splitlines()):
            yield text
            continue
        run: list[str] = []
        for line in text.splitlines(keepends=True):
            if len(line) <= size:
                run.append(line)
                continue
            if run:
                yield "".join(run)
                run = []
            yield from (line[start:start + size] for start in range(0, len(line), size))
        if run:
            yield "".join(run)


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int = 2,
              eos_token: str = "<|endoftext|>", mask_token: str = "<|mask|>") -> Tokenizer:
    """Byte-level BPE (Sennrich et al. 2016; GPT-2's byte alphabet) trained on `texts`, read as
    lines cut at BPE_TRAIN_PIECE characters, so that training time grows linearly with the corpus.

    The vocabulary holds the special tokens (ids 0, 1), the 256 byte symbols and up to
    `vocab_size - 258` merges; a small corpus may yield fewer merges.
    """
    hf = _byte_level(HFTokenizer(models.BPE()))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[eos_token, mask_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    hf.train_from_iterator(_pieces(texts), trainer=trainer)
    return Tokenizer(hf, eos_token, mask_token)


def load_tokenizer(path: str | Path, eos_token: str | None = None,
                   mask_token: str | None = None) -> Tokenizer:
    """Load a `tokenizer.json` (or a directory holding one).

    The separator and mask tokens are `eos_token` / `mask_token` when given, else the first known
    name found in the vocabulary (``<|endoftext|>``, ``</s>``, ``[SEP]`` ...; ``<|mask|>``,
    ``[MASK]``, ``<mask>``). A tokenizer without a separator gets ``<|endoftext|>`` added; one
    without a mask token gets ``<|mask|>`` added (both appended after the existing ids).
    """
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(f"tokenizer file {str(path)!r} does not exist: give 'bpe', 'byte', or the path "
                          "of a tokenizer.json file (or of a directory holding one).")
    try:
        hf = HFTokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception on malformed files
        raise ConfigError(f"{str(path)!r} is not a Hugging Face tokenizer.json file: {err}") from err
    return _with_specials(hf, eos_token, mask_token)


def tokenizer_from_json(text: str, eos_token: str | None = None, mask_token: str | None = None,
                        name: str = "the tokenizer") -> Tokenizer:
    """`load_tokenizer` for the text of a tokenizer.json already read (and checked: the token cache),
    so that the bytes checked are the bytes used; `name` says where the text came from."""
    try:
        hf = HFTokenizer.from_str(text)
    except Exception as err:  # tokenizers raises a bare Exception on malformed files
        raise ConfigError(f"{name} is not a Hugging Face tokenizer.json file: {err}") from err
    return _with_specials(hf, eos_token, mask_token)


def _with_specials(hf: HFTokenizer, eos_token: str | None, mask_token: str | None) -> Tokenizer:
    """`hf` with its separator and mask tokens picked, or added (see `load_tokenizer`)."""
    vocab = hf.get_vocab(with_added_tokens=True)

    def pick(given: str | None, known: tuple[str, ...]) -> str:
        if given is not None:
            return given
        return next((name for name in known if name in vocab), known[0])

    eos, mask = pick(eos_token, KNOWN_EOS), pick(mask_token, KNOWN_MASK)
    missing = [tok for tok in (eos, mask) if tok not in vocab]
    if missing:
        hf.add_special_tokens(missing)
    return Tokenizer(hf, eos, mask)
