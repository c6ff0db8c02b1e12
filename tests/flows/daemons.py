"""Real servers for the cluster-path tests, started here and stopped by their PIDs, also when a test fails:
a throwaway PostgreSQL (its own data directory and port), and Prefect and MLflow servers on it.

Debian's packages provide them (scripts/setup.sh installs them when it runs as root). Where they are
missing a test skips with one line naming the packages, unless $SPECCAP_REQUIRE_DAEMONS is set (CI
sets it), where it fails: there they must run."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

REQUIRE_ENV = "SPECCAP_REQUIRE_DAEMONS"


def missing(what: str, packages: str) -> None:
    """Skip (or, where the daemons are required, fail) naming what to install."""
    message = f"{what} not found: install Debian's {packages} (scripts/setup.sh does, as root)"
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(message)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(ready, procs: list[subprocess.Popen], what: str, log: Path | None, timeout: float = 60.0) -> None:
    """Poll `ready()` until it holds; a process of `procs` that exits, or the timeout, fails naming
    `what` with the end of its log."""
    deadline = time.monotonic() + timeout
    while not ready():
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
            raise RuntimeError(f"{what} did not start (exit {[p.poll() for p in procs]}); {log}:\n{tail}")
        time.sleep(0.3)


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
        return True
    except OSError:
        return False


def wait_http(url: str, proc: subprocess.Popen, what: str, log: Path, timeout: float = 120.0) -> None:
    wait_until(lambda: _answers(url), [proc], what, log, timeout)


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
    """Stop one process we started, by its PID: `sig`, then SIGKILL if it does not go."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


def _postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    return Path(found[-1]).parent if found else None


def _as_postgres_user() -> list[str]:
    """PostgreSQL refuses to run as root: as root, run its programs as the `postgres` user the Debian
    package creates (setpriv execs, so the PID we hold is the server's own)."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"]


@contextlib.contextmanager
def postgres(databases: tuple[str, ...] = ("mlflow", "prefect")):
    """A PostgreSQL server on a free loopback port with `databases` created; yields
    {name: "postgresql://speccap@127.0.0.1:PORT/name"}. Its data directory is removed afterwards."""
    bindir = _postgres_bin()
    if bindir is None:
        missing("PostgreSQL", "postgresql")
    import psycopg
    data = Path(tempfile.mkdtemp(prefix="speccap-pg-"))  # /tmp: the postgres user can reach it
    user = _as_postgres_user()
    if user:
        pw = pwd.getpwnam("postgres")
        os.chown(data, pw.pw_uid, pw.pw_gid)
    port = free_port()
    server = None
    try:
        subprocess.run([*user, str(bindir / "initdb"), "-D", str(data / "db"), "-U", "speccap", "-A", "trust",
                        "-E", "UTF8", "--no-sync"], check=True, capture_output=True, timeout=120)
        server = subprocess.Popen([*user, str(bindir / "postgres"), "-D", str(data / "db"), "-p", str(port),
                                   "-k", str(data), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        def accepts() -> bool:
            try:
                psycopg.connect(host="127.0.0.1", port=port, user="speccap", dbname="postgres").close()
                return True
            except psycopg.OperationalError:
                return False
        wait_until(accepts, [server], "PostgreSQL", None)
        conn = psycopg.connect(host="127.0.0.1", port=port, user="speccap", dbname="postgres", autocommit=True)
        with conn:
            for name in databases:
                conn.execute(f"CREATE DATABASE {name}")
        yield {name: f"postgresql://speccap@127.0.0.1:{port}/{name}" for name in databases}
    finally:
        if server is not None:
            stop(server, signal.SIGINT)  # PostgreSQL's fast shutdown
        shutil.rmtree(data, ignore_errors=True)


@contextlib.contextmanager
def mlflow_server(backend_uri: str, artifacts: Path):
    """`mlflow server` on a free loopback port over `backend_uri`; yields its URL."""
    port = free_port()
    env = os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    env.pop("MLFLOW_TRACKING_URI", None)
    log = artifacts.parent / f"mlflow-server-{port}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                                 "--workers", "1", "--backend-store-uri", backend_uri,
                                 "--artifacts-destination", str(artifacts)],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", proc, "MLflow server", log)
        yield url
    finally:
        stop(proc)


@contextlib.contextmanager
def prefect_server(database_url: str, home: Path):
    """`prefect server start` on a free loopback port with its database at `database_url` (a
    postgresql+asyncpg:// or sqlite+aiosqlite:// URL); yields its API URL."""
    port = free_port()
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    # its UI asks for the API where this says (else at 127.0.0.1:4200, where nothing is)
    env |= {"PREFECT_HOME": str(home), "PREFECT_API_DATABASE_CONNECTION_URL": database_url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1",
            "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api"}
    log = home / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                                 str(port)], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        api = f"http://127.0.0.1:{port}/api"
        wait_http(f"{api}/health", proc, "Prefect server", log, timeout=180)
        yield api
    finally:
        stop(proc)


@contextlib.contextmanager
def slurm_cluster(cpus: int | None = None, memory_mb: int | None = None):
    """A one-node Slurm cluster on this machine: munged, slurmctld and slurmd (as root, the packages'
    own user otherwise being absent here) from a generated slurm.conf with the machine's CPUs and
    memory, on free ports, everything in a temporary folder. Yields the folder's slurm.conf path
    (clients find it through $SLURM_CONF, which the caller sets); `sacct --completion` reads the
    finished jobs from its job-completion file."""
    # daemons live in /usr/sbin, which a non-login PATH may lack
    bins = {prog: shutil.which(prog) or str(Path("/usr/sbin", prog)) for prog in ("munged", "slurmctld", "slurmd")}
    for prog, path in bins.items():
        if not Path(path).exists():
            missing(f"{prog} (Slurm)", "slurm-wlm and munge")
    if os.geteuid() != 0:
        pytest.skip("a Slurm cluster of our own needs root (slurmd runs jobs as their users)")
    import psutil
    cpus = cpus or os.cpu_count()
    memory_mb = memory_mb or int(psutil.virtual_memory().total / 2**20 * 0.8)
    d = Path(tempfile.mkdtemp(prefix="speccap-slurm-"))
    for sub in ("state", "spool", "logs"):
        (d / sub).mkdir()
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    sock = d / "munge.socket"
    conf = d / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=speccap", "SlurmctldHost=localhost(127.0.0.1)", "SlurmUser=root", "SlurmdUser=root",
        f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}", "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={sock}", f"StateSaveLocation={d / 'state'}", f"SlurmdSpoolDir={d / 'spool'}",
        f"SlurmctldPidFile={d / 'slurmctld.pid'}", f"SlurmdPidFile={d / 'slurmd.pid'}",
        f"SlurmctldLogFile={d / 'logs' / 'slurmctld.log'}", f"SlurmdLogFile={d / 'logs' / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none", "ReturnToService=2",
        "SchedulerType=sched/backfill", "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU_Memory",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/filetxt", f"JobCompLoc={d / 'jobcomp.txt'}", "KillWait=5", "MinJobAge=5",
        f"NodeName=speccap-node NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""]))
    env = os.environ | {"SLURM_CONF": str(conf)}
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen([bins["munged"], "-F", "--force", f"--key-file={key}", f"--socket={sock}",
                                       f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'logs' / 'munged.log'}",
                                       f"--seed-file={d / 'munge.seed'}"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_until(sock.exists, procs, "munged", d / "logs" / "munged.log")
        procs.append(subprocess.Popen([bins["slurmctld"], "-D", "-i", "-f", str(conf)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        procs.append(subprocess.Popen([bins["slurmd"], "-D", "-f", str(conf), "-N", "speccap-node"], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        def node_idle() -> bool:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, timeout=10)
            return out.stdout.strip() == "idle"
        wait_until(node_idle, procs, "slurmd", d / "logs" / "slurmd.log")
        yield conf
    finally:
        for p in reversed(procs):
            stop(p)
        shutil.rmtree(d, ignore_errors=True)

