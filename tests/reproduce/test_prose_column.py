"""The reproduction page's "on prose" column: the claims decided at `cpu`, judged again on English text
(scale `cpu-prose`, OUT/cpu-prose), with the side of zero of each check on both corpora.

References: the sides and agreements of hand-made intervals; on tiny stores trained here, each cell
rebuilt from the runs' summaries with scipy's t-interval and the verdict rule written out again.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from blocklab.reproduce import SCALES, Scale, reproduce
from blocklab.reproduce import page_prose as P
from blocklab.reproduce.judge import CheckResult, ClaimResult, Reproduction
from blocklab.reproduce.page import write_summary
from blocklab.statistics import evidence
from blocklab.statistics.claims import select


def claim_result(cid: str, *values: list[float]) -> ClaimResult:
    """A claim's result with one interval per check, from per-seed values."""
    claim = select([cid])[0]
    checks = [CheckResult(k, "inconclusive", interval=evidence.t_interval(v))
              for k, v in zip(claim.checks, values, strict=True)]
    return ClaimResult(claim, checks)


def test_sides_and_agreement_by_hand():
    below, above, zero = [-0.07, -0.06, -0.05], [0.03, 0.04, 0.05], [-0.01, 0.0, 0.012]  # t(2) 4.30: +-0.025
    assert [P.side(claim_result("resformer-beats-pre-ln", v).checks[0]) for v in (below, above, zero)] == \
        ["-", "+", "0"]
    code = claim_result("resformer-beats-pre-ln", below)
    assert P.agreement(code, claim_result("resformer-beats-pre-ln", [-0.04, -0.03, -0.02])) == P.SAME
    assert P.agreement(code, claim_result("resformer-beats-pre-ln", above)) == P.OPPOSITE
    assert P.agreement(code, claim_result("resformer-beats-pre-ln", zero)) == P.ONE_SIDED
    both_zero = claim_result("resformer-beats-pre-ln", zero), claim_result("resformer-beats-pre-ln", zero)
    assert P.agreement(*both_zero) == P.SAME
    # three checks: every one must agree; opposite sides anywhere outweigh a side shown on one corpus only
    three = claim_result("sas-p-with-resformer", below, zero, above)
    for prose, expected in (((below, zero, above), P.SAME), ((below, above, above), P.ONE_SIDED),
                            ((zero, zero, below), P.OPPOSITE)):
        assert P.agreement(three, claim_result("sas-p-with-resformer", *prose)) == expected
    # one seed: no interval, nothing to read
    assert P.side(claim_result("resformer-beats-pre-ln", [0.5]).checks[0]) is None
    # an exact check: its value against its reference
    kv = select(["svformer-kv-cache"])[0].checks[0]
    assert P.side(CheckResult(kv, "reproduced", value=0.625, reference=0.625)) == "0"
    assert P.side(CheckResult(kv, "contradicted", value=0.7, reference=0.625)) == "+"


def test_cells_only_for_the_claims_decided_at_cpu():
    decided = claim_result("resformer-beats-pre-ln", [-0.07, -0.06, -0.05])
    decided.checks[0].verdict = "reproduced"
    open_ = claim_result("constant-lambda-2", [-0.01, 0.0, 0.05])  # inconclusive at cpu
    code = Reproduction([decided, open_], SCALES["cpu"], "cpu", {}, 0.0)
    ids = ["resformer-beats-pre-ln", "constant-lambda-2", "gpu-only-claim"]
    assert P.prose_cells([code], None, ids) == ["not yet run", "-", "-"]
    prose = Reproduction([claim_result("resformer-beats-pre-ln", [0.03, 0.04, 0.05]),
                          claim_result("constant-lambda-2", [-0.07, -0.06, -0.05])], SCALES["cpu-prose"],
                         "cpu-prose", {}, 0.0)
    prose.results[0].checks[0].verdict = "contradicted"
    assert P.prose_cells([code], prose, ids) == [f"contradicted; {P.OPPOSITE}", "-", "-"]
    assert P.prose_cells([replace(code, scale_name="cpu-deep")], prose, ids) == ["-", "-", "-"]


def tiny(source: str, cache: Path) -> Scale:
    """A scale of seconds: d 32 x 4 layers, 40 steps of 4 x 32 bytes, 3 seeds."""
    return Scale("tiny test scale", "tiny", 40, seeds=3, batch_size=4, seq_len=32, lr=1e-2, eval_every=40,
                 model={"d_model": 32, "n_layers": 4, "n_heads": 2},
                 train={"eval_batches": 2, "log_every": 1,
                        "data": {"source": source, "tokenizer": "byte", "cache_dir": str(cache),
                                 "max_chars": 60_000}})


def by_hand(store: Path, arch: str, baseline: str) -> tuple[float, float]:
    """The 95% t-interval of arch - baseline's final validation loss over seeds 0-2, from the summaries."""
    def loss(a: str, seed: int) -> float:
        return json.loads((store / "tiny-steps" / "runs" / f"{a}-seed{seed}" / "summary.json").read_text())[
            "val_loss"]
    d = [loss(arch, s) - loss(baseline, s) for s in range(3)]
    return stats.t.interval(0.95, 2, loc=np.mean(d), scale=stats.sem(d))


def verdict_and_side(low: float, high: float) -> tuple[str, str]:
    """The rule for a check expected above zero ("higher"), written out again, and the interval's side."""
    verdict = "reproduced" if low > 0 else "contradicted" if high < 0 else (
        "no effect" if -0.02 <= low and high <= 0.02 else "inconclusive")
    return verdict, "+" if low > 0 else "-" if high < 0 else "0"


def column(page: Path) -> dict[str, str]:
    """The verdict table's "on prose" cells by claim."""
    lines = page.read_text().splitlines()
    head = lines.index(next(line for line in lines if line.startswith("| claim | paper |")))
    assert lines[head].endswith("| on prose |")
    rows = [line.strip("|").split(" | ") for line in lines[head + 2:] if line.startswith("| ")]
    return {row[0].strip(): row[-1].strip() for row in rows if len(row) > 4}


def test_the_column_reads_the_prose_store(corpus, tmp_path: Path, monkeypatch):
    cache, out = tmp_path / "cache", tmp_path / "rep"
    monkeypatch.setitem(SCALES, "cpu", tiny(str(corpus), cache))
    monkeypatch.setitem(SCALES, "cpu-prose", replace(tiny("shakespeare", cache), description="prose"))
    claims = select(["v-skipinit-worse-than-sas", "svformer-kv-cache"])
    quiet = dict(log=lambda *_: None)
    code = reproduce(claims, "cpu", out, **quiet)
    page = tmp_path / "REPRODUCTION.md"
    low, high = by_hand(out / "cpu", "v-skipinit", "sas")
    code_verdict, code_side = verdict_and_side(low, high)
    assert code.results[0].verdict == code_verdict
    assert code_verdict in P.DECIDED  # 40 steps tell V-SkipInit from SAS on the code corpus

    # no prose store yet: every decided claim's cell says so
    write_summary([code], page, "blocklab reproduce ...")
    assert column(page) == {"v-skipinit-worse-than-sas": "not yet run", "svformer-kv-cache": "not yet run"}
    assert f"runs in `{(out / 'cpu-prose').relative_to(tmp_path)}`" in page.read_text()
    assert not (out / "cpu-prose").exists()  # reading the page made no store

    # the prose store trained: its verdict and the sides, rebuilt from its runs' summaries
    prose = reproduce(claims, "cpu-prose", out, **quiet)
    low, high = by_hand(out / "cpu-prose", "v-skipinit", "sas")
    prose_verdict, prose_side = verdict_and_side(low, high)
    assert prose.results[0].verdict == prose_verdict
    agreement = (P.SAME if code_side == prose_side else P.OPPOSITE if {code_side, prose_side} == {"+", "-"}
                 else P.ONE_SIDED)
    manifest = json.loads((out / "cpu-prose" / "tiny-steps" / "runs" / "sas-seed0" / "data_manifest.json")
                          .read_text())
    assert manifest["source"]["fingerprint"]["corpus"] == "shakespeare"
    write_summary([code], page, "blocklab reproduce ...")
    assert column(page) == {
        "v-skipinit-worse-than-sas": f"{prose_verdict}; {agreement}",
        "svformer-kv-cache": f"reproduced; {P.SAME}"}  # the same cache arithmetic on either corpus

    # a prose run not finished: the claim reads how far its runs have got
    (out / "cpu-prose" / "tiny-steps" / "runs" / "sas-seed2" / "summary.json").unlink()
    write_summary([code], page, "blocklab reproduce ...")
    assert column(page)["v-skipinit-worse-than-sas"] == "partial: 5 of 6 runs"
    # a page without the cpu scale has no column
    renamed = replace(code, scale_name="other")
    write_summary([renamed], page, "blocklab reproduce ...")
    assert "on prose" not in page.read_text()


@pytest.mark.parametrize("name", ["cpu-prose"])
def test_the_prose_scale_is_the_cpu_scale_on_english_text(name):
    prose, cpu = SCALES[name], SCALES["cpu"]
    assert replace(prose, train=cpu.train, description=cpu.description) == cpu
    assert prose.base("steps")["data"] == {"source": "shakespeare"}
