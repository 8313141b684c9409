"""What a wandb run wrote, read back from its record file (``run-<id>.wandb``) for the tests.

wandb 0.31 ships no Python reader of its own (its writer is the Go core), so this reads the format:
a 7-byte header (":W&B", magic 0xBEE1, version 0), then LevelDB's log format, blocks of 32 KiB holding
records of a 7-byte header (CRC-32 of the type byte and the data, little-endian; length; type FULL=1,
FIRST=2, MIDDLE=3, LAST=4) and their data, each whole record a protobuf `wandb_internal_pb2.Record`.
Every checksum is verified, so a misread file fails loudly rather than giving no rows.
"""

from __future__ import annotations

import json
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from timeouts import patient

BLOCK = 32768
HEADER = 7


def _payloads(data: bytes) -> list[bytes]:
    ident, magic, version = struct.unpack("<4sHB", data[:HEADER])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    out, pending, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's trailer: too short for a record header
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:  # zero padding
            continue
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc, f"bad checksum at byte {pos}"
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            out.append(pending + chunk)
    return out


@dataclass
class WandbRun:
    """One record file: the run's id, project, name, group and config, and its history rows."""

    id: str = ""
    project: str = ""
    name: str = ""
    group: str = ""
    job_type: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)  # each with "_step"
    exit_code: int | None = None


def read_wandb_file(path: Path) -> WandbRun:
    from wandb.proto import wandb_internal_pb2 as pb

    run = WandbRun()
    for payload in _payloads(Path(path).read_bytes()):
        record = pb.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            run.id, run.project, run.name, run.group, run.job_type = (r.run_id, r.project, r.display_name,
                                                                       r.run_group, r.job_type)
            run.config.update(_items(r.config.update))
        elif kind == "config":
            run.config.update(_items(record.config.update))
        elif kind == "history":
            run.history.append(_items(record.history.item))
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def _items(items) -> dict[str, Any]:
    return {"/".join(i.nested_key) if i.nested_key else i.key: json.loads(i.value_json) for i in items}


def wandb_runs(folder: Path, wait_s: float = 60.0) -> list[WandbRun]:
    """Every record file under `folder` (a run's, or a comparison's), oldest first, each read once it
    holds its exit record: wandb's core process may still be writing the file's last block for a moment
    after `run.finish()` returned (seen on a loaded machine), so a file without one is read again."""
    runs = []
    for path in sorted(Path(folder).rglob("run-*.wandb"), key=lambda p: p.parent.name):
        deadline = time.monotonic() + patient(wait_s)
        run = read_wandb_file(path)
        while run.exit_code is None and time.monotonic() < deadline:
            time.sleep(0.2)
            run = read_wandb_file(path)
        runs.append(run)
    return runs


def scalar_rows(runs: list[WandbRun]) -> list[tuple[int, str, float]]:
    """(step, name, value) of every scalar the runs' history holds, wandb's own keys (_step, _runtime,
    _timestamp) left out, in the order written."""
    return [(row["_step"], key, value) for run in runs for row in run.history for key, value in row.items()
            if not key.startswith("_")]
