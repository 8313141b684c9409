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
    """One size of a ladder: its folder name, the ModelConfig fields it sets over the size preset, and
    optionally a size preset of its own and its own peak learning rate (a ladder of `lr: per-rung`)."""

    name: str
    model: dict[str, Any]
    size: str | None = None
    lr: float | None = None


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
    lr_rule: str  # the learning-rate rule, in words (the code: `lr`, the rungs' or each arch's recipe)
    seeds: int = 3
    eval_every: int = 50
    lr: float | None = None  # None: each rung's lr, else each architecture's recipe rate at `size`
    train: dict[str, Any] = field(default_factory=dict)  # other TrainConfig fields (data, device...)
    archs: tuple[str, ...] = DEFAULT_ARCHS
    trains_on: str = "cpu"
    notes: str = ""  # how the ladder was sized (the arithmetic), printed in its report
    tokens_per_parameter: float | None = None  # steps per rung: this x the rung's parameters / batch tokens

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
            return f"{self.tokens:,} tokens a run at every rung"
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


# The shipped ladders: blocklab/recipes/ladders/<name>.yaml (cpu, gpu-resformer, toy), how each was sized
# in its comments. `--ladder FILE.yaml` reads a ladder of the user's own.
SHIPPED = Path(__file__).resolve().parent.parent / "recipes" / "ladders"


def _shipped() -> dict[str, Ladder]:
    from blocklab.scaling.ladder_files import read_ladder_file

    order = ("cpu", "gpu-resformer", "toy")  # --list's and the reproduction page's order
    paths = sorted(SHIPPED.glob("*.yaml"), key=lambda p: (order.index(p.stem) if p.stem in order else 9,
                                                         p.stem))
    return {path.stem: read_ladder_file(path) for path in paths}


def get_ladder(name: str) -> Ladder:
    """A shipped ladder by name, or the ladder a YAML file holds (`ladder_files.read_ladder_file`)."""
    from blocklab.scaling.ladder_files import read_ladder_file

    if name in LADDERS:
        return LADDERS[name]
    if name.endswith((".yaml", ".yml")) or Path(name).is_file():
        return read_ladder_file(name)
    raise ConfigError(f"ladder {name!r} is not allowed: choose one of {', '.join(LADDERS)}, or give a "
                      "ladder file (FILE.yaml, docs/scaling.md)")


def store_name(name: str) -> str:
    """The store folder of ladder `name` (a shipped name or a file): ladder-<name>, ladder-<file stem>."""
    return f"ladder-{name if name in LADDERS else Path(name).stem}"


def check_archs(archs: list[str]) -> None:
    from blocklab.presets import resolve

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


def plan(
    archs: list[str], ladder: Ladder, out: Path, seeds: int | None = None
) -> list[tuple[Rung, Entry, TrainConfig]]:
    """Every run of the ladder, seed-major and the largest rung first within a seed, so that a ladder cut
    off part-way has whole seeds to fit and two runs at once finish together: (rung, entry, config)."""
    check_archs(archs)
    n = seeds or ladder.seeds
    steps = rung_steps(ladder) if ladder.steps is None else {}
    by_rung = {}
    for rung in ladder.rungs:
        fields = ladder.rung_base(rung)
        if rung.name in steps:
            fields = merge(fields, {"max_steps": steps[rung.name][1]})
        by_rung[rung.name] = run_configs([Entry.parse(a) for a in archs], n, out / rung.name, fields)
    runs = []
    for seed in range(n):
        for rung in reversed(ladder.rungs):
            runs += [(rung, e, cfg) for e, cfg in by_rung[rung.name] if cfg.seed == seed]
    return runs


LADDERS: dict[str, Ladder] = _shipped()
