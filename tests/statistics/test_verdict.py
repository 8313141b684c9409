"""The compare report's verdict (blocklab.statistics.verdict) against hand computations and scipy."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from blocklab.compare import Entry
from blocklab.statistics import verdict


def runs(losses: dict[str, list[float]]) -> tuple[list[Entry], dict[str, list[dict]]]:
    """Entries and their runs (what the verdict reads: seed, loss, bits per byte) from per-seed losses."""
    entries = [Entry.parse(a) for a in losses]
    by_label = {a: [{"summary": {"seed": s, "val_loss": v, "val_bpb": v / 2, "step": 150}}
                    for s, v in enumerate(vs)] for a, vs in losses.items()}
    return entries, by_label


@pytest.mark.parametrize("difference, sd", [(0.05, 0.03), (0.01, 0.017), (0.2, 0.03), (-0.04, 0.02)])
def test_seeds_needed_is_the_fewest_whose_interval_is_narrower_than_the_difference(difference, sd):
    by_hand = next(n for n in range(3, 1000) if stats.t.ppf(0.975, n - 1) * sd / np.sqrt(n) < abs(difference))
    assert verdict.seeds_needed(difference, sd) == (by_hand if by_hand <= verdict.MOST_SEEDS else None)
    assert verdict.seeds_needed(0.0, sd) is None


def test_the_reference_spread_is_the_nearest_measured_budget_of_the_size():
    table = json.loads(verdict.SEED_SPREAD.read_text())["sizes"]["tiny"]
    steps = sorted(e["steps"] for e in table)
    assert verdict.reference_spread("tiny", steps[0])["steps"] == steps[0]
    assert verdict.reference_spread("tiny", steps[-1] * 10)["steps"] == steps[-1]
    assert verdict.reference_spread("resformer-82m", 150) is None
    assert all(0 < e["paired_sd"] < 0.2 for e in table)


def test_the_ranking_pairs_by_seed_and_reads_each_interval():
    losses = {"pre-ln": [4.00, 4.10, 4.05, 3.95], "sas": [3.90, 4.01, 3.94, 3.86],
              "resformer": [4.001, 4.098, 4.052, 3.951], "bov": [4.02, 4.30, 3.90, 4.10]}
    entries, by_label = runs(losses)
    ranked = verdict.ranking(entries, by_label, "tiny")
    assert [r["label"] for r in ranked["rows"]] == sorted(losses, key=lambda a: np.mean(losses[a]))
    rows = {r["label"]: r for r in ranked["rows"]}
    for arch in ("sas", "resformer", "bov"):
        d = np.array(losses[arch]) - np.array(losses["pre-ln"])
        low, high = stats.t.interval(0.95, 3, loc=d.mean(), scale=stats.sem(d))
        assert (rows[arch]["diff"].low, rows[arch]["diff"].high) == pytest.approx((low, high))
    assert rows["sas"]["reading"] == "lower than pre-ln"
    assert rows["resformer"]["reading"].startswith("no effect")  # within +-0.02 around 0
    assert rows["bov"]["reading"].startswith("no clear difference (within the seed spread)")  # noisy
    # this comparison's own spread: the pooled s.d. of the three architectures' paired differences
    diffs = [np.array(losses[a]) - np.array(losses["pre-ln"]) for a in ("sas", "resformer", "bov")]
    pooled = np.sqrt(sum(((d - d.mean()) ** 2).sum() for d in diffs) / sum(len(d) - 1 for d in diffs))
    assert ranked["paired_sd"] == pytest.approx(pooled)
    assert ranked["paired_sd_source"] == "this comparison's seeds"


def test_one_seed_cannot_tell_and_says_how_many_seeds_would():
    entries, by_label = runs({"pre-ln": [4.0], "sas": [3.9], "resformer": [3.999]})
    ranked = verdict.ranking(entries, by_label, "tiny")
    ref = verdict.reference_spread("tiny", 150)
    rows = {r["label"]: r for r in ranked["rows"]}
    n = verdict.seeds_needed(-0.1, ref["paired_sd"])
    assert rows["sas"]["reading"] == (f"cannot tell with 1 seed (beyond the seed spread); about {n} seeds "
                                      "would tell one this size")
    assert rows["resformer"]["reading"].endswith(f"more than {verdict.MOST_SEEDS} seeds")
    assert ranked["paired_sd"] == ref["paired_sd"] and ref["source"] in ranked["paired_sd_source"]
    assert "cannot tell a difference from seed-to-seed noise" in verdict.verdict_text(ranked)
    table = verdict.verdict_table(ranked)
    assert [row[1] for row in table] == ["sas", "resformer", "pre-ln"] and table[2][4] == "baseline"


def test_every_claim_whose_architectures_are_present_gets_a_row_with_its_caveats():
    losses = {"pre-ln": [4.0, 4.1, 4.2], "sas-p": [3.9, 4.05, 4.1], "resformer": [3.95, 4.08, 4.15],
              "sas-p+resformer": [3.8, 3.95, 4.0], "bov": [3.9, 4.0, 4.1]}
    entries, by_label = runs(losses)
    rows = verdict.claim_rows(entries, by_label, "steps")
    by_check = {(r[0], r[1]): r for r in rows}
    # BoV's claim is at equal FLOPs: measured on these equal-step runs all the same, and said so
    bov = by_check["bov-beats-pre-ln", "bov - pre-ln"]
    assert "these runs are at equal steps, the paper compares at equal FLOPs" in bov[5]
    # the interaction: (A+B - A) - (B - pre-ln), paired by seed
    a, b, ab, base = (np.array(losses[k]) for k in ("sas-p", "resformer", "sas-p+resformer", "pre-ln"))
    inter = (ab - a) - (b - base)
    row = by_check["sas-p-with-resformer", "sas-p+resformer - sas-p - (resformer - pre-ln)"]
    low, high = stats.t.interval(0.95, 2, loc=inter.mean(), scale=stats.sem(inter))
    assert row[3] == f"{inter.mean():+.4f}" and row[4] == f"[{low:+.4f}, {high:+.4f}]"
    assert ("sas-matches-pre-ln", "sas - pre-ln") not in by_check  # sas is absent
    one = verdict.claim_rows(*runs({"pre-ln": [4.0], "resformer": [3.9]}), "steps")
    assert one[0][5] == "inconclusive (1 seed: 3 or more decide)"


def test_what_is_held_equal_names_flops_and_parameters_with_and_without_value_tables():
    rows = [{"label": "pre-ln", "flops_per_token": 100.0, "params": {"total": 1000, "value_tables": 0}},
            {"label": "bov", "flops_per_token": 90.0, "params": {"total": 1800, "value_tables": 900}}]
    text = verdict.held_equal_text(rows, "steps")
    assert "same steps" in text and "`bov` 0.90x" in text
    assert "`bov` 1.80x (0.90x without its value tables)" in text
    assert "equal FLOPs" in text
    assert "cheaper block takes more steps" in verdict.held_equal_text(rows, "flops")


def test_runs_without_bits_per_byte_are_ranked_by_loss():
    entries, by_label = runs({"pre-ln": [4.0, 4.1], "sas": [3.9, 4.0]})
    for run in by_label["sas"]:
        run["summary"]["val_bpb"] = None
    ranked = verdict.ranking(entries, by_label, "tiny")
    assert [r["label"] for r in ranked["rows"]] == ["sas", "pre-ln"]
    sas, base = ranked["rows"]
    assert sas["val_bpb"] is None and sas["diff_bpb"] is None and base["val_bpb"] == pytest.approx(4.05 / 2)
    assert sas["diff"].mean == pytest.approx(-0.1)
    assert [row[3] for row in verdict.verdict_table(ranked)] == ["-", f"{4.05 / 2:.4f}"]
    assert verdict.verdict_table(ranked)[0][6] == "-"
    assert "bits per byte are not available for every run" in verdict.verdict_text(ranked)
    assert verdict.as_data(ranked)["rows"][0]["val_bpb"] is None


def test_a_compare_whose_runs_have_no_bits_per_byte_writes_its_report(tmp_path):
    """A word-level tokenizer to which every word of the data is unknown (a special token: no text bytes)
    gives runs without bits per byte: compare died in the ranking with a TypeError and wrote no
    report.md. Now the report ranks by loss and shows '-' for bits per byte."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from blocklab.compare import compare
    from helpers import compare_base, write_code_corpus

    (tmp_path / "corpus").mkdir()
    corpus = write_code_corpus(tmp_path / "corpus")
    words = ["[UNK]", "</s>"] + [f"w{i}" for i in range(62)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["[UNK]", "</s>"])
    tok.save(str(tmp_path / "words.json"))
    base = compare_base(corpus, tmp_path / "cache", steps=2)
    base["data"].update(tokenizer=str(tmp_path / "words.json"), eos_token="</s>")
    compare(["pre-ln", "sas-p"], tmp_path / "cmp", base=base, log=lambda *_: None, timing_rounds=1,
            timing_steps=2)
    summaries = {a: json.loads((tmp_path / "cmp" / "runs" / f"{a}-seed0" / "summary.json").read_text())
                 for a in ("pre-ln", "sas-p")}
    assert all(s["val_bpb"] is None for s in summaries.values())
    results = json.loads((tmp_path / "cmp" / "results.json").read_text())
    rows = results["verdict"]["rows"]
    assert [r["label"] for r in rows] == sorted(summaries, key=lambda a: summaries[a]["val_loss"])
    assert all(r["val_bpb"] is None for r in rows)
    report = (tmp_path / "cmp" / "report.md").read_text()
    assert "bits per byte are not available for every run" in report
    first = next(line for line in report.splitlines() if line.startswith(f"| 1 | {rows[0]['label']} |"))
    assert first.split("|")[4].strip() == "-"
