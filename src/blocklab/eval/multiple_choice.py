"""Zero-shot multiple choice on local JSONL files, and the DCLM CORE aggregate.

Each line of a task file is ``{"context": str, "choices": [str, ...], "label": int}`` (HellaSwag
style). A choice is scored as the continuation ``delimiter + choice`` of ``[SEP] + context``
(the run's separator token begins the text, as it begins every document in pretraining), by

    sum:       log p(continuation | context)                      (summed over its tokens)
    per byte:  log p(continuation | context) / UTF-8 bytes of the continuation

and the prediction is the argmax over choices (the first one on a tie). Per task we report
both accuracies and the centered accuracy of DCLM (Li et al., 2024), as used by Bank of Values
(Sec. 4): with r "the task's random-guessing (or majority-class) baseline", by default
1 / number of choices (averaged over the examples when that number varies), or given per task
(`random_baseline`, e.g. the majority class of BoolQ),

    centered = (acc - r) / (1 - r),

and the CORE score is the unweighted mean of the centered accuracies over tasks (Bank of
Values reports it over the 21 DCLM CORE tasks). Both scorings get a CORE score: the byte-normalised
one is the rule of the Bank of Values code; compare models under one rule only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from torch import nn

from blocklab.eval.loglik import check_causal, score_continuations
from blocklab.util.errors import ConfigError


@dataclass
class MCExample:
    context: str
    choices: list[str]
    label: int


@dataclass
class MCResult:
    task: str
    n: int
    acc: float  # summed log-likelihood
    acc_per_byte: float  # log-likelihood per byte
    random_baseline: float  # r
    centered_acc: float
    centered_acc_per_byte: float

    def to_dict(self) -> dict:
        return asdict(self)


def load_mc(path: str | Path) -> list[MCExample]:
    """The examples of a JSONL file of ``{"context", "choices", "label"}`` objects."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"multiple-choice file {str(path)!r} does not exist.")
    examples = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{str(path)!r} line {i} is not JSON: {err}") from err
        where = f"{str(path)!r} line {i}"
        if not isinstance(row, dict) or not {"context", "choices", "label"} <= set(row):
            raise ConfigError(f"{where} must be an object with 'context', 'choices' and 'label'.")
        context, choices, label = row["context"], row["choices"], row["label"]
        if not isinstance(context, str) or not isinstance(choices, list) or len(choices) < 2 \
                or not all(isinstance(c, str) and c for c in choices):
            raise ConfigError(f"{where}: 'context' must be a string and 'choices' a list of at least two "
                              "non-empty strings.")
        if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < len(choices):
            raise ConfigError(f"{where}: 'label' = {label!r} is not allowed: give an index in "
                              f"[0, {len(choices)}).")
        examples.append(MCExample(context, choices, label))
    if not examples:
        raise ConfigError(f"multiple-choice file {str(path)!r} holds no examples.")
    return examples


def continuation_ids(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """([SEP] + context, continuation) as token ids, split where the two encodings part.

    The whole text is encoded at once, so a tokenizer that merges across the boundary scores
    the merged token as part of the continuation.
    """
    head = [tokenizer.eos_id] + tokenizer.encode(context)
    whole = [tokenizer.eos_id] + tokenizer.encode(context + continuation)
    split = 0
    while split < min(len(head), len(whole)) and head[split] == whole[split]:
        split += 1
    return whole[:split], whole[split:]


def centered_accuracy(acc: float, random_baseline: float) -> float:
    """(acc - r) / (1 - r): 0 for random guessing, 1 for a perfect score (DCLM)."""
    return (acc - random_baseline) / (1.0 - random_baseline)


def score_mc(model: nn.Module, tokenizer, examples: list[MCExample], task: str = "task",
             batch_size: int = 16, delimiter: str = " ", random_baseline: float | None = None) -> MCResult:
    """Accuracies of `model` on `examples` under both scorings (module docstring); `random_baseline`
    is the task's r (default: 1 / number of choices, averaged over the examples)."""
    check_causal(model, "zero-shot multiple choice")
    if random_baseline is not None and not 0.0 <= random_baseline < 1.0:
        raise ConfigError(f"random baseline {random_baseline!r} of task {task!r} is not allowed: give r in "
                          "[0, 1).")
    requests, n_bytes = [], []
    for example in examples:
        for choice in example.choices:
            requests.append(continuation_ids(tokenizer, example.context, delimiter + choice))
            n_bytes.append(len((delimiter + choice).encode("utf-8")))
    scores = [s for s, _ in score_continuations(model, requests, batch_size)]
    correct_sum = correct_byte = 0
    baseline = 0.0
    k = 0
    for example in examples:
        m = len(example.choices)
        total = scores[k:k + m]
        per_byte = [s / b for s, b in zip(total, n_bytes[k:k + m], strict=True)]
        correct_sum += max(range(m), key=total.__getitem__) == example.label
        correct_byte += max(range(m), key=per_byte.__getitem__) == example.label
        baseline += 1.0 / m
        k += m
    n = len(examples)
    acc, acc_byte = correct_sum / n, correct_byte / n
    r = baseline / n if random_baseline is None else float(random_baseline)
    return MCResult(task, n, acc, acc_byte, r, centered_accuracy(acc, r), centered_accuracy(acc_byte, r))


def core_score(results: list[MCResult]) -> dict[str, float]:
    """The unweighted mean of the centered accuracies over tasks, for both scorings."""
    if not results:
        raise ValueError("core_score needs at least one task result.")
    return {"core": sum(r.centered_acc for r in results) / len(results),
            "core_per_byte": sum(r.centered_acc_per_byte for r in results) / len(results)}


def task_names(files: list[str | Path]) -> list[str]:
    """One name per file: its stem, or parent/stem where two files share a stem."""
    paths = [Path(f) for f in files]
    stems = [p.stem for p in paths]
    names = [f"{p.parent.name}/{p.stem}" if stems.count(p.stem) > 1 else p.stem for p in paths]
    for name in names:
        if names.count(name) > 1:
            same = [str(p) for p, n in zip(paths, names, strict=True) if n == name]
            raise ConfigError(f"multiple-choice files {', '.join(same)} would both be task {name!r}: give "
                              "each task file a distinct name (or folder).")
    return names


def evaluate_mc(model: nn.Module, tokenizer, files: list[str | Path], batch_size: int = 16,
                delimiter: str = " ", limit: int | None = None,
                random_baseline: dict[str, float] | None = None) -> dict:
    """Score every file; returns ``{"tasks": [...], "core": ..., ...}``.

    A task is named by its file's stem (parent/stem when two files share one); `random_baseline`
    maps task names to their r (DCLM: "random-guessing (or majority-class) baseline"), the others
    use 1 / number of choices.
    """
    names = task_names(files)
    given = dict(random_baseline or {})
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ConfigError(f"random baseline for unknown task(s) {', '.join(map(repr, unknown))}; the tasks "
                          f"are {', '.join(map(repr, names))}.")
    results = []
    for path, name in zip(files, names, strict=True):
        examples = load_mc(path)[:limit] if limit else load_mc(path)
        results.append(score_mc(model, tokenizer, examples, name, batch_size, delimiter, given.get(name)))
    return {"tasks": [r.to_dict() for r in results], **core_score(results)}


def format_table(report: dict) -> str:
    """A plain-text table of `evaluate_mc`'s report."""
    head = f"{'task':<24} {'n':>6} {'acc':>7} {'acc/byte':>9} {'random':>7} {'centered':>9} {'c. /byte':>9}"
    lines = [head, "-" * len(head)]
    for r in report["tasks"]:
        lines.append(f"{r['task']:<24} {r['n']:>6} {r['acc']:>7.4f} {r['acc_per_byte']:>9.4f} "
                     f"{r['random_baseline']:>7.4f} {r['centered_acc']:>9.4f} "
                     f"{r['centered_acc_per_byte']:>9.4f}")
    lines.append(f"CORE (mean centered accuracy): {report['core']:.4f} summed log-likelihood, "
                 f"{report['core_per_byte']:.4f} per byte")
    return "\n".join(lines)
