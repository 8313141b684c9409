"""The README.md model card of a Hugging Face export: what the model is, which paper, how it trained.

The card opens with the YAML front matter the Hugging Face Hub reads (licence, library, pipeline
tag, tags: the preset, the value path and the papers' arXiv ids), then names the architecture preset
the model comes from: the one its run recorded (config.yaml's ``arch``) or else the block preset its
fields match, with any fields that differ from it; then its paper, how to load it, a table from the
config and the parameter and KV-cache accounting and, when the export comes from a run, that run's
summary.json. It needs nothing beyond blocklab.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from blocklab.accounting import count_parameters
from blocklab.catalog import (  # the papers a card cites, read from here too (tests/interop/test_exports.py)
    BANK_OF_VALUES,  # noqa: F401
    SIMPLIFYING,  # noqa: F401
    VALUE_RESIDUAL,  # noqa: F401
    VASWANI,  # noqa: F401
    block_paper,
    variant,
)
from blocklab.model.config import ModelConfig
from blocklab.model.presets import BLOCK_PRESETS, split_arch
from blocklab.model.value_paths import VALUE_PATHS
from blocklab.runtime import LanguageModel
from blocklab.runtime.cache_layout import cache_bytes_per_token

if TYPE_CHECKING:
    from blocklab.interop.export_files import SpecialTokens

# the card's licence: the project's own (pyproject.toml, LICENSE); change it where the training data asks
LICENSE = "mit"
NATIVE_CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}


# -- which preset -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Arch:
    """The architecture preset of a config: a block preset and the config's value path, the fields
    in which the config's block differs from that preset, and whether a run recorded the name."""

    block: str
    value_path: str
    differs: tuple[str, ...] = ()
    recorded: bool = False

    @property
    def name(self) -> str:
        """The name `ModelConfig.from_preset` takes: ``"sas"``, ``"sas-p+bov"``."""
        return self.block if self.value_path == "standard" else f"{self.block}+{self.value_path}"


def block_differences(cfg: ModelConfig, block: str) -> list[str]:
    """The fields that the block presets set in which `cfg` differs from the block preset `block`
    (a field that `block` leaves alone must keep its default)."""
    defaults = ModelConfig()
    fields = {f for preset in BLOCK_PRESETS.values() for f in preset.fields}
    wanted = {f: getattr(defaults, f) for f in fields} | BLOCK_PRESETS[block].fields
    return sorted(f for f, value in wanted.items() if getattr(cfg, f) != value)


def architecture(cfg: ModelConfig, recorded: str | None = None) -> Arch:
    """The preset `cfg` comes from: the block of `recorded` (the ``arch`` a run recorded) when it
    names a block preset, else the block preset that differs from `cfg` in the fewest fields."""
    block = split_arch(recorded)[0] if recorded else None
    known = block in BLOCK_PRESETS
    if not known:
        block = min(BLOCK_PRESETS, key=lambda name: len(block_differences(cfg, name)))
    assert block is not None
    return Arch(block, cfg.value_path, tuple(block_differences(cfg, block)), known)


def papers(model: LanguageModel, arch: Arch | None = None) -> list[str]:
    """The papers `model` comes from: its block preset's and its value path's."""
    arch = arch or architecture(model.cfg)
    found = [block_paper(arch.block), variant(arch.value_path).paper]  # the catalog's (blocklab/catalog.py)
    return [paper for paper in found if paper]


def _recorded_run(run: Path | None) -> dict[str, Any]:
    """``arch`` and ``size`` as the run recorded them: config.yaml, else summary.json; {} without."""
    if run is None:
        return {}
    for name, read in (("config.yaml", yaml.safe_load), ("summary.json", json.loads)):
        try:
            data = read((run / name).read_text())
        except (OSError, ValueError, yaml.YAMLError):
            continue
        if isinstance(data, dict) and isinstance(data.get("arch"), str):
            return {key: data[key] for key in ("arch", "size") if isinstance(data.get(key), str)}
    return {}


# -- the card's parts ---------------------------------------------------------------------------
def _front_matter(model: LanguageModel, arch: Arch, native: str | None, cited: list[str]) -> str:
    """The YAML block the Hub reads: licence, library, pipeline, tags (arXiv ids link the papers)."""
    tags = ["blocklab", arch.block]
    tags += [arch.value_path] if arch.value_path != "standard" else []
    tags += [native] if native else ["custom_code"]
    tags += [f"arxiv:{number}" for paper in cited for number in re.findall(r"arXiv:(\d{4}\.\d{4,5})", paper)]
    meta = {"license": LICENSE, "library_name": "transformers",
            "pipeline_tag": "text-generation" if model.cfg.causal else "fill-mask", "tags": tags}
    return f"---\n{yaml.safe_dump(meta, sort_keys=False)}---\n"


def _title(arch: Arch) -> str:
    what = BLOCK_PRESETS[arch.block].description
    if arch.value_path != "standard":
        what += f"; value path: {VALUE_PATHS[arch.value_path].description.split(':')[0]}"
    if arch.differs:
        return f"# A blocklab model near `{arch.name}` ({what}), with its own {', '.join(arch.differs)}"
    return f"# blocklab `{arch.name}`: {what}"


def _preset_line(arch: Arch, size: str | None) -> str:
    how = "as its training run recorded" if arch.recorded else "matched from the config's fields"
    sized = f", size preset `{size}`" if size else ""
    if arch.differs:
        fields = ", ".join(f"`{f}`" for f in arch.differs)
        return (f"Preset: `{arch.name}`{sized} ({how}), except for {fields}, which the config sets "
                "otherwise (the table below has the block's fields).")
    return f"Preset: `{arch.name}`{sized} ({how}): `ModelConfig.from_preset({arch.name!r}, ...)` in blocklab."


def _usage(model: LanguageModel, native: str | None) -> str:
    if native:
        return f"""Exported from blocklab as a plain `{NATIVE_CLASSES[native]}` checkpoint: it loads with
transformers alone, with no blocklab installed and no remote code, and computes the blocklab
model's logits.

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("path/to/this/folder")
tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")
```"""
    cls = "AutoModelForCausalLM" if model.cfg.causal else "AutoModelForMaskedLM"
    cache = ("`generate` decodes with blocklab's KV cache, which keeps only what this value\npath reads "
             "again. " if model.cfg.causal else "")
    return f"""Exported from blocklab as remote code:

```python
from transformers import {cls}, AutoTokenizer

model = {cls}.from_pretrained("path/to/this/folder", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")
```

`configuration_blocklab.py` and `modeling_blocklab.py` hold no model code: they import blocklab
(`pip install "blocklab[hf]"`), whose `Transformer` computes the model, so loading the model needs
blocklab installed. {cache}The tokenizer is transformers' own `PreTrainedTokenizerFast` and runs
no code from this folder. To load it alone, without blocklab, pass `trust_remote_code=False`
(`AutoTokenizer.from_pretrained("path/to/this/folder", trust_remote_code=False)`): transformers 5
reads config.json before the tokenizer's files and would otherwise ask whether to run the model's
code (after the model has loaded, as above, it knows that code and does not ask)."""


def _tokenizer_lines(specials: SpecialTokens | None, causal: bool) -> list[str]:
    if specials is None:
        return []
    if specials.pad is None:
        return ["", "The tokenizer has no end-of-text or pad token: give `padding=True` a `pad_token` first."]
    side = "left, so that generation continues each row from its last real token" if causal else "right"
    same = ", the end-of-text token too (GPT-2's convention)," if specials.pad == specials.eos else ""
    return ["", f"The tokenizer pads with `{specials.pad[0]}` (id {specials.pad[1]}){same} on the {side}; "
            "the attention mask marks the pads. A special token's text in a prompt is encoded as text, as in "
            "training (`split_special_tokens`)."]


def _architecture_rows(model: LanguageModel, arch: Arch) -> list[tuple[str, str]]:
    cfg = model.cfg
    counts = count_parameters(model)
    options = json.dumps(cfg.value_path_options, sort_keys=True) if cfg.value_path_options else "defaults"
    return [
        ("objective", "causal LM" if cfg.causal else "masked LM (encoder)"),
        ("preset", f"`{arch.name}`" + (f", differing in {', '.join(arch.differs)}" if arch.differs else "")),
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
        bpb = s.get("val_bpb")
        bpb_text = "no bits/byte (none measured)" if bpb is None else f"{bpb:.4f} bits/byte"
        lines.append(f"- validation loss {s['val_loss']:.4f} nats/token, {bpb_text}")
    return lines


def model_card(model: LanguageModel, run: Path | None = None, native: str | None = None,
               specials: SpecialTokens | None = None) -> str:
    """README.md for an export folder of `model` (trained in the blocklab run folder `run`, if any):
    a native checkpoint when `native` names its target ("gpt2", "llama"), else remote code;
    `specials`, the exported tokenizer's special tokens (None: no tokenizer)."""
    recorded = _recorded_run(run)
    arch = architecture(model.cfg, recorded.get("arch"))
    cited = papers(model, arch)
    rows = "\n".join(f"| {name} | {value} |" for name, value in _architecture_rows(model, arch))
    listed = "\n".join(f"- {p}" for p in cited) or "- none"
    tokenizer = "\n".join(_tokenizer_lines(specials, model.cfg.causal))
    return f"""{_front_matter(model, arch, native, cited)}{_title(arch)}

{_preset_line(arch, recorded.get("size"))}

{_usage(model, native)}
{tokenizer}

## Architecture

| | |
|---|---|
{rows}

## Papers

{listed}

## Training

{chr(10).join(_training_lines(run))}
"""
