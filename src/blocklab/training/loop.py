"""The training loop: `blocklab.training(...)` and `blocklab train`.

One run = one directory: ``config.yaml`` (the TrainConfig), ``model_config.json`` (the resolved
ModelConfig), ``tokenizer.json``, ``data_manifest.json``, ``metrics.jsonl``, ``checkpoints/`` and,
when it finishes, ``summary.json``. Batches are a pure function of (seed, step), so a resumed run
continues on exactly the batches (and, on CPU, exactly the loss curve) of an uninterrupted one.
A new run never writes into a directory that holds one (``overwrite=true`` replaces it); a resume
takes the run's own config.yaml and may change only `config.RESUMABLE`.
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

from blocklab.accounting import count_parameters, flops_per_token
from blocklab.data import Batches, bits_per_byte, prepare_data
from blocklab.data.sources import skipped_lines
from blocklab.model.config import ModelConfig
from blocklab.runtime import LanguageModel
from blocklab.training import checkpoint as ckpt
from blocklab.training import distributed, init_from, memory, rundir, trackers
from blocklab.training.budget import Budget
from blocklab.training.config import TrainConfig, read_yaml, resolve_config
from blocklab.training.metrics import MetricsLogger, learned_scalars, read_metrics
from blocklab.training.optim import build_optimizers
from blocklab.training.schedules import lr_factor
from blocklab.training.step import autocast_for, compile_for_training, lm_loss, train_step
from blocklab.util import locks
from blocklab.util.diskfull import said_plainly
from blocklab.util.errors import ConfigError, TrainingError
from blocklab.util.filemodes import atomic_write_text
from blocklab.util.progress import progress_bar, say


@dataclass
class RunResult:
    run_dir: Path
    model: LanguageModel
    summary: dict[str, Any]


def resolve_device(name: str, env: distributed.DistEnv) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("TrainConfig.device = 'cuda' is not allowed: no CUDA device is available.")
        return torch.device("cuda", env.local_rank)
    return torch.device(name)


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


def _check_resume(checkpoint: Path, model_cfg: ModelConfig, tokenizer_hash: str) -> None:
    """The checkpoint's own record (state.json) of the model config and tokenizer it was trained with."""
    _, meta = ckpt.read_state(checkpoint)
    saved_tok = meta.get("tokenizer_hash")
    if saved_tok is not None and saved_tok != tokenizer_hash:
        raise TrainingError(f"cannot resume from {str(checkpoint)!r}: the tokenizer differs from the one "
                            f"it was trained with (saved hash {saved_tok[:12]}..., now "
                            f"{tokenizer_hash[:12]}...). "
                            "Restore data.tokenizer (or its tokenizer.json), or start a new out_dir.")
    saved_cfg, now = meta.get("model_config"), json.loads(json.dumps(model_cfg.to_dict()))
    if saved_cfg is not None and saved_cfg != now:
        diff = {k: (saved_cfg.get(k), v) for k, v in now.items() if saved_cfg.get(k) != v}
        raise TrainingError(f"cannot resume from {str(checkpoint)!r}: the model config differs from the "
                            f"checkpoint's (field: (saved, now)) {diff}. Start a new out_dir or restore "
                            "the config.")


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


def _announce_resume(run_dir: Path, checkpoint: Path | None, cfg: TrainConfig) -> None:
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


class RunProgress(Protocol):
    """What a Trainer reports to a progress line over several runs (`blocklab.launch.progress`)."""

    def skip(self, done: float) -> None:
        """The run resumes with `done` of its budget spent before."""

    def advance(self, fraction: float, status: str = "") -> None:
        """The run has spent `fraction` of its budget; `status` says where it is ("step 40/150, ...")."""


class Trainer:
    def __init__(self, cfg: TrainConfig, resume: bool = False, overall: RunProgress | None = None):
        """`overall`: this run's part of a progress line over several runs (`blocklab.launch`), which
        the run advances instead of showing a bar of its own."""
        self.overall = overall
        self.threads_before = torch.get_num_threads() if cfg.threads is not None else None
        if cfg.threads is not None:  # until the run ends: then the count before it comes back
            torch.set_num_threads(cfg.threads)
        try:
            self._setup(cfg, resume)
        except BaseException:
            self._restore_threads()
            raise

    def _restore_threads(self) -> None:
        if self.threads_before is not None:
            torch.set_num_threads(self.threads_before)

    def _setup(self, cfg: TrainConfig, resume: bool) -> None:
        trackers.require_installed(trackers.tracker_names(cfg))  # before the data, which may take long
        # before the data: it names the tokenizer; a resume reads the run's own model config and tokenizer
        init = init_from.load_init(cfg, Path(cfg.out_dir) if resume else None) if cfg.init_from else None
        if init is not None:  # the run records the source's arch and size, the model it trains
            cfg = init_from.with_source_preset(cfg, init[0])
            cfg = init_from.with_source_tokenizer(cfg, init[1])
        self.cfg, self.resume = cfg, resume
        self.run_dir = Path(cfg.out_dir)
        # where a resume starts; resume without a checkpoint starts from step 0
        self.checkpoint = ckpt.latest_checkpoint(self.run_dir) if resume else None
        if self.checkpoint is not None:
            rundir.check_resume_config(self.run_dir, cfg, self.checkpoint)
            if cfg.init_from:  # its source may be gone: the run's own tokenizer.json serves
                cfg = self.cfg = init_from.resumed_tokenizer(cfg, self.run_dir)
            if distributed.launch_rank() == 0:  # the process that appends to metrics.jsonl
                rundir.check_resume_metrics(self.run_dir, self.checkpoint)
                trackers.check_resume(self.run_dir, cfg)
        elif not resume:
            rundir.check_new_run_dir(self.run_dir, cfg.overwrite)
        torch.manual_seed(cfg.seed)
        device_probe = torch.device("cuda" if cfg.device in ("auto", "cuda") and torch.cuda.is_available()
                                    else "cpu")
        self.env = distributed.setup(device_probe)
        self.device = resolve_device(cfg.device, self.env)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.autocast = autocast_for(cfg.precision, self.device)
        rows = self.env.world_size * cfg.grad_accum
        if cfg.batch_size % rows:
            raise ConfigError(f"TrainConfig.batch_size = {cfg.batch_size} is not allowed: it must be "
                              f"divisible by processes x grad_accum = {rows}.")
        if init is None:  # init_from: the model is the source's, in memory already
            # before the data, which may take long: the tokenizer's vocabulary is not known yet, so 1
            # (or model.vocab_size when given) stands in for it, a lower bound; exact once it is known
            memory.check_training_fits(cfg, cfg.model_config(1), self.device, self.env.world_size)

        # data first: it fixes the vocabulary; rank 0 tokenises, the others read its cache
        if self.env.is_main:
            self.data = prepare_data(cfg.data, progress=cfg.progress)
            for line in skipped_lines(self.data.stats, str(self.run_dir / "data_manifest.json")):
                say(line)
        distributed.barrier(self.env)
        if not self.env.is_main:
            self.data = prepare_data(cfg.data)
        self.train_batches = Batches(self.data, "train", cfg.batch_size, cfg.seq_len, seed=cfg.seed)
        self.val_batches = Batches(self.data, "val", cfg.batch_size, cfg.seq_len, seed=cfg.seed)
        self.token_bytes = torch.as_tensor(self.data.tokenizer.token_bytes, device=self.device)

        # summary.json reports this run's peak from here on: the model and its training, not the
        # process's lifetime nor the one-off tokenisation of a cold cache
        memory.reset_peak_memory(self.device)
        torch.manual_seed(cfg.seed)
        if init is not None:  # continued pretraining: the source's (retrofitted) config and weights
            init_from.check_init(cfg, init[0], init[1], self.data.tokenizer)
            self.model = init[0].to(self.device)
            self.model_cfg = self.model.cfg
        else:
            self.model_cfg = cfg.model_config(self.data.tokenizer.vocab_size)
            memory.check_training_fits(cfg, self.model_cfg, self.device, self.env.world_size)
            self.model = LanguageModel(self.model_cfg).to(self.device)
        self.counts = count_parameters(self.model)
        self.flops_per_token = flops_per_token(self.model)
        compile_for_training(self.model, cfg.compile)
        self.wrapped = distributed.wrap(self.model, self.env, cfg.parallel, self.device)
        self.tokens_per_step = cfg.batch_size * cfg.seq_len
        # after FSDP swaps in sharded params; the tokens per step scale nanochat's learning rates
        self.optimizers = build_optimizers(self.model, cfg.optim, self.tokens_per_step)
        self.budget = Budget(cfg, self.tokens_per_step, self.flops_per_token)
        self.state = ckpt.TrainState()

    # -- run directory -------------------------------------------------------------------------------
    def _prepare_run_dir(self) -> None:
        if self.checkpoint is not None:
            _check_resume(self.checkpoint, self.model_cfg, self.data.tokenizer.hash)
        if not self.env.is_main:
            return
        if self.resume:
            _announce_resume(self.run_dir, self.checkpoint, self.cfg)
        if self.checkpoint is None and self.cfg.overwrite:
            rundir.clear_run(self.run_dir)
        ckpt.remove_partial_writes(self.run_dir)  # left by a process killed while saving
        rundir.make_run_dir(self.run_dir)
        (self.run_dir / "config.yaml").write_text(self.cfg.to_yaml())  # on resume: the new budget, cadence
        if self.checkpoint is None:
            (self.run_dir / "model_config.json").write_text(self.model_cfg.to_json())
            (self.run_dir / "data_manifest.json").write_text(
                json.dumps({**self.data.manifest, "tokenizer_hash": self.data.tokenizer.hash}, indent=2))
            self.data.tokenizer.save(self.run_dir)

    def _resume_hint(self) -> str:
        return ckpt.resume_hint(self.run_dir)

    def _restore(self) -> None:
        path = self.checkpoint
        ckpt.verify_checkpoint(path, self.run_dir)  # weights, optimizer, model config, tokenizer
        try:
            weights = ckpt.load_weights_file(path / "model.safetensors")
            ckpt.check_weights(weights, distributed.unwrap(self.wrapped).state_dict(), path)
            blob = ckpt.load_optimizer_state(path)
            distributed.load_full_states(self.wrapped, self.optimizers, weights, blob["optimizers"])
            ckpt.set_rng_state(blob["rng"])
            self.state, _ = ckpt.read_state(path)
        except Exception as err:  # any unreadable or mismatched checkpoint: a message, not a traceback
            raise TrainingError(f"cannot resume from {str(path)!r}: {err}") from err

    def _save(self, logger: MetricsLogger | None) -> None:
        weights, optim_states = distributed.full_states(self.wrapped, self.optimizers)
        if self.env.is_main:
            # the config these steps were taken with: a resume checks config.yaml against it; the rows
            # metrics.jsonl holds: a resume checks that none was lost since
            meta = {"model_config": self.model_cfg.to_dict(), "tokenizer_hash": self.data.tokenizer.hash,
                    "train_config": self.cfg.to_dict(), "metrics_rows": dict(logger.rows) if logger else None}
            ckpt.save_checkpoint(self.run_dir, weights, optim_states, self.state, meta,
                                 self.cfg.keep_checkpoints)
        distributed.barrier(self.env)

    # -- the loop ----------------------------------------------------------------------------------
    def _micro_batches(self, step: int):
        accum, env = self.cfg.grad_accum, self.env
        for micro in range(accum):  # the global batch, split over accumulation steps, then ranks
            batch = self.train_batches.get(step, rank=micro * env.world_size + env.rank,
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
        res = evaluate(self.wrapped, self.val_batches, self.cfg.batch_size, self.cfg.eval_batches,
                       self.device, self.autocast, self.token_bytes)
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
        return run_plateau(self.data, self.val_batches, self.cfg.batch_size, self.cfg.eval_batches)

    def _logged_val(self, step: int) -> dict[str, Any] | None:
        """The validation row already logged at `step` (a finished run resumed), if any."""
        path = self.run_dir / "metrics.jsonl"
        rows = read_metrics(path, "val", whole=False) if path.is_file() else []
        return next((r for r in reversed(rows) if r["step"] == step), None)

    def run(self) -> RunResult:
        cfg, env = self.cfg, self.env
        logger: MetricsLogger | None = None
        try:
            with said_plainly("the run's files in", self.run_dir, None, self._resume_hint):
                self._prepare_run_dir()
            resumed = self.checkpoint is not None
            if resumed:
                self._restore()
                if not self.budget.done(self.state):  # training goes on from here
                    self.state.resumed_at.append(self.state.step)
            def open_trackers(run_dir: Path, resume_step: int | None) -> list[trackers.Tracker]:
                return trackers.open_trackers(run_dir, cfg, resume_step)

            logger = MetricsLogger(self.run_dir, self.state.step if resumed else None,
                                   open_trackers) if env.is_main else None  # rank 0 alone: metrics, trackers
            if logger is not None and logger.torn is not None:
                say(f"{logger.path}: dropped a torn last line ({logger.torn} bytes) left by an interrupted "
                    "write")
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
                with said_plainly("the summary", path, len(text), self._resume_hint):
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
            if cfg.ckpt_every and state.step % cfg.ckpt_every == 0 and not done:
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
