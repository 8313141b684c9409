"""Greedy decoding at the limit: blocklab `generate` against a hand-written loop on the same weights.

The hand-written contender (`HandDecoder`) reads the weights of a blocklab Pre-LN `Transformer` with
standard values and GPT-2's block (LayerNorm, learned positions, GELU, biases, tied or untied head)
into plain tuples and runs its own forward pass: `F.embedding`, `F.layer_norm`, `F.linear`,
`F.scaled_dot_product_attention`, the MLP activation, K and V written into tensors preallocated for
the whole sequence in the (layer, B, H, T, D) layout SDPA reads, no mask while decoding (one query
sees every cached key), under `torch.inference_mode`, no module calls and no objects per step. It is
what blocklab's decode path would cost with no bookkeeping at all: the same kernels in the same
order (Q, K and V are three matmuls as in blocklab, not one fused QKV matmul), so any gap is
per-token Python and dispatch overhead. Before timing, its tokens are checked to equal `generate`'s.

"blocklab generate" is the eager step (``generate(..., compile=False)``), whatever the device; on
CUDA `generate` compiles the step by default, which `--compile default` times beside it.

Measurement: one process, one thread (`--threads`), both contenders built from one model per size;
for each (size, batch) cell a warm-up call each, then `--repeats` calls each, round-robin with the
starting contender alternating. A call is a full greedy generation: the prompt's prefill, then
`--new` tokens one at a time (prompt 64 + 128 new tokens by default); tokens/s = batch x new /
wall time of the call. The table gives the median with the min-max over repeats and the ratio of
medians blocklab / hand loop (>= 1.00: blocklab is as fast), and the median of the per-repeat
ratios (paired, the same repeat), which is steadier on a shared machine.

Sizes (GPT-2's block on each): ``small`` (blocklab's `small` preset dims: d 256, 6 layers, 4 heads,
MLP 1024, vocab 8192) and ``gpt2`` (GPT-2 small: d 768, 12 layers, 12 heads, MLP 3072, vocab 50257);
``tiny`` (d 64, 2 layers) is for the tests.

`--compile MODES` adds one contender per mode (`COMPILE_MODES`), each on its own copy of the model,
its compilation done in the warm-up and its tokens checked like the others': ``default`` is
`generate` as a user calls it (``compile=None``: the compiled step on CUDA, eager on a CPU);
``blocks`` is `compile_blocks(dynamic=True)` (per-block `torch.compile`); ``step`` is
`compile_decoding()`, the whole decoding step (embedding, every block and its cache writes, head) as
one inductor graph; ``step-frozen`` is `compile_decoding(freeze_weights=True)`, that graph with the
weights folded in as constants; ``step-eager`` is `compile_decoding(backend="eager")`, the same graph
captured by dynamo but run with eager kernels, which removes the module stack's Python and keeps the
kernels; ``hand-frozen`` is the hand loop with its step compiled with frozen weights
(`FrozenHandDecoder`), the limit for the frozen step. `--compile` alone means ``blocks``.

    PYTHONPATH=src python benchmarks/bench_decode.py [--sizes small,gpt2] [--batches 1,8] [--repeats 7]
        [--quick] [--compile [default,blocks,step,step-frozen,step-eager,hand-frozen]] [--device cuda]
        [--threads N] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import blocklab
from blocklab.runtime.compiled_step import run_frozen
from blocklab.runtime.generate import generate

SIZES = {
    "tiny": dict(d_model=64, n_layers=2, n_heads=2, mlp_hidden=128, vocab_size=512),  # tests
    "small": dict(d_model=256, n_layers=6, n_heads=4, mlp_hidden=1024, vocab_size=8192),
    "gpt2": dict(d_model=768, n_layers=12, n_heads=12, mlp_hidden=3072, vocab_size=50257),
}
GPT2_BLOCK = dict(norm="layernorm", norm_eps=1e-5, positions="learned", mlp_act="gelu", bias=True,
                  tie_embeddings=True, final_norm=True, dropout=0.0)
ACTIVATIONS = {"gelu": F.gelu, "gelu_tanh": lambda h: F.gelu(h, approximate="tanh"), "relu": F.relu}
RESULTS = Path(__file__).parent / "results"
OURS, HAND = "blocklab generate", "hand loop"
COMPILE_MODES = {  # --compile: contender name per mode
    "default": "blocklab generate, default step",  # compile=None: compiled on CUDA, eager on a CPU
    "blocks": "blocklab generate, compile_blocks",  # per-block torch.compile (dynamic shapes)
    "step": "blocklab generate, compile_decoding",  # the whole decoding step, one inductor graph
    "step-eager": "blocklab generate, captured step",  # the same graph, eager kernels (backend="eager")
    "step-frozen": "blocklab generate, frozen step",  # compile_decoding(freeze_weights=True)
    "hand-frozen": "hand loop, frozen step",  # the hand loop's step compiled the same way
}


def make_model(size: str, context: int, seed: int = 0) -> blocklab.LanguageModel:
    """A blocklab Pre-LN model of GPT-2's block at `size` (a key of SIZES), eval mode, random weights."""
    torch.manual_seed(seed)
    cfg = blocklab.ModelConfig.from_preset("pre-ln", "small", **SIZES[size], **GPT2_BLOCK,
                                           context_length=context)
    return blocklab.LanguageModel(cfg).eval()


# -- the hand-written contender --------------------------------------------------------------------
class Contender(Protocol):
    def generate(self, prompt: Tensor, new: int) -> Tensor: ...


class Layer(NamedTuple):
    ln1_w: Tensor
    ln1_b: Tensor | None
    q_w: Tensor
    q_b: Tensor | None
    k_w: Tensor
    k_b: Tensor | None
    v_w: Tensor
    v_b: Tensor | None
    o_w: Tensor
    o_b: Tensor | None
    ln2_w: Tensor
    ln2_b: Tensor | None
    fc_w: Tensor
    fc_b: Tensor | None
    out_w: Tensor
    out_b: Tensor | None


def _linear(module: nn.Module) -> tuple[Tensor, Tensor | None]:
    if not isinstance(module, nn.Linear):
        raise ValueError(f"the hand loop reads plain nn.Linear weights, not {type(module).__name__}")
    return module.weight, module.bias  # the model's own parameters: a frozen compile folds them


def _norm(module: nn.Module) -> tuple[Tensor, Tensor | None]:
    if not isinstance(module, nn.LayerNorm) or module.weight is None:
        raise ValueError(f"the hand loop reads LayerNorm weights, not {type(module).__name__}")
    return module.weight, module.bias


def _is_one(gain: nn.Module | None) -> bool:
    return gain is not None and getattr(gain, "gain", 0) is None and getattr(gain, "init", 0) == 1.0


class HandDecoder:
    """Greedy decoding of a blocklab Pre-LN, GPT-2-block model by a minimal loop over its weights."""

    def __init__(self, model: blocklab.LanguageModel):
        cfg = model.cfg
        supported = (cfg.block_layout == "pre-ln" and cfg.attn_matrix == "softmax" and cfg.causal
                     and cfg.value_path == "standard" and cfg.norm == "layernorm" and cfg.final_norm
                     and cfg.norm_layers == "all" and cfg.positions == "learned" and not cfg.qk_norm
                     and cfg.window_size is None and cfg.logit_softcap is None
                     and cfg.attention_shape.n_kv_heads == cfg.n_heads and cfg.mlp_act in ACTIVATIONS
                     and cfg.attn_logit_scale == 1.0
                     and not (cfg.embed_norm or cfg.smear or cfg.residual_scalars or cfg.backout))
        if not supported:
            raise ValueError("the hand loop covers Pre-LN GPT-2 blocks only (softmax attention, standard "
                             "values, LayerNorm, learned positions, full context, no soft-cap)")
        layers = []
        for block in model.block_list():
            gains = (block.attn_skip, block.attn_branch, block.mlp_skip, block.mlp_branch)
            if not all(_is_one(g) for g in gains) or not isinstance(block.dropout, nn.Identity):
                raise ValueError("the hand loop needs fixed unit skip and branch gains and no dropout")
            assert block.norm2 is not None and block.attn.k is not None
            layers.append(Layer(*_norm(block.norm1), *_linear(block.attn.q), *_linear(block.attn.k),
                                *_linear(block.attn.values.w_v), *_linear(block.attn.proj),
                                *_norm(block.norm2), *_linear(block.mlp.fc), *_linear(block.mlp.out)))
        assert model.pos_emb is not None
        self.layers = layers
        self.tok = model.tok_emb.weight
        self.pos = model.pos_emb.weight
        self.head = self.tok if model.head is None else model.head.weight
        self.ln_f = _norm(model.norm)
        self.eps, self.d = cfg.norm_eps, cfg.d_model
        self.n_heads, self.head_dim = cfg.n_heads, cfg.attention_shape.head_dim
        self.act = ACTIVATIONS[cfg.mlp_act]

    def _block(self, x: Tensor, w: Layer, keys: Tensor, values: Tensor, at: int) -> Tensor:
        """One Pre-LN block over the tokens x (B, T, d) at positions at .. at+T-1; fills keys and
        values (B, H, max_len, D) there and attends over positions 0 .. at+T-1."""
        b, t, d = x.shape
        heads, hd = self.n_heads, self.head_dim
        h = F.layer_norm(x, (d,), w.ln1_w, w.ln1_b, self.eps)
        q = F.linear(h, w.q_w, w.q_b).view(b, t, heads, hd).transpose(1, 2)
        keys[:, :, at:at + t] = F.linear(h, w.k_w, w.k_b).view(b, t, heads, hd).transpose(1, 2)
        values[:, :, at:at + t] = F.linear(h, w.v_w, w.v_b).view(b, t, heads, hd).transpose(1, 2)
        # a prefill is causal over itself; one new query sees every cached key: no mask
        y = F.scaled_dot_product_attention(q, keys[:, :, :at + t], values[:, :, :at + t], is_causal=t > 1)
        x = F.linear(y.transpose(1, 2).reshape(b, t, d), w.o_w, w.o_b) + x
        h = F.layer_norm(x, (d,), w.ln2_w, w.ln2_b, self.eps)
        return F.linear(self.act(F.linear(h, w.fc_w, w.fc_b)), w.out_w, w.out_b) + x

    def _next(self, x: Tensor) -> Tensor:
        h = F.layer_norm(x[:, -1], (self.d,), *self.ln_f, self.eps)
        return (h @ self.head.T).argmax(dim=-1)

    def new_cache(self, batch: int, positions: int) -> tuple[Tensor, Tensor]:
        """Keys and values (layers, B, H, positions, D), preallocated in the layout SDPA reads."""
        shape = (len(self.layers), batch, self.n_heads, positions, self.head_dim)
        return (torch.empty(shape, dtype=self.tok.dtype, device=self.tok.device),
                torch.empty(shape, dtype=self.tok.dtype, device=self.tok.device))

    def step(self, ids: Tensor, keys: Tensor, values: Tensor, at: int) -> Tensor:
        """The greedy token (B,) after feeding `ids` (B,) at position `at`: one decoding step."""
        x = (F.embedding(ids, self.tok) + self.pos[at])[:, None]
        for i, w in enumerate(self.layers):
            x = self._block(x, w, keys[i], values[i], at)
        return self._next(x)

    @torch.inference_mode()
    def decode(self, ids: Tensor, keys: Tensor, values: Tensor, at: int, new: int) -> Tensor:
        """Greedy tokens (B, new) after feeding `ids` (B,) at position `at`, one token per step,
        over keys and values already filled for positions 0 .. at-1."""
        out = torch.empty(ids.shape[0], new, dtype=ids.dtype, device=ids.device)
        for step in range(new):
            ids = self.step(ids, keys, values, at + step)
            out[:, step] = ids
        return out

    @torch.inference_mode()
    def generate(self, prompt: Tensor, new: int) -> Tensor:
        """Prompt + `new` greedy tokens (B, T + new), as `model.generate(prompt, new)`."""
        b, t = prompt.shape
        keys, values = self.new_cache(b, t + new - 1)  # the last token is never fed back
        x = F.embedding(prompt, self.tok) + self.pos[:t]
        for i, w in enumerate(self.layers):
            x = self._block(x, w, keys[i], values[i], 0)
        first = self._next(x)
        rest = self.decode(first, keys, values, t, new - 1) if new > 1 else first[:, :0]
        return torch.cat((prompt, first[:, None], rest), dim=1)


class FrozenHandDecoder(HandDecoder):
    """The hand loop with its decoding step compiled by inductor and the weights folded in, as
    `compile_decoding(freeze_weights=True)` compiles blocklab's step: the limit of compiled decoding.
    The weights are the model's `nn.Parameter`s, which dynamo makes graph constants while inductor's
    `freezing` flag is on (set around every call by blocklab's own `run_frozen`)."""

    def __init__(self, model: blocklab.LanguageModel):
        super().__init__(model)
        self._compiled = torch.compile(super().step)

    def new_cache(self, batch: int, positions: int) -> tuple[Tensor, Tensor]:
        """Keys and values as one (B, H, positions, D) tensor per layer, as blocklab's cache keeps
        them: written through views of one stacked tensor, inductor copied the whole stack every step
        (0.25x the eager loop at batch 8)."""
        shape = (batch, self.n_heads, positions, self.head_dim)
        like = dict(dtype=self.tok.dtype, device=self.tok.device)
        keys, values = ([torch.empty(shape, **like) for _ in self.layers] for _ in range(2))
        return keys, values  # type: ignore[return-value]  # indexed by layer like the stacked tensors

    def step(self, ids: Tensor, keys: Tensor, values: Tensor, at: int) -> Tensor:
        return run_frozen(self._compiled, ids, keys, values, at)


class Generate:
    """`generate` on `model` with ``compile`` fixed: False is the eager step on every device, None the
    default (compiled on CUDA)."""

    def __init__(self, model: blocklab.LanguageModel, compile: bool | None):
        self.model, self.compile = model, compile

    def generate(self, prompt: Tensor, new: int) -> Tensor:
        return generate(self.model, prompt, new, compile=self.compile)


def compiled_contender(mode: str, size: str, context: int, device: torch.device) -> Contender:
    """A copy of `make_model(size, context)` (the same seed: the same weights) compiled as `mode` says."""
    model = make_model(size, context).to(device)
    if mode == "default":
        return Generate(model, compile=None)
    if mode == "hand-frozen":
        return FrozenHandDecoder(model)
    if mode == "blocks":
        model.compile_blocks(dynamic=True)
    elif mode == "step-eager":
        model.compile_decoding(backend="eager")
    else:
        model.compile_decoding(freeze_weights=mode == "step-frozen")
    return model


# -- measurement -----------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_same_tokens(model: Contender | blocklab.LanguageModel, hand: HandDecoder, prompt: Tensor,
                      new: int) -> None:
    ours, theirs = model.generate(prompt, new), hand.generate(prompt, new)
    if not torch.equal(ours, theirs):
        diff = (ours != theirs).nonzero()
        raise RuntimeError(f"the hand loop's tokens differ from generate's at {diff[:5].tolist()}")


def measure_cell(model: blocklab.LanguageModel, hand: HandDecoder, prompt: Tensor, new: int,
                 repeats: int, compiled: dict[str, Contender] | None = None) -> dict[str, list[float]]:
    """tokens/s of every contender per repeat, round-robin, the first contender rotating; `model` decodes
    with its eager step; `compiled`: further contenders by name."""
    device = prompt.device
    contenders: dict[str, Contender] = {OURS: Generate(model, compile=False), HAND: hand, **(compiled or {})}
    calls = {name: (lambda c=c: c.generate(prompt, new)) for name, c in contenders.items()}
    for call in calls.values():  # warm-up (and, compiled, the compilation)
        call()
    names = list(calls)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            sync(device)
            start = time.perf_counter()
            calls[name]()
            sync(device)
            rates[name].append(prompt.shape[0] * new / (time.perf_counter() - start))
    return rates


def _ratios(ours: list[float], hand: list[float]) -> tuple[float, dict]:
    paired = [a / b for a, b in zip(ours, hand, strict=True)]
    return (statistics.median(ours) / statistics.median(hand),
            dict(median=statistics.median(paired), min=min(paired), max=max(paired)))


def summarize(rates: dict[str, list[float]]) -> dict:
    out: dict = {name: dict(median=statistics.median(r), min=min(r), max=max(r)) for name, r in rates.items()}
    out["ratio"], out["ratio_paired"] = _ratios(rates[OURS], rates[HAND])
    out["ratios_to_hand"] = {name: dict(zip(("medians", "paired"), _ratios(r, rates[HAND]), strict=True))
                             for name, r in rates.items() if name not in (OURS, HAND)}
    return out


def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def _spread(r: dict) -> str:
    return f"{_rate(r['median'])} ({_rate(r['min'])}-{_rate(r['max'])})"


def table(cells: list[dict]) -> str:
    header = ["size", "batch", f"{OURS} tok/s (min-max)", f"{HAND} tok/s (min-max)",
              "blocklab / hand (medians)", "paired ratio median (min-max)"]
    extra = list(cells[0]["summary"]["ratios_to_hand"]) if cells else []
    for name in extra:
        header += [f"{name} tok/s (min-max)", "/ hand (medians)", "paired (min-max)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in cells:
        s = c["summary"]
        p = s["ratio_paired"]
        row = (f"| {c['size']} | {c['batch']} | {_spread(s[OURS])} | {_spread(s[HAND])} | "
               f"{s['ratio']:.2f} | {p['median']:.2f} ({p['min']:.2f}-{p['max']:.2f}) |")
        for name in extra:
            r = s["ratios_to_hand"][name]
            q = r["paired"]
            row += (f" {_spread(s[name])} | {r['medians']:.2f} | "
                    f"{q['median']:.2f} ({q['min']:.2f}-{q['max']:.2f}) |")
        lines.append(row)
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--sizes", default="small,gpt2", help=f"comma-separated, from {', '.join(SIZES)}")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="size small, 16 new tokens, 3 repeats")
    p.add_argument("--compile", nargs="?", const="blocks", default="",
                   help=f"compiled contenders, comma-separated from {', '.join(COMPILE_MODES)} "
                        "(alone: blocks)")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON results (default benchmarks/results/decode-<device>.json; none with --quick)")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.new, args.repeats = "small", 16, 3
    args.compile = [m for m in args.compile.split(",") if m]
    unknown = [m for m in args.compile if m not in COMPILE_MODES]
    if unknown:
        p.error(f"--compile {','.join(unknown)} is not allowed: choose from {', '.join(COMPILE_MODES)}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    sizes = args.sizes.split(",")
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        raise SystemExit(f"--sizes {','.join(unknown)} is not allowed: choose from {', '.join(SIZES)}")
    batches = [int(b) for b in args.batches.split(",")]
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    from _measure import machine_info, write_result

    info = machine_info(args.device, args.threads)
    print(f"# bench_decode: sizes {sizes}, batches {batches}, prompt {args.prompt} + {args.new} new tokens, "
          f"{args.repeats} repeats, {device}, {args.threads} thread(s); load {info['load_avg_at_start']}",
          flush=True)
    start = time.time()
    cells = []
    for size in sizes:
        model = make_model(size, args.prompt + args.new).to(device)
        hand = HandDecoder(model)
        compiled = {COMPILE_MODES[m]: compiled_contender(m, size, args.prompt + args.new, device)
                    for m in args.compile}
        for batch in batches:
            g = torch.Generator().manual_seed(batch)
            prompt = torch.randint(0, SIZES[size]["vocab_size"], (batch, args.prompt), generator=g).to(device)
            check_same_tokens(Generate(model, compile=False), hand, prompt, args.new)
            for contender in compiled.values():
                check_same_tokens(contender, hand, prompt, args.new)
            t0 = time.time()
            rates = measure_cell(model, hand, prompt, args.new, args.repeats, compiled)
            cells.append(dict(size=size, batch=batch, tokens_per_s=rates, summary=summarize(rates)))
            print(f"  {size} batch {batch}: {time.time() - t0:.0f} s, blocklab / hand "
                  f"{cells[-1]['summary']['ratio']:.3f}", flush=True)
    text = table(cells)
    print(text)
    elapsed = time.time() - start
    print(f"# total {elapsed:.0f} s")
    result = dict(machine=info, command=" ".join(["python", *sys.argv]),
                  args=dict(sizes=sizes, dims={s: SIZES[s] for s in sizes}, gpt2_block=GPT2_BLOCK,
                            batches=batches, prompt=args.prompt, new_tokens=args.new, repeats=args.repeats,
                            threads=args.threads, quick=args.quick, compile=args.compile),
                  same_tokens_checked=True, elapsed_s=round(elapsed, 1), cells=cells, table=text)
    out = args.out or (None if args.quick else RESULTS / f"decode-{device.type}.json")
    write_result(result, out)
    return result


if __name__ == "__main__":
    main()
