"""One step of a federated round as StreamFlow runs it, where StreamFlow put it (entry point
`site-task` of supertune.entry):

    python -m supertune.entry site-task train    --federation-id ID --site S --round N --config SITE_YAML --site-dir DIR --global-model DIR
    python -m supertune.entry site-task average  --federation DIR --round N --previous DIR --publish DIR --sites S1 S2 ... --checkpoint DIR1 --checkpoint DIR2 ...
    python -m supertune.entry site-task evaluate --federation-id ID --site S --round N --config SITE_YAML --site-dir DIR --model DIR
    python -m supertune.entry site-task check    --site S < SITE_YAML

`check` runs over SSH at a site with `login` before its first round: the site's run config (on
stdin) is checked there, where its data and tokenizer are, and nothing is written.

Each writes its outputs into the current directory (StreamFlow's output folder of the step), under
names that tell the sites apart: train `checkpoint-S/` (hard links of the run's final checkpoint)
and `trained-S.json`; average `global-model/` and `averaged.json`; evaluate `evaluated-S.json`.

A site's run lives at a stable path (`--site-dir`/run), not in StreamFlow's folders, which are new
on every run: a round that failed and is run again resumes the same run from its latest checkpoint.
The global model StreamFlow staged is linked to `--site-dir`/start-model first, so the run's config
names the same model every time (a resumed run refuses changed settings).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

from ....errors import UserError
from ...rounds.failures import FederationError
from ...state.receipts import write_trained
from ...state.records import FailedTraining

__all__ = ["add_arguments", "run", "link_tree", "START_MODEL", "TRAIN_LOG"]

START_MODEL = "start-model"
"""The global model a site's round starts from, next to its run."""
TRAIN_LOG = "train.log"
COST = "cost.json"
"""The attempts of the site's training this round (cost.py), beside its run."""


def link_tree(source: Path, target: Path) -> None:
    """`target` as a copy of the directory `source` made of hard links (copies across file systems),
    published by a rename: a directory at `target` is always complete. An existing one is kept,
    unless it is empty (earlier versions published an empty one for a missing source, which every
    later attempt then kept and failed on). A missing or empty `source` is a FederationError (a
    failed attempt, retried), never an empty `target`."""
    if target.is_dir() and any(target.iterdir()):
        return
    if not source.is_dir() or not any(path.is_file() for path in source.rglob("*")):
        raise FederationError(
            f"{source} is missing or holds no files, so {target} cannot be made from it; "
            "check that the step was given the model (the round's global model or a checkpoint)",
            f"failed: no model at {source.name}",
        )
    if target.is_dir():
        target.rmdir()
    source = source.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        for path in sorted(source.rglob("*")):
            dest = tmp / path.relative_to(source)
            if path.is_dir():
                dest.mkdir(exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, dest)
            except OSError:  # another file system, or one without hard links
                shutil.copy2(path, dest)
        os.chmod(tmp, 0o755)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _restore_home() -> None:
    """A CWL runner sets HOME to the step's output folder (the current directory). supertune's
    caches, user profiles and the Hugging Face cache default to paths under the real home, so it is
    taken back from the password database. A HOME set on purpose for the step is left alone."""
    import pwd

    if os.environ.get("HOME") and Path(os.environ["HOME"]).resolve() == Path.cwd().resolve():
        os.environ["HOME"] = pwd.getpwuid(os.getuid()).pw_dir


# -- train ----------------------------------------------------------------------------------------


def train(
    site: str,
    number: int,
    config: Path,
    site_dir: Path,
    global_model: Path,
    out: Path,
    federation_id: str,
    report_failure: bool = False,
) -> dict:
    """The site's round, trained or resumed at its stable path (or found finished: a round run again
    after its average failed hands the finished checkpoint out again), checked, handed out. The
    folder must be this federation's (ownership): another federation's run is never reused.

    With `report_failure` (a round with a quorum or retries), a training that fails, or a checkpoint
    refused, is reported in `trained-<site>.json` as {site, round, failed: reason} and the step
    succeeds: StreamFlow ends every other step of a workflow when one fails, and the other sites'
    training must go on for the quorum. Returns the record written."""
    from ....rundir import RunDir
    from ...rounds.attempts import reason_of
    from ...rounds.phases import trained_record
    from ...state.ownership import claim_site_dir

    site_dir.mkdir(parents=True, exist_ok=True)
    ours = claim_site_dir(site_dir, federation_id, site, number)
    run = RunDir(site_dir / "run")
    if ours and run.summary.is_file():
        print(f"supertune: {site} round {number}: this federation's run in {run.path} finished in an earlier attempt; "
              "handing its checkpoint out again", flush=True)  # fmt: skip
    elif ours and run.path.exists():
        print(f"supertune: {site} round {number}: resuming this federation's run in {run.path}", flush=True)
    kept = site_dir / "site.yaml"
    text = config.read_text(encoding="utf-8")
    if not kept.is_file() or kept.read_text(encoding="utf-8") != text:
        kept.write_text(text, encoding="utf-8")
    receipt = out / f"trained-{site}.json"
    try:
        if not run.summary.is_file():
            start = site_dir / START_MODEL
            link_tree(global_model, start)
            code = _train_run(site, number, kept, start, run.path, site_dir / TRAIN_LOG, site_dir / COST)
            if code != 0:
                raise FederationError(
                    f"{site} round {number}: training stopped (exit code {code}); see {site_dir / TRAIN_LOG}; the run "
                    f"in {run.path} resumes when the round runs again",
                    f"failed: {_exit_text(code)}",
                )
        try:
            record = trained_record(site, number, run.path)
        except UserError as exc:  # its checkpoint does not match its manifest: not averaged
            said = reason_of(exc, f"{site} round {number}")
            raise FederationError(str(exc), f"refused: {said}") from None
    except FederationError as exc:
        if not report_failure:
            raise
        print(f"supertune: {exc}", flush=True)
        failed = FailedTraining(site, number, exc.reason or reason_of(exc, f"{site} round {number}"))
        write_trained(receipt, failed)
        return failed.as_json()
    # The whole checkpoint, as its manifest lists it (the average refuses one with files missing):
    # with AdamW in fp32 that includes an optimizer state twice the weights' size.
    link_tree(Path(record.checkpoint), out / f"checkpoint-{site}")
    write_trained(receipt, record)
    return record.as_json()


def _exit_text(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit {code}"


def _train_run(site: str, number: int, config: Path, start: Path, run: Path, logfile: Path, cost: Path) -> int:
    """Train the site's round here (as `supertune train` would), or, for a cluster site, run the job
    script supertune renders for it inside the SLURM allocation StreamFlow submitted; the exit code.
    slurm.max_restarts=0 there: the job is StreamFlow's, and a requeue would restart StreamFlow's command.
    Here, the attempt's processes and wall time go to `cost` (a SLURM job's times are Slurm's, read by the
    federation: cost.py)."""
    import time

    from ....config.load import load_saved_config
    from ....launch.environment import slurm_allocation
    from ....resolve import resolve
    from ....runs.local import train_logged
    from ....runs.slurm import prepare_slurm, run_script_here
    from ...state.cost import RUNNING, Attempt, end_attempt, record_attempt

    model = f"model.name_or_path={start}"
    label = f"{site} round {number}"
    print(f"supertune: {label}: training (log {logfile})", flush=True)
    if load_saved_config(config).launch.cluster == "local":
        resolution = resolve(config, [model])
        started = time.time()
        nproc = resolution.config.launch.nproc
        record_attempt(
            cost, Attempt(job=None, nodes=1, submit=started, start=started, end=None, outcome=RUNNING, processes=nproc)
        )
        code = 1
        try:
            code = train_logged(resolution, run, logfile).exit_code
        finally:  # a step ended from outside (SIGTERM) does not get here: the federation closes its attempt
            end_attempt(cost, started, time.time(), "finished" if code == 0 else f"failed: {_exit_text(code)}")
        return code
    if slurm_allocation() is None:
        raise UserError(
            f"{label}: a cluster site's step runs inside a SLURM job, and this is none; bind it to the site's slurm deployment"
        )
    choice, _ = prepare_slurm(resolve(config, [model, "slurm.max_restarts=0"]), str(run))
    return run_script_here(choice.run.job_script, logfile)


# -- check ------------------------------------------------------------------------------------------


def check(site: str, text: str) -> None:
    """The site's base run config checked here, at the site, with the checks of its files (data,
    tokenizer) that the federation's machine cannot make; one ConfigError naming the site."""
    import yaml

    from ....config.build import build_config
    from ....config.errors import ConfigError
    from ....config.schema import RunConfig
    from ....config.validate import config_problems
    from ....resolve.checks import model_file_problems

    try:
        data = yaml.safe_load(text)
        if not isinstance(data, dict):
            raise ConfigError(["the site's run config on stdin is not a mapping of sections"])
        # The model each round starts from is the federation's global model, staged here by the
        # round itself: the base model's path (on the federation's machine) is not looked for here.
        if isinstance(data.get("model"), dict):
            data["model"]["name_or_path"] = None
        cfg = build_config(RunConfig, data)
        problems = config_problems(cfg) + model_file_problems(cfg)
    except (ConfigError, yaml.YAMLError) as exc:
        problems = getattr(exc, "problems", None) or [str(exc).splitlines()[0]]
    if problems:
        raise ConfigError([f"site {site}: {p}" for p in problems])


# -- average ----------------------------------------------------------------------------------------


def average(
    federation: Path, number: int, previous: Path, checkpoints: list[tuple[str, Path]], publish: Path, out: Path
) -> dict:
    """Average the sites' checkpoints into `publish` (the round's global model in the federation
    directory: this step runs on the federation's machine), and link it into `out` for the evaluations."""
    from ...config.load import load_federation
    from ...rounds.phases import average_round
    from ...state.history import active_federation
    from ...state.layout import FederationDir
    from ...state.receipts import read_receipt

    root = FederationDir(federation)
    fed, _ = load_federation(federation)
    fed = active_federation(fed, root)  # a dropped site has no checkpoint here
    # The sites left out of the round (failed, late, skipped): decided by the federation, kept in their receipts.
    left_out = {
        s.name: str(receipt.get("reason"))
        for s in fed.sites
        if (receipt := read_receipt(root.round(number).site(s.name).left_out)) is not None
    }
    record = average_round(
        fed,
        number,
        [s for s, _ in checkpoints],
        [str(c) for _, c in checkpoints],
        previous,
        publish,
        out / "averaged.json",
        left_out=left_out,
    )
    link_tree(publish, out / "global-model")
    return record


# -- evaluate -------------------------------------------------------------------------------------


def evaluate(site: str, number: int, config: Path, site_dir: Path, model: Path, out: Path, federation_id: str) -> dict:
    """The global model's loss on the site's validation data: here for a local site, through the
    site's evaluation job script (its modules, environment, container) inside the allocation otherwise.
    The folder must be this federation's (round 0 is claimed here: it has no train step)."""
    from ....config.load import load_saved_config
    from ...state.ownership import claim_site_dir
    from ..builtin.site_eval import evaluate_at_site

    site_dir.mkdir(parents=True, exist_ok=True)
    claim_site_dir(site_dir, federation_id, site, number)

    receipt = out / f"evaluated-{site}.json"
    cfg = load_saved_config(config)
    if cfg.launch.cluster == "local":
        return evaluate_at_site(config, model, receipt)
    from ....clusters import load_profile
    from ....launch.environment import slurm_allocation
    from ....rundir import RunDir
    from ....runs.slurm import run_script_here
    from ....slurm.script import render_sbatch
    from ...rounds.site_jobs import evaluation_job

    label = f"{site} round {number}"
    if slurm_allocation() is None:
        raise UserError(
            f"{label}: a cluster site's step runs inside a SLURM job, and this is none; bind it to the site's slurm deployment"
        )
    directory = RunDir(site_dir / "evaluate")
    directory.logs.mkdir(parents=True, exist_ok=True)
    kept = directory.path / "site.yaml"
    shutil.copyfile(config, kept)
    profile = load_profile(cfg.launch.cluster, what=f"site {site}: where")
    job = evaluation_job(
        cfg, profile, directory.path, f"{site}-eval-r{number:03d}", (str(kept), str(model), str(receipt))
    )
    directory.job_script.write_text(render_sbatch(job, profile), encoding="utf-8")
    logfile = site_dir / "evaluate.log"
    code = run_script_here(directory.job_script, logfile)
    if code != 0 or not receipt.is_file():
        raise UserError(f"{label}: evaluation stopped (exit code {code}); see {logfile}")
    return json.loads(receipt.read_text(encoding="utf-8"))


# -- command line ---------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = "One step of a federated round (StreamFlow)."
    sub = p.add_subparsers(dest="task", required=True)
    t = sub.add_parser("train")
    t.add_argument("--federation-id", required=True, help="the federation's id, recorded in the site's folder")
    t.add_argument("--site", required=True)
    t.add_argument("--round", type=int, required=True)
    t.add_argument("--config", type=Path, required=True, help="the site's resolved run config of this round")
    t.add_argument(
        "--site-dir", type=Path, required=True, help="the site's stable folder of this round (the run, its log)"
    )
    t.add_argument(
        "--global-model",
        type=Path,
        required=True,
        help="the global model this round starts from (as StreamFlow staged it)",
    )
    t.add_argument(
        "--report-failure",
        action="store_true",
        help="a failed training is reported in trained-SITE.json ({failed: reason}) and the step succeeds",
    )
    a = sub.add_parser("average")
    a.add_argument("--federation", type=Path, required=True)
    a.add_argument("--round", type=int, required=True)
    a.add_argument("--previous", type=Path, required=True)
    a.add_argument(
        "--publish", type=Path, required=True, help="where the round's global model goes (federation directory)"
    )
    a.add_argument("--sites", nargs="+", required=True, help="the sites, in the federation's order")
    a.add_argument(
        "--checkpoint",
        type=Path,
        action="append",
        default=[],
        help="each site's final checkpoint, in the order of --sites",
    )
    e = sub.add_parser("evaluate")
    e.add_argument("--federation-id", required=True, help="the federation's id, recorded in the site's folder")
    e.add_argument("--site", required=True)
    e.add_argument("--round", type=int, required=True)
    e.add_argument("--config", type=Path, required=True, help="the site's base run config (its data settings)")
    e.add_argument("--site-dir", type=Path, required=True)
    e.add_argument("--model", type=Path, required=True)
    c = sub.add_parser("check", help="check the site's run config (on stdin) where its files are")
    c.add_argument("--site", required=True)


def run(args: argparse.Namespace) -> int:
    import sys

    _restore_home()
    out = Path.cwd()
    if args.task == "check":
        check(args.site, sys.stdin.read())
        print(f"supertune: site {args.site}: its run config's files are here", flush=True)
        return 0
    try:
        return _run_task(args, out)
    except UserError as exc:
        # StreamFlow's log shows this line among every step's: it names the site.
        label = f"{args.site} round {args.round}" if args.task != "average" else ""
        if label and not str(exc).startswith(label):
            raise UserError(f"{label}: {exc}") from None
        raise


def _run_task(args: argparse.Namespace, out: Path) -> int:
    if args.task == "train":
        record = train(args.site, args.round, args.config, args.site_dir, args.global_model, out, args.federation_id,
                       report_failure=args.report_failure)  # fmt: skip
        if "failed" not in record:
            print(
                f"supertune: {args.site} round {args.round}: trained, checkpoint {record['checkpoint']} verified",
                flush=True,
            )
    elif args.task == "average":
        if len(args.sites) != len(args.checkpoint):
            raise UserError(
                f"--checkpoint: {len(args.checkpoint)} given for {len(args.sites)} sites; give one per site, in their order"
            )
        record = average(
            args.federation, args.round, args.previous, list(zip(args.sites, args.checkpoint)), args.publish, out
        )
        print(f"supertune: round {args.round}: averaged into {record['global_model']}", flush=True)
    else:
        record = evaluate(args.site, args.round, args.config, args.site_dir, args.model, out, args.federation_id)
        print(
            f"supertune: {args.site} round {args.round}: eval loss {record['eval_loss']:.4f} of the global model",
            flush=True,
        )
    return 0
