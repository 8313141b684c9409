"""Fine-tuning tasks: GLUE (Wang et al., 2019) column layouts, labels and metrics, and a reader
for local task files (TSV or CSV with a header line, or JSONL).

GLUE's CoLA train/dev TSVs have no header line (columns: source, label, original mark,
sentence); a task may give a `headerless` layout of column positions that is used when the
first row holds none of its column names. Files are read as ``utf-8-sig`` (MRPC starts with a BOM).

Each GLUE task fixes its sentence columns, number of labels and metrics. Column names are tried
in order, so both the original GLUE TSV files (``#1 String``, ``gold_label``, ``is_duplicate``,
``score`` ...) and the Hugging Face ``glue`` export to JSONL (``sentence1``, ``premise``,
``label`` ...) work. String labels map to ids in the order of the Hugging Face ``glue`` data
set (MNLI: entailment 0, neutral 1, contradiction 2; QNLI, RTE: entailment 0, not_entailment 1).

The task score is the one the GLUE leaderboard shows: the mean of F1 and accuracy (MRPC, QQP),
of Pearson and Spearman (STS-B), the Matthews correlation (CoLA, which also reports accuracy),
else accuracy.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from blocklab.finetune import metrics as M
from blocklab.util.configbase import is_count
from blocklab.util.errors import ConfigError


@dataclass(frozen=True)
class TaskSpec:
    name: str
    text_columns: tuple[tuple[str, ...], ...]  # per sentence: the column names to try, in order
    label_columns: tuple[str, ...]
    num_labels: int  # 1: regression
    metrics: tuple[str, ...]  # names in METRICS, all reported
    score: tuple[str, ...]  # the metrics whose mean is the task score
    label_names: tuple[str, ...] = ()  # string labels, in id order
    headerless: tuple[tuple[int, ...], int] | None = None  # (sentence positions, label position)

    @property
    def regression(self) -> bool:
        return self.num_labels == 1


METRICS = {
    "accuracy": M.accuracy,
    "f1": M.f1_binary,
    "mcc": M.matthews_corrcoef,
    "pearson": M.pearson,
    "spearman": M.spearman,
}

_PAIR = (("sentence1",), ("sentence2",))
_NLI = ("entailment", "not_entailment")
_ACC, _F1_ACC, _CORR = ("accuracy",), ("f1", "accuracy"), ("pearson", "spearman")
GLUE_TASKS: dict[str, TaskSpec] = {t.name: t for t in (
    TaskSpec("cola", (("sentence",),), ("label",), 2, ("mcc", "accuracy"), ("mcc",), headerless=((3,), 1)),
    TaskSpec("sst2", (("sentence",),), ("label",), 2, _ACC, _ACC),
    TaskSpec("mrpc", (("sentence1", "#1 String"), ("sentence2", "#2 String")), ("label", "Quality"), 2,
             _F1_ACC, _F1_ACC),
    TaskSpec("qqp", (("question1",), ("question2",)), ("label", "is_duplicate"), 2, _F1_ACC, _F1_ACC),
    TaskSpec("stsb", _PAIR, ("label", "score"), 1, _CORR, _CORR),
    TaskSpec("mnli", (("premise", "sentence1"), ("hypothesis", "sentence2")), ("label", "gold_label"), 3,
             _ACC, _ACC, ("entailment", "neutral", "contradiction")),
    TaskSpec("qnli", (("question",), ("sentence",)), ("label",), 2, _ACC, _ACC, _NLI),
    TaskSpec("rte", _PAIR, ("label",), 2, _ACC, _ACC, _NLI),
    TaskSpec("wnli", _PAIR, ("label",), 2, _ACC, _ACC),
)}
GENERIC = "generic"
TASK_NAMES = (*GLUE_TASKS, GENERIC)


@dataclass
class Example:
    texts: tuple[str, ...]  # one or two sentences
    label: float | int


def make_task(name: str, text_columns: tuple[str, ...] | list[str] | None = None,
              label_column: str | None = None, num_labels: int | None = None,
              label_names: tuple[str, ...] | list[str] | None = None) -> TaskSpec:
    """A GLUE task by name (columns may be overridden), or ``"generic"`` with explicit columns.

    A generic task needs `text_columns` (one or two) and `label_column`; `num_labels` = 1 makes
    it a regression (Pearson / Spearman), otherwise it is a classification (accuracy, and F1 and
    MCC when binary). Without `num_labels` it is inferred from the training labels (`resolve_labels`).
    """
    if name not in TASK_NAMES:
        raise ConfigError(f"task {name!r} is not allowed: choose one of {', '.join(TASK_NAMES)} (generic "
                          "needs text_columns and label_column).")
    if text_columns is not None:
        text_columns = tuple(text_columns)
        if not 1 <= len(text_columns) <= 2 or not all(isinstance(c, str) and c for c in text_columns):
            raise ConfigError(f"text_columns = {text_columns!r} is not allowed: give one or two column "
                              "names.")
    if num_labels is not None and not is_count(num_labels, 1):
        raise ConfigError(f"num_labels = {num_labels!r} is not allowed: 1 (regression) or the number of "
                          "classes (>= 2).")
    labels = tuple(label_names) if label_names else ()
    if labels and num_labels is not None and num_labels != len(labels):
        raise ConfigError(f"label_names {labels!r} name {len(labels)} classes but num_labels = {num_labels}.")
    if name == GENERIC:
        if text_columns is None or not label_column:
            raise ConfigError("task 'generic' needs text_columns (one or two column names) and label_column.")
        n = num_labels if num_labels is not None else (len(labels) or 0)  # 0: infer from the data
        spec = TaskSpec(GENERIC, tuple((c,) for c in text_columns), (label_column,), n, (), (), labels)
        return _with_metrics(spec)
    spec = GLUE_TASKS[name]
    if text_columns is not None or label_column:  # named columns: the file has a header
        spec = _replace(spec, headerless=None)
    if text_columns is not None:
        if len(text_columns) != len(spec.text_columns):
            raise ConfigError(f"task {name!r} has {len(spec.text_columns)} sentence column(s); got "
                              f"text_columns = {text_columns!r}.")
        spec = _replace(spec, text_columns=tuple((c,) for c in text_columns))
    if label_column:
        spec = _replace(spec, label_columns=(label_column,))
    if num_labels is not None and num_labels != spec.num_labels:
        raise ConfigError(f"num_labels = {num_labels} is not allowed for task {name!r}: it has "
                          f"{spec.num_labels} (use task 'generic' for other label sets).")
    return spec


def _replace(spec: TaskSpec, **changes) -> TaskSpec:
    return TaskSpec(**{**spec.__dict__, **changes})


def _with_metrics(spec: TaskSpec) -> TaskSpec:
    """A generic task's metrics: Pearson and Spearman (their mean scores), or accuracy (the score),
    with F1 and MCC for two classes."""
    if spec.num_labels == 1:
        return _replace(spec, metrics=_CORR, score=_CORR)
    if spec.num_labels == 2:
        return _replace(spec, metrics=("accuracy", "f1", "mcc"), score=_ACC)
    return _replace(spec, metrics=_ACC, score=_ACC)


# -- reading files -----------------------------------------------------------------------------------------
def read_rows(path: str | Path, spec: TaskSpec | None = None) -> list[dict]:
    """Rows of a .jsonl (one JSON object a line), .tsv / .txt (tab-separated) or .csv file with a header.

    TSV is read without quote handling, as the GLUE files contain unescaped quotes. A tabular
    file whose first row names none of `spec`'s columns is read with `spec.headerless` (CoLA),
    its rows keyed by the task's first column names.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"task file {str(path)!r} does not exist.")
    suffix = path.suffix.lower()
    with path.open(encoding="utf-8-sig", newline="") as f:  # -sig: drop a BOM (GLUE's MRPC has one)
        if suffix in (".jsonl", ".json"):
            rows = []
            for i, line in enumerate(f, 1):
                if line.strip():
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as err:
                        raise ConfigError(f"{str(path)!r} line {i} is not JSON: {err}") from err
                    if not isinstance(row, dict):
                        raise ConfigError(f"{str(path)!r} line {i} is not a JSON object.")
                    rows.append(row)
        elif suffix in (".tsv", ".txt", ".csv"):
            table = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if suffix != ".csv"
                         else csv.reader(f))
            rows = _table_rows(table, spec, path)
        else:
            raise ConfigError(f"task file {str(path)!r} is not allowed: use .tsv / .txt (tab-separated with "
                              "a header line), .csv (with a header line) or .jsonl.")
    if not rows:
        raise ConfigError(f"task file {str(path)!r} holds no examples.")
    return rows


def _table_rows(table: list[list[str]], spec: TaskSpec | None, path: Path) -> list[dict]:
    """Dicts keyed by the header line, or by `spec.headerless` when the first row names no column."""
    table = [r for r in table if r]  # blank lines
    if not table:
        return []
    names = set() if spec is None else {n for c in (*spec.text_columns, spec.label_columns) for n in c}
    if spec is None or spec.headerless is None or names & set(table[0]):
        header = table[0]
        return [dict(zip(header, r, strict=False)) for r in table[1:]]
    positions, label = spec.headerless
    keys = [(c[0], i) for c, i in zip(spec.text_columns, positions, strict=True)]
    keys.append((spec.label_columns[0], label))
    width = max(i for _, i in keys) + 1
    for n, r in enumerate(table, 1):
        if len(r) < width:
            raise ConfigError(f"{str(path)!r} row {n} has {len(r)} columns; task {spec.name!r} without a "
                              f"header line reads columns {', '.join(str(i) for _, i in keys)} (from 0).")
    return [{key: r[i] for key, i in keys} for r in table]


def _column(row: dict, names: tuple[str, ...], path: Path, what: str) -> object:
    for name in names:
        if name in row:
            return row[name]
    raise ConfigError(f"{str(path)!r} has no {what} column {' or '.join(map(repr, names))}; its columns are "
                      f"{', '.join(map(repr, row))}. Name the column with text_columns / label_column.")


def read_examples(path: str | Path, spec: TaskSpec) -> tuple[list[Example], list]:
    """The sentences of every row and its raw label (string, int or float), before `resolve_labels`."""
    path = Path(path)
    examples, raw = [], []
    for row in read_rows(path, spec):
        texts = tuple(str(_column(row, names, path, "sentence")) for names in spec.text_columns)
        examples.append(Example(texts, 0))
        raw.append(_column(row, spec.label_columns, path, "label"))
    return examples, raw


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def resolve_labels(spec: TaskSpec, train_raw: list) -> TaskSpec:
    """Fix a generic task's number of labels (and names of string labels) from its training labels."""
    if spec.num_labels:
        return spec
    ints = [_as_int(v) for v in train_raw]
    if all(i is not None for i in ints):
        if min(ints) < 0:
            raise ConfigError("integer labels must be >= 0; set num_labels=1 for a regression task.")
        n = max(ints) + 1
    else:
        names = spec.label_names or tuple(sorted({str(v) for v in train_raw}))
        spec, n = _replace(spec, label_names=names), len(names)
    if n < 2:
        raise ConfigError(f"the training labels hold a single class ({train_raw[0]!r}); a classifier needs "
                          "at least two (set num_labels=1 for a regression task).")
    return _with_metrics(_replace(spec, num_labels=n))


def label_value(spec: TaskSpec, value: object, path: str | Path, index: int) -> float | int:
    """A raw label as a float (regression) or a class id in [0, num_labels)."""
    if spec.regression:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{str(path)!r} example {index}: label {value!r} is not a number "
                              f"(task {spec.name!r} is a regression).") from None
    label = _as_int(value)
    if label is None and str(value) in spec.label_names:
        label = spec.label_names.index(str(value))
    if label is None or not 0 <= label < spec.num_labels:
        names = f" or one of {', '.join(map(repr, spec.label_names))}" if spec.label_names else ""
        raise ConfigError(f"{str(path)!r} example {index}: label {value!r} is not allowed for task "
                          f"{spec.name!r}: give an integer in [0, {spec.num_labels}){names}.")
    return label


def load_task_file(path: str | Path, spec: TaskSpec) -> list[Example]:
    examples, raw = read_examples(path, spec)
    for i, (example, value) in enumerate(zip(examples, raw, strict=True)):
        example.label = label_value(spec, value, path, i)
    return examples


def compute_metrics(spec: TaskSpec, predictions: list, labels: list) -> dict[str, float]:
    """The task's metrics and its score (the GLUE leaderboard's number for the task)."""
    out = {name: METRICS[name](predictions, labels) for name in spec.metrics}
    out["score"] = sum(out[name] for name in spec.score) / len(spec.score)
    return out
