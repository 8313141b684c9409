"""Ladder runs faked in this process (`launch.store.train_claimed`), for the scaling tests that need a
known loss per run: each run's config.yaml, validation curve and summary.json written at once from a
function of its config, so a ladder trains, reuses and reports in a fraction of a second."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from blocklab.launch import store

# a run's config -> (its parameters, the validation loss at each evaluation step, seconds of training a step)
RunOf = Callable[..., tuple[int, Callable[[int], float], float]]


def fake_ladder_runs(monkeypatch, run_of: RunOf) -> list[str]:
    """Patch training so that a run of `cfg` evaluates every eval_every steps and at its last, at
    `loss(step)` of `run_of(cfg)`, and records its parameters, final loss, training time and FLOPs (the
    piece estimator reads them); returns the out_dirs trained, in order."""
    done: list[str] = []

    def fake(cfg, resume, progress=None):
        n, loss, seconds_a_step = run_of(cfg)
        run = Path(cfg.out_dir)
        run.mkdir(parents=True, exist_ok=True)
        (run / "config.yaml").write_text(cfg.to_yaml())
        per_step = cfg.batch_size * cfg.seq_len
        steps = list(range(cfg.eval_every, cfg.max_steps, cfg.eval_every)) + [cfg.max_steps]
        rows = [{"kind": "val", "step": s, "tokens": s * per_step, "val_loss": loss(s)} for s in steps]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        summary = {"params": {"total": n, "non_embedding": n // 2}, "val_loss": rows[-1]["val_loss"],
                   "step": cfg.max_steps, "train_time": seconds_a_step * cfg.max_steps,
                   "flops": 6 * n * cfg.max_steps * per_step}
        (run / "summary.json").write_text(json.dumps(summary))
        done.append(cfg.out_dir)
        return summary

    monkeypatch.setattr(store, "train_claimed", fake)
    return done


def ladder_command(path: Path, out: Path, *extra: str) -> list[str]:
    return ["scaling", "--ladder", str(path), "--out", str(out), "--jobs", "1", *extra]
