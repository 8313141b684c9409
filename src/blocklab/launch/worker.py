"""A worker process: `python -m blocklab.launch.worker CONFIG_JSON` trains one run of a launch.

Its stdout is the channel to the launching process (one JSON message per line: "skip", "advance",
"waiting", then "done" or "error"); everything else the run prints goes to stderr, which the launcher
points at the run's log. The worker stops as after Ctrl-C when its stdin closes, which happens when
the launcher stops it or dies in any way, so no worker outlives its launcher by more than a step.

`python -m blocklab.launch.worker --torchrun CONFIG_JSON` is one process of a run that torchrun
launches over several devices (a cluster job's): the run was claimed before, so every process
only trains (resuming when the run has a checkpoint), and reports nothing.
"""

from __future__ import annotations

import _thread
import json
import os
import sys
import threading
import time
from typing import IO


class PipeProgress:
    """The Trainer's `overall`: its progress sent to the launcher, at most every `every` seconds."""

    def __init__(self, send, every: float = 0.5) -> None:
        self.send, self.every, self.last = send, every, 0.0

    def skip(self, done: float) -> None:
        self.send(event="skip", done=done)

    def advance(self, fraction: float, status: str = "") -> None:
        now = time.monotonic()
        if now - self.last >= self.every or fraction >= 1.0:
            self.last = now
            self.send(event="advance", fraction=fraction, status=status)


def watch_parent(grace_s: float = 60.0) -> None:
    """Stop this process as Ctrl-C would once stdin closes (the launcher stopped us or died); if the
    run has not stopped `grace_s` later (stuck in one long operation), exit at once."""
    def watch() -> None:
        while os.read(0, 1 << 16):  # the raw descriptor: sys.stdin's lock would hang the shutdown
            pass
        _thread.interrupt_main()
        time.sleep(grace_s)
        os._exit(130)

    threading.Thread(target=watch, daemon=True).start()


def _channel() -> IO[str]:
    """This process's stdout as the message channel; fd 1 itself then points at stderr (the log), so
    that whatever else writes to stdout, C libraries included, lands in the log."""
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return channel


def main(argv: list[str]) -> int:
    from blocklab.launch.store import train_claimed, train_run
    from blocklab.training.config import TrainConfig

    if argv[:1] == ["--torchrun"]:
        cfg = TrainConfig.from_dict(json.loads(argv[1]))
        from blocklab.training.checkpoint import latest_checkpoint

        train_claimed(cfg, latest_checkpoint(cfg.out_dir) is not None)
        return 0
    channel = _channel()

    def send(**message) -> None:
        channel.write(json.dumps(message) + "\n")

    cfg = TrainConfig.from_dict(json.loads(argv[0]))
    watch_parent()
    try:
        outcome = train_run(cfg, PipeProgress(send), on_wait=lambda: send(event="waiting"))
    except KeyboardInterrupt:
        print("blocklab worker: stopped; the run resumes from its last checkpoint", file=sys.stderr)
        send(event="error", error="stopped before it finished (interrupted)")
        return 130
    except BaseException as err:  # noqa: BLE001 - every failure is reported, with its traceback in the log
        import traceback

        traceback.print_exc()
        send(event="error", error=f"{type(err).__name__}: {err}")
        return 1
    send(event="done", status=outcome.status, seconds=outcome.seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
