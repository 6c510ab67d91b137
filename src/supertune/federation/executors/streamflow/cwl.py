"""What is left of a round as a StreamFlow workflow: the CWL v1.2 workflow, its job (settings) file
and `streamflow.yml`, each a plain dict from pure functions (dumped as YAML by `streamflow`).

One explicit step per site and phase, no scatter: `train_<site>` (from the previous global model,
out come the site's final checkpoint and `trained-<site>.json`), `average` (the checkpoints in,
the global model and `averaged.json` out) and `evaluate_<site>` (the global model in,
`evaluated-<site>.json` out). Models move as CWL Directory values, so StreamFlow carries them
between deployments (a symbolic link on one machine, a copy over SSH to a remote site). Every
value reaches a command through an input's binding, never through a string with `$(...)` in it
(CWL would evaluate it).

Deployments (StreamFlow's names start with a lower-case letter): `federation` (this machine: the
average), and per site `site.<name>`, of type `local` (where: local), `slurm` (a cluster profile;
sbatch runs here), or `slurm` wrapping `ssh` to the site's login node, `login.<name>`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ....entry import SITE_TASK, entry_words
from ...config.schema import FederationConfig
from ...config.site_login import login_parts
from ...rounds.loop import RoundWork

if TYPE_CHECKING:
    from ....slurm.job import JobSpec

__all__ = ["SitePlace", "RoundFiles", "round_workflow", "round_job", "streamflow_config", "slurm_service", "job_name"]
FEDERATION_DEPLOYMENT = "federation"


@dataclass(frozen=True)
class SitePlace:
    """Where a site's files of one round are, and how its steps run there."""

    name: str
    site_dir: str
    """The site's stable folder of this round, on the site's file system (its run, start model, logs)."""
    python: str
    """The interpreter with supertune at the site."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment of the site's steps (CWL EnvVarRequirement): HOME and caches for a site on this machine."""
    login: str | None = None
    """[user@]host[:port] of the site's login node; None: this machine."""
    workdir: str | None = None
    """Where StreamFlow makes the site's step folders."""
    services: dict[str, dict[str, Any]] | None = None
    """SLURM services (`train`, `evaluate`) of a cluster site; None: a site on this machine (local)."""

    @property
    def deployment(self) -> str:
        return f"site.{self.name}"

    @property
    def login_deployment(self) -> str:
        return f"login.{self.name}"


@dataclass(frozen=True)
class RoundFiles:
    """StreamFlow's files of one round, under <federation dir>/streamflow/round-NNN/."""

    directory: Path

    @property
    def workflow(self) -> Path:
        return self.directory / "round.cwl"

    @property
    def job(self) -> Path:
        return self.directory / "job.yml"

    @property
    def streamflow(self) -> Path:
        return self.directory / "streamflow.yml"

    @property
    def outdir(self) -> Path:
        """Where `streamflow run --outdir` copies the workflow's outputs (the receipts)."""
        return self.directory / "out"

    @property
    def log(self) -> Path:
        return self.directory / "streamflow.log"

    @property
    def database(self) -> Path:
        return self.directory / "streamflow.db"

    @property
    def group(self) -> Path:
        """The process group of a running `streamflow run` (to end it after a kill of the federation)."""
        return self.directory / "streamflow.pgid"

    @property
    def tmp(self) -> Path:
        return self.directory / "tmp"

    def workdir(self, deployment: str) -> Path:
        return self.directory / "work" / deployment


def job_name(fed: FederationConfig, number: int, site: str, service: str) -> str:
    """A SLURM job name unique per federation, round, site and service (scancel --name finds it)."""
    return f"{fed.name}-r{number:03d}-{site}-{service}"


def slurm_service(job: JobSpec, name: str) -> dict[str, Any]:
    """A StreamFlow slurm service from a `slurm.job.JobSpec`: the same allocation as the job script
    asks for. StreamFlow's schema wants `nodes` and `gpusPerNode` as strings, task counts as integers."""
    service: dict[str, Any] = {
        "jobName": name,
        "nodes": str(job.nodes),
        "ntasksPerNode": job.tasks_per_node,
        "cpusPerTask": job.cpus_per_task,
        "time": job.time,
    }
    if job.gpus_per_node:
        service["gpusPerNode"] = str(job.gpus_per_node)
    for key in ("partition", "account", "qos", "mem"):
        if getattr(job, key):
            service[key] = getattr(job, key)
    if job.exclusive:
        service["exclusive"] = True
    return service


# -- the workflow ---------------------------------------------------------------------------------


def _tool(
    python: str, task: str, env: dict[str, str], inputs: dict[str, Any], outputs: dict[str, Any]
) -> dict[str, Any]:
    tool: dict[str, Any] = {
        "class": "CommandLineTool",
        "baseCommand": [python, *map(str, entry_words(SITE_TASK, [task]))],
    }
    if env:
        tool["requirements"] = {"EnvVarRequirement": {"envDef": dict(env)}}
    tool["inputs"] = inputs
    tool["outputs"] = outputs
    return tool


def _flag(kind: str, prefix: str, position: int | None = None) -> dict[str, Any]:
    binding: dict[str, Any] = {"prefix": prefix}
    if position is not None:
        binding["position"] = position
    return {"type": kind, "inputBinding": binding}


def _glob(kind: str, pattern: str) -> dict[str, Any]:
    return {"type": kind, "outputBinding": {"glob": pattern}}


def round_workflow(
    work: RoundWork,
    places: dict[str, SitePlace],
    local: SitePlace,
    federation_dir: Path,
    given: dict[str, str],
    report_failure: bool = False,
) -> dict[str, Any]:
    """The round's workflow. `given`: sites whose training finished in an earlier attempt of the
    round, with their checkpoint on this machine (a workflow input instead of a train step).
    `report_failure`: the train steps report a failed training in their receipt and succeed (a
    workflow of training only, for a quorum: site_task.train)."""
    n = work.number
    trained = [w.name for w in work.train]
    inputs: dict[str, Any] = {}
    outputs: dict[str, Any] = {}
    steps: dict[str, Any] = {}
    if trained or work.average:
        inputs["previous"] = "Directory"
    for name in places:
        if name in trained:
            inputs[f"config_{name}"] = "File"
            steps[f"train_{name}"] = _train_step(places[name], n, work.federation_id, report_failure)
            outputs[f"trained_{name}"] = {"type": "File", "outputSource": f"train_{name}/receipt"}
        if name in given:
            inputs[f"checkpoint_{name}"] = "Directory"
    model = "global_model"
    if work.average:
        # The sites averaged: those of the round not left out of it (work.trained), in the federation's order.
        steps["average"] = _average_step(work, list(work.trained), local, federation_dir, given)
        outputs["averaged"] = {"type": "File", "outputSource": "average/receipt"}
        model = "average/global_model"
    elif work.evaluate:
        inputs["global_model"] = "Directory"
    for w in work.evaluate:
        inputs[f"base_config_{w.name}"] = "File"
        steps[f"evaluate_{w.name}"] = _evaluate_step(places[w.name], n, model, work.federation_id)
        outputs[f"evaluated_{w.name}"] = {"type": "File", "outputSource": f"evaluate_{w.name}/receipt"}
    return {"cwlVersion": "v1.2", "class": "Workflow", "inputs": inputs, "outputs": outputs, "steps": steps}


def _train_step(place: SitePlace, number: int, federation_id: str, report_failure: bool) -> dict[str, Any]:
    inputs = {
        "federation_id": _flag("string", "--federation-id"),
        "site": _flag("string", "--site"),
        "round": _flag("int", "--round"),
        "config": _flag("File", "--config"),
        "site_dir": _flag("string", "--site-dir"),
        "global_model": _flag("Directory", "--global-model"),
    }
    step_in = {
        "federation_id": {"default": federation_id},
        "site": {"default": place.name},
        "round": {"default": number},
        "config": f"config_{place.name}",
        "site_dir": {"default": place.site_dir},
        "global_model": "previous",
    }
    outputs = {
        # A failed training reported (report_failure) hands no checkpoint out.
        "checkpoint": _glob("Directory?" if report_failure else "Directory", f"checkpoint-{place.name}"),
        "receipt": _glob("File", f"trained-{place.name}.json"),
    }
    tool = _tool(place.python, "train", place.env, inputs, outputs)
    if report_failure:
        tool["arguments"] = ["--report-failure"]
    return {"run": tool, "in": step_in, "out": ["checkpoint", "receipt"]}


def _average_step(
    work: RoundWork, sites: list[str], local: SitePlace, federation_dir: Path, given: dict[str, str]
) -> dict[str, Any]:
    inputs: dict[str, Any] = {
        "federation": _flag("string", "--federation", 1),
        "round": _flag("int", "--round", 2),
        "previous": _flag("Directory", "--previous", 3),
        "publish": _flag("string", "--publish", 4),
        "sites": {"type": "string[]", "inputBinding": {"prefix": "--sites", "position": 5}},
    }
    step_in: dict[str, Any] = {
        "federation": {"default": str(federation_dir)},
        "round": {"default": work.number},
        "previous": "previous",
        "publish": {"default": str(work.global_model)},
        "sites": {"default": sites},
    }
    for i, name in enumerate(sites):
        # One input per site, bound in the sites' order: --checkpoint DIR1 --checkpoint DIR2 ...
        inputs[f"checkpoint_{name}"] = _flag("Directory", "--checkpoint", 10 + i)
        step_in[f"checkpoint_{name}"] = f"checkpoint_{name}" if name in given else f"train_{name}/checkpoint"
    outputs = {"global_model": _glob("Directory", "global-model"), "receipt": _glob("File", "averaged.json")}
    return {
        "run": _tool(local.python, "average", local.env, inputs, outputs),
        "in": step_in,
        "out": ["global_model", "receipt"],
    }


def _evaluate_step(place: SitePlace, number: int, model: str, federation_id: str) -> dict[str, Any]:
    inputs = {
        "federation_id": _flag("string", "--federation-id"),
        "site": _flag("string", "--site"),
        "round": _flag("int", "--round"),
        "config": _flag("File", "--config"),
        "site_dir": _flag("string", "--site-dir"),
        "model": _flag("Directory", "--model"),
    }
    step_in = {
        "federation_id": {"default": federation_id},
        "site": {"default": place.name},
        "round": {"default": number},
        "config": f"base_config_{place.name}",
        "site_dir": {"default": place.site_dir},
        "model": model,
    }
    outputs = {"receipt": _glob("File", f"evaluated-{place.name}.json")}
    return {"run": _tool(place.python, "evaluate", place.env, inputs, outputs), "in": step_in, "out": ["receipt"]}


def round_job(work: RoundWork, given: dict[str, str]) -> dict[str, Any]:
    """The workflow's inputs: files on this machine, which StreamFlow stages for each step (the run
    config of every site with a train step among them)."""

    def directory(path: Path | str) -> dict[str, str]:
        return {"class": "Directory", "path": str(path)}

    def file(path: Path | str) -> dict[str, str]:
        return {"class": "File", "path": str(path)}

    job: dict[str, Any] = {}
    if work.train or work.average:
        job["previous"] = directory(work.previous)
    for w in work.train:
        job[f"config_{w.name}"] = file(w.config)
    for name, checkpoint in given.items():
        job[f"checkpoint_{name}"] = directory(checkpoint)
    if not work.average and work.evaluate:
        job["global_model"] = directory(work.global_model)
    for w in work.evaluate:
        job[f"base_config_{w.name}"] = file(w.config)
    return job


# -- streamflow.yml -------------------------------------------------------------------------------


def streamflow_config(
    fed: FederationConfig, work: RoundWork, places: dict[str, SitePlace], files: RoundFiles, steps: list[str]
) -> dict[str, Any]:
    """streamflow.yml of the round: its deployments, which step runs where, and StreamFlow's own
    files (database, step folders) inside the federation directory."""
    deployments: dict[str, Any] = {
        FEDERATION_DEPLOYMENT: {"type": "local", "config": {}, "workdir": str(files.workdir(FEDERATION_DEPLOYMENT))},
    }
    bindings = []
    for name, place in places.items():
        used = [s for s in steps if s in (f"train_{name}", f"evaluate_{name}")]
        if not used:
            continue
        deployments.update(_deployments(fed, place, files))
        for step in used:
            if place.services is None:
                target: dict[str, Any] = {"deployment": place.deployment}
            else:
                target = {
                    "deployment": place.deployment,
                    "service": "train" if step.startswith("train_") else "evaluate",
                }
            bindings.append({"step": f"/{step}", "target": target})
    if "average" in steps:
        bindings.append({"step": "/average", "target": {"deployment": FEDERATION_DEPLOYMENT}})
    return {
        "version": "v1.0",
        "workflows": {
            f"round-{work.number:03d}": {
                "type": "cwl",
                "config": {"file": files.workflow.name, "settings": files.job.name},
                "bindings": bindings,
            }
        },
        "deployments": deployments,
        "database": {"type": "default", "config": {"connection": str(files.database)}},
    }


def _deployments(fed: FederationConfig, place: SitePlace, files: RoundFiles) -> dict[str, Any]:
    workdir = place.workdir or str(files.workdir(place.deployment))
    if place.services is None:
        return {place.deployment: {"type": "local", "config": {}, "workdir": workdir}}
    slurm: dict[str, Any] = {
        "type": "slurm",
        "config": {
            "pollingInterval": fed.streamflow.polling_seconds,
            # A site's train and evaluate jobs never wait on each other; 1 would only log a warning.
            "maxConcurrentJobs": 2,
            "services": place.services,
        },
        "workdir": workdir,
    }
    out = {place.deployment: slurm}
    if place.login:
        user, host, port = login_parts(place.login) or (None, place.login, None)
        ssh: dict[str, Any] = {"nodes": [f"{host}:{port}" if port else host], "checkHostKey": True}
        if user:
            ssh["username"] = user
        if fed.streamflow.ssh_key:
            ssh["sshKey"] = fed.streamflow.ssh_key
        out[place.login_deployment] = {"type": "ssh", "config": ssh, "workdir": workdir}
        slurm["wraps"] = place.login_deployment
    return out
