"""The policy language: text in, a checked ``Policy`` out, and back again.

A policy is a list of statements, each ending in ``;``. Keywords are case-insensitive and
``--`` starts a comment that runs to the end of the line::

    BUDGET EPSILON 3.0 DELTA 1e-6;        -- required, once: the total all queries may spend
    BUDGET PER ANALYST EPSILON 1 DELTA 1e-7;  -- optional: what each analyst may spend in all
    ACCOUNTING ZCDP;                      -- or BASIC (the default) or ADVANCED
    NEIGHBOURS UNBOUNDED;                 -- or BOUNDED (NEIGHBORS is accepted too)
    QUERY EPSILON 0.1 DELTA 0;            -- default cost of a query that names none
    NOISE LAPLACE;                        -- or GAUSSIAN, which needs a budget delta > 0
    PRIVATE TABLE visits (
        PRIVACY UNIT user_id,             -- or PRIVACY UNIT ROW: each row is its own unit
        MAX ROWS PER UNIT 10,             -- required with a unit column
        MAX GROUPS PER UNIT 5,
        amount BOUNDS 0 TO 500,           -- clamping bounds, needed to SUM or AVG
        store KEYS FROM stores.store,     -- a public key domain, from a PUBLIC TABLE ...
        channel KEYS ('web', 'shop'),     -- ... or listed
        answer LOCAL RR EPSILON 1 DOMAIN ('yes', 'no')  -- collected with randomized response
    );
    PUBLIC TABLE stores;

Names are identifiers or double-quoted identifiers; table names may be ``schema.table``.
A column named like an item keyword (``max``, ``privacy``, ``row``) must be double-quoted.
Numbers are parsed from their decimal text into exact ``Fraction`` values, never via float.

``parse_policy`` checks what the text alone decides; ``check_policy`` checks the policy
against the database's catalog (read by the backend, ``dpsql.backends.duckdb.read_catalog``).
Both raise ``PolicyError`` naming the line and column of the offending item.
"""

from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import replace
from decimal import ROUND_CEILING, ROUND_FLOOR
from fractions import Fraction
from pathlib import Path
from typing import Any, NamedTuple

from lark import Lark, Transformer, v_args
from lark.exceptions import UnexpectedInput, VisitError
from lark.lexer import PatternStr

from dpsql.errors import PolicyError
from dpsql.policy.check import (  # noqa: F401  (the public API)
    _error,
    _number_text,
    check_policy,
    validate_policy,
)
from dpsql.policy.model import (
    DEFAULT_MAX_JOIN_MULTIPLICITY,
    DEFAULT_MAX_RELEASED_KEYS,
    DEFAULT_MAX_ROWS_AFTER_JOINS,
    Bounds,
    ColumnRule,
    KeyDomain,
    LocalRR,
    Policy,
    Position,
    PrivateTable,
    PublicTable,
)
from dpsql.sql.names import quoted

_PACKAGE = Path(__file__).resolve().parents[1]  # dpsql/: an installed wheel carries grammar/ inside it
_GRAMMAR_DIRS = (_PACKAGE / "grammar", _PACKAGE.parent / "grammar")
_MAX_EXPONENT = 100  # Fraction("1e999999999") would build a billion-digit integer.
_STATEMENT_WORDS = {"BUDGET", "NEIGHBOURS", "NEIGHBORS", "QUERY", "NOISE", "PRIVATE", "PUBLIC",
                    "ACCOUNTING"}
_TERMINAL_WORDS = {"NAME": "a name", "QUOTED_NAME": "a name", "NUMBER": "a number",
                   "STRING": "a quoted string"}


# --- parsing: text -> statements -> Policy -------------------------------------------------


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    for directory in _GRAMMAR_DIRS:
        if (directory / "policy.lark").is_file():
            grammar = (directory / "policy.lark").read_text(encoding="utf-8")
            return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=True)
    raise FileNotFoundError(f"policy.lark not found in {[str(d) for d in _GRAMMAR_DIRS]}")


class Located(NamedTuple):
    """A name or number with the position it was written at."""

    value: Any
    position: Position


class Statement(NamedTuple):
    """A statement or table item as written: its grammar rule, position and parts."""

    kind: str
    position: Position
    args: tuple


@v_args(inline=True)
class _ToStatements(Transformer):
    """Turns the parse tree into ``Statement``s; judging them is left to ``_build_policy``."""

    def __default__(self, data, children, meta):
        return Statement(str(data), Position(meta.line, meta.column), tuple(children))

    def start(self, *statements):
        return list(statements)

    def number(self, token):
        position = Position(token.line, token.column)
        exponent = re.search(r"[eE]([+-]?\d+)$", token)
        if exponent and abs(int(exponent.group(1))) > _MAX_EXPONENT:  # no billion-digit ints
            raise _error(f"the number {token} is out of range", position,
                         hint=f"write numbers between 1e-{_MAX_EXPONENT} and 1e{_MAX_EXPONENT}")
        return Located(Fraction(str(token)), position)

    def string(self, token):
        return token[1:-1].replace("''", "'")

    def name(self, token):
        text = token[1:-1].replace('""', '"') if token.type == "QUOTED_NAME" else str(token)
        return Located(text, Position(token.line, token.column))

    def table_name(self, first, second):
        return first if second is None else Located(f"{first.value}.{second.value}", first.position)

    def neighbour_relation(self, token):
        return token.lower()

    noise_family = accounting_method = neighbour_relation


def _syntax_error(err: UnexpectedInput, text: str) -> PolicyError:
    """One sentence for lark's exception: what was found where, and what was expected."""
    token = getattr(err, "token", None)
    if token is not None and token.type == "$END":
        found, offset = "the end of the policy", len(text)
        line, col = token.end_line, token.end_column
    else:
        offset = (err.pos_in_stream or 0) if token is None else token.start_pos
        found = repr(str(token) if token else text[offset:offset + 1])
        line, col = err.line, err.column
    if line is None or line < 1:  # an empty policy has no last token to point after
        line, col = 1, 1
    # accepts() replays the parser, so it omits lookaheads LALR only allows before a reduce.
    parser = getattr(err, "interactive_parser", None)
    expected = parser.accepts() if parser else getattr(err, "expected", None) or getattr(err, "allowed", None) or ()
    wanted = sorted({_describe_terminal(name) for name in expected if name != "$END"})
    message = f"syntax error: found {found}"
    if wanted:
        listed = ", ".join(wanted[:-1]) + " or " if len(wanted) > 1 else ""
        message += f" where {listed}{wanted[-1]} was expected"
    before = "\n".join(line.split("--", 1)[0] for line in text[:offset].split("\n"))
    if found == "'.'" and "BOUNDS" in wanted:  # t (..., meta.n BOUNDS 0 TO 9): a STRUCT field
        field = re.search(r'("(?:[^"]|"")+"|[^\W\d]\w*)\s*$', before)
        column = field.group(1) if field else "s"
        return PolicyError(f"BOUNDS and KEYS name a column, not a field of the STRUCT {column}", line=line, col=col,
                           hint=f"bound the field in the query, SUM(CLAMP({column}.f, lo, hi)), or declare a "
                                f"view with the field as a column (SELECT unit, {column}.f AS f FROM t) as the "
                                "private table")
    hint = ("remove the comma before ')'" if found == "')'" and before.rstrip().endswith(",")
            else "end every statement with ';'" if "';'" in wanted and (
                found.strip("'").upper() in _STATEMENT_WORDS or found == "the end of the policy")
            else 'double-quote a column named like a keyword: "max" BOUNDS 0 TO 9'
            if found.upper() in ("'BOUNDS'", "'KEYS'") else None)
    return PolicyError(message, line=line, col=col, hint=hint)


def _describe_terminal(name: str) -> str:
    if name in _TERMINAL_WORDS:
        return _TERMINAL_WORDS[name]
    pattern = next((t.pattern for t in _parser().terminals if t.name == name), None)
    if isinstance(pattern, PatternStr):
        return pattern.value.upper() if pattern.value.isalpha() else f"'{pattern.value}'"
    return name


def parse_policy(text: str) -> Policy:
    """Parse policy text into a ``Policy``, checking everything the text alone decides.

    >>> p = parse_policy('''
    ...     BUDGET EPSILON 1 DELTA 1e-6;   -- the total
    ...     private table t (privacy unit ROW, x BOUNDS -1.5 TO 2);''')
    >>> p.budget_delta, p.table("T").column("x").bounds.lower
    (Fraction(1, 1000000), Fraction(-3, 2))
    >>> parse_policy("BUDGET EPSILON 0;")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    dpsql.errors.PolicyError: BUDGET EPSILON must be greater than 0, not 0 (line 1, column 16)...
    """
    try:
        statements = _ToStatements().transform(_parser().parse(text))
    except UnexpectedInput as err:
        raise _syntax_error(err, text) from None
    except VisitError as err:
        raise err.orig_exc from None
    where: dict = {}  # item key -> Position, so validate_policy can point at the text
    policy = _build_policy(statements, where)
    validate_policy(policy, where)
    return policy



def _whole_setting(count, title: str, example: int, largest: int | None) -> int:
    """A policy setting that counts something: a whole number from 1 (to ``largest``)."""
    if count.value.denominator != 1 or count.value < 1 or (largest is not None and count.value > largest):
        allowed = "of at least 1" if largest is None else f"from 1 to {largest}"
        raise _error(f"{title} must be a whole number {allowed}, not {_number_text(count.value)}",
                     count.position, hint=f"write {title} {example};")
    return int(count.value)

def _single(statements, kinds: tuple[str, ...], what: str) -> Statement | None:
    """The one statement or item of these kinds; a second one is an error."""
    found = [s for s in statements if s.kind in kinds]
    if len(found) > 1:
        first = found[0].position
        raise _error(f"{what} is given twice", found[1].position,
                     hint=f"keep only the one at line {first.line}, column {first.col}")
    return found[0] if found else None


def _build_policy(statements: list[Statement], where: dict) -> Policy:
    budget = _single(statements, ("budget",), "BUDGET")
    if budget is None:
        raise _error("the policy has no BUDGET", Position(1, 1),
                     hint="start it with `BUDGET EPSILON <epsilon>;`")
    settings: dict[str, Any] = {}
    for statement in (budget, _single(statements, ("analyst_budget",), "BUDGET PER ANALYST"),
                      _single(statements, ("query",), "QUERY")):
        if statement is not None:
            epsilon, delta = statement.args
            for part, number in (("epsilon", epsilon), ("delta", delta)):
                where[f"{statement.kind}_{part}"] = (number or epsilon).position
                if number is not None:
                    settings[f"{statement.kind}_{part}"] = number.value
    for kind in ("neighbours", "noise", "accounting"):
        statement = _single(statements, (kind,), kind.upper())
        if statement is not None:
            settings[kind], where[kind] = statement.args[0], statement.position
    for kind, field, title, example, largest in (
            ("join_multiplicity", "max_join_multiplicity", "MAX JOIN MULTIPLICITY", 10, None),
            ("rows_after_joins", "max_rows_after_joins", "MAX ROWS PER UNIT AFTER JOINS", 1000, 10**9),
            ("released_keys", "max_released_keys", "MAX RELEASED KEYS", 10000, 10**9)):
        statement = _single(statements, (kind,), title)
        if statement is not None:
            settings[field] = _whole_setting(statement.args[0], title, example, largest)
            where[field] = statement.position
    bias = _single(statements, ("report_bias",), "REPORT BIAS")
    if bias is not None:
        settings["bias_share"] = bias.args[0].value
        where["bias_share"] = bias.args[0].position  # checked by validate_policy
    private = tuple(_private_table(s.args[0], s.args[1:], where)
                    for s in statements if s.kind == "private_table")
    public = tuple(PublicTable(s.args[0].value, position=s.args[0].position)
                   for s in statements if s.kind == "public_table")
    return Policy(**settings, private_tables=private, public_tables=public)


def _private_table(name: Located, items: tuple[Statement, ...], where: dict) -> PrivateTable:
    table = name.value
    unit_item = _single(items, ("unit_column", "unit_row"), f"PRIVACY UNIT of table {table}")
    if unit_item is None:
        raise _error(f"private table {table} has no PRIVACY UNIT", name.position,
                     hint="add `PRIVACY UNIT <column>`, or `PRIVACY UNIT ROW` if each row is "
                          "one person")
    unit = unit_item.args[0].value if unit_item.kind == "unit_column" else None
    settings: dict[str, Any] = {}
    for kind in ("max_rows", "max_groups"):
        what = f"{kind.replace('_', ' ').upper()} PER UNIT"
        item = _single(items, (kind,), f"{what} of table {table}")
        if item is not None:
            count = item.args[0]
            if count.value.denominator != 1:
                raise _error(f"{what} must be a whole number, not {_number_text(count.value)}",
                             count.position, hint=f"write {math.floor(count.value)}")
            settings[f"{kind}_per_unit"] = int(count.value)
            where[(table.lower(), kind)] = item.position
        elif kind == "max_rows" and unit is not None:
            raise _error(f"the privacy unit {unit} of table {table} has no MAX ROWS PER UNIT",
                         unit_item.position, hint=f"add `MAX ROWS PER UNIT k`: the most rows "
                                                  f"of one {unit} a query may use")
    for kind, what, example in (("max_list", "MAX LIST LENGTH", 100), ("max_string", "MAX STRING LENGTH", 1000)):
        item = _single(items, (kind,), f"{what} of table {table}")
        if item is not None:
            count = item.args[0]
            if count.value.denominator != 1 or count.value < 1:
                raise _error(f"{what} must be a whole number of at least 1, not {_number_text(count.value)}",
                             count.position, hint=f"write {what} {example}")
            settings[f"{kind}_length"] = int(count.value)
            where[(table.lower(), kind)] = item.position
    return PrivateTable(table, unit=unit, columns=_column_rules(table, items, where),
                        position=name.position, **settings)


def _column_rules(table: str, items, where: dict) -> tuple[ColumnRule, ...]:
    """One rule per column: its BOUNDS and KEYS items merge, each kind at most once."""
    rules: dict[str, ColumnRule] = {}
    for item in items:
        if item.kind not in ("bounds", "unit_bounds", "keys_from", "keys_list", "local_rr"):
            continue
        column, *parts = item.args
        value: Bounds | KeyDomain | LocalRR
        if item.kind == "local_rr":
            field, value = "local", LocalRR(parts[0].value, tuple(map(_key_value, parts[1:])))
            where[(table.lower(), column.value.lower(), "local_epsilon")] = parts[0].position
        elif item.kind == "bounds":
            field, value = "bounds", Bounds(parts[0].value, parts[1].value)
        elif item.kind == "unit_bounds":
            field, value = "unit_bounds", Bounds(parts[0].value, parts[1].value)
        elif item.kind == "keys_list":
            field, value = "keys", KeyDomain(values=tuple(map(_key_value, parts)))
        else:  # the last name is the column, what comes before it the (maybe qualified) table
            *source, source_column = [part.value for part in parts if part is not None]
            field, value = "keys", KeyDomain(table=".".join(source), column=source_column)
        key = (table.lower(), column.value.lower(), field)
        rule = rules.get(key[1]) or ColumnRule(column.value, position=item.position)
        if getattr(rule, field) is not None:
            first = where[key]
            raise _error(f"column {column.value} of table {table} is given "
                         f"{_FIELD_WORDS[field]} twice",
                         item.position,
                         hint=f"keep only the one at line {first.line}, column {first.col}")
        change: dict[str, Any] = {field: value}
        rules[key[1]] = replace(rule, **change)
        where[key] = item.position
    return tuple(rules.values())


_FIELD_WORDS = {"local": "LOCAL RR", "bounds": "BOUNDS", "unit_bounds": "BOUNDS PER UNIT", "keys": "KEYS"}


def _key_value(literal):
    """Whole numbers become ``int`` so they compare and render like SQL integer keys."""
    if isinstance(literal, str):
        return literal
    return int(literal.value) if literal.value.denominator == 1 else literal.value


# --- validating a Policy, from text or built in Python -----------------------------------


def load_policy(source) -> Policy:
    """A ``Policy`` from a Policy (returned as is), a path to a policy file, or policy text."""
    if isinstance(source, Policy):
        return source
    if isinstance(source, (str, os.PathLike)) and _is_file(source):
        return parse_policy(Path(source).read_text(encoding="utf-8"))
    if isinstance(source, str) and (";" in source or "\n" in source):
        return parse_policy(source)
    raise _error(f"no policy file {source!r}", None,
                 hint="pass a path to an existing file, policy text, or a Policy")


def _is_file(path) -> bool:
    try:
        return Path(path).is_file()
    except (OSError, ValueError):  # too long for a file name, or holds a NUL
        return False


# --- rendering: Policy -> text -----------------------------------------------------------


def policy_to_text(policy: Policy) -> str:
    """Write a policy in the policy language; ``parse_policy`` reads it back unchanged.

    >>> print(policy_to_text(parse_policy("budget epsilon 1.50 delta 1E-7; query epsilon .1;")))
    BUDGET EPSILON 1.5 DELTA 1E-7;
    NEIGHBOURS UNBOUNDED;
    QUERY EPSILON 0.1;
    NOISE LAPLACE;
    <BLANKLINE>
    """
    lines = [_budget_text("BUDGET", policy.budget_epsilon, policy.budget_delta)]
    if policy.analyst_budget_epsilon is not None:
        lines.append(_budget_text("BUDGET PER ANALYST", policy.analyst_budget_epsilon,
                                  policy.analyst_budget_delta))
    if policy.accounting != "basic":
        lines.append(f"ACCOUNTING {policy.accounting.upper()};")
    lines.append(f"NEIGHBOURS {policy.neighbours.upper()};")
    if policy.query_epsilon is not None:
        query = f"QUERY EPSILON {_number_text(policy.query_epsilon, ROUND_FLOOR)}"
        if policy.query_delta:
            query += f" DELTA {_number_text(policy.query_delta, ROUND_FLOOR)}"
        lines.append(query + ";")
    elif policy.query_delta:
        raise _error("a QUERY DELTA cannot be written without a QUERY EPSILON", None,
                     hint="set query_epsilon too")
    lines.append(f"NOISE {policy.noise.upper()};")
    if policy.max_join_multiplicity != DEFAULT_MAX_JOIN_MULTIPLICITY:
        lines.append(f"MAX JOIN MULTIPLICITY {policy.max_join_multiplicity};")
    if policy.max_rows_after_joins != DEFAULT_MAX_ROWS_AFTER_JOINS:
        lines.append(f"MAX ROWS PER UNIT AFTER JOINS {policy.max_rows_after_joins};")
    if policy.max_released_keys != DEFAULT_MAX_RELEASED_KEYS:
        lines.append(f"MAX RELEASED KEYS {policy.max_released_keys};")
    if policy.bias_share is not None:
        lines.append(f"REPORT BIAS SHARE {_number_text(policy.bias_share)};")
    for table in policy.private_tables:
        items = ",\n".join(f"    {item}" for item in _table_items(table))
        lines += ["", f"PRIVATE TABLE {_table_name_text(table.name)} (", items, ");"]
    if policy.public_tables:
        lines.append("")
    lines += [f"PUBLIC TABLE {_table_name_text(table.name)};" for table in policy.public_tables]
    return "\n".join(lines) + "\n"


def _budget_text(statement: str, epsilon: Fraction, delta: Fraction) -> str:
    """A budget statement, rounded down: never more budget than stated."""
    text = f"{statement} EPSILON {_number_text(epsilon, ROUND_FLOOR)}"
    if delta:
        text += f" DELTA {_number_text(delta, ROUND_FLOOR)}"
    return text + ";"


def _table_items(table: PrivateTable) -> list[str]:
    items = ["PRIVACY UNIT " + ("ROW" if table.unit is None else _name_text(table.unit))]
    if not table.row_level or table.max_rows_per_unit != 1:
        items.append(f"MAX ROWS PER UNIT {table.max_rows_per_unit}")
    if table.max_groups_per_unit is not None:
        items.append(f"MAX GROUPS PER UNIT {table.max_groups_per_unit}")
    if table.max_list_length is not None:
        items.append(f"MAX LIST LENGTH {table.max_list_length}")
    if table.max_string_length is not None:
        items.append(f"MAX STRING LENGTH {table.max_string_length}")
    for rule in table.columns:
        name = _name_text(rule.name)
        if rule.bounds is not None:
            # Rounding outward keeps a non-decimal bound safe: clamping only gets looser.
            items.append(f"{name} BOUNDS {_number_text(rule.bounds.lower, ROUND_FLOOR)} TO "
                         f"{_number_text(rule.bounds.upper, ROUND_CEILING)}")
        if rule.unit_bounds is not None:
            items.append(f"{name} BOUNDS PER UNIT {_number_text(rule.unit_bounds.lower, ROUND_FLOOR)} TO "
                         f"{_number_text(rule.unit_bounds.upper, ROUND_CEILING)}")
        keys = rule.keys  # a checked policy's KEYS: a table and a column, or values
        if keys is not None and keys.table is not None and keys.column is not None:
            items.append(f"{name} KEYS FROM {_table_name_text(keys.table)}.{_name_text(keys.column)}")
        elif keys is not None and keys.values is not None:
            items.append(f"{name} KEYS ({', '.join(map(_literal_text, keys.values))})")
        if rule.local is not None:
            items.append(f"{name} LOCAL RR EPSILON {_number_text(rule.local.epsilon)} "
                         f"DOMAIN ({', '.join(map(_literal_text, rule.local.domain))})")
    return items


def _literal_text(value) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, (int, float, Fraction)) and not isinstance(value, bool):
        return _number_text(value)
    raise _error(f"the key {value!r} cannot be written in a policy", None,
                 hint="keys are strings or numbers")


@functools.lru_cache(maxsize=1)
def _keywords() -> frozenset[str]:
    return frozenset(t.pattern.value.upper() for t in _parser().terminals
                     if isinstance(t.pattern, PatternStr) and t.pattern.value.isalpha())


def _name_text(name: str) -> str:
    if re.fullmatch(r"[^\W\d]\w*", name) and name.upper() not in _keywords():
        return name
    return quoted(name)


def _table_name_text(name: str) -> str:
    return ".".join(_name_text(part) for part in name.split("."))
