"""The training loop: `blocklab.training(...)` and `blocklab train`.

One run = one directory: ``config.yaml`` (the TrainConfig), ``model_config.json`` (the resolved
ModelConfig), ``tokenizer.json``, ``data_manifest.json``, ``metrics.jsonl``, ``checkpoints/`` and,
when it finishes, ``summary.json``. Batches are a pure function of (seed, step), so a resumed run
continues on exactly the batches (and, on CPU, exactly the loss curve) of an uninterrupted one.
A new run never writes into a directory that holds one (``overwrite=true`` replaces it); a resume
takes the run's own config.yaml and may change only `config.RESUMABLE`.

The `Trainer` is the recipe's last part: training/build.py's steps build the run's parts (its folder
and config, processes and device, data, model, optimizers and budget, checkpoints, metrics and
trackers), and the Trainer runs the loop with them: steps, validation, logging, checkpoints, summary.
"""

from __future__ import annotations

import json
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from tqdm.std import tqdm as std_tqdm

from blocklab.data import Batches, bits_per_byte
from blocklab.runtime import LanguageModel
from blocklab.training import build, distributed, memory, rundir
from blocklab.training import checkpoint as ckpt
from blocklab.training.budget import Budget
from blocklab.training.checkpointer import Checkpointer
from blocklab.training.config import TrainConfig, resolve_config
from blocklab.training.metrics import MetricsLogger, learned_scalars, read_metrics
from blocklab.training.optim import build_optimizers
from blocklab.training.schedules import lr_factor
from blocklab.training.step import lm_loss, train_step
from blocklab.util import locks
from blocklab.util.diskfull import said_plainly
from blocklab.util.errors import TrainingError
from blocklab.util.filemodes import atomic_write_text
from blocklab.util.progress import progress_bar


@dataclass
class RunResult:
    run_dir: Path
    model: LanguageModel
    summary: dict[str, Any]


@torch.no_grad()
def evaluate(model: nn.Module, batches: Batches, batch_size: int, max_batches: int | None,
             device: torch.device, autocast, token_bytes: Tensor | None = None) -> dict[str, float]:
    """Validation over the first `max_batches` batches of the held-out split: the token-weighted mean
    loss, the number of target tokens scored and the UTF-8 bytes they stand for (`token_bytes[id]`)."""
    was_training = model.training
    model.eval()
    total = torch.zeros(3, dtype=torch.float64, device=device)
    for batch in batches.validation(batch_size, max_batches):
        batch = {k: v.to(device) for k, v in batch.items()}
        with autocast:
            loss = lm_loss(model, batch)
        targets = batch["labels"][batch["labels"] != -100]
        total[0] += loss.double() * targets.numel()
        total[1] += targets.numel()
        if token_bytes is not None:
            total[2] += token_bytes[targets].sum()
    model.train(was_training)
    loss_sum, tokens, n_bytes = total.tolist()
    return {"loss": loss_sum / max(tokens, 1), "tokens": int(tokens), "bytes": int(n_bytes)}


def _set_lr(optimizers, factor: float) -> None:
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["base_lr"] * factor


def train(config: TrainConfig | dict | str | Path | None = None, resume: bool = False,
          **overrides: Any) -> RunResult:
    """Train one model. `config` is a TrainConfig, a dict, a YAML path or None (defaults);
    keyword overrides use TrainConfig field names, with dotted names for sections given as a dict,
    e.g. ``train(max_steps=100, **{"optim.lr": 3e-4})``. With ``resume=True`` the run's saved
    config.yaml is the base, so ``train(out_dir="runs/a", resume=True, max_steps=2000)`` extends it.

    The run's folder is held for the whole run (`blocklab.util.locks`): a second process training into it
    is refused with this one's pid and command (under torchrun, the launch's first process holds it)."""
    cfg = resolve_config(config, overrides, resume)
    with locks.hold(cfg.out_dir, make=True) if distributed.launch_rank() == 0 else nullcontext():
        return Trainer(cfg, resume=resume).run()


class RunProgress(Protocol):
    """What a Trainer reports to a progress line over several runs (`blocklab.launch.progress`)."""

    def skip(self, done: float) -> None:
        """The run resumes with `done` of its budget spent before."""

    def advance(self, fraction: float, status: str = "") -> None:
        """The run has spent `fraction` of its budget; `status` says where it is ("step 40/150, ...")."""


class Trainer:
    """One run: its parts built by the steps of training/build.py, then the loop over them (`run`)."""

    def __init__(self, cfg: TrainConfig, resume: bool = False, overall: RunProgress | None = None):
        """`overall`: this run's part of a progress line over several runs (`blocklab.launch`), which
        the run advances instead of showing a bar of its own."""
        self.overall = overall
        self.threads_before = torch.get_num_threads() if cfg.threads is not None else None
        if cfg.threads is not None:  # until the run ends: then the count before it comes back
            torch.set_num_threads(cfg.threads)
        try:
            self._build(cfg, resume)
        except BaseException:
            self._restore_threads()
            raise

    def _restore_threads(self) -> None:
        if self.threads_before is not None:
            torch.set_num_threads(self.threads_before)

    def _build(self, cfg: TrainConfig, resume: bool) -> None:
        """The run's parts, one step each, in the order of training/build.py's docstring."""
        start = build.start_run(cfg, resume)
        self.cfg, self.resume, self.run_dir = start.cfg, resume, start.run_dir
        where = build.place(self.cfg, start.source)
        self.env, self.device, self.autocast = where.env, where.device, where.autocast
        self.data = build.build_data(self.cfg, where, self.run_dir)
        built = build.build_model(self.cfg, start.source, self.data.tokenizer, where)
        self.model, self.wrapped, self.model_cfg = built.model, built.wrapped, built.config
        self.counts, self.flops_per_token = built.counts, built.flops_per_token
        self.tokens_per_step = self.cfg.batch_size * self.cfg.seq_len
        # after FSDP swaps in sharded params; the tokens per step scale nanochat's learning rates
        self.optimizers = build_optimizers(self.model, self.cfg.optim, self.tokens_per_step)
        self.budget = Budget(self.cfg, self.tokens_per_step, self.flops_per_token)
        self.checkpoints = Checkpointer(self.cfg, self.run_dir, start.checkpoint, self.wrapped,
                                        self.optimizers, self.env, self.model_cfg, self.data.tokenizer.hash)
        self.state = ckpt.TrainState()

    def _prepare_run_dir(self) -> None:
        self.checkpoints.check_resume()  # every rank: before anything is written
        if self.env.is_main:
            rundir.write_run_files(self.run_dir, self.cfg, self.model_cfg, self.data.prepared, self.resume,
                                   self.checkpoints.resume_from)

    def _save(self, logger: MetricsLogger | None) -> None:
        self.checkpoints.save(self.state, logger.rows if logger is not None else None)

    # -- the loop ----------------------------------------------------------------------------------
    def _micro_batches(self, step: int):
        accum, env = self.cfg.grad_accum, self.env
        for micro in range(accum):  # the global batch, split over accumulation steps, then ranks
            batch = self.data.train.get(step, rank=micro * env.world_size + env.rank,
                                        world_size=accum * env.world_size)
            yield {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def _stop(self, what: str) -> TrainingError:
        last = ckpt.latest_checkpoint(self.run_dir)
        return TrainingError(
            f"{what} at step {self.state.step + 1}; stopping before the update, without saving this state. "
            f"The last good checkpoint is {str(last) if last else 'none (none was saved yet)'}. "
            "Try a lower optim.lr, gradient clipping (optim.grad_clip) or float32 precision.")

    def _step(self) -> tuple[float, float]:
        """One optimiser step on this step's global batch (`step.train_step`); returns (loss, grad norm)."""
        return train_step(self.wrapped, self._micro_batches(self.state.step), self.optimizers,
                          accum=self.cfg.grad_accum, autocast=self.autocast,
                          grad_clip=self.cfg.optim.grad_clip, loss_fn=lm_loss,
                          reduce=lambda t: distributed.mean_across(t, self.env), stop=self._stop)

    def _validate(self, logger: MetricsLogger | None) -> dict[str, float]:
        # every rank scores the same batches of the global batch size: the result does not depend on
        # the number of processes (and FSDP needs every rank in every forward anyway)
        res = evaluate(self.wrapped, self.data.val, self.cfg.batch_size, self.cfg.eval_batches,
                       self.device, self.autocast, self.data.token_bytes)
        bpb = None
        if self.model_cfg.causal and res["bytes"]:  # bytes of the targets scored, not the split's average
            bpb = bits_per_byte(res["loss"], res["bytes"] / res["tokens"])
        row = {"kind": "val", "step": self.state.step, "tokens": self.state.tokens,
               "wall_time": self.state.train_time, "val_loss": res["loss"], "val_bpb": bpb,
               "val_tokens": res["tokens"], "val_bytes": res["bytes"]}
        if logger is not None:
            logger.log(row)
        return row

    def _unigram_loss(self) -> float | None:
        """The plateau: the loss on the scored validation targets of a model that knows only the
        training split's token frequencies (`plateau.unigram_loss`); None for masked LM."""
        from blocklab.statistics.plateau import run_plateau

        if not self.model_cfg.causal:
            return None
        return run_plateau(self.data.prepared, self.data.val, self.cfg.batch_size, self.cfg.eval_batches)

    def _logged_val(self, step: int) -> dict[str, Any] | None:
        """The validation row already logged at `step` (a finished run resumed), if any."""
        path = self.run_dir / "metrics.jsonl"
        rows = read_metrics(path, "val", whole=False) if path.is_file() else []
        return next((r for r in reversed(rows) if r["step"] == step), None)

    def run(self) -> RunResult:
        cfg, env = self.cfg, self.env
        logger: MetricsLogger | None = None
        try:
            with said_plainly("the run's files in", self.run_dir, None, self.checkpoints.resume_hint):
                self._prepare_run_dir()
            resumed = self.checkpoints.resume_from is not None
            if resumed:
                self.state = self.checkpoints.restore()
                if not self.budget.done(self.state):  # training goes on from here
                    self.state.resumed_at.append(self.state.step)
            logger = build.open_metrics(cfg, self.run_dir, self.state.step if resumed else None, env)
            if not resumed:
                scalars = learned_scalars(self.model)  # a collective under FSDP: every rank gathers
                if logger is not None:
                    logger.log({"kind": "train", "step": 0, "tokens": 0, "scalars": scalars})
            if not resumed and (cfg.eval_every or cfg.init_from):  # step 0: every curve starts there
                self._validate(logger)
            val = self._loop(logger, resumed)
            summary = self._summary(val)
            if env.is_main:
                # written last and atomically: a summary.json on disk is what marks a finished run
                text, path = json.dumps(summary, indent=2), self.run_dir / "summary.json"
                with said_plainly("the summary", path, len(text), self.checkpoints.resume_hint):
                    atomic_write_text(path, text)
                logger.close()
            return RunResult(self.run_dir, distributed.unwrap(self.wrapped), summary)
        except BaseException:
            if logger is not None:  # a tracker's run ends as failed; a resume goes on with it
                logger.close(failed=True)
            raise
        finally:
            distributed.teardown(env)
            self._restore_threads()

    def _progress_bar(self) -> std_tqdm:
        """This run's bar: tqdm's on a terminal, a line every tenth in a log file (`progress_mode`); off
        with progress=false, on ranks other than 0 and under an `overall` line."""
        show = self.cfg.progress and self.env.is_main and self.overall is None
        if self.budget.total_steps is None:  # a wall-clock budget: seconds of training, so tqdm has an ETA
            return progress_bar(
                self.budget.max_time, show, initial=self.state.train_time, unit="s", dynamic_ncols=True,
                bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} s [{elapsed}<{remaining}{postfix}]",
                line_format="{percentage:3.0f}% {n:.1f}/{total:.1f} s [{elapsed}<{remaining}{postfix}]")
        return progress_bar(
            self.budget.total_steps, show, initial=self.state.step, unit="step", dynamic_ncols=True,
            line_format="{percentage:3.0f}% {n_fmt}/{total_fmt} steps [{elapsed}<{remaining}, {rate_fmt}"
                        "{postfix}]")

    def _status(self, loss: float) -> str:
        """Where the run is, for an `overall` progress line: "step 120/400, loss 4.123"."""
        state, budget = self.state, self.budget
        if budget.total_steps is None:
            return f"step {state.step}, {state.train_time:.0f}/{budget.max_time:g} s, loss {loss:.3f}"
        return f"step {state.step}/{budget.total_steps}, loss {loss:.3f}"

    def _loop(self, logger: MetricsLogger | None, resumed: bool) -> dict[str, float]:
        cfg, state, budget = self.cfg, self.state, self.budget
        bar = self._progress_bar()
        timed = budget.total_steps is None
        first_step = state.step
        val: dict[str, float] | None = None
        window_tokens, window_start = 0, time.perf_counter()
        if self.overall is not None and budget.progress(state) > 0:  # resumed: that part was done before
            self.overall.skip(budget.progress(state))
        self.wrapped.train()
        done = self._done()
        while not done:
            factor = lr_factor(cfg.optim, budget.progress(state), state.step, budget.total_steps)
            _set_lr(self.optimizers, factor)
            start = time.perf_counter()
            loss, grad_norm = self._step()
            seconds = time.perf_counter() - start
            state.train_time += seconds
            state.step += 1
            state.tokens += self.tokens_per_step
            state.flops += self.flops_per_token * self.tokens_per_step
            if cfg.compile and state.step == first_step + 1:  # compiling: in the budget, not in tokens/s
                state.warmup_time += seconds
                state.warmup_tokens += self.tokens_per_step
                window_start = time.perf_counter()
            else:
                window_tokens += self.tokens_per_step
            bar.update(min(state.train_time, budget.max_time) - bar.n if timed else 1)
            bar.set_postfix({"step": state.step, "loss": f"{loss:.3f}"} if timed else {"loss": f"{loss:.3f}"})
            if self.overall is not None:
                self.overall.advance(budget.progress(state), self._status(loss))
            done = self._done()  # a collective: every rank calls it exactly once per step
            # gathering FSDP-sharded gains (DTensor.full_tensor) is a collective: every rank takes part
            scalars = learned_scalars(self.model) if state.step % cfg.log_every == 0 or done else None
            if logger is not None and scalars is not None:
                now = time.perf_counter()
                row = {"kind": "train", "step": state.step, "tokens": state.tokens, "loss": loss,
                       "lr": cfg.optim.lr * factor, "grad_norm": grad_norm,
                       "tokens_per_s": window_tokens / max(now - window_start, 1e-9),
                       "wall_time": state.train_time, "scalars": scalars}
                if not window_tokens:  # only the compile warm-up step in this window
                    del row["tokens_per_s"]
                logger.log(row)
                window_tokens, window_start = 0, now
            if cfg.eval_every and state.step % cfg.eval_every == 0 and not done:
                val = self._validate(logger)
                window_start = time.perf_counter()  # keep evaluation out of tokens/s
            if self.checkpoints.due(state.step) and not done:
                self._save(logger)
        bar.close()
        trained = state.step > first_step
        if not trained and resumed:  # a finished run resumed: its final row and checkpoint exist
            val = self._logged_val(state.step)
        if val is None or val["step"] != state.step:
            val = self._validate(logger)
        if trained or not resumed:
            self._save(logger)
        return val

    def _done(self) -> bool:
        done = torch.tensor(float(self.budget.done(self.state)))
        return bool(distributed.mean_across(done, self.env).item() > 0)  # rank clocks may disagree

    def _summary(self, val: dict[str, float]) -> dict[str, Any]:
        s = self.state
        tokens, seconds = s.tokens - s.warmup_tokens, s.train_time - s.warmup_time  # without compiling
        return {
            "arch": self.cfg.arch, "size": self.cfg.size, "seed": self.cfg.seed,
            "params": {"total": self.counts.total, "embedding": self.counts.embedding,
                       "value_tables": self.counts.value_tables, "non_embedding": self.counts.non_embedding},
            "flops_per_token": self.flops_per_token, **asdict(s),
            "tokens_per_s": tokens / seconds if tokens and seconds > 0 else None,
            "peak_memory_mib": memory.peak_memory_mib(self.device), "device": str(self.device),
            "world_size": self.env.world_size,
            "val_loss": val["val_loss"], "val_bpb": val["val_bpb"],
            "unigram_loss": self._unigram_loss(),
        }
