"""Runs on this machine: one at a time in this process, or N at once, each in a worker process.

A worker (`python -m blocklab.launch.worker`) trains one run and reports its progress as JSON lines on
its stdout; everything else it prints, a traceback included, goes to the run's log. On CPU the cores
are split between the workers (`threads` each, cores // N by default), on CUDA each worker sees one
GPU (CUDA_VISIBLE_DEVICES, round-robin over the visible ones). A worker that fails is recorded against
its log and its slot goes to the next run. On Ctrl-C (or SIGTERM) every worker is told to stop (its
stdin closes, as when this process dies, even by kill -9) and waited for; one still alive after
`STOP_GRACE_S` is killed. A run's checkpoints and its summary.json are written atomically, so a worker
stopped at any moment leaves a run that the same command resumes.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from blocklab.launch.plan import (
    Launch,
    Todo,
    available_cores,
    failure,
    resolve_jobs,
    result_line,
    reuse_finished,
)
from blocklab.launch.progress import RunsProgress
from blocklab.launch.store import Outcome, log_path, prepare_once, train_run

STOP_GRACE_S = 30.0


def _visible_gpus(configs: list[tuple[Any, Any]]) -> list[str]:
    """The GPUs the runs would use (none when they train on the CPU), as CUDA_VISIBLE_DEVICES ids."""
    if not any(cfg.device in ("auto", "cuda") for _, cfg in configs):
        return []
    import torch

    if not torch.cuda.is_available():
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in visible.split(",") if d.strip()] if visible else []
    return ids[: torch.cuda.device_count()] or [str(k) for k in range(torch.cuda.device_count())]


@dataclass
class LocalLauncher:
    """`jobs` runs at once (an integer, or "auto": `plan.resolve_jobs`); `threads` CPU threads per run
    when several train at once (None: the cores split evenly between them)."""

    jobs: int | str = 1
    threads: int | None = None
    name = "local"

    def train(self, configs: list[tuple[Any, Any]], log=print) -> Launch:
        outcomes, todo = reuse_finished(configs, log)
        gpus = _visible_gpus([(None, t.cfg) for t in todo])
        jobs = resolve_jobs(self.jobs, len(todo), self.threads, len(gpus)) if todo else 1
        if jobs > 1 or self.threads:
            threads = self.threads or max(1, available_cores() // jobs)
            configs = [(e, c.replace(threads=c.threads or threads)) for e, c in configs]
            for t in todo:
                t.cfg = configs[t.index][1]
        if jobs > 1:
            prepare_once([t.cfg for t in todo])
        with RunsProgress(len(todo), enabled=any(cfg.progress for _, cfg in configs)) as line:
            if jobs == 1:
                done = _train_here(todo, line, log)
            else:
                done = _train_in_workers(todo, jobs, gpus, line, log)
        for t, outcome in zip(todo, done, strict=True):
            outcomes[t.index] = outcome
        return Launch(configs, [o for o in outcomes if o is not None], jobs=jobs,
                      threads=configs[0][1].threads if configs else None)


def _train_here(todo: list[Todo], line: RunsProgress, log) -> list[Outcome]:
    """One run after another in this process; a run that raises is recorded, with its traceback in its
    log, and the next one starts. Ctrl-C stops them all."""
    outcomes = []
    for t in todo:
        line.write(t.line(t.verb), log)
        tracker = line.begin(t.name, t.name)
        try:
            outcome = train_run(t.cfg, tracker)
        except Exception as err:  # noqa: BLE001 - any error is this run's: the others go on
            path = log_path(t.cfg)
            with open(path, "a") as handle:
                handle.write(f"== {_now()} training {t.cfg.out_dir} in the launching process\n")
                traceback.print_exc(file=handle)
            outcome = failure(t.cfg, f"{type(err).__name__}: {err}")
        line.end(t.name)
        line.write(t.line(result_line(outcome)), log)
        outcomes.append(outcome)
    return outcomes


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


class _Worker:
    """One worker process training one run, and what it has said so far."""

    def __init__(self, todo: Todo, gpu: str | None, slot: int, line: RunsProgress, events: queue.Queue):
        self.todo, self.slot = todo, slot
        self.tracker = line.begin(todo.name, todo.name)
        self.done: dict[str, Any] | None = None
        self.error: str | None = None
        cfg = todo.cfg
        self.log = log_path(cfg)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        with open(self.log, "a") as handle:
            handle.write(f"== {_now()} training {cfg.out_dir} in a worker process (threads {cfg.threads}"
                         + (f", CUDA_VISIBLE_DEVICES={gpu}" if gpu is not None else "") + ")\n")
            handle.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "blocklab.launch.worker", json.dumps(cfg.to_dict())],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=handle, env=env, text=True)
        threading.Thread(target=self._read, args=(events,), daemon=True).start()

    def _read(self, events: queue.Queue) -> None:
        assert self.proc.stdout is not None
        for text in self.proc.stdout:
            try:
                events.put((self, json.loads(text)))
            except ValueError:  # not a message: nothing else is written there, but never stop reading
                continue
        events.put((self, None))

    def hear(self, message: dict[str, Any], line: RunsProgress, log) -> None:
        """A message from the worker."""
        event = message["event"]
        if event == "skip":
            self.tracker.skip(message["done"])
        elif event == "advance":
            self.tracker.advance(message["fraction"], message.get("status", ""))
        elif event == "waiting":
            line.write(self.todo.line("another process is training it; waiting for it to end"), log)
        elif event == "done":
            self.done = message
        elif event == "error":
            self.error = message["error"]

    def outcome(self) -> Outcome:
        code = self.proc.wait()
        if self.done is not None and code == 0:
            return Outcome(self.todo.cfg, self.done["status"], self.done.get("seconds", 0.0))
        if self.error is None:
            self.error = (f"the worker was killed by signal {-code}" if code < 0 else
                          f"the worker exited with code {code}")
        return failure(self.todo.cfg, self.error)

    def stop(self) -> None:
        """Ask the worker to stop: it stops when its stdin closes (`worker.watch_parent`)."""
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()


def _train_in_workers(todo: list[Todo], jobs: int, gpus: list[str], line: RunsProgress, log
                      ) -> list[Outcome]:
    """The runs of `todo` in up to `jobs` worker processes at once, in order; their outcomes."""
    events: queue.Queue = queue.Queue()
    waiting = list(todo)
    running: dict[int, _Worker] = {}  # by slot: a GPU stays with one worker at a time
    outcomes: dict[int, Outcome] = {}
    previous = _sigterm_as_interrupt()
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                t = waiting.pop(0)
                slot = min(set(range(jobs)) - running.keys())
                gpu = gpus[slot % len(gpus)] if gpus else None
                where = f" on GPU {gpu}" if gpu is not None else ""
                line.write(t.line(f"{t.verb} in a worker{where}"), log)
                running[slot] = _Worker(t, gpu, slot, line, events)
            worker, message = _next_event(events)
            if message is not None:
                worker.hear(message, line, log)
                continue
            outcome = outcomes[worker.todo.index] = worker.outcome()  # the worker ended
            del running[worker.slot]
            line.end(worker.todo.name)
            line.write(worker.todo.line(result_line(outcome)), log)
    except BaseException:
        _stop_all(list(running.values()))
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return [outcomes[t.index] for t in todo]


# How often the waiting main thread wakes: a signal (SIGTERM from `kill` or a scheduler) is handled by
# Python only in the main thread, and the kernel may deliver it to a reader thread instead, leaving a
# main thread blocked in a queue's lock asleep until a worker next writes (a minute, at times).
WAKE_S = 0.2


def _next_event(events: queue.Queue) -> tuple[Any, Any]:
    """The next (worker, message), waking every WAKE_S so that a pending signal's handler runs."""
    while True:
        try:
            return events.get(timeout=WAKE_S)
        except queue.Empty:
            continue


def _stop_all(workers: list[_Worker]) -> None:
    """Stop every worker and wait for it; kill one still alive after STOP_GRACE_S."""
    import time

    for worker in workers:
        worker.stop()
    deadline = time.monotonic() + STOP_GRACE_S
    for worker in workers:
        try:
            worker.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.proc.kill()
            worker.proc.wait()


def _sigterm_as_interrupt():
    """SIGTERM (a scheduler's, `kill`'s) stops the workers as Ctrl-C does; the previous handler back."""
    def interrupt(signum, _frame):
        raise KeyboardInterrupt(f"stopped by signal {signum}; rerun the same command: finished runs are "
                                "reused and unfinished ones resume")
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set one
        return None
    return signal.signal(signal.SIGTERM, interrupt)

