"""The Slurm test cluster itself (tests/cluster): real sbatch, srun, scancel and requeue, on one node
and on two emulated nodes, so that tests of supertune's Slurm support can rely on it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cluster.slurm_cluster import SlurmCluster, wait_for_text

pytestmark = pytest.mark.slurm

# One process per node; rank, world size and rendezvous come from Slurm's variables only, the way a
# job script without torchrun would set up torch.distributed.
ALLREDUCE = """\
import datetime, os, socket
import torch
import torch.distributed as dist

rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
address = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=60))
x = torch.tensor([float(rank + 1)])
dist.all_reduce(x)
print(f"rank {rank}/{world} on {socket.gethostname()}: sum {x.item():g}", flush=True)
dist.destroy_process_group()
"""


def _lines(path: Path) -> list[str]:
    return sorted(path.read_text().splitlines())


def test_wrap_job_completes_and_writes_its_output(slurm_single: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "wrap.out"
    job = slurm_single.sbatch(None, f"--output={out}", "--wrap", "echo hello from slurm")
    assert slurm_single.wait(job) == "COMPLETED"
    assert out.read_text() == "hello from slurm\n"


def test_two_tasks_run_on_one_node(slurm_single: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "tasks.out"
    script = (
        "#!/bin/bash\n#SBATCH --ntasks=2\nsrun bash -c 'echo task $SLURM_PROCID of $SLURM_NTASKS on $SLURMD_NODENAME'\n"
    )
    job = slurm_single.sbatch(script, f"--output={out}")
    assert slurm_single.wait(job) == "COMPLETED"
    node = slurm_single.nodes[0]
    assert _lines(out) == [f"task 0 of 2 on {node}", f"task 1 of 2 on {node}"]


def test_scancel_ends_a_running_job_cancelled(slurm_single: SlurmCluster) -> None:
    job = slurm_single.sbatch(None, "--output=/dev/null", "--wrap", "sleep 300")
    slurm_single.wait(job, states=("RUNNING",))
    slurm_single.scancel(job)
    assert slurm_single.wait(job) == "CANCELLED"


def test_requeue_restarts_a_running_job_and_append_keeps_both_outputs(
    slurm_single: SlurmCluster, tmp_path: Path
) -> None:
    out = tmp_path / "requeue.out"
    script = (
        "#!/bin/bash\n"
        'echo "start restart=${SLURM_RESTART_COUNT:-0}"\n'
        '[ "${SLURM_RESTART_COUNT:-0}" -eq 0 ] && sleep 300\n'
        'echo "done restart=$SLURM_RESTART_COUNT"\n'
    )
    job = slurm_single.sbatch(script, f"--output={out}", "--open-mode=append")
    wait_for_text(out, "start restart=0")
    slurm_single.requeue(job)
    # The requeued job may start again only after cred_expire (10 s) and a scheduling pass.
    assert slurm_single.wait(job, timeout=90) == "COMPLETED"
    lines = out.read_text().splitlines()
    # slurmstepd notes the requeue in the job's output, between the two runs.
    assert any("DUE TO JOB REQUEUE" in line for line in lines)
    ours = [line for line in lines if not line.startswith("slurmstepd")]
    assert ours == ["start restart=0", "start restart=1", "done restart=1"]
    assert slurm_single.job_info(job)["Restarts"] == "1"


def test_srun_on_two_nodes_runs_on_node1_and_node2(slurm_multi: SlurmCluster, tmp_path: Path) -> None:
    assert slurm_multi.nodes == ["node1", "node2"]
    out = tmp_path / "hostnames.out"
    job = slurm_multi.sbatch(None, "--nodes=2", "--ntasks-per-node=1", f"--output={out}", "--wrap", "srun hostname")
    assert slurm_multi.wait(job) == "COMPLETED"
    assert _lines(out) == ["node1", "node2"]


def test_torch_distributed_gloo_across_two_nodes(slurm_multi: SlurmCluster, tmp_path: Path) -> None:
    (tmp_path / "allreduce.py").write_text(ALLREDUCE)
    out = tmp_path / "allreduce.out"
    script = f"""#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=5
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_ADDR MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))
export TORCH_CPP_LOG_LEVEL=ERROR OMP_NUM_THREADS=1
srun {sys.executable} {tmp_path / "allreduce.py"}
"""
    job = slurm_multi.sbatch(script, f"--output={out}", f"--chdir={tmp_path}")
    state = slurm_multi.wait(job, timeout=150)
    assert state == "COMPLETED", out.read_text()
    assert _lines(out) == ["rank 0/2 on node1: sum 3", "rank 1/2 on node2: sum 3"]


# The two tests below run in this order (a file's tests run in order, on one pytest worker): the first
# leaves a running job and a queued one behind, as a test stopped by a failed assertion or a timed-out
# wait does; the second starts on an empty queue only because tests/slurm_fixtures.py cancelled them.
_LEFT_BEHIND: list[int] = []


# Like a link of a site agent's chain, the running job submits its successor when it is told to end.
_CHAIN_LINK = "trap 'sbatch --job-name=successor --cpus-per-task=2 --wrap \"sleep 600\"; exit 0' TERM; sleep 600 & wait"


def test_a_test_may_end_with_its_jobs_still_queued(slurm_single: SlurmCluster) -> None:
    # Two jobs of both CPUs each: one runs, the other waits for it.
    _LEFT_BEHIND[:] = [
        slurm_single.sbatch(None, "--cpus-per-task=2", "--wrap", wrap) for wrap in (_CHAIN_LINK, "sleep 600")
    ]
    assert slurm_single.wait(_LEFT_BEHIND[0], states=("RUNNING",)) == "RUNNING"
    assert slurm_single.job_state(_LEFT_BEHIND[1]) == "PENDING"


def test_the_next_test_starts_on_an_empty_queue(slurm_single: SlurmCluster) -> None:
    if not _LEFT_BEHIND:
        pytest.skip("runs after test_a_test_may_end_with_its_jobs_still_queued (run the file, not this test alone)")
    assert slurm_single.run("squeue", "--noheader").stdout == ""
    assert {slurm_single.job_state(job) for job in _LEFT_BEHIND} == {"CANCELLED"}
    jobs = slurm_single.run("scontrol", "-o", "show", "job").stdout.splitlines()
    successors = [line for line in jobs if "JobName=successor " in line]
    assert successors and all("JobState=CANCELLED " in line for line in successors), successors
    job = slurm_single.sbatch(None, "--cpus-per-task=2", "--wrap", "true")
    assert slurm_single.wait(job, timeout=60) == "COMPLETED"  # the node's CPUs are free again
