"""The reproduction page's headline section (blocklab.headlines.page): an until-decided call's report in its
own folder, its claims on the page rebuilt from the runs, and the "on prose" column, on fake ladder stores
(runs written from a known law: seconds, no training)."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from blocklab.cli import main as cli
from blocklab.headlines.page import headline_section
from blocklab.headlines.prose import FIELDS
from blocklab.scaling.ladders import LADDERS, Ladder, Rung, plan
from blocklab.util.errors import ConfigError
from tests.helpers import write_law_run

ARCHS = ["pre-ln", "resformer", "sas-p"]


def small_cpu_ladder() -> Ladder:
    """Four rungs, three seeds, three architectures: stands in for the `cpu` ladder."""
    return replace(LADDERS["toy"], rungs=tuple(Rung(f"r{k}", {}) for k in range(4)), seeds=3,
                   archs=tuple(ARCHS))


@pytest.fixture
def ladder(monkeypatch) -> Ladder:
    """The page's only ladder is the small one, under the name `cpu`."""
    small = small_cpu_ladder()
    for key in list(LADDERS):
        monkeypatch.delitem(LADDERS, key)
    monkeypatch.setitem(LADDERS, "cpu", small)
    return small


def fake_runs(savings: dict[str, float], sd: float, rng: random.Random, fields: dict | None = None):
    """A `train_ladder` that writes each planned run's config.yaml, summary.json and validation curve from
    a known law: X reaches the baseline's loss with savings[X] fewer parameters (and tokens), each seed
    with noise shared by its architectures and its own. `fields`: the user's overrides of every run."""
    shared: dict[int, float] = {}

    def train(archs, ladder, name, out, seeds=None, launcher=None, log=print, only=None):
        if fields:
            from blocklab.scaling.overrides import with_user_fields
            ladder = with_user_fields(ladder, "cpu", fields)
        for rung, entry, cfg in plan(archs, ladder, Path(out) / name, seeds):
            run = Path(cfg.out_dir)
            if (run / "summary.json").is_file() or (only is not None and not only(entry.arch, cfg.seed)):
                continue
            n = 2e5 * 2 ** [r.name for r in ladder.rungs].index(rung.name)
            scale = 1 / (1 - savings.get(entry.arch, 0.0))
            offset = shared.setdefault(cfg.seed, rng.gauss(0, sd))
            loss = 6 * (n * scale) ** -0.08 + offset + rng.gauss(0, sd)
            write_law_run(run, n, scale, offset, loss, cfg)
    return train


def table(lines: list[str], head: str) -> dict[str, list[str]]:
    """The rows of the markdown table whose header starts with `head`, by their first cell."""
    at = next(k for k, line in enumerate(lines) if line.startswith(head))
    rows = []
    for line in lines[at + 2:]:
        if not line.startswith("| "):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
    return {row[0]: row for row in rows}


# -- until decided ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("saving, sd, max_seeds, stopped", [
    (0.20, 0.01, 8, "decided"),  # a clear saving: decided within the budget, after more than one look
    (0.01, 0.05, 3, "max seeds"),  # none, much noise: the budget ends at the first look
])
def test_an_until_decided_call_has_its_own_folder_and_its_claims_reach_the_page(
        ladder, tmp_path, monkeypatch, capsys, saving, sd, max_seeds, stopped):
    import blocklab.scaling.orchestrate as orchestrate

    store, page = tmp_path / "data", tmp_path
    train = fake_runs({"resformer": saving, "sas-p": 0.2}, sd, random.Random(3))
    train(ARCHS, ladder, "ladder-cpu", store)  # the fixed-seed ladder: 3 seeds of every architecture
    root = store / "ladder-cpu"
    before = headline_section(store, page)  # writes the fixed-seed report into root
    fixed = {name: (root / name).read_bytes() for name in ("scaling.md", "scaling.json")}

    monkeypatch.setattr(orchestrate, "train_ladder", train)
    args = ["scaling", "--ladder", "cpu", "--archs", "pre-ln,resformer", "--out", str(store),
            "--claims", "resformer-fewer-parameters", "--until-decided", "--max-seeds", str(max_seeds)]
    assert cli(args) == 0
    assert f"report: {root / 'until-decided' / 'scaling.md'}" in capsys.readouterr().out
    folder = root / "until-decided"
    record = json.loads((folder / "until_decided.json").read_text())
    assert record["stopped"] == stopped
    assert record["archs"] == ["pre-ln", "resformer"] and record["claims"] == ["resformer-fewer-parameters"]
    assert {p.name for p in folder.iterdir()} >= {"scaling.md", "scaling.html", "scaling.json"}
    report = (folder / "scaling.md").read_text()
    assert "confidence sequences" in report
    assert cli(args) == 0  # again: its own report, noted, is rewritten (not refused as the user's), the same
    capsys.readouterr()
    assert (folder / "scaling.md").read_text() == report
    # the fixed-seed report was not touched, and the page's fixed-seed part is as it was
    assert all((root / name).read_bytes() == data for name, data in fixed.items())
    after = headline_section(store, page)
    assert after[:len(before)] == before  # the block follows the ladder's caption, nothing before changes
    # the fixed-seed report, rebuilt, reads seeds 0-2 still; its Method names the seeds the rounds added
    rebuilt = json.loads((root / "scaling.json").read_text())
    assert rebuilt["seeds"] == [0, 1, 2]
    assert rebuilt["headlines"] == json.loads(fixed["scaling.json"])["headlines"]
    if record["seeds"] > 3:
        assert "of pre-ln, resformer at every rung" in (root / "scaling.md").read_text()

    # the block: the claim waited for, rebuilt from the runs as the rounds' last look read it
    block = after[len(before):]
    n = record["seeds"]
    assert "[`ladder-cpu` until decided](data/ladder-cpu/until-decided/scaling.md)" in block[1]
    assert record["method"] in block[1] and record["ended"] in block[1]
    rows = table(block, "| claim | verdict | ours | seeds |")
    assert list(rows) == ["resformer-fewer-parameters"]
    judged = {h["id"]: h for h in json.loads((folder / "scaling.json").read_text())["headlines"]}
    claim, verdict, ours, seeds, how = rows["resformer-fewer-parameters"]
    assert verdict == f"**{judged[claim]['verdict']}**" and ours == judged[claim]["text"] and seeds == str(n)
    if stopped == "decided":
        undecided_at = [look["seeds"] for look in record["looks"] if look["undecided"]]
        assert len(record["looks"]) > 1  # seeds were added: the claim decided at a later look
        at = max(undecided_at) + 1 if undecided_at else record["looks"][0]["seeds"]
        assert how == f"decided at {at} seeds" and record["headline"] == f"decided at {n} seeds"
    else:
        recorded = record["looks"][-1]["undecided"][0].removeprefix(f"{claim}: ")
        assert how == f"budget ended at {n} seeds (--max-seeds {max_seeds} reached): {recorded}"

    # a run of the last look gone: the page quotes the record and says it could not rebuild it
    (root / "r0" / "runs" / f"resformer-seed{n - 1}" / "summary.json").unlink()
    quoted = headline_section(store, page)[len(before):]
    assert record["headline"] in quoted[1] and "not rebuilt here" in quoted[1]


def test_an_until_decided_call_on_an_empty_store_reaches_the_page_before_the_whole_ladder(
        ladder, tmp_path, monkeypatch, capsys):
    import blocklab.scaling.orchestrate as orchestrate

    store = tmp_path / "data"
    monkeypatch.setattr(orchestrate, "train_ladder", fake_runs({"resformer": 0.2}, 0.01, random.Random(8)))
    assert cli(["scaling", "--ladder", "cpu", "--archs", "pre-ln,resformer", "--out", str(store),
                "--until-decided", "--max-seeds", "4"]) == 0
    capsys.readouterr()
    lines = headline_section(store, tmp_path)
    assert "**`ladder-cpu`: under way**, no seed has finished every rung yet." in lines  # sas-p never ran
    rows = table(lines, "| claim | verdict | ours | seeds |")
    assert set(rows) == {"resformer-fewer-parameters", "resformer-less-data"}


def test_without_a_record_the_page_has_no_until_decided_block(ladder, tmp_path):
    fake_runs({"resformer": 0.1}, 0.01, random.Random(4))(ARCHS, ladder, "ladder-cpu", tmp_path / "data")
    lines = headline_section(tmp_path / "data", tmp_path)
    assert not any("until decided" in line for line in lines)


# -- on prose --------------------------------------------------------------------------------------------
def side(iv: dict | None) -> str | None:
    """The claims table's side of an interval, written out again."""
    if iv is None or iv["low"] is None:
        return None
    return "+" if iv["low"] > 0 else "-" if iv["high"] < 0 else "0"


def agreement(a: str | None, b: str | None) -> str:
    if a is None or b is None:
        return "sign not measured"
    if a == b:
        return "same sign"
    return "opposite sign" if {a, b} == {"+", "-"} else "sign shown on one corpus only"


def test_the_prose_column_reads_the_prose_store(ladder, tmp_path, monkeypatch, capsys):
    store = tmp_path / "data"
    prose = store / "prose"
    fake_runs({"resformer": 0.3, "sas-p": 0.3}, 0.004, random.Random(5))(ARCHS, ladder, "ladder-cpu", store)

    def column() -> dict[str, str]:
        rows = table(headline_section(store, tmp_path), "| claim | verdict")
        return {cid: row[-1] for cid, row in rows.items()}

    ids = ["resformer-fewer-parameters", "resformer-less-data", "sas-p-fewer-parameters"]
    # no prose store: every claim "not yet run", and reading the page made none
    assert column() == dict.fromkeys(ids, "not yet run")
    text = headline_section(store, tmp_path)
    assert any("runs in `data/prose/ladder-cpu`" in line and "data.source=shakespeare" in line
               for line in text)
    assert not prose.exists()

    # part of it: seeds 0 and 1 of pre-ln and resformer (2 archs x 4 rungs x 2 seeds = 16 of 24 runs)
    fields = {"data": {"source": "shakespeare"}}
    train = fake_runs({"resformer": -0.3, "sas-p": 0.3}, 0.004, random.Random(6), fields)
    train(ARCHS, ladder, "ladder-cpu", prose, only=lambda arch, seed: arch != "sas-p" and seed < 2)
    assert column() == {ids[0]: "partial: 16 of 24 runs", ids[1]: "partial: 16 of 24 runs",
                        ids[2]: "partial: 8 of 24 runs"}
    # an architecture the shipped prose command does not train, with no run there, is said to be left out
    with monkeypatch.context() as patch:
        patch.setattr("blocklab.headlines.prose.ARCHS", ("pre-ln", "resformer"))
        assert column()[ids[2]] == "not trained: sas-p is not in the prose ladder's --archs"

    # the whole of it: each verdict as `scaling --no-train` reads the prose store, and the signs by hand
    train(ARCHS, ladder, "ladder-cpu", prose)
    assert cli(["scaling", "--ladder", "cpu", "--out", str(prose), "--no-train", *FIELDS]) == 0
    capsys.readouterr()
    there = {h["id"]: h for h in json.loads((prose / "ladder-cpu" / "scaling.json").read_text())["headlines"]}
    code = {h["id"]: h for h in json.loads((store / "ladder-cpu" / "scaling.json").read_text())["headlines"]}
    cells = column()
    for cid in ids:
        expected = agreement(side(code[cid]["interval"]), side(there[cid]["interval"]))
        assert cells[cid] == f"{there[cid]['verdict']}; {expected}"
    # resformer saves parameters on code and needs more on prose; sas-p saves on both
    assert cells[ids[0]] == "contradicted; opposite sign" and cells[ids[2]].endswith("; same sign")
    text = headline_section(store, tmp_path)
    assert any("[its report](data/prose/ladder-cpu/scaling.md)" in line for line in text)


def test_a_prose_store_trained_on_another_corpus_is_refused(ladder, tmp_path):
    store = tmp_path / "data"
    train = fake_runs({"resformer": 0.3}, 0.004, random.Random(7))
    train(ARCHS, ladder, "ladder-cpu", store)
    train(ARCHS, ladder, "ladder-cpu", store / "prose")  # the code corpus, in the prose store's place
    with pytest.raises(ConfigError, match="data.source"):
        headline_section(store, tmp_path)


def test_the_method_says_once_which_seeds_it_left_out_at_every_rung():
    from blocklab.scaling.method import _left_out_text

    names = [f"{r}/{a}-seed{k}" for k in (3, 4, 5) for a in ("pre-ln", "resformer") for r in ("r0", "r1")]
    assert _left_out_text([*names, "r1/sas-p-seed3"], ["r0", "r1"]) == (
        "seeds 3-5 of pre-ln, resformer at every rung; r1/sas-p-seed3")
    assert _left_out_text(["r0/pre-ln-seed3", "r1/pre-ln-seed3", "r0/bov-seed5"], ["r0", "r1"]) == (
        "seed 3 of pre-ln at every rung; r0/bov-seed5")
    assert _left_out_text(["r0/pre-ln-seed3"], ["r0", "r1"]) == "r0/pre-ln-seed3"


def test_two_until_decided_calls_kept_apart_by_report_both_reach_the_page(
        ladder, tmp_path, monkeypatch, capsys):
    """A second call on other claims, given a --report folder beside the first (`until-decided-<name>`),
    leaves the first call's record and block as they were, and adds its own block after it."""
    import blocklab.scaling.orchestrate as orchestrate

    store = tmp_path / "data"
    root = store / "ladder-cpu"
    train = fake_runs({"resformer": 0.2, "sas-p": 0.2}, 0.01, random.Random(5))
    train(ARCHS, ladder, "ladder-cpu", store)  # the fixed-seed ladder: 3 seeds of every architecture
    monkeypatch.setattr(orchestrate, "train_ladder", train)
    first = ["scaling", "--ladder", "cpu", "--archs", "pre-ln,sas-p", "--out", str(store),
             "--claims", "sas-p-fewer-parameters", "--until-decided", "--max-seeds", "3"]
    assert cli(first) == 0
    alone = headline_section(store, tmp_path)
    second = ["scaling", "--ladder", "cpu", "--archs", "pre-ln,resformer", "--out", str(store),
              "--claims", "resformer-less-data", "--until-decided", "--max-seeds", "4",
              "--report", str(root / "until-decided-less-data")]
    assert cli(second) == 0
    capsys.readouterr()
    assert json.loads((root / "until-decided" / "until_decided.json").read_text())["claims"] == [
        "sas-p-fewer-parameters"]
    both = headline_section(store, tmp_path)
    assert both[:len(alone)] == alone
    added = both[len(alone):]
    assert "[`ladder-cpu` until decided (`until-decided-less-data`)]" \
           "(data/ladder-cpu/until-decided-less-data/scaling.md)" in added[1]
    assert list(table(added, "| claim | verdict | ours | seeds |")) == ["resformer-less-data"]
