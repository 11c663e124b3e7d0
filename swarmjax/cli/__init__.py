"""The ``swarmjax`` command line. Subcommands register themselves in :data:`COMMANDS`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

# name -> (help, add_arguments(parser), run(args) -> exit code)
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None],
                          Callable[[argparse.Namespace], int]]] = {}

# What ``swarmjax --help`` prints above the command list: plain text, not the module
# docstring (argparse shows reST roles and literals verbatim).
DESCRIPTION = ("The swarmjax command line: train and evaluate RL policies, sample from a "
               "checkpoint, look at orchestration traces. 'swarmjax COMMAND --help' "
               "describes each command.")


def register(name: str, help: str):
    """Decorator for a subcommand module's ``(add_arguments, run)`` pair."""
    def wrap(fns):
        COMMANDS[name] = (help, *fns)
        return fns
    return wrap


def build_parser() -> argparse.ArgumentParser:
    from swarmjax.cli import envs, export, plan, sample, serve, trace, train  # noqa: F401  (register their commands)

    parser = argparse.ArgumentParser(prog="swarmjax", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_, add_arguments, run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        add_arguments(p)
        p.set_defaults(_run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args._run(args)
    except ValueError as e:  # bad input: one clear line, no traceback
        print(f"swarmjax {args.command}: error: {e}", file=sys.stderr)
        return 2
