"""The launch flags that `blocklab compare` and `blocklab reproduce` share, and the launcher they build."""

from __future__ import annotations

import argparse
from pathlib import Path

from blocklab.launch.plan import parse_jobs
from blocklab.util.errors import ConfigError

JOBS_HELP = ("runs at once (default auto: on CPU one per core, the cores split between them, no more than "
             "the free memory holds; on CUDA one per visible GPU). With --launcher slurm: the most jobs "
             "running at once (auto: as many as Slurm grants)")


def _jobs(text: str) -> int | str:
    try:
        return parse_jobs(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("launching the runs (docs/launch.md)")
    g.add_argument("--jobs", type=_jobs, default="auto", help=JOBS_HELP)
    g.add_argument("--launcher", choices=("local", "slurm"), default="local",
                   help="local (default): worker processes on this machine; slurm: one Slurm job per run "
                   "through submitit (pip install 'blocklab[slurm]')")
    g.add_argument("--no-wait", action="store_true",
                   help="with --launcher slurm: submit and return; the same command later waits for the jobs "
                   "still running, reuses the finished runs and writes the report")
    g.add_argument("--slurm-config", metavar="YAML", help="Slurm settings: a YAML file whose slurm: section "
                   "sets any of partition, account, gpus_per_run, cpus_per_run, mem_gb, time_min, sbatch, "
                   "setup, procs_per_run, folder, signal_delay_s (the time-limit signal this many seconds "
                   "before the limit; default 90), max_requeues (how often a job cut off at its limit is "
                   "requeued; default 3), poll_s (seconds between looks at the jobs; default 10), "
                   "cluster (slurm, or local: the same jobs on this machine) (the flags below win); jobs "
                   "run this Python by its absolute path, which must exist on the nodes (docs/launch.md)")
    g.add_argument("--partition", help="Slurm partition of every job")
    g.add_argument("--account", help="Slurm account charged for every job")
    g.add_argument("--gpus-per-run", type=int, help="GPUs per run's job (several: torchrun inside the job, "
                   "DDP, or FSDP2 with parallel=fsdp)")
    g.add_argument("--cpus-per-run", type=int, help="CPUs per run's job, also its threads (default 1)")
    g.add_argument("--mem-gb", type=float, help="memory per run's job, GB")
    g.add_argument("--time-limit", help="time limit per job: minutes, HH:MM:SS or D-HH:MM:SS (default 4 "
                   "hours); a run cut off there is requeued and resumes from its checkpoint")
    g.add_argument("--sbatch", action="append", metavar="KEY=VALUE", default=[],
                   help="another sbatch option for every job, e.g. --sbatch qos=high --sbatch "
                   "constraint=a100")


def launcher_from_args(args: argparse.Namespace, out: str | Path):
    """The launcher that `args` asks for; Slurm's files go to OUT/slurm unless the settings say where."""
    from blocklab.launch.local import LocalLauncher

    slurm_flags = ("partition", "account", "gpus_per_run", "cpus_per_run", "mem_gb", "time_limit")
    if args.launcher == "local":
        given = [f for f in slurm_flags if getattr(args, f) is not None]
        if args.no_wait or args.slurm_config or args.sbatch or given:
            raise ConfigError("--no-wait, --slurm-config, --sbatch and the Slurm settings (--partition, "
                              "--account, --gpus-per-run, --cpus-per-run, --mem-gb, --time-limit) need "
                              "--launcher slurm.")
        return LocalLauncher(jobs=args.jobs, threads=args.threads)
    try:
        from blocklab.launch.slurm import SlurmLauncher, SlurmSettings
    except ImportError:
        raise ConfigError("--launcher slurm needs submitit: pip install 'blocklab[slurm]'.") from None
    sbatch = {}
    for item in args.sbatch:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--sbatch {item!r} is not allowed: give KEY=VALUE, e.g. qos=high.")
        sbatch[key.strip().lstrip("-")] = value
    settings = SlurmSettings.load(
        args.slurm_config, partition=args.partition, account=args.account, gpus_per_run=args.gpus_per_run,
        cpus_per_run=args.cpus_per_run, mem_gb=args.mem_gb, time_min=args.time_limit)
    settings.sbatch = {**settings.sbatch, **sbatch}
    if settings.folder is None:
        settings.folder = str(Path(out) / "slurm")
    jobs = None if args.jobs == "auto" else int(args.jobs)
    return SlurmLauncher(settings, jobs=jobs, wait=not args.no_wait)
