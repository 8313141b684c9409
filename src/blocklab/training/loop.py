"""The training loop: `blocklab.training(...)` and `blocklab train`.

One run = one directory: ``config.yaml`` (the TrainConfig), ``model_config.json`` (the resolved
ModelConfig), ``tokenizer.json``, ``data_manifest.json``, ``metrics.jsonl``, ``checkpoints/`` and,
when it finishes, ``summary.json``. Batches are a pure function of (seed, step), so a resumed run
continues on exactly the batches (and, on CPU, exactly the loss curve) of an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import resource
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blocklab.accounting import count_parameters, flops_per_token
from blocklab.config import ConfigError, ModelConfig
from blocklab.data import Batches, bits_per_byte, prepare_data
from blocklab.model import Transformer
from blocklab.training import checkpoint as ckpt
from blocklab.training import distributed
from blocklab.training.budget import Budget
from blocklab.training.config import TrainConfig
from blocklab.training.metrics import MetricsLogger, learned_scalars
from blocklab.training.optim import build_optimizers
from blocklab.training.schedules import lr_factor


class TrainingError(RuntimeError):
    """Training cannot go on (a non-finite loss, a run that does not match its checkpoint)."""


@dataclass
class RunResult:
    run_dir: Path
    model: Transformer
    summary: dict[str, Any]


def resolve_device(name: str, env: distributed.DistEnv) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("TrainConfig.device = 'cuda' is not allowed: no CUDA device is available.")
        return torch.device("cuda", env.local_rank)
    return torch.device(name)


def autocast_for(precision: str, device: torch.device):
    """bf16 autocast on CUDA by default; float32 on CPU, where bf16 without hardware support is slow."""
    use_bf16 = precision == "bfloat16" or (
        precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported())
    return torch.autocast(device.type, dtype=torch.bfloat16) if use_bf16 else nullcontext()


def lm_loss(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """Mean cross-entropy over the labelled positions (next tokens, or masked tokens; -100 ignored)."""
    logits = model(batch["input_ids"])
    return F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=-100)


@torch.no_grad()
def evaluate(model: nn.Module, batches: Batches, batch_size: int, max_batches: int | None,
             device: torch.device, autocast) -> float:
    """Mean validation loss over the held-out split (token-weighted)."""
    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)
    for batch in batches.validation(batch_size, max_batches):
        batch = {k: v.to(device) for k, v in batch.items()}
        with autocast:
            loss = lm_loss(model, batch)
        n = (batch["labels"] != -100).sum()
        total += torch.stack([loss.double() * n, n.double()])
    model.train(was_training)  # every rank evaluates the whole split (FSDP needs all ranks anyway)
    return (total[0] / total[1].clamp_min(1)).item()


def _set_lr(optimizers, factor: float) -> None:
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["base_lr"] * factor


def _peak_memory_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


def _check_resume(run_dir: Path, model_cfg: ModelConfig, tokenizer_hash: str) -> None:
    saved_cfg = json.loads((run_dir / "model_config.json").read_text())
    if saved_cfg != json.loads(json.dumps(model_cfg.to_dict())):
        diff = {k: (saved_cfg.get(k), v) for k, v in model_cfg.to_dict().items() if saved_cfg.get(k) != v}
        raise TrainingError(f"cannot resume {str(run_dir)!r}: the model config differs from the checkpoint's "
                            f"(field: (saved, now)) {diff}. Start a new out_dir or restore the config.")
    saved_tok = json.loads((run_dir / "data_manifest.json").read_text()).get("tokenizer_hash")
    if saved_tok != tokenizer_hash:
        raise TrainingError(f"cannot resume {str(run_dir)!r}: the tokenizer differs from the run's "
                            f"(saved hash {saved_tok}, now {tokenizer_hash}).")


def train(config: TrainConfig | dict | str | Path | None = None, resume: bool = False,
          **overrides: Any) -> RunResult:
    """Train one model. `config` is a TrainConfig, a dict, a YAML path or None (defaults);
    keyword overrides use TrainConfig field names, with dotted names for sections given as a dict,
    e.g. ``train(max_steps=100, **{"optim.lr": 3e-4})``."""
    if isinstance(config, TrainConfig):
        cfg = TrainConfig.load(None, {**config.to_dict(), **overrides}) if overrides else config
    elif isinstance(config, dict):
        cfg = TrainConfig.load(None, {**config, **overrides})
    else:
        cfg = TrainConfig.load(config, overrides)
    return Trainer(cfg, resume=resume).run()


def load_init(cfg: TrainConfig) -> tuple[Transformer, Path | None]:
    """Continued pretraining: the float32 model saved in `cfg.init_from` (a run directory or a
    `blocklab.interop.save_pretrained` export), retrofitted with the value path `cfg.retrofit`
    (`blocklab.interop.retrofit`: ResFormer's mix starts at the baseline where the formula allows,
    a low-cost use of value residuals per Value Residual Learning), and the source's tokenizer.json
    (None when an export has none)."""
    from blocklab.interop import load_pretrained, retrofit
    from blocklab.training.runs import load_run

    src = Path(cfg.init_from)
    try:
        if (src / "model_config.json").is_file():
            model = load_run(src).model
        elif (src / "config.json").is_file():
            model = load_pretrained(src)
        else:
            raise FileNotFoundError(f"TrainConfig.init_from = {cfg.init_from!r} is not allowed: it is "
                                    "neither a run directory (model_config.json) nor a save_pretrained "
                                    "export (config.json).")
    except FileNotFoundError as err:  # a usage error, reported without a traceback
        raise ConfigError(str(err)) from None
    model = model.float().train()
    if cfg.retrofit:
        model = retrofit(model, cfg.retrofit)
    tok = src / "tokenizer.json"
    return model, tok if tok.is_file() else None


def _check_init(cfg: TrainConfig, model: Transformer, source_tok: Path | None, tokenizer) -> None:
    """The source must fit the data: its tokenizer, vocabulary, objective and context length."""
    from blocklab.data import load_tokenizer

    where = f"init_from = {cfg.init_from!r}"
    if source_tok is not None:
        if load_tokenizer(source_tok, tokenizer.eos_token, tokenizer.mask_token).hash != tokenizer.hash:
            raise ConfigError(f"data.tokenizer = {cfg.data.tokenizer!r} differs from the tokenizer of "
                              f"{where}; leave data.tokenizer at 'bpe' (then {str(source_tok)!r} is used) "
                              "or give that file.")
    elif cfg.data.tokenizer == "bpe":
        raise ConfigError(f"{where} has no tokenizer.json: set data.tokenizer to the model's tokenizer "
                          "(byte or a tokenizer.json path) rather than training a new BPE.")
    m = model.cfg
    if tokenizer.vocab_size > m.vocab_size:
        raise ConfigError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model of {where} only "
                          f"{m.vocab_size}.")
    if m.causal != (cfg.data.objective == "clm"):
        raise ConfigError(f"data.objective = {cfg.data.objective!r} does not fit the model of {where} "
                          f"(causal = {m.causal}); use {'clm' if m.causal else 'mlm'}.")
    if cfg.seq_len > m.context_length:
        raise ConfigError(f"seq_len = {cfg.seq_len} is longer than the context length {m.context_length} "
                          f"of the model of {where}.")


class Trainer:
    def __init__(self, cfg: TrainConfig, resume: bool = False):
        init = load_init(cfg) if cfg.init_from else None  # before the data: it names the tokenizer
        if init is not None and init[1] is not None and cfg.data.tokenizer == "bpe":
            cfg = replace(cfg, data=cfg.data.replace(tokenizer=str(init[1])))
        self.cfg, self.resume = cfg, resume
        self.run_dir = Path(cfg.out_dir)
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

        # data first: it fixes the vocabulary; rank 0 tokenises, the others read its cache
        if self.env.is_main:
            self.data = prepare_data(cfg.data)
        distributed.barrier(self.env)
        if not self.env.is_main:
            self.data = prepare_data(cfg.data)
        self.train_batches = Batches(self.data, "train", cfg.batch_size, cfg.seq_len, seed=cfg.seed)
        self.val_batches = Batches(self.data, "val", cfg.batch_size, cfg.seq_len, seed=cfg.seed)

        torch.manual_seed(cfg.seed)
        if init is not None:  # continued pretraining: the source's (retrofitted) config and weights
            _check_init(cfg, init[0], init[1], self.data.tokenizer)
            self.model = init[0].to(self.device)
            self.model_cfg = self.model.cfg
        else:
            self.model_cfg = cfg.model_config(self.data.tokenizer.vocab_size)
            self.model = Transformer(self.model_cfg).to(self.device)
        self.counts = count_parameters(self.model)
        self.flops_per_token = flops_per_token(self.model)
        if cfg.compile:
            for block in self.model.blocks:
                block.compile()
        self.wrapped = distributed.wrap(self.model, self.env, cfg.parallel, self.device)
        self.optimizers = build_optimizers(self.model, cfg.optim)  # after FSDP swaps in sharded params
        self.tokens_per_step = cfg.batch_size * cfg.seq_len
        self.budget = Budget(cfg, self.tokens_per_step, self.flops_per_token)
        self.state = ckpt.TrainState()

    # -- run directory -------------------------------------------------------------------------------
    def _prepare_run_dir(self) -> None:
        resuming = self.resume and ckpt.latest_checkpoint(self.run_dir) is not None
        if resuming:
            _check_resume(self.run_dir, self.model_cfg, self.data.tokenizer.hash)
        elif self.env.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.yaml").write_text(self.cfg.to_yaml())
            (self.run_dir / "model_config.json").write_text(self.model_cfg.to_json())
            (self.run_dir / "data_manifest.json").write_text(
                json.dumps({**self.data.manifest, "tokenizer_hash": self.data.tokenizer.hash}, indent=2))
            self.data.tokenizer.save(self.run_dir)

    def _restore(self) -> None:
        path = ckpt.latest_checkpoint(self.run_dir)
        weights = ckpt.load_weights_file(path / "model.safetensors")
        blob = ckpt.load_optimizer_state(path)
        distributed.load_full_states(self.wrapped, self.optimizers, weights, blob["optimizers"])
        ckpt.set_rng_state(blob["rng"])
        self.state, _ = ckpt.read_state(path)

    def _save(self) -> None:
        weights, optim_states = distributed.full_states(self.wrapped, self.optimizers)
        if self.env.is_main:
            meta = {"model_config": self.model_cfg.to_dict(), "tokenizer_hash": self.data.tokenizer.hash}
            ckpt.save_checkpoint(self.run_dir, weights, optim_states, self.state, meta,
                                 self.cfg.keep_checkpoints)
        distributed.barrier(self.env)

    # -- the loop ----------------------------------------------------------------------------------
    def _micro_batches(self, step: int):
        accum, env = self.cfg.grad_accum, self.env
        for micro in range(accum):  # the global batch, split over accumulation steps, then ranks
            batch = self.train_batches.get(step, rank=micro * env.world_size + env.rank,
                                           world_size=accum * env.world_size)
            yield micro, {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def _step(self) -> tuple[float, float]:
        model, accum = self.wrapped, self.cfg.grad_accum
        loss_sum = torch.zeros((), device=self.device)
        for micro, batch in self._micro_batches(self.state.step):
            sync = micro == accum - 1 or not hasattr(model, "no_sync")
            with (nullcontext() if sync else model.no_sync()), self.autocast:
                loss = lm_loss(model, batch) / accum
            loss.backward()
            loss_sum += loss.detach()
        loss = distributed.mean_across(loss_sum, self.env).item()
        if not math.isfinite(loss):
            last = ckpt.latest_checkpoint(self.run_dir)
            raise TrainingError(
                f"the training loss became {loss} at step {self.state.step}; stopping without saving this "
                f"state. The last good checkpoint is {str(last) if last else 'none (none was saved yet)'}. "
                "Try a lower optim.lr, gradient clipping (optim.grad_clip) or float32 precision.")
        params = [p for p in model.parameters() if p.grad is not None]
        clip = self.cfg.optim.grad_clip
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip if clip else float("inf"))
        for opt in self.optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
        return loss, float(grad_norm)

    def _validate(self, logger: MetricsLogger | None) -> dict[str, float]:
        loss = evaluate(self.wrapped, self.val_batches, self.cfg.batch_size // self.env.world_size,
                        self.cfg.eval_batches, self.device, self.autocast)
        bpb = bits_per_byte(loss, self.data.bytes_per_token["val"]) if self.model_cfg.causal else None
        row = {"kind": "val", "step": self.state.step, "tokens": self.state.tokens, "val_loss": loss,
               "val_bpb": bpb}
        if logger is not None:
            logger.log(row)
        return row

    def run(self) -> RunResult:
        cfg, env = self.cfg, self.env
        try:
            self._prepare_run_dir()
            resumed = self.resume and ckpt.latest_checkpoint(self.run_dir) is not None
            if resumed:
                self._restore()
            logger = MetricsLogger(self.run_dir, self.state.step if resumed else None,
                                   cfg.tensorboard) if env.is_main else None
            if logger is not None and not resumed:
                logger.log({"kind": "train", "step": 0, "tokens": 0, "scalars": learned_scalars(self.model)})
            if cfg.init_from and not resumed:  # the starting point's validation loss (step 0)
                self._validate(logger)
            val = self._loop(logger)
            summary = self._summary(val)
            if env.is_main:
                (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
                logger.close()
            return RunResult(self.run_dir, distributed.unwrap(self.wrapped), summary)
        finally:
            distributed.teardown(env)

    def _loop(self, logger: MetricsLogger | None) -> dict[str, float]:
        cfg, state, budget = self.cfg, self.state, self.budget
        show = cfg.progress and self.env.is_main
        from tqdm.auto import tqdm

        bar = tqdm(total=budget.total_steps, initial=state.step, disable=not show, unit="step",
                   dynamic_ncols=True, file=sys.stderr)
        val: dict[str, float] | None = None
        window_tokens, window_start = 0, time.perf_counter()
        self.wrapped.train()
        done = self._done()
        while not done:
            factor = lr_factor(cfg.optim, budget.progress(state), state.step, budget.total_steps)
            _set_lr(self.optimizers, factor)
            start = time.perf_counter()
            loss, grad_norm = self._step()
            state.train_time += time.perf_counter() - start
            state.step += 1
            state.tokens += self.tokens_per_step
            state.flops += self.flops_per_token * self.tokens_per_step
            window_tokens += self.tokens_per_step
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}")
            done = self._done()  # a collective: every rank calls it exactly once per step
            if logger is not None and (state.step % cfg.log_every == 0 or done):
                now = time.perf_counter()
                logger.log({"kind": "train", "step": state.step, "tokens": state.tokens, "loss": loss,
                            "lr": cfg.optim.lr * factor, "grad_norm": grad_norm,
                            "tokens_per_s": window_tokens / max(now - window_start, 1e-9),
                            "wall_time": state.train_time, "scalars": learned_scalars(self.model)})
                window_tokens, window_start = 0, now
            if cfg.eval_every and state.step % cfg.eval_every == 0 and not done:
                val = self._validate(logger)
                window_start = time.perf_counter()  # keep evaluation out of tokens/s
            if cfg.ckpt_every and state.step % cfg.ckpt_every == 0 and not done:
                self._save()
        bar.close()
        if val is None or val["step"] != state.step:
            val = self._validate(logger)
        self._save()
        return val

    def _done(self) -> bool:
        done = torch.tensor(float(self.budget.done(self.state)))
        return bool(distributed.mean_across(done, self.env).item() > 0)  # rank clocks may disagree

    def _summary(self, val: dict[str, float]) -> dict[str, Any]:
        s = self.state
        return {
            "arch": self.cfg.arch, "size": self.cfg.size, "seed": self.cfg.seed,
            "params": {"total": self.counts.total, "embedding": self.counts.embedding,
                       "value_tables": self.counts.value_tables, "non_embedding": self.counts.non_embedding},
            "flops_per_token": self.flops_per_token, **asdict(s),
            "tokens_per_s": s.tokens / s.train_time if s.train_time else None,
            "peak_memory_mib": _peak_memory_mib(self.device), "device": str(self.device),
            "world_size": self.env.world_size,
            "val_loss": val["val_loss"], "val_bpb": val["val_bpb"],
        }
