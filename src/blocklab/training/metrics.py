"""`metrics.jsonl` (one JSON object per line) and, optionally, TensorBoard.

Training lines: ``{"kind": "train", "step", "tokens", "loss", "lr", "grad_norm", "tokens_per_s",
"wall_time", "scalars": {name: [floats]}}``; validation lines: ``{"kind": "val", "step", "tokens",
"wall_time", "val_loss", "val_bpb", "val_tokens", "val_bytes"}`` (``tokens`` and ``wall_time`` as in
training lines: trained so far; ``val_bpb`` divides by the UTF-8 bytes of the ``val_tokens`` target
tokens scored, ``val_bytes``). Scalar names are the names of the trainable gains without their
``.gain`` suffix (``blocks.0.attn.alpha`` per head, ``blocks.2.attn.values.coef`` for BoV's gamma_v).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

from blocklab.model.gains import is_gain


def learned_scalars(model: nn.Module) -> dict[str, list[float]]:
    """Every trainable gain (SAS alpha/beta/gamma, beta_FF, ResFormer lambda, BoV gamma_v, ...)."""
    out = {}
    for name, param in model.named_parameters():
        if is_gain(name):
            full = param.full_tensor() if hasattr(param, "full_tensor") else param  # FSDP DTensor
            out[name.removesuffix(".gain")] = [round(v, 6) for v in full.detach().float().cpu().tolist()]
    return out


def read_metrics(path: str | Path, kind: str | None = None) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file, one JSON object a line (blank lines are skipped), only those
    of `kind` ("train", "val") if given. A missing file is a FileNotFoundError and a damaged line a
    ValueError, each naming the file (and the line)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path}")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n} is not a JSON object: {e}") from e
    return [r for r in rows if kind is None or r.get("kind") == kind]


class MetricsLogger:
    """Appends to metrics.jsonl; on resume, drops lines past the resumed step so the log stays one curve."""

    def __init__(self, run_dir: Path, resume_step: int | None = None, tensorboard: bool = False):
        self.path = Path(run_dir) / "metrics.jsonl"
        if resume_step is None:
            self.path.write_text("")
        elif self.path.exists():
            keep = [r for r in read_metrics(self.path) if r["step"] <= resume_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in keep))
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise ImportError("tensorboard=True needs the tensorboard package: "
                                  "pip install 'blocklab[tensorboard]'") from err
            self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def log(self, row: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self.writer is not None:
            for key, value in row.items():
                if isinstance(value, (int, float)) and key not in ("step", "kind"):
                    self.writer.add_scalar(f"{row['kind']}/{key}", value, row["step"])
            for name, values in row.get("scalars", {}).items():
                for i, v in enumerate(values):
                    self.writer.add_scalar(f"scalars/{name}/{i}", v, row["step"])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
