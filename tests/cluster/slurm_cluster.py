"""Drive the Slurm test cluster of tests/cluster (start.sh, stop.sh) and its client commands."""

from __future__ import annotations

import os
import pwd
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

HERE = Path(__file__).resolve().parent
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
# States after which a job does not run again unless someone requeues it.
TERMINAL_STATES = frozenset({*FINAL_STATES, "BOOT_FAIL", "DEADLINE", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"})
# Variables that steer Slurm's clients: inherited from an outer Slurm job or a user's shell, they
# would point sbatch and srun at a job or options that do not exist in the test cluster.
_CLIENT_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_", "SINFO_", "SCANCEL_")
# `scontrol -o show job` prints `Key=value` pairs separated by spaces; a value may itself
# contain '=' (TRES=cpu=1,node=1) and, rarely, spaces, so a value runs up to the next ` Key=`.
_PAIR = re.compile(r"(\S+?)=(.*?)(?= \S+?=|$)")


class SlurmError(RuntimeError):
    """A Slurm command or the cluster scripts failed; the message carries their output."""


class SlurmCluster:
    """One test cluster: `start(mode, state_dir)`, submit and watch jobs, `stop()`."""

    def __init__(self) -> None:
        self.mode: str | None = None
        self.state_dir: Path | None = None
        self.nodes: list[str] = []
        self._exports: dict[str, str] = {}

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self, mode: str, state_dir: Path | str, timeout: float = 180.0) -> None:
        """Start a `single` or `multi` cluster under state_dir; raises SlurmError with the logs."""
        self.mode, self.state_dir = mode, Path(state_dir).resolve()
        proc = subprocess.run(
            ["bash", str(HERE / "start.sh"), mode, str(self.state_dir)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise SlurmError(f"tests/cluster/start.sh {mode} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        self._exports = _read_exports(self.state_dir / "env.sh")
        self.nodes = self._exports["SUPERTUNE_SLURM_NODES"].split()

    def stop(self) -> None:
        """Stop everything start() started; safe to call twice or after a failed start."""
        if self.state_dir is None:
            return
        proc = subprocess.run(
            ["bash", str(HERE / "stop.sh"), str(self.state_dir)], capture_output=True, text=True, timeout=120
        )
        self._exports, self.nodes = {}, []
        if proc.returncode != 0:
            raise SlurmError(f"tests/cluster/stop.sh failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return bool(self._exports)

    @property
    def env(self) -> dict[str, str]:
        """Environment for a client command or a job: this cluster's SLURM_CONF, and a PATH that
        finds Slurm's tools and, first, this Python's scripts (so `python` in a job is this one)."""
        if not self._exports:
            raise SlurmError("the Slurm test cluster is not running")
        env = {k: v for k, v in os.environ.items() if not k.startswith(_CLIENT_PREFIXES)}
        env.update(self._exports)
        path = [str(Path(sys.executable).parent), *env.get("PATH", "").split(os.pathsep), "/usr/bin", "/usr/sbin"]
        env["PATH"] = os.pathsep.join(dict.fromkeys(p for p in path if p))
        return env

    # ---- commands -------------------------------------------------------------------------

    def run(
        self,
        *cmd: str,
        cwd: Path | str | None = None,
        input: str | None = None,
        timeout: float = 60.0,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run a client command (sbatch, srun, scontrol, ...) against this cluster."""
        proc = subprocess.run(
            list(cmd),
            cwd=cwd or self._job_dir(),
            env=self.env,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise SlurmError(f"{shlex.join(cmd)} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
        return proc

    def sbatch(self, script: str | Path | None, *args: str, cwd: Path | str | None = None) -> int:
        """Submit a job and return its id. `script` is a path (Path, or a str not starting with
        "#!"), the text of a script (a str starting with "#!"), or None with `--wrap` in args.
        Options go in args; without --chdir the job runs in cwd (default STATE_DIR/jobs)."""
        cmd, text = ["sbatch", "--parsable", *args], None
        if isinstance(script, str) and script.startswith("#!"):
            text = script  # sbatch reads the script from stdin when no file is named
        elif script is not None:
            cmd.append(str(script))
        out = self.run(*cmd, cwd=cwd, input=text).stdout.strip()
        return int(out.split(";")[0])  # --parsable prints "id" or "id;cluster"

    def job_info(self, job_id: int) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, RestartCnt, NodeList, StdOut, ...)."""
        line = self.run("scontrol", "-o", "show", "job", str(job_id)).stdout.strip()
        return {m.group(1): m.group(2) for m in _PAIR.finditer(line)}

    def job_state(self, job_id: int) -> str:
        return self.job_info(job_id)["JobState"]

    def wait(self, job_id: int, states: Iterable[str] = FINAL_STATES, timeout: float = 60.0) -> str:
        """Poll until the job is in one of `states` and return it. Raises SlurmError when the job
        ends in another state, TimeoutError (with the job and the logs) after `timeout` s."""
        wanted = frozenset(states)
        deadline = time.monotonic() + timeout
        while True:
            info = self.job_info(job_id)
            state = info["JobState"]
            if state in wanted:
                return state
            if state in TERMINAL_STATES:
                raise SlurmError(f"job {job_id} ended {state}, expected {sorted(wanted)}: {info}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"job {job_id} still {state} after {timeout:.0f} s, expected {sorted(wanted)}: {info}\n"
                    + self.log_tail()
                )
            time.sleep(0.2)

    def scancel(self, job_id: int, *args: str) -> None:
        self.run("scancel", *args, str(job_id))

    def requeue(self, job_id: int) -> None:
        self.run("scontrol", "requeue", str(job_id))

    def cancel_all(self, timeout: float = 120.0) -> list[str]:
        """Cancel every job of this cluster (they are all the tests') and wait until Slurm lists none,
        the ending ones (COMPLETING) included, so that nothing left by one test holds a node that the
        next test's jobs would wait for. Returns the ids there were; raises SlurmError when some are
        still listed after `timeout` s (a job Slurm cannot end: the daemons' logs say why)."""
        listed = self.run("squeue", "--noheader", "--format=%i").stdout.split()
        if not listed:
            return []
        user = pwd.getpwuid(os.getuid()).pw_name
        deadline = time.monotonic() + timeout
        # Again while any is listed: a job that submits its successor (a site agent's chain of links)
        # may do so while it is being cancelled.
        while left := self.run("squeue", "--noheader", "--format=%i %T").stdout.strip():
            if time.monotonic() > deadline:
                raise SlurmError(f"jobs still listed {timeout:.0f} s after scancel:\n{left}\n{self.log_tail()}")
            self.run("scancel", f"--user={user}")
            time.sleep(0.5)
        return listed

    def log_tail(self, lines: int = 15) -> str:
        """The end of each daemon log, for failure messages."""
        if self.state_dir is None:
            return ""
        parts = []
        for log in sorted((self.state_dir / "log").glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log}\n" + "\n".join(tail))
        return "\n".join(parts)

    def _job_dir(self) -> Path:
        assert self.state_dir is not None
        path = self.state_dir / "jobs"
        path.mkdir(exist_ok=True)
        return path


def wait_for_text(path: Path, text: str, timeout: float = 30.0) -> str:
    """Wait until a job's output file contains `text`; return the file's contents."""
    deadline = time.monotonic() + timeout
    while True:
        content = path.read_text(errors="replace") if path.exists() else ""
        if text in content:
            return content
        if time.monotonic() > deadline:
            raise TimeoutError(f"{text!r} not in {path} after {timeout:.0f} s; it holds: {content[-2000:]!r}")
        time.sleep(0.1)


def _read_exports(env_file: Path) -> dict[str, str]:
    """The `export KEY='value'` lines that start.sh writes to STATE_DIR/env.sh."""
    exports = {}
    for line in env_file.read_text().splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export ") :].partition("=")
            exports[key] = shlex.split(value)[0] if value else ""
    return exports
