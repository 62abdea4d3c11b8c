"""What a mechanism is given: the few things of a connection it may use, and no more.

A mechanism (``dpsql.calls``: a sparse vector stream, a fit, an MWEM workload, a PMW session)
plans through the connection's preparation of queries, prices itself, and spends through the
connection's ``Spender`` (``dpsql.query.spend``); it reads public key domains and draws noise
from the connection's source. It never reaches into the connection: ``Connection.mechanism_context()``
builds this for the analyst (and the call) a view of the connection acts for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dpsql.policy.model import Policy
from dpsql.query.prepare import Prepared
from dpsql.query.spend import Spender


@dataclass(frozen=True)
class MechanismContext:
    """A connection as a mechanism sees it (module docstring)."""

    policy: Policy
    """The policy that rules the connection."""
    catalog: dict[str, dict[str, str]]
    """Table key -> column name -> type, of every table (schema only)."""
    policy_text: str
    """The policy in dpsql's policy language, as repeat keys name it."""
    analyst: str | None
    """Who is asking (``None``: the curator)."""
    spender: Spender
    """The one way to spend: lock, free repeat, charge, run, release, record."""
    prepare: Callable[..., Prepared]
    """``prepare(sql, epsilon, delta, noise, weights, report_bias)``: ``db.sql``'s static half, for the analyst."""
    source: Any
    """The noise source (``None``: the cryptographically secure default)."""
    dialect: str
    """The engine's SQL dialect, statements are rendered in."""
    read_keys: Callable[[list[tuple], Any], list[tuple]]
    """Fetched rows with their keys as DuckDB reads them back (``dpsql.backends.keys``)."""
    fetch_public: Callable[[str], list[tuple]]
    """Rows of a statement over public data only (a KEYS domain): nothing private is read."""
    pmw_sessions: dict
    """The open PMW sessions, shared by every view of the connection (``dpsql.calls.pmw_call``)."""
