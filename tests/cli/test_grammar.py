"""One grammar for the experiment commands: `blocklab train | prepare | compare | reproduce [CONFIG.yaml]
[key=value ...] [--flags]`. compare's former TrainConfig options are refused with one line naming the
override; compare's own defaults are a named config file (recipes/compare.yaml), and the main job
(`blocklab compare` alone) plans exactly the runs it planned before; reproduce's overrides reach every
run of every claim and never what a claim varies itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import blocklab.compare
from blocklab.cli import main
from blocklab.training import TrainConfig
from blocklab.training.config import flat
from blocklab.util.errors import ConfigError

# -- compare -------------------------------------------------------------------------------------


def _planned(monkeypatch, capsys, argv: list[str]) -> tuple[dict[str, dict], dict]:
    """The runs `blocklab <argv>` (a compare) would train, none trained: {run folder: the fields of its
    config that differ from TrainConfig's defaults, arch and seed always}, and compare's other
    arguments."""
    seen = {}

    def fake_compare(entries, out, seeds=1, base=None, **kwargs):
        seen.update(entries=entries, out=out, seeds=seeds, base=base, kwargs=kwargs)
        raise ConfigError("stop here")

    monkeypatch.setattr(blocklab.compare, "compare", fake_compare)
    assert main(argv) == 2 and "stop here" in capsys.readouterr().err
    defaults = flat(TrainConfig(max_steps=1).to_dict())
    planned = {}
    configs = blocklab.compare.run_configs(seen["entries"], seen["seeds"], Path(seen["out"]), seen["base"])
    for _, cfg in configs:
        fields = flat(cfg.to_dict())
        planned[Path(cfg.out_dir).name] = {k: v for k, v in fields.items()
                                           if k in ("arch", "seed") or defaults.get(k, object()) != v}
    return planned, {"seeds": seen["seeds"], "out": str(seen["out"]), **seen["kwargs"]}


# The main job's runs as `blocklab compare` planned them before its options became overrides (read
# from that code, 2026-11-28): 2 seeds of six architectures, 150 steps, validation and a checkpoint
# every 50, the recipe's Muon at size tiny; every other field TrainConfig's default (batch 16 x 128).
MAIN_JOB = {f"{arch}-seed{seed}": {"arch": arch, "seed": seed, "eval_every": 50, "ckpt_every": 50,
                                   "max_steps": 150, "optim.lr": 0.03, "optim.muon_lr": 0.06,
                                   "optim.name": "muon", "out_dir": f"runs/compare/runs/{arch}-seed{seed}"}
            for arch in ("pre-ln", "sas", "sas-p", "resformer", "svformer", "bov") for seed in (0, 1)}


def test_the_main_job_plans_the_runs_it_planned_before(monkeypatch, capsys):
    planned, kwargs = _planned(monkeypatch, capsys, ["compare"])
    assert planned == MAIN_JOB
    assert (kwargs["seeds"], kwargs["out"], kwargs["timing_rounds"], kwargs["lr_sweep"]) == (
        2, "runs/compare", 5, None)


def test_compare_shows_its_default_config(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "blocklab/recipes/compare.yaml: batch_size=16 seq_len=128 eval_every=50" in text
    for gone in ("--batch-size", "--seq-len", "--eval-every", "--lr ", "--size"):
        assert gone not in text


@pytest.mark.parametrize("argv, line", [
    (["--eval-every", "50"], "--eval-every is now an override, as in blocklab train: write eval_every=50"),
    (["--eval-every=20"], "--eval-every is now an override, as in blocklab train: write eval_every=20"),
    (["--batch-size", "8"], "--batch-size is now an override, as in blocklab train: write batch_size=8"),
    (["--seq-len", "64"], "--seq-len is now an override, as in blocklab train: write seq_len=64"),
    (["--lr", "5e-4"], "--lr is now an override, as in blocklab train: write optim.lr=5e-4"),
    (["--size", "small"], "--size is now an override, as in blocklab train: write size=small"),
    (["arch=sas"], "the override arch=... is not allowed: compare sets arch of every run itself; use --archs "
                   "(or --grid)."),
    (["seed=3"], "the override seed=... is not allowed: compare sets seed of every run itself; use --seeds."),
    (["out_dir=x"], "the override out_dir=... is not allowed: compare sets out_dir of every run itself; use "
                    "--out."),
])
def test_compare_refuses_its_former_options_naming_the_override(argv, line, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(blocklab.compare, "compare", lambda *a, **k: pytest.fail("compare ran"))
    assert main(["compare", "--archs", "pre-ln", "--steps", "3", *argv, "--out", "c"]) == 2
    assert capsys.readouterr().err == f"blocklab: error: {line}\n"
    assert not any(tmp_path.iterdir())  # nothing written


def test_a_yaml_config_replaces_compares_recipe_and_overrides_come_last(tmp_path, monkeypatch, capsys):
    """CONFIG.yaml is where every run starts instead of recipes/compare.yaml (so eval_every is
    TrainConfig's 100 unless the file sets it); the overrides come after it; the config's arch and
    out_dir are compare's (--archs, --out)."""
    config = tmp_path / "mine.yaml"
    config.write_text("size: small\nseq_len: 64\narch: sas\nout_dir: elsewhere\n"
                      "data:\n  tokenizer: byte\noptim:\n  lr: 0.002\n")
    planned, _ = _planned(monkeypatch, capsys, ["compare", str(config), "--archs", "pre-ln,sas-p", "--seeds",
                                                "1", "seq_len=32", "--out", "c", "optim.warmup_fraction=0.1"])
    assert sorted(planned) == ["pre-ln-seed0", "sas-p-seed0"]
    for name, fields in planned.items():
        arch = name.removesuffix("-seed0")
        assert fields == {"arch": arch, "seed": 0, "size": "small", "seq_len": 32, "data.tokenizer": "byte",
                          "optim.lr": 0.002, "optim.warmup_fraction": 0.1, "max_steps": 150,
                          "ckpt_every": 100,  # checkpoints follow eval_every: TrainConfig's 100
                          "optim.name": "muon", "optim.muon_lr": 0.06,  # the main job's recipe at small
                          "out_dir": f"c/runs/{name}"}, name
    # a shipped recipe by name, as `blocklab train crammed-bert`: its budget (max_time) is the runs'
    planned, _ = _planned(monkeypatch, capsys, ["compare", "crammed-bert", "--archs", "pre-ln,sas",
                                                "--seeds", "1", "max_time=60"])
    read = {(f["data.objective"], f["max_time"], f.get("max_steps"), f["size"]) for f in planned.values()}
    assert read == {("mlm", 60, None, "crammed-bert")}


def test_a_grids_setup_and_size_give_way_to_overrides(monkeypatch, capsys):
    planned, _ = _planned(monkeypatch, capsys, ["compare", "--grid", "resformer-fig7", "--seeds", "1"])
    assert {(f["optim.warmup_fraction"], f.get("size")) for f in planned.values()} == {(0.12, None)}
    planned, _ = _planned(monkeypatch, capsys, ["compare", "--grid", "resformer-fig7", "--seeds", "1",
                                                "optim.warmup_fraction=0.2", "size=small"])
    assert {(f["optim.warmup_fraction"], f["size"]) for f in planned.values()} == {(0.2, "small")}


# -- reproduce -----------------------------------------------------------------------------------

def _trained(monkeypatch, capsys, argv: list[str]) -> list[TrainConfig]:
    """The configs `blocklab <argv>` (a reproduce) first hands to training (the learning-rate sweep's,
    where the scale has one), none trained."""
    import blocklab.launch

    calls: list[list[TrainConfig]] = []

    def fake_train_runs(configs, launcher=None, log=print):
        calls.append([cfg for _, cfg in configs])
        raise ConfigError("stop here")

    monkeypatch.setattr(blocklab.launch, "train_runs", fake_train_runs)
    assert main(argv) == 2 and "stop here" in capsys.readouterr().err
    return calls[0]


def test_reproduce_overrides_and_a_yaml_config_reach_every_run(tmp_path, monkeypatch, capsys):
    """`reproduce [CONFIG.yaml] key=value`: the config's fields (its arch and out_dir aside: the claims'
    and the store's) and the overrides on every run of the claim, the scale's own fields (batch_size,
    seq_len, size) replaced where the scale holds them."""
    config = tmp_path / "mine.yaml"
    config.write_text(f"arch: sas\nout_dir: elsewhere\ndata:\n  source: {tmp_path}\n  tokenizer: byte\n"
                      "model:\n  n_layers: 2\n")
    runs = _trained(monkeypatch, capsys, ["reproduce", str(config), "--claims", "resformer-beats-pre-ln",
                                            "--scale", "quick", "--out", str(tmp_path / "rep"),
                                            "batch_size=8", "eval_batches=4"])
    assert sorted(Path(c.out_dir).name for c in runs) == [f"{a}-seed{s}" for a in ("pre-ln", "resformer")
                                                         for s in range(3)]
    for cfg in runs:
        assert (cfg.data.source, cfg.data.tokenizer, cfg.model["n_layers"], cfg.batch_size, cfg.eval_batches,
                cfg.max_steps, cfg.seq_len) == (str(tmp_path), "byte", 2, 8, 4, 120, 128)
        assert Path(cfg.out_dir).parent.parent == tmp_path / "rep" / "quick" / "tiny-steps"
    # at a scale with a sweep, the sweep's runs take them too (the sweep trains first)
    sweep = _trained(monkeypatch, capsys, ["reproduce", "--claims", "resformer-beats-pre-ln", "--scale",
                                              "cpu", "--out", str(tmp_path / "rep"), "data.tokenizer=byte",
                                              "seq_len=64"])
    assert len(sweep) == 6 and all("lr-sweep" in c.out_dir for c in sweep)
    assert {(c.data.tokenizer, c.seq_len, c.max_steps) for c in sweep} == {("byte", 64, 200)}


SETS = "is not allowed: reproduce sets {0} of every run itself"
SWEEP = ("the override optim.lr=... is not allowed at a scale with a learning-rate sweep: the sweep chooses "
         "each architecture's rate (see `blocklab reproduce --list`); leave it out, or choose a scale "
         "without a sweep.")


@pytest.mark.parametrize("argv, line", [
    (["arch=sas"], f"the override arch=... {SETS.format('arch')} (the claims' architectures)."),
    (["seed=4"], f"the override seed=... {SETS.format('seed')} (the scale's seeds)."),
    (["max_steps=10"], f"the override max_steps=... {SETS.format('max_steps')} (the scale's budget)."),
    (["model.value_path=bov"], "the override model.value_path=... is not allowed: claim "
                               "resformer-beats-pre-ln varies model.value_path itself (its architectures "
                               "differ there); leave it out, or leave that claim out (--claims)."),
    (["--scale", "cpu", "optim.lr=1e-3"], SWEEP),
])
def test_reproduce_refuses_what_a_claim_sets_itself(argv, line, tmp_path, monkeypatch, capsys):
    import blocklab.launch

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(blocklab.launch, "train_runs", lambda *a, **k: pytest.fail("trained"))
    assert main(["reproduce", "--claims", "resformer-beats-pre-ln", "--scale", "quick", *argv,
                 "--out", "rep"]) == 2
    assert capsys.readouterr().err == f"blocklab: error: {line}\n"
    assert not any(tmp_path.iterdir())  # nothing written
    # the same field where no selected claim varies it is an override like any other
    if argv == ["model.value_path=bov"]:
        runs = _trained(monkeypatch, capsys, ["reproduce", "--claims", "sas-matches-pre-ln", "--scale",
                                              "quick", "model.value_path=bov", "--out", "rep"])
        assert {c.model["value_path"] for c in runs} == {"bov"}


def test_a_store_refuses_runs_of_another_config_training_or_not(tmp_path):
    """The runs reproduce plans, saved as finished: read again with another override, they are refused
    by the --no-train report as by a training call, naming the field; with the same, they are read."""
    from blocklab.reproduce import SCALES, reproduce
    from blocklab.reproduce.orchestrate import check_stored
    from blocklab.reproduce.planning import plan
    from blocklab.reproduce.scales import with_overrides
    from blocklab.statistics.claims import select

    claims, out = select(["resformer-beats-pre-ln"]), tmp_path / "rep"
    scale = with_overrides(SCALES["quick"], {"data": {"tokenizer": "byte"}})
    planned = [cfg for _, cfg in plan(claims, scale, out / "quick")["steps"]]
    for cfg in planned:  # a finished run as the store keeps it: its config.yaml and summary.json
        Path(cfg.out_dir).mkdir(parents=True)
        (Path(cfg.out_dir) / "config.yaml").write_text(cfg.to_yaml())
        (Path(cfg.out_dir) / "summary.json").write_text("{}")
    check_stored(planned)  # the same config: read
    for train in (False, True):
        with pytest.raises(ConfigError, match=r"pre-ln-seed0 holds a finished run with a different config "
                                              r"\(data.tokenizer: 'byte' -> 'bpe'\)"):
            reproduce(claims, "quick", out, train=train, overrides={"data": {"tokenizer": "bpe"}})
    with pytest.raises(ConfigError, match=r"with a different config \(data.tokenizer: 'byte' -> 'bpe'\)"):
        reproduce(claims, "quick", out, train=False)  # TrainConfig's bpe: no override is another config too


# -- prepare -------------------------------------------------------------------------------------

def test_prepare_takes_a_yaml_config_as_train_does(tmp_path, capsys):
    """`blocklab prepare CONFIG.yaml key=value` fills the cache entry the same overrides alone fill."""
    from helpers import write_code_corpus

    (tmp_path / "code").mkdir()
    corpus, cache = write_code_corpus(tmp_path / "code"), tmp_path / "cache"
    config = tmp_path / "data.yaml"
    config.write_text(f"data:\n  source: {corpus}\n  tokenizer: byte\nprogress: false\n")
    assert main(["prepare", str(config), f"data.cache_dir={cache}"]) == 0
    first = capsys.readouterr().out
    assert first.startswith("prepared ")
    assert main(["prepare", f"data.source={corpus}", "data.tokenizer=byte", f"data.cache_dir={cache}"]) == 0
    again = capsys.readouterr().out
    assert again.startswith("already prepared") and again.splitlines()[-1] == first.splitlines()[-1]
