"""The scales of a reproduction (model size, batch, steps, seeds, learning rates) and the settings
the claims' checks read (equal steps, equal FLOPs, a longer sequence).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from blocklab.compare import Entry, default_budget, merge
from blocklab.data.config import PROSE
from blocklab.training.config import BUDGET_FIELDS, flat
from blocklab.util.errors import ConfigError


@dataclass(frozen=True)
class Scale:
    description: str
    size: str
    steps: int
    seeds: int = 3
    batch_size: int = 16
    seq_len: int = 128
    # None: each architecture's rate at this size in recipes/learning_rates.json (compare.run_configs),
    # else the TrainConfig default
    lr: float | None = None
    model: dict[str, Any] = field(default_factory=dict)  # ModelConfig overrides of every run
    eval_every: int = 50
    train: dict[str, Any] = field(default_factory=dict)  # other TrainConfig fields (data, eval_batches...)
    # Seeds are added to an undecided claim, `seeds` at a time, up to this many (None: no more)
    max_seeds: int | None = None
    # The learning-rate sweep: every architecture trains seed 0 at these multiples of its recipe's
    # peak rates (AdamW's and Muon's together) for `sweep_steps` steps, and its runs train at the best
    lr_sweep: tuple[float, ...] = ()
    sweep_steps: int = 200
    leaves_out: tuple[str, ...] = ()  # claims with these tags are not judged at this scale
    # The throughput checks' interleaved timing after training (`time_throughput`): rounds x steps
    timing_rounds: int = 10
    timing_steps: int = 3
    caveat: str = ""  # what every verdict at this scale must be read with (printed beside each one)
    # where its runs are meant to train: "cpu", or "gpu" (the report names the GPU and commit of each
    # run: `blocklab.reproduce.budgeted_launch`)
    trains_on: str = "cpu"

    def base(self, setting: str) -> dict[str, Any]:
        """The TrainConfig fields shared by every run of `setting` (the budget included)."""
        if setting not in SETTINGS:
            raise ConfigError(f"setting {setting!r} is not allowed: choose one of {', '.join(SETTINGS)}")
        base: dict[str, Any] = {
            "size": self.size,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "eval_every": self.eval_every,
            "progress": False,
        }
        if self.model:
            base["model"] = dict(self.model)
        if self.lr is not None:
            base["optim"] = {"lr": self.lr}
        base = merge(base, self.train)
        if setting == "seq-long":  # 4x the sequence, a quarter of the sequences: the same tokens per step
            if self.batch_size % 4:
                raise ConfigError(
                    f"the seq-long setting needs a batch size divisible by 4; got {self.batch_size}"
                )
            base.update(seq_len=4 * self.seq_len, batch_size=self.batch_size // 4)
        if setting == "flops":  # what the baseline (pre-ln) spends in `steps` steps
            base["max_flops"] = default_budget("flops", [Entry.parse(FLOPS_BASELINE)], base, self.steps)
        else:
            base["max_steps"] = self.steps
        return base

    def group(self, setting: str) -> str:
        tag = f"seq{4 * self.seq_len}" if setting == "seq-long" else setting
        return f"{self.size}-{tag}"

    def describe(self) -> str:
        """The description with the seeds and the sweep as configured."""
        more = f", up to {self.max_seeds} for an undecided claim" if self.max_seeds else ""
        factors = ", x".join(f"{f:.3g}" for f in self.lr_sweep)
        sweep = (f"; learning rate per architecture from a sweep of x{factors} "
                 f"its recipe's rates ({self.sweep_steps} steps, seed 0)" if self.lr_sweep else "")
        left = f"; not judged here: the {', '.join(self.leaves_out)} claims" if self.leaves_out else ""
        return f"{self.description}, {self.seeds} seeds{more}{sweep}{left}"


SETTINGS = ("steps", "flops", "seq-long")


# TrainConfig fields that a Scale holds itself: an override of one replaces the scale's value, so that
# the settings built on it (seq-long: 4x the sequence at a quarter of the batch) and the folders named
# after it (OUT/<scale>/<size>-<setting>) follow.
SCALE_FIELDS = ("size", "batch_size", "seq_len", "eval_every")

# What the runs of every claim set themselves, whatever the overrides: an override of one is refused,
# naming what sets it.
OWN_FIELDS = {"arch": "the claims' architectures", "seed": "the scale's seeds", "out_dir": "--out",
              **dict.fromkeys(BUDGET_FIELDS, "the scale's budget")}


def with_overrides(scale: Scale, fields: dict[str, Any] | None) -> Scale:
    """`scale` with TrainConfig `fields` (nested, as a YAML config and key=value overrides give them) on
    every run of every claim and of the learning-rate sweep, and named in its description (so in the
    report). A ConfigError for a field the runs set themselves (OWN_FIELDS) or, at a scale with a sweep,
    a peak learning rate (the sweep chooses it)."""
    if not fields:
        return scale
    for key in fields:
        if key in OWN_FIELDS:
            raise ConfigError(f"the override {key}=... is not allowed: reproduce sets {key} of every run "
                              f"itself ({OWN_FIELDS[key]}).")
    chosen = sorted({"lr", "muon_lr"} & set(fields.get("optim") or {}))
    if scale.lr_sweep and chosen:
        raise ConfigError(f"the override optim.{chosen[0]}=... is not allowed at a scale with a "
                          "learning-rate sweep: the sweep chooses each architecture's rate (see `blocklab "
                          "reproduce --list`); leave it out, or choose a scale without a sweep.")
    said = ", ".join(f"{k}={v}" for k, v in flat(fields).items())
    return replace(scale, **{k: fields[k] for k in SCALE_FIELDS if k in fields},
                   train=merge(scale.train, {k: v for k, v in fields.items() if k not in SCALE_FIELDS}),
                   description=f"{scale.description}; every run with {said}")


# The equal-FLOPs budget is what this architecture spends in the scale's steps, so its equal-FLOPs runs
# are its equal-steps runs, step for step (same schedule, same batches): they are read from there,
# not trained twice (`run_group`).
FLOPS_BASELINE = "pre-ln"


def run_group(setting: str, arch: str) -> str:
    """The setting whose runs `arch` reads at `setting`: its own, but the equal-steps runs for the
    equal-FLOPs baseline."""
    return "steps" if setting == "flops" and arch == FLOPS_BASELINE else setting


# The evidence scales: a per-architecture learning-rate sweep at x1/3, x1 and x3 of the recipe's rates
# (the recipe's own grid, benchmarks/baseline_grid.py --grid lr), 5 seeds, and 5 more for a claim
# still undecided after them.
EVIDENCE = dict(seeds=5, max_seeds=10, lr_sweep=(1 / 3, 1.0, 3.0), sweep_steps=200, timing_rounds=20)


SCALES: dict[str, Scale] = {
    "quick": Scale(
        "size tiny (4 layers, d 128), 120 steps of 16 x 128 tokens: about 10 minutes on a 2-core CPU. "
        "Every model leaves the unigram plateau by step 50, but 0.25M tokens is far below the papers' "
        "budgets: a check of the pipeline and of early training, not of the papers' claims; see the cpu "
        "scale (benchmarks/REPRODUCTION.md)",
        "tiny",
        120,
        caveat="a pipeline check in early training, not evidence for or against the claim",
    ),
    "cpu": Scale(
        "size tiny (4 layers, d 128), 400 steps of 16 x 128 tokens (0.8M tokens)", "tiny", 400, **EVIDENCE
    ),
    # the combination claims only at cpu: 22 architectures x 5 seeds at 8 layers would not fit a session
    "cpu-deep": Scale(
        "size tiny at 8 layers (d 128), 400 steps of 16 x 128 tokens (0.8M tokens): room for the depth "
        "effects",
        "tiny",
        400,
        model={"n_layers": 8},
        leaves_out=("combination",),
        **EVIDENCE,
    ),
    "gpu-resformer": Scale(
        "resformer-82m (8 layers, d 512), 2,000 steps of 32 x 512 tokens, lr 1e-3",
        "resformer-82m",
        2000,
        batch_size=32,
        seq_len=512,
        lr=1e-3,
        eval_every=250,
        trains_on="gpu",
    ),
    "gpu-sas-p": Scale(
        "codeparrot-18l (18 layers, d 768), 2,000 steps of 64 x 128 tokens, lr 1e-3",
        "codeparrot-18l",
        2000,
        batch_size=64,
        seq_len=128,
        lr=1e-3,
        eval_every=250,
        trains_on="gpu",
    ),
}


# The GPU campaign's short budgets (benchmarks/gpu_campaign.py): each fits one 10-minute call on one
# H100-class GPU, 3 seeds of every architecture one after another.
SCALES["gpu-resformer-short"] = replace(
    SCALES["gpu-resformer"], steps=400, eval_every=100,
    description="resformer-82m (8 layers, d 512), 400 steps of 32 x 512 tokens (6.6M tokens), lr 1e-3")


# With the paper's sinusoidal positions, Pre-LN and SAS (3 seeds each; the call ended before SAS-P's
# runs) sat on the unigram plateau (validation loss 6.82-6.84 from step 100 to 400) on an H200
# (2026-11-26): at 400 steps the piece could judge nothing. RoPE, as in our CPU sizes ("The CPU sizes'
# recipe", docs/design.md), where every model leaves the plateau within 50 steps; not yet run here.
SCALES["gpu-sas-p-short"] = replace(
    SCALES["gpu-sas-p"], steps=400, eval_every=100, model={"positions": "rope"},
    description="codeparrot-18l (18 layers, d 768) with RoPE for its sinusoidal positions, 400 steps of "
                "64 x 128 tokens (3.3M tokens), lr 1e-3")


# gpu-mid: the claims of the cpu scale at 22x its parameters and 12x its tokens, trained a piece at a
# time on whatever GPU a call brings (`benchmarks/gpu_campaign.py next`,
# `blocklab.reproduce.budgeted_launch`).
# The shape is the CPU sizes' recipe (ReLU MLP, RMSNorm, tied embeddings, RoPE: size small) widened to
# d 512 at 8 layers, so a claim's paired difference here and at cpu differs by size, not by recipe;
# the recipe's rates start the sweep, as at cpu.
#
# Chosen by arithmetic, not yet by a GPU measurement (the first GPU call checks it; the campaign's time
# estimates switch to that call's own measured rate as soon as one run has finished):
# - Pre-LN has 29.4M parameters (25.2M in the blocks, 4.2M tied embedding) and 201 MFLOPs per token at
#   seq 512 (`accounting.flops_per_token`: 6N and the attention); SAS-P 25.4M and 178 MFLOPs.
# - 600 steps of 32 x 512 tokens: 9.8M tokens, 2.0 PFLOP a run. resformer-82m at vocab 4096 (220
#   MFLOPs per token, the same width and depth) trained at 109 TFLOP/s (496k tokens/s) on an H200 in
#   this store (gpu-resformer-short, eager, bf16 autocast; 20.8 s of wall clock a run with its
#   validations and start), and the figure for a 124M model on an H100 is 295 TFLOP/s. At a
#   conservative 100 TFLOP/s a run trains in about 20 s, 30 s with its start and 7 validations; a sweep
#   run (300 steps) in about 20 s. The svformer claim's 4x longer sequence (8 x 2048) costs 1.4x.
# - The plan at 3 seeds is 48 sweep runs (16 architectures x 3 rates) and 63 claim runs: about 50 GPU
#   minutes, so 7-8 pieces of a 10-minute call at 6-8 minutes each, 10-20 runs a piece; more seeds
#   follow for the undecided checks (3 at a time, up to 9).
# - Tokens: the GPU machines reach no network, so the data is the embedded corpus: 2.45M training
#   tokens at vocab 8192 (its BPE trains in ~5 s on first use). 9.8M tokens is 4 passes over it; the
#   issue's 20-40M would be 8-16 passes, where a 29M-parameter model would likely memorise it (the 82M
#   run above ended 0.8 nats lower on its last training batch than on the held-out files after 2.5
#   passes at vocab 4096). A larger fixed corpus, carried to the machine, is what more tokens need.
SCALES["gpu-mid"] = Scale(
    "size small widened to d 512 at 8 layers (8 heads, ReLU MLP 2048, RoPE, vocab 8192; Pre-LN 29.4M "
    "parameters), 600 steps of 32 x 512 tokens (9.8M tokens, 4 passes over the embedded corpus), trained "
    "a piece at a time on GPUs",
    "small",
    600,
    seeds=3,
    max_seeds=9,
    batch_size=32,
    seq_len=512,
    model={"n_layers": 8, "d_model": 512, "n_heads": 8, "mlp_hidden": 2048},
    eval_every=100,
    # a checkpoint every 200 steps (not every validation): saving 29M weights and their optimiser state
    # costs more than the 100 steps between validations save when a cut-off run resumes
    train={"data": {"vocab_size": 8192}, "ckpt_every": 200},
    lr_sweep=(1 / 3, 1.0, 3.0),
    sweep_steps=300,
    timing_rounds=10,
    trains_on="gpu",
    caveat="4 passes over a 2.45M-token corpus: read the gap between training and held-out loss in the "
    "curves",
)


# cpu-prose: the cpu scale's claims on the second embedded corpus, English text instead of Python code
# (`data.source=shakespeare`; the same tokenizer settings, its BPE trained on that corpus): whether a
# verdict is a property of code. 400 steps of 2,048 tokens read 0.82M of its 1.57M training tokens, less
# than one pass. The page's "on prose" column reads its store, OUT/cpu-prose (`page_prose`).
SCALES["cpu-prose"] = replace(
    SCALES["cpu"], train={"data": {"source": PROSE}},
    description="size tiny (4 layers, d 128), 400 steps of 16 x 128 tokens (0.8M tokens) on English text "
                f"(data.source={PROSE}: Shakespeare's plays and poems, 1.57M training tokens)")
