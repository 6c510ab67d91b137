"""The launch view from each launcher's variables, in the documented order of precedence."""

from __future__ import annotations

from supertune.launch.environment import expand_nodelist, export_for_torch, launch_environment, port_for_job

SLURM_STEP = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "8",
    "SLURM_NODEID": "1",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_TASKS_PER_NODE": "4(x2)",
}


def test_plain_process_is_rank_zero_of_one():
    view = launch_environment({})
    assert (view.rank, view.world_size, view.launcher, view.is_main, view.distributed) == (0, 1, "none", True, False)


def test_torchrun_variables():
    env = {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "n1",
        "MASTER_PORT": "29500",
    }
    view = launch_environment(env)
    assert view.launcher == "torchrun"
    assert (view.rank, view.local_rank, view.world_size, view.node_rank, view.num_nodes) == (3, 1, 4, 1, 2)
    assert (view.master_addr, view.master_port, view.device_index) == ("n1", 29500, 1)


def test_torchrun_wins_over_slurm_inside_a_job():
    env = dict(SLURM_STEP, RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", MASTER_ADDR="gpu07", MASTER_PORT="1234")
    view = launch_environment(env)
    assert view.launcher == "torchrun" and view.world_size == 2 and view.job_id == "4242"


def test_srun_step_gives_ranks_and_a_derived_rendezvous():
    view = launch_environment(SLURM_STEP)
    assert view.launcher == "slurm"
    assert (view.rank, view.local_rank, view.world_size, view.local_world_size) == (5, 1, 8, 4)
    assert (view.node_rank, view.num_nodes, view.master_addr) == (1, 2, "gpu07")
    assert view.master_port == port_for_job(4242) == 10000 + 4242


def test_batch_script_itself_is_not_a_rank():
    env = {k: v for k, v in SLURM_STEP.items() if k != "SLURM_STEP_ID"}
    assert launch_environment(env).launcher == "none"
    assert launch_environment(dict(env, SLURM_STEP_ID="batch")).launcher == "none"


def test_uneven_tasks_per_node():
    env = dict(SLURM_STEP, SLURM_TASKS_PER_NODE="3,2(x2)", SLURM_NODEID="2", SLURM_NTASKS="7", SLURM_JOB_NUM_NODES="3")
    assert launch_environment(env).local_world_size == 2


def test_one_visible_gpu_means_device_zero():
    assert launch_environment(dict(SLURM_STEP, CUDA_VISIBLE_DEVICES="3")).device_index == 0
    assert launch_environment(dict(SLURM_STEP, ROCR_VISIBLE_DEVICES="6")).device_index == 0
    assert launch_environment(dict(SLURM_STEP, CUDA_VISIBLE_DEVICES="0,1,2,3")).device_index == 1


def test_mpi_variables():
    env = {
        "OMPI_COMM_WORLD_RANK": "6",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "2",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    }
    view = launch_environment(env)
    assert (view.launcher, view.rank, view.local_rank, view.node_rank, view.num_nodes) == ("mpi", 6, 2, 1, 2)


def test_ports_differ_for_jobs_sharing_a_node():
    ports = {port_for_job(j) for j in range(1000, 1100)}
    assert len(ports) == 100 and all(10000 <= p < 30000 for p in ports)


def test_nodelist_expansion_with_the_hostlist_library():
    assert expand_nodelist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]


def test_export_for_torch_writes_env_init_variables():
    env: dict[str, str] = {}
    export_for_torch(launch_environment(dict(SLURM_STEP, CUDA_VISIBLE_DEVICES="1")), env)
    assert env["RANK"] == "5" and env["WORLD_SIZE"] == "8" and env["LOCAL_RANK"] == "0"
    assert env["MASTER_ADDR"] == "gpu07" and env["MASTER_PORT"] == str(port_for_job(4242))
