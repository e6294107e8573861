"""The ``python -m mk`` command line: one module per group of subcommands, each parsing its arguments and calling
into ``mk``; this module puts them together in one parser (``mk.__main__`` runs it). Each command imports what it
runs inside its own function, so that ``python -m mk sol`` answers without loading JAX, the kernels or torch."""

from __future__ import annotations

import argparse
import sys

from .compiler import add_compile, add_schedule
from .generate import add_generate
from .measure import add_bench, add_measure, add_report, add_tpu_measure, add_tpu_smoke
from .modelled import add_lists, add_predict, add_sol, add_straggler

COMMANDS = (
    add_sol,
    add_lists,
    add_generate,
    add_bench,
    add_straggler,
    add_predict,
    add_schedule,
    add_compile,
    add_report,
    add_measure,
    add_tpu_smoke,
    add_tpu_measure,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mk", description="mk: decode megakernels for Gemma 4")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
