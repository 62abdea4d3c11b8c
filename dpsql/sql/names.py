"""Names: how a table is keyed in the catalog, how a name is quoted in SQL, how it is shown.

DuckDB matches table and column names case-insensitively, so dpsql compares them lower-cased,
keyed by ``table_key`` (``schema.table``, the default schema dropped). SQL that dpsql writes
quotes every name (``quoted``, ``quoted_table``), so any spelling survives. What an analyst reads
must be SQL they can paste back: a name is shown as the query wrote it, or as the database
spells it, quoted only when SQL needs quotes (``sql_name``: ``"Customer ID"``), never as the
lower-cased key (``customer id``).

>>> sql_name("Customer ID"), sql_name("amount"), sql_name('a"b')
('"Customer ID"', 'amount', '"a""b"')
>>> columns_hint("amout", ["amount", "age", "day", "store", "user_id", "zip"])
'did you mean amount? The columns are: age, amount, day, store, user_id, zip'
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

DEFAULT_SCHEMA = "main"
"""DuckDB's default schema: ``main.visits`` and ``visits`` are one table."""


def key_of_parts(parts: Sequence[str]) -> str:
    """Catalog key of a table name given as its parts (a quoted part may hold a dot):
    lower-cased, joined with dots, the default schema dropped.

    >>> key_of_parts(["Main", "Visits"]), key_of_parts(["sales", "Orders"]), key_of_parts(["main.x"])
    ('visits', 'sales.orders', 'main.x')
    """
    lowered = [part.lower() for part in parts]
    if len(lowered) == 2 and lowered[0] == DEFAULT_SCHEMA:
        lowered = lowered[1:]
    return ".".join(lowered)


def table_key(name: str) -> str:
    """Catalog key of a dotted table name as a policy writes it (``Main.Visits``: ``visits``).

    >>> table_key("Main.Visits"), table_key("sales.Orders"), table_key("visits")
    ('visits', 'sales.orders', 'visits')
    """
    return key_of_parts(name.split("."))


def quoted(name: str) -> str:
    """One identifier as SQL that dpsql writes: always quoted, inner quotes doubled.

    >>> quoted("amount"), quoted("Customer ID"), quoted('a"b')
    ('"amount"', '"Customer ID"', '"a""b"')
    """
    return '"' + name.replace('"', '""') + '"'


def quoted_table(name: str) -> str:
    """A dotted table name (``schema.table``) with each part ``quoted``.

    >>> quoted_table("sales.Orders"), quoted_table("visits")
    ('"sales"."Orders"', '"visits"')
    """
    return ".".join(quoted(part) for part in name.split("."))


LISTED = 12
"""A hint lists every name when there are at most this many; otherwise only the nearest."""


class Catalog(dict):
    """Lower-cased table name -> {lower-cased column: DuckDB type}, as ``Engine.catalog`` reads
    it, which also remembers how the database spells each name (for messages only)."""

    def __init__(self, *args, spellings: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.spellings: dict[str, str] = dict(spellings or {})
        """Lower-cased name -> the database's own spelling, for tables and columns."""


def spelled(name: str, spellings: dict[str, str] | None) -> str:
    """``name`` as the database spells it, when known."""
    return (spellings or {}).get(name.lower(), name)


def sql_name(name: str, spellings: dict[str, str] | None = None) -> str:
    """``name`` (in the database's spelling, when known) as SQL writes it: bare when it is a
    plain word, else in double quotes."""
    name = spelled(name, spellings)
    return name if _BARE.fullmatch(name) else quoted(name)


def columns_hint(wrong: str, names: list[str], spellings: dict[str, str] | None = None,
                 what: str = "columns") -> str:
    """A hint for an unknown name: the nearest known names first, then all of them when the
    list is short (``LISTED``); names are shown as SQL writes them."""
    ordered = sorted(names)
    shown = {name: sql_name(name, spellings) for name in ordered}
    near = difflib.get_close_matches(wrong.lower(), ordered, n=3, cutoff=0.6)
    parts = []
    if near:
        parts.append("did you mean " + " or ".join(shown[n] for n in near) + "?")
    if len(ordered) <= LISTED:
        parts.append(f"{'The' if parts else 'the'} {what} are: " + ", ".join(shown[n] for n in ordered))
    elif not near:
        parts.append(f"none of the {len(ordered)} {what} is close to it")
    return " ".join(parts)


# Reserved column names of the bounded copies (``dpsql.backends.bounding``): the policy refuses
# columns that would collide with them.
PAD = "dp_pad"
"""The copies' column marking the two padding rows."""
ROW_UNIT = "dp_row"
"""The hidden unit column of a row-level table's copy: each row's own id (never in scope)."""
ROW_UNIT_TYPE = "UHUGEINT"
"""The type of ``ROW_UNIT``: a salted 128-bit hash (``dpsql.backends.bounding``)."""
