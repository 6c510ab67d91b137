"""`supertune doctor --comm`: real process groups over gloo, under torchrun (--nproc) and as a job
step starts it (two processes with srun's variables), with small messages to stay quick."""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys

import pytest

from supertune.doctor.comm import CommResult, Measurement, bandwidths, bus_factor, comm_check, message_sizes

SMALL = ["--min-size", "16K", "--max-size", "256K", "--repeats", "3", "--warmup", "1"]
SIZES = [16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10]


def _clean_env(**extra: str) -> dict[str, str]:
    launch = (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "NCCL_", "GLOO_", "OMPI_", "PMI_")) and k not in launch
    }
    return {**env, **extra}


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_bus_bandwidth_formulas():
    assert bus_factor("all_reduce", 2) == 1.0 and bus_factor("all_gather", 2) == 0.5
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75) and bus_factor("all_gather", 8) == pytest.approx(0.875)
    algbw, busbw = bandwidths("all_reduce", 2**30, 0.1, 4)
    assert algbw == pytest.approx(2**30 / 0.1 / 1e9) and busbw == pytest.approx(algbw * 1.5)
    assert message_sizes(1 << 20, 1 << 30) == [1 << s for s in range(20, 31)]


def test_expectation_compares_the_largest_size_of_each_collective():
    def m(op, size, busbw):
        return Measurement(op, size, 1.0, (1.0,), busbw, busbw)

    result = CommResult("nccl", "cuda:0", 16, 2, 2, 5, expect_gbps=40.0)
    result.measurements = [
        m("all_reduce", 1 << 20, 5.0),
        m("all_reduce", 1 << 30, 80.0),
        m("all_gather", 1 << 30, 30.0),
    ]
    check = comm_check(result)
    assert (
        check.verdict == "fail"
        and "all_gather 30 GB/s" in check.evidence
        and "all_reduce 80" not in check.evidence.split("below")[1]
    )
    result.expect_gbps = 25.0
    assert comm_check(result).verdict == "ok"


def test_comm_over_two_local_gloo_processes():
    proc = subprocess.run(
        [sys.executable, "-m", "supertune", "doctor", "--comm", "--nproc", "2", "--json", *SMALL],
        capture_output=True, text=True, timeout=180, env=_clean_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    comm = doc["comm"]
    assert (comm["backend"], comm["device"], comm["world_size"], comm["error"]) == ("gloo", "cpu", 2, None)
    assert (
        doc["launcher"] == "torchrun" and doc["checks"][-1]["name"] == "comm" and doc["checks"][-1]["verdict"] == "ok"
    )
    n = comm["world_size"]
    for op in ("all_reduce", "all_gather"):
        rows = [m for m in comm["measurements"] if m["op"] == op]
        assert [m["size_bytes"] for m in rows] == SIZES  # bus bandwidth for every size
        for m in rows:
            assert len(m["times_s"]) == 3 and m["time_s"] == statistics.median(m["times_s"]) > 0
            algbw = m["size_bytes"] / m["time_s"] / 1e9
            factor = 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n
            assert m["algbw_gbps"] == pytest.approx(algbw, rel=1e-12)
            assert m["busbw_gbps"] == pytest.approx(algbw * factor, rel=1e-12)
    assert comm["headline_busbw_gbps"]["all_gather"] == comm["measurements"][-1]["busbw_gbps"]


def test_expect_gbps_above_loopback_fails_with_the_reason():
    proc = subprocess.run(
        [sys.executable, "-m", "supertune", "doctor", "--comm", "--nproc", "2", "--expect-gbps", "1000000", *SMALL],
        capture_output=True, text=True, timeout=180, env=_clean_env(),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FAIL  comm" in proc.stdout and "below --expect-gbps 1e+06" in proc.stdout
    assert "all_reduce   256 KiB" in proc.stdout  # the table is printed with the verdict
    assert "-> FAIL (exit 1)" in proc.stdout


def test_worker_as_a_job_step_runs_it(tmp_path):
    """Two processes started the way srun starts them (SLURM_* variables only, no torchrun): both
    exit 1 below --expect-gbps, rank 0 prints the report and writes it to --out."""
    port = _free_port()
    report = tmp_path / "doctor.json"
    procs = []
    for rank in (0, 1):
        env = _clean_env(
            SLURM_JOB_ID="4242", SLURM_STEP_ID="0", SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank), SLURM_NTASKS="2",
            SLURM_NODEID="0", SLURM_JOB_NUM_NODES="1", SLURM_JOB_NODELIST="localhost", SLURM_TASKS_PER_NODE="2",
            MASTER_PORT=port, HF_HUB_OFFLINE="1",
        )  # fmt: skip
        argv = [
            sys.executable,
            "-m",
            "supertune.entry",
            "doctor-worker",
            "--comm",
            "--expect-gbps",
            "1000000",
            "--out",
            str(report),
            *SMALL,
        ]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outputs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [1, 1], outputs
    rank0, rank1 = outputs
    assert "rank 0 of 2 (slurm)" in rank0[0] and "below --expect-gbps" in rank0[0]
    assert rank1[0] == ""  # one report per job, from rank 0
    doc = json.loads(report.read_text())
    assert doc["exit_code"] == 1 and doc["launcher"] == "slurm" and doc["checks"][-1]["verdict"] == "fail"
    assert [c["name"] for c in doc["checks"] if c["verdict"] == "ok"][:1] == ["python"]


def test_a_failed_check_on_another_process_stops_the_measurement():
    """Rank 1's run directory cannot take a file (/proc): both exit 1 without measuring, and rank 0's
    report shows rank 1's failure with its fix."""
    port, procs = _free_port(), []
    for rank, run_dir in ((0, "/tmp"), (1, "/proc/supertune-run")):
        env = _clean_env(
            SLURM_JOB_ID="4243", SLURM_STEP_ID="0", SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank), SLURM_NTASKS="2",
            SLURM_NODEID="0", SLURM_JOB_NUM_NODES="1", SLURM_JOB_NODELIST="localhost", MASTER_PORT=port,
            HF_HUB_OFFLINE="1", SUPERTUNE_RUN_DIR=run_dir,
        )  # fmt: skip
        argv = [sys.executable, "-m", "supertune.entry", "doctor-worker", "--comm", "--json", *SMALL]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outputs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [1, 1], outputs
    doc = json.loads(outputs[0][0])
    assert doc["comm"]["measurements"] == [] and "not measured" in doc["comm"]["error"]
    [other] = [e for e in doc["elsewhere"] if e["name"] == "scratch"]
    assert (
        other["verdict"] == "fail"
        and other["ranks"] == [1]
        and "/proc/supertune-run: NOT writable" in other["evidence"]
    )
    assert "--run-dir" in other["fix"]
