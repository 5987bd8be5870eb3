"""The `phaselens` command: one module per command group, composed here.

``serve`` and ``load`` are the serving stack's own (:mod:`serving.cli`, which stays independent of
the rest); ``collect`` (:mod:`phaselens.cli.collect`), ``store``, ``simulate``, ``analyze``,
``goodput``, ``report`` and ``demo`` each have their module in this package (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import argparse
import re
import sys

from phaselens.cli.analyze import add_analyze_command
from phaselens.cli.apply import add_apply_commands
from phaselens.cli.calibrate import add_calibrate_command
from phaselens.cli.collect import add_collect_command
from phaselens.cli.demo import add_demo_command
from phaselens.cli.export import add_export_command
from phaselens.cli.goodput import add_goodput_command
from phaselens.cli.recommend import add_recommend_command
from phaselens.cli.report import add_report_command
from phaselens.cli.simulate import add_simulate_command
from phaselens.cli.store import add_store_command
from phaselens.cli.workload import add_workload_command
from serving import cli as serving_cli


def build_parser() -> argparse.ArgumentParser:
    """The ``phaselens`` parser with every command group, in the order ``--help`` lists them."""
    parser = argparse.ArgumentParser(
        prog="phaselens", description="phase-aware GPU efficiency for LLM serving"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serving_cli.add_commands(sub)
    add_collect_command(sub)
    add_store_command(sub)
    add_simulate_command(sub)
    add_analyze_command(sub)
    add_goodput_command(sub)
    add_recommend_command(sub)
    add_report_command(sub)
    add_export_command(sub)
    add_workload_command(sub)
    add_demo_command(sub)
    add_apply_commands(sub)  # apply, rollback
    add_calibrate_command(sub)
    return parser


# A value that starts with a dash and a digit: a negative number or span (``-5``, ``-0.5``, ``-5m``).
_DASH_VALUE = re.compile(r"-\.?\d")


def attach_dash_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--since -5m`` → ``--since=-5m``: argparse takes a value that starts with a dash for an option
    (``expected one argument``) unless it reads as a plain negative number, so the command's own
    check never saw it; attached, the value reaches that check, which says what is allowed.

    Only a long option of the chosen command that takes one value, followed by a token that starts
    with a dash and a digit and is not itself one of the command's options, is attached.
    """
    commands = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    at = next((i for i, tok in enumerate(argv) if commands and tok in commands.choices), None)
    if commands is None or at is None:
        return list(argv)
    options = commands.choices[argv[at]]._option_string_actions
    out = list(argv[: at + 1])
    i = at + 1
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            out += argv[i:]
            break
        action = options.get(tok)
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if (
            tok.startswith("--")
            and action is not None
            and action.nargs is None
            and nxt is not None
            and _DASH_VALUE.match(nxt)
            and nxt not in options
        ):
            out.append(f"{tok}={nxt}")
            i += 2
            continue
        out.append(tok)
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    """Run ``phaselens`` with ``argv`` (default: the process's arguments); the command's exit status."""
    parser = build_parser()
    args = parser.parse_args(attach_dash_values(parser, sys.argv[1:] if argv is None else argv))
    return int(args.func(args) or 0)
