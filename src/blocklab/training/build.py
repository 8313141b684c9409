"""The steps that build a training run, torchtitan's recipe: each builds one part from its part of
`TrainConfig`, and `loop.Trainer` calls them in this order, then runs the loop with what they built.

1. `start_run`: the run's folder and config. The trackers it names are installed, an ``init_from``
   source is loaded (it fixes the model and the tokenizer), and the folder is checked: a resume
   against its last checkpoint and metrics.jsonl, a new run against what the folder already holds.
2. `place`: the processes and the device (``device``, ``precision``; under torchrun the process
   group), whether the global batch splits over them (``batch_size``, ``grad_accum``), and, with no
   source model, whether the model will fit before the data is read.
3. `build_data`: the data (``data``, ``batch_size``, ``seq_len``, ``seed``): the tokenised corpus and
   its batches, a pure function of (seed, step).
4. `build_model`: the model (``arch``, ``size``, ``model``, or the source's), counted, compiled
   (``compile``) and wrapped for DDP or FSDP (``parallel``).
5. `optim.build_optimizers` (``optim``) and `budget.Budget` (``max_*``).
6. `checkpointer.Checkpointer`: the checkpoints (``ckpt_every``, ``keep_checkpoints``).
7. `open_metrics`: metrics.jsonl and the trackers beside it (``logger``, ``tensorboard``,
   ``wandb_project``, ``wandb_group``), once the run's files are written.

The order is the one the run's random streams and refusals depend on: the seed is set before the
processes start and again just before the model is built, and everything a run is refused for is
checked before the data, which may take long, or before anything is written.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from blocklab.accounting import ParameterCounts, count_parameters, flops_per_token
from blocklab.data import Batches, PreparedData, Tokenizer, prepare_data
from blocklab.data.sources import skipped_lines
from blocklab.model.config import ModelConfig
from blocklab.runtime import LanguageModel
from blocklab.training import checkpoint as ckpt
from blocklab.training import distributed, init_from, memory, rundir, trackers
from blocklab.training.config import TrainConfig
from blocklab.training.metrics import MetricsLogger
from blocklab.training.step import autocast_for, compile_for_training
from blocklab.util.errors import ConfigError
from blocklab.util.progress import say

Source = tuple[LanguageModel, Path | None]  # init_from: the source's model and its tokenizer file


@dataclass
class RunStart:
    """What `start_run` settles: the config the run goes on with (init_from's arch, size and tokenizer
    filled in), its folder, the checkpoint a resume starts from (None: step 0) and the source model."""

    cfg: TrainConfig
    run_dir: Path
    checkpoint: Path | None
    source: Source | None


def start_run(cfg: TrainConfig, resume: bool) -> RunStart:
    """The run's folder and config, checked before the data, which may take long: a resume takes its
    last checkpoint (`ckpt.latest_checkpoint`) and may change only `config.RESUMABLE`; rank 0 checks
    that metrics.jsonl lost no row since and the trackers can go on; a new run must not write over a
    saved one (`rundir.check_new_run_dir`)."""
    trackers.require_installed(trackers.tracker_names(cfg))
    # before the data: it names the tokenizer; a resume reads the run's own model config and tokenizer
    source = init_from.load_init(cfg, Path(cfg.out_dir) if resume else None) if cfg.init_from else None
    if source is not None:  # the run records the source's arch and size, the model it trains
        cfg = init_from.with_source_preset(cfg, source[0])
        cfg = init_from.with_source_tokenizer(cfg, source[1])
    run_dir = Path(cfg.out_dir)
    checkpoint = ckpt.latest_checkpoint(run_dir) if resume else None  # None: a resume from step 0
    if checkpoint is not None:
        rundir.check_resume_config(run_dir, cfg, checkpoint)
        if cfg.init_from:  # its source may be gone: the run's own tokenizer.json serves
            cfg = init_from.resumed_tokenizer(cfg, run_dir)
        if distributed.launch_rank() == 0:  # the process that appends to metrics.jsonl
            rundir.check_resume_metrics(run_dir, checkpoint)
            trackers.check_resume(run_dir, cfg)
    elif not resume:
        rundir.check_new_run_dir(run_dir, cfg.overwrite)
    return RunStart(cfg, run_dir, checkpoint, source)


def resolve_device(name: str, env: distributed.DistEnv) -> torch.device:
    """`TrainConfig.device`: "auto" is CUDA when there is one; under torchrun each process its own GPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("TrainConfig.device = 'cuda' is not allowed: no CUDA device is available.")
        return torch.device("cuda", env.local_rank)
    return torch.device(name)


@dataclass
class Placement:
    """Where the run computes: its processes (`env`), this process's device and the autocast of the
    precision."""

    env: distributed.DistEnv
    device: torch.device
    autocast: AbstractContextManager


def place(cfg: TrainConfig, source: Source | None) -> Placement:
    """Seed torch, join torchrun's process group (none when run alone) and pick the device; the global
    batch must split over processes x accumulation steps. With no source model, the model's training
    memory is checked against the device before the data: the vocabulary is not known yet, so 1 (or
    model.vocab_size when given) stands in for it, a lower bound (`build_model` checks it exactly)."""
    torch.manual_seed(cfg.seed)
    probe = torch.device("cuda" if cfg.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu")
    env = distributed.setup(probe)
    device = resolve_device(cfg.device, env)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    autocast = autocast_for(cfg.precision, device)
    rows = env.world_size * cfg.grad_accum
    if cfg.batch_size % rows:
        raise ConfigError(f"TrainConfig.batch_size = {cfg.batch_size} is not allowed: it must be "
                          f"divisible by processes x grad_accum = {rows}.")
    if source is None:  # init_from: the model is the source's, in memory already
        memory.check_training_fits(cfg, cfg.model_config(1), device, env.world_size)
    return Placement(env, device, autocast)


@dataclass
class RunData:
    """The run's data: the prepared corpus, its training and validation batches, and the UTF-8 bytes
    of each token id (for bits per byte)."""

    prepared: PreparedData
    train: Batches
    val: Batches
    token_bytes: Tensor

    @property
    def tokenizer(self) -> Tokenizer:
        return self.prepared.tokenizer


def build_data(cfg: TrainConfig, where: Placement, run_dir: Path) -> RunData:
    """`TrainConfig.data` prepared (read, tokenised, cached) and batched. Rank 0 tokenises and says
    which files it skipped; the other ranks wait for it, then read its cache."""
    if where.env.is_main:
        prepared = prepare_data(cfg.data, progress=cfg.progress)
        for line in skipped_lines(prepared.stats, str(run_dir / "data_manifest.json")):
            say(line)
    distributed.barrier(where.env)
    if not where.env.is_main:
        prepared = prepare_data(cfg.data)
    return RunData(prepared, Batches(prepared, "train", cfg.batch_size, cfg.seq_len, seed=cfg.seed),
                   Batches(prepared, "val", cfg.batch_size, cfg.seq_len, seed=cfg.seed),
                   torch.as_tensor(prepared.tokenizer.token_bytes, device=where.device))


@dataclass
class BuiltModel:
    """The model the run trains (`model`), what the steps run (`wrapped`: DDP or FSDP under torchrun,
    else `model` itself), its config, parameter counts and training FLOPs per token."""

    model: LanguageModel
    wrapped: nn.Module
    config: ModelConfig
    counts: ParameterCounts
    flops_per_token: float


def build_model(cfg: TrainConfig, source: Source | None, tokenizer: Tokenizer,
                where: Placement) -> BuiltModel:
    """A new model of `cfg.model_config(vocabulary)`, its memory checked, or init_from's source (its
    tokenizer checked against the data's); then counted, compiled (`step.compile_for_training`) and
    wrapped (`distributed.wrap`). The seed is set again first, so the initial weights do not depend on
    what the data preparation drew."""
    # summary.json reports this run's peak from here on: the model and its training, not the
    # process's lifetime nor the one-off tokenisation of a cold cache
    memory.reset_peak_memory(where.device)
    torch.manual_seed(cfg.seed)
    if source is not None:  # continued pretraining: the source's (retrofitted) config and weights
        init_from.check_init(cfg, source[0], source[1], tokenizer)
        model = source[0].to(where.device)
        model_cfg = model.cfg
    else:
        model_cfg = cfg.model_config(tokenizer.vocab_size)
        memory.check_training_fits(cfg, model_cfg, where.device, where.env.world_size)
        model = LanguageModel(model_cfg).to(where.device)
    counts, flops = count_parameters(model), flops_per_token(model)
    compile_for_training(model, cfg.compile)
    wrapped = distributed.wrap(model, where.env, cfg.parallel, where.device)
    return BuiltModel(model, wrapped, model_cfg, counts, flops)


def open_metrics(cfg: TrainConfig, run_dir: Path, resume_step: int | None,
                 env: distributed.DistEnv) -> MetricsLogger | None:
    """metrics.jsonl (a new one, or on resume cut back to `resume_step`) and the trackers `cfg` names,
    on rank 0 alone (None on the others). A torn last line, left by a write that was interrupted, is
    dropped and said."""
    if not env.is_main:
        return None
    logger = MetricsLogger(run_dir, resume_step,
                           lambda folder, step: trackers.open_trackers(folder, cfg, step))
    if logger.torn is not None:
        say(f"{logger.path}: dropped a torn last line ({logger.torn} bytes) left by an interrupted write")
    return logger
