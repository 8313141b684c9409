"""Hugging Face modeling of a blocklab model, loaded by transformers with trust_remote_code=True.

It holds no model code: it imports blocklab (pip install "blocklab[hf]"), whose Transformer
computes the model, so that this folder computes what the installed blocklab computes.
"""

from blocklab.interop.hf_model import BlocklabForCausalLM, BlocklabForMaskedLM

__all__ = ['BlocklabForCausalLM', 'BlocklabForMaskedLM']
