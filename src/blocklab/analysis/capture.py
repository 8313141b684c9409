"""Read what every layer computes, with forward hooks, without touching the model code.

Per layer we keep the queries and keys as the attention sees them (after QK-norm, RoPE and the
value path: CLA's non-leaders report their leader's keys), the values it applies, the block output
(the hidden state), and two attention matrices built from those queries and keys:

    probs:  the softmax A of Simplifying Eq. (2)
    matrix: what the layer applies to its values, A, alpha I + beta A (Eq. 4) or
            alpha I + beta A - gamma C (Eq. 5)

`diagnostic_mode` switches every attention layer to its explicit path, so that the model itself
multiplies by exactly that matrix while it is being looked at.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from blocklab.model import ops
from blocklab.model.attention import Attention


@dataclass
class LayerTrace:
    """What one layer computed on a batch.

    The (B, H, T, T) matrices are built from q and k (and the layer's current gains) when asked for
    and not kept, so that a deep model with long sequences holds one layer's matrix at a time.
    """

    q: Tensor  # (B, H, T, D) queries
    k: Tensor  # (B, H_kv, T, D) keys
    v: Tensor  # (B, T, kv_dim) the values the attention applies (after the value path)
    hidden: Tensor  # (B, T, d_model) the block output
    attn: Attention = field(repr=False)

    @property
    def probs(self) -> Tensor:
        """(B, H, T, T) softmax attention A, Simplifying Eq. (2)."""
        return ops.attention_probs(self.q, self.k, self.attn.causal, self.attn.window)

    @property
    def matrix(self) -> Tensor:
        """(B, H, T, T) the matrix applied to the values: A, alpha I + beta A or alpha I + beta A - gamma C
        (Simplifying Eqs. 2, 4, 5)."""
        return self.attn.attention_matrix(self.q, self.k)


@contextmanager
def diagnostic_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Eval mode, no gradients and explicit attention matrices while inside; on exit (also on an
    error) every module's training flag and every attention layer's `explicit` flag are restored."""
    modes = [(m, m.training) for m in model.modules()]
    flags = [(m, m.explicit) for m in model.modules() if isinstance(m, Attention)]
    try:
        model.eval()
        for m, _ in flags:
            m.explicit = True
        with torch.no_grad():
            yield model
    finally:
        for m, flag in flags:
            m.explicit = flag
        for m, training in modes:
            m.training = training


def trace(model: nn.Module, input_ids: Tensor) -> list[LayerTrace]:
    """Run `model(input_ids)` once and return one `LayerTrace` per block.

    The model runs as it is (use `diagnostic_mode` for eval mode, no_grad and explicit matrices);
    the hooks are removed afterwards, also on error.
    """
    records: list[dict[str, Tensor]] = [{} for _ in model.blocks]

    def on_heads(i: int):
        def hook(_module, _args, output):
            records[i].update(q=output[0], k=output[1])  # the queries and keys the layer attends with
        return hook

    def on_values(i: int):
        def hook(_module, _args, output):
            records[i]["v"] = output[0].v  # LayerValues and the carry
        return hook

    def on_layer_output(i: int):  # the input of the next block (or of the final norm): what layer i
        def hook(_module, args):  # hands on, after any model-level step such as DenseFormer's average
            records[i]["hidden"] = args[0]
        return hook

    handles = []
    try:
        for i, block in enumerate(model.blocks):
            handles.append(block.attn.heads.register_forward_hook(on_heads(i)))
            handles.append(block.attn.values.register_forward_hook(on_values(i)))
            following = model.blocks[i + 1] if i + 1 < len(model.blocks) else model.norm
            handles.append(following.register_forward_pre_hook(on_layer_output(i)))
        model(input_ids)
    finally:
        for handle in handles:
            handle.remove()

    return [LayerTrace(r["q"], r["k"], r["v"], r["hidden"], block.attn)
            for block, r in zip(model.blocks, records, strict=True)]
