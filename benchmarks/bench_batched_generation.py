"""Batched generation of prompts of different lengths: one padded batch against one prompt at a time.

For each architecture (a blocklab model at `--size`, random weights, eval mode), `--prompts` prompts
whose lengths are spread evenly over `--lengths MIN,MAX` are continued by `--new` greedy tokens in two
ways: "one at a time" calls `generate` once per prompt (no padding, no masks: the fastest path for a
single sequence), "padded batch" calls it once on the prompts left-padded to the longest, with an
attention_mask (model/masking.py: per-row positions, masked keys; shaped attention builds its matrix).
Before timing, the rows of the batch are compared with their prompts generated alone: the table gives
how many rows have the same tokens (all, on a CPU in float32; a GPU's batched kernels may round a
near tie the other way).

Measurement: one process, `--threads` threads, eager decoding (``compile=False``, as on a CPU by
default); per architecture a warm-up call each, then `--repeats` calls each, alternating which goes
first. tokens/s = prompts x new / wall time of the call (prefill included). The table gives medians
and the median of the per-repeat ratios batch / one at a time (paired: steadier on a shared machine).

    PYTHONPATH=src python benchmarks/bench_batched_generation.py [--archs pre-ln,sas-p] [--size tiny]
        [--prompts 8] [--lengths 8,64] [--new 32] [--repeats 5] [--quick] [--device cpu] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from torch import Tensor

import blocklab

RESULTS = Path(__file__).parent / "results"
ARCHS = ("pre-ln", "sas-p", "svformer", "bov", "cla")


def make_model(arch: str, size: str, device: str, seed: int = 0) -> blocklab.LanguageModel:
    torch.manual_seed(seed)
    return blocklab.LanguageModel(blocklab.ModelConfig.from_preset(arch, size)).to(device).eval()


def make_prompts(n: int, lengths: tuple[int, int], vocab: int, device: str) -> list[Tensor]:
    low, high = lengths
    gen = torch.Generator().manual_seed(0)
    sizes = [round(low + (high - low) * i / max(n - 1, 1)) for i in range(n)]
    return [torch.randint(0, vocab, (s,), generator=gen).to(device) for s in sizes]


def left_padded(prompts: list[Tensor]) -> tuple[Tensor, Tensor]:
    t = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), t, dtype=torch.long, device=prompts[0].device)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, t - len(p):], mask[row, t - len(p):] = p, 1
    return ids, mask


def one_at_a_time(model: blocklab.LanguageModel, prompts: list[Tensor], new: int) -> list[Tensor]:
    return [model.generate(p[None], new, compile=False)[0, len(p):] for p in prompts]


def batched(model: blocklab.LanguageModel, ids: Tensor, mask: Tensor, new: int) -> Tensor:
    return model.generate(ids, new, attention_mask=mask, compile=False)[:, ids.shape[1]:]


def rows_equal(model: blocklab.LanguageModel, prompts: list[Tensor], new: int) -> int:
    """How many rows of the padded batch give the tokens of their prompt generated alone."""
    ids, mask = left_padded(prompts)
    together = batched(model, ids, mask, new)
    alone = one_at_a_time(model, prompts, new)
    return sum(torch.equal(together[row], tokens) for row, tokens in enumerate(alone))


def measure(model: blocklab.LanguageModel, prompts: list[Tensor], new: int, repeats: int,
            device: torch.device) -> dict[str, list[float]]:
    from _measure import timed

    ids, mask = left_padded(prompts)
    calls = {"one at a time": lambda: one_at_a_time(model, prompts, new),
             "padded batch": lambda: batched(model, ids, mask, new)}
    for fn in calls.values():  # warm-up
        fn()
    tokens = len(prompts) * new
    rates: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for r in range(repeats):
        for name in names[r % 2:] + names[:r % 2]:
            rates[name].append(tokens / timed(calls[name], device))
    return rates


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--archs", default=",".join(ARCHS))
    p.add_argument("--size", default="tiny")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--lengths", default="8,64", help="MIN,MAX prompt length")
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--quick", action="store_true", help="2 repeats, 4 new tokens, write nothing")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.new = 2, 4
    elif args.out is None:
        args.out = RESULTS / f"batched-generation-{args.device}.json"
    low, high = map(int, args.lengths.split(","))
    torch.set_num_threads(args.threads)
    from _measure import machine_info, table, write_result

    device = torch.device(args.device)
    info = machine_info(args.device, args.threads)
    print(f"# bench_batched_generation: {args.archs} at {args.size}, {args.prompts} prompts of {low}-{high} "
          f"tokens + {args.new} new, {args.repeats} repeats, {args.threads} thread(s); load "
          f"{info['load_avg_at_start']}", flush=True)
    cells, rows = [], []
    for arch in args.archs.split(","):
        model = make_model(arch, args.size, args.device)
        prompts = make_prompts(args.prompts, (low, high), model.cfg.vocab_size, args.device)
        with torch.inference_mode():
            same = rows_equal(model, prompts, args.new)
        rates = measure(model, prompts, args.new, args.repeats, device)
        paired = statistics.median(b / s for b, s in zip(rates["padded batch"], rates["one at a time"],
                                                           strict=True))
        med = {name: statistics.median(r) for name, r in rates.items()}
        cells.append(dict(arch=arch, tokens_per_s=rates, median=med, batch_vs_one_at_a_time=paired,
                          rows_equal=same))
        rows.append([arch, f"{med['one at a time']:,.0f}", f"{med['padded batch']:,.0f}", f"{paired:.2f}",
                     f"{same}/{len(prompts)}"])
        print(f"  {arch}: padded batch / one at a time {paired:.2f}", flush=True)
    header = ["arch", "one at a time tok/s", "padded batch tok/s", "batch / one at a time (paired)",
              "rows as alone"]
    text = table(header, rows)
    print(text)
    result = dict(machine=info, command=" ".join(["python", *sys.argv]),
                  args=vars(args) | {"out": str(args.out)}, cells=cells, table=text)
    write_result(result, None if args.quick else args.out)
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
