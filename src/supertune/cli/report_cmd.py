"""`supertune report RUN_DIR... | SWEEP_DIR [--out DIR]`"""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = (
    "A markdown table (devices, nodes, train time, tokens/s, speedup, scaling efficiency, MFU, eval loss) and PNG "
    "plots of a sweep's runs or of run directories: speedup against ideal, tokens/s per device and every run's loss "
    "curve on one axis; for one run, its loss and learning-rate curves and its throughput over steps. Every number "
    "comes from the runs' summary.json and metrics.jsonl; the table is printed and written with the plots."
)


def epilog() -> str:
    return (
        "examples:\n"
        "  supertune report runs/supertune-sweep-20261123-101500\n"
        "  supertune report runs/llama-1gpu runs/llama-8gpu runs/llama-16gpu --out report/\n"
        "  supertune report runs/llama-it-20261121-101500      # one run: loss, learning rate, throughput\n"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "paths", nargs="+", metavar="RUN_DIR|SWEEP_DIR", help="a sweep directory, or one or more run directories"
    )
    p.add_argument(
        "--out",
        help="folder for report.md, report.json and the PNGs (default: <sweep or run dir>/report, or ./report for several runs)",
    )


def run(args: argparse.Namespace) -> int:
    from ..sweeps.report import write_report

    folder, table = write_report(args.paths, args.out)
    sys.stdout.write(table)
    print(f"supertune: report in {folder / 'report.md'} with its plots", file=sys.stderr)
    return 0
