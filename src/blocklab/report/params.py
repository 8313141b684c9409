"""`blocklab params`: parameter counts and analytic FLOPs per token of the presets at each size."""

from __future__ import annotations

from typing import Any

import torch


def params_rows(archs: list[str] | None, sizes: list[str]) -> list[dict[str, Any]]:
    """Parameter counts and analytic training FLOPs per token of each preset at each size, the models
    built on the meta device (no memory). `archs` None: every block preset, then every value path on a
    Pre-LN block."""
    from blocklab.accounting import count_parameters, flops_per_token
    from blocklab.model.config import ModelConfig
    from blocklab.model.presets import BLOCK_PRESETS
    from blocklab.model.value_paths import VALUE_PATHS
    from blocklab.runtime import LanguageModel

    if archs is None:
        archs = list(BLOCK_PRESETS) + [f"pre-ln+{vp}" for vp in VALUE_PATHS if vp != "standard"]
    rows = []
    for size in sizes:
        for arch in archs:
            cfg = ModelConfig.from_preset(arch, size=size)
            with torch.device("meta"):
                model = LanguageModel(cfg)
            counts = count_parameters(model)
            rows.append(dict(arch=arch, size=size, total=counts.total, embedding=counts.embedding,
                             value_tables=counts.value_tables, non_embedding=counts.non_embedding,
                             flops_per_token=flops_per_token(model)))
    return rows


def params_table(rows: list[dict[str, Any]]) -> str:
    """`params_rows` as a plain-text table, millions of parameters and FLOPs."""
    head = (f"{'arch':<32} {'size':<15} {'total':>9} {'embed':>9} {'v-tables':>9} {'non-emb':>9} "
            f"{'FLOPs/tok':>10}")
    lines = [head, "-" * len(head)]
    lines += [f"{r['arch']:<32} {r['size']:<15} {r['total'] / 1e6:>8.2f}M {r['embedding'] / 1e6:>8.2f}M "
              f"{r['value_tables'] / 1e6:>8.2f}M {r['non_embedding'] / 1e6:>8.2f}M "
              f"{r['flops_per_token'] / 1e6:>9.1f}M" for r in rows]
    return "\n".join(lines + ["FLOPs/tok: analytic training FLOPs per token (forward + backward) at the "
                               "context length."])
