"""A single-node Slurm cluster for the slow tests: munged, slurmctld and slurmd of Debian's `slurm-wlm`
and `munge`, started by hand (as root) from a `slurm.conf` written into a temporary folder.

Everything the daemons write (the munge key and socket, state, spool, logs, pid files) stays in that
folder, and they listen on free ports, so the cluster touches nothing of the machine's own set-up and
two test sessions do not meet. Clients (sbatch, squeue, sacct, scancel, and submitit through them) find it
through the `SLURM_CONF` variable in `cluster.env`. Accounting is off by default: `sacct` answers that
accounting storage is disabled, as it does on many small clusters; `accounting=True` adds slurmdbd over a
MariaDB server of its own (Debian's `slurmdbd` and `mariadb-server`), data folder and port in `root` too.

    with SlurmCluster(tmp_path / "slurm") as cluster:   # skips where it cannot start (`why_not`)
        subprocess.run(["sbatch", ...], env={**os.environ, **cluster.env})
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from timeouts import patient

DAEMONS = ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd")  # the order they start in
CLIENTS = ("sbatch", "srun", "squeue", "sinfo", "scancel", "scontrol")
ACCOUNTING = ("mariadb-install-db", "mariadbd", "mariadb", "slurmdbd", "sacct")
PARTITION = "debug"
DB_USER, DB_PASS, DB_NAME = "slurm", "blocklab-test", "slurm_acct_db"


def why_not(accounting: bool = False) -> str | None:
    """Why a cluster cannot be started here (a missing program, not root), or None where it can."""
    needed = ("munged", "slurmctld", "slurmd") + CLIENTS + (ACCOUNTING if accounting else ())
    missing = [name for name in needed if shutil.which(name, path=_path()) is None]
    if missing:
        packages = "slurm-wlm munge" + (" slurmdbd mariadb-server" if accounting else "")
        return (f"Slurm{' accounting' if accounting else ''} is not installed ({', '.join(missing)} not "
                f"found): apt-get install -y {packages}")
    if os.geteuid() != 0:
        return "the single-node Slurm cluster is started by hand and needs root (slurmd runs jobs as users)"
    return None


def _path() -> str:
    """PATH with the sbin folders, where Debian puts the daemons."""
    return os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def _free_ports(names: tuple[str, ...]) -> dict[str, int]:
    """A free port of 127.0.0.1 for each name, all different: every socket stays bound until all are
    chosen (one closed before the next is bound may be handed out again)."""
    socks = [socket.socket() for _ in names]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return {name: sock.getsockname()[1] for name, sock in zip(names, socks, strict=True)}
    finally:
        for sock in socks:
            sock.close()


class SlurmCluster:
    """One node (this host, all its CPUs) in one partition, `debug`; `start` waits until it is idle."""

    def __init__(self, root: Path, accounting: bool = False, cpus: int | None = None,
                 start_timeout_s: float = 60.0):
        self.root = Path(root)
        self.accounting = accounting
        self.node = socket.gethostname().split(".")[0]  # what `hostname -s` says; slurmd names itself so
        self.cpus = cpus or os.cpu_count() or 1
        self.start_timeout_s = start_timeout_s
        self.conf = self.root / "slurm.conf"
        self.socket = self.root / "munge" / "munge.socket"
        self.env = {"SLURM_CONF": str(self.conf), "PATH": _path()}
        self._procs: dict[str, subprocess.Popen] = {}
        self._ports = _free_ports(("slurmctld", "slurmd", "slurmdbd", "mariadbd"))

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- start -------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Write the key and slurm.conf, start munged, slurmctld and slurmd, wait for the node to be idle.
        Raises RuntimeError naming the daemon and the end of its log when one does not come up."""
        for sub in ("munge", "state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        try:
            self._start_munge()
            self.conf.write_text(self.slurm_conf())
            if self.accounting:
                self._start_accounting()
            self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-f", str(self.conf)])
            self._wait(lambda: self._ok(["scontrol", "ping"], "UP"), "slurmctld")
            self._spawn("slurmd", ["slurmd", "-D", "-N", self.node, "-f", str(self.conf)])
            self._wait(self._node_idle, "slurmd")
        except BaseException:
            self.stop()
            raise

    def _start_munge(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn("munged", ["munged", "-F", "-f", f"--socket={self.socket}", f"--key-file={key}",
                               f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                               f"--seed-file={self.root / 'munge' / 'munged.seed'}",
                               f"--log-file={self.root / 'log' / 'munged.log'}"])
        self._wait(self.socket.exists, "munged")

    def slurm_conf(self) -> str:
        """The smallest slurm.conf of one node: no cgroups, accounting through slurmdbd or none, state in
        `root`; the daemons run in the foreground (-D) and log to their stderr, `root`/log/NAME.out."""
        r = self.root
        accounting = (["AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=127.0.0.1",
                       f"AccountingStoragePort={self._ports['slurmdbd']}",
                       f"AccountingStoragePass={self.socket}",  # the munge socket for slurmdbd's connections
                       "JobAcctGatherType=jobacct_gather/linux"]
                      if self.accounting else ["AccountingStorageType=accounting_storage/none",
                                               "JobAcctGatherType=jobacct_gather/none"])
        return "\n".join([
            "ClusterName=blocklabtest",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            "SlurmUser=root", "SlurmdUser=root",
            f"SlurmctldPort={self._ports['slurmctld']}", f"SlurmdPort={self._ports['slurmd']}",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}", f"SlurmdPidFile={r / 'slurmd.pid'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill", "MpiDefault=none", "SwitchType=switch/none",
            *accounting, "JobCompType=jobcomp/none",
            "ReturnToService=2", "SlurmctldTimeout=30", "SlurmdTimeout=30", "InactiveLimit=0",
            "KillWait=5", "MinJobAge=300",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN",
            f"PartitionName={PARTITION} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
            ""])

    def _start_accounting(self) -> None:
        """A MariaDB server on a free port of 127.0.0.1 with a user for slurmdbd, then slurmdbd itself;
        slurmctld registers the cluster when it starts."""
        db, port = self.root / "db", self._ports["mariadbd"]
        db_socket = self.root / "db.sock"
        subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={db}", "--user=root",
                        "--auth-root-authentication-method=normal", "--skip-test-db"],
                       check=True, capture_output=True, timeout=patient(120))
        self._spawn("mariadbd", ["mariadbd", "--no-defaults", f"--datadir={db}", "--user=root",
                                 f"--socket={db_socket}", f"--port={port}", "--bind-address=127.0.0.1",
                                 f"--pid-file={self.root / 'mariadbd.pid'}", "--skip-log-bin"])
        sql = (f"CREATE USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{DB_PASS}'; "
               f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1';")
        self._wait(lambda: subprocess.run(["mariadb", "--no-defaults", f"--socket={db_socket}", "-uroot",
                                           "-e", sql], capture_output=True).returncode == 0, "mariadbd")
        dbd_conf = self.root / "slurmdbd.conf"  # beside slurm.conf: slurmdbd finds it through SLURM_CONF
        dbd_conf.write_text("\n".join([
            "AuthType=auth/munge", f"AuthInfo=socket={self.socket}", "DbdHost=localhost",
            "DbdAddr=127.0.0.1", f"DbdPort={self._ports['slurmdbd']}", "SlurmUser=root",
            f"PidFile={self.root / 'slurmdbd.pid'}", "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1", f"StoragePort={port}", f"StorageUser={DB_USER}",
            f"StoragePass={DB_PASS}", f"StorageLoc={DB_NAME}", ""]))
        dbd_conf.chmod(0o600)  # slurmdbd refuses a file others can read: it holds the password
        self._spawn("slurmdbd", ["slurmdbd", "-D"])
        self._wait(lambda: self._ok(["sacctmgr", "-n", "show", "cluster"], ""), "slurmdbd")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.root / "log" / f"{name}.out").open("ab")
        self._procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env={**os.environ, **self.env},
                                             start_new_session=True)
        log.close()

    def _wait(self, ready, name: str) -> None:
        deadline = time.monotonic() + patient(self.start_timeout_s)
        while not ready():
            proc = self._procs[name]
            if proc.poll() is not None or time.monotonic() > deadline:
                state = f"exited with {proc.returncode}" if proc.poll() is not None else "is not ready"
                waited = patient(self.start_timeout_s)
                raise RuntimeError(f"{name} {state} after {waited:.0f} s:\n{self.logs(name)}")
            time.sleep(0.2)

    def _ok(self, argv: list[str], needle: str) -> bool:
        done = self.run(argv, check=False)
        return done.returncode == 0 and needle in done.stdout

    def _node_idle(self) -> bool:
        done = self.run(["sinfo", "-h", "-N", "-n", self.node, "-o", "%T"], check=False)
        return done.returncode == 0 and done.stdout.strip() == "idle"

    # -- use ---------------------------------------------------------------------------------------------
    def run(self, argv: list[str], check: bool = True,
            timeout: float | None = None) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster, its output as text (time limit: `timeout`,
        else patient(30))."""
        return subprocess.run(argv, env={**os.environ, **self.env}, capture_output=True, text=True,
                              check=check, timeout=patient(30) if timeout is None else timeout)

    def queue(self) -> list[str]:
        """`JOBID STATE` of every job squeue still lists."""
        return self.run(["squeue", "-h", "-o", "%i %T"]).stdout.split("\n")[:-1]

    def logs(self, *names: str, tail: int = 30) -> str:
        """The last lines of the daemons' logs (all of them by default): what to show when a test fails."""
        parts = []
        for name in names or DAEMONS:
            for path in sorted((self.root / "log").glob(f"{name}.*")):
                lines = path.read_text(errors="replace").splitlines()[-tail:]
                parts.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    # -- stop --------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Cancel every job, wait for them to leave the node, then stop slurmd, slurmctld and munged."""
        if "slurmctld" in self._procs and self._procs["slurmctld"].poll() is None:
            self.run(["scancel", "--full", "--user=root"], check=False)
            deadline = time.monotonic() + patient(20)
            while time.monotonic() < deadline and self.run(["squeue", "-h"], check=False).stdout.strip():
                time.sleep(0.5)
        for name in reversed(DAEMONS):
            proc = self._procs.pop(name, None)
            if proc is None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=patient(15))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=patient(5))
