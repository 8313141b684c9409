"""The file names of an export folder and the mark its weights carry, shared by the formats, and the
two modules of a remote-code export (written by the export and by the HF classes' save_pretrained)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from blocklab.util.errors import ConfigError

CONFIG_NAME, WEIGHTS_NAME, TOKENIZER_NAME = "config.json", "model.safetensors", "tokenizer.json"
# the tokenizer class an export names (tokenizer_config.json, and a remote-code export's config.json):
# transformers' generic fast tokenizer, in every version blocklab allows: loading it runs no code of ours
TOKENIZER_CLASS = "PreTrainedTokenizerFast"
# the model card and generation defaults, in both kinds of Hugging Face export
CARD_NAME, GENERATION_CONFIG_NAME = "README.md", "generation_config.json"
MARKER_KEY = "blocklab_export"  # in model.safetensors' metadata: the format that wrote it
# the dtypes a saved model may be read in (config.json's "dtype"): blocklab computes in these
DTYPES = ("float32", "bfloat16", "float16", "float64")


def check_dtype(value: object, where: str) -> str:
    """`value`, a dtype name from a saved config, if blocklab computes in it; else a ConfigError that
    starts with `where` (e.g. "FOLDER/config.json has dtype")."""
    if value not in DTYPES:
        raise ConfigError(f"{where} = {value!r}, which blocklab cannot compute in: a saved model's dtype "
                          f"must be one of {', '.join(DTYPES)}.")
    return str(value)


@dataclass(frozen=True)
class SpecialTokens:
    """The special tokens of an exported tokenizer, each as (text, id), or None where it has none."""

    eos: tuple[str, int] | None = None
    pad: tuple[str, int] | None = None
    mask: tuple[str, int] | None = None

    def ids(self) -> dict[str, int | None]:
        """bos, eos and pad ids for config.json and generation_config.json: the end-of-text token is
        also the bos (GPT-2's convention); None leaves a field unset rather than pointing at HF's
        defaults, which are ids of other vocabularies."""
        eos_id = self.eos[1] if self.eos else None
        return dict(bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=self.pad[1] if self.pad else None)


def export_metadata(fmt: str) -> dict[str, str]:
    """safetensors metadata of an export: "format": "pt" is what transformers expects."""
    return {"format": "pt", MARKER_KEY: fmt}


# the remote-code export's two modules (hf_remote.py), which transformers loads with trust_remote_code
CONFIG_MODULE, MODEL_MODULE = "configuration_blocklab", "modeling_blocklab"
_NOTE = ('"""Hugging Face {what} of a blocklab model, loaded by transformers with trust_remote_code=True.\n\n'
         "It holds no model code: it imports blocklab (pip install \"blocklab[hf]\"), whose Transformer\n"
         'computes the model, so that this folder computes what the installed blocklab computes.\n"""\n\n')


def _module_text(what: str, names: tuple[str, ...]) -> str:
    return _NOTE.format(what=what) + f"from blocklab.interop.hf_model import {', '.join(names)}\n\n" + \
        f"__all__ = {list(names)!r}\n"


def auto_map(causal: bool) -> dict[str, str]:
    """config.json's auto_map: where transformers finds the classes, in the two modules below."""
    model_class = "BlocklabForCausalLM" if causal else "BlocklabForMaskedLM"
    auto = "AutoModelForCausalLM" if causal else "AutoModelForMaskedLM"
    return {"AutoConfig": f"{CONFIG_MODULE}.BlocklabConfig", auto: f"{MODEL_MODULE}.{model_class}"}


def write_modules(folder: Path) -> None:
    """The two modules that trust_remote_code loads: imports of blocklab's classes, nothing more."""
    (folder / f"{CONFIG_MODULE}.py").write_text(_module_text("configuration", ("BlocklabConfig",)))
    (folder / f"{MODEL_MODULE}.py").write_text(
        _module_text("modeling", ("BlocklabForCausalLM", "BlocklabForMaskedLM")))
