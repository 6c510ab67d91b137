"""`supertune doctor`: every check against crafted environments (variables, interface lists, torch
facts, GPU allocations), real read-only and full file systems, and the command end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from supertune.doctor import CHECK_NAMES
from supertune.doctor.gpus import bf16_support, check_gpu_visibility, check_gpus, check_nccl
from supertune.doctor.job import check_rendezvous, check_slurm
from supertune.doctor.nccl_settings import check_nccl_debug, check_nccl_ib_hca
from supertune.doctor.network import (
    check_fabric,
    check_gloo_socket_ifname,
    check_nccl_socket_ifname,
    find_net_plugins,
    nccl_socket_interfaces,
    parse_ifname_list,
)
from supertune.doctor.options import (
    DoctorOptions,
    add_doctor_arguments,
    options_from_args,
    parse_size,
    preflight_arguments,
)
from supertune.doctor.probe import GpuDevice, GpuHardware, IbPort, NetInterface, TorchFacts, read_interfaces
from supertune.doctor.report import format_text, merge_elsewhere, report_document
from supertune.doctor.result import CheckResult
from supertune.doctor.software import check_packages, check_python, check_torch_build
from supertune.doctor.storage import (
    check_free_space,
    check_hf_cache,
    check_offline,
    check_scratch,
    check_tmpdir,
    hf_paths,
)
from supertune.launch.environment import launch_environment, slurm_allocation

# --- crafted nodes -------------------------------------------------------------------------------

LO = NetInterface("lo", ("127.0.0.1", "::1"), "loopback", "unknown")
ETH0 = NetInterface("eth0", ("10.1.0.5",), "ethernet", "up")
ETH1_BARE = NetInterface("eth1", (), "ethernet", "down")
IB0 = NetInterface("ib0", ("10.2.0.5",), "infiniband", "up")
HSN0 = NetInterface("hsn0", ("10.3.0.5",), "ethernet", "up")
DOCKER = NetInterface("docker0", ("172.17.0.1",), "ethernet", "up")
GPU_NODE = [LO, ETH0, ETH1_BARE, IB0, DOCKER]

CPU_TORCH = TorchFacts(version="2.13.0+cpu")
H100 = GpuDevice(0, "NVIDIA H100 80GB HBM3", 80 * 2**30, (9, 0))
V100 = GpuDevice(0, "Tesla V100-SXM2-32GB", 32 * 2**30, (7, 0))
CUDA_TORCH = TorchFacts(
    version="2.13.0+cu128", cuda="12.8", device_count=1, gpus=(H100,), nccl=True, nccl_version="2.27.5"
)
MI250 = GpuDevice(0, "AMD Instinct MI250X", 64 * 2**30, (9, 0), "gfx90a:sramecc+:xnack-")
ROCM_TORCH = TorchFacts(
    version="2.13.0+rocm6.4", hip="6.4.43482", device_count=1, gpus=(MI250,), nccl=True, nccl_version="2.22.3"
)
NVIDIA_NODE = GpuHardware(
    nvidia_devices=("/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia3"), nvidia_driver="550.54.15"
)
AMD_NODE = GpuHardware(amd_gpus=8, amd_driver="6.8.5")
NO_GPU = GpuHardware()

GPU_JOB = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "4", "SLURM_JOB_GPUS": "0,1,2,3"}


def _resolver(table):
    def resolve(name):
        if name not in table:
            raise OSError(f"[Errno -2] Name or service not known: {name}")
        return table[name]

    return resolve


# --- NCCL's interface lists -----------------------------------------------------------------------


def test_ifname_lists_read_as_nccl_reads_them():
    assert parse_ifname_list("eth").matches("eth0") and parse_ifname_list("eth").matches("eth10")
    assert not parse_ifname_list("eth").matches("ib0")
    exact = parse_ifname_list("=eth0,ib0")
    assert exact.exact and exact.matches("eth0") and exact.matches("ib0") and not exact.matches("eth01")
    excluded = parse_ifname_list("^docker,lo")
    assert (
        excluded.exclude and excluded.matches("eth0") and not excluded.matches("docker0") and not excluded.matches("lo")
    )
    both = parse_ifname_list("^=eth0")
    assert both.exclude and both.exact and not both.matches("eth0") and both.matches("eth01")
    ports = parse_ifname_list("mlx5_0:1,mlx5_1")
    assert ports.matches("mlx5_0", 1) and not ports.matches("mlx5_0", 2) and ports.matches("mlx5_1", 2)
    assert not parse_ifname_list("^").matches("eth0")  # an empty list excluded: nothing is left


def test_nccl_default_order_prefers_infiniband_then_skips_docker_and_loopback():
    assert [i.name for i in nccl_socket_interfaces(None, GPU_NODE)] == ["ib0"]
    assert [i.name for i in nccl_socket_interfaces(None, [LO, ETH0, DOCKER])] == ["eth0"]
    assert [i.name for i in nccl_socket_interfaces(None, [LO])] == ["lo"]
    # Interfaces without an address are never used, even when named.
    assert nccl_socket_interfaces("eth1", GPU_NODE) == []


def test_nccl_socket_ifname_that_matches_nothing_fails_with_a_suggestion():
    result = check_nccl_socket_ifname({"NCCL_SOCKET_IFNAME": "hsn"}, GPU_NODE, num_nodes=2, nccl_used=True)
    assert result.verdict == "fail"
    assert "NCCL_SOCKET_IFNAME=hsn matches no usable interface" in result.evidence
    assert "lo, eth0, eth1 (no address), ib0, docker0" in result.evidence
    assert "NCCL_SOCKET_IFNAME=ib0" in result.fix and "unset it" in result.fix


def test_nccl_exact_name_is_not_a_prefix():
    assert check_nccl_socket_ifname({"NCCL_SOCKET_IFNAME": "=eth"}, GPU_NODE, 2, True).verdict == "fail"
    ok = check_nccl_socket_ifname({"NCCL_SOCKET_IFNAME": "=eth0"}, GPU_NODE, 2, True)
    assert ok.verdict == "ok" and "eth0 (10.1.0.5)" in ok.evidence


def test_nccl_prefix_matching_only_an_interface_without_address_fails():
    result = check_nccl_socket_ifname({"NCCL_SOCKET_IFNAME": "=eth1"}, GPU_NODE, 2, True)
    assert result.verdict == "fail" and "eth1 match but have no IP address" in result.evidence


def test_nccl_exclusion_that_leaves_loopback_fails_across_nodes_only():
    env = {"NCCL_SOCKET_IFNAME": "^eth,ib,docker"}
    assert check_nccl_socket_ifname(env, GPU_NODE, 2, True).verdict == "fail"
    assert "only loopback" in check_nccl_socket_ifname(env, GPU_NODE, 2, True).evidence
    assert check_nccl_socket_ifname(env, GPU_NODE, 1, True).verdict == "ok"


def test_nccl_socket_ifname_unset_or_unused():
    result = check_nccl_socket_ifname({}, GPU_NODE, 2, True)
    assert result.verdict == "ok" and "NCCL uses ib0" in result.evidence
    assert check_nccl_socket_ifname({}, GPU_NODE, 2, nccl_used=False).verdict == "n/a"
    # Set but NCCL unused (a CPU node): still reported, as a warning.
    assert check_nccl_socket_ifname({"NCCL_SOCKET_IFNAME": "hsn"}, GPU_NODE, 2, nccl_used=False).verdict == "warn"
    short = check_nccl_socket_ifname({"NCCL_SOCKET_IFNAME": "e"}, GPU_NODE, 2, True)
    assert short.verdict == "warn" and "NCCL ignores it" in short.evidence


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("^all", "excludes 'all', which is no interface of this node"),
        (",,", "names no interface at all (an empty list)"),
        ("ib0,ethh", "names 'ethh', which is no interface of this node"),
        ("^dokcer,lo", "excludes 'dokcer', which is no interface of this node"),
        ("=eth0,=ib0", "names '=ib0', which is no interface of this node"),
    ],
)
def test_nccl_socket_ifname_naming_no_interface_warns(value, said):
    """A list entry that names no interface of the node (a typo, another site's name, an empty list)
    selects nothing and excludes nothing: NCCL runs on what is left, without a word."""
    result = check_nccl_socket_ifname({"NCCL_SOCKET_IFNAME": value}, GPU_NODE, 1, nccl_used=True)
    assert result.verdict == "warn", result
    assert result.evidence.startswith(f"NCCL_SOCKET_IFNAME={value!r} {said}")
    assert (
        "interfaces: lo, eth0, eth1 (no address), ib0, docker0" in result.evidence and "NCCL uses " in result.evidence
    )
    assert "NCCL_SOCKET_IFNAME=ib0" in result.fix and "unset it" in result.fix


def test_nccl_socket_ifname_naming_only_the_nodes_interfaces_is_ok():
    for value in ("ib", "ib0,eth0", "^docker,lo", "=ib0,eth0", "^=docker0,lo"):
        assert check_nccl_socket_ifname({"NCCL_SOCKET_IFNAME": value}, GPU_NODE, 2, True).verdict == "ok", value


def test_gloo_socket_ifname_takes_exact_names():
    resolve = _resolver({"node1": ["10.1.0.5"]})
    prefix = check_gloo_socket_ifname({"GLOO_SOCKET_IFNAME": "eth"}, GPU_NODE, "node1", resolve, 2)
    assert prefix.verdict == "fail" and "no interface eth" in prefix.evidence and "exact names" in prefix.evidence
    assert "GLOO_SOCKET_IFNAME=ib0" in prefix.fix
    bare = check_gloo_socket_ifname({"GLOO_SOCKET_IFNAME": "eth1"}, GPU_NODE, "node1", resolve, 2)
    assert bare.verdict == "fail" and "has no IP address" in bare.evidence
    good = check_gloo_socket_ifname({"GLOO_SOCKET_IFNAME": "eth0,ib0"}, GPU_NODE, "node1", resolve, 2)
    assert good.verdict == "ok" and "eth0 (10.1.0.5), ib0 (10.2.0.5)" in good.evidence


def test_gloo_unset_binds_to_what_the_host_name_resolves_to():
    assert check_gloo_socket_ifname({}, GPU_NODE, "node1", _resolver({"node1": ["10.1.0.5"]}), 2).verdict == "ok"
    loopback = _resolver({"node1": ["127.0.1.1"]})
    across = check_gloo_socket_ifname({}, GPU_NODE, "node1", loopback, 2)
    assert across.verdict == "fail" and "127.0.1.1" in across.evidence and "GLOO_SOCKET_IFNAME=ib0" in across.fix
    assert check_gloo_socket_ifname({}, GPU_NODE, "node1", loopback, 1).verdict == "ok"
    unresolved = check_gloo_socket_ifname({}, GPU_NODE, "node1", _resolver({}), 2)
    assert unresolved.verdict == "fail" and "does not resolve" in unresolved.evidence


def test_read_interfaces_finds_loopback_with_its_address():
    found = {i.name: i for i in read_interfaces()}
    assert "127.0.0.1" in found["lo"].addresses and found["lo"].kind == "loopback"


# --- fabric ---------------------------------------------------------------------------------------

ACTIVE = IbPort("mlx5_0", 1, "ACTIVE", "InfiniBand", "200 Gb/sec (4X HDR)")


def test_fabric_is_not_applicable_without_gpus():
    assert check_fabric([ACTIVE], [], GPU_NODE, {}, [], CPU_TORCH).verdict == "n/a"


def test_fabric_infiniband_and_the_settings_that_turn_it_off():
    assert check_fabric([ACTIVE], [], GPU_NODE, {}, [], CUDA_TORCH).verdict == "ok"
    disabled = check_fabric([ACTIVE], [], GPU_NODE, {"NCCL_IB_DISABLE": "1"}, [], CUDA_TORCH)
    assert disabled.verdict == "warn" and "TCP sockets" in disabled.evidence and "unset NCCL_IB_DISABLE" in disabled.fix
    wrong = check_fabric([ACTIVE], [], GPU_NODE, {"NCCL_IB_HCA": "=mlx5_1"}, [], CUDA_TORCH)
    assert wrong.verdict == "fail" and "NCCL_IB_HCA=mlx5_0" in wrong.fix
    assert check_fabric([ACTIVE], [], GPU_NODE, {"NCCL_IB_HCA": "mlx5_0:1"}, [], CUDA_TORCH).verdict == "ok"
    down = check_fabric([IbPort("mlx5_0", 1, "DOWN")], [], GPU_NODE, {}, [], CUDA_TORCH)
    assert down.verdict == "warn" and "no ACTIVE port" in down.evidence


def test_fabric_slingshot_needs_the_network_plugin(tmp_path):
    assert find_net_plugins({"LD_LIBRARY_PATH": str(tmp_path)}, extra_dirs=()) == []
    missing = check_fabric([], ["cxi0"], [LO, HSN0], {}, [], ROCM_TORCH)
    assert missing.verdict == "warn" and "aws-ofi" in missing.fix
    (tmp_path / "librccl-net.so").write_bytes(b"")
    plugins = find_net_plugins({"LD_LIBRARY_PATH": f"/nonexistent:{tmp_path}"}, extra_dirs=())
    assert plugins == [str(tmp_path / "librccl-net.so")]
    assert check_fabric([], ["cxi0"], [LO, HSN0], {}, plugins, ROCM_TORCH).verdict == "ok"


def test_nccl_ib_hca_naming_no_device_warns():
    env = {"NCCL_IB_HCA": "mlx5_0"}
    assert check_nccl_ib_hca({}, [ACTIVE]).verdict == "n/a"
    none = check_nccl_ib_hca(env, [])
    assert none.verdict == "warn"
    assert none.evidence.startswith(
        "NCCL_IB_HCA='mlx5_0' names RDMA devices, but this node has none (/sys/class/infiniband"
    )
    assert "unset it" in none.fix
    two = [ACTIVE, IbPort("mlx5_1", 1, "ACTIVE")]
    typo = check_nccl_ib_hca({"NCCL_IB_HCA": "mlx5_0,mxl5_1"}, two)
    assert typo.verdict == "warn"
    assert typo.evidence == (
        "NCCL_IB_HCA='mlx5_0,mxl5_1' names 'mxl5_1', which is no device (port) of this node; devices: "
        "mlx5_0:1 (ACTIVE), mlx5_1:1 (ACTIVE): NCCL uses mlx5_0:1"
    )
    assert "NCCL_IB_HCA=mlx5_0" in typo.fix
    port = check_nccl_ib_hca({"NCCL_IB_HCA": "mlx5_0:2"}, two)
    assert port.verdict == "warn" and "names 'mlx5_0:2'" in port.evidence and "uses TCP sockets" in port.evidence
    excluded = check_nccl_ib_hca({"NCCL_IB_HCA": "^mlx5"}, two)
    assert excluded.verdict == "warn" and "excludes every device of this node" in excluded.evidence
    assert check_nccl_ib_hca({"NCCL_IB_HCA": ",,"}, two).verdict == "warn"
    good = check_nccl_ib_hca({"NCCL_IB_HCA": "=mlx5_1:1"}, two)
    assert good.verdict == "ok" and good.evidence == "NCCL_IB_HCA==mlx5_1:1: NCCL uses mlx5_1:1"


def test_read_ib_ports_of_a_node_without_infiniband(tmp_path):
    """No /sys/class/infiniband (a node without RDMA devices) reads as no port, which the check names."""
    from supertune.doctor.probe import read_ib_ports

    assert read_ib_ports(tmp_path / "infiniband") == []
    port = tmp_path / "infiniband" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    assert read_ib_ports(tmp_path / "infiniband") == [IbPort("mlx5_0", 1, "ACTIVE", "InfiniBand", "")]


def test_nccl_debug_is_one_of_the_levels():
    assert check_nccl_debug({}, CUDA_TORCH).verdict == "n/a"
    for value in ("INFO", "warn", "Version", "TRACE"):
        assert check_nccl_debug({"NCCL_DEBUG": value}, CPU_TORCH).verdict == "ok", value
    for value in ("VERBOSE", "1", "", "INFO,WARN"):
        result = check_nccl_debug({"NCCL_DEBUG": value}, CUDA_TORCH)
        assert result.verdict == "warn", value
        assert result.evidence == (
            f"NCCL_DEBUG={value!r} is not one of NCCL's levels (VERSION, WARN, INFO, TRACE): NCCL ignores it and prints nothing"
        )
        assert "NCCL_DEBUG=INFO" in result.fix and "unset it" in result.fix
    # RCCL documents two more.
    assert check_nccl_debug({"NCCL_DEBUG": "ERROR"}, ROCM_TORCH).verdict == "ok"
    assert check_nccl_debug({"NCCL_DEBUG": "ERROR"}, CUDA_TORCH).verdict == "warn"


# --- GPUs -----------------------------------------------------------------------------------------


def test_cpu_build_with_allocated_gpus_is_refused():
    result = check_gpu_visibility(CPU_TORCH, NO_GPU, slurm_allocation(GPU_JOB), {})
    assert result.verdict == "fail"
    assert "job 4242 has 4 GPU(s)" in result.evidence and "CPU build cannot use GPUs" in result.evidence
    assert "SUPERTUNE_TORCH=auto bash scripts/env.sh" in result.fix


def test_wrong_vendor_builds_are_refused():
    cuda_on_amd = check_gpu_visibility(TorchFacts(version="2.13.0+cu128", cuda="12.8"), AMD_NODE, None, {})
    assert cuda_on_amd.verdict == "fail" and "CUDA build on an AMD (ROCm) node" in cuda_on_amd.evidence
    assert "whl/rocm" in cuda_on_amd.fix
    rocm_on_nvidia = check_gpu_visibility(TorchFacts(version="2.13.0+rocm6.4", hip="6.4"), NVIDIA_NODE, None, {})
    assert (
        rocm_on_nvidia.verdict == "fail"
        and "whl/cu" in rocm_on_nvidia.fix
        and "PyPI's own 'torch==2.13.0'" in rocm_on_nvidia.fix
    )


def test_right_build_that_sees_no_gpu_gives_torchs_reason():
    old_driver = TorchFacts(
        version="2.13.0+cu128", cuda="12.8", device_error="The NVIDIA driver on your system is too old"
    )
    result = check_gpu_visibility(old_driver, NVIDIA_NODE, None, {})
    assert result.verdict == "fail" and "driver on your system is too old" in result.evidence


def test_visible_devices_variables_hide_or_narrow():
    hidden = check_gpu_visibility(CUDA_TORCH, NVIDIA_NODE, slurm_allocation(GPU_JOB), {"CUDA_VISIBLE_DEVICES": ""})
    assert hidden.verdict == "fail" and "hides them all" in hidden.fix + hidden.evidence
    one_per_task = check_gpu_visibility(
        CUDA_TORCH, NVIDIA_NODE, slurm_allocation(GPU_JOB), {"CUDA_VISIBLE_DEVICES": "2"}
    )
    assert one_per_task.verdict == "ok"
    fewer = check_gpu_visibility(CUDA_TORCH, NVIDIA_NODE, slurm_allocation(GPU_JOB), {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert fewer.verdict == "warn" and "sees 1" in fewer.evidence


def test_gpu_visibility_not_applicable_on_a_cpu_node():
    assert check_gpu_visibility(CPU_TORCH, NO_GPU, None, {}).verdict == "n/a"
    assert check_gpu_visibility(CPU_TORCH, NO_GPU, slurm_allocation({"SLURM_JOB_ID": "1"}), {}).verdict == "n/a"


def test_bf16_from_compute_capability_and_from_the_rocm_architecture():
    assert bf16_support(H100, CUDA_TORCH)[0] and not bf16_support(V100, CUDA_TORCH)[0]
    assert bf16_support(MI250, ROCM_TORCH) == (True, "gfx90a")
    assert not bf16_support(
        GpuDevice(0, "AMD Instinct MI50", 32 * 2**30, (9, 0), "gfx906:sramecc+:xnack-"), ROCM_TORCH
    )[0]
    rocm = check_gpus(ROCM_TORCH)
    assert rocm.verdict == "ok" and "bf16 yes" in rocm.evidence and "torch.version.cuda is None" in rocm.evidence
    old = check_gpus(TorchFacts(version="2.13.0+cu128", cuda="12.8", device_count=1, gpus=(V100,)))
    assert old.verdict == "warn" and "bf16 no" in old.evidence and "training.fp16=true" in old.fix
    h100 = check_gpus(CUDA_TORCH)
    assert "NVIDIA H100 80GB HBM3, 80.0 GiB, compute capability 9.0, bf16 yes" in h100.evidence
    assert check_gpus(CPU_TORCH).verdict == "n/a"


def test_nccl_check():
    assert check_nccl(CPU_TORCH, {}).verdict == "n/a"
    assert "RCCL 2.22.3" in check_nccl(ROCM_TORCH, {}).evidence
    slow = check_nccl(CUDA_TORCH, {"NCCL_P2P_DISABLE": "1", "NCCL_DEBUG": "INFO"})
    assert slow.verdict == "warn" and "NCCL_DEBUG=INFO" in slow.evidence and "unset NCCL_P2P_DISABLE" in slow.fix
    no_nccl = TorchFacts(version="2.13.0+cu128", cuda="12.8", device_count=1, gpus=(H100,), nccl=False)
    assert check_nccl(no_nccl, {}).verdict == "fail"


# --- software -------------------------------------------------------------------------------------

PINS = {"torch": "2.13.0", "transformers": "5.23.0", "accelerate": "1.15.0", "peft": "0.21.2", "deepspeed": "0.19.8"}


def test_packages_against_the_pins():
    installed = {
        "torch": "2.13.0+cu128",
        "transformers": "5.23.0",
        "accelerate": "1.15.0",
        "peft": "0.21.2",
        "deepspeed": None,
    }
    result = check_packages(installed, PINS)
    assert result.verdict == "ok" and "deepspeed not installed" in result.evidence
    differ = check_packages(dict(installed, transformers="5.1.0"), PINS)
    assert differ.verdict == "warn" and "pip install 'transformers==5.23.0'" in differ.fix
    missing = check_packages(dict(installed, torch=None), PINS)
    assert missing.verdict == "fail" and "not installed: torch" in missing.evidence


def test_torch_build_against_the_driver():
    old = check_torch_build(CUDA_TORCH, GpuHardware(nvidia_devices=("/dev/nvidia0",), nvidia_driver="470.57.02"))
    assert old.verdict == "fail" and "needs an NVIDIA driver 525" in old.evidence and "CUDA 11.x" in old.fix
    assert check_torch_build(CUDA_TORCH, NVIDIA_NODE).verdict == "ok"
    broken = check_torch_build(TorchFacts(version=None, import_error="OSError: libcudnn.so.9: cannot open"), NO_GPU)
    assert broken.verdict == "fail" and "libcudnn" in broken.evidence
    assert check_python((3, 10, 12), "/usr/bin/python3").verdict == "fail"


# --- the job --------------------------------------------------------------------------------------


def test_slurm_allocation_counts_gpus_from_any_variable():
    assert slurm_allocation({}) is None
    assert slurm_allocation({"SLURM_JOB_ID": "1", "SLURM_GPUS_ON_NODE": "8"}).gpus_on_node == 8
    assert slurm_allocation({"SLURM_JOB_ID": "1", "SLURM_JOB_GPUS": "0,1"}).gpus_on_node == 2
    assert slurm_allocation({"SLURM_JOB_ID": "1", "SLURM_GPUS_PER_NODE": "a100:4"}).gpus_on_node == 4
    assert slurm_allocation({"SLURM_JOB_ID": "1", "SLURM_GPUS_PER_NODE": "gpu:a100:2,v100:1"}).gpus_on_node == 3
    assert slurm_allocation({"SLURM_JOB_ID": "1"}).gpus_on_node is None


def test_slurm_check():
    assert check_slurm(None, launch_environment({})).verdict == "n/a"
    step = dict(
        GPU_JOB,
        SLURM_STEP_ID="0",
        SLURM_PROCID="0",
        SLURM_NTASKS="16",
        SLURM_NODEID="0",
        SLURM_JOB_NODELIST="gpu[01-02]",
        SLURM_TASKS_PER_NODE="8(x2)",
    )
    crowded = check_slurm(slurm_allocation(step), launch_environment(step))
    assert crowded.verdict == "fail" and "8 processes on this node share 4 GPU(s)" in crowded.evidence
    fits = dict(step, SLURM_NTASKS="8", SLURM_TASKS_PER_NODE="4(x2)")
    result = check_slurm(slurm_allocation(fits), launch_environment(fits))
    assert result.verdict == "ok" and "job 4242" in result.evidence and "rank 0 of 8 (slurm)" in result.evidence


def test_rendezvous_check():
    assert check_rendezvous(launch_environment({}), _resolver({})).verdict == "n/a"
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "gpu01", "MASTER_PORT": "29500"}
    bad = check_rendezvous(launch_environment(env), _resolver({}))
    assert (
        bad.verdict == "fail"
        and "MASTER_ADDR=gpu01 does not resolve" in bad.evidence
        and "scontrol show hostnames" in bad.fix
    )
    assert check_rendezvous(launch_environment(env), _resolver({"gpu01": ["10.0.0.1"]})).verdict == "ok"
    assert check_rendezvous(launch_environment({"RANK": "0", "WORLD_SIZE": "2"}), _resolver({})).verdict == "fail"


# --- storage: real read-only and full file systems -------------------------------------------------


@contextmanager
def _mounted(size: str, read_only: bool, prepare=None):
    """A real tmpfs (read-only after `prepare` filled it, if asked): root ignores permission bits, not mounts."""
    if os.geteuid() != 0:
        if not read_only:
            pytest.skip("needs root to mount a small file system")
        yield from _read_only_by_mode(prepare)  # permission bits hold for other users
        return
    where = Path(tempfile.mkdtemp(prefix="supertune-doctor-mnt-"))
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
        ).returncode
        != 0
    ):
        where.rmdir()
        pytest.skip("mount is not permitted here")
    try:
        if prepare:
            prepare(where)
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True, capture_output=True)
            with pytest.raises(OSError):  # the test is only worth something if writing really fails
                (where / "probe").write_text("x")
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True)
        where.rmdir()


def _read_only_by_mode(prepare):
    where = Path(tempfile.mkdtemp(prefix="supertune-doctor-ro-"))
    try:
        if prepare:
            prepare(where)
        for path in [where, *where.rglob("*")]:
            path.chmod(0o555)
        with pytest.raises(OSError):
            (where / "probe").write_text("x")
        yield where
    finally:
        for path in [where, *where.rglob("*")]:
            path.chmod(0o755)
        subprocess.run(["rm", "-rf", str(where)])


def test_read_only_scratch_fails(tmp_path):
    with _mounted("1m", read_only=True) as ro:
        result = check_scratch([("run directory", ro / "runs"), ("temporary files", tmp_path)])
    assert result.verdict == "fail"
    assert f"run directory {ro / 'runs'}: NOT writable" in result.evidence and "cannot create a file" in result.evidence
    assert f"temporary files {tmp_path}: writable" in result.evidence
    assert "--run-dir" in result.fix


def test_tmpdir_missing_a_file_or_read_only_fails(tmp_path):
    """Python's tempfile passes over such a TMPDIR silently; compilers and mktemp do not."""
    (tmp_path / "afile").write_text("x")
    for value, found in ((tmp_path / "missing", "does not exist"), (tmp_path / "afile", "is a file, not a directory")):
        result = check_tmpdir({"TMPDIR": str(value)})
        assert result.verdict == "fail"
        assert result.evidence.startswith(f"TMPDIR={str(value)!r} {found}: compilers")
        assert result.fix == "point TMPDIR at a writable directory (node-local scratch; mkdir -p it first), or unset it"
    with _mounted("1m", read_only=True) as ro:
        result = check_tmpdir({"TMPDIR": str(ro)})
    assert result.verdict == "fail"
    assert result.evidence.startswith(f"TMPDIR={str(ro)!r} is not writable (cannot create a file: ")
    assert check_tmpdir({"TMPDIR": str(tmp_path)}).verdict == "ok"
    assert check_tmpdir({}).verdict == "ok"


def test_writable_scratch_passes(tmp_path):
    result = check_scratch([("run directory", tmp_path / "runs" / "new"), ("temporary files", tmp_path)])
    assert result.verdict == "ok" and "not created yet" in result.evidence


def test_read_only_hf_cache_warns():
    def with_model(root: Path) -> None:
        (root / "hub" / "models--org--tiny").mkdir(parents=True)
        (root / "datasets").mkdir()

    with _mounted("1m", read_only=True, prepare=with_model) as ro:
        paths = hf_paths({"HF_HOME": str(ro)}, Path("/nonexistent-home"))
        result = check_hf_cache(paths, offline=True)
    assert result.verdict == "warn"
    assert "1 model(s)" in result.evidence and "NOT writable" in result.evidence
    assert "HF_HOME" in result.fix


def test_missing_hf_cache_offline_warns_with_the_download_command(tmp_path):
    paths = hf_paths({"XDG_CACHE_HOME": str(tmp_path / "xdg")}, Path("/nonexistent-home"))
    assert paths.hub == tmp_path / "xdg" / "huggingface" / "hub"
    result = check_hf_cache(paths, offline=True)
    assert result.verdict == "warn" and "missing" in result.evidence and "hf download MODEL_ID" in result.fix
    assert check_hf_cache(paths, offline=False).verdict == "ok"
    (paths.hub / "models--org--tiny").mkdir(parents=True)
    assert check_hf_cache(paths, offline=True).verdict == "ok"
    env = {"HF_HOME": "/a", "HF_HUB_CACHE": "/b/hub", "HF_DATASETS_CACHE": "/c"}
    assert (hf_paths(env, Path("/h")).hub, hf_paths(env, Path("/h")).datasets) == (Path("/b/hub"), Path("/c"))


def test_offline_flags_inside_a_job():
    assert check_offline({}, in_job=True).verdict == "warn"
    assert "HF_HUB_OFFLINE=1" in check_offline({}, in_job=True).fix
    assert check_offline({"HF_HUB_OFFLINE": "true"}, in_job=True).verdict == "ok"
    assert check_offline({}, in_job=False).verdict == "ok"


def test_free_space_on_a_full_and_a_roomy_file_system(tmp_path):
    with _mounted("1m", read_only=False) as tiny:
        full = check_free_space([("run directory", tiny)], min_free_bytes=20 * 2**30)
    assert full.verdict == "fail" and "less than 1.0 GiB free" in full.evidence
    roomy = check_free_space([("run directory", tmp_path), ("temporary files", tmp_path / "later")], min_free_bytes=1)
    assert roomy.verdict == "ok" and "run directory, temporary files" in roomy.evidence
    low = check_free_space([("run directory", tmp_path)], min_free_bytes=1 << 60)
    assert low.verdict == "warn" and "--min-free-gb" in low.fix


# --- options and report ----------------------------------------------------------------------------


def _parse(*argv: str) -> DoctorOptions:
    import argparse

    parser = argparse.ArgumentParser()
    add_doctor_arguments(parser)
    return options_from_args(parser.parse_args(list(argv)))


def test_options_are_checked_and_travel_to_the_worker():
    from supertune.errors import UserError

    assert parse_size("64K") == 65536 and parse_size("1G") == 2**30 and parse_size("4096") == 4096
    with pytest.raises(UserError, match="--nproc: only with --comm"):
        _parse("--nproc", "2")
    with pytest.raises(UserError, match="--max-size"):
        _parse("--comm", "--max-size", "lots")
    options = _parse("--comm", "--expect-gbps", "12.5", "--max-size", "64M", "--dir", "/scratch/me", "--json")
    assert _parse(*options.worker_argv()) == options
    assert preflight_arguments(20, "/runs/x/doctor.json", "256M") == [
        "--comm",
        "--expect-gbps",
        "20",
        "--max-size",
        "256M",
        "--out",
        "/runs/x/doctor.json",
    ]


def test_report_merges_the_other_processes():
    own = [CheckResult("scratch", "ok", "fine")]
    other = [{"name": "gpu-visibility", "verdict": "fail", "evidence": "torch sees 0", "fix": "install"}]
    elsewhere = merge_elsewhere(
        [("n2", 4, other), ("n2", 5, other), ("n1", 1, [c.as_dict() for c in own])], [c.as_dict() for c in own]
    )
    assert elsewhere == [{**other[0], "hosts": ["n2"], "ranks": [4, 5]}]
    doc = report_document("n1", {"rank": 0, "world_size": 8, "launcher": "slurm"}, own, elsewhere)
    assert doc["verdict"] == "fail" and doc["exit_code"] == 1
    assert "[n2 rank 4-5] torch sees 0" in format_text(doc)


# --- the command ----------------------------------------------------------------------------------


def _doctor(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "NCCL_", "GLOO_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    return subprocess.run(
        [sys.executable, "-m", "supertune", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, **(env or {})},
    )


def test_doctor_json_reports_every_check():
    proc = _doctor("--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert [c["name"] for c in doc["checks"]] == list(CHECK_NAMES)
    assert all(c["verdict"] in ("ok", "n/a", "warn") for c in doc["checks"])
    assert doc["comm"] is None and doc["exit_code"] == 0


def test_doctor_names_each_hostile_variable(tmp_path):
    """Variables that NCCL, compilers or Slurm read without a word, end to end: one line each naming
    the variable, its value and the fix; a read-only or missing TMPDIR fails the node."""
    env = {
        "NCCL_SOCKET_IFNAME": "^all",
        "NCCL_IB_HCA": "mlx5_9",
        "NCCL_DEBUG": "VERBOSE",
        "TMPDIR": str(tmp_path / "missing"),
    }
    proc = _doctor("--json", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    expected = {
        "nccl-socket-ifname": ("warn", "NCCL_SOCKET_IFNAME='^all' excludes 'all'"),
        "nccl-debug": ("warn", "NCCL_DEBUG='VERBOSE' is not one of NCCL's levels"),
        "tmpdir": ("fail", f"TMPDIR={str(tmp_path / 'missing')!r} does not exist"),
    }
    if not Path("/sys/class/infiniband").exists():
        expected["nccl-ib-hca"] = ("warn", "NCCL_IB_HCA='mlx5_9' names RDMA devices, but this node has none")
    for name, (verdict, said) in expected.items():
        assert checks[name]["verdict"] == verdict and checks[name]["evidence"].startswith(said), checks[name]
        assert checks[name]["fix"]
    garbage = _doctor(env={"SLURM_JOB_ID": "77", "SLURM_GPUS_PER_NODE": "gpu:garbage"})
    assert garbage.returncode == 2 and garbage.stderr.strip().splitlines() == [
        "supertune: error: SLURM_GPUS_PER_NODE='gpu:garbage' in the environment is not a GPU count per node such as "
        '"4" or "a100:4"; Slurm (sbatch, salloc and srun) sets it: unset it, or start supertune through that launcher'
    ]


def test_doctor_refuses_a_gpu_job_that_torch_cannot_see():
    """A faked GPU allocation (SLURM GPU variables, no device): the CPU build is refused with the fix."""
    proc = _doctor(
        env={"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "1", "SLURM_GPUS_ON_NODE": "2", "SLURM_JOB_GPUS": "0,1"}
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL  gpu-visibility" in proc.stdout and "job 77 has 2 GPU(s) on this node" in proc.stdout
    assert "fix: install the build for the node's GPUs" in proc.stdout
    assert "-> FAIL (exit 1)" in proc.stdout


def test_doctor_comm_needs_several_processes():
    proc = _doctor("--comm")
    assert proc.returncode == 2 and "--nproc N" in proc.stderr


def test_a_gpu_the_build_has_no_kernels_for_fails():
    """A CUDA 13 build (kernels from 7.5 on) on V100s (7.0) sees them but cannot run on them; cubins run
    on later minors of their major (sm_80 on 8.6), PTX on any later capability (compute_120 on 12.1)."""
    from supertune.doctor.gpus import has_kernels

    cu130 = TorchFacts(
        version="2.13.0+cu130",
        cuda="13.0",
        device_count=1,
        gpus=(V100,),
        arch_list=("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"),
    )
    result = check_gpus(cu130)
    assert result.verdict == "fail"
    assert (
        "carries kernels for sm_75, sm_80, sm_86, sm_90, sm_100, sm_120, compute_120 only, none for compute capability 7.0 (1 of 1 GPU(s))"
        in result.evidence
    )
    assert "sm_70" in result.fix
    a10 = GpuDevice(0, "NVIDIA A10", 24 * 2**30, (8, 6))
    assert has_kernels(a10, TorchFacts(version="x", cuda="12.8", arch_list=("sm_80",))) is True
    assert (
        has_kernels(
            GpuDevice(0, "B", 1, (12, 1)), TorchFacts(version="x", cuda="13.0", arch_list=("sm_90", "compute_120"))
        )
        is True
    )
    assert has_kernels(H100, TorchFacts(version="x", cuda="13.0", arch_list=("sm_90a",))) is True
    assert has_kernels(H100, TorchFacts(version="x", cuda="12.6", arch_list=("sm_70", "sm_80"))) is False
    assert has_kernels(V100, TorchFacts(version="x", cuda="12.6")) is None  # no list: unknown, not refused
    assert has_kernels(MI250, ROCM_TORCH) is None
    assert (
        check_gpus(
            TorchFacts(version="2.13.0+cu128", cuda="12.8", device_count=1, gpus=(H100,), arch_list=("sm_80", "sm_90"))
        ).verdict
        == "ok"
    )
