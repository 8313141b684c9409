"""Hugging Face `generate` on a blocklab export against blocklab's own `generate`, on the same weights.

For each architecture (a blocklab model at `--size`, random weights) the HF model is
`blocklab.interop.hf_model.hf_model(model)`: the class an export loads through
``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)``, around the same
`Transformer`. Both decode greedily with blocklab's KV cache (HF's loop carries a `BlocklabCache`), so
the difference is the cost of HF's generation loop (logits processors, stopping criteria, output
bookkeeping) over blocklab's. Before timing, the two must give the same tokens, and the cache HF
carried must hold what blocklab's `new_cache` holds for the same length.

Measurement: one process, `--threads` threads; per (arch, batch) cell a warm-up call each, then
`--repeats` calls each, alternating which goes first; a call is prompt prefill + `--new` tokens;
tokens/s = batch x new / wall time. The table gives medians and the median of the per-repeat
ratios HF / blocklab (paired, so steadier on a shared machine), and each cache's bytes.

    PYTHONPATH=src python benchmarks/bench_hf_generate.py [--archs pre-ln,svformer] [--size tiny]
        [--batches 1,8] [--repeats 7] [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import blocklab
from blocklab.interop.hf_model import CACHE_NAME, hf_model

RESULTS = Path(__file__).parent / "results"
ARCHS = ("pre-ln", "sas-p+resformer-learnable", "svformer", "bov")


def make_pair(arch: str, size: str, seed: int = 0):
    torch.manual_seed(seed)
    model = blocklab.LanguageModel(blocklab.ModelConfig.from_preset(arch, size)).eval()
    return model, hf_model(model).eval()


def blocklab_call(model, prompt: torch.Tensor, new: int) -> torch.Tensor:
    return model.generate(prompt, new)


def hf_call(hf, prompt: torch.Tensor, new: int):
    # min_new_tokens: HF would stop a row at an eos token, which blocklab's generate does not do here
    return hf.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                       return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)


def check_same(model, hf, prompt: torch.Tensor, new: int) -> int:
    """Same tokens and the same cache layout; returns the cache's bytes (blocklab's `new_cache`)."""
    ours, theirs = blocklab_call(model, prompt, new), hf_call(hf, prompt, new)
    if not torch.equal(ours, theirs.sequences):
        raise SystemExit(f"{model.cfg.value_path}: HF generate and blocklab generate disagree")
    cache = getattr(theirs, CACHE_NAME)
    reference = model.new_cache(prompt.shape[0], model.cfg.context_length)
    if cache.nbytes != reference.nbytes:
        raise SystemExit(f"HF's cache holds {cache.nbytes} bytes, blocklab's {reference.nbytes}")
    return reference.nbytes


def measure_cell(model, hf, prompt: torch.Tensor, new: int, repeats: int) -> dict[str, list[float]]:
    calls = {"blocklab": lambda: blocklab_call(model, prompt, new), "hf": lambda: hf_call(hf, prompt, new)}
    rates: dict[str, list[float]] = {name: [] for name in calls}
    with torch.inference_mode():
        for call in calls.values():
            call()  # warm-up
        for r in range(repeats):
            for name in sorted(calls, reverse=bool(r % 2)):
                t0 = time.perf_counter()
                calls[name]()
                rates[name].append(prompt.shape[0] * new / (time.perf_counter() - t0))
    return rates


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--archs", default=",".join(ARCHS))
    p.add_argument("--size", default="tiny")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="2 repeats, 8 new tokens, write nothing")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.new = 2, 8
    torch.set_num_threads(args.threads)
    from _measure import machine_info, table, write_result

    info = machine_info("cpu", args.threads)
    print(f"# bench_hf_generate: {args.archs} at {args.size}, batches {args.batches}, prompt {args.prompt} + "
          f"{args.new} new, {args.repeats} repeats, {args.threads} thread(s); "
          f"load {info['load_avg_at_start']}", flush=True)
    cells, rows = [], []
    for arch in args.archs.split(","):
        model, hf = make_pair(arch, args.size)
        for batch in map(int, args.batches.split(",")):
            prompt = torch.randint(0, model.cfg.vocab_size, (batch, args.prompt),
                                   generator=torch.Generator().manual_seed(batch))
            cache_bytes = check_same(model, hf, prompt, args.new)
            rates = measure_cell(model, hf, prompt, args.new, args.repeats)
            paired = statistics.median(h / b for h, b in zip(rates["hf"], rates["blocklab"], strict=True))
            med = {name: statistics.median(r) for name, r in rates.items()}
            cells.append(dict(arch=arch, batch=batch, tokens_per_s=rates, median=med, hf_vs_blocklab=paired,
                              cache_bytes=cache_bytes))
            rows.append([arch, batch, f"{med['blocklab']:,.0f}", f"{med['hf']:,.0f}", f"{paired:.2f}",
                         f"{cache_bytes:,}"])
            print(f"  {arch} batch {batch}: HF / blocklab {paired:.2f}", flush=True)
    text = table(["arch", "batch", "blocklab generate tok/s", "HF generate tok/s", "HF / blocklab (paired)",
                  "cache bytes (both)"], rows)
    print(text)
    result = dict(machine=info, command=" ".join(["python", *sys.argv]),
                  args=vars(args) | {"out": str(args.out)}, same_tokens_checked=True, cells=cells, table=text)
    write_result(result, args.out or (None if args.quick else RESULTS / "hf-generate-cpu.json"))
    return result


if __name__ == "__main__":
    main()
