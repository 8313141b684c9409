"""Ladders as data (`blocklab.scaling.ladder_files`), the user's config and overrides over a ladder
(`scaling.overrides`), the store's config check (`scaling.orchestrate.check_store`) and the output paths
checked before anything trains (`scaling.outputs`, `reproduce.budgeted_launch.check_export`)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

from blocklab.cli import main as cli
from blocklab.scaling import orchestrate
from blocklab.scaling.ladder_files import ladder_from_dict, read_ladder_file
from blocklab.scaling.ladders import LADDERS, Ladder, Rung, get_ladder, plan
from blocklab.scaling.overrides import with_user_fields
from blocklab.util.errors import ConfigError
from tests.helpers import write_code_corpus

ROOT = Path(__file__).resolve().parents[2]


# -- the shipped ladders: the constants they replaced, as the code defined them before ------------------
def _cpu_rung(d_model: int, n_layers: int) -> Rung:
    return Rung(f"d{d_model}-l{n_layers}",
                {"d_model": d_model, "n_layers": n_layers, "n_heads": d_model // 32,
                 "mlp_hidden": 4 * d_model})


def _llama_rung(name: str, n_layers: int, d_model: int, n_heads: int, mlp_hidden: int) -> Rung:
    return Rung(name, {"n_layers": n_layers, "d_model": d_model, "n_heads": n_heads,
                       "mlp_hidden": mlp_hidden})


OLD = {
    "cpu": Ladder(
        "size tiny's recipe at d 64 x 2 layers, 96 x 3, 128 x 4 (size tiny), 160 x 5 and 192 x 6 (heads of "
        "32, MLP 4d, vocab 4096), 400 steps of 16 x 128 tokens (0.82M tokens) at every rung",
        "tiny", tuple(_cpu_rung(d, d // 32) for d in (64, 96, 128, 160, 192)), steps=400, batch_size=16,
        seq_len=128,
        lr_rule="each architecture's recipe rate at size tiny (recipes/main_job_optim.json), the same at "
        "every rung, as Value Residual Learning trains every size at one peak rate (6e-4)",
        notes="sized by measurement: d64-l2 trains at ~23k tokens/s and d192-l6 at ~4.4k on one thread of "
        "this project's 2-core CPU, so the 75 runs take about 9,000 core-seconds; measured: 98 minutes of "
        "wall clock at two runs at once (2026-11-27)"),
    "gpu-resformer": Ladder(
        "Value Residual Learning's shapes, 82M (8 x 512), 180M (12 x 768), 320M (14 x 1024, our reading) "
        "and 468M (24 x 1024), Llama-like, 500 steps of 32 x 512 tokens (8.2M tokens) at every rung, "
        "lr 6e-4 as in the paper", "resformer-82m",
        (_llama_rung("82m", 8, 512, 8, 1792), _llama_rung("180m", 12, 768, 12, 2688),
         _llama_rung("320m", 14, 1024, 16, 3584), _llama_rung("468m", 24, 1024, 16, 3584)),
        steps=500, batch_size=32, seq_len=512, eval_every=50, lr=6e-4,
        lr_rule="6e-4 for every architecture and rung, the paper's peak rate (Table 4)",
        train={"data": {"vocab_size": 8192}, "ckpt_every": 250}, archs=("pre-ln", "resformer", "svformer"),
        trains_on="gpu",
        notes="8.2M tokens is 3.3 passes over the embedded 2.45M-token corpus (the GPU machines reach no "
        "network), far from the paper's 20B: a larger corpus carried to the machine is what its budgets "
        "need"),
    "toy": Ladder(
        "size tiny's recipe at d 32 x 2 layers, 64 x 2 and 96 x 3, 20 steps of 4 x 32 tokens: a smoke, not "
        "evidence", "tiny", (_cpu_rung(32, 2), _cpu_rung(64, 2), _cpu_rung(96, 3)), steps=20, batch_size=4,
        seq_len=32, eval_every=10, seeds=2, lr_rule="each architecture's recipe rate at size tiny"),
}


@pytest.mark.parametrize("name", list(OLD))
def test_each_shipped_ladder_file_plans_exactly_the_runs_of_the_constant_it_replaced(name):
    """Config by config (out_dir included), and the report's words: the committed store is reused. The
    descriptions no longer state the tokens a run (the report's `tokens_line` does, once): compared
    with that clause taken out of the old one."""
    new, old = LADDERS[name], OLD[name]
    archs = list(old.archs)
    for a, b in zip(plan(archs, new, Path("/s")), plan(archs, old, Path("/s")), strict=True):
        assert a[0] == b[0] and a[1] == b[1] and a[2].to_dict() == b[2].to_dict()
    assert new.description == re.sub(r", \d+ steps of \d+ x \d+ tokens \([\d.]+M tokens\) at every rung|, "
                                     r"\d+ steps of \d+ x \d+ tokens(?=:)", "", old.description)
    for field in ("lr_rule", "notes", "seeds", "archs", "trains_on", "tokens", "eval_every"):
        assert getattr(new, field) == getattr(old, field), field
    # the report's shape column, in the same order
    assert [list(r.model) for r in new.rungs] == [list(r.model) for r in old.rungs]


# -- ladder files -------------------------------------------------------------------------------------------
def doc_ladder() -> dict:
    """The example ladder of docs/scaling.md, as a user copies it."""
    text = (ROOT / "docs" / "scaling.md").read_text()
    return yaml.safe_load(re.search(r"## Your own ladder.*?```yaml\n(.*?)```", text, re.S).group(1))


def test_the_docs_example_ladder_plans_its_steps_from_20_tokens_per_parameter(tmp_path):
    """Each rung's steps are round(20 N / (4 x 32)), N counted here by hand on the model the run builds."""
    from blocklab.runtime import LanguageModel

    (tmp_path / "corpus").mkdir()
    data = doc_ladder()
    data["train"]["data"].update(source=str(write_code_corpus(tmp_path / "corpus")),
                                 cache_dir=str(tmp_path / "cache"))
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
    ladder = get_ladder(str(path))
    runs = plan(list(ladder.archs), ladder, tmp_path / "s")
    assert len(runs) == 2 * 3 * 2 and [r.name for r in ladder.rungs] == ["d32-l2", "d64-l2", "wide"]
    for rung in ladder.rungs:
        configs = [cfg for r, _, cfg in runs if r == rung]
        base = next(c for c in configs if c.arch == "pre-ln")
        with torch.device("meta"):
            n = sum(p.numel() for p in LanguageModel(base.model_config(_vocab(base))).parameters())
        assert {c.max_steps for c in configs} == {round(20 * n / (4 * 32))}
    line = ladder.tokens_line()
    assert line.startswith("20 tokens per parameter of pre-ln") and "wide" in line


def _vocab(cfg) -> int:
    from blocklab.data import prepare_data

    return prepare_data(cfg.data).tokenizer.vocab_size


def test_a_learning_rate_rule_is_fixed_per_rung_or_each_architectures_recipe():
    rungs = [{"d_model": 32, "n_layers": 2, "n_heads": 1, "lr": 1e-3}, {"d_model": 64, "n_layers": 2,
                                                                         "n_heads": 2, "lr": 3e-3}]
    base = {"rungs": rungs, "steps": 5, "batch_size": 2, "seq_len": 16, "lr": "per-rung"}
    per_rung = ladder_from_dict(base)
    got = {(r.name, cfg.optim.lr) for r, _, cfg in plan(["pre-ln", "sas-p"], per_rung, Path("/s"))}
    assert got == {("d32-l2", 1e-3), ("d64-l2", 3e-3)}
    fixed = ladder_from_dict({**base, "lr": 6e-4, "rungs": [{k: v for k, v in r.items() if k != "lr"}
                                                              for r in rungs]})
    assert {cfg.optim.lr for *_, cfg in plan(["pre-ln", "sas-p"], fixed, Path("/s"))} == {6e-4}
    recipe = replace(fixed, lr=None)
    rates = {(cfg.arch, cfg.optim.lr) for *_, cfg in plan(["pre-ln", "sas-p"], recipe, Path("/s"))}
    assert len(rates) == 2 and rates == {(a, lr) for a, lr in rates}  # one rate per architecture
    from blocklab.recipes import recipe_optim

    assert rates == {(a, recipe_optim(a, "tiny")["lr"]) for a in ("pre-ln", "sas-p")}


GOOD = {"rungs": [{"d_model": 32, "n_layers": 2, "n_heads": 1}], "steps": 5, "batch_size": 2, "seq_len": 16}


@pytest.mark.parametrize("change, message", [
    ({"stepz": 4}, "key 'stepz' is not allowed: the keys are description, size, rungs, steps"),
    ({"rungs": []}, "rungs = [] is not allowed: give a list of one or more rungs"),
    ({"rungs": [{"d_model": 32, "n_layers": 2}, {"d_model": 32, "n_layers": 2}]}, "'d32-l2' is given twice"),
    ({"rungs": [{"d_model": "wide", "n_layers": 2}]}, "rung 1: d_model = 'wide' is not allowed"),
    ({"rungs": [{"width": 32}]}, "rung 1: key 'width' is not allowed: the keys are name, size, lr"),
    ({"rungs": [{"name": "../up", "d_model": 32}]}, "rung 1: name = '../up' is not allowed"),
    ({"rungs": ["huge"]}, "rung 1: size = 'huge' is not a size preset"),
    ({"tokens_per_parameter": 20}, "give exactly one of steps"),
    ({"steps": 0}, "steps = 0 is not allowed: give an integer >= 1"),
    ({"batch_size": "16"}, "batch_size = '16' is not allowed"),
    ({"lr": "sweep"}, "lr = 'sweep' is not allowed: give recipe, a positive rate"),
    ({"lr": "per-rung"}, "rung 1: each rung needs its lr with `lr: per-rung`"),
    ({"archs": ["pre-ln"]}, "archs = ['pre-ln'] is not allowed: give a list of two or more"),
    ({"archs": ["pre-ln", "nonsense"]}, "nonsense"),
    ({"trains_on": "tpu"}, "trains_on = 'tpu' is not allowed: choose cpu or gpu"),
])
def test_a_bad_ladder_file_is_one_line_naming_the_file_and_the_key(tmp_path, capsys, change, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**GOOD, **change}))
    code = cli(["scaling", "--ladder", str(path), "--out", str(tmp_path / "s"), "--no-train"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and str(path) in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "s").exists()


def test_a_key_given_twice_in_a_ladder_file_is_refused_with_both_lines(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("rungs: [small]\nsteps: 5\nbatch_size: 2\nseq_len: 16\nsteps: 50\n")
    with pytest.raises(ConfigError, match=r"key 'steps' is given twice \(lines 2 and 5\)"):
        read_ladder_file(path)


def test_a_ladder_file_given_as_the_training_config_is_named(tmp_path, capsys):
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    assert cli(["scaling", str(path), "--out", str(tmp_path / "s"), "--no-train"]) == 2
    err = capsys.readouterr().err
    assert f"{path} is a ladder file, not a training config: pass it as --ladder {path}" in err


def test_list_names_the_shipped_ladder_files_and_how_to_write_ones_own(capsys):
    assert cli(["scaling", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(f"ladder {name}:" in out for name in ("cpu", "gpu-resformer", "toy"))
    assert "recipes/ladders" in out and "--ladder FILE.yaml" in out


# -- the user's config and overrides ----------------------------------------------------------------------
def test_a_config_and_overrides_reach_every_run_and_the_ladders_fields_stay_its_own(tmp_path):
    config = tmp_path / "mine.yaml"
    config.write_text("data: {source: corpus/, tokenizer: byte}\nprecision: float32\n")
    from blocklab.scaling.cli import user_fields

    fields = user_fields([str(config), "data.tokenizer=bpe", "optim.weight_decay=0.0", "progress=true"])
    ladder = with_user_fields(LADDERS["toy"], "toy", fields)
    runs = plan(["pre-ln", "resformer"], ladder, tmp_path)
    assert {(c.data.source, c.data.tokenizer, c.precision, c.optim.weight_decay, c.progress)
            for *_, c in runs} == {("corpus/", "bpe", "float32", 0.0, True)}
    old = plan(["pre-ln", "resformer"], LADDERS["toy"], tmp_path)
    for (_, _, a), (_, _, b) in zip(runs, old, strict=True):  # the ladder's own fields unchanged
        assert (a.model, a.max_steps, a.batch_size, a.seq_len, a.optim.lr, a.size) == (
            b.model, b.max_steps, b.batch_size, b.seq_len, b.optim.lr, b.size)


@pytest.mark.parametrize("override, message", [
    ("model.d_model=64", "model.d_model = 64 is not allowed: each rung of ladder toy sets it (d32-l2: 32, "
                         "d64-l2: 64, d96-l3: 96); to change the rungs, write a ladder file"),
    ("optim.lr=1e-3", "optim.lr = 0.001 is not allowed: ladder toy's learning-rate rule sets it"),
    ("batch_size=8", "batch_size = 8 is not allowed: it is ladder toy's own (4)"),
    ("max_tokens=1000", "max_tokens = 1000 is not allowed: it is ladder toy's own"),
    ("arch=sas", "arch = 'sas' is not allowed: `blocklab scaling` sets it per run; use --archs"),
    ("out_dir=x", "use --out"),
    ("init_from=runs/a", "from scratch"),
])
def test_an_override_of_the_ladders_own_field_is_refused_naming_it(tmp_path, capsys, override, message):
    code = cli(["scaling", "--ladder", "toy", override, "--out", str(tmp_path / "s"), "--no-train"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err


def test_old_command_lines_keep_working(tmp_path, monkeypatch):
    """`blocklab scaling --archs pre-ln,resformer --ladder cpu --seeds 3 --out runs/scaling` trains what it
    trained (the training itself stubbed)."""
    seen = {}

    def stub(archs, ladder, name, out, seeds=None, launcher=None, log=print):
        seen.update(archs=archs, ladder=ladder, name=name, out=out, seeds=seeds)
        raise ConfigError("stubbed")

    monkeypatch.setattr(orchestrate, "train_ladder", stub)
    out = str(tmp_path / "runs")
    line = ["scaling", "--archs", "pre-ln,resformer", "--ladder", "cpu", "--seeds", "3", "--out", out]
    assert cli(line) == 2
    assert seen == {"archs": ["pre-ln", "resformer"], "ladder": LADDERS["cpu"], "name": "ladder-cpu",
                    "out": out, "seeds": 3}


# -- the store's config check -----------------------------------------------------------------------------
def fake_store(root: Path, ladder: Ladder, archs: list[str]) -> list:
    """Finished runs of `ladder` as training would leave them (config.yaml, summary.json, a val curve), with
    losses from a power law: enough for --no-train to fit and report."""
    runs = plan(archs, ladder, root)
    for rung, entry, cfg in runs:
        run = Path(cfg.out_dir)
        run.mkdir(parents=True)
        (run / "config.yaml").write_text(cfg.to_yaml())
        n = {"d32-l2": 30_000, "d64-l2": 80_000, "d96-l3": 200_000}[rung.name]
        loss = 9 * n ** -0.1 * (1.01 if entry.arch == "pre-ln" else 1.0) + 0.001 * cfg.seed
        rows = [{"kind": "val", "step": s, "tokens": 128 * s, "val_loss": loss + 2 / (1 + s)}
                for s in (0, 10, 20)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run / "summary.json").write_text(json.dumps({"params": {"total": n, "non_embedding": n // 2},
                                                      "val_loss": rows[-1]["val_loss"], "step": 20}))
    return runs


def test_no_train_refuses_a_run_trained_with_another_config_naming_it_and_the_field(tmp_path, capsys):
    archs = ["pre-ln", "resformer"]
    out = tmp_path / "s"
    runs = fake_store(out / "ladder-toy", LADDERS["toy"], archs)
    args = ["scaling", "--ladder", "toy", "--archs", ",".join(archs), "--out", str(out), "--no-train"]
    assert cli(args) == 0
    capsys.readouterr()
    other = Path(runs[-1][2].out_dir)  # the case: a run trained at optim.lr=1e-3
    (other / "config.yaml").write_text(runs[-1][2].replace(optim={"lr": 1e-3}).to_yaml())
    report = (out / "ladder-toy" / "scaling.md").read_bytes()
    assert cli(args) == 2
    err = capsys.readouterr().err
    assert f"{other} holds a finished run with a different config (optim.lr: 0.001 ->" in err
    assert "--fresh (leaving out --no-train)" in err
    assert (out / "ladder-toy" / "scaling.md").read_bytes() == report
    assert cli([*args, "--fresh"]) == 2 and "leave out --no-train" in capsys.readouterr().err
    # the same store on another corpus (an override): every run named as trained on another source
    assert cli([*args, "data.source=elsewhere/"]) == 2
    assert "data.source: 'python-stdlib' -> 'elsewhere/'" in capsys.readouterr().err


def test_fresh_removes_only_the_runs_whose_config_differs(tmp_path):
    archs = ["pre-ln", "resformer"]
    root = tmp_path / "ladder-toy"
    runs = fake_store(root, LADDERS["toy"], archs)
    other = Path(runs[0][2].out_dir)
    (other / "config.yaml").write_text(runs[0][2].replace(seq_len=16).to_yaml())
    with pytest.raises(ConfigError, match=r"seq_len: 16 -> 32\); use another --out, or --fresh"):
        orchestrate.check_store(archs, LADDERS["toy"], root)
    removed = orchestrate.check_store(archs, LADDERS["toy"], root, fresh=True, log=lambda _: None)
    assert removed == [other] and not other.exists()
    assert all(Path(cfg.out_dir).is_dir() for *_, cfg in runs[1:])


# -- flags refused as compare refuses them, and output paths checked before anything trains --------------
@pytest.mark.parametrize("extra, message", [
    (["--archs", ","], "no architecture given"),
    (["--archs", ""], "no architecture given"),
    (["--archs", " "], "no architecture given"),
    (["--export", "x.tgz"], "--export writes the tarball of a piece: give --minutes M too"),
    (["--export", ""], "--export '' is not allowed: give the path of a .tgz"),
])
def test_flags_that_would_be_ignored_are_refused(tmp_path, capsys, monkeypatch, extra, message):
    monkeypatch.chdir(tmp_path)
    code = cli(["scaling", "--ladder", "toy", "--out", str(tmp_path / "s"), "--no-train", *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not (tmp_path / "x.tgz").exists()


@pytest.fixture
def no_training(monkeypatch):
    """Training stubbed: a test fails if the command got as far as training."""
    def refuse(*args, **kwargs):
        raise AssertionError("trained before checking its output paths")

    monkeypatch.setattr(orchestrate, "train_piece", refuse)
    monkeypatch.setattr(orchestrate, "train_ladder", refuse)


def test_export_never_replaces_a_file_blocklab_did_not_write(tmp_path, capsys, no_training):
    thesis = tmp_path / "thesis.txt"
    thesis.write_text("three years of work")
    args = ["scaling", "--ladder", "toy", "--out", str(tmp_path / "s"), "--minutes", "1", "--export"]
    assert cli([*args, str(thesis)]) == 2
    assert f"--export {thesis} holds a file blocklab did not write" in capsys.readouterr().err
    assert thesis.read_text() == "three years of work"
    folder = tmp_path / "exports"
    folder.mkdir()
    assert cli([*args, str(folder)]) == 2
    assert f"--export {folder} is a folder" in capsys.readouterr().err


def test_export_rewrites_its_own_tarball_and_refuses_another_stores(tmp_path):
    from blocklab.reproduce.budgeted_launch import check_export, export_store

    root, other = tmp_path / "s" / "ladder-toy", tmp_path / "t" / "ladder-toy"
    root.mkdir(parents=True)
    other.mkdir(parents=True)
    ours = export_store(root, tmp_path / "ours.tgz")
    check_export(ours, root)  # ours: rewritten without a word
    with pytest.raises(ConfigError, match="holds the export of another store"):
        check_export(ours, other)
    check_export(ours, other, overwrite=True)


def test_report_and_out_paths_are_checked_before_anything_trains(tmp_path, capsys, no_training):
    file = tmp_path / "a-file"
    file.write_text("mine")
    base = ["scaling", "--ladder", "toy", "--minutes", "1"]
    assert cli([*base, "--out", str(tmp_path / "s"), "--report", str(file)]) == 2
    assert f"--report {file}: {file} is a file, not a folder" in capsys.readouterr().err
    assert cli([*base, "--out", str(file)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert file.read_text() == "mine"


@pytest.mark.slow  # about 20 s of training: CI's slow tier runs it
def test_the_toy_ladder_trains_on_a_users_folder_and_the_report_repeats_the_override(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for k in range(12):
        (corpus / f"notes{k}.txt").write_text("".join(f"line {j} of note {k}: the cat sat on mat {j % 9}.\n"
                                                      for j in range(150)))
    out = tmp_path / "runs"
    args = ["scaling", "--ladder", "toy", "--seeds", "1", "--archs", "pre-ln,resformer",
            f"data.source={corpus}", "data.tokenizer=byte", "data.val_fraction=0.25",
            f"data.cache_dir={tmp_path / 'cache'}", "--out", str(out)]
    assert cli(args) == 0
    runs = list((out / "ladder-toy").glob("*/runs/*/config.yaml"))
    assert len(runs) == 6
    assert all(yaml.safe_load(r.read_text())["data"]["source"] == str(corpus) for r in runs)
    report = (out / "ladder-toy" / "scaling.md").read_text()
    assert f"data.source={corpus}" in report
    capsys.readouterr()
    assert cli([*args, "--no-train"]) == 0


def test_training_refuses_a_differing_run_before_anything_trains_and_names_fresh(tmp_path, capsys,
                                                                                 no_training):
    archs = ["pre-ln", "resformer"]
    out = tmp_path / "s"
    runs = fake_store(out / "ladder-toy", LADDERS["toy"], archs)
    other = Path(runs[3][2].out_dir)
    (other / "config.yaml").write_text(runs[3][2].replace(eval_batches=4).to_yaml())
    assert cli(["scaling", "--ladder", "toy", "--archs", ",".join(archs), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{other} holds a finished run with a different config (eval_batches: 4 -> 16)" in err
    assert "use another --out, or --fresh to retrain it" in err
