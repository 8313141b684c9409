"""The statistics the papers use to look inside a model, as pure functions of tensors.

    token importance   a_j = (1/l) sum_i A_ij,  a'_j = a_j / sum_j a_j        Value Residual Eq. (11)
    importance entropy e = - sum_j a'_j log a'_j                              Value Residual Eq. (11)
    value spectrum     (1/l) sum_i v_i v_i^T = sum_j w_j lambda_j w_j^T        Value Residual Eq. (12)
    token similarity   s = 1/(l(l-1)) sum_i sum_{j != i} cos(h_i, h_j)        Value Residual Eq. (13)
    token norms        ||v_i||_2, ||h_i||_2                                    Value Residual Fig. 2

Leading dimensions are batch dimensions: each function reduces only the last one or two. Results
are float64, whatever the input dtype, because the reductions run over thousands of positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def token_importance(attn: Tensor) -> Tensor:
    """The normalised importance a' of every key, Value Residual Learning Eq. (11).

    a_j = (1/l) sum_i A_ij is the mean attention that key j receives over the l queries, and
    a'_j = a_j / sum_j a_j. `attn` is (..., T_q, T_k) with non-negative entries (a softmax A, not
    the shaped matrix alpha I + beta A - gamma C, whose entries can be negative); returns (..., T_k).
    """
    if attn.dim() < 2:
        raise ValueError(f"attention must have shape (..., T_q, T_k); got {tuple(attn.shape)}")
    if (attn < 0).any():
        raise ValueError("token importance needs a non-negative attention matrix (the softmax A); "
                         "the shaped matrix alpha I + beta A - gamma C has negative entries")
    a = attn.mean(dim=-2, dtype=torch.float64)  # reduce before upcasting: A can be large
    return a / a.sum(dim=-1, keepdim=True)


def importance_entropy(attn: Tensor) -> Tensor:
    """Entropy of token importance e = -sum_j a'_j log a'_j, Value Residual Learning Eq. (11).

    Low entropy means attention concentrates on a few tokens (an attention sink); uniform
    importance over T keys gives the maximum, log T. (The paper's text after Eq. 11 says the
    opposite, but its Fig. 1 caption and every figure read lower entropy as more concentrated.)
    `attn` is (..., T_q, T_k); returns (...). 0 log 0 counts as 0.
    """
    return torch.special.entr(token_importance(attn)).sum(dim=-1)


def token_similarity(hidden: Tensor) -> Tensor:
    """Average pairwise cosine similarity of the l tokens, Value Residual Learning Eq. (13):

        s = 1 / (l (l - 1)) sum_i sum_{j != i} cos(h_i, h_j).

    With unit vectors u_i, sum_{i, j} u_i . u_j = ||sum_i u_i||^2, so the double sum costs O(l d)
    instead of O(l^2 d). A zero vector has cosine 0 with everything. `hidden` is (..., l, d);
    returns (...).
    """
    n = hidden.shape[-2] if hidden.dim() >= 2 else 0
    if n < 2:
        raise ValueError(f"token similarity needs at least 2 tokens in (..., l, d); got "
                         f"{tuple(hidden.shape)}")
    u = F.normalize(hidden.to(torch.float64), dim=-1)
    all_pairs = u.sum(dim=-2).square().sum(dim=-1)
    self_pairs = u.square().sum(dim=(-2, -1))  # l, less one per zero vector
    return (all_pairs - self_pairs) / (n * (n - 1))


def value_spectrum(values: Tensor) -> Tensor:
    """Eigenvalues, largest first, of (1/l) sum_i v_i v_i^T, Value Residual Learning Eq. (12).

    `values` is (..., l, d): the l value vectors of one sequence (all heads, d = kv_dim). The
    matrix is the uncentred second moment of the values, as in the paper. When l < d its rank is
    at most l: the non-zero eigenvalues are those of the l x l Gram matrix (1/l) V V^T, which is
    cheaper, and the rest are 0. Returns (..., d); round-off below zero is clipped to 0.
    """
    if values.dim() < 2:
        raise ValueError(f"values must have shape (..., l, d); got {tuple(values.shape)}")
    v = values.to(torch.float64)
    n, d = v.shape[-2:]
    if n < d:
        eig = torch.linalg.eigvalsh(v @ v.mT / n)
        eig = F.pad(eig, (d - n, 0))  # eigvalsh sorts ascending: the zeros go first
    else:
        eig = torch.linalg.eigvalsh(v.mT @ v / n)
    return eig.flip(-1).clamp_min(0)


def normalized_spectrum(eigenvalues: Tensor) -> Tensor:
    """lambda_j / sum_k lambda_k: the share of the values' second moment along each eigenvector."""
    total = eigenvalues.sum(dim=-1, keepdim=True)
    return eigenvalues / total.clamp_min(torch.finfo(eigenvalues.dtype).tiny)


def token_norms(x: Tensor) -> Tensor:
    """||x_i||_2 of every token, (..., T, d) -> (..., T): value-state drains and hidden-state peaks
    (Value Residual Learning Fig. 2; Guo et al. 2024, Sun et al. 2024)."""
    return torch.linalg.vector_norm(x.to(torch.float64), dim=-1)
