"""Ladders: one recipe trained at several model sizes (rungs) on the same tokens, so that loss can be
fitted against parameters (`blocklab.scaling.fit`).

A rung widens and deepens the ladder's size preset together, as the papers' tables do (Value Residual
Learning, Table 4: 82M, 180M, 468M). Every rung trains the same steps of the same batch, so every size
sees the same tokens in the same order for a given seed (Fig. 6, left: 20B tokens at every size), and
every architecture trains at one learning-rate rule for all rungs (`Ladder.lr_rule`). The runs of a
rung live in `OUT/<ladder>/<rung>/runs/<arch>-seed<k>`, the layout and configs of `blocklab compare`,
so an interrupted ladder resumes and a finished run is reused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blocklab.compare import Entry, merge, run_configs
from blocklab.training import TrainConfig
from blocklab.util.errors import ConfigError


@dataclass(frozen=True)
class Rung:
    """One size of a ladder: its folder name and the ModelConfig fields it sets over the size preset."""

    name: str
    model: dict[str, Any]


def _cpu_rung(d_model: int, n_layers: int) -> Rung:
    """Size tiny's recipe at width d and depth `n_layers`: heads of 32, MLP 4d."""
    return Rung(
        f"d{d_model}-l{n_layers}",
        {"d_model": d_model, "n_layers": n_layers, "n_heads": d_model // 32, "mlp_hidden": 4 * d_model},
    )


def _llama_rung(name: str, n_layers: int, d_model: int, n_heads: int, mlp_hidden: int) -> Rung:
    return Rung(
        name, {"n_layers": n_layers, "d_model": d_model, "n_heads": n_heads, "mlp_hidden": mlp_hidden}
    )


@dataclass(frozen=True)
class Ladder:
    description: str
    size: str  # the size preset every rung starts from
    rungs: tuple[Rung, ...]
    steps: int
    batch_size: int
    seq_len: int
    lr_rule: str  # the learning-rate rule, in words (the code: `lr` or each arch's recipe at `size`)
    seeds: int = 3
    eval_every: int = 50
    lr: float | None = None  # None: each architecture's recipe rate at `size`, the same at every rung
    train: dict[str, Any] = field(default_factory=dict)  # other TrainConfig fields (data, device...)
    archs: tuple[str, ...] = ("pre-ln", "resformer", "svformer", "bov", "sas-p")
    trains_on: str = "cpu"
    notes: str = ""  # how the ladder was sized (the arithmetic), printed in its report

    def base(self) -> dict[str, Any]:
        base: dict[str, Any] = {
            "size": self.size,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "max_steps": self.steps,
            "eval_every": self.eval_every,
            "progress": False,
        }
        if self.lr is not None:
            base["optim"] = {"lr": self.lr}
        return merge(base, self.train)

    @property
    def tokens(self) -> int:
        return self.steps * self.batch_size * self.seq_len

    def rung(self, name: str) -> Rung:
        for rung in self.rungs:
            if rung.name == name:
                return rung
        raise ConfigError(
            f"rung {name!r} is not on this ladder: choose one of {', '.join(r.name for r in self.rungs)}"
        )


# The CPU ladder: size tiny's recipe (ReLU MLP, RMSNorm, tied embeddings, RoPE, vocab 4096, context 128)
# at five widths with depth growing with width, 400 steps of 16 x 128 tokens (0.82M tokens) at every
# rung, as the cpu scale of `blocklab reproduce` trains size tiny (the d128-l4 rung is size tiny).
# Sized by measurement (one thread each, this project's 2-core machine, 2026-11-27, 40 steps of pre-ln):
# d64-l2 trained 23,168 tokens/s and d192-l6 4,379, so a seed of one architecture over the five rungs
# is about 35 + 70 + 130 + 150 + 190 s = ~575 s of training plus ~30 s of validations and start; 5
# architectures x 3 seeds is 15 of them, ~9,000 core-seconds: about 1.3 hours with two runs at once on
# the two cores, 2.5 hours on one; inside the 4 hours the ladder was allowed. Measured (2026-11-27): the
# 75 runs took 98 minutes of wall clock at two at once (2.8 hours of training summed over the runs).
LADDERS: dict[str, Ladder] = {
    "cpu": Ladder(
        "size tiny's recipe at d 64 x 2 layers, 96 x 3, 128 x 4 (size tiny), 160 x 5 and 192 x 6 (heads of "
        "32, MLP 4d, vocab 4096), 400 steps of 16 x 128 tokens (0.82M tokens) at every rung",
        "tiny",
        tuple(_cpu_rung(d, d // 32) for d in (64, 96, 128, 160, 192)),
        steps=400,
        batch_size=16,
        seq_len=128,
        lr_rule="each architecture's recipe rate at size tiny (recipes/main_job_optim.json), the same at "
        "every rung, as Value Residual Learning trains every size at one peak rate (6e-4)",
        notes="sized by measurement: d64-l2 trains at ~23k tokens/s and d192-l6 at ~4.4k on one thread of "
        "this project's 2-core CPU, so the 75 runs take about 9,000 core-seconds; measured: 98 minutes of "
        "wall clock at two runs at once (2026-11-27)",
    ),
    # The paper's own shapes (Table 4; 320M is named in Sec. 4.2 but not in the table: 14 layers of its
    # 468M shape give 316M), Llama-like, untied embeddings, vocab 50277 in the paper; here the GPU
    # machine's embedded corpus and its 8192-token BPE, so the tokens per run are what a lent call can
    # afford, not the paper's 20B. `--minutes` trains it a piece at a time.
    "gpu-resformer": Ladder(
        "Value Residual Learning's shapes, 82M (8 x 512), 180M (12 x 768), 320M (14 x 1024, our reading) "
        "and 468M (24 x 1024), Llama-like, 500 steps of 32 x 512 tokens (8.2M tokens) at every rung, "
        "lr 6e-4 as in the paper",
        "resformer-82m",
        (
            _llama_rung("82m", 8, 512, 8, 1792),
            _llama_rung("180m", 12, 768, 12, 2688),
            _llama_rung("320m", 14, 1024, 16, 3584),
            _llama_rung("468m", 24, 1024, 16, 3584),
        ),
        steps=500,
        batch_size=32,
        seq_len=512,
        eval_every=50,
        lr=6e-4,
        lr_rule="6e-4 for every architecture and rung, the paper's peak rate (Table 4)",
        train={"data": {"vocab_size": 8192}, "ckpt_every": 250},
        archs=("pre-ln", "resformer", "svformer"),
        trains_on="gpu",
        notes="8.2M tokens is 3.3 passes over the embedded 2.45M-token corpus (the GPU machines reach no "
        "network), far from the paper's 20B: a larger corpus carried to the machine is what its budgets need",
    ),
    # A toy ladder for tests and smoke runs: seconds a run.
    "toy": Ladder(
        "size tiny's recipe at d 32 x 2 layers, 64 x 2 and 96 x 3, 20 steps of 4 x 32 tokens: a smoke, not "
        "evidence",
        "tiny",
        (_cpu_rung(32, 2), _cpu_rung(64, 2), _cpu_rung(96, 3)),
        steps=20,
        batch_size=4,
        seq_len=32,
        eval_every=10,
        seeds=2,
        lr_rule="each architecture's recipe rate at size tiny",
    ),
}


def get_ladder(name: str) -> Ladder:
    if name not in LADDERS:
        raise ConfigError(f"ladder {name!r} is not allowed: choose one of {', '.join(LADDERS)}")
    return LADDERS[name]


def check_archs(archs: list[str]) -> None:
    from blocklab.presets import split_arch

    if not archs:
        raise ConfigError(
            "no architecture given: name two or more, the baseline first, e.g. --archs pre-ln,resformer"
        )
    if len(set(archs)) != len(archs):
        raise ConfigError(f"an architecture is named twice in {','.join(archs)}: name each once")
    for arch in archs:
        split_arch(arch)  # raises a ConfigError naming the known presets


def plan(
    archs: list[str], ladder: Ladder, out: Path, seeds: int | None = None
) -> list[tuple[Rung, Entry, TrainConfig]]:
    """Every run of the ladder, seed-major and the largest rung first within a seed, so that a ladder cut
    off part-way has whole seeds to fit and two runs at once finish together: (rung, entry, config)."""
    check_archs(archs)
    n = seeds or ladder.seeds
    by_rung = {
        rung.name: run_configs(
            [Entry.parse(a) for a in archs], n, out / rung.name, merge(ladder.base(), {"model": rung.model})
        )
        for rung in ladder.rungs
    }
    runs = []
    for seed in range(n):
        for rung in reversed(ladder.rungs):
            runs += [(rung, e, cfg) for e, cfg in by_rung[rung.name] if cfg.seed == seed]
    return runs
