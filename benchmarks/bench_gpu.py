"""The GPU path: training tokens/s, MFU and peak memory, eager and compiled, against a hand-written model
of the same shape in the same process, and decode tokens/s.

For each architecture (default: pre-ln, sas, sas-p, resformer, svformer, bov) at a 124M-class size
(GPT-2 small's shape: 12 layers, d 768, 12 heads, MLP 3072, vocab 50257 or `--vocab`, with GPT-2's
block: LayerNorm, learned positions, GELU (tanh), biases, tied embeddings) and sequence length 1024:

- training: bf16 autocast, a step is forward, loss, backward and a fused AdamW step on random tokens
  (batch `--batch`, a comma-separated list such as 8,16 runs each). blocklab's loss is the trainer's
  own, `blocklab.training.step.lm_loss(model, {"input_ids", "labels"})` (what the trainer times),
  except in ``compile-model``, where `torch.compile(model)`'s logits go through float32
  `F.cross_entropy` as a hand-written script would. Modes: ``eager``; ``compile``, what the trainer's
  ``compile=true`` runs (`model.compile_model()`: the forward as one graph, falling back to per-block
  compile with a warning, recorded in the row, if inductor fails); ``compile-blocks``
  (`model.compile_blocks()`, one graph per block); ``compile-model`` (`torch.compile(model)`). After
  `--warmup` steps (which include the compilation, reported apart as ``first_step_s``), `--repeats`
  timed chunks of `--steps` steps: tokens/s is the median chunk with the min-max. Peak memory is
  `torch.cuda.max_memory_allocated` over the run of that configuration (parameters, gradients, AdamW
  state and activations).
- the hand-written contender (`hand_gpt.HandGPT`: a nanoGPT-style GPT-2 of the same shape, fused QKV,
  SDPA, tied head; float32 `F.cross_entropy` of its logits) runs first in each batch: ``eager``, and
  ``compiled`` (`torch.compile(model)`) when a compiled mode is asked for. Every blocklab row states
  ``vs_hand``, its tokens/s over the hand model's in the same mode (eager over hand eager, every
  compiled mode over hand compiled; `--hand none` drops it, `--hand eager` keeps only the eager one).
- MFU = `blocklab.flops_per_token(model, seq_len)` x tokens/s / peak (the hand model: that of the
  blocklab pre-ln of its shape, the same function), over two peaks: the best rate of a timed large
  bf16 matmul on this device (``mfu_measured``) and the datasheet's dense bf16 rate picked by device
  name (``mfu_datasheet``: H100 SXM 989, H100 PCIe 756, H100 NVL 835, H200 989, A100 312 TFLOP/s;
  none for another device).
- decoding (blocklab, eager mode only): the model cast to bf16 (on CUDA), `model.generate` greedy,
  prompt 64 + 128 new tokens at batch 1 and 8, median of `--decode-repeats` calls; for pre-ln also the
  hand-written loop of `bench_decode.py` on the same weights, as the no-overhead reference, and a copy
  of the model with `compile_decoding()` (the per-token step as one graph; `--decode-compile-archs`;
  with `--decode-freeze`, `compile_decoding(freeze_weights=True)`, the weights folded in).

The run starts no configuration once `--budget-s` seconds have passed since `main` began (plus the
time this module's imports took: a run as a script counts from the start of its process), nor
one expected to end after that (1.2 x the time the previous eager, or compiled, configuration took);
the default 540 keeps the run within one 10-minute call. Skipped configurations are listed as such.
Rows are written to the JSON after every configuration, so an interrupted run keeps what it measured.

    python benchmarks/bench_gpu.py                      # CUDA: writes benchmarks/results/gpu.json
    python benchmarks/bench_gpu.py --quick              # fewer steps, compile for pre-ln only
    python benchmarks/bench_gpu.py --archs pre-ln,sas-p,sas --modes eager,compile --decode-batches none \
        --budget-s 265                                  # the hand comparison of gpu_session.sh
    python benchmarks/bench_gpu.py --batch 16 --vocab 50304   # the vocabulary padded by hand
    python benchmarks/bench_gpu.py --device cpu --smoke # tiny sizes, 2 steps, eager: seconds on a CPU;
                                                        # writes a smoke file in a temporary folder
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

IMPORTING = time.perf_counter()  # the imports count against --budget-s (see IMPORT_S)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import blocklab  # noqa: E402
from _measure import machine_info  # noqa: E402
from bench_decode import GPT2_BLOCK, SIZES, HandDecoder  # noqa: E402
from hand_gpt import HandGPT  # noqa: E402

ARCHS = ("pre-ln", "sas", "sas-p", "resformer", "svformer", "bov")
MODES = ("eager", "compile", "compile-blocks", "compile-model")
HAND = "hand"  # the hand-written contender's name in the rows; its modes are eager and compiled
HAND_CHOICES = {"same": ("eager", "compiled"), "eager": ("eager",), "none": ()}
BLOCK = {**GPT2_BLOCK, "mlp_act": "gelu_tanh"}  # GPT-2's block with its tanh GELU, as the hand model's
# dense bf16 tensor-core TFLOP/s from the vendor datasheets; the first name found in the device's wins
DATASHEET_BF16_TFLOPS = (("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H200", 989.0),
                         ("A100", 312.0))
SMOKE_DIMS = dict(d_model=64, n_layers=2, n_heads=2, mlp_hidden=128, vocab_size=256)
RESULTS = Path(__file__).parent / "results"


def datasheet_peak(device_name: str) -> tuple[str, float] | None:
    """(table entry, dense bf16 TFLOP/s) for a device name such as "NVIDIA H100 80GB HBM3"."""
    for key, tflops in DATASHEET_BF16_TFLOPS:
        if key.lower() in device_name.lower():
            return key, tflops
    return None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measured_peak_tflops(device: torch.device, n: int, iters: int = 10, tries: int = 5) -> float:
    """The best TFLOP/s of n x n bf16 matmuls (2 n^3 FLOPs each) over `tries` timed batches."""
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    a @ b  # warm-up: kernel selection
    best = 0.0
    for _ in range(tries):
        sync(device)
        start = time.perf_counter()
        for _ in range(iters):
            a @ b
        sync(device)
        best = max(best, 2 * n**3 * iters / (time.perf_counter() - start) / 1e12)
    return best


def make_cfg(arch: str, dims: dict, seq_len: int) -> blocklab.ModelConfig:
    """`arch` at the given dims with GPT-2's block (the pre-ln of `bench_decode.HandDecoder`)."""
    return blocklab.ModelConfig.from_preset(arch, "small", **dims, **BLOCK, context_length=seq_len)


def make_hand(cfg: blocklab.ModelConfig) -> HandGPT:
    """The hand-written GPT-2 of a pre-ln config's shape."""
    return HandGPT(cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.context_length,
                   cfg.mlp_hidden, eps=cfg.norm_eps or 1e-5)


def hand_mode(mode: str) -> str:
    """The hand model's mode a blocklab mode is compared with: eager with eager, any compile with compiled."""
    return "eager" if mode == "eager" else "compiled"


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def memory_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def memory_peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


# -- training ----------------------------------------------------------------------------------------
def train(arch: str, mode: str, batch: int, opts: argparse.Namespace, dims: dict, device: torch.device,
          peaks: dict) -> dict:
    """Tokens/s, MFU and peak memory of training `arch` (or the hand model, arch "hand") in `mode`, and in
    eager mode the decoding speed of the trained blocklab model."""
    if mode != "eager":
        torch._dynamo.reset()  # a fresh compile cache for each model
    free(device)
    memory_reset(device)
    torch.manual_seed(0)
    cfg = make_cfg("pre-ln" if arch == HAND else arch, dims, opts.seq_len)
    with torch.device("meta"):  # the hand model computes the function of blocklab's pre-ln: its FLOPs
        flops = blocklab.flops_per_token(blocklab.LanguageModel(cfg), opts.seq_len)
    model = (make_hand(cfg) if arch == HAND else blocklab.LanguageModel(cfg)).to(device).train()
    params = (sum(p.numel() for p in model.parameters()) if arch == HAND
              else blocklab.count_parameters(model).total)
    row = dict(arch=arch, mode=mode, params=params, flops_per_token=flops, batch=batch, seq_len=opts.seq_len,
               **timed_training(model, mode, batch, opts, device))
    rate = row["tokens_per_s"]
    row.update(step_ms=1000 * batch * opts.seq_len / rate, model_tflops=flops * rate / 1e12,
               mfu_measured=flops * rate / (peaks["measured_tflops"] * 1e12),
               mfu_datasheet=(flops * rate / (peaks["datasheet_tflops"] * 1e12)
                              if peaks["datasheet_tflops"] else None),
               peak_memory_gib=memory_peak_gib(device))
    if arch != HAND and mode == "eager" and opts.decode_batches:
        model.eval()
        if device.type == "cuda":  # bf16 weights and cache; a CPU decodes in float32 (its bf16 is slow)
            model.to(torch.bfloat16)
        free(device)  # the optimiser state and the batch went with timed_training
        row["decode"] = decode(model, opts, device, compiled=arch in opts.decode_compile_archs)
    del model
    free(device)
    return row


def prepare(model: torch.nn.Module, mode: str, opts: argparse.Namespace) -> tuple[torch.nn.Module, str]:
    """Compile `model` for `mode`: (the module to call for logits, how it was compiled)."""
    kwargs = {"backend": opts.compile_backend} if opts.compile_backend else {}
    if mode in ("compiled", "compile-model"):
        return torch.compile(model, **kwargs), "torch.compile(model)"
    if mode == "compile-blocks":
        model.compile_blocks(**kwargs)
        return model, "compile_blocks()"
    if mode == "compile":  # the trainer's compile=true
        if hasattr(model, "compile_model"):
            model.compile_model(**kwargs)
            return model, "compile_model()"
        model.compile_blocks(**kwargs)
        return model, "compile_blocks() (this blocklab has no compile_model)"
    return model, "eager"


def timed_training(model: torch.nn.Module, mode: str, batch: int, opts: argparse.Namespace,
                   device: torch.device) -> dict:
    """first_step_s (compilation included), tokens_per_s (median chunk), runs (every chunk), the loss
    used, how the model was compiled and the warnings of the first step (a compile fallback names its
    error there)."""
    from blocklab.training.step import lm_loss

    forward, compiled = prepare(model, mode, opts)
    # the trainer's loss for blocklab; float32 cross-entropy of the logits for the hand model and for
    # torch.compile(model), whose compiled forward returns logits
    trainer_loss = isinstance(model, blocklab.LanguageModel) and mode != "compile-model"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    vocab = model.cfg.vocab_size if isinstance(model, blocklab.LanguageModel) else model.wte.num_embeddings
    tokens = torch.randint(0, vocab, (batch, opts.seq_len + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)

    def step() -> None:
        if trainer_loss:
            with autocast:  # as train_step calls it
                loss = lm_loss(model, {"input_ids": inputs, "labels": targets})
        else:
            with autocast:
                logits = forward(inputs)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    sync(device)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step()  # the first step: compilation for the compiled modes
    sync(device)
    first = time.perf_counter() - start
    for w in caught:  # shown as usual too
        warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    for _ in range(opts.warmup - 1):
        step()
    rates = []
    for _ in range(opts.repeats):
        sync(device)
        start = time.perf_counter()
        for _ in range(opts.steps):
            step()
        sync(device)
        rates.append(opts.steps * batch * opts.seq_len / (time.perf_counter() - start))
    messages = list(dict.fromkeys(f"{w.category.__name__}: {str(w.message)[:300]}" for w in caught))
    return dict(first_step_s=first, tokens_per_s=statistics.median(rates), runs=rates,
                loss="lm_loss" if trainer_loss else "F.cross_entropy(logits.float())", compiled=compiled,
                first_step_warnings=messages)


# -- decoding ----------------------------------------------------------------------------------------
def decode(model: blocklab.LanguageModel, opts: argparse.Namespace, device: torch.device,
           compiled: bool = False) -> dict:
    """Greedy tokens/s of `model.generate` (and of the hand loop for pre-ln) per batch size;
    `compiled`: also of a copy of the model with `compile_decoding()` (its compilation in the warm-up;
    frozen weights with `--decode-freeze`)."""
    hand = None
    try:
        hand = HandDecoder(model)
    except ValueError:  # not a plain pre-ln GPT-2 block: no hand-written reference
        pass
    step_compiled = None
    if compiled:
        step_compiled = copy.deepcopy(model)
        step_compiled.compile_decoding(freeze_weights=opts.decode_freeze)
    out = {}
    for b in opts.decode_batches:
        g = torch.Generator().manual_seed(b)
        prompt = torch.randint(0, model.cfg.vocab_size, (b, opts.prompt), generator=g).to(device)
        calls = {"blocklab": lambda p=prompt: model.generate(p, opts.new)}
        if step_compiled is not None:
            calls["compiled"] = lambda p=prompt: step_compiled.generate(p, opts.new)
        if hand is not None:
            calls["hand"] = lambda p=prompt: hand.generate(p, opts.new)
        rates: dict[str, list[float]] = {name: [] for name in calls}
        for call in calls.values():  # warm-up
            call()
        for r in range(opts.decode_repeats):
            names = list(calls)[r % len(calls):] + list(calls)[:r % len(calls)]
            for name in names:
                sync(device)
                start = time.perf_counter()
                calls[name]()
                sync(device)
                rates[name].append(b * opts.new / (time.perf_counter() - start))
        entry: dict = {f"{name}_tokens_per_s": statistics.median(r) for name, r in rates.items()}
        entry["runs"] = rates
        if hand is not None:
            entry["blocklab_vs_hand"] = entry["blocklab_tokens_per_s"] / entry["hand_tokens_per_s"]
            entry["same_tokens"] = bool(torch.equal(calls["blocklab"](), calls["hand"]()))
        if step_compiled is not None:
            entry["compiled_same_tokens"] = bool(torch.equal(calls["compiled"](), calls["blocklab"]()))
        out[str(b)] = entry
    return out


# -- report ------------------------------------------------------------------------------------------
def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def add_hand_ratios(rows: list[dict]) -> None:
    """``vs_hand`` of every measured row: its tokens/s over the hand model's of the same batch in the same
    mode (`hand_mode`; 1 for the hand rows); None where that hand row is missing or was skipped."""
    hand = {(r["batch"], r["mode"]): r["tokens_per_s"] for r in rows
            if r["arch"] == HAND and "skipped" not in r}
    for r in rows:
        if "skipped" not in r:
            ref = hand.get((r["batch"], r["mode"] if r["arch"] == HAND else hand_mode(r["mode"])))
            r["vs_hand"] = r["tokens_per_s"] / ref if ref else None


def table(rows: list[dict], decode_batches: list[int]) -> str:
    header = ["arch", "mode", "batch", "params", "tokens/s (min-max)", "x hand, same mode", "step ms",
              "first step s", "model TFLOP/s", "MFU measured", "MFU datasheet", "peak GiB"]
    header += [f"decode tok/s b{b}" for b in decode_batches]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        if "skipped" in r:
            gap = " |" * (len(header) - 4)
            lines.append(f"| {r['arch']} | {r['mode']} | {r['batch']} | skipped: {r['skipped']} |" + gap)
            continue
        mode = r["mode"] if r["arch"] == HAND or r["mode"] == "eager" else f"{r['mode']}: {r['compiled']}"
        ratio = "1.00 (reference)" if r["arch"] == HAND else fmt(r.get("vs_hand"), ".2f")
        cells = [r["arch"], mode, str(r["batch"]), f"{r['params'] / 1e6:.1f}M",
                 f"{r['tokens_per_s']:,.0f} ({min(r['runs']):,.0f}-{max(r['runs']):,.0f})", ratio,
                 f"{r['step_ms']:.1f}", f"{r['first_step_s']:.1f}", f"{r['model_tflops']:.1f}",
                 f"{100 * r['mfu_measured']:.1f}%",
                 "-" if r["mfu_datasheet"] is None else f"{100 * r['mfu_datasheet']:.1f}%",
                 fmt(r["peak_memory_gib"], ".2f")]
        for b in decode_batches:
            d = r.get("decode", {}).get(str(b))
            if d is None:
                cells.append("-")
            else:
                cell = f"{d['blocklab_tokens_per_s']:,.0f}"
                if "compiled_tokens_per_s" in d:
                    cell += f", compiled {d['compiled_tokens_per_s']:,.0f}"
                if "hand_tokens_per_s" in d:
                    cell += f" (hand {d['hand_tokens_per_s']:,.0f}, {d['blocklab_vs_hand']:.2f}x)"
                cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--archs", default=",".join(ARCHS))
    p.add_argument("--modes", default=None, help=f"comma-separated from {', '.join(MODES)} (default: "
                                                 "eager,compile; eager with --smoke)")
    p.add_argument("--compile-archs", default=None,
                   help="archs that also run the compiled modes (default: all; pre-ln with --quick)")
    p.add_argument("--hand", choices=list(HAND_CHOICES), default="same",
                   help="the hand-written model's modes: same (eager, and compiled when a compiled mode "
                        "runs; default), eager, or none")
    p.add_argument("--compile-backend", default=None,
                   help="torch.compile backend of every compiled mode (default inductor; eager: dynamo only)")
    p.add_argument("--batch", default=None,
                   help="sequences per step, comma-separated: each runs (8,16; default 8; 2 with --smoke)")
    p.add_argument("--vocab", type=int, default=None,
                   help="vocabulary size of every contender (default 50257, GPT-2's; 50304 is it padded to "
                        "a multiple of 128 by hand; 256 with --smoke)")
    p.add_argument("--seq-len", type=int, default=None, help="default 1024; 32 with --smoke")
    p.add_argument("--steps", type=int, default=None, help="steps per timed chunk (default 10)")
    p.add_argument("--repeats", type=int, default=None, help="timed chunks (default 3)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps, compilation included (default 3)")
    p.add_argument("--decode-batches", default=None, help="default 1,8; 1 with --quick; none: skip decoding")
    p.add_argument("--decode-compile-archs", default="pre-ln",
                   help="archs that also decode with compile_decoding() (default pre-ln; none: no arch)")
    p.add_argument("--decode-freeze", action="store_true",
                   help="the compiled decoding copy folds its weights: compile_decoding(freeze_weights=True)")
    p.add_argument("--prompt", type=int, default=None, help="decode prompt length (default 64)")
    p.add_argument("--new", type=int, default=None, help="decoded tokens per call (default 128)")
    p.add_argument("--decode-repeats", type=int, default=None, help="default 3")
    p.add_argument("--peak-n", type=int, default=None, help="matmul size for the measured peak (8192)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: 1 on a CPU, where more only wait on a shared machine)")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="seconds from the start of the process after which no configuration starts, nor "
                        "one expected to end later than that (1.2 x the last eager, or compiled, one; "
                        "default 540)")
    p.add_argument("--quick", action="store_true", help="5 steps x 2 chunks, decode at batch 1, compile "
                                                         "for pre-ln only")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, 2 steps, eager, no file under "
                                                         "benchmarks/ (a check that the script runs)")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON results (default benchmarks/results/gpu.json; with --smoke a file in a "
                        "temporary folder)")
    a = p.parse_args(argv)

    def pick(value, normal, quick, smoke):
        return value if value is not None else smoke if a.smoke else quick if a.quick else normal

    a.modes = pick(a.modes, "eager,compile", "eager,compile", "eager").split(",")
    bad = [m for m in a.modes if m not in MODES]
    if bad:
        p.error(f"--modes {','.join(bad)} is not allowed: choose from {', '.join(MODES)}")
    a.archs = a.archs.split(",")
    a.compile_archs = pick(a.compile_archs, ",".join(a.archs), "pre-ln", ",".join(a.archs)).split(",")
    a.hand = HAND_CHOICES[a.hand]
    batches = pick(a.batch, "8", "8", "2").split(",")
    if not all(b.isdigit() and int(b) > 0 for b in batches):
        p.error(f"--batch {','.join(batches)} is not allowed: give positive integers, comma-separated")
    a.batch = [int(b) for b in batches]
    if a.vocab is not None and a.vocab < 2:
        p.error(f"--vocab {a.vocab} is not allowed: give a vocabulary size of at least 2")
    a.seq_len = pick(a.seq_len, 1024, 1024, 32)
    a.steps = pick(a.steps, 10, 5, 2)
    a.repeats = pick(a.repeats, 3, 2, 1)
    a.warmup = pick(a.warmup, 3, 2, 1)
    batches = pick(a.decode_batches, "1,8", "1", "1,2")
    a.decode_batches = [] if batches == "none" else [int(b) for b in batches.split(",")]
    a.decode_compile_archs = [] if a.decode_compile_archs == "none" else a.decode_compile_archs.split(",")
    a.prompt = pick(a.prompt, 64, 64, 8)
    a.new = pick(a.new, 128, 128, 8)
    a.decode_repeats = pick(a.decode_repeats, 3, 2, 1)
    a.peak_n = pick(a.peak_n, 8192, 8192, 256)
    if a.decode_batches and a.prompt + a.new > a.seq_len:
        p.error(f"--prompt {a.prompt} + --new {a.new} exceed --seq-len {a.seq_len}, the model's context")
    return a


def configurations(opts: argparse.Namespace) -> list[tuple[int, str, str]]:
    """(batch, arch, mode) in run order: per batch and mode, the hand model in the matching mode first
    (once per batch), then blocklab's archs."""
    out: list[tuple[int, str, str]] = []
    for batch in opts.batch:
        for mode in opts.modes:
            archs = [a for a in opts.archs if mode == "eager" or a in opts.compile_archs]
            hand = (batch, HAND, hand_mode(mode))
            if archs and hand_mode(mode) in opts.hand and hand not in out:
                out.append(hand)
            out += [(batch, arch, mode) for arch in archs]
    return out


def main(argv: list[str] | None = None) -> dict:
    # the budget's clock: from this call, less the imports' time (not from the import, which a caller
    # such as a test session may have made many minutes earlier)
    began = time.perf_counter() - IMPORT_S
    opts = parse_args(argv)
    device = torch.device(opts.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here; on a CPU run `--device cpu --smoke`")
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    if opts.threads or device.type == "cpu":
        torch.set_num_threads(opts.threads or 1)
    dims = dict(SMOKE_DIMS if opts.smoke else SIZES["gpt2"])
    if opts.vocab is not None:
        dims["vocab_size"] = opts.vocab
    info = machine_info(opts.device, torch.get_num_threads())
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else info["cpu"]
    sheet = datasheet_peak(name) if device.type == "cuda" else None
    peaks = dict(device_name=name, measured_tflops=measured_peak_tflops(device, opts.peak_n),
                 measured_matmul_n=opts.peak_n, datasheet_entry=sheet[0] if sheet else None,
                 datasheet_tflops=sheet[1] if sheet else None)
    print(f"# bench_gpu on {name}: archs {opts.archs}, modes {opts.modes}, hand {list(opts.hand)}, batch "
          f"{opts.batch} x {opts.seq_len}, vocab {dims['vocab_size']}, {opts.repeats} x {opts.steps} timed "
          f"steps after {opts.warmup}; measured bf16 peak {peaks['measured_tflops']:.1f} TFLOP/s; "
          f"datasheet {sheet or 'none for this device'}", flush=True)
    out = opts.out or (Path(tempfile.gettempdir()) / "bench_gpu-smoke.json" if opts.smoke
                       else RESULTS / "gpu.json")
    start = time.perf_counter()
    last: dict[str, float] = {}  # seconds the latest eager, and compiled, configuration took
    rows: list[dict] = []
    result = dict(machine=info, command=" ".join(["python", *sys.argv]) if argv is None else argv,
                  smoke=opts.smoke, dims=dims, gpt2_block=BLOCK, peaks=peaks,
                  options={k: v for k, v in vars(opts).items() if k != "out"}, elapsed_s=0.0, rows=rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    for batch, arch, mode in configurations(opts):
        kind = "eager" if mode == "eager" else "compiled"
        elapsed = time.perf_counter() - began  # the imports and the peak measurement count too
        expected = elapsed + 1.2 * last.get(kind, 0.0)
        if expected > opts.budget_s:
            why = f"time budget: {elapsed:.0f} s gone, ~{expected:.0f} s after it > {opts.budget_s:g} s"
            rows.append(dict(arch=arch, mode=mode, batch=batch, skipped=why))
            continue
        t0 = time.perf_counter()
        try:
            rows.append(train(arch, mode, batch, opts, dims, device, peaks))
        except Exception as e:  # one failing configuration must not lose the others' results
            why = f"{type(e).__name__}: {str(e)[:200]}"
            rows.append(dict(arch=arch, mode=mode, batch=batch, skipped=why))
            free(device)
        last[kind] = time.perf_counter() - t0
        print(f"  {arch} {mode} batch {batch}: {last[kind]:.0f} s", flush=True)
        add_hand_ratios(rows)
        result["elapsed_s"] = time.perf_counter() - start
        out.write_text(json.dumps(result, indent=1, default=str))  # kept if a later configuration hangs
    text = table(rows, opts.decode_batches)
    result["table"], result["elapsed_s"] = text, time.perf_counter() - start
    out.write_text(json.dumps(result, indent=1, default=str))
    print(text)
    print(f"# total {time.perf_counter() - start:.0f} s; wrote {out}")
    return result


IMPORT_S = time.perf_counter() - IMPORTING  # seconds this module's imports took


if __name__ == "__main__":
    main()
