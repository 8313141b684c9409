"""The run directory's rules: a new run never writes over a saved one, and a resume keeps its config;
and the files a run writes there before its first step (`write_run_files`)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from blocklab.data import PreparedData
from blocklab.model.config import ModelConfig
from blocklab.training.checkpoint import read_state, remove_partial_writes
from blocklab.training.config import TrainConfig, check_resumable, check_trained_config, read_yaml
from blocklab.training.metrics import resume_rows, row_counts
from blocklab.util.errors import ConfigError
from blocklab.util.progress import say


def check_new_run_dir(run_dir: Path, overwrite: bool) -> None:
    """A new run must not write over a saved one (its metrics, configs and checkpoints), nor over files
    of the names a run writes (RUN_FILES) in a folder that is not a run: a user's own config.yaml,
    tokenizer.json or summary.json. `overwrite` replaces either."""
    if overwrite:
        return
    if (run_dir / "checkpoints").exists() or (run_dir / "metrics.jsonl").exists():
        raise ConfigError(f"out_dir {str(run_dir)!r} already holds a run (checkpoints/ or metrics.jsonl). "
                          "Pass --resume (resume=True) to continue it, choose another out_dir, or set "
                          "overwrite=true to delete it and start again.")
    taken = [name for name in RUN_FILES if (run_dir / name).exists()]
    if taken:
        raise ConfigError(f"out_dir {str(run_dir)!r} is not a blocklab run (no metrics.jsonl nor "
                          f"checkpoints/) but holds {', '.join(taken)}, which a new run would replace. "
                          "Choose another out_dir, or set overwrite=true to replace them (other files there "
                          "are kept).")


# what a run writes into its directory (and blocklab diagnose beside it); overwrite=true removes these
RUN_FILES = ("config.yaml", "model_config.json", "tokenizer.json", "data_manifest.json", "metrics.jsonl",
             "summary.json", "checkpoints", "tensorboard", "diagnostics")


def make_run_dir(run_dir: Path) -> None:
    """Make the run's folder where it really is: through a symlink to a folder not made yet (the lock
    already sits beside that real path, `locks.lock_path`), as compare and exports write through one,
    rather than "File exists" from mkdir on the link itself."""
    Path(os.path.realpath(run_dir)).mkdir(parents=True, exist_ok=True)


def clear_run(run_dir: Path) -> None:
    # only the run's own entries: an out_dir such as "." may hold other files
    for name in RUN_FILES:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def check_resume_config(run_dir: Path, cfg: TrainConfig, checkpoint: Path) -> None:
    """The config a resume goes on with against the one the checkpoint was trained with (its
    state.json's train_config), else, for a checkpoint saved before that was recorded, against
    config.yaml (which a hand edit would then pass)."""
    _, meta = read_state(checkpoint)
    if isinstance(meta.get("train_config"), dict):
        check_trained_config(checkpoint, meta["train_config"], cfg)
    if not (run_dir / "config.yaml").is_file():
        return  # the checkpoint's model config and tokenizer are still checked
    check_resumable(cfg, run_dir)


def check_resume_metrics(run_dir: Path, checkpoint: Path) -> None:
    """Every line of the run's metrics.jsonl holds what a resume reads of it (`metrics.resume_rows`), and
    the file holds every row the checkpoint recorded (its state.json's `metrics_rows`, by kind; a
    checkpoint saved before that record passes): checked before the resume writes anything, so that a
    refused resume leaves the run's files as they were. Lost rows cannot be made again (a validation
    row scores the weights of its step, which are gone), and a resume would keep the hole for good."""
    path = run_dir / "metrics.jsonl"
    rows = resume_rows(path)[0] if path.is_file() else []
    state, meta = read_state(checkpoint)
    recorded = meta.get("metrics_rows")
    if not isinstance(recorded, dict):
        return
    found = row_counts(rows, state.step)
    lost = {kind: n - found[kind] for kind, n in recorded.items() if kind in found and n > found[kind]}
    if not lost:
        return
    names = {"train": "training", "val": "validation"}
    missing = " and ".join(f"{n} of its {recorded[k]} {names[k]} rows" for k, n in lost.items())
    steps = [r["step"] for r in rows]
    ends = f"it ends at step {max(steps)}" if steps else "it holds no row" if path.is_file() else "it is gone"
    raise ConfigError(f"{path} lacks {missing} up to step {state.step}, which {checkpoint / 'state.json'} "
                      f"recorded ({ends}): lines were lost after the run wrote them, and a resume would "
                      "leave the gap in its curve for good. Restore metrics.jsonl from a copy, or train the "
                      "run again from the start (overwrite=true).")


def write_run_files(run_dir: Path, cfg: TrainConfig, model_cfg: ModelConfig, data: PreparedData,
                    resume: bool, checkpoint: Path | None) -> None:
    """The run's folder before its first step (rank 0): config.yaml (on resume: the new budget and
    cadence) and, for a run that starts at step 0, model_config.json, data_manifest.json and
    tokenizer.json. With overwrite=true a new run first removes the run there (`clear_run`); leftovers
    of a process killed while saving a checkpoint go (`checkpoint.remove_partial_writes`)."""
    if resume:
        announce_resume(run_dir, checkpoint, cfg)
    if checkpoint is None and cfg.overwrite:
        clear_run(run_dir)
    remove_partial_writes(run_dir)  # left by a process killed while saving
    make_run_dir(run_dir)
    (run_dir / "config.yaml").write_text(cfg.to_yaml())
    if checkpoint is None:
        (run_dir / "model_config.json").write_text(model_cfg.to_json())
        (run_dir / "data_manifest.json").write_text(
            json.dumps({**data.manifest, "tokenizer_hash": data.tokenizer.hash}, indent=2))
        data.tokenizer.save(run_dir)


def announce_resume(run_dir: Path, checkpoint: Path | None, cfg: TrainConfig) -> None:
    """Say what a resume does when it is not the obvious thing: no checkpoint yet, or a new budget."""
    if checkpoint is None:
        say(f"--resume: {run_dir} holds no checkpoint yet (one is written every ckpt_every={cfg.ckpt_every} "
            f"/ eval_every={cfg.eval_every} steps); training starts from step 0")
        return
    saved_path = run_dir / "config.yaml"
    if not saved_path.is_file():
        return
    saved = TrainConfig.from_dict(read_yaml(saved_path)).budgets()
    if saved != cfg.budgets():
        say(f"--resume: the budget changes from {_plain_budget(saved)} to {_plain_budget(cfg.budgets())}; "
            f"the learning-rate schedule is recomputed for the new budget from {checkpoint.name} on, so the "
            "curve follows neither the old run's schedule nor a fresh run's")


def _plain_budget(budgets: dict[str, int | float]) -> str:
    return " and ".join(f"{k}={v:g}" for k, v in budgets.items()) or "none"
