"""`DataConfig`: where the text comes from, how it is tokenised, split and batched.

One flat dataclass with a default for every field, validated on construction like
`blocklab.ModelConfig`: a bad value raises `blocklab.ConfigError` naming the field, the value and
what is allowed. Whether a path exists is checked later, by `prepare_data`, so that a config saved
with a run can still be read on a machine without its data.
"""

from __future__ import annotations

import os
from dataclasses import field
from typing import Any

from blocklab.util.configbase import ConfigBase, config_dataclass

EMBEDDED = "python-stdlib"  # the default corpus: Python code
PROSE = "shakespeare"  # the second embedded corpus: English plays and poems (data/build_shakespeare.py)
EMBEDDED_CORPORA = (EMBEDDED, PROSE)  # the names data.source resolves to a snapshot shipped in the package
TOKENIZER_KINDS = ("bpe", "byte")
OBJECTIVES = ("clm", "mlm")
N_BYTES = 256


@config_dataclass
class DataConfig(ConfigBase):
    # -- corpus --------------------------------------------------------------------------------
    # "python-stdlib" or "shakespeare" (embedded snapshots), a directory, a glob, a text file, a
    # .jsonl file, or "hf:NAME" for `datasets.load_dataset(NAME, **hf_kwargs)`.
    source: str = EMBEDDED
    text_field: str = "text"  # JSONL / datasets column holding the document text
    hf_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. {"data_files": ..., "split": ...}
    max_chars: int | None = None  # cap on the characters read (split between train and val)
    val_fraction: float = 0.05  # share of documents (files, JSONL records) held out
    # -- tokenizer -----------------------------------------------------------------------------
    tokenizer: str = "bpe"  # "bpe" (trained on the train split) | "byte" | a tokenizer.json path
    vocab_size: int = 4096  # BPE only; counts the 256 byte symbols and the special tokens
    bpe_min_frequency: int = 2  # a merge needs a pair seen this often
    bpe_train_chars: int | None = None  # train BPE on at most this many characters (None: all)
    eos_token: str = "<|endoftext|>"  # document separator
    mask_token: str = "<|mask|>"  # masked-LM mask token
    # -- objective -----------------------------------------------------------------------------
    objective: str = "clm"  # "clm": next-token windows | "mlm": masked-token windows
    mask_prob: float = 0.25  # Crammed BERT (Geiping & Goldstein, 2023); BERT used 0.15
    mask_token_frac: float = 0.8  # of the chosen positions: replaced by the mask token
    random_token_frac: float = 0.1  # ... by a random token; the rest are left unchanged
    # -- cache ---------------------------------------------------------------------------------
    cache_dir: str | None = None  # None: $BLOCKLAB_CACHE, else ~/.cache/blocklab

    def __post_init__(self) -> None:
        for name in ("source", "tokenizer", "cache_dir"):  # accept pathlib paths
            if isinstance(getattr(self, name), os.PathLike):
                setattr(self, name, os.fspath(getattr(self, name)))
        _validate(self)

    @property
    def special_tokens(self) -> tuple[str, str]:
        return (self.eos_token, self.mask_token)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _validate(cfg: DataConfig) -> None:
    for name in ("source", "text_field", "tokenizer", "eos_token", "mask_token", "objective"):
        value = getattr(cfg, name)
        if not isinstance(value, str) or not value:
            cfg.fail(name, value, "it must be a non-empty string.")
    if cfg.source.startswith("hf:") and not cfg.source[3:]:
        cfg.fail("source", cfg.source, "name a dataset after 'hf:', e.g. 'hf:json' with "
                 "hf_kwargs={'data_files': 'corpus.jsonl'}.")
    if not isinstance(cfg.hf_kwargs, dict):
        cfg.fail("hf_kwargs", cfg.hf_kwargs, "it must be a dict of datasets.load_dataset keyword arguments.")
    looks_like_path = cfg.tokenizer.endswith(".json") or os.sep in cfg.tokenizer or "/" in cfg.tokenizer \
        or os.path.isdir(cfg.tokenizer)
    if cfg.tokenizer not in TOKENIZER_KINDS and not looks_like_path:
        cfg.fail("tokenizer", cfg.tokenizer, "choose 'bpe', 'byte', or give the path of a tokenizer.json "
                 "file (or of a directory holding one).")
    n_special = len(set(cfg.special_tokens))
    if n_special != 2:
        cfg.fail("mask_token", cfg.mask_token, "the mask token must differ from eos_token.")
    if not _is_int(cfg.vocab_size) or cfg.vocab_size < N_BYTES + n_special:
        cfg.fail("vocab_size", cfg.vocab_size, f"it must be an integer >= {N_BYTES + n_special} "
                 "(256 byte symbols plus the special tokens).")
    for name in ("max_chars", "bpe_train_chars"):
        value = getattr(cfg, name)
        if value is not None and (not _is_int(value) or value <= 0):
            cfg.fail(name, value, "it must be a positive integer or None.")
    if not _is_int(cfg.bpe_min_frequency) or cfg.bpe_min_frequency < 1:
        cfg.fail("bpe_min_frequency", cfg.bpe_min_frequency, "it must be an integer >= 1.")
    if not _is_number(cfg.val_fraction) or not 0.0 <= cfg.val_fraction < 1.0:
        cfg.fail("val_fraction", cfg.val_fraction, "it must be a number in [0, 1).")
    if cfg.objective not in OBJECTIVES:
        cfg.fail("objective", cfg.objective, f"choose one of {', '.join(map(repr, OBJECTIVES))}.")
    if not _is_number(cfg.mask_prob) or not 0.0 < cfg.mask_prob < 1.0:
        cfg.fail("mask_prob", cfg.mask_prob, "it must be a number in (0, 1).")
    for name in ("mask_token_frac", "random_token_frac"):
        value = getattr(cfg, name)
        if not _is_number(value) or not 0.0 <= value <= 1.0:
            cfg.fail(name, value, "it must be a number in [0, 1].")
    if cfg.mask_token_frac + cfg.random_token_frac > 1.0 + 1e-12:
        cfg.fail("random_token_frac", cfg.random_token_frac, "mask_token_frac + random_token_frac must be "
                 f"<= 1 (mask_token_frac = {cfg.mask_token_frac}).")
    if cfg.cache_dir is not None and (not isinstance(cfg.cache_dir, str) or not cfg.cache_dir):
        cfg.fail("cache_dir", cfg.cache_dir, "it must be a directory path or None.")
