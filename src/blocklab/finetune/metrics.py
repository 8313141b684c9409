"""GLUE metrics (Wang et al., 2019) on fixed predictions: accuracy, F1, Matthews correlation,
Pearson and Spearman correlation. All take plain sequences and return Python floats.

With the confusion counts of a binary task (positive class 1), TP, TN, FP, FN:

    accuracy = (TP + TN) / N
    F1       = 2 TP / (2 TP + FP + FN)                                  (MRPC, QQP)
    MCC      = (TP TN - FP FN) / sqrt((TP + FP)(TP + FN)(TN + FP)(TN + FN))     (CoLA)

MCC for K classes (Gorodkin, 2004), which reduces to the line above for K = 2: with c correct
predictions out of s, p_k predictions and t_k true labels of class k,

    MCC = (c s - sum_k p_k t_k) / sqrt((s^2 - sum_k p_k^2)(s^2 - sum_k t_k^2)).

Pearson r = cov(x, y) / (std(x) std(y)); Spearman rho is Pearson r of the ranks, where tied
values share the mean of the ranks they span (STS-B). A zero denominator gives 0 (the
convention of scikit-learn for F1 and MCC; a constant prediction has no correlation).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _pair(predictions: Sequence, labels: Sequence, dtype) -> tuple[np.ndarray, np.ndarray]:
    p, y = np.asarray(predictions, dtype=dtype), np.asarray(labels, dtype=dtype)
    if p.shape != y.shape or p.ndim != 1 or len(p) == 0:
        raise ValueError(f"predictions and labels must be two non-empty 1-D sequences of equal length; got "
                         f"shapes {p.shape} and {y.shape}.")
    return p, y


def accuracy(predictions: Sequence[int], labels: Sequence[int]) -> float:
    p, y = _pair(predictions, labels, np.int64)
    return float((p == y).mean())


def f1_binary(predictions: Sequence[int], labels: Sequence[int], positive: int = 1) -> float:
    """F1 of the positive class: 2 TP / (2 TP + FP + FN); 0 when there is no positive at all."""
    p, y = _pair(predictions, labels, np.int64)
    tp = np.sum((p == positive) & (y == positive))
    fp = np.sum((p == positive) & (y != positive))
    fn = np.sum((p != positive) & (y == positive))
    denominator = 2 * tp + fp + fn
    return float(2 * tp / denominator) if denominator else 0.0


def matthews_corrcoef(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """Matthews correlation coefficient for any number of classes (module docstring)."""
    p, y = _pair(predictions, labels, np.int64)
    classes = np.union1d(p, y)
    pred_counts = np.array([np.sum(p == k) for k in classes], dtype=np.float64)
    true_counts = np.array([np.sum(y == k) for k in classes], dtype=np.float64)
    s, c = float(len(p)), float(np.sum(p == y))
    denominator = (s * s - pred_counts @ pred_counts) * (s * s - true_counts @ true_counts)
    if denominator <= 0:
        return 0.0
    return float((c * s - pred_counts @ true_counts) / np.sqrt(denominator))


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    a, b = _pair(x, y, np.float64)
    a, b = a - a.mean(), b - b.mean()
    denominator = np.sqrt((a @ a) * (b @ b))
    return float(a @ b / denominator) if denominator > 0 else 0.0


def average_ranks(x: Sequence[float]) -> np.ndarray:
    """1-based ranks; a run of tied values gets the mean of the ranks it spans."""
    values = np.asarray(x, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values), dtype=np.float64)
    start = 0
    while start < len(values):
        end = start
        while end + 1 < len(values) and values[order[end + 1]] == values[order[start]]:
            end += 1
        ranks[order[start:end + 1]] = (start + end) / 2 + 1  # mean of ranks start+1 .. end+1
        start = end + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    a, b = _pair(x, y, np.float64)
    return pearson(average_ranks(a), average_ranks(b))
