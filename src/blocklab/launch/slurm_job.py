"""What one Slurm job runs (`RunJob`): one run trained into the shared run store, over torchrun's
processes when it has more than one, its outcome written as JSON beside the job (`launch.outcome`).

A job that reaches its time limit is requeued by submitit and its run resumes from its last checkpoint
(`RunJob` is Checkpointable). SIGTERM (`scancel`, Ctrl-C in the waiting command, which cancels the jobs
not yet finished, or a preemption) stops a job at once, between two of its steps, leaving its run's last
checkpoint for the rerun to resume from; submitit itself would ignore SIGTERM and the job would train on
until Slurm kills it (KillWait, 30 s by default).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import traceback
from typing import Any

import submitit

from blocklab.launch.failures import rerun_text
from blocklab.launch.outcome import write_outcome
from blocklab.launch.store import claim, run_lock, train_run
from blocklab.training.config import TrainConfig


class RunJob(submitit.helpers.Checkpointable):
    """What one job runs: train one run (over `procs` torchrun processes when more than one). At the time
    limit submitit requeues it with the same arguments, and the run resumes from its checkpoint. SIGTERM
    stops it between two steps (`_stop_on_sigterm`), its run's last checkpoint left for a rerun."""

    def __call__(self, config: dict[str, Any], procs: int = 1) -> dict[str, Any]:
        previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
        try:
            result = self._train(TrainConfig.from_dict(config), config, procs)
            write_outcome(result)
            return result
        except KeyboardInterrupt as err:
            rerun = rerun_text(config["out_dir"])
            print(f"blocklab job: stopped ({str(err) or 'interrupted'}); {rerun}", file=sys.stderr,
                  flush=True)
            raise SystemExit(STOPPED_CODE) from None  # no result file: Slurm's state says how it ended
        except Exception as err:
            write_outcome({"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()})
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _train(self, cfg: TrainConfig, config: dict[str, Any], procs: int) -> dict[str, Any]:
        if procs <= 1:
            outcome = train_run(cfg)
            return {"status": outcome.status, "seconds": outcome.seconds}
        with run_lock(cfg):
            if claim(cfg) == "finished":
                return {"status": "reused", "seconds": 0.0}
            start = time.perf_counter()
            proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                     f"--nproc_per_node={procs}", "-m", "blocklab.launch.worker",
                                     "--torchrun", json.dumps(config)])
            try:
                code = proc.wait()
            except KeyboardInterrupt:  # torchrun passes SIGTERM on to its processes and waits for them
                proc.terminate()
                proc.wait()
                raise
            if code:
                raise RuntimeError(f"torchrun over {procs} processes exited with code {code}")
            return {"status": "trained", "seconds": time.perf_counter() - start}


STOPPED_CODE = 143  # 128 + SIGTERM: a job stopped by a signal, without a result file


def _stop_on_sigterm(signum: int, _frame: Any) -> None:
    """SIGTERM in a job: stop as Ctrl-C does. submitit's own handler only logs it ("Bypassing signal
    SIGTERM"), waiting for its time-limit signal (USR2), so a cancelled job would train on until Slurm
    kills it; a run's checkpoints are written atomically, so stopping at any moment leaves the last one."""
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}: scancel, the launching command's Ctrl-C "
                            "or a preemption")
