"""A ``dpsql serve`` of the small shop database for wire tests: one analyst, its own ledger."""

from __future__ import annotations

from dpsql.server import start_in_thread
from dpsql.server.users import add_user


def serve_shop(database, directory, policy: str, user: str, password: str):
    """Start a server (kernel-picked port) on ``database`` under ``policy``; the caller stops it."""
    (directory / "shop.policy").write_text(policy)
    add_user(directory / "users", user, password)
    return start_in_thread(database, users=directory / "users", policy=directory / "shop.policy", port=0,
                           ledger=directory / "ledger")


def psql_lines(server, user: str, password: str, *commands: str) -> tuple[list[str], str]:
    """(output lines, stdout + stderr) of psql running ``commands`` unaligned and tuples-only
    against ``server`` as ``user``."""
    import os
    import shutil
    import subprocess

    environment = {**os.environ, "PGPASSWORD": password, "PGCONNECT_TIMEOUT": "5"}
    arguments = [shutil.which("psql"), "-h", "127.0.0.1", "-p", str(server.port), "-U", user, "-d", "shop",
                 "-X", "-A", "-t"]
    for command in commands:
        arguments += ["-c", command]
    done = subprocess.run(arguments, env=environment, capture_output=True, text=True, timeout=120)
    return done.stdout.splitlines(), done.stdout + done.stderr
