"""Training throughput of blocklab against a hand-written GPT-2 and Hugging Face GPT-2 of the same shape
(issues 4 and 37).

Every model is built from one `transformers.GPT2Config`: HF's `GPT2LMHeadModel` directly, blocklab's
`Transformer` from `blocklab.interop.config_from_hf` of it (pre-LN, learned positions, LayerNorm,
GELU_tanh MLP, biases, tied embeddings, no dropout), and the hand-written model (`hand_gpt.HandGPT`: a
nanoGPT-style GPT-2, fused QKV, SDPA, tied head, the plain-PyTorch reference) of its shape, so they
have the same parameters and compute the same function (checked before timing, on perturbed weights:
`from_hf` of an HF model gives HF's logits, and blocklab built from the hand model's weights, through
that HF layout, gives the hand model's logits). "blocklab sas-p" is blocklab's `sas-p` block preset
applied to the same config (the GPT-2 shape and block fields, SAS-P's own fields on top): fewer
parameters and FLOPs per token (`blocklab.flops_per_token`), so each size with it reports SAS-P's
tokens/s over Pre-LN's next to the inverse of its FLOPs ratio, the speed its FLOPs promise. Sizes:

    tiny        4 layers, d 128, 4 heads, context 128, vocab 4096 (blocklab's `tiny` shape)
    small       6 layers, d 256, 4 heads, MLP 1024, context 256, vocab 8192 (blocklab's `small` preset's
                dims, with GPT-2's block in place of its RoPE / RMSNorm / ReLU)
    d768x4      4 layers, d 768, 12 heads, MLP 3072, context 128, vocab 50257 (GPT-2 small's width and
                vocabulary, 4 layers)
    gpt2-small  12 layers, d 768, 12 heads, context 1024, vocab 50257 (GPT-2 small, 124M parameters)

Contenders per size: tiny and gpt2-small (issue 4) time blocklab, a second identical blocklab child
("blocklab (control)", whose ratio to "blocklab" shows what noise alone does), HF with
attn_implementation="sdpa", HF "eager" (`--no-eager` drops it) and the hand model, with HF sdpa the
reference of the ratios; small and d768x4 (issue 37) time the hand model (the reference), blocklab,
its control and blocklab sas-p. `--reference hand` or `hf-sdpa` sets the reference of every size (HF
sdpa joins a size that lacks it). A training step is the same in every child: logits = model(ids),
mean float32 cross-entropy, backward, `torch.optim.AdamW` step, zero_grad(set_to_none=True); HF is
called with `use_cache=False`; blocklab's loss is the trainer's own
(`blocklab.training.step.lm_loss(model, {"input_ids", "labels"})`; `--blocklab-loss logits` gives it
the logits loss of the others). Each model runs in its own child process with
`torch.set_num_threads(--threads)` (default 1); warm-up, then repeats interleaved round-robin
(`_measure.bench_training`). On CPU, GPT-2 small runs at sequence 256 (batch 1): one step at
sequence 1024 takes ~27 s on one thread, too long to repeat; small runs batch 4 x 256 and d768x4
batch 1 x 128 (about 2 s and 2.7 s a step on one thread of this project's 2-core CPU under a load
of ~6, so about a second each on 2 threads).

The blocklab Trainer (`blocklab.training.train`) is also timed at the tiny shape, on a byte
tokenizer over a small corpus written to a temporary directory (Python standard-library sources),
next to the raw step loop in the same child, to show what the trainer adds (data loading, gradient
clipping, loss sync, logging, validation, checkpoint).

GPU (`--device cuda`): bf16 autocast and per-block `torch.compile` (every model), GPT-2 small at
batch 16 x 1024, and model FLOPs utilisation

    MFU = flops_per_token x tokens/s / peak,

flops_per_token from `blocklab.flops_per_token` (6 x matmul weights + 12 L H d_head T: forward and
backward, attention counted over all T keys as in PaLM / nanoGPT), peak measured in a child: the
best rate of a timed square matmul in the run's dtype (bf16 on CUDA, float32 on CPU) with the run's
threads (`measured_peak_tflops`). `--peak-tflops` overrides it (989 is the H100 SXM datasheet's
dense bf16 rate, which the table also reports MFU against on CUDA).

    PYTHONPATH=src python benchmarks/bench_train.py [--quick] [--sizes tiny,gpt2-small] [--no-eager]
    PYTHONPATH=src python benchmarks/bench_train.py --sizes small,d768x4 --threads 2 --no-trainer
    PYTHONPATH=src python benchmarks/bench_train.py --device cuda [--peak-tflops 989]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

import blocklab
from _measure import _worker, bench_training, in_child, machine_info, memory_mark, memory_unit, prime, table
from _measure import train_steps as timed_steps
from blocklab.interop import config_from_hf, from_hf
from blocklab.model.presets import BLOCK_PRESETS
from blocklab.training import train
from blocklab.training.metrics import read_metrics
from blocklab.training.step import lm_loss
from hand_gpt import HandGPT, hf_state_dict

SHAPES = {
    "tiny": dict(n_layer=4, n_embd=128, n_head=4, n_positions=128, vocab_size=4096),
    "small": dict(n_layer=6, n_embd=256, n_head=4, n_positions=256, vocab_size=8192),
    "d768x4": dict(n_layer=4, n_embd=768, n_head=12, n_positions=128, vocab_size=50257),
    "gpt2-small": dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257),
}
# (batch, sequence) per device; on one thread of this project's shared 2-core CPU (load ~6) a step of small
# took ~2 s, of d768x4 ~2.7 s (its 50257-row head is 56% of its FLOPs), and of GPT-2 small at T = 1024 ~27 s
SHAPE_RUN = {"cpu": {"tiny": (8, 128), "small": (4, 256), "d768x4": (1, 128), "gpt2-small": (1, 256)},
             "cuda": {"tiny": (64, 128), "small": (64, 256), "d768x4": (64, 128), "gpt2-small": (16, 1024)}}
STEPS = {"cpu": {"tiny": 4, "small": 2, "d768x4": 2, "gpt2-small": 1},  # per timed chunk
         "cuda": {"tiny": 10, "small": 10, "d768x4": 10, "gpt2-small": 10}}
REPEATS = {"cpu": {"tiny": 9, "small": 11, "d768x4": 11, "gpt2-small": 9},
           "cuda": {"tiny": 5, "small": 5, "d768x4": 5, "gpt2-small": 5}}
WARMUP = {"cpu": 2, "cuda": 5}  # steps; on CUDA they include the compilation
H100_SXM_BF16_TFLOPS = 989.0  # NVIDIA H100 SXM datasheet, dense bf16 tensor core
HF_SDPA, OURS, CONTROL, HAND, SAS_P = "HF sdpa", "blocklab", "blocklab (control)", "hand", "blocklab sas-p"
KINDS = {OURS: "blocklab", CONTROL: "blocklab", HF_SDPA: "hf-sdpa", "HF eager": "hf-eager", HAND: "hand",
         SAS_P: "blocklab-sas-p"}
HF_SIZES = ("tiny", "gpt2-small")  # issue 4's sizes: against HF; the others against the hand model
REFERENCES = {"hand": HAND, "hf-sdpa": HF_SDPA}
TRAINER_STEPS = 30


# -- the models ----------------------------------------------------------------------------------
def hf_config(shape: dict, attn: str = "sdpa"):
    """The GPT2Config of a shape, without dropout."""
    from transformers import GPT2Config

    last = shape["vocab_size"] - 1  # GPT-2's 50256 does not exist in a smaller vocabulary
    return GPT2Config(**shape, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=last,
                      eos_token_id=last, attn_implementation=attn)


def blocklab_config(kind: str, shape: dict) -> blocklab.ModelConfig:
    """blocklab's config of a GPT-2 shape: pre-ln (`config_from_hf`), or for kind blocklab-sas-p the
    sas-p block preset's fields applied on top of it (everything else, the shape and GPT-2's block, kept)."""
    cfg = config_from_hf(hf_config(shape))
    if kind != "blocklab-sas-p":
        return cfg
    block = BLOCK_PRESETS["sas-p"].fields
    return blocklab.ModelConfig.from_preset("sas-p", **{k: v for k, v in cfg.to_dict().items()
                                                        if k not in block})


def make_hand(shape: dict) -> HandGPT:
    """The hand-written GPT-2 of a GPT2Config shape."""
    return HandGPT(shape["vocab_size"], shape["n_embd"], shape["n_layer"], shape["n_head"],
                   shape["n_positions"])


def blocklab_from_hand(hand: HandGPT, shape: dict) -> blocklab.LanguageModel:
    """blocklab's pre-ln with the hand model's weights: through HF's GPT-2 layout and `from_hf`."""
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel(hf_config(shape)).to(hand.wte.weight.dtype)
    hf.load_state_dict(hf_state_dict(hand))  # strict: every weight of the layout filled
    return from_hf(hf)


def build(kind: str, shape: dict):
    """(model, forward: ids -> logits, its repeated blocks) for kind blocklab, blocklab-sas-p, hand,
    hf-sdpa or hf-eager."""
    if kind.startswith("blocklab"):
        model = blocklab.LanguageModel(blocklab_config(kind, shape))
        return model, model, model.blocks
    if kind == "hand":
        model = make_hand(shape)
        return model, model, model.blocks
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel(hf_config(shape, attn=kind.removeprefix("hf-")))
    return model, lambda ids: model(input_ids=ids, use_cache=False).logits, model.transformer.h


def prime_kind(kind: str, dev: torch.device) -> None:
    """One training step of a throwaway 1-layer model of the same library, so that its lazy imports and
    first-call set-up are not counted in the memory figures (HF's add ~90 MiB of RSS)."""
    model, forward, _ = build(kind, dict(n_layer=1, n_embd=16, n_head=2, n_positions=16, vocab_size=64))
    ids = torch.randint(0, 64, (2, 9), device=dev)
    model.to(dev)
    F.cross_entropy(forward(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()).backward()
    torch.optim.AdamW(model.parameters()).step()


def model_flops(kind: str, size: str, seq_len: int) -> int:
    """Analytic training FLOPs per token of a kind at a GPT-2 shape: blocklab's config of it (pre-ln for
    the hand model and HF, which compute the same function)."""
    with torch.device("meta"):
        model = blocklab.LanguageModel(blocklab_config(kind, SHAPES[size]))
    return blocklab.flops_per_token(model, seq_len)


def perturb(model: torch.nn.Module, scale: float = 0.02) -> None:
    """Move every parameter off its init: biases 0 and LayerNorm gains 1 would hide errors."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))


def check_same_model(size: str) -> dict:
    """The contenders are one shape and function: blocklab's import of a perturbed HF model gives HF's
    logits, and blocklab built from a perturbed hand model's weights gives the hand model's logits."""
    torch.manual_seed(0)
    shape = SHAPES[size]
    ids = torch.randint(0, shape["vocab_size"], (2, 16))
    hf, _, _ = build("hf-sdpa", shape)
    hand = make_hand(shape)
    perturb(hf)
    perturb(hand)
    pairs = {"hf": (from_hf(hf), lambda i: hf(input_ids=i, use_cache=False).logits, hf),
             "hand": (blocklab_from_hand(hand, shape), hand, hand)}
    out = {}
    for name, (ours, theirs, model) in pairs.items():
        with torch.no_grad():
            diff = (ours(ids) - theirs(ids)).abs().max().item()
        counts = [sum(p.numel() for p in m.parameters()) for m in (ours, model)]
        if diff > 1e-4 or counts[0] != counts[1]:
            raise RuntimeError(f"{size}: blocklab and {name} differ (max |logit diff| {diff:.2e}, "
                               f"params {counts})")
        out[name] = dict(max_abs_logit_diff=diff, params=counts[0])
    return out


def setup_child(opts: dict, kind: str, size: str, device: str, threads: int) -> None:
    """Child initialiser for `_measure.bench_training`: one model, its AdamW and a random batch."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    dev = torch.device(device)
    prime(dev)
    prime_kind(kind, dev)
    model, forward, blocks = build(kind, SHAPES[size])
    model.to(dev).train()
    if opts["compile"]:
        for block in blocks:  # per block, as the Trainer does: one small graph reused by every layer
            block.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch_size, seq_len = opts["batch"][size]
    batch = torch.randint(0, SHAPES[size]["vocab_size"], (batch_size, seq_len + 1), device=dev)
    inputs, labels = batch[:, :-1], batch[:, 1:]
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=opts["bf16"])
    trainer_loss = kind.startswith("blocklab") and opts["blocklab_loss"] == "lm_loss"

    def step() -> None:
        with autocast:
            if trainer_loss:  # the trainer's own loss (train_step calls it under autocast)
                loss = lm_loss(model, {"input_ids": inputs, "labels": labels})
            else:
                loss = F.cross_entropy(forward(inputs).flatten(0, 1).float(), labels.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    _worker.update(step=step, device=dev, tokens=batch_size * seq_len, base=memory_mark(dev),
                   params=dict(total=sum(p.numel() for p in model.parameters())),
                   flops=model_flops(kind, size, seq_len))


# -- the trainer against the raw step loop ---------------------------------------------------------
def write_corpus(folder: Path, n_files: int = 40, max_bytes: int = 20_000) -> int:
    """A small local text corpus: the first n_files standard-library modules, up to max_bytes each."""
    folder.mkdir(parents=True)
    sources = sorted(Path(os.__file__).parent.glob("*.py"))[:n_files]
    total = 0
    for src in sources:
        text = src.read_text(encoding="utf-8", errors="replace")[:max_bytes]
        (folder / f"{src.stem}.txt").write_text(text, encoding="utf-8")
        total += len(text.encode())
    return total


def trainer_vs_raw(opts: dict, device: str, threads: int, steps: int) -> dict:
    """In one child: the raw step loop, then `blocklab.training.train` for `steps` steps, then the raw
    loop again, all at the tiny GPT-2 shape and the same batch."""
    size = "tiny"
    setup_child(opts, "blocklab", size, device, threads)
    batch_size, seq_len = opts["batch"][size]
    timed_steps(WARMUP[device])
    raw_before = timed_steps(steps)
    cfg = config_from_hf(hf_config(SHAPES[size]))
    model_fields = {k: v for k, v in cfg.to_dict().items() if k != "context_length"}  # from seq_len
    with tempfile.TemporaryDirectory() as tmp:
        corpus_bytes = write_corpus(Path(tmp) / "corpus")
        start = time.perf_counter()
        result = train(
            arch="pre-ln", size=size, model=model_fields,  # vocab 4096 kept: the byte ids use 258 rows
            data=dict(source=str(Path(tmp) / "corpus"), tokenizer="byte", val_fraction=0.1,
                      cache_dir=str(Path(tmp) / "cache")),
            batch_size=batch_size, seq_len=seq_len, max_steps=steps, eval_every=0, eval_batches=2,
            log_every=10, ckpt_every=0, progress=False, device=device,
            precision="bfloat16" if opts["bf16"] else "float32", compile=opts["compile"],
            out_dir=str(Path(tmp) / "run"))
        wall = time.perf_counter() - start
        run_dir = result.run_dir
        summary = json.loads((run_dir / "summary.json").read_text())
        resolved = json.loads((run_dir / "model_config.json").read_text())
        logged = read_metrics(run_dir / "metrics.jsonl", "train")
        windows = [(row["step"], row["tokens_per_s"]) for row in logged if "tokens_per_s" in row]
    if resolved != json.loads(cfg.to_json()):
        raise RuntimeError("the Trainer built another shape than the GPT-2 config: "
                           f"{ {k: v for k, v in resolved.items() if cfg.to_dict().get(k) != v} }")
    raw_after = timed_steps(steps)
    return dict(steps=steps, batch=[batch_size, seq_len], corpus_bytes=corpus_bytes,
                raw_before=raw_before, raw_after=raw_after,
                trainer_summary=summary["tokens_per_s"], trainer_train_time_s=summary["train_time"],
                trainer_windows=windows, trainer_wall_s=wall,
                trainer_end_to_end=summary["tokens"] / wall, val_loss=summary["val_loss"])


def measured_peak_tflops(device: str, threads: int, bf16: bool) -> float:
    """The best TFLOP/s of n x n matmuls (2 n^3 FLOPs each) in the run's dtype: the peak for MFU."""
    torch.set_num_threads(threads)
    dtype = torch.bfloat16 if bf16 else torch.float32
    n = 8192 if device == "cuda" else 1024
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    best = 0.0
    for _ in range(5):  # the best of 5 timed batches, after the first (warm-up) one
        sync()
        t0 = time.perf_counter()
        for _ in range(10):
            a @ b
        sync()
        best = max(best, 2 * n**3 * 10 / (time.perf_counter() - t0) / 1e12)
    return best


# -- the run -------------------------------------------------------------------------------------
def contenders(size: str, opts: dict) -> tuple[dict[str, str], str]:
    """label -> kind of the children measured at `size`, and the label of the reference of its ratios."""
    if size in HF_SIZES:
        labels = [OURS, CONTROL, HF_SDPA, *(["HF eager"] if opts["eager"] else []), HAND]
    else:
        labels = [HAND, OURS, CONTROL, SAS_P]
    choice = opts["reference"]
    ref = REFERENCES[choice] if choice != "auto" else HF_SDPA if size in HF_SIZES else HAND
    if ref not in labels:
        labels.append(ref)
    return {label: KINDS[label] for label in labels}, ref


def bench_size(size: str, opts: dict, device: str, threads: int, warmup: int, repeats: int,
               steps: int) -> list[dict]:
    labels, ref_label = contenders(size, opts)
    results = bench_training(labels, size, device, threads, warmup, repeats, steps,
                             setup=partial(setup_child, opts))
    ref = results[ref_label]
    rows = []
    for label, r in results.items():
        paired = [a / b for a, b in zip(r["runs"], ref["runs"], strict=True)]  # the same repeat
        rows.append(dict(size=size, label=label, kind=labels[label], reference=ref_label,
                         batch=opts["batch"][size], **r, vs_reference=r["tokens_per_s"] / ref["tokens_per_s"],
                         vs_reference_paired=statistics.median(paired),
                         model_flops_per_s=r["flops_per_token"] * r["tokens_per_s"]))
    for row in rows:
        row["mfu"] = row["model_flops_per_s"] / (opts["peak_tflops"] * 1e12)
        if device == "cuda":
            row["mfu_datasheet"] = row["model_flops_per_s"] / (H100_SXM_BF16_TFLOPS * 1e12)
    params = {row["params"]["total"] for row in rows if row["kind"] != "blocklab-sas-p"}
    if len(params) != 1:
        raise RuntimeError(f"{size}: the GPT-2-shaped children have different parameter counts {params}")
    return rows


def sas_p_summary(rows: list[dict]) -> dict | None:
    """SAS-P's tokens/s over Pre-LN's (ratio of medians, and the median of the per-repeat ratios) next to
    the inverse of its FLOPs ratio, FLOPs(pre-ln) / FLOPs(sas-p) per token: the speed-up its FLOPs promise.
    None for a size without SAS-P."""
    by = {r["label"]: r for r in rows}
    if SAS_P not in by:
        return None
    pre, sas = by[OURS], by[SAS_P]
    paired = [a / b for a, b in zip(sas["runs"], pre["runs"], strict=True)]
    return dict(size=pre["size"], speed=sas["tokens_per_s"] / pre["tokens_per_s"],
                speed_paired=statistics.median(paired),
                inverse_flops_ratio=pre["flops_per_token"] / sas["flops_per_token"],
                flops_per_token=dict(pre_ln=pre["flops_per_token"], sas_p=sas["flops_per_token"]),
                params=dict(pre_ln=pre["params"]["total"], sas_p=sas["params"]["total"]))


class LoadSampler:
    """Polls the 1-minute load average in the background: the machine is shared."""

    def __init__(self, every: float = 10.0):
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    def _run(self, every: float) -> None:
        while not self._stop.is_set():
            self.samples.append(round(os.getloadavg()[0], 2))
            self._stop.wait(every)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        s = self.samples
        return dict(n=len(s), min=min(s), median=statistics.median(s), max=max(s))


def throughput_table(rows: list[dict], device: str) -> str:
    """One markdown table per size, its ratios to that size's reference."""
    out = []
    for size in dict.fromkeys(r["size"] for r in rows):
        group = [r for r in rows if r["size"] == size]
        ref = group[0]["reference"]
        header = ["size", "model", "batch x seq", "params", "GFLOP/token", "tokens/s", "(min-max)",
                  f"x {ref}", f"x {ref} (paired)", "model GFLOP/s", f"memory ({memory_unit(device)})", "MFU"]
        lines = [[r["size"], r["label"], "{} x {}".format(*r["batch"]), f"{r['params']['total'] / 1e6:.2f}M",
                  f"{r['flops_per_token'] / 1e9:.3f}", f"{r['tokens_per_s']:,.0f}",
                  f"({min(r['runs']):,.0f}-{max(r['runs']):,.0f})", f"{r['vs_reference']:.2f}",
                  f"{r['vs_reference_paired']:.2f}", f"{r['model_flops_per_s'] / 1e9:.1f}",
                  f"{r['peak_mib']:.0f}", f"{100 * r['mfu']:.1f}%"] for r in group]
        out.append(table(header, lines))
    return "\n\n".join(out)


def sas_p_table(summaries: list[dict]) -> str:
    header = ["size", "SAS-P / Pre-LN tokens/s", "(paired)", "Pre-LN / SAS-P FLOPs per token (the promise)",
              "params Pre-LN / SAS-P"]
    return table(header, [[s["size"], f"{s['speed']:.2f}", f"{s['speed_paired']:.2f}",
                           f"{s['inverse_flops_ratio']:.2f}",
                           f"{s['params']['pre_ln'] / 1e6:.2f}M / {s['params']['sas_p'] / 1e6:.2f}M"]
                          for s in summaries])


def trainer_table(t: dict) -> str:
    raw = statistics.mean([t["raw_before"], t["raw_after"]])
    steps = [0] + [step for step, _ in t["trainer_windows"]]
    figures = {"raw step loop, before": t["raw_before"], "raw step loop, after": t["raw_after"],
               "Trainer, summary.json tokens_per_s (step time only)": t["trainer_summary"],
               f"Trainer, last logged window (metrics.jsonl, steps {steps[-2] + 1}-{steps[-1]})":
                   t["trainer_windows"][-1][1],
               "Trainer, end to end (tokens / wall time of train())": t["trainer_end_to_end"]}
    return table(["tiny GPT-2 shape", "tokens/s", "x raw loop (mean of before, after)"],
                 [[name, f"{rate:,.0f}", f"{rate / raw:.2f}"] for name, rate in figures.items()])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--sizes", help=f"comma-separated, from {', '.join(SHAPES)} (default: all on CPU, "
                                    "gpt2-small on CUDA)")
    ap.add_argument("--quick", action="store_true", help="one repeat of one step (smoke test)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in every child")
    ap.add_argument("--reference", choices=["auto", *REFERENCES], default="auto",
                    help="the reference of the ratios: hand (the hand-written model), hf-sdpa, or auto "
                         f"(default: HF sdpa at {' and '.join(HF_SIZES)}, the hand model at the others)")
    ap.add_argument("--blocklab-loss", choices=["lm_loss", "logits"], default="lm_loss",
                    help="blocklab's loss: the trainer's lm_loss (default) or float32 cross-entropy of its "
                         "logits, as the other contenders")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction,
                    help="bf16 autocast (default: on for CUDA, off for CPU)")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction,
                    help="torch.compile every block (default: on for CUDA, off for CPU)")
    ap.add_argument("--eager", action=argparse.BooleanOptionalAction, default=True,
                    help="also time HF with attn_implementation='eager'")
    ap.add_argument("--trainer", action=argparse.BooleanOptionalAction, default=True,
                    help="also time blocklab.training.train at the tiny shape")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="peak TFLOP/s for MFU (default: measured with a timed matmul in the run's dtype; "
                         f"{H100_SXM_BF16_TFLOPS:g} is the H100 SXM datasheet's dense bf16)")
    ap.add_argument("--out", type=Path, help="JSON results (default benchmarks/results/train-<device>.json)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda is not allowed here: torch.cuda.is_available() is False")
    args.sizes = (args.sizes or ("gpt2-small" if args.device == "cuda" else ",".join(SHAPES))).split(",")
    unknown = [s for s in args.sizes if s not in SHAPES]
    if unknown:
        ap.error(f"--sizes {','.join(unknown)} is not allowed: choose from {', '.join(SHAPES)}")
    if args.threads < 1:
        ap.error(f"--threads {args.threads} is not allowed: give a positive integer")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    cuda = args.device == "cuda"
    sizes = args.sizes
    opts = dict(batch=SHAPE_RUN[args.device], eager=args.eager, reference=args.reference,
                blocklab_loss=args.blocklab_loss, bf16=cuda if args.bf16 is None else args.bf16,
                compile=cuda if args.compile is None else args.compile, peak_tflops=args.peak_tflops)
    out = args.out or Path(__file__).parent / "results" / f"train-{args.device}.json"
    warmup = 1 if args.quick else WARMUP[args.device]

    info = machine_info(args.device, args.threads)
    info["transformers"] = importlib.metadata.version("transformers")
    print(f"machine: {info}\noptions: {opts}\n", flush=True)
    if opts["peak_tflops"] is None:
        opts["peak_tflops"] = in_child(measured_peak_tflops, args.device, args.threads, opts["bf16"])
        opts["peak_source"] = "measured matmul, " + ("bf16" if opts["bf16"] else "float32")
    else:
        opts["peak_source"] = "--peak-tflops"
    print(f"peak for MFU: {opts['peak_tflops']:.2f} TFLOP/s ({opts['peak_source']})", flush=True)
    load, start = LoadSampler(), time.perf_counter()
    # in a child: the parent must stay small, since a spawned child's ru_maxrss starts at the parent's RSS
    checks = {size: in_child(check_same_model, size) for size in sizes}
    print(f"same model (perturbed weights: from_hf of HF, and blocklab from the hand model): {checks}\n",
          flush=True)
    rows: list[dict] = []
    seconds: dict[str, float] = {}
    summaries: list[dict] = []
    repeats = {s: 1 if args.quick else REPEATS[args.device][s] for s in sizes}
    steps = {s: 1 if args.quick else STEPS[args.device][s] for s in sizes}
    result = dict(machine=info, command=" ".join(["python", *sys.argv]) if argv is None else argv,
                  seconds=seconds, args=dict(quick=args.quick, sizes=sizes, warmup=warmup, repeats=repeats,
                                             steps=steps, **opts),
                  same_model_check=checks, rows=rows, sas_p_vs_pre_ln=summaries, trainer=None)
    out.parent.mkdir(parents=True, exist_ok=True)
    for size in sizes:
        t0 = time.perf_counter()
        size_rows = bench_size(size, opts, args.device, args.threads, warmup, repeats[size], steps[size])
        rows += size_rows
        summaries += [s for s in [sas_p_summary(size_rows)] if s]
        seconds[size] = time.perf_counter() - t0
        print(f"{size}: {seconds[size]:.0f} s", flush=True)
        out.write_text(json.dumps(result, indent=2))  # kept if a later size is cut off
    trainer = None
    if args.trainer and "tiny" in sizes:
        t0 = time.perf_counter()
        n_steps = 3 if args.quick else TRAINER_STEPS
        trainer = in_child(trainer_vs_raw, opts, args.device, args.threads, n_steps)
        seconds["trainer"] = time.perf_counter() - t0
    total = time.perf_counter() - start

    print(f"\n## Training step: blocklab against the hand-written model and HF GPT2LMHeadModel of the same "
          f"shape ({total:.0f} s)\n")
    print(throughput_table(rows, args.device) + "\n")
    if summaries:
        print("## SAS-P against Pre-LN: tokens/s and the inverse FLOPs ratio\n")
        print(sas_p_table(summaries) + "\n")
    if trainer:
        print(f"## Trainer vs raw step loop ({seconds['trainer']:.0f} s)\n")
        print(trainer_table(trainer) + "\n")
    info["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    info["load_1min_during_run"] = load.stop()
    print(f"load average (1 min) during the run: {info['load_1min_during_run']}")
    seconds["total"] = total
    result["trainer"] = trainer
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
