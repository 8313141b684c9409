"""What a ladder is: its rungs (`Rung`), and the `Ladder` itself (tokens per run, batch and sequence
length, learning-rate rule, seeds, architectures, the report's words), with each rung's steps
(`rung_steps`). The shipped ladders and a user's are files read by `scaling.ladder_files`; `scaling.ladders`
names them and plans their runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blocklab.compare import Entry, merge, run_configs
from blocklab.util.errors import ConfigError


@dataclass(frozen=True)
class Rung:
    """One size of a ladder: its folder name, the ModelConfig fields it sets over the size preset, and
    optionally a size preset of its own and its own peak learning rate (a ladder of `lr: per-rung`)."""

    name: str
    model: dict[str, Any]
    size: str | None = None
    lr: float | None = None


@dataclass(frozen=True)
class LrSweep:
    """A short learning-rate sweep per rung (a ladder file's `lr: {sweep: [...], steps: N}`): at every rung,
    each architecture trains `seeds` runs (seeds `seed`, `seed` + 1, ...; `steps` steps) at each of
    `factors` x its recipe rate, and that rung's runs of that architecture train at the factor of the
    lowest final validation loss, averaged over those seeds (`scaling.sweeps`)."""

    factors: tuple[float, ...]
    steps: int
    seed: int = 0
    seeds: int = 1

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.seed, self.seed + self.seeds))

    def seeds_text(self) -> str:
        """`seed 0`, or `seeds 0-2` (the mean of their losses decides)."""
        if self.seeds == 1:
            return f"seed {self.seed}"
        return f"seeds {self.seed}-{self.seed + self.seeds - 1}"

    def describe(self) -> str:
        """The rule in words, for the report's learning rate."""
        grid = ", ".join(f"{f:g}" for f in self.factors[:-1]) + f" and {self.factors[-1]:g}"
        runs = (f"whose {self.steps}-step run ({self.seeds_text()}) ends at the lowest validation loss"
                if self.seeds == 1 else
                f"whose {self.steps}-step runs ({self.seeds_text()}) end at the lowest mean validation loss")
        return (f"a short sweep per rung: each architecture's recipe rate (the rate `lr: recipe` gives it "
                f"there) times the factor, of {grid}, {runs}, chosen at each rung for each architecture")


DEFAULT_ARCHS = ("pre-ln", "resformer", "svformer", "bov", "sas-p")


@dataclass(frozen=True)
class Ladder:
    """A ladder (one is a file, `blocklab.scaling.ladder_files`): rungs, tokens per run (`steps` at every
    rung, or `tokens_per_parameter`), batch and sequence length, the learning-rate rule, seeds and
    architectures, and the report's words for them."""

    description: str
    size: str  # the size preset every rung starts from
    rungs: tuple[Rung, ...]
    steps: int | None  # None: `tokens_per_parameter` sets each rung's steps
    batch_size: int
    seq_len: int
    lr_rule: str  # the learning-rate rule, in words (the code: `lr`, the rungs', `lr_sweep` or the recipe)
    seeds: int = 3
    eval_every: int = 50
    lr: float | None = None  # None: each rung's lr, the sweep's or each architecture's recipe rate
    train: dict[str, Any] = field(default_factory=dict)  # other TrainConfig fields (data, device...)
    archs: tuple[str, ...] = DEFAULT_ARCHS
    trains_on: str = "cpu"
    notes: str = ""  # how the ladder was sized (the arithmetic), printed in its report
    tokens_per_parameter: float | None = None  # steps per rung: this x the rung's parameters / batch tokens
    lr_sweep: LrSweep | None = None  # a short sweep per rung chooses each architecture's rate there
    shorter_runs: tuple[float, ...] = ()  # fractions of the largest rung's steps (`scaling.shorter_runs`)

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

    def rung_base(self, rung: Rung) -> dict[str, Any]:
        """The fields every run of `rung` shares (its steps aside, with `tokens_per_parameter`)."""
        own: dict[str, Any] = {"model": rung.model}
        if rung.size is not None:
            own["size"] = rung.size
        if rung.lr is not None:
            own["optim"] = {"lr": rung.lr}
        return merge(self.base(), own)

    @property
    def tokens(self) -> int:
        """Tokens a run at every rung (the largest rung's with `tokens_per_parameter`: see tokens_line)."""
        steps = self.steps if self.steps is not None else rung_steps(self)[self.rungs[-1].name][1]
        return steps * self.batch_size * self.seq_len

    def tokens_line(self) -> str:
        """The tokens a run trains, as the report states them: one number, or the rule and every rung's."""
        if self.steps is not None:
            shape = f"{self.steps:,} steps of {self.batch_size} x {self.seq_len} tokens"
            return f"{shape} ({self.tokens:,} tokens) a run at every rung"
        batch = self.batch_size * self.seq_len
        per = ", ".join(f"{name} {n:,} parameters, {s:,} steps ({s * batch:,} tokens)"
                        for name, (n, s) in rung_steps(self).items())
        return (f"{self.tokens_per_parameter:g} tokens per parameter of {self.archs[0]} (all parameters), in "
                f"whole steps of {self.batch_size} x {self.seq_len} tokens: {per}")

    def rung(self, name: str) -> Rung:
        for rung in self.rungs:
            if rung.name == name:
                return rung
        raise ConfigError(
            f"rung {name!r} is not on this ladder: choose one of {', '.join(r.name for r in self.rungs)}"
        )


def check_archs(archs: list[str]) -> None:
    from blocklab.model.presets import resolve

    if not archs:
        raise ConfigError(
            "no architecture given: name two or more, the baseline first, e.g. --archs pre-ln,resformer"
        )
    if len(set(archs)) != len(archs):
        raise ConfigError(f"an architecture is named twice in {','.join(archs)}: name each once")
    for arch in archs:
        resolve(arch, "tiny")  # raises a ConfigError naming the known presets


def rung_steps(ladder: Ladder) -> dict[str, tuple[int | None, int]]:
    """Each rung's (parameters, steps): `steps` at every rung (parameters None), or with
    `tokens_per_parameter` round(rule x N / (batch_size x seq_len)), at least 1, N the parameters (all,
    as the papers count) of the ladder's first architecture at that rung, on the tokenizer its data
    gives (prepared once and cached, as the runs will read it)."""
    if ladder.steps is not None or ladder.tokens_per_parameter is None:
        return {rung.name: (None, ladder.steps or 0) for rung in ladder.rungs}
    import torch

    from blocklab.accounting import count_parameters
    from blocklab.data import prepare_data
    from blocklab.runtime import LanguageModel

    vocab: dict[str, int] = {}
    out: dict[str, tuple[int | None, int]] = {}
    for rung in ladder.rungs:
        fields = merge(ladder.rung_base(rung), {"max_steps": 1})
        [(_, cfg)] = run_configs([Entry.parse(ladder.archs[0])], 1, Path("unused"), fields)
        key = repr(cfg.data.to_dict())
        if key not in vocab:
            vocab[key] = prepare_data(cfg.data, progress=cfg.progress).tokenizer.vocab_size
        with torch.device("meta"):
            n = count_parameters(LanguageModel(cfg.model_config(vocab[key]))).total
        steps = max(1, round(ladder.tokens_per_parameter * n / (ladder.batch_size * ladder.seq_len)))
        out[rung.name] = (n, steps)
    return out
