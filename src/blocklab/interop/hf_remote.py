"""Export any blocklab model for transformers, as remote code that imports blocklab.

The folder holds what `transformers` needs to load a model of its own kind through its Auto
classes (``trust_remote_code=True``):

    config.json                 `BlocklabConfig`: model_type "blocklab", the ModelConfig under
                                "blocklab", an auto_map naming the two modules below and, with a
                                tokenizer, its class (`pipeline` in transformers 4.x loads a
                                tokenizer only for a model type it knows or a config that names one)
    configuration_blocklab.py   one import: blocklab.interop.hf_model.BlocklabConfig
    modeling_blocklab.py        one import: the causal-LM and masked-LM classes
    model.safetensors           the Transformer's weights under ``model.`` + their export names
                                (blocklab's, less two that transformers 4.x renames: export_names.py)
    generation_config.json      HF's generation defaults: bos, eos and pad ids (causal models)
    tokenizer.json, tokenizer_config.json   when exported with a tokenizer: transformers' own fast
                                tokenizer (hf_export.write_tokenizer_config), no code of ours
    README.md                   the model card (interop/model_card.py)

The modules copy no model code, so the export computes what the installed blocklab computes; the
card says blocklab must be installed. The tokenizer needs no remote code, but transformers 5 reads
config.json before tokenizer_config.json, and an ``auto_map`` with an ``AutoConfig`` (which the model
needs) makes a bare ``AutoTokenizer.from_pretrained(folder)`` in a process that has not loaded the
model ask whether to run it; the card says to load the tokenizer alone with ``trust_remote_code=False``,
which loads it at once. Plain Pre-LN GPT-2- and Llama-shaped models are exported natively instead
(hf_export.py), loadable with no blocklab at all.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_model

from blocklab.interop.export_files import (
    CARD_NAME,
    CONFIG_MODULE,
    CONFIG_NAME,
    GENERATION_CONFIG_NAME,
    MODEL_MODULE,
    TOKENIZER_CLASS,
    TOKENIZER_NAME,
    WEIGHTS_NAME,
    SpecialTokens,
    auto_map,
    export_metadata,
    write_modules,
)
from blocklab.interop.export_names import check_export_names
from blocklab.interop.hf_export import write_generation_config
from blocklab.interop.model_card import model_card
from blocklab.runtime import LanguageModel

FILES = (f"{CONFIG_MODULE}.py", f"{MODEL_MODULE}.py", CARD_NAME, GENERATION_CONFIG_NAME)


def write_remote_code(model: LanguageModel, folder: Path, dtype: torch.dtype, specials: SpecialTokens,
                      run: Path | None = None) -> None:
    """Write the files above (less the tokenizer's, which the caller writes, finding its `specials`)
    into `folder`."""
    from blocklab.interop.hf_model import BlocklabConfig, hf_model

    hf = hf_model(model)
    tokenizer = {"tokenizer_class": TOKENIZER_CLASS} if (folder / TOKENIZER_NAME).is_file() else {}
    config = BlocklabConfig(
        blocklab=model.cfg.to_dict(), architectures=[type(hf).__name__], auto_map=auto_map(model.cfg.causal),
        torch_dtype=str(dtype).removeprefix("torch."), **specials.ids(), **tokenizer)
    (folder / CONFIG_NAME).write_text(config.to_json_string(use_diff=False))
    if model.cfg.causal:
        write_generation_config(folder, specials)
    check_export_names(hf.state_dict())
    save_model(hf, str(folder / WEIGHTS_NAME), metadata=export_metadata("hf"), force_contiguous=True)
    write_modules(folder)
    (folder / CARD_NAME).write_text(model_card(model, run, specials=specials))
