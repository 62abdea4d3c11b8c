"""The curator's ``dpsql serve`` and ``dpsql user`` commands: their arguments and what they run
(``dpsql.cli`` lists them with the other commands).

>>> import argparse
>>> parser = argparse.ArgumentParser(); user_arguments(parser)
>>> parser.parse_args(["add", "users.txt", "ada", "--password-stdin"]).password_stdin
True
"""

from __future__ import annotations

import argparse
import getpass
import logging
import sys

from dpsql.backends.deadline import DEFAULT_REQUEST_TIMEOUT
from dpsql.errors import DPError


def serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("database", metavar="DB", help="the DuckDB database file to serve (opened read-only)")
    parser.add_argument("--policy", metavar="P", help="the policy file (default: the one stored by `dpsql init`)")
    parser.add_argument("--users", metavar="USERS", required=True,
                        help="the users file (`dpsql user add`); read again at every login")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=5433, help="port to listen on (default: 5433)")
    parser.add_argument("--tls-cert", metavar="C", help="certificate (PEM) for TLS; with --tls-key")
    parser.add_argument("--tls-key", metavar="K", help="private key (PEM) for TLS")
    parser.add_argument("--max-connections", type=int, default=64, help="concurrent connections (default: 64)")
    parser.add_argument("--workers", type=_positive, default=None,
                        help="worker processes answering queries side by side (default: one per core); "
                             "threads with --threads or on Spark (default: two per core)")
    parser.add_argument("--threads", action="store_true",
                        help="answer in threads of one process instead of worker processes")
    parser.add_argument("--query-timeout", type=float, default=30.0,
                        help="seconds a query may run; a query stopped by it stays charged (default: 30)")
    parser.add_argument("--request-timeout", type=float, default=DEFAULT_REQUEST_TIMEOUT,
                        help="seconds one request of many statements (a stream, a fit) may take, counted before "
                             "its charge as its statements times --query-timeout; a longer one is refused "
                             "(default: 3600)")
    parser.add_argument("--persist-copies", action="store_true",
                        help="keep the bounded copies beside the ledger (DB.ledger.copies, owner-only) so a restart "
                             "reuses them; rebuilt when the data, policy or salt changed")


def serve(args: argparse.Namespace) -> int:
    from dpsql.server import serve as run_server

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.tls_cert is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        print("dpsql serve: warning: no TLS on a non-loopback address; SCRAM keeps the password "
              "safe but not the queries and answers", file=sys.stderr)
    run_server(args.database, users=args.users, policy=args.policy, host=args.host, port=args.port,
               tls_cert=args.tls_cert, tls_key=args.tls_key, max_connections=args.max_connections,
               query_timeout=args.query_timeout, request_timeout=args.request_timeout,
               persist_copies=args.persist_copies, **({"processes": False} if args.threads else {}),
               **({} if args.workers is None else {"workers": args.workers}))
    return 0


def _positive(text: str) -> int:
    """An integer of at least 1, for ``--workers``."""
    number = int(text)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def user_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("add", "remove", "list"),
                        help="add (or change the password of) a user, remove one, list them")
    parser.add_argument("users", metavar="USERS", help="the users file (created by the first `add`)")
    parser.add_argument("name", metavar="NAME", nargs="?", help="the analyst's name (add, remove)")
    parser.add_argument("--password-stdin", action="store_true",
                        help="read the password from the first line of standard input instead of a prompt")


def user(args: argparse.Namespace) -> int:
    from dpsql.server.users import add_user, load_users, remove_user

    if args.action == "list":
        for name in sorted(load_users(args.users)):
            print(name)
        return 0
    if args.name is None:
        raise DPError(f"`dpsql user {args.action}` needs the analyst's name",
                      hint=f"write dpsql user {args.action} {args.users} NAME")
    if args.action == "remove":
        remove_user(args.users, args.name)
        print(f"removed {args.name}; their ledger entries stay", file=sys.stderr)
        return 0
    add_user(args.users, args.name, read_password(args.password_stdin))
    print(f"{args.name} can connect now, with SCRAM-SHA-256; {args.users} keeps a verifier, "
          "not the password", file=sys.stderr)
    return 0


def read_password(from_stdin: bool) -> str:
    """The new password: the first line of standard input, or typed twice at a prompt."""
    if from_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    first = getpass.getpass("Password: ")
    if getpass.getpass("Again: ") != first:
        raise DPError("the two passwords differ", hint="type the same password twice")
    return first
