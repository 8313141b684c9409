"""Benchmark the KV cache: bytes held and decode throughput against context length.

Every block preset (with standard values) and every value path (on the pre-ln block), plus grouped-
query attention and SSSL sliding windows, at a GPT-2-shaped size (LayerNorm, GELU, learned
positions, biases, tied embeddings), side by side with Hugging Face `transformers`'
`GPT2LMHeadModel.generate` and its `DynamicCache` for the same shape (random weights).

Sizes: ``small`` (default; d 256, 6 layers, 4 heads, vocab 8192: blocklab's "small" with GPT-2's
block, so that Bank of Values' breakeven T = |V| = 8192 lies inside the measured range on a CPU) and
``gpt2`` (GPT-2 small: d 768, 12 layers, 12 heads, vocab 50257; for a GPU).

Memory: `KVCache.nbytes` of a cache made for exactly T positions (batch 1), checked against
`cache_bytes_per_token`; Hugging Face's is the bytes of its key and value tensors after T positions.
Bank of Values' and value embeddings' tables are listed apart (parameters, not cache).

Decode throughput: for each context length T, every model gets a cache holding T positions of random
keys, values and token ids (a prefill's content does not change the cost of a decode step, and
skipping it keeps the run short); then `generate` runs N greedy steps of one token, the first
attending to T cached positions. The "hand loop" contender is bench_decode.py's `HandDecoder` over
pre-ln's weights (`F.*` calls, keys and values preallocated in the layout SDPA reads): what a decode
step costs with no bookkeeping at all. tokens/s = N / wall time. The models are measured round-robin,
one generate call each per repeat and the starting model rotating, after a warm-up; the figure is
the median over repeats with the min-max. Ratios divide medians of the same run. On CPU the run
uses one thread by default (`--threads`).

A plot of cache memory (with Bank of Values' table) against context length is written to
benchmarks/results/cache-memory.png.

With ``--offload`` it measures instead Bank of Values with its tables offloaded to host memory
(`model.offload_value_tables()`, runtime/offload.py): for each context length, the device and host
bytes of `pre-ln+bov` with resident and with offloaded tables against the standard model's cache and
Bank of Values Eq. 6, on real text (a BPE of |V| ids trained on the embedded stdlib snapshot), each
figure checked against the measured tensors; the break-even contexts; decode tokens/s at batch 1
and 8 with and without offloading (eager steps).

    PYTHONPATH=src python benchmarks/bench_cache.py [--device cuda] [--quick] [--size small|gpt2] [--offload]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import statistics
import time
from pathlib import Path

import torch

import blocklab
from _measure import machine_info
from bench_decode import HandDecoder
from blocklab.model.presets import BLOCK_PRESETS
from blocklab.model.value_paths import VALUE_PATHS
from blocklab.runtime.cache import cache_bytes_per_token

SIZES = {
    "small": dict(d_model=256, n_layers=6, n_heads=4, mlp_hidden=1024, vocab_size=8192),
    "gpt2": dict(d_model=768, n_layers=12, n_heads=12, mlp_hidden=3072, vocab_size=50257),
}
GPT2_BLOCK = dict(norm="layernorm", norm_eps=1e-5, positions="learned", mlp_act="gelu", bias=True,
                  tie_embeddings=True, final_norm=True)
LENGTHS = (128, 512, 1024, 2048, 4096, 8192)
QUICK_LENGTHS = (128, 1024)
WINDOW = 64  # below every length, so the sliding-window layers always drop positions
HF = "hf-gpt2"
HAND = "hand loop"  # bench_decode's hand-written loop over pre-ln's weights: the per-token floor
BASELINE = "pre-ln"
OTHERS = (HF, HAND)  # contenders that are not blocklab models
RESULTS = Path(__file__).parent / "results"


# -- models ----------------------------------------------------------------------------------------
def variants(size: dict) -> dict[str, tuple[str, dict]]:
    """name -> (arch, overrides): block presets, value paths on pre-ln, GQA and sliding windows."""
    out = {b: (b, {}) for b in BLOCK_PRESETS}
    out.update({f"pre-ln+{v}": (f"pre-ln+{v}", {}) for v in VALUE_PATHS if v != "standard"})
    out[f"pre-ln gqa-kv{size['n_heads'] // 4}"] = ("pre-ln", dict(n_kv_heads=size["n_heads"] // 4))
    out[f"pre-ln SSSL-{WINDOW}"] = ("pre-ln", dict(window_size=WINDOW, window_pattern="SSSL"))
    return out


def make_cfg(arch: str, size: dict, context: int, **overrides) -> blocklab.ModelConfig:
    return blocklab.ModelConfig.from_preset(arch, "small", **{**size, **GPT2_BLOCK, "context_length": context,
                                                              **overrides})


def hf_model(size: dict, context: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_embd=size["d_model"], n_layer=size["n_layers"], n_head=size["n_heads"],
                     n_inner=size["mlp_hidden"], vocab_size=size["vocab_size"], n_positions=context,
                     bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return GPT2LMHeadModel(cfg).eval()


# -- decoding with a filled cache -------------------------------------------------------------------
class OurDecoder:
    def __init__(self, model, length: int, new: int, vocab: int, device):
        self.model, self.length, self.new = model, length, new
        self.cache = model.new_cache(1, length + new)
        g = torch.Generator(device=device).manual_seed(0)
        for name, t in self.cache.tensors().items():  # random past: decode cost does not depend on it
            if name == "token_ids":
                t.random_(0, vocab, generator=g)
            else:
                t.normal_(generator=g)
        self.prompt = torch.randint(0, vocab, (1, 1), device=device, generator=g)

    def run(self, n: int) -> None:
        self.cache.length = self.length  # forget the tokens the previous call appended
        self.model.generate(self.prompt, n, cache=self.cache)


class HFDecoder:
    def __init__(self, model, length: int, _new: int, vocab: int, device):  # OurDecoder's signature
        from transformers import DynamicCache

        cfg = model.config
        self.model, self.length = model, length
        self.cache = DynamicCache(config=cfg)
        g = torch.Generator(device=device).manual_seed(0)
        shape = (1, cfg.n_head, length, cfg.n_embd // cfg.n_head)
        for layer in range(cfg.n_layer):
            self.cache.update(torch.randn(shape, generator=g, device=device),
                              torch.randn(shape, generator=g, device=device), layer)
        self.ids = torch.randint(0, vocab, (1, length + 1), device=device, generator=g)
        self.mask = torch.ones_like(self.ids)

    def nbytes(self) -> int:
        return sum(t.nbytes for layer in self.cache.layers for t in (layer.keys, layer.values))

    def run(self, n: int) -> None:
        extra = self.cache.get_seq_length() - self.length
        if extra:
            self.cache.crop(-extra)
        with torch.no_grad():
            self.model.generate(self.ids, attention_mask=self.mask, past_key_values=self.cache,
                                max_new_tokens=n, min_new_tokens=n, do_sample=False)


class HandLoopDecoder:
    """bench_decode's `HandDecoder` over the pre-ln model's weights, from a filled past of `length`."""

    def __init__(self, model, length: int, new: int, vocab: int, device):
        self.hand, self.length = HandDecoder(model), length
        self.keys, self.values = self.hand.new_cache(1, length + new)
        g = torch.Generator(device=device).manual_seed(0)
        self.keys.normal_(generator=g)
        self.values.normal_(generator=g)
        self.ids = torch.randint(0, vocab, (1,), device=device, generator=g)

    def run(self, n: int) -> None:
        self.hand.decode(self.ids, self.keys, self.values, self.length, n)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_length(models: dict, length: int, new: int, repeats: int, size: dict, device) -> dict:
    """tokens/s of every model at one context length, round-robin over repeats."""
    vocab = size["vocab_size"]
    kinds = {HF: HFDecoder, HAND: HandLoopDecoder}
    decoders = {name: kinds.get(name, OurDecoder)(m, length, new, vocab, device)
                for name, m in models.items()}
    for name, d in decoders.items():  # the timing caches must be what the formula says
        if name not in OTHERS:
            formula = cache_bytes_per_token(models[name].cfg, 4, length + new)["total_bytes"]
            assert d.cache.nbytes == formula, (name, d.cache.nbytes, formula)
    hf_bytes = decoders[HF].nbytes() if HF in decoders else None
    for d in decoders.values():  # warm-up
        d.run(2)
    times: dict[str, list[float]] = {name: [] for name in decoders}
    names = list(decoders)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            sync(device)
            start = time.perf_counter()
            decoders[name].run(new)
            sync(device)
            times[name].append(new / (time.perf_counter() - start))
    del decoders
    return {"tokens_per_s": times, "hf_cache_bytes": hf_bytes}


# -- memory ----------------------------------------------------------------------------------------
def memory_rows(models: dict, lengths) -> dict:
    """Measured nbytes of a cache made for exactly T positions, its formula and the value tables."""
    out = {}
    for name, model in models.items():
        if name in OTHERS:
            continue
        rows = {}
        for t in lengths:
            formula = cache_bytes_per_token(model.cfg, 4, t)
            measured = model.new_cache(1, t).nbytes
            assert measured == formula["total_bytes"], (name, t)
            rows[t] = dict(cache_bytes=measured, token_id_bytes=formula["token_id_bytes"],
                           value_table_bytes=formula["value_table_bytes"], kinds=formula["kinds"])
        out[name] = rows
    return out


def plot(path: Path, size_name: str, size: dict, configs: dict, measured: dict, hf_bytes: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(size_name, size, True), ("gpt2", SIZES["gpt2"], False)] if size_name != "gpt2" else \
        [("gpt2", size, True)]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False)
    shown = {BASELINE: "pre-ln (K+V every layer)", "pre-ln+svformer": "SVFormer (K per layer, V once)",
             "pre-ln+cla": "CLA (group 2)", "pre-ln+x0-value": "x0-value (ids, no table)"}
    for ax, (name, dims, with_points) in zip(axes[0], panels, strict=True):
        vocab = dims["vocab_size"]
        ts = sorted({int(round(x)) for x in torch.logspace(7, 17.5, 60, base=2).tolist()} | {vocab})
        for key, label in shown.items():
            cfg = make_cfg(configs[key][0], dims, max(ts), **configs[key][1])
            ax.plot(ts, [cache_bytes_per_token(cfg, 4, t)["total_bytes"] / 2**20 for t in ts], label=label)
        bov = make_cfg("pre-ln+bov", dims, max(ts))
        f = [cache_bytes_per_token(bov, 4, t) for t in ts]
        ax.plot(ts, [x["total_bytes"] / 2**20 for x in f], "--", color="C4",
                label="BoV cache (K, V of non-target layers, ids)")
        ax.plot(ts, [(x["total_bytes"] + x["value_table_bytes"]) / 2**20 for x in f], color="C4", lw=2.2,
                label="BoV cache + value tables E_v")
        ax.axvline(vocab, color="grey", ls=":", lw=1)
        ax.text(vocab * 1.08, 0.02, f"T = |V| = {vocab}", rotation=90,
                transform=ax.get_xaxis_transform(), color="grey", va="bottom")
        if with_points:
            for key, color in ((BASELINE, "C0"), ("pre-ln+bov", "C4")):
                pts = sorted(measured[key].items())
                ax.plot([t for t, _ in pts], [(r["cache_bytes"] + r["value_table_bytes"]) / 2**20
                                              for _, r in pts], "o", color=color, ms=5)
            if hf_bytes:
                ax.plot(list(hf_bytes), [b / 2**20 for b in hf_bytes.values()], "x", color="k", ms=7,
                        label="HF GPT-2 DynamicCache (measured)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context length T (positions cached, batch 1)")
        ax.set_ylabel("MiB (float32)")
        ax.set_title(f"{name}: d {dims['d_model']}, {dims['n_layers']} layers, |V| {vocab}"
                     + (" (dots: measured nbytes)" if with_points else " (formula)"))
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7.5, loc="upper left")
    fig.suptitle("KV-cache memory against context length; Bank of Values breaks even at T = |V| (Eq. 6)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- offloaded value tables (--offload) ------------------------------------------------------------
OFFLOAD_ARCH = "pre-ln+bov"
OFFLOAD_CHUNK = 1024  # prefill chunk: the measured caches are filled in pieces of this many tokens


def text_tokens(vocab: int, n: int) -> tuple[list[int], str]:
    """`n` tokens of real text: a byte-level BPE of `vocab` ids trained on the embedded Python-stdlib
    snapshot's first files, encoding the files after them (held out), so that the distinct ids of a
    prefix grow as in a real prompt rather than as uniform random ids would."""
    from blocklab.data.snapshot import iter_snapshot
    from blocklab.data.tokenizer import train_bpe

    docs = [text for _, text in iter_snapshot()]
    train, size = [], 0
    while size < 3_000_000:
        train.append(docs[len(train)])
        size += len(train[-1])
    tok = train_bpe(train, vocab)
    ids: list[int] = []
    for text in docs[len(train):]:
        ids += tok.encode(text)
        if len(ids) >= n:
            break
    return ids[:n], f"BPE {tok.vocab_size} ids trained on {len(train)} stdlib files, text of the next files"


def distinct_prefix_counts(ids: list[int]) -> list[int]:
    """counts[t]: distinct ids among the first t + 1 tokens."""
    seen: set[int] = set()
    out = []
    for i in ids:
        seen.add(i)
        out.append(len(seen))
    return out


def offload_memory(size: dict, lengths, ids: list[int], device: torch.device) -> list[dict]:
    """For each T: `offload_bytes` with the text's distinct ids, checked against a bov model's cache filled
    with the first T tokens (prefill in chunks) with its tables offloaded: measured bytes of the cache,
    of the compact rows on the device (filled, and allocated: chunks after the first grow the tables by
    a quarter at a time) and of the host tables."""
    from blocklab.accounting import offload_bytes

    model = blocklab.LanguageModel(make_cfg(OFFLOAD_ARCH, size, max(lengths))).to(device).eval()
    model.offload_value_tables()
    counts = distinct_prefix_counts(ids)
    rows = []
    for t in lengths:
        report = offload_bytes(model.cfg, t, unique_ids=counts[t - 1], dtype_bytes=4)
        cache = model.new_cache(1, t)
        with torch.no_grad():
            for start in range(0, t, OFFLOAD_CHUNK):
                model(torch.tensor([ids[start:min(t, start + OFFLOAD_CHUNK)]], device=device), cache=cache)
        assert cache.value_rows is not None
        rows_used = cache.value_rows.used_bytes
        measured = dict(cache=cache.nbytes, rows_used=rows_used, rows_allocated=cache.value_row_bytes,
                        host=cache.value_rows.host_bytes)
        assert measured["cache"] == report["cache_bytes"], (t, measured, report)
        assert measured["rows_used"] == report["row_bytes"], (t, measured, report)
        assert measured["host"] == report["offloaded_host_bytes"], (t, measured, report)
        rows.append({**report, "measured": measured})
    return rows


def break_even(cfg, counts: list[int] | None, key: str = "saved_offloaded_bytes",
               dtype_bytes: int = 4) -> int | None:
    """The first context T at which Bank of Values holds fewer device bytes than the standard model's
    cache (`key`: with offloaded or resident tables; `counts`: the text's distinct ids per prefix; None:
    every position a new id, the worst case); None if not within len(counts) or 16 |V| positions.

    Without sliding windows every term of `offload_bytes` is affine in T and in the distinct ids, so
    the saving is evaluated from T = 1, 2 and one id, and checked against `offload_bytes` at the end."""
    from blocklab.accounting import offload_bytes

    def saved(t: int, u: int) -> int:
        return offload_bytes(cfg, t, unique_ids=u, dtype_bytes=dtype_bytes)[key]

    vocab = cfg.vocab_size
    first, slope = saved(1, 0), saved(2, 0) - saved(1, 0)
    per_id = saved(1, 1) - first
    limit = len(counts) if counts is not None else 16 * vocab

    def distinct(t: int) -> int:
        return counts[t - 1] if counts is not None else min(t, vocab)

    assert saved(limit, distinct(limit)) == first + (limit - 1) * slope + per_id * distinct(limit)
    return next((t for t in range(1, limit + 1) if first + (t - 1) * slope + per_id * distinct(t) > 0), None)


def offload_speed(size: dict, prompt: list[int], new: int, repeats: int, device: torch.device) -> dict:
    """Decode tokens/s of bov with resident and with offloaded tables, batch 1 and 8: after an untimed
    prefill of `prompt`, `new` greedy steps of `decode_step` (what `generate` runs per token) are timed;
    the median of `repeats` after a warm-up, the two modes alternating."""
    model = blocklab.LanguageModel(make_cfg(OFFLOAD_ARCH, size, len(prompt) + new)).to(device).eval()
    out: dict = {}
    for batch in (1, 8):
        ids = torch.tensor([prompt] * batch, device=device)
        times: dict[str, list[float]] = {"resident": [], "offloaded": []}
        for r in range(repeats + 1):
            for mode in ("resident", "offloaded"):
                model.offload_value_tables(mode == "offloaded")
                cache = model.new_cache(batch, len(prompt) + new)
                with torch.inference_mode():
                    logits = model(ids, cache=cache)[:, -1]
                    sync(device)
                    t0 = time.perf_counter()
                    for _ in range(new):
                        logits = model.decode_step(logits.argmax(-1, keepdim=True), cache)
                    sync(device)
                if r:  # the first round warms up
                    times[mode].append(time.perf_counter() - t0)
        out[batch] = {m: batch * new / statistics.median(v) for m, v in times.items()}
    model.offload_value_tables(False)
    return out


def offload_table(size_name: str, rows: list[dict], even: dict, speed: dict) -> str:
    vocab = SIZES[size_name]["vocab_size"]
    head = ["T", "distinct ids", "standard cache MiB", "BoV cache MiB", "+ tables (resident) MiB",
            "+ rows (offloaded) MiB", "rows allocated MiB", "host MiB", "Eq. 6 saved MiB",
            "saved resident MiB",
            "saved offloaded MiB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    mib = 2 ** 20
    for r in rows:
        lines.append("| " + " | ".join([
            str(r["context"]), str(r["unique_ids"]), f"{r['standard_cache_bytes'] / mib:.2f}",
            f"{r['cache_bytes'] / mib:.2f}", f"{r['resident_device_bytes'] / mib:.2f}",
            f"{r['offloaded_device_bytes'] / mib:.2f}", f"{r['measured']['rows_allocated'] / mib:.2f}",
            f"{r['offloaded_host_bytes'] / mib:.2f}",
            f"{r['eq6_saved_bytes'] / mib:.2f}", f"{r['saved_resident_bytes'] / mib:.2f}",
            f"{r['saved_offloaded_bytes'] / mib:.2f}"]) + " |")
    lines.append(f"break-even (fewer device bytes than the standard cache), batch 1, float32: resident "
                 f"tables T = {even['resident']} (Eq. 6: T = |V| = {vocab}); offloaded, this text "
                 f"T = {even['text']}; offloaded, every position a new id T = {even['worst']}")
    for batch, s in speed.items():
        lines.append(f"decode tokens/s, batch {batch}: resident {s['resident']:,.0f}, offloaded "
                     f"{s['offloaded']:,.0f} (x{s['offloaded'] / s['resident']:.2f})")
    return "\n".join(lines)


def offload_main(args, device: torch.device) -> None:
    """--offload: device and host bytes of bov with resident and offloaded tables against the standard
    cache per context length, measured on real text, the break-even points, and decode tokens/s."""
    size = SIZES[args.size]
    lengths = tuple(int(x) for x in args.lengths.split(",")) if args.lengths else (
        QUICK_LENGTHS if args.quick else (*LENGTHS, 16384))
    new = args.new_tokens or (4 if args.quick else 32)
    repeats = args.repeats or (2 if args.quick else 3)
    start = time.time()
    ids, source = text_tokens(size["vocab_size"], max(lengths))
    print(f"# bench_cache --offload: size {args.size} {size}, {OFFLOAD_ARCH}, lengths {lengths}, {device}; "
          f"tokens: {source}", flush=True)
    rows = offload_memory(size, lengths, ids, device)
    cfg = make_cfg(OFFLOAD_ARCH, size, max(lengths))
    even = dict(resident=break_even(cfg, None, "saved_resident_bytes"),
                text=break_even(cfg, distinct_prefix_counts(ids)), worst=break_even(cfg, None))
    speed = offload_speed(size, ids[:512], new, repeats, device)
    text = offload_table(args.size, rows, even, speed)
    print(text)
    out = args.out or RESULTS / f"cache-offload-{device.type}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(machine=machine_info(args.device, torch.get_num_threads()), size=args.size,
                                   dims=size, arch=OFFLOAD_ARCH, tokens=source, lengths=lengths, rows=rows,
                                   break_even=even, tokens_per_s={str(b): s for b, s in speed.items()},
                                   new_tokens=new, repeats=repeats, elapsed_s=round(time.time() - start, 1),
                                   table=text), indent=1))
    print(f"# wrote {out} ({time.time() - start:.0f} s)")


# -- report ----------------------------------------------------------------------------------------
def summarize(speeds: dict[int, dict], lengths) -> dict:
    out = {}
    for t in lengths:
        tps = speeds[t]["tokens_per_s"]
        base = statistics.median(tps[BASELINE])
        hf = statistics.median(tps[HF]) if HF in tps else None
        out[t] = {name: dict(median=statistics.median(v), min=min(v), max=max(v),
                             x_pre_ln=statistics.median(v) / base,
                             x_hf=statistics.median(v) / hf if hf else None) for name, v in tps.items()}
    return out


def table(names, lengths, memory, summary, hf_bytes) -> str:
    last = lengths[-1]
    head = ["model", f"cache MiB at T={last}", "x pre-ln"]
    for t in lengths:
        head += [f"tok/s T={t} (min-max)", "x pre-ln"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base_bytes = memory[BASELINE][last]["cache_bytes"]
    for name in names:
        if name == HF:
            b = hf_bytes.get(last)
            row = [f"{HF} (transformers)", f"{b / 2**20:.1f}" if b else "-",
                   f"{b / base_bytes:.3f}" if b else "-"]
        elif name == HAND:  # the same cache as pre-ln, preallocated
            row = [f"{HAND} (pre-ln's weights)", "-", "-"]
        else:
            b = memory[name][last]["cache_bytes"]
            row = [name, f"{b / 2**20:.1f}", f"{b / base_bytes:.3f}"]
        for t in lengths:
            s = summary[t][name]
            row += [f"{s['median']:,.0f} ({s['min']:,.0f}-{s['max']:,.0f})", f"{s['x_pre_ln']:.2f}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--size", choices=list(SIZES), default="small")
    p.add_argument("--quick", action="store_true", help="two lengths, 4 new tokens, 2 repeats")
    p.add_argument("--lengths", type=str, default=None, help="comma-separated context lengths")
    p.add_argument("--new-tokens", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-hf", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=RESULTS / "cache-memory.png")
    p.add_argument("--offload", action="store_true",
                   help="only the offloaded value tables' table: device and host bytes of bov per context "
                        "length on real text, the break-even points, decode tokens/s with and without")
    args = p.parse_args()
    device = torch.device(args.device)
    # one thread: a decode step is a chain of ~1 ms ops, and on a shared 2-core VM a second OpenMP
    # thread costs more in waiting than it gains (measured 10x slower per step under load)
    threads = args.threads or 1
    torch.set_num_threads(threads)
    if args.offload:
        offload_main(args, device)
        return
    lengths = tuple(int(x) for x in args.lengths.split(",")) if args.lengths else (
        QUICK_LENGTHS if args.quick else LENGTHS)
    new = args.new_tokens or (4 if args.quick else 16)
    repeats = args.repeats or (2 if args.quick else 5)
    size = SIZES[args.size]
    context = max(lengths) + new
    info = machine_info(args.device, threads)
    info["transformers"] = importlib.metadata.version("transformers")
    print(f"# bench_cache: size {args.size} {size}, lengths {lengths}, {new} new tokens, {repeats} repeats, "
          f"{device}, {threads} threads; load {info['load_avg_at_start']}", flush=True)

    start = time.time()
    torch.manual_seed(0)
    configs = variants(size)
    models = {}
    for name, (arch, overrides) in configs.items():
        models[name] = blocklab.LanguageModel(make_cfg(arch, size, context, **overrides)).to(device).eval()
    models[HAND] = models[BASELINE]  # the hand loop reads pre-ln's weights
    if not args.no_hf:
        models[HF] = hf_model(size, context).to(device)
    memory = memory_rows(models, lengths)
    speeds, hf_bytes = {}, {}
    with torch.no_grad():
        for t in lengths:
            t0 = time.time()
            speeds[t] = measure_length(models, t, new, repeats, size, device)
            if speeds[t]["hf_cache_bytes"] is not None:
                hf_bytes[t] = speeds[t]["hf_cache_bytes"]
            print(f"  T={t}: {time.time() - t0:.0f} s", flush=True)
    summary = summarize(speeds, lengths)
    names = list(models)
    text = table(names, lengths, memory, summary, hf_bytes)
    print(text)
    elapsed = time.time() - start
    print(f"# total {elapsed:.0f} s")
    plot(args.plot, args.size, size, configs, memory, hf_bytes)
    out = args.out or RESULTS / f"cache-{device.type}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(
        machine=info, args=dict(size=args.size, dims=size, gpt2_block=GPT2_BLOCK, lengths=lengths,
                                new_tokens=new, repeats=repeats, quick=args.quick),
        configs={k: dict(arch=a, overrides=o) for k, (a, o) in configs.items()}, elapsed_s=round(elapsed, 1),
        memory={n: {str(t): r for t, r in rows.items()} for n, rows in memory.items()},
        hf_cache_bytes={str(t): b for t, b in hf_bytes.items()},
        tokens_per_s={str(t): speeds[t]["tokens_per_s"] for t in lengths},
        summary={str(t): s for t, s in summary.items()}, table=text), indent=1))
    print(f"# wrote {out} and {args.plot}")


if __name__ == "__main__":
    main()
