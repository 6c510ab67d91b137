"""The job script of a run, rendered by a pure function: same inputs, same text (golden-file tested).

Layout: #SBATCH header, strict shell mode, modules, environment, rendezvous address, the launcher
step. Values that came from a user or a profile are quoted (`shell.quote`), or pass through
`shell.sbatch_value` in the header, or `shell.env_value` for environment values.
"""

from __future__ import annotations

from ..clusters.schema import ClusterProfile
from ..config.job_values import env_name_problem
from ..entry import BENCH_EVAL, SITE_EVAL, TRAIN_WORKER
from ..exit_codes import REQUEUE_EXIT_CODE
from ..launch.environment import PORT_BASE, PORT_SPAN
from ..launch.launchers import HOSTFILE, get_launcher
from ..rundir import STOP_REQUEST_FILE, STOPPED_FILE, SUMMARY_FILE, RunDir
from .job import JobSpec
from .shell import Expand, env_value, join, quote, sbatch_value, slurm_filename

__all__ = [
    "render_sbatch",
    "container_words",
    "modules_section",
    "env_name",
    "comment",
    "site_options",
    "directives",
    "step_words",
]


def render_sbatch(job: JobSpec, profile: ClusterProfile, run_dir_field: str = "--run-dir") -> str:
    """The complete sbatch script of `job` on the cluster `profile`; `run_dir_field` names what chose
    the run directory in the error when its path cannot be a log file name."""
    sections = [
        _header(job, run_dir_field),
        "set -euo pipefail",
        modules_section(profile),
        _environment(job, profile),
        _node_dirs(profile),
        _rendezvous(job),
        _preflight(job, profile),
        _step(job, profile),
    ]
    return "\n\n".join(s for s in sections if s) + "\n"


def _header(job: JobSpec, run_dir_field: str) -> str:
    logs = slurm_filename(run_dir_field, str(RunDir(job.run_dir).logs))
    options: list[tuple[str, object | None]] = [
        ("job-name", sbatch_value("output.name", job.name)),
        ("nodes", job.nodes),
        ("ntasks-per-node", job.tasks_per_node),
        ("cpus-per-task", job.cpus_per_task),
        ("gpus-per-node", job.gpus_per_node or None),
        *site_options(job.time, job.partition, job.account, job.qos, job.mem),
        ("output", sbatch_value(run_dir_field, f"{logs}/%x-%j.out")),
        ("error", sbatch_value(run_dir_field, f"{logs}/%x-%j.err")),
        ("open-mode", "append"),
        # USR1 to the batch shell (B:) signal_lead seconds before the time limit: checkpoint, requeue.
        ("signal", f"B:USR1@{job.signal_lead}"),
    ]
    what, source = _JOB_KINDS.get(job.entry, _OTHER_JOB)
    lines = ["#!/bin/bash", f"# Job script of {what.format(folder=comment(job.run_dir))}.", f"# {source}"]
    lines += directives(options)
    lines.append("#SBATCH --requeue")
    if job.exclusive:
        lines.append("#SBATCH --exclusive")
    lines += [f"#SBATCH {sbatch_value('slurm.extra_args', arg)}" for arg in job.extra_args]
    return "\n".join(lines)


_JOB_KINDS: dict[str, tuple[str, str]] = {
    TRAIN_WORKER: (
        "the supertune run in {folder}",
        "Rendered from the run's config.yaml; render it again (supertune submit --dry-run) rather than edit it.",
    ),
    BENCH_EVAL: (
        "the benchmarks of a saved model (supertune eval MODEL --tasks ... --submit), with its logs in {folder}",
        "Rendered from the model's run config and the command's options; render it again (the same command "
        "with --dry-run) rather than edit it.",
    ),
    SITE_EVAL: (
        "a federated site's evaluation of the round's global model (supertune federate), in {folder}",
        "Rendered by the federation from the site's run config, again for every round: change the site's "
        "config, not this file.",
    ),
}
"""What each kind of job (by the entry point its processes run) says it is in its script's first lines:
(what the job is, where its script comes from)."""
_OTHER_JOB = ("a supertune job in {folder}", "Rendered by supertune; render it again rather than edit it.")


def site_options(
    time: str, partition: str | None, account: str | None, qos: str | None, mem: str | None
) -> list[tuple[str, object | None]]:
    """The scheduler's limits and accounting (slurm.* over the profile), quoted, as (option, value)."""
    return [
        ("time", sbatch_value("slurm.time", time)),
        ("partition", partition and sbatch_value("slurm.partition", partition)),
        ("account", account and sbatch_value("slurm.account", account)),
        ("qos", qos and sbatch_value("slurm.qos", qos)),
        ("mem", mem and sbatch_value("slurm.mem", mem)),
    ]


def directives(options: list[tuple[str, object | None]]) -> list[str]:
    """#SBATCH lines of the options that have a value."""
    return [f"#SBATCH --{name}={value}" for name, value in options if value not in (None, "")]


def comment(text: str) -> str:
    """`text` on one line, safe inside a # comment of a script."""
    return text.replace("\n", " ").replace("\r", " ")


def modules_section(profile: ClusterProfile) -> str:
    """The profile's `module purge` / `module use` / `module load` lines (empty when it has none).
    The search paths come before the loads, since the modules may live there (LUMI's AI modules do)."""
    if not profile.modules and not profile.module_purge and not profile.module_use:
        return ""
    lines = [
        f"# Software stack of the cluster profile {comment(profile.name)}",
        "# (module scripts may read unset variables, which strict mode would turn into a failure)",
        "set +u",
    ]
    if profile.module_purge:
        lines.append("module purge")
    if profile.module_use:
        lines.append("module use " + " ".join(quote(path) for path in profile.module_use))
    if profile.modules:
        lines.append("module load " + " ".join(quote(m) for m in profile.modules))
    lines.append("set -u")
    return "\n".join(lines)


def _environment(job: JobSpec, profile: ClusterProfile) -> str:
    lines = ["# Environment of every process (cluster profile, then supertune's own)"]
    for name, value in profile.env.items():
        lines.append(f"export {env_name(name)}={env_value(str(value))}")
    if "OMP_NUM_THREADS" not in profile.env:
        # One thread per core of each process. Left unset, torch (or accelerate) starts as many threads
        # as the node has cores in every process, and N processes then fight over the same cores
        # (on the 2-core test node, 8 steps took 16 s instead of 1 s). Set here, not inherited from
        # the shell that submitted.
        lines.append(f"export OMP_NUM_THREADS={job.cpus_per_proc}")
    lines.append(f"export SUPERTUNE_RUN_DIR={quote(job.run_dir)}")
    # torch's c10d warns about the hostname of every node otherwise; the message is harmless.
    lines.append('export TORCH_CPP_LOG_LEVEL="${TORCH_CPP_LOG_LEVEL:-ERROR}"')
    return "\n".join(lines)


def _node_dirs(profile: ClusterProfile) -> str:
    """The profile's node_dirs, made on every node (one task each) before any process needs them."""
    if not profile.node_dirs:
        return ""
    srun = ["srun", Expand("--ntasks=${SLURM_JOB_NUM_NODES}"), "--ntasks-per-node=1", "--cpus-per-task=1"]
    return "\n".join([
        "# Directories on each node's own disk (node_dirs), made before any process needs them",
        join([*srun, "mkdir", "-p", "--", *(Expand(d) for d in profile.node_dirs)]),
    ])  # fmt: skip


def env_name(name: str) -> str:
    """`name` when it can name an environment variable, else a UserError naming it (profiles are
    checked when loaded; this keeps a hand-built profile from reaching the script unchecked)."""
    from ..errors import UserError

    problem = env_name_problem(name)
    if problem:
        raise UserError(f"env.{comment(name)}: {problem}")
    return name


def _rendezvous(job: JobSpec) -> str:
    if job.master_port is not None:
        port = quote(job.master_port)
    else:
        port = f"$(( {PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN} ))"
    lines = [
        "# Rendezvous: the first node of the allocation, on a port derived from the job id",
        "# (sed reads the whole list: with head, scontrol could die of SIGPIPE, which pipefail makes fatal)",
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"',
        f"MASTER_PORT={port}",
        "export MASTER_ADDR MASTER_PORT",
    ]
    if HOSTFILE in get_launcher(job.launcher).needs:
        lines += [
            f"# The {job.launcher} launcher's hostfile: every node of the allocation with its process slots",
            f'scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/\\$/ slots={job.procs_per_node}/" > {quote(RunDir(job.run_dir).hostfile)}',
        ]
    lines.append(
        'echo "supertune: job ${SLURM_JOB_ID} on ${SLURM_JOB_NUM_NODES} node(s), '
        f"{job.world_size} processes ({job.launcher}), master ${{MASTER_ADDR}}:${{MASTER_PORT}}, "
        'restart ${SLURM_RESTART_COUNT:-0}"'
    )
    return "\n".join(lines)


def container_words(profile: ClusterProfile) -> list[object]:
    """The container prefix of the training command, or nothing when the profile runs on the host."""
    c = profile.container
    if c.runtime == "none" or not c.image:
        return []
    words = [c.runtime, "exec"]
    if profile.gpu_vendor == "nvidia":
        words.append("--nv")
    elif profile.gpu_vendor == "amd":
        words.append("--rocm")
    if c.binds:
        words += ["--bind", Expand(",".join(c.binds))]
    # Paths may name variables ($USER, $SCRATCH) that must expand when the job runs.
    return [*words, *(Expand(a) for a in c.extra_args), Expand(c.image)]


def step_words(job: JobSpec, profile: ClusterProfile) -> list[object]:
    """What srun runs on each task: the launcher's command, in the profile's container if any."""
    return get_launcher(job.launcher).step(job.step_plan(container_words(profile)))


def _srun_line(job: JobSpec, words: list[object]) -> str:
    """srun of `words` on every task of the job (under `bash -c` on each node when the launcher needs per-node values)."""
    # --cpus-per-task again: srun of Slurm 22.05 to 23.02 does not take it over from the job, and
    # would confine each launcher agent and all of its processes to one core.
    srun = [
        "srun",
        "--kill-on-bad-exit=1",
        f"--ntasks-per-node={job.tasks_per_node}",
        f"--cpus-per-task={job.cpus_per_task}",
    ]
    if get_launcher(job.launcher).per_node_values:
        # Per-node values ($SLURM_NODEID) must expand on each node, not in this batch shell.
        return (
            "# shellcheck disable=SC2016  # the ${...} in single quotes expand in bash -c on each node\n"
            + join(srun)
            + " bash -c "
            + quote("exec " + join(words))
        )
    return join(srun + words)


_PREFLIGHT_REPORT = RunDir("run").preflight_report.name


def _preflight(job: JobSpec, profile: ClusterProfile) -> str:
    """slurm.preflight: the doctor on every process first; a failed check ends the job before training."""
    if job.preflight is None:
        return ""
    words = get_launcher(job.launcher).step(job.preflight_plan(container_words(profile)))
    return "\n".join([
        "# Pre-flight (slurm.preflight): every process checks its node, then all_reduce and all_gather are",
        "# timed between them (supertune doctor --comm); a failed check stops the job before training",
        _srun_line(job, words) + " || {",
        f'  echo "supertune: pre-flight failed: training not started (the report is above, and in $SUPERTUNE_RUN_DIR/{_PREFLIGHT_REPORT})"',
        "  exit 1",
        "}",
    ])  # fmt: skip


def _step(job: JobSpec, profile: ClusterProfile) -> str:
    lines = [
        _fill(_STOP_HANDLING, job),
        "# Training: " + job.launcher + " (in the background, so that the traps above run at once)",
        _srun_line(job, step_words(job, profile)) + " &",
        _fill(_AFTER_STEP, job),
    ]
    return "\n".join(lines)


def _fill(template: str, job: JobSpec) -> str:
    values = {
        "STOP_FILE": STOP_REQUEST_FILE,
        "STOPPED_FILE": STOPPED_FILE,
        "SUMMARY_FILE": SUMMARY_FILE,
        "REQUEUE_EXIT_CODE": str(REQUEUE_EXIT_CODE),
        "MAX_RESTARTS": str(int(job.max_restarts)),
    }
    for name, value in values.items():
        template = template.replace(f"@{name}@", value)
    return template


# A signal to this shell becomes the stop-request file, which the training processes read once per
# step: they finish the step, save a checkpoint and stop (supertune.train.trainer.stopping). USR1 comes from
# --signal before the time limit (or `scancel --batch --signal=USR1`) and asks for a requeue as
# well; TERM (scancel, preemption) only for the checkpoint: SLURM decides what happens next.
_STOP_HANDLING = """\
# Stop requests: checkpoint, then requeue (USR1) or just stop (TERM)
rm -f -- "$SUPERTUNE_RUN_DIR/@STOP_FILE@" "$SUPERTUNE_RUN_DIR/@STOPPED_FILE@"
requeue_wanted=0
# shellcheck disable=SC2317  # called by the traps below
stop_requested() {
  echo "supertune: $1 received by the job script: the run finishes its step, saves a checkpoint and stops"
  touch -- "$SUPERTUNE_RUN_DIR/@STOP_FILE@"
}
trap 'requeue_wanted=1; stop_requested USR1' USR1
trap 'stop_requested TERM' TERM"""

# `wait` returns early whenever a trapped signal arrives; bash keeps the step's exit status, so the
# last `wait` reads it after the step has ended.
_AFTER_STEP = """\
step_pid=$!
while kill -0 "$step_pid" 2>/dev/null; do wait "$step_pid" || true; done
status=0
wait "$step_pid" || status=$?

# Finished; or stopped after its checkpoint on USR1: requeue while restarts remain
if [ -f "$SUPERTUNE_RUN_DIR/@SUMMARY_FILE@" ] || [ ! -f "$SUPERTUNE_RUN_DIR/@STOPPED_FILE@" ] || [ "$requeue_wanted" != 1 ]; then
  exit "$status"
fi
restarts="${SLURM_RESTART_COUNT:-0}"
if [ "$restarts" -ge @MAX_RESTARTS@ ]; then
  echo "supertune: checkpoint saved, not requeued: slurm.max_restarts (@MAX_RESTARTS@) reached; submit the run again to resume"
  exit @REQUEUE_EXIT_CODE@
fi
echo "supertune: checkpoint saved; requeueing job ${SLURM_JOB_ID} (restart $((restarts + 1)) of @MAX_RESTARTS@)"
if ! scontrol requeue "$SLURM_JOB_ID"; then
  echo "supertune: scontrol requeue failed; submit the run again to resume"
  exit @REQUEUE_EXIT_CODE@
fi
exit 0"""
