"""The papers' claims as data: what each one says, what it compares, how it is measured.

A claim is one sentence of a paper with its figure or table, and one or more `Check`s. A check is
a measured relation between a metric of one architecture and of a baseline (paired by seed), a
metric compared with a formula, or a metric of one architecture alone against zero. Its setting
names the group of runs it reads (`blocklab.reproduce.SETTINGS`): equal steps, equal FLOPs, or a
longer sequence at the same tokens per step. `blocklab reproduce` trains what the chosen claims
need and gives each check a verdict (`blocklab.statistics.evidence`); a claim is reproduced when all of its
checks are.

Metrics (`blocklab.reproduce.METRICS`): measured ones vary with the seed and get a t-interval;
exact ones (parameters, FLOPs, cache bytes) are properties of the architecture and are compared
directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PAPERS = {
    "simplifying": "Simplifying Transformer Blocks (He & Hofmann, ICLR 2024)",
    "value-residual": "Value Residual Learning (Zhou et al., ACL 2025)",
    "bank-of-values": "Bank of Values (He, Liu et al., 2026)",
    "combinations": "Combinations of the papers (blocklab; no paper tests them)",
}


@dataclass(frozen=True)
class Check:
    """metric(arch) - metric(baseline), per seed, stands in `relation` to 0 (or to `tolerance`).

    baseline None: metric(arch) itself is compared (a slope against 0, a quantity against a formula).
    expected: for relation "equals", the name of a formula in `blocklab.reproduce.FORMULAS`.
    relative: compare metric(arch) / metric(baseline) - 1 instead of the difference (throughput).
    minus_setting: a difference of differences, (arch - baseline) at `setting` minus the same at
    `minus_setting` (SVFormer's gap at a long sequence minus its gap at a short one).
    minus: a difference of differences at one setting, (arch - baseline) minus (minus[0] - minus[1]):
    what a change gains on top of another, less what it gains alone (an interaction).
    """

    metric: str
    arch: str
    baseline: str | None
    relation: str  # lower, higher, within, at_most (statistics/evidence.py), or equals (exact, a formula)
    tolerance: float = 0.0
    setting: str = "steps"
    expected: str | None = None
    minus_setting: str | None = None
    relative: bool = False
    minus: tuple[str, str] | None = None

    @property
    def archs(self) -> tuple[str, ...]:
        return tuple(a for a in (self.baseline, self.arch, *(self.minus or ())) if a is not None)


@dataclass(frozen=True)
class Claim:
    id: str
    paper: str  # a key of PAPERS
    where: str  # figure, table or section
    statement: str  # the claim in one sentence
    paper_result: str  # what the paper reports, with its numbers and scale
    budget: str  # the paper's budget kind: steps, tokens, flops, time, or exact
    checks: tuple[Check, ...]
    notes: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)  # "quick": in `blocklab reproduce --quick`

    @property
    def archs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(a for c in self.checks for a in c.archs))


# The tolerance of "matches": a difference of final validation loss small against what separates
# the papers' rows (Simplifying Fig. 5: the block variants end within ~0.02-0.05 nats of Pre-LN).
MATCH_NATS = 0.03

CLAIMS: tuple[Claim, ...] = (
    Claim(
        "sas-matches-pre-ln",
        "simplifying",
        "Fig. 5",
        "SAS and SAS-P match Pre-LN's loss per step while having fewer parameters.",
        "18-layer, 768-wide models on CodeParrot, 40K steps (batch 128 x 128): SAS and SAS-P track Pre-LN "
        "per step within a few hundredths of a nat; 15% fewer parameters (167M to 146M incl. embeddings)",
        "steps",
        (
            Check("val_loss", "sas", "pre-ln", "within", MATCH_NATS),
            Check("val_loss", "sas-p", "pre-ln", "within", MATCH_NATS),
            Check("params", "sas", "pre-ln", "lower"),
            Check("params", "sas-p", "pre-ln", "lower"),
        ),
        tags=("quick",),
    ),
    Claim(
        "v-skipinit-worse-than-sas",
        "simplifying",
        "Sec. 4.1, Fig. 3",
        "Removing the attention skip with V-SkipInit alone trains worse than SAS.",
        "V-SkipInit without the value/projection identities and shaped attention loses per step to SAS "
        "at 18 layers (Fig. 3 vs Fig. 5)",
        "steps",
        (Check("val_loss", "v-skipinit", "sas", "higher"),),
    ),
    Claim(
        "sas-p-throughput",
        "simplifying",
        "Table 1",
        "SAS-P trains more tokens per second than Pre-LN.",
        "Crammed BERT on one A5000-class GPU: SAS-P 16% faster per step than Pre-LN (fewer matmuls, "
        "parallel sub-blocks). CPU timings show the fewer matmuls, not the GPU's fusion",
        "time",
        (
            Check("tokens_per_s", "sas-p", "pre-ln", "higher", relative=True),
            Check("flops_per_token", "sas-p", "pre-ln", "lower"),
        ),
        notes="tokens/s comes from a timing pass after training, not from the runs' logs (a run shares "
        "the machine with whatever else ran, and a resumed run's logged speed is its last half's): each "
        "architecture's training step in interleaved rounds, so a change in load hits both alike; the "
        "values are per round, the interval over rounds.",
        tags=("quick",),
    ),
    Claim(
        "resformer-beats-pre-ln",
        "value-residual",
        "Fig. 6-7, Table 5",
        "ResFormer reaches a lower loss than the vanilla Transformer at equal steps.",
        "82M-468M Llama-like models, 20B SlimPajama tokens, 10K steps of 2M tokens: ResFormer's training "
        "loss 0.02-0.04 below the Transformer's; equivalent to 10.4% fewer parameters",
        "steps",
        (Check("val_loss", "resformer", "pre-ln", "lower"),),
        tags=("quick",),
    ),
    Claim(
        "constant-lambda-2",
        "value-residual",
        "Table 5 (summary)",
        "Constant-ResFormer (lambda = 2) ends at or below Identity-ResFormer (lambda = 1/2).",
        "82M model: Identity-ResFormer 2.712, Constant-ResFormer (lambda = 2) 2.700 validation loss",
        "steps",
        (Check("val_loss", "resformer-constant", "resformer", "at_most", 0.0),),
    ),
    Claim(
        "learned-lambda-deeper",
        "value-residual",
        "Fig. 10 (summary)",
        "Learnable-ResFormer learns larger weights on V_1 in deeper layers.",
        "82M model: the learned lambda on V_1 grows with depth, matching Sparse-ResFormer's pattern "
        "(V_1 only in the last layers)",
        "steps",
        (Check("lambda_v1_slope", "resformer-learnable", None, "higher"),),
        notes="metric: the least-squares slope of the final lambda_{n,1} over the layers n >= 1.",
    ),
    Claim(
        "resformer-deep-entropy",
        "value-residual",
        "Fig. 1, Eq. 11",
        "ResFormer raises the token-importance entropy of deep layers (less attention concentration).",
        "82M model, 1,000 sequences: the Transformer's deep layers concentrate attention on few tokens "
        "(low entropy); ResFormer's keep it higher",
        "steps",
        (Check("deep_entropy", "resformer", "pre-ln", "higher"),),
        notes="metric: the importance entropy (Eq. 11), averaged over the deeper half of the layers, on "
        "32 held-out windows of the run's sequence length.",
    ),
    Claim(
        "svformer-kv-cache",
        "value-residual",
        "Sec. 3.3",
        "SVFormer's KV cache is (L + 1) / 2L of the Transformer's: all layers share V_1.",
        "'reducing the KV cache by nearly 50%'",
        "exact",
        (Check("kv_bytes_per_token", "svformer", "pre-ln", "equals", expected="(L+1)/2L"),),
        tags=("quick",),
    ),
    Claim(
        "svformer-longer-sequences",
        "value-residual",
        "Fig. 14",
        "SVFormer's loss gap to the Transformer shrinks when the training sequence is longer.",
        "82M model, batch 2M tokens, sequences 512 to 64K: SVFormer is always overtaken by the "
        "Transformer, but later and by less the longer the sequence",
        "tokens",
        (Check("val_loss", "svformer", "pre-ln", "lower", setting="seq-long", minus_setting="steps"),),
        notes="the check is (SVFormer - Pre-LN) at 4x the sequence length (same tokens per step) minus "
        "(SVFormer - Pre-LN) at the scale's sequence length: negative when the gap shrinks.",
    ),
    Claim(
        "denseformer-neutreno-between",
        "value-residual",
        "Fig. 7 (right)",
        "DenseFormer and NeuTRENO improve on the Transformer but stay above ResFormer.",
        "82M model: relative training loss ResFormer < NeuTRENO, DenseFormer < Transformer",
        "steps",
        (
            Check("val_loss", "denseformer", "pre-ln", "lower"),
            Check("val_loss", "denseformer", "resformer", "higher"),
            Check("val_loss", "neutreno", "pre-ln", "lower"),
            Check("val_loss", "neutreno", "resformer", "higher"),
        ),
    ),
    Claim(
        "bov-beats-pre-ln",
        "bank-of-values",
        "Table 1, Sec. 4",
        "Bank of Values reaches a lower loss than standard attention at equal FLOPs, with fewer FLOPs "
        "per token and no value cache in its table layers.",
        "nanochat d12 (135M), 1.5e18 FLOPs (1.97B tokens for the baseline): BoV 0.845 BPB against 0.854",
        "flops",
        (
            Check("val_loss", "bov", "pre-ln", "lower", setting="flops"),
            Check("flops_per_token", "bov", "pre-ln", "lower"),
            Check("table_layer_value_bytes", "bov", None, "equals", expected="0"),
        ),
        tags=("quick",),
    ),
    Claim(
        "x0-value-close-to-bov",
        "bank-of-values",
        "Table 1 rows 8-9, Sec. 4",
        "Computing deep values from x0 W_V matches the Bank of Values table, which learns those values "
        "directly.",
        "nanochat d12: x0 W_V in the last third 0.845-0.847 BPB, BoV 0.845",
        "flops",
        (Check("val_loss", "x0-value", "bov", "within", MATCH_NATS, setting="flops"),),
    ),
)



def _combination(first: str, second: str, together: str, name: str) -> Claim:
    """Do two papers' changes add up? At equal FLOPs, `together` is below each change alone, and the
    second change's gain on top of the first is at least its gain alone, less MATCH_NATS."""
    return Claim(
        f"{first}-with-{name}",
        "combinations",
        "-",
        f"{together} gains on both {first} and {second} alone at equal FLOPs, and the gains add up.",
        "no paper combines them; each paper's change is measured against its own baseline",
        "flops",
        (
            Check("val_loss", together, first, "lower", setting="flops"),
            Check("val_loss", together, second, "lower", setting="flops"),
            Check("val_loss", together, first, "at_most", MATCH_NATS, setting="flops",
                  minus=(second, "pre-ln")),
        ),
        notes=f"the third check is the interaction: ({together} - {first}) - ({second} - pre-ln), what "
        f"{second} gains on top of {first} less what it gains on Pre-LN. At most {MATCH_NATS} nats "
        "means the gains add up (negative: more than add up).",
        tags=("combination",),
    )


# The table no paper has: SAS-P's block with each value-path paper's change, and ResFormer's value
# residual below Bank of Values' table layers (model/value_paths/bank.py, ResFormerBank, says why it
# stops there). All at equal FLOPs, since SAS-P and BoV are cheaper per token than Pre-LN.
COMBINATIONS: tuple[Claim, ...] = (
    _combination("sas-p", "resformer", "sas-p+resformer", "resformer"),
    _combination("sas-p", "svformer", "sas-p+svformer", "svformer"),
    _combination("sas-p", "bov", "sas-p+bov", "bov"),
    _combination("bov", "resformer", "bov-resformer", "resformer-below"),
)
CLAIMS = CLAIMS + COMBINATIONS

CLAIMS_BY_ID = {c.id: c for c in CLAIMS}


def select(ids: list[str] | None = None, papers: list[str] | None = None, quick: bool = False) -> list[Claim]:
    """The claims named by id, or of the named papers, or tagged quick; all of them by default."""
    from blocklab.util.errors import ConfigError

    for name in ids or []:
        if name not in CLAIMS_BY_ID:
            import difflib

            close = difflib.get_close_matches(name, list(CLAIMS_BY_ID), n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"unknown claim {name!r}.{hint} Known: {', '.join(CLAIMS_BY_ID)}.")
    for name in papers or []:
        if name not in PAPERS:
            raise ConfigError(f"unknown paper {name!r}: choose one of {', '.join(PAPERS)}.")
    chosen = [c for c in CLAIMS if (not ids or c.id in ids) and (not papers or c.paper in papers)]
    if quick:
        chosen = [c for c in chosen if "quick" in c.tags]
    return chosen


# The papers' headline numbers: claims about how loss scales with size or data, judged on a ladder
# (`blocklab scaling`, `blocklab.scaling.judge`) rather than on one size's runs.
MEASURES = ("parameters", "data", "gain across sizes")
DIRECTIONS = ("fewer", "more", "lower")


@dataclass(frozen=True)
class Headline:
    """A headline number: `arch` against `baseline` on a ladder.

    measure "parameters": the fraction of parameters `arch` saves at equal loss (the ladder's law of
    each, read at the middle of the ladder); "data": the fraction of tokens it saves to reach the
    baseline's final loss on the largest rung; "gain across sizes": its paired loss difference at the
    smallest and at the largest rung. direction: "fewer" (a saving above 0), "more" (below 0), or
    "lower" (a lower loss at both ends). paper_value: the paper's fraction (0.104 for 10.4% fewer;
    -0.122 for 12.2% more), None where the paper gives no one number.
    """

    id: str
    paper: str  # a key of PAPERS
    where: str
    statement: str
    paper_result: str
    measure: str
    arch: str
    baseline: str
    direction: str
    paper_value: float | None = None
    notes: str = ""

    @property
    def archs(self) -> tuple[str, str]:
        return self.baseline, self.arch


HEADLINES: tuple[Headline, ...] = (
    Headline(
        "resformer-fewer-parameters", "value-residual", "Abstract, Sec. 4.2, Fig. 6 (left)",
        "ResFormer reaches the Transformer's validation loss with fewer parameters.",
        "82M-468M models on 20B tokens: equivalent loss with 10.4% fewer parameters (9.8-11.3% across sizes "
        "from Table 5's losses)", "parameters", "resformer", "pre-ln", "fewer", 0.104),
    Headline(
        "resformer-less-data", "value-residual", "Abstract, Sec. 4.2, Fig. 6 (right)",
        "ResFormer reaches the Transformer's final validation loss with fewer training tokens.",
        "468M model evaluated every 2B of 20B tokens: 13.6% less training data", "data", "resformer",
        "pre-ln", "fewer", 0.136),
    Headline(
        "svformer-more-parameters", "value-residual", "Sec. 4.5, Fig. 15c",
        "SVFormer needs more parameters than the Transformer to reach the same validation loss.",
        "Llama-like and GPT2-like models: a 12.2% increase in parameters for the same loss", "parameters",
        "svformer", "pre-ln", "more", -0.122),
    Headline(
        "bov-gain-across-sizes", "bank-of-values", "Table 1, Sec. 4 (135M and 780M)",
        "Bank of Values' lower loss holds at a small and at a large model size.",
        "nanochat d12 (135M) and d24 (780M) at equal FLOPs: lower BPB than the baseline at both sizes",
        "gain across sizes", "bov", "pre-ln", "lower",
        notes="the ladder trains equal tokens: BoV spends fewer FLOPs per token than Pre-LN, so a lower loss "
        "at equal tokens is a lower loss at equal FLOPs too (more tokens would only lower it further)."),
    Headline(
        "sas-p-fewer-parameters", "simplifying", "Abstract, Sec. 5, Fig. 5",
        "SAS-P matches Pre-LN's loss with fewer parameters.",
        "18-layer, 768-wide models on CodeParrot: the same loss per step with ~15% fewer parameters "
        "(167M to 146M)", "parameters", "sas-p", "pre-ln", "fewer", 0.15),
)

HEADLINES_BY_ID = {h.id: h for h in HEADLINES}
