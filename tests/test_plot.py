"""`blocklab plot` on runs from `blocklab train`, and `compare --add` bringing such runs into a report."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import blocklab
from blocklab.cli import main
from blocklab.compare import compare
from blocklab.training.metrics import read_metrics
from blocklab.util.errors import ConfigError
from helpers import compare_base, saved_figures

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def overrides(corpus: Path, cache: Path, **extra) -> list[str]:
    """`blocklab train` key=value overrides of the compare tests' quick config."""
    fields = {**compare_base(corpus, cache), **extra}
    out = []
    for key, value in fields.items():
        if isinstance(value, dict):
            out += [f"{key}.{k}={v}" for k, v in value.items()]
        elif key != "progress":
            out.append(f"{key}={value}")
    return out


def train(corpus, cache, out: Path, *extra: str) -> Path:
    assert main(["train", *overrides(corpus, cache), *extra, "--out", str(out)]) == 0
    return out


def test_plot_overlays_runs_from_train_on_four_axes(corpus, tmp_path, capsys):
    cache = tmp_path / "cache"
    a = train(corpus, cache, tmp_path / "a", "arch=pre-ln")
    b = train(corpus, cache, tmp_path / "b", "arch=sas-p", "max_steps=6")
    assert main(["plot", str(a), str(b), "--out", str(tmp_path / "plot")]) == 0
    assert "plot:" in capsys.readouterr().out
    md = (tmp_path / "plot" / "plot.md").read_text()
    for axis in ("step", "tokens", "flops", "wall_time"):
        png = tmp_path / "plot" / f"loss_vs_{axis}.png"
        assert png.read_bytes()[:8] == PNG_SIGNATURE and f"({png.name})" in md
    page = (tmp_path / "plot" / "plot.html").read_text()
    assert page.count("data:image/png;base64,") == 4
    # the table: each run's last evaluation, as its metrics.jsonl has it
    for run, steps in ((a, 4), (b, 6)):
        last = read_metrics(run / "metrics.jsonl", "val")[-1]
        assert last["step"] == steps and f"| {last['val_loss']:.4f} |" in md


def test_plot_draws_flops_as_tokens_times_flops_per_token(corpus, tmp_path, monkeypatch):
    from blocklab import plot

    figures = saved_figures(monkeypatch)
    run = train(corpus, tmp_path / "cache", tmp_path / "a")
    plot.plot_runs([run], tmp_path / "plot")
    per_token = json.loads((run / "summary.json").read_text())["flops_per_token"]
    tokens = [r["tokens"] for r in read_metrics(run / "metrics.jsonl", "val")]
    flops_axes = figures[2].axes[0]
    assert list(flops_axes.get_lines()[0].get_xdata()) == [t * per_token for t in tokens]


def test_drawing_leaves_pyplot_and_the_backend_alone(tmp_path):
    """A user's process (a notebook, say) keeps its matplotlib backend and its open figures while blocklab
    draws: the figures are `Figure` objects on their own Agg canvas, never pyplot's."""
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"kind": "val", "step": s, "tokens": 64 * s, "wall_time": s / 10, "val_loss": 5 - s / 10,
             "val_bpb": 2.0} for s in (2, 4)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"flops_per_token": 1000.0}))
    code = "\n".join([
        "import matplotlib",
        "matplotlib.use('svg')",
        "import matplotlib.pyplot as plt",
        "mine = plt.figure()",
        "from blocklab.plot import plot_runs",
        f"plot_runs([{str(run)!r}], {str(tmp_path / 'plot')!r})",
        "assert matplotlib.get_backend() == 'svg', matplotlib.get_backend()",
        "assert plt.get_fignums() == [mine.number], plt.get_fignums()",
    ])
    subprocess.run([sys.executable, "-c", code], check=True)
    assert (tmp_path / "plot" / "loss_vs_step.png").read_bytes()[:8] == PNG_SIGNATURE


def test_no_module_draws_through_pyplot():
    src = Path(blocklab.__file__).parent
    through_pyplot = [p.relative_to(src).as_posix() for p in sorted(src.rglob("*.py"))
                      if re.search(r"matplotlib\.pyplot|matplotlib\.use\(|import pyplot", p.read_text())]
    assert not through_pyplot


def test_plot_refuses_what_is_not_a_run(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    assert "is not a run directory: it has no metrics.jsonl" in capsys.readouterr().err


def test_compare_add_joins_a_seed_and_adds_a_longer_run_after_checking_the_data(corpus, tmp_path):
    cache = tmp_path / "cache"
    base = compare_base(corpus, cache)
    # seed 1 of pre-ln and a longer sas run, trained outside the compare
    seed1 = train(corpus, cache, tmp_path / "elsewhere" / "pre-ln-1", "arch=pre-ln", "seed=1",
                  "optim.name=muon", "optim.lr=0.03", "optim.muon_lr=0.06")
    longer = train(corpus, cache, tmp_path / "elsewhere" / "sas-long", "arch=sas", "max_steps=8")
    out = tmp_path / "cmp"
    report = compare(["pre-ln", "sas"], out, seeds=1, base=base, timing_rounds=1, timing_steps=1,
                     log=lambda *_: None, add=[seed1, longer]).read_text()
    results = json.loads((out / "results.json").read_text())
    rows = {r["label"]: r for r in results["architectures"]}
    assert rows["pre-ln"]["seeds"] == 2, "a run matching pre-ln's config but its seed joins it"
    assert rows["sas (sas-long)"]["steps"] == 8 and rows["sas"]["steps"] == 4
    assert "added with `--add`" in report and str(longer) in report
    # the same run again, or one on other data, is refused naming why
    with pytest.raises(ConfigError, match="already has a run of seed 1"):
        compare(["pre-ln", "sas"], out, seeds=1, base=base, timing_rounds=0, log=lambda *_: None,
                add=[seed1, seed1])
    other = tmp_path / "other-corpus"
    other.mkdir()
    for i in range(20):
        (other / f"z{i}.py").write_text("".join(f"z{i} = {j}\n" for j in range(100)))
    stranger = train(other, cache, tmp_path / "elsewhere" / "stranger", "arch=pre-ln",
                     "data.val_fraction=0.3")
    with pytest.raises(ConfigError, match=r"cannot join this report: it differs .* in data source"):
        compare(["pre-ln", "sas"], out, seeds=1, base=base, timing_rounds=0, log=lambda *_: None,
                add=[stranger])
    windows = train(corpus, cache, tmp_path / "elsewhere" / "windows", "arch=pre-ln", "eval_batches=1")
    with pytest.raises(ConfigError, match=r"eval_batches \(2 against 1\)"):
        compare(["pre-ln", "sas"], out, seeds=1, base=base, timing_rounds=0, log=lambda *_: None,
                add=[windows])
    with pytest.raises(ConfigError, match="not a finished run"):
        compare(["pre-ln", "sas"], out, seeds=1, base=base, log=lambda *_: None, add=[tmp_path / "nothing"])


def test_plot_replaces_only_its_own_files_and_refuses_the_users_by_name(corpus, tmp_path, capsys):
    """issue 57 item 11: a plot.md, plot.html or loss_vs_*.png of the user's in --out is refused by name
    with nothing written; blocklab's own are rewritten; --overwrite replaces the named files."""
    run = train(corpus, tmp_path / "cache", tmp_path / "a", "arch=pre-ln")
    out = tmp_path / "plot"
    out.mkdir()
    (out / "plot.md").write_text("my notes\n")
    (out / "loss_vs_step.png").write_bytes(b"my figure")
    assert main(["plot", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "plot.md, loss_vs_step.png, not blocklab plot's own" in err and "--overwrite" in err
    assert (out / "plot.md").read_text() == "my notes\n" and sorted(p.name for p in out.iterdir()) == [
        "loss_vs_step.png", "plot.md"]
    assert main(["plot", str(run), "--out", str(out), "--overwrite"]) == 0
    assert (out / "loss_vs_step.png").read_bytes()[:8] == PNG_SIGNATURE
    assert main(["plot", str(run), "--out", str(out)]) == 0  # its own files: rewritten
    (out / "loss_vs_tokens.png").write_bytes(b"the user's, in place of blocklab's")
    assert main(["plot", str(run), "--out", str(out)]) == 2
    assert "loss_vs_tokens.png (changed since blocklab wrote it)" in capsys.readouterr().err
    (out / "plot.md").unlink()  # a folder from before the record: the marks tell blocklab's files
    (out / ".blocklab-wrote.json").unlink()
    (out / "loss_vs_tokens.png").unlink()
    assert main(["plot", str(run), "--out", str(out)]) == 2  # loss_vs_*.png no longer linked from a report
    assert main(["plot", str(run), "--out", str(out), "--overwrite"]) == 0
    (out / ".blocklab-wrote.json").unlink()
    assert main(["plot", str(run), "--out", str(out)]) == 0  # plot.md marked, its figures linked from it
