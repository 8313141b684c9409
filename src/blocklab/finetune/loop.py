"""Fine-tune a pretrained masked-LM run on a sentence (pair) classification or regression task.

The protocol of Simplifying Transformer Blocks (Sec. 5 and App. D.2), which follows Crammed BERT
(Geiping & Goldstein, 2023): 5 epochs with the same hyperparameters for every task, dropout 0.1
(pretraining uses none), batch 32, AdamW (betas 0.9 / 0.98, eps 1e-6, no weight decay) with a
peak learning rate of 1.5e-4, a linear warmup over the first 10% of the steps and cosine decay to 0.
With T steps, W = round(0.1 T) warmup steps and s = 0 .. T - 1 the updates done so far,

    lr(s) = 1.5e-4 min((s + 1) / W, (1 + cos(pi (s - W) / (T - W))) / 2),

so the first update uses 1.5e-4 / W rather than 0 (a wasted step), as nanochat's (it + 1) / warmup.

The metrics are measured on the evaluation file after every epoch; the reported ones are those
after the last epoch (no selection on the evaluation set).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from blocklab.finetune.model import POOLINGS, SequenceClassifier, encode_example
from blocklab.finetune.tasks import (
    Example,
    TaskSpec,
    compute_metrics,
    load_task_file,
    make_task,
    read_examples,
    resolve_labels,
)
from blocklab.runtime import LanguageModel
from blocklab.training.optim import OptimConfig, build_optimizers, clip_grad_norm
from blocklab.training.schedules import lr_factor
from blocklab.util.configbase import ConfigBase, config_dataclass, is_count
from blocklab.util.errors import ConfigError


@config_dataclass
class FinetuneConfig(ConfigBase):
    epochs: int = 5
    batch_size: int = 32
    lr: float = 1.5e-4
    warmup_fraction: float = 0.1
    final_lr_fraction: float = 0.0  # cosine decay to 0
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-6
    weight_decay: float = 0.0
    grad_clip: float | None = None
    dropout: float = 0.1  # the model's blocks and the head, while fine-tuning
    pooling: str | None = None  # first | mean | last; None: first (encoder) or last (causal, if allowed)
    max_length: int | None = None  # tokens per example; None: the run's context length
    eval_batch_size: int = 128
    max_steps: int | None = None  # stop early (quick checks); the schedule follows the shorter run
    seed: int = 0
    device: str = "auto"
    allow_causal: bool = False  # fine-tune a causal (CLM) run, pooling its last real token
    # -- columns and labels (a generic task needs the first two) ------------------------------
    text_columns: tuple[str, ...] | None = None
    label_column: str | None = None
    num_labels: int | None = None  # generic: 1 = regression; None: inferred from the training labels
    label_names: tuple[str, ...] | None = None  # string labels in id order (generic)
    progress: bool = False

    def __post_init__(self) -> None:
        for name in ("betas", "text_columns", "label_names"):
            if isinstance(getattr(self, name), list):
                setattr(self, name, tuple(getattr(self, name)))
        _validate(self)

    def optim(self) -> OptimConfig:
        return OptimConfig(name="adamw", lr=self.lr, betas=self.betas, eps=self.eps,
                           weight_decay=self.weight_decay, grad_clip=self.grad_clip, schedule="cosine",
                           warmup_fraction=self.warmup_fraction, final_lr_fraction=self.final_lr_fraction)


def _validate(cfg: FinetuneConfig) -> None:
    def fail(name: str, allowed: str) -> None:
        cfg.fail(name, getattr(cfg, name), allowed)

    for name in ("epochs", "batch_size", "eval_batch_size"):
        value = getattr(cfg, name)
        if not is_count(value, 1):
            fail(name, "it must be a positive integer.")
    for name in ("max_length", "max_steps"):
        value = getattr(cfg, name)
        if value is not None and not is_count(value, 1):
            fail(name, "it must be a positive integer or None.")
    if not (isinstance(cfg.dropout, (int, float)) and 0.0 <= cfg.dropout < 1.0):
        fail("dropout", "it must lie in [0, 1).")
    if cfg.pooling is not None and cfg.pooling not in POOLINGS:
        fail("pooling", f"choose one of {', '.join(POOLINGS)} (or None for the model's default).")
    if cfg.device not in ("auto", "cpu", "cuda", "mps") and not str(cfg.device).startswith("cuda:"):
        fail("device", "choose auto, cpu, cuda, cuda:N or mps.")
    cfg.optim()  # OptimConfig names a bad lr, betas, eps, weight decay or warmup


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _tensors(tokenizer, examples: list[Example], max_length: int, regression: bool):
    rows = [encode_example(tokenizer, e.texts, max_length) for e in examples]
    ids = torch.tensor([r[0] for r in rows], dtype=torch.long)
    lengths = torch.tensor([r[1] for r in rows], dtype=torch.long)
    labels = torch.tensor([e.label for e in examples], dtype=torch.float32 if regression else torch.long)
    return ids, lengths, labels


def _loss(logits, labels, regression: bool):
    return F.mse_loss(logits.float(), labels) if regression else F.cross_entropy(logits.float(), labels)


@torch.no_grad()
def predict(model: SequenceClassifier, ids, lengths, batch_size: int, device) -> list:
    """Class ids (classification) or values (regression) for every row, in eval mode."""
    was_training = model.training
    model.eval()
    out = []
    for start in range(0, len(ids), batch_size):
        logits = model(ids[start:start + batch_size].to(device), lengths[start:start + batch_size].to(device))
        out.append(logits.float().cpu() if model.num_labels == 1 else logits.argmax(-1).cpu())
    model.train(was_training)
    return torch.cat(out).tolist()


def prepare_encoder(run_dir: str | Path, cfg: FinetuneConfig):
    """The model of a run directory or a blocklab export (`load_model_folder`) rebuilt in float32 with
    the fine-tuning dropout, its tokenizer, and the pooling to use."""
    from blocklab.training.runs import load_model_folder

    run = load_model_folder(run_dir)
    model_cfg = run.model.cfg
    if model_cfg.causal and not cfg.allow_causal:
        raise ConfigError(f"the model of {str(run_dir)!r} is a causal language model (causal=True); "
                          "fine-tuning needs a masked-LM encoder (train with data.objective=mlm, e.g. "
                          "`blocklab train crammed-bert`), or set allow_causal=True (--allow-causal) to pool "
                          "its last token.")
    encoder = LanguageModel(model_cfg.replace(dropout=float(cfg.dropout)))
    encoder.load_state_dict(run.model.state_dict())
    pooling = cfg.pooling or ("last" if model_cfg.causal else "first")
    return encoder, run.tokenizer, pooling


def finetune_dir(run_dir: str | Path, task: str) -> Path:
    """Where `finetune` writes a task's results unless given `out_dir`: ``run_dir/finetune/<task>``."""
    return Path(run_dir) / "finetune" / task


@dataclass
class TaskData:
    """The task and its examples: the training file's and the evaluation file's."""

    spec: TaskSpec
    train: list[Example]
    eval: list[Example]


def load_task(task: str, cfg: FinetuneConfig, train_file: str | Path, eval_file: str | Path) -> TaskData:
    """The task named `task` (its columns and labels from `cfg`; a label count not given is read from
    the training labels) and the examples of both files."""
    spec = make_task(task, cfg.text_columns, cfg.label_column, cfg.num_labels, cfg.label_names)
    if not spec.num_labels:
        spec = resolve_labels(spec, read_examples(train_file, spec)[1])
    return TaskData(spec, load_task_file(train_file, spec), load_task_file(eval_file, spec))


@dataclass
class Classifier:
    """The model being fine-tuned (the encoder and its head, on `device`), its tokenizer, its pooling
    and the tokens an example keeps."""

    model: SequenceClassifier
    tokenizer: Any
    pooling: str
    max_length: int
    device: torch.device


def build_classifier(run_dir: str | Path, cfg: FinetuneConfig, spec: TaskSpec) -> Classifier:
    """The run's encoder (`prepare_encoder`) with a new head of the task's labels; the head's
    initialisation follows `cfg.seed`. An example keeps at most the run's context length."""
    encoder, tokenizer, pooling = prepare_encoder(run_dir, cfg)
    max_length = min(cfg.max_length or encoder.cfg.context_length, encoder.cfg.context_length)
    device = _device(cfg.device)
    torch.manual_seed(cfg.seed)
    model = SequenceClassifier(encoder, spec.num_labels, pooling, cfg.dropout).to(device)
    return Classifier(model, tokenizer, pooling, max_length, device)


def total_steps(cfg: FinetuneConfig, train_examples: int) -> int:
    """The updates of the run: `cfg.epochs` epochs of `cfg.batch_size` (the last batch of an epoch may
    be short), or `cfg.max_steps` if fewer."""
    total = math.ceil(train_examples / cfg.batch_size) * cfg.epochs
    return total if cfg.max_steps is None else min(cfg.max_steps, total)


def set_lr(optimizers: list, optim_cfg: OptimConfig, step: int, total: int) -> None:
    """Every group's lr for update `step` of `total`: its base lr times the schedule's factor."""
    factor = lr_factor(optim_cfg, step / total, step, total)
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["base_lr"] * factor


@dataclass
class Training:
    """The state of the fine-tuning loop: the optimizers and their schedule, the updates done of
    `total`, and the progress bar."""

    optimizers: list
    optim_cfg: OptimConfig
    total: int
    bar: Any
    step: int = 0

    @property
    def done(self) -> bool:
        return self.step == self.total


def start_training(model: SequenceClassifier, cfg: FinetuneConfig, train_examples: int) -> Training:
    """The optimizers (`cfg.optim`), the schedule over the run's updates (`total_steps`), its warmup
    in steps, and the progress bar (shown with `cfg.progress`)."""
    optim_cfg = cfg.optim()
    optimizers = build_optimizers(model, optim_cfg)
    total = total_steps(cfg, train_examples)
    # the warmup in steps: its ramp (step + 1) / W makes the first update count (lr > 0)
    optim_cfg = optim_cfg.replace(warmup_steps=round(cfg.warmup_fraction * total))
    from tqdm.auto import tqdm

    return Training(optimizers, optim_cfg, total, tqdm(total=total, disable=not cfg.progress, unit="step"))


def train_epoch(clf: Classifier, cfg: FinetuneConfig, regression: bool, data, order, state: Training
                ) -> list[float]:
    """One pass over the training rows in `order`, a batch an update, stopping at the last update;
    returns each update's loss."""
    losses = []
    for i in range(0, len(order), cfg.batch_size):
        if state.done:
            break
        set_lr(state.optimizers, state.optim_cfg, state.step, state.total)
        rows = order[i:i + cfg.batch_size]
        ids, lengths, labels = (t[rows].to(clf.device) for t in data)
        loss = _loss(clf.model(ids, lengths), labels, regression)
        loss.backward()
        clip_grad_norm(clf.model, cfg.grad_clip)
        for opt in state.optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
        state.step += 1
        losses.append(loss.item())
        state.bar.update(1)
        state.bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return losses


def train_and_evaluate(clf: Classifier, cfg: FinetuneConfig, spec: TaskSpec, train_data, eval_data,
                       state: Training) -> tuple[list[dict[str, Any]], list]:
    """The epochs (each in its own order, drawn from `cfg.seed`), the evaluation file's metrics after
    each; returns the history and the last evaluation's predictions."""
    generator = torch.Generator().manual_seed(cfg.seed)
    history = []
    clf.model.train()
    for epoch in range(cfg.epochs):
        order = torch.randperm(len(train_data[0]), generator=generator)
        losses = train_epoch(clf, cfg, spec.regression, train_data, order, state)
        predictions = predict(clf.model, eval_data[0], eval_data[1], cfg.eval_batch_size, clf.device)
        history.append({"epoch": epoch + 1, "step": state.step, "train_loss": sum(losses) / len(losses),
                        **compute_metrics(spec, predictions, eval_data[2].tolist())})
        if state.done:
            break
    return history, predictions


def write_results(out: Path, record: dict[str, Any], predictions: list, labels: list) -> None:
    """``metrics.json`` (the record) and ``predictions.jsonl`` (the last epoch's prediction and label
    of every evaluation example, behind the metrics) in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(record, indent=2))
    rows = zip(predictions, labels, strict=True)
    (out / "predictions.jsonl").write_text("".join(json.dumps({"prediction": p, "label": y}) + "\n"
                                                   for p, y in rows))


def finetune(run_dir: str | Path, train_file: str | Path, eval_file: str | Path, task: str,
             out_dir: str | Path | None = None, **hp: Any) -> dict[str, float]:
    """Fine-tune the run (or blocklab export) in `run_dir` on `train_file`, evaluate on `eval_file`,
    write ``metrics.json`` and ``predictions.jsonl`` (the last epoch's prediction and label of every
    evaluation example).

    `task` is a GLUE task (cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli) or ``"generic"``
    (give ``text_columns`` and ``label_column``); `hp` are `FinetuneConfig` fields. `out_dir`
    defaults to ``run_dir/finetune/<task>``. Returns the final metrics and the task ``score``.
    """
    cfg = FinetuneConfig.from_dict(hp)
    data = load_task(task, cfg, train_file, eval_file)
    spec = data.spec
    clf = build_classifier(run_dir, cfg, spec)
    train_data = _tensors(clf.tokenizer, data.train, clf.max_length, spec.regression)
    eval_data = _tensors(clf.tokenizer, data.eval, clf.max_length, spec.regression)
    state = start_training(clf.model, cfg, len(data.train))
    start = time.perf_counter()
    history, predictions = train_and_evaluate(clf, cfg, spec, train_data, eval_data, state)
    state.bar.close()
    metrics = {k: v for k, v in history[-1].items() if k not in ("epoch", "step", "train_loss")}
    record = {"task": spec.name, "run": str(run_dir), "train_file": str(train_file),
              "eval_file": str(eval_file), "metrics": metrics, "history": history,
              "num_labels": spec.num_labels, "label_names": list(spec.label_names), "pooling": clf.pooling,
              "max_length": clf.max_length, "train_examples": len(data.train),
              "eval_examples": len(data.eval), "steps": state.step,
              "warmup_steps": state.optim_cfg.warmup_steps, "time_s": time.perf_counter() - start,
              "config": cfg.to_dict()}
    out = Path(out_dir) if out_dir is not None else finetune_dir(run_dir, spec.name)
    write_results(out, record, predictions, eval_data[2].tolist())
    return metrics


__all__ = ["FinetuneConfig", "TaskSpec", "finetune", "finetune_dir", "predict", "prepare_encoder"]
