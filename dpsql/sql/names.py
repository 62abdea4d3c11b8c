"""Names as the analyst writes them: shown in messages and hints, never compared.

DuckDB matches table and column names case-insensitively, so dpsql compares them lower-cased
(``dpsql.analysis.bind``). What an analyst reads must be SQL they can paste back: a name is shown as
the query wrote it, or as the database spells it, quoted when SQL needs quotes (``"Customer
ID"``), never as the lower-cased key (``customer id``).

>>> sql_name("Customer ID"), sql_name("amount"), sql_name('a"b')
('"Customer ID"', 'amount', '"a""b"')
>>> columns_hint("amout", ["amount", "age", "day", "store", "user_id", "zip"])
'did you mean amount? The columns are: age, amount, day, store, user_id, zip'
"""

from __future__ import annotations

import difflib
import re

_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

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
    return name if _BARE.fullmatch(name) else '"' + name.replace('"', '""') + '"'


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
