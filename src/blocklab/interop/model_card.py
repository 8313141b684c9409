"""The README.md model card of a Hugging Face export: what the model is, which paper, how it trained.

Plain text from the config, the parameter and KV-cache accounting and, when the export comes from a
run, that run's summary.json; it needs nothing beyond blocklab.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from blocklab.accounting import count_parameters
from blocklab.config import ModelConfig
from blocklab.model import Transformer
from blocklab.model.cache import cache_bytes_per_token

SIMPLIFYING = "He & Hofmann, *Simplifying Transformer Blocks*, ICLR 2024 (arXiv:2311.01906)"
VALUE_RESIDUAL = ("Zhou et al., *Value Residual Learning for Alleviating Attention Concentration in "
                  "Transformers*, ACL 2025 (arXiv:2410.17897)")
BANK_OF_VALUES = ("*Do Value Vectors in Deep Layers Need Context from the Residual Stream?* "
                  "(arXiv:2606.02780)")
# value path -> the paper that proposes it or compares against it
VALUE_PATH_PAPERS = {
    **dict.fromkeys(("resformer", "resformer-constant", "resformer-sparse", "resformer-learnable",
                     "resformer-mix", "resformer-learnable-plus", "resformer-dense", "svformer", "neutreno",
                     "denseformer", "cla", "cross-layer-attn"), VALUE_RESIDUAL),
    **dict.fromkeys(("bov", "bov-resformer", "x0-value", "v1-value", "v-scale", "value-embed"),
                    BANK_OF_VALUES),
}


def papers(model: Transformer) -> list[str]:
    """The papers whose ideas `model` uses: the simplified block (any change to the Pre-LN block) and
    its value path's paper."""
    cfg = model.cfg
    simplified = (cfg.block_layout != "pre-ln" or cfg.attn_matrix == "shaped" or cfg.value_form != "linear"
                  or cfg.proj_form != "linear" or cfg.trainable_block_gains)
    out = [SIMPLIFYING] if simplified else []
    paper = VALUE_PATH_PAPERS.get(cfg.value_path)
    return out + ([paper] if paper else [])


def _architecture_rows(model: Transformer) -> list[tuple[str, str]]:
    cfg = model.cfg
    counts = count_parameters(model)
    options = json.dumps(cfg.value_path_options, sort_keys=True) if cfg.value_path_options else "defaults"
    return [
        ("objective", "causal LM" if cfg.causal else "masked LM (encoder)"),
        ("block layout", f"`{cfg.block_layout}`, attention matrix `{cfg.attn_matrix}`, value map "
                         f"`{cfg.value_form}`, projection `{cfg.proj_form}`"),
        ("value path", f"`{cfg.value_path}` ({options})"),
        ("size", f"{cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads, context "
                 f"{cfg.context_length}, vocabulary {cfg.vocab_size}"),
        ("positions, norm, MLP", f"`{cfg.positions}`, `{cfg.norm}`, `{cfg.mlp_act}`"),
        ("parameters", f"{counts.total:,} ({counts.non_embedding:,} outside embeddings and value tables)"),
        ("KV cache per token", _cache_line(cfg) if cfg.causal else "none (an encoder)"),
    ]


def _cache_line(cfg: ModelConfig) -> str:
    cache = cache_bytes_per_token(cfg)["per_token"]
    standard = cache_bytes_per_token(cfg.replace(value_path="standard", value_path_options={}))["per_token"]
    return f"{cache:,.0f} bytes in bfloat16 ({cache / standard:.3f}x the same model's standard value path)"


def _training_lines(run: Path | None) -> list[str]:
    if run is None:
        return ["Not exported from a blocklab run: no training record."]
    try:
        s: dict[str, Any] = json.loads((run / "summary.json").read_text())
    except (OSError, ValueError):
        return [f"Exported from the run `{run.name}`, which has no summary.json (unfinished)."]
    lines = [f"Exported from the blocklab run `{run.name}` (`--arch {s.get('arch')} --size {s.get('size')} "
             f"--seed {s.get('seed')}`)."]
    if "step" in s:
        lines.append(f"- {s['step']:,} steps, {s.get('tokens', 0):,} tokens on {s.get('device', '?')}")
    if s.get("val_loss") is not None:
        bpb = s.get("val_bpb", float("nan"))
        lines.append(f"- validation loss {s['val_loss']:.4f} nats/token, {bpb:.4f} bits/byte")
    return lines


def model_card(model: Transformer, run: Path | None = None) -> str:
    """README.md for an export folder of `model` (trained in the blocklab run folder `run`, if any)."""
    cls = "AutoModelForCausalLM" if model.cfg.causal else "AutoModelForMaskedLM"
    rows = "\n".join(f"| {name} | {value} |" for name, value in _architecture_rows(model))
    cited = "\n".join(f"- {p}" for p in papers(model)) or "- none: the standard Pre-LN Transformer"
    return f"""---
library_name: transformers
tags: [blocklab, {model.cfg.value_path}, {model.cfg.block_layout}]
---
# A blocklab model: `{model.cfg.block_layout}` blocks, `{model.cfg.value_path}` value path

```python
from transformers import {cls}, AutoTokenizer

model = {cls}.from_pretrained("path/to/this/folder", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")
```

`configuration_blocklab.py` and `modeling_blocklab.py` hold no model code: they import blocklab
(`pip install "blocklab[hf]"`), whose `Transformer` computes the model, so loading needs blocklab
installed. `generate` decodes with blocklab's KV cache, which keeps only what this value path reads
again.

## Architecture

| | |
|---|---|
{rows}

## Papers

{cited}

## Training

{chr(10).join(_training_lines(run))}
"""
