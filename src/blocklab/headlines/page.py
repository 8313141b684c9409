"""The reproduction page's section "The papers' headline numbers" (`headline_section`, which
`blocklab reproduce` places on benchmarks/REPRODUCTION.md): for each ladder store under OUT,

- the fixed-seed verdicts of every whole seed, with 95% t-intervals: the table, the figure and a link
  to the ladder's report in OUT/ladder-<name>/ (rewritten here from the runs), and for the `cpu`
  ladder a column "on prose", the same numbers on English text (`headlines.prose`);
- where `scaling --until-decided` has run on it (its record in OUT/ladder-<name>/until-decided/), the
  claims it waited for, rebuilt from the runs exactly as the rounds' last look read them: the same
  seeds, the confidence sequence (`rounds_lines`);
- a GPU ladder not yet run: its plan and estimated GPU minutes (`ladder_plan_line`).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from blocklab.report import md_table
from blocklab.scaling.report import VERDICT_READING, figure_path, verdict_table, write_scaling_report

HEADLINE_TEXT = (
    "The papers lead with numbers of another kind than the claims above: how much smaller (or "
    "how much less trained) a model can be for the same loss. Each is read off a ladder of sizes "
    "(`blocklab scaling`, docs/scaling.md): every architecture trained at every rung on the same "
    "tokens, loss fitted against parameters per seed, the equivalence read off the fits, a 95% "
    "t-interval over seeds. The paper's number stands beside ours."
)


def ladder_plan_line(root: Path, ladder, archs: list[str]) -> str:
    """A ladder with no whole seed yet: the runs left and their estimated time on its device (from the
    store's finished runs there, else a prior); a learning-rate sweep's runs count among them."""
    from blocklab.reproduce.estimate import Estimator
    from blocklab.scaling.ladders import plan
    from blocklab.scaling.sweeps import finished, sweep_plan

    sweep = sweep_plan(archs, ladder, root) if ladder.lr_sweep is not None else []
    if not all(finished(run) for run in sweep):  # no rate chosen yet: the runs' folders are the recipe's
        ladder = replace(ladder, lr_sweep=None)
    runs = [(run.rung, run.cfg) for run in sweep]
    runs += [(rung, cfg) for rung, _, cfg in plan(archs, ladder, root)]
    left = [(rung, cfg) for rung, cfg in runs if not (Path(cfg.out_dir) / "summary.json").is_file()]
    device = "gpu" if ladder.trains_on == "gpu" else "cpu"
    estimate = Estimator(root, device)
    minutes = sum(estimate.seconds(cfg) for _, cfg in left) / 60
    by_rung: dict[str, float] = {}
    for rung, cfg in left:
        by_rung[rung.name] = by_rung.get(rung.name, 0.0) + estimate.seconds(cfg) / 60
    rungs = ", ".join(f"{r} {m:.0f} min" for r, m in by_rung.items())
    done = len(runs) - len(left)
    state = f"{done} of {len(runs)} runs finished" if done else "not yet run"
    name = root.name
    return (
        f"**`{name}`: {state}.** {ladder.description}; {ladder.tokens_line()}; {len(runs)} runs "
        f"({len(archs)} architectures x {len(ladder.rungs)} rungs x {ladder.seeds} seeds"
        f"{f', and {len(sweep)} of the learning-rate sweep' if sweep else ''}), {len(left)} left: about "
        f"{minutes:.0f} "
        f"{device.upper()} minutes ({rungs}), estimated at {estimate.source}. It trains a piece per lent "
        f"call: `SKIP_BENCH=1 SKIP_CHECKS=1 LADDER={name.removeprefix('ladder-')} LADDER_MIN=8 bash "
        "benchmarks/gpu_session.sh`."
    )


def headline_section(store: Path, page_dir: Path) -> list[str]:
    """The reproduction page's section "The papers' headline numbers": each ladder in `store` with finished
    seeds (its verdicts, on prose for `cpu`, its figure, a link to its report, and the claims an
    until-decided call waited for), and the GPU ladders' plans."""
    from blocklab.headlines import prose as page_prose
    from blocklab.scaling.judge import judge_ladder, read_ladder
    from blocklab.scaling.ladders import LADDERS
    from blocklab.util.commands import pasteable

    md = ["## The papers' headline numbers", "", HEADLINE_TEXT]
    for key, ladder in LADDERS.items():
        name = f"ladder-{key}"
        root = store / name
        if key == "toy" or (not root.is_dir() and ladder.trains_on != "gpu"):
            continue
        archs = list(ladder.archs)
        data = read_ladder(root, ladder, archs, name) if root.is_dir() else None
        if data is None or not data.seeds():
            if ladder.trains_on == "gpu":
                md += ["", ladder_plan_line(root, ladder, archs)]
            else:
                md += ["", f"**`{name}`: under way**, no seed has finished every rung yet."]
            md += rounds_lines(root, ladder, page_dir)  # an until-decided call on some of its architectures
            continue
        result = judge_ladder(data)
        command = pasteable("blocklab", "scaling", "--ladder", key, "--archs", ",".join(archs),
                            "--out", store, "--no-train")
        write_scaling_report(result, root, command, flag="the ladder's folder")
        # the ladder's own seeds: runs an until-decided call added past them are counted in its table
        done = sum(s < ladder.seeds for seeds in data.points.values() for s in seeds)
        total = len(archs) * len(ladder.rungs) * ladder.seeds
        link = os.path.relpath(root / "scaling.md", page_dir)
        md += [
            "",
            f"**[`{name}`]({link})**: {ladder.description}; {ladder.tokens_line()}; "
            f"seeds {', '.join(map(str, result.seeds))} "
            f"({done} of {total} runs finished). Learning rate: {ladder.lr_rule}.",
            "",
        ]
        head, rows = verdict_table(result)
        prose = key == page_prose.LADDER
        if prose:
            cells = page_prose.prose_cells(result, store)
            head, rows = [*head, page_prose.COLUMN], [[*row, c] for row, c in zip(rows, cells, strict=True)]
        md += md_table(head, rows)
        if prose:
            md += ["", page_prose.column_text(store, page_dir)]
        figure = os.path.relpath(figure_path(root, VERDICT_READING), page_dir)
        md += [
            "",
            f"![loss against parameters, {name}]({figure})",
            "",
            f"Loss against parameters (all, log axis) on `{name}`: the mean over seeds per rung and the "
            "fitted laws; the equivalences at every rung, both parameter counts, the fits and their "
            f"residuals are in [its report]({link}).",
        ]
        md += rounds_lines(root, ladder, page_dir)
    return md


ROUNDS_HEAD = ["claim", "verdict", "ours", "seeds", "how the rounds stopped"]


def rounds_lines(root: Path, ladder, page_dir: Path) -> list[str]:
    """The claims each `scaling --until-decided` call waited for on this ladder: its record in
    root/until-decided/, or in a folder beside it whose name starts so (a call given such a --report, to
    keep its claims apart from another call's); [] without a record."""
    from blocklab.rounds.commands import RECORD, SCALING_FOLDER

    folders = sorted(p.parent for p in root.glob(f"{SCALING_FOLDER}*/{RECORD}"))
    return [line for folder in folders for line in _rounds_block(root, folder, ladder, page_dir)]


def _rounds_block(root: Path, folder: Path, ladder, page_dir: Path) -> list[str]:
    """One until-decided call's block, rebuilt from the runs as the rounds' last look read them: seeds
    0..n-1 (`rounds.commands.look_data`), every interval the confidence sequence. A record whose look
    the runs no longer give (runs missing) is quoted, and said to be."""
    from blocklab.rounds.commands import RECORD, SCALING_FOLDER, look_data
    from blocklab.scaling.judge import judge_ladder
    from blocklab.statistics import sequential

    record = json.loads((folder / RECORD).read_text())
    link = os.path.relpath(folder / "scaling.md", page_dir)
    n, archs = record["seeds"], record.get("archs")
    named = "" if folder.name == SCALING_FOLDER else f" (`{folder.name}`)"
    title = f"**[`{root.name}` until decided{named}]({link})**"
    data = look_data(root, ladder, archs, root.name, n) if archs else None
    if data is None or data.seeds() != list(range(n)):
        return ["", f"{title}: {record['headline']}. Quoted from [its report]({link}): the runs of its last "
                f"look (seeds 0-{n - 1}) are not all in `{root.name}`, so it is not rebuilt here."]
    with sequential.in_use():
        result = judge_ladder(data)
    claims = record.get("claims") or [h.claim.id for h in result.headlines]
    waited = [h for h in result.headlines if h.claim.id in claims]
    rows = [[h.claim.id, f"**{h.verdict}**", h.text, str(n),
             _how_stopped(h, result, record)] for h in waited]
    looks = ", ".join(str(look["seeds"]) for look in record["looks"])
    were = "was" if len(claims) == 1 else "were"
    text = (
        f"{title} (`{record.get('command', 'blocklab scaling --until-decided')}`): seeds added a round at "
        f"a time, one of every rung of {', '.join(archs)}, until {', '.join(claims)} {were} decided or the "
        f"budget ended: {record.get('ended', record['headline'])}, after looks at {looks} seeds. Every "
        f"interval here is an {record['method']}, not a t-interval: it stays 95% sure however the rounds "
        f"stopped. Rebuilt from the runs at seeds 0-{n - 1}, as the rounds' last look read them."
    )
    recorded = {u.partition(":")[0] for u in record["looks"][-1]["undecided"]}
    rebuilt = {h.claim.id for h in waited if h.verdict == "inconclusive"}
    if recorded != rebuilt:
        text += (" The runs now give other verdicts than the last look recorded (undecided then: "
                 f"{', '.join(sorted(recorded)) or 'none'}): a run changed since; rerun the command.")
    return ["", text, "", *md_table(ROUNDS_HEAD, rows)]


def _how_stopped(h, result, record: dict[str, Any]) -> str:
    """"decided at m seeds" (the first look from which the rounds no longer waited for it), or how the
    budget ended and what more would tell, read off the rebuilt look."""
    from blocklab.rounds.commands import headline_pending

    n = record["seeds"]
    if h.verdict == "inconclusive":
        pending = headline_pending(h, result)
        more = pending.text(n).removeprefix(f"{pending.name}: ")
        return f"{record.get('ended', f'budget ended at {n} seeds')}: {more}"
    at = n
    for look in reversed(record["looks"]):
        if any(u.partition(":")[0] == h.claim.id for u in look["undecided"]):
            break
        at = look["seeds"]
    return f"decided at {at} seeds"
