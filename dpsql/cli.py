"""The ``dpsql`` command line.

Each subcommand is one ``Command`` in ``COMMANDS``: its name, a one-line help, an example
for ``--help``, a function that declares its arguments and a function that runs it and
returns an exit code. Adding ``query`` or ``budget`` is one more entry, nothing else.
Errors become exit codes in one place, ``exit_code``.

>>> main(["demo", "--help"])  # doctest: +ELLIPSIS
usage: dpsql demo [-h] [--dir DIR]
...
0
"""

from __future__ import annotations

import argparse
import sys
import traceback
from dataclasses import dataclass
from typing import Callable, Sequence

from dpsql.errors import BudgetExceeded, DPError, UnsupportedQuery

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_REFUSED = 2
EXIT_OVER_BUDGET = 3

EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (UnsupportedQuery, EXIT_REFUSED),
    (BudgetExceeded, EXIT_OVER_BUDGET),
)
"""Which error ends the process with which code, first match wins; anything else is 1."""

_EXIT_CODES_HELP = """\
exit codes:
  0  success
  1  any other error (bad arguments, policy errors, I/O, ...)
  2  the query was refused (nothing was charged)
  3  the query would exceed the privacy budget (nothing was charged)"""


def exit_code(error: BaseException) -> int:
    """The exit code for an error that ended a command.

    >>> exit_code(UnsupportedQuery("window functions are not supported"))
    2
    >>> exit_code(ValueError("anything else"))
    1
    """
    for kind, code in EXIT_CODES:
        if isinstance(error, kind):
            return code
    return EXIT_ERROR


@dataclass(frozen=True)
class Command:
    """One ``dpsql`` subcommand."""

    name: str
    """What the user types after ``dpsql``."""
    help: str
    """One line for the list of commands and the top of the command's ``--help``."""
    example: str
    """Example invocations shown at the end of the command's ``--help``."""
    add_arguments: Callable[[argparse.ArgumentParser], None]
    """Declares the command's arguments on its parser."""
    run: Callable[[argparse.Namespace], int]
    """Runs the command and returns its exit code; errors it raises are mapped by ``exit_code``."""


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir",
        metavar="DIR",
        default=None,
        help="where to write shop.duckdb, shop.policy and the ledger (default: ./demo-data)",
    )


def _demo(args: argparse.Namespace) -> int:
    from dpsql.demo import run_demo

    run_demo(args.dir, sys.stdout)
    return EXIT_OK


COMMANDS: tuple[Command, ...] = (
    Command(
        name="demo",
        help="build a sample shop database and run example queries on it",
        example="  dpsql demo\n  dpsql demo --dir /tmp/shop",
        add_arguments=_demo_arguments,
        run=_demo,
    ),
)
"""Every subcommand, in the order ``--help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``dpsql`` with one subparser per entry of ``COMMANDS``."""
    parser = argparse.ArgumentParser(
        prog="dpsql",
        description="Differentially private SQL over DuckDB.",
        epilog="example:\n  dpsql demo\n\n" + _EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    for command in COMMANDS:
        sub = subparsers.add_parser(
            command.name,
            help=command.help,
            description=command.help[:1].upper() + command.help[1:] + ".",
            epilog=f"example:\n{command.example}\n\n{_EXIT_CODES_HELP}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(sub)
        sub.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dpsql`` with ``argv`` (default: the process arguments) and return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        # argparse exits 2 on bad usage; 2 means "refused" here, so bad usage is 1.
        return EXIT_OK if exit_.code in (0, None) else EXIT_ERROR
    if getattr(args, "run", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    try:
        return args.run(args)
    except DPError as error:
        print(f"dpsql: {error}", file=sys.stderr)
        return exit_code(error)
    except OSError as error:
        print(f"dpsql: {error}", file=sys.stderr)
        return EXIT_ERROR
    except Exception:
        traceback.print_exc()
        print("dpsql: internal error (this is a bug, please report it)", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
