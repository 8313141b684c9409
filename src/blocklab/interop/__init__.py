"""Interoperability: import Hugging Face GPT-2 / Llama, export and load blocklab models (any of them
as a Hugging Face model too), retrofit a pretrained baseline with a value path. See docs/interop.md.
"""

from blocklab.interop.checkpoint import load_pretrained, load_tokenizer, save_pretrained
from blocklab.interop.hf import config_from_hf, from_hf
from blocklab.interop.retrofitting import retrofit
from blocklab.interop.upgrade import upgrade_state_dict


def to_hf(model):
    """`model` (a blocklab `Transformer`) as a transformers model, `BlocklabForCausalLM` or
    `BlocklabForMaskedLM`, sharing its parameters; needs the hf extra (interop/hf_model.py)."""
    from blocklab.interop.hf_model import hf_model  # imports transformers: only when asked

    return hf_model(model)


__all__ = ["config_from_hf", "from_hf", "load_pretrained", "load_tokenizer", "retrofit", "save_pretrained",
           "to_hf", "upgrade_state_dict"]
