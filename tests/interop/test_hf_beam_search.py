"""Beam search (`generate(num_beams=...)`) through blocklab's cache in Hugging Face's loop
(interop/hf_model.py `BlocklabCache.reorder_cache`, runtime/cache.py `KVCache.reorder`).

References: the same model's beam search without a cache (``use_cache=False``: every step runs the
whole sequence), in float64 so that the cached and uncached logits cannot rank two beams apart by
rounding; for GPT-2, HF's own `GPT2LMHeadModel`. Every model is perturbed away from its init, and
each test checks that the beams really changed parents (a cache that skipped reordering would give
other tokens there)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from blocklab.interop import from_hf  # noqa: E402
from blocklab.interop.hf_model import hf_model  # noqa: E402
from helpers import padded_prompts  # noqa: E402
from tests.interop.test_hf_model import SMALL, _every_arch, perturbed  # noqa: E402

BEAMS, NEW = 3, 10




def _beams(hf, ids, mask, **kwargs):
    with torch.no_grad():
        return hf.generate(ids, attention_mask=mask, num_beams=BEAMS, num_return_sequences=BEAMS,
                           max_new_tokens=NEW, do_sample=False, pad_token_id=0, return_dict_in_generate=True,
                           output_scores=True, **kwargs)


@pytest.mark.parametrize("arch", _every_arch())
def test_beam_search_with_the_cache_equals_beam_search_without(arch, reorders):
    hf = hf_model(perturbed(arch, scale=0.3, **SMALL).double()).eval()
    ids, mask = padded_prompts(SMALL["vocab_size"])
    cached, uncached = _beams(hf, ids, mask), _beams(hf, ids, mask, use_cache=False)
    assert reorders, "no step changed the beams' parents: the comparison would not test reordering"
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(cached.sequences_scores, uncached.sequences_scores, rtol=0, atol=1e-12)


def test_beam_search_with_offloaded_value_tables_equals_resident(reorders):
    """Bank of Values with its tables in host memory: the cache holds slots into the batch's rows."""
    model = perturbed("sas-p+bov", scale=0.3, **SMALL).double()
    ids, mask = padded_prompts(SMALL["vocab_size"])
    resident = _beams(hf_model(model).eval(), ids, mask)
    model.offload_value_tables()
    offloaded = _beams(hf_model(model).eval(), ids, mask)
    assert reorders
    assert torch.equal(offloaded.sequences, resident.sequences)
    torch.testing.assert_close(offloaded.sequences_scores, resident.sequences_scores, rtol=0, atol=1e-12)


def test_beam_search_of_an_imported_gpt2_equals_hfs_own(reorders):
    """A GPT-2 through from_hf behind blocklab's HF class: the beams of HF's GPT2LMHeadModel."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=SMALL["vocab_size"],
                                      n_positions=32, attn_implementation="eager")).double().eval()
    with torch.no_grad():
        for p in gpt2.parameters():
            p.add_(0.3 * torch.randn_like(p))
    ours = hf_model(from_hf(gpt2)).eval()
    ids, mask = padded_prompts(SMALL["vocab_size"])
    got = _beams(ours, ids, mask)
    want = _beams(gpt2, ids, mask)
    assert reorders
    assert torch.equal(got.sequences, want.sequences)
    torch.testing.assert_close(got.sequences_scores, want.sequences_scores, rtol=0, atol=1e-10)


def test_reorder_refuses_bad_indices():
    cache = perturbed("pre-ln", **SMALL).new_cache(3, 8)
    with pytest.raises(ValueError, match=r"one integer row index per row of the batch \(3\)"):
        cache.reorder(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"must lie in \[0, 3\), got 0 \.\. 3"):
        cache.reorder(torch.tensor([0, 1, 3]))
