"""The cluster profile schema: what supertune must know about a site to run a job there.

Hardware facts (GPUs per node, peak TFLOP/s) live here, never in code. Profiles are YAML data
files, shipped in `clusters/profiles/` and overridable by the user (see `registry`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["ContainerSpec", "ClusterProfile"]


@dataclass
class ContainerSpec:
    """The container a job runs in, and the base image `supertune container` builds on."""

    runtime: Literal["none", "apptainer", "singularity"] = "none"
    """Container runtime on the compute nodes; none runs on the host Python."""
    image: str | None = None
    """Image file (.sif) the job runs in; empty: no container even with a runtime."""
    base_image: str | None = None
    """Base image of the definition `supertune container` writes (e.g. docker://nvcr.io/nvidia/pytorch:24.05-py3)."""
    binds: list[str] = field(default_factory=list)
    """Bind mounts, "host[:container[:opts]]", e.g. /scratch or /project."""
    extra_args: list[str] = field(default_factory=list)
    """More runtime arguments before the image, e.g. ["--cleanenv"]."""
    cotainr_system: str | None = None
    """cotainr's --system for this site (e.g. lumi-g: the site's ROCm base image, as its cotainr install knows it), used instead of --base-image in the command `supertune container` prints."""
    torch_index_url: str | None = None
    """Extra pip index for torch in the conda environment `supertune container` writes, e.g. https://download.pytorch.org/whl/rocm6.4 for AMD; empty: PyPI's own build (for torch 2.13.0 on x86_64 the CUDA 13.0 build, which needs an NVIDIA driver 580+)."""


@dataclass
class ClusterProfile:
    """One site: its nodes, its scheduler defaults, its software stack and its known workarounds."""

    name: str = "local"
    """Short name used in launch.cluster and --cluster."""
    description: str = ""
    """One line: the site and the node type."""
    gpu_vendor: Literal["nvidia", "amd", "none"] = "none"
    """GPU maker: decides nccl or rccl settings and --nv or --rocm."""
    gpu_model: str = ""
    """GPU model, e.g. "A100 64GB" or "MI250X GCD"."""
    gpus_per_node: int = 0
    """GPUs (for AMD MI250X: GCDs) per node; one process each."""
    gpu_memory_gb: float = 0.0
    """Memory of one GPU (GCD) in GB."""
    peak_bf16_tflops_per_gpu: float = 0.0
    """Dense bf16 peak of one GPU (GCD) in TFLOP/s, for MFU."""
    gpu_bf16: bool = True
    """Whether the GPUs compute in bf16 (V100: no); a run asking for bf16 on GPUs without it is refused."""
    cpus_per_gpu: int = 1
    """CPU cores for each GPU process (--cpus-per-task)."""
    cpus_per_node: int = 1
    """CPU cores per node."""
    memory_per_node_gb: int | None = None
    """Host memory per node in GB."""
    partition: str | None = None
    """Default partition."""
    qos: str | None = None
    """Default quality of service."""
    account: str | None = None
    """Default account: a placeholder to replace with your project, e.g. project_465000000."""
    module_use: list[str] = field(default_factory=list)
    """Directories added to the module search path (`module use`), in order, before any module is loaded, e.g. /appl/local/training/modules/AI-20240529."""
    modules: list[str] = field(default_factory=list)
    """Environment modules loaded, in order, before the job starts."""
    module_purge: bool = False
    """Run `module purge` before loading modules."""
    container: ContainerSpec = field(default_factory=ContainerSpec)
    """Container runtime, image and binds."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment of the job. Values may reference other variables as $NAME or ${NAME} (nothing else is expanded)."""
    run_config: dict[str, Any] = field(default_factory=dict)
    """Run-config defaults of this site, e.g. {training: {bf16: true}}: over supertune's defaults, under the run YAML and the command line."""
    node_dirs: list[str] = field(default_factory=list)
    """Directories the job makes on every node before any process starts: node-local caches such as MIOpen's, e.g. ["${MIOPEN_USER_DB_PATH}"]; absolute, $NAME references expand in the job."""
    notes: list[str] = field(default_factory=list)
    """Facts to know about the site, including which values are not certain."""
    placeholders: list[str] = field(default_factory=list)
    """Words in this profile that stand for your own (an account, a project number in a path), e.g. [project_465000000]: `supertune submit` refuses a job while any value still holds one (a --dry-run warns); write your own values in your profile."""
    placeholder_keys: list[str] = field(default_factory=list)
    """Keys whose shipped values are examples not checked on the machine (module names marked CHECK), e.g. [modules]: `supertune submit` refuses a job until your profile sets each of them (the same value confirms it; a --dry-run warns)."""
