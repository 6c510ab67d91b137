"""`supertune federate [FEDERATION.yaml | DIR] [--dir DIR]` and `supertune federate --status DIR`"""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = (
    "Federated training across sites: in every round each site trains the global model on its own data "
    "(a local process, or a SLURM job on its cluster), the checkpoints are verified and averaged (token-weighted "
    "FedAvg), and the new global model is evaluated on every site's data. Run the same command again after a "
    "crash, a time limit or a lost site: it resumes at the first unfinished phase. Without FEDERATION: the embedded "
    "default, two local sites on their own corpora, three rounds."
)


def epilog() -> str:
    return (
        "examples:\n"
        "  supertune federate                                   # the embedded default: 2 local sites, 3 rounds\n"
        "  supertune federate federation.yaml --dir runs/llama-2sites\n"
        "  supertune federate runs/llama-2sites                 # resume it\n"
        "  supertune federate --status runs/llama-2sites        # the per-round table, dropped sites, failures\n"
        "  supertune federate runs/llama-2sites --drop karolina # go on without a site that cannot (its rounds stay in the table)\n"
        "  supertune federate runs/llama-2sites --skip-site lumi  # leave a site out of the next round only\n"
        "  supertune federate federation.yaml --plan            # expected node-hours and bytes of the rounds left\n"
        "  supertune federate --site leonardo ssh://me@vm.example.org/srv/fed   # a site's agent (executor: agents)\n"
        "  supertune federate --site leonardo ssh://me@vm.example.org/srv/fed --new-key ~/.supertune/leonardo.key\n"
        "  supertune federate --site leonardo ssh://me@vm.example.org/srv/fed --submit --cluster leonardo --time 04:00:00\n"
        "                                                       # the agent as a chain of SLURM jobs\n"
        "  supertune federate runs/llama-2sites --plan --link link.json   # and each round's time over a measured link\n"
        "\n"
        "The federation config and its keys: docs/federated/config.md.\n"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "federation",
        nargs="?",
        help="federation YAML, or a federation directory to resume (default: the embedded default)",
    )
    p.add_argument("--dir", help="federation directory (default: runs/<name>); an unfinished federation there resumes")
    p.add_argument(
        "--status",
        metavar="DIR",
        help="print the per-round table of a federation directory, its dropped sites and failures, and exit (from "
        "its receipts: the sites' configs and cluster profiles need not be on this machine)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check every site's config and print the plan and each Slurm site's job script; write and start nothing",
    )
    p.add_argument(
        "--plan",
        action="store_true",
        help="print the expected node-hours and bytes of every round still to run, per site, from the config and the rounds run; run nothing",
    )
    p.add_argument(
        "--site",
        metavar="NAME",
        help="run the agent of site NAME (executor: agents): FEDERATION is then the exchange (a directory or "
        "ssh://[user@]host[:port]/path); it trains the site's rounds here and meets the coordinator there, waits "
        "out an outage of the exchange, and stops when the coordinator drops the site (--drop)",
    )
    p.add_argument(
        "--submit",
        action="store_true",
        help="with --site: run the agent as a chain of SLURM jobs on --cluster, each submitting the next before its "
        "time limit, until the federation's last round; with --dry-run, print the job script",
    )
    p.add_argument(
        "--new-key",
        metavar="KEYFILE",
        help="with --site NAME: make the site's key pair for secure aggregation: the private key in KEYFILE (mode "
        "0600, never overwritten), the public key printed, to pin in the federation config as sites[].public_key; "
        "nothing else is done",
    )
    p.add_argument(
        "--key",
        metavar="KEYFILE",
        help="with --site NAME EXCHANGE: the site's private key (--new-key made it); the agent refuses to run unless "
        "its public key is the one the federation pins for the site",
    )
    p.add_argument("--cluster", help="with --site --submit: the cluster profile whose SLURM runs the agent's jobs")
    p.add_argument("--time", help="with --site --submit: each job's wall-clock limit (default 04:00:00)")
    p.add_argument(
        "--partition", help="with --site --submit: the partition of the agent's jobs (default: the profile's)"
    )
    p.add_argument(
        "--link",
        metavar="FILE",
        help="with --plan: also forecast each round's time (train, upload, wait, download) from a link measured by "
        "`supertune doctor --exchange URL --out FILE`",
    )
    p.add_argument(
        "--drop",
        metavar="SITE",
        action="append",
        default=[],
        help="drop SITE from the first round not yet averaged on, then go on (repeat for several); its earlier rounds stay in the table",
    )
    p.add_argument(
        "--skip-site",
        metavar="SITE",
        action="append",
        default=[],
        help="leave SITE out of the next round (the first not yet averaged) only, recorded in its receipts, then go on (repeat for several)",
    )


def run(args: argparse.Namespace) -> int:
    from ..errors import UserError

    chain = [f for f, v in (("--submit", args.submit), ("--cluster", args.cluster), ("--time", args.time),
                            ("--partition", args.partition)) if v]  # fmt: skip
    if chain and not (args.site and args.submit):
        raise UserError(
            f"{chain[0]}: only with --site NAME EXCHANGE --submit (a site's agent as a chain of SLURM jobs)"
        )
    if (args.new_key or args.key) and not args.site:
        raise UserError(f"{'--new-key' if args.new_key else '--key'}: only with --site NAME (a site's key)")
    if args.new_key:
        return _new_key(args)
    if args.key and args.submit:
        raise UserError(
            "--key: not with --submit yet (a chain's jobs take no key); run the agent by hand with --site NAME EXCHANGE --key KEYFILE"
        )
    if args.site and args.submit:
        return _submit_chain(args)
    if args.status:
        if args.federation or args.dir or args.drop or args.skip_site:
            raise UserError("--status DIR takes no other arguments; e.g. supertune federate --status runs/llama-2sites")
        from ..federation import federation_status

        print(federation_status(args.status), end="")
        return 0
    if args.link and not args.plan:
        raise UserError("--link: only with --plan, whose forecast it feeds")
    if args.plan or args.dry_run:
        if args.plan and args.dry_run:
            raise UserError(
                "--plan and --dry-run: give one of them (--plan: the cost; --dry-run: the plan and job scripts)"
            )
        if args.drop or args.skip_site:
            option = "--drop" if args.drop else "--skip-site"
            which = "--plan" if args.plan else "--dry-run"
            raise UserError(f"{which} and {option}: {which} changes nothing; leave out {option} to see the plan")
        from ..federation import federation_cost_plan, federation_plan

        if args.plan:
            sys.stdout.write(federation_cost_plan(args.federation, args.dir, link=args.link))
        else:
            sys.stdout.write(federation_plan(args.federation, args.dir))
        return 0
    from ..federation import federate
    from ..train.lifecycle.logging_setup import setup_logging

    if args.site:
        if not args.federation or args.drop or args.skip_site:
            raise UserError(
                "--site NAME EXCHANGE: give the exchange (a directory or ssh://[user@]host[:port]/path), and no --drop/--skip-site"
            )
        from ..federation.executors.agents.site_agent import run_agent_through_outages

        setup_logging()
        ended = run_agent_through_outages(args.site, args.federation, args.dir, args.key)
        print(f"supertune: {ended.said}")
        return 0

    setup_logging()

    root = federate(args.federation, args.dir, args.drop, args.skip_site)
    print((root.table_markdown).read_text(encoding="utf-8"), end="")
    plot = f", plot {root.plot.name}" if root.plot.is_file() else ""
    print(f"supertune: federation finished: {root.path} (table {root.table_markdown.name}{plot})")
    return 0


def _new_key(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..errors import UserError
    from ..federation.state.site_key import make_site_key

    others = [f for f, v in (("--key", args.key), ("--dir", args.dir), ("--drop", args.drop),
                             ("--skip-site", args.skip_site), ("--status", args.status), ("--plan", args.plan),
                             ("--dry-run", args.dry_run)) if v]  # fmt: skip
    if others:
        raise UserError(f"--new-key: makes a key and does nothing else; leave out {others[0]}")
    public = make_site_key(Path(args.new_key).expanduser())
    print(public)
    print(f"supertune: site {args.site}: private key written to {args.new_key} (mode 0600; it never leaves this site); "
          f"pin the public key above in the federation config as the site's public_key, and run its agent with "
          f"--key {args.new_key}", file=sys.stderr)  # fmt: skip
    return 0


def _submit_chain(args: argparse.Namespace) -> int:
    from ..config.schema import RunConfig
    from ..errors import UserError
    from ..federation.executors.agents.agent_chain import plan_chain, render_chain_script, submit_chain
    from ..runs.submit_checks import placeholder_problems

    if not args.federation or args.drop or args.skip_site or args.plan or args.status:
        raise UserError("--site NAME EXCHANGE --submit: give the exchange, and no --drop/--skip-site/--plan/--status")
    chain, profile = plan_chain(args.site, args.federation, args.dir, args.cluster, args.time, args.partition)
    script = render_chain_script(chain, profile)
    # The profile's placeholder account or modules would fail the job only after its wait in the queue.
    problems = placeholder_problems(RunConfig(), profile)
    if problems and not args.dry_run:
        raise UserError("; ".join(problems))
    if args.dry_run:
        sys.stdout.write(script)
        for problem in problems:
            print(f"warning: {problem}", file=sys.stderr)
        print(f"supertune: dry run: nothing written, nothing submitted (the script would be {chain.job_dir.job_script})",
              file=sys.stderr)  # fmt: skip
        return 0
    job_id = submit_chain(chain, script)
    print(job_id)
    print(f"supertune: site {args.site}: submitted job {job_id} on {chain.cluster}, a link of the agent's chain; "
          f"logs in {chain.job_dir.logs}, the agent's directory {chain.directory}", file=sys.stderr)  # fmt: skip
    return 0
