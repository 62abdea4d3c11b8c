"""What the catalog says of each table and column: the policy's rules, as PostgreSQL comments
(psql's ``\\d+`` and ``\\dt+`` Description, SQLAlchemy's ``comment``, JDBC's ``REMARKS``).

The policy is public to the analyst (``SHOW policy``); these are its rules beside the names
they govern, nothing more.

>>> from dpsql.policy.language import parse_policy
>>> policy = parse_policy("BUDGET EPSILON 1; PRIVATE TABLE v (PRIVACY UNIT uid, MAX ROWS PER UNIT 5, "
...                       "x BOUNDS 0 TO 2.5, k KEYS ('a', 'b')); PUBLIC TABLE s;")
>>> table, columns = described(policy)["v"]
>>> table
'private: privacy unit uid, at most 5 rows per unit'
>>> columns
{'uid': 'privacy unit', 'x': 'clamped to [0, 2.5]', 'k': "keys 'a', 'b'"}
>>> described(policy)["s"]
('public: answered exactly, at no cost', {})
"""

from __future__ import annotations

from dpsql.policy.model import Policy, PrivateTable
from dpsql.server.intervals import exact_text

LISTED_KEYS = 8
"""Keys a comment lists; the rest are counted (``SHOW policy`` lists them all)."""


def described(policy: Policy) -> dict[str, tuple[str, dict[str, str]]]:
    """Table name -> (the table's comment, column name -> the column's comment)."""
    found: dict[str, tuple[str, dict[str, str]]] = {}
    for table in policy.private_tables:
        found[table.name] = (_table_text(table), _columns_text(table))
    for public in policy.public_tables:
        found[public.name] = ("public: answered exactly, at no cost", {})
    return found


def _table_text(table: PrivateTable) -> str:
    unit = "each row its own privacy unit" if table.row_level else f"privacy unit {table.unit}"
    limits = f"at most {table.max_rows_per_unit} row{'' if table.max_rows_per_unit == 1 else 's'}"
    if table.max_groups_per_unit is not None:
        limits += f" and {table.max_groups_per_unit} groups"
    return f"private: {unit}, {limits} per unit"


def _columns_text(table: PrivateTable) -> dict[str, str]:
    texts: dict[str, list[str]] = {}
    if table.unit is not None:
        texts[table.unit] = ["privacy unit"]
    for rule in table.columns:
        parts = texts.setdefault(rule.name, [])
        if rule.bounds is not None:
            parts.append(f"clamped to [{exact_text(rule.bounds.lower)}, {exact_text(rule.bounds.upper)}]")
        keys = rule.keys
        if keys is not None and keys.table is not None and keys.column is not None:
            parts.append(f"keys from {keys.table}.{keys.column}")
        elif keys is not None and keys.values is not None:
            listed = ", ".join(_key_text(value) for value in keys.values[:LISTED_KEYS])
            more = len(keys.values) - LISTED_KEYS
            parts.append(f"keys {listed}" + (f" and {more:,} more" if more > 0 else ""))
        if rule.local is not None:
            listed = ", ".join(_key_text(value) for value in rule.local.domain[:LISTED_KEYS])
            parts.append(f"randomized response at epsilon {exact_text(rule.local.epsilon)} over {listed}")
    return {name: "; ".join(parts) for name, parts in texts.items() if parts}


def _key_text(value) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return exact_text(value) if not isinstance(value, (bool, float)) and hasattr(value, "denominator") \
        else str(value)
