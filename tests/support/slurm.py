"""A real Slurm on this one host for tests/slurm: Debian's slurmctld and two slurmd "nodes" (n1,
n2) with four fake GPUs each (character devices, so Slurm sets CUDA_VISIBLE_DEVICES per step),
as /work/shared/notes/slurm.md found to work. Its config, spool and pid files live in a
directory of the test session's (SLURM_CONF points the clients at it); munge keeps its system
key and socket. Needs root; started by the session, stopped by its pid files."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scancel", "squeue", "sinfo")
FAKE_GPUS = Path("/dev/fakegpu")
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
NODES = ("n1", "n2")
GPUS_PER_NODE = 4


def missing() -> list[str]:
    return [name for name in DAEMONS if shutil.which(name) is None]


def config(root: Path, host: str) -> str:
    return "\n".join([
        "ClusterName=fleetgen-test", f"SlurmctldHost={host}", "AuthType=auth/munge",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SlurmUser=root",
        f"SlurmctldPidFile={root}/slurmctld.pid", f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmdSpoolDir={root}/spool/%n", f"StateSaveLocation={root}/state",
        f"SlurmctldLogFile={root}/slurmctld.log", f"SlurmdLogFile={root}/slurmd-%n.log",
        "SchedulerType=sched/backfill", "SelectType=select/cons_tres", "ReturnToService=2",
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
        "GresTypes=gpu", "KillWait=30", "MinJobAge=30",
        *(f"NodeName={n} NodeHostname={host} Port={6818 + 10 * i} CPUs=2 RealMemory=4000 "
          f"Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN" for i, n in enumerate(NODES)),
        f"PartitionName=main Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP",
        ""])


def gres(root: Path) -> str:
    lines = [f"NodeName={n} Name=gpu File={FAKE_GPUS}/nvidia[{i * GPUS_PER_NODE}-"
             f"{(i + 1) * GPUS_PER_NODE - 1}]" for i, n in enumerate(NODES)]
    return "\n".join(lines) + "\n"


class Slurm:
    """The controller and both nodes; `env` is what a client command needs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                              timeout=timeout_s)

    def start(self) -> None:
        host = socket.gethostname()
        for sub in ("state", *(f"spool/{n}" for n in NODES)):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(config(self.root, host))
        (self.root / "gres.conf").write_text(gres(self.root))
        _fake_gpus()
        _munge()
        subprocess.run(["slurmctld", "-f", str(self.conf)], env=self.env, check=True,
                       timeout=60)
        for node in NODES:
            subprocess.run(["slurmd", "-f", str(self.conf), "-N", node], env=self.env,
                           check=True, timeout=60)
        self.wait_idle(60)

    def wait_idle(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        states = ""
        while time.monotonic() < deadline:
            states = self.run("sinfo", "-h", "-N", "-o", "%N %t").stdout
            if states.split() and all(line.split()[1] == "idle"
                                      for line in states.strip().splitlines()):
                return
            time.sleep(0.5)  # the poll of a condition with a deadline
        raise AssertionError(f"Slurm nodes not idle after {timeout_s} s: {states!r}\n"
                             f"{self.log_tail()}")

    def log_tail(self) -> str:
        logs = [self.root / "slurmctld.log", *(self.root / f"slurmd-{n}.log" for n in NODES)]
        return "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text().splitlines()[-15:])
                         for p in logs if p.exists())

    def stop(self) -> None:
        self.run("scancel", "--user", "root")
        for pid_file in [*(self.root / f"slurmd-{n}.pid" for n in NODES),
                         self.root / "slurmctld.pid"]:
            try:
                os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
            except (OSError, ValueError):
                continue


def _fake_gpus() -> None:
    """Devices like /dev/null (c 1 3): Slurm counts them as GPUs and sets their indexes."""
    FAKE_GPUS.mkdir(parents=True, exist_ok=True)
    for i in range(len(NODES) * GPUS_PER_NODE):
        device = FAKE_GPUS / f"nvidia{i}"
        if not device.exists():
            os.mknod(device, 0o666 | 0o020000, os.makedev(1, 3))


def _munge() -> None:
    """munged with the system key (made once); left running, as any host's munge is."""
    if MUNGE_SOCKET.exists() and subprocess.run(
            ["munge", "-n"], capture_output=True, timeout=10).returncode == 0:
        return
    MUNGE_KEY.parent.mkdir(parents=True, exist_ok=True)
    if not MUNGE_KEY.exists() or MUNGE_KEY.stat().st_size < 32:
        MUNGE_KEY.write_bytes(os.urandom(1024))
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    shutil.chown(MUNGE_KEY, "munge", "munge")
    MUNGE_KEY.chmod(0o400)
    for d in (MUNGE_KEY.parent, Path("/run/munge")):
        shutil.chown(d, "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", "munged", "--force"], check=True,
                   timeout=30)
