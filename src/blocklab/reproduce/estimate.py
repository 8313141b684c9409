"""How long the runs of a campaign take, and which are left: a run's training FLOPs over a rate measured
on the store's own finished runs (or a prior before there are any), plus its start and validations.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from blocklab.reproduce.metrics import METRICS
from blocklab.reproduce.orchestrate import scale_claims, starting_seeds
from blocklab.reproduce.planning import needed_archs, plan, sweep_plan, unique_runs
from blocklab.reproduce.scales import Scale
from blocklab.reproduce.timing import TIMING, timed_archs
from blocklab.statistics.claims import Claim
from blocklab.training import TrainConfig

# What trained a finished run of a campaign: the GPU (torch.cuda.get_device_name) or "cpu", the
# commit, the date, its wall-clock seconds in the piece that finished it (start, validations and
# the metrics read from its weights included) and the steps it resumed at, if it was cut off before.
TRAINED_ON = "trained_on.json"

# Before a store holds a finished run of the device: training FLOP/s and seconds a run spends besides
# training. GPU: 100 TFLOP/s, below the 109 measured for resformer-82m (220 MFLOPs per token) on an
# H200 in this store (gpu-resformer-short) and far below the 295 of a 124M model on an H100
# (benchmarks/RESULTS.md), with the 7.6 s a run spent there on its start and validations rounded up;
# CPU (a smoke's toy runs): 40 GFLOP/s, about what size tiny trained at on one thread in the cpu scale
# (45), and 2 s.
PRIOR = {"gpu": (100e12, 10.0), "cpu": (40e9, 2.0)}


def read_trained_on(run: Path) -> dict | None:
    path = run / TRAINED_ON
    return json.loads(path.read_text()) if path.is_file() else None


@cache
def _vocab(data: str) -> int:
    from blocklab.data import DataConfig, prepare_data

    return prepare_data(DataConfig.from_dict(json.loads(data))).tokenizer.vocab_size


_FLOPS_PER_TOKEN: dict[str, float] = {}


def _flops_per_token(cfg: TrainConfig, vocab: int) -> float:
    import torch

    from blocklab.accounting import flops_per_token
    from blocklab.runtime import LanguageModel

    model = cfg.model_config(vocab)
    key = repr(model)
    if key not in _FLOPS_PER_TOKEN:
        with torch.device("meta"):
            _FLOPS_PER_TOKEN[key] = float(flops_per_token(LanguageModel(model)))
    return _FLOPS_PER_TOKEN[key]


def run_steps(cfg: TrainConfig) -> tuple[int, float]:
    """The steps a run trains (its first budget to run out) and its FLOPs per token."""
    vocab = _vocab(json.dumps(cfg.data.to_dict(), sort_keys=True))
    fpt = _flops_per_token(cfg, vocab)
    per_step = cfg.batch_size * cfg.seq_len
    limits = [cfg.max_steps] if cfg.max_steps else []
    if cfg.max_tokens:
        limits.append(math.ceil(cfg.max_tokens / per_step))
    if cfg.max_flops:
        limits.append(math.ceil(cfg.max_flops / (fpt * per_step)))
    if not limits:
        raise ValueError(f"{cfg.out_dir} has no budget of steps, tokens or FLOPs: its time is unknown")
    return min(limits), fpt


def done_steps(run: Path) -> int:
    """The step of a cut-off run's newest checkpoint (0 without one)."""
    from blocklab.training.checkpoint import PREFIX, latest_checkpoint

    try:
        newest = latest_checkpoint(run)
    except Exception:  # noqa: BLE001 - a damaged checkpoint: the run starts again
        return 0
    return int(newest.name[len(PREFIX):]) if newest is not None else 0


@dataclass
class Estimator:
    """Seconds a run takes on `device` (a GPU's name or "cpu"): the training FLOP/s and the seconds
    besides training, from the finished runs under `root` that trained on this device in one go (then
    on any GPU, for a GPU), else `PRIOR`."""

    root: Path
    device: str
    rate: float = 0.0
    overhead: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        self.refresh()

    def refresh(self) -> None:
        """Measure again, with the runs finished since (a piece does after each of its runs)."""
        kind = "cpu" if self.device == "cpu" else "gpu"
        runs = [(r, s) for r, s in self._finished() if r["device"] == self.device]
        if not runs and kind == "gpu":
            runs = [(r, s) for r, s in self._finished() if r["device"] != "cpu"]
        if runs:
            self.rate = sum(s["flops"] for _, s in runs) / sum(s["train_time"] for _, s in runs)
            self.overhead = statistics.median(max(0.0, r["wall_seconds"] - s["train_time"]) for r, s in runs)
            devices = ", ".join(sorted({r["device"] for r, _ in runs}))
            self.source = f"measured on {len(runs)} finished run(s) ({devices})"
        else:
            self.rate, self.overhead = PRIOR[kind]
            self.source = f"a prior for a {kind.upper()}, no run of this store measured on one yet"
        self.source = (f"{self.rate / 1e12:.3g} TFLOP/s while training and {self.overhead:.0f} s a run "
                       f"besides, {self.source}")

    def _finished(self) -> list[tuple[dict, dict]]:
        found = []
        for record_path in sorted(self.root.rglob(TRAINED_ON)):
            run = record_path.parent
            record = read_trained_on(run)
            if record and not record.get("resumed_at") and (run / "summary.json").is_file():
                summary = json.loads((run / "summary.json").read_text())
                if summary.get("train_time"):
                    found.append((record, summary))
        return found

    def seconds(self, cfg: TrainConfig) -> float:
        """The estimated seconds `cfg` still needs: all of it, or what follows its newest checkpoint."""
        steps, fpt = run_steps(cfg)
        left = max(0, steps - done_steps(Path(cfg.out_dir)))
        return self.overhead + left * cfg.batch_size * cfg.seq_len * fpt / self.rate


def unfinished(cfgs: list[TrainConfig]) -> list[TrainConfig]:
    return [c for c in cfgs if not (Path(c.out_dir) / "summary.json").is_file()]


@dataclass
class Remaining:
    """What a campaign has left: its stages in order, each with its unfinished runs, and the estimate."""

    stages: list[tuple[str, list[TrainConfig]]]
    estimate: Estimator
    timing: list[str] = field(default_factory=list)  # settings whose timing pass has not run
    more_seeds_up_to: int | None = None  # undecided checks may get more seeds later, up to this many

    @property
    def runs(self) -> int:
        return sum(len(cfgs) for _, cfgs in self.stages)

    def minutes(self) -> float:
        return sum(self.estimate.seconds(c) for _, cfgs in self.stages for c in cfgs) / 60

    def lines(self) -> list[str]:
        out = [f"  {what}: {len(cfgs)} runs, about {sum(map(self.estimate.seconds, cfgs)) / 60:.1f} min"
               for what, cfgs in self.stages if cfgs]
        if self.timing:
            out.append(f"  the interleaved timing pass of the throughput check ({', '.join(self.timing)})")
        if self.more_seeds_up_to:
            out.append(f"  then more seeds for the checks still undecided, up to {self.more_seeds_up_to}")
        head = (f"remaining: {self.runs} runs, about {self.minutes():.1f} min on {self.estimate.device} "
                f"(estimated at {self.estimate.source})")
        return [head, *out] if self.runs or self.timing else ["remaining: nothing; every claim is judged"]


def remaining(claims: list[Claim], scale: Scale, root: Path, estimate: Estimator) -> Remaining:
    """The runs `reproduce` would still train at `scale` in `root`: the sweep's, then the claims' at the
    seeds planned so far, then, once those have all finished, the seeds added for undecided checks."""
    from blocklab.reproduce.judge import more_seeds
    from blocklab.reproduce.orchestrate import reproduce

    claims = scale_claims(claims, scale)
    needed = needed_archs(claims)
    archs = list(dict.fromkeys(a for group in needed.values() for a in group))
    sweep = [cfg for *_, cfg in sweep_plan(archs, scale, root)] if scale.lr_sweep else []
    seeds = starting_seeds(needed, scale, root)
    claim_runs = [cfg for _, cfg in unique_runs(plan(claims, scale, root, None, seeds))]
    stages = [("learning-rate sweep", unfinished(sweep)), (f"claim runs ({_seed_range(seeds)})",
                                                           unfinished(claim_runs))]
    timing = [s for s, a in timed_archs(claims).items() if not _timed(root / scale.group(s), a)]
    if not any(cfgs for _, cfgs in stages) and needed:
        rep = reproduce(claims, scale, root.parent, train=False, partial=True, name=root.name,
                        log=lambda *_: None)
        more = more_seeds(rep.results, seeds, scale)
        if more:
            seeds.update(more)
            added = unfinished([cfg for _, cfg in unique_runs(plan(claims, scale, root, None, seeds))])
            stages.append((f"more seeds for undecided checks ({_seed_range(seeds)})", added))
        return Remaining(stages, estimate, timing)
    undecided = scale.max_seeds if scale.max_seeds and any(
        not METRICS[k.metric].exact for c in claims for k in c.checks) else None
    return Remaining(stages, estimate, timing, undecided)


def _seed_range(seeds: dict[tuple[str, str], int]) -> str:
    low, high = min(seeds.values(), default=0), max(seeds.values(), default=0)
    return f"{low} seeds" if low == high else f"{low}-{high} seeds"


def _timed(group: Path, archs: list[str]) -> bool:
    path = group / TIMING
    return path.is_file() and set(archs) <= set(json.loads(path.read_text())["architectures"])
