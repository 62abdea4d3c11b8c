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
