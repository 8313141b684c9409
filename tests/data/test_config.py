"""DataConfig (data/config.py): each bad field named, and a round trip through its dict."""

from __future__ import annotations

from pathlib import Path

import pytest

from blocklab.data import DataConfig
from blocklab.util.errors import ConfigError


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
