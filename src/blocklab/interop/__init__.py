"""Interoperability: import Hugging Face GPT-2 / Llama, export and load blocklab models, retrofit
a pretrained baseline with a value path. See docs/interop.md.
"""

from blocklab.interop.checkpoint import load_pretrained, load_tokenizer, save_pretrained
from blocklab.interop.hf import config_from_hf, from_hf
from blocklab.interop.retrofitting import retrofit

__all__ = ["config_from_hf", "from_hf", "load_pretrained", "load_tokenizer", "retrofit", "save_pretrained"]
