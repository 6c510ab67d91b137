"""Checks of a built cluster profile that types alone cannot express.

Each problem is returned with the top-level key it concerns, so that the registry can name the file
that set it. Environment values are held to what the job-script renderer expands safely: plain text
with $NAME or ${NAME} references, nothing a shell would run.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ..config.job_values import env_name_problem as _env_name_rule
from ..config.job_values import slurm_name_problem
from .schema import ClusterProfile

__all__ = ["profile_problems", "env_name_problem", "env_value_problem", "BOOTSTRAP_AGENTS"]

_REFERENCE = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\})")
# Secrets never belong in a profile: profiles are shared files and end up in job scripts and logs.
_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY)$", re.IGNORECASE)
_HF_TOKEN_VALUE = re.compile(r"\bhf_[A-Za-z0-9]{20,}")
_MODULE = re.compile(r"^[A-Za-z0-9_./+:@-]+\Z")
_MODULE_PATH = re.compile(r"^/[A-Za-z0-9_./+:@-]*\Z")  # no spaces, quotes or $: the job script writes it as it is
_COTAINR_SYSTEM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
_BIND_OPTIONS = {"ro", "rw"}
_ENV_VARIABLE = re.compile(r"[A-Z_][A-Z0-9_]*")
# Image reference schemes an Apptainer definition can start from, and the Bootstrap agent of each.
BOOTSTRAP_AGENTS = {"docker://": "docker", "oras://": "oras", "library://": "library"}

Report = Callable[[str, str], None]  # (key, problem without the key)


def profile_problems(p: ClusterProfile) -> list[tuple[str, str]]:
    """(key, "key: problem and fix") for every inconsistency in the profile; empty when it is sound."""
    out: list[tuple[str, str]] = []

    def bad(key: str, text: str) -> None:
        out.append((key, f"{key}: {text}"))

    _check_hardware(p, bad)
    _check_scheduler(p, bad)
    for i, path in enumerate(p.module_use):
        if not _MODULE_PATH.match(path):
            bad(
                f"module_use[{i}]",
                f"{path!r} is not an absolute directory path; write one per item, e.g. /appl/local/training/modules/AI-20240529",
            )
    for i, module in enumerate(p.modules):
        if not _MODULE.match(module):
            bad(f"modules[{i}]", f"{module!r} is not a module name; write one name per item, e.g. cuda/12.1")
    for name, value in p.env.items():
        problem = env_name_problem(name) or env_value_problem(value)
        if problem:
            bad(f"env.{name}", problem)
    _check_container(p, bad)
    _check_node_dirs(p, bad)
    _check_placeholder_keys(p, bad)
    if p.run_config:
        _check_run_config(p, bad)
    return out


def env_name_problem(name: str) -> str | None:
    """A name the job script can export that is no secret's."""
    problem = _env_name_rule(name)
    if problem:
        return problem
    if _SECRET_NAME.search(name):
        return "secrets do not belong in a cluster profile; set it in your own environment, or log in with the Hugging Face CLI on a login node"
    return None


def env_value_problem(value: object) -> str | None:
    """Why `value` cannot be an environment value of a job script, or None."""
    if not isinstance(value, str):
        return f'expected a string, got {value!r} (quote it, e.g. "1")'
    if "`" in value or "$(" in value:
        return f"{value!r} runs a command; only $NAME and ${{NAME}} references are expanded"
    if "$" in _REFERENCE.sub("", value):
        return f"{value!r} has a $ that is not a $NAME or ${{NAME}} reference (no defaults or other shell forms are expanded)"
    if _HF_TOKEN_VALUE.search(value):
        return "looks like a Hugging Face token; secrets do not belong in a cluster profile"
    if "\n" in value or "\0" in value:
        return f"{value!r} must be one line"
    return None


def _check_hardware(p: ClusterProfile, bad: Report) -> None:
    if p.gpus_per_node < 0:
        bad("gpus_per_node", f"must not be negative, got {p.gpus_per_node}")
    if p.gpu_vendor == "none" and p.gpus_per_node > 0:
        bad("gpu_vendor", f"is none but gpus_per_node is {p.gpus_per_node}; set nvidia or amd, or gpus_per_node: 0")
    if p.gpu_vendor != "none" and p.gpus_per_node == 0:
        bad(
            "gpus_per_node",
            f"is 0 but gpu_vendor is {p.gpu_vendor}; give the GPUs per node (for MI250X: GCDs, 8 per node)",
        )
    if p.gpus_per_node > 0:
        if p.gpu_memory_gb <= 0:
            bad("gpu_memory_gb", f"must be positive on a GPU node, got {p.gpu_memory_gb} (memory of one GPU, e.g. 40)")
        if p.peak_bf16_tflops_per_gpu <= 0:
            bad(
                "peak_bf16_tflops_per_gpu",
                f"must be positive on a GPU node, got {p.peak_bf16_tflops_per_gpu} (e.g. 312 for A100)",
            )
        if not p.gpu_model:
            bad("gpu_model", 'is empty on a GPU node; name the GPU, e.g. "A100 40GB"')
    for key in ("gpu_memory_gb", "peak_bf16_tflops_per_gpu"):
        if getattr(p, key) < 0:
            bad(key, f"must not be negative, got {getattr(p, key)}")
    if p.cpus_per_gpu < 1:
        bad("cpus_per_gpu", f"must be at least 1, got {p.cpus_per_gpu}")
    if p.cpus_per_node < 1:
        bad("cpus_per_node", f"must be at least 1, got {p.cpus_per_node}")
    elif p.gpus_per_node > 0 and p.cpus_per_gpu >= 1 and p.cpus_per_gpu * p.gpus_per_node > p.cpus_per_node:
        bad(
            "cpus_per_gpu",
            f"{p.cpus_per_gpu} cores for each of {p.gpus_per_node} GPUs is more than the node's {p.cpus_per_node} (cpus_per_node); lower it",
        )
    if p.memory_per_node_gb is not None and p.memory_per_node_gb <= 0:
        bad("memory_per_node_gb", f"must be positive or empty, got {p.memory_per_node_gb}")


def _check_scheduler(p: ClusterProfile, bad: Report) -> None:
    for key in ("partition", "qos", "account"):
        value = getattr(p, key)
        problem = value is not None and slurm_name_problem(value)
        if problem:
            bad(key, problem)


def _check_container(p: ClusterProfile, bad: Report) -> None:
    c = p.container
    if c.runtime == "none" and c.image:
        bad(
            "container.image",
            f"is set ({c.image}) but container.runtime is none; set runtime to apptainer or singularity",
        )
    if c.base_image and not (c.base_image.startswith(tuple(BOOTSTRAP_AGENTS)) or c.base_image.endswith(".sif")):
        bad(
            "container.base_image",
            f"{c.base_image!r} is not an image reference; write docker://REPO:TAG (or oras://, library://, or a .sif path)",
        )
    if c.image and ("`" in c.image or "$(" in c.image):
        bad("container.image", f"{c.image!r} runs a command; write a path (with $NAME references at most)")
    texts = [("container.image", c.image), ("container.base_image", c.base_image)]
    texts += [(f"container.binds[{i}]", b) for i, b in enumerate(c.binds)]
    texts += [(f"container.extra_args[{i}]", a) for i, a in enumerate(c.extra_args)]
    for key, text in texts:
        if text and any(ch in text for ch in "\0\n\r"):
            bad(key, f"{text!r} holds a NUL byte or a line break, which no command line can carry; remove it")
        elif text and key != "container.base_image":
            problem = _container_reference_problem(text)
            if problem:
                bad(key, problem)
    for i, bind in enumerate(c.binds):
        parts = bind.split(":")
        if not bind.startswith("/") or len(parts) > 3 or (len(parts) == 3 and parts[2] not in _BIND_OPTIONS):
            bad(
                f"container.binds[{i}]",
                f"{bind!r} is not host[:container[:ro|rw]] with an absolute host path, e.g. /scratch or /data:/data:ro",
            )
        elif len(parts) >= 2 and not parts[1].startswith("/"):
            bad(f"container.binds[{i}]", f"{bind!r}: the container path must be absolute, e.g. /scratch:/scratch")
    if c.cotainr_system is not None and not _COTAINR_SYSTEM.match(c.cotainr_system):
        bad(
            "container.cotainr_system",
            f"{c.cotainr_system!r} is not a cotainr system name (see `cotainr info`), e.g. lumi-g",
        )
    if c.torch_index_url and not c.torch_index_url.startswith(("https://", "http://")):
        bad(
            "container.torch_index_url",
            f"{c.torch_index_url!r} is not a URL; e.g. https://download.pytorch.org/whl/rocm6.4",
        )


def _check_node_dirs(p: ClusterProfile, bad: Report) -> None:
    for i, path in enumerate(p.node_dirs):
        key = f"node_dirs[{i}]"
        if any(ch in path for ch in "\0\n\r"):
            bad(key, f"{path!r} holds a NUL byte or a line break, which no command line can carry; remove it")
        elif not path.startswith(("/", "$")):
            bad(key, f"{path!r} is not an absolute path (or a $NAME reference to one), e.g. /tmp/${{USER}}-miopen")
        else:
            problem = _container_reference_problem(path)
            if problem:
                bad(key, problem)


def _check_placeholder_keys(p: ClusterProfile, bad: Report) -> None:
    import dataclasses

    names = [f.name for f in dataclasses.fields(p) if f.name not in ("name", "placeholders", "placeholder_keys")]
    for i, key in enumerate(p.placeholder_keys):
        if key not in names:
            bad(f"placeholder_keys[{i}]", f"{key!r} is not a key of a profile; name one, e.g. modules")


def _container_reference_problem(text: str) -> str | None:
    """Why a container word's $ references would not survive the job script, or None.

    The job expands $NAME / ${NAME} in the image, binds and extra arguments ($USER, $SCRATCH) and
    runs under `set -u`, so a reference to a variable unset on the node ends the job before
    training. Environment variables are named in capitals; a lower-case `$name` is a shell variable
    no job has (or a $ meant literally), and is refused here rather than in the queue."""
    if "$" in _REFERENCE.sub("", text):
        return f"{text!r} has a $ that is not a $NAME or ${{NAME}} reference (nothing else expands); remove it"
    for match in _REFERENCE.finditer(text):
        name = match.group(0).strip("${}")
        if not _ENV_VARIABLE.fullmatch(name):
            return (
                f"{text!r} refers to ${name}, which no job's environment sets, and the job script stops on an unset "
                "variable; name an environment variable in capitals such as $USER or $SCRATCH, or write the value itself"
            )
    return None


def _check_run_config(p: ClusterProfile, bad: Report) -> None:
    from ..config.build import build_config
    from ..config.errors import ConfigError
    from ..config.schema import RunConfig

    try:
        build_config(RunConfig, p.run_config)
    except ConfigError as exc:
        out = [f"run_config.{problem}" for problem in exc.problems]
        for text in out:
            key, _, rest = text.partition(": ")
            bad(key, rest)
    launch = p.run_config.get("launch")
    if isinstance(launch, dict) and "cluster" in launch:
        # The profile is chosen by launch.cluster before its run_config is read: it cannot choose another.
        bad(
            "run_config.launch.cluster",
            "a profile cannot name the cluster; remove it (launch.cluster or --cluster chooses the profile)",
        )
