"""Checking a policy: its values (``validate_policy``) and its fit to the database (``check_policy``).

Every problem is a ``PolicyError`` naming the line and column of the policy text where the
offending item was written (positions are ``None`` for a policy built in Python).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import ROUND_HALF_EVEN, Decimal, localcontext
from fractions import Fraction

from dpsql.errors import PolicyError
from dpsql.policy.model import Bounds, ColumnRule, Policy, Position, PrivateTable, PublicTable
from dpsql.sql.names import PAD, ROW_UNIT, sql_name
from dpsql.sql.numbers import finite_decimal
from dpsql.sql.types import (
    base_type,
    decimal_shape,
    equality_is_identity,
    family,
    inward,
    is_numeric_type,
    step,
    value_range,
)


def _error(message: str, position: Position | None, hint: str | None = None) -> PolicyError:
    line, col = (position.line, position.col) if position else (None, None)
    return PolicyError(message, line=line, col=col, hint=hint)


def validate_policy(policy: Policy, where: Mapping | None = None) -> None:
    """Check a ``Policy``'s values; ``where`` maps item keys to positions for messages.

    Runs on every parsed policy and, through ``check_policy``, on policies built in Python.

    >>> from fractions import Fraction
    >>> validate_policy(Policy(Fraction(1), query_epsilon=Fraction(2)))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    dpsql.errors.PolicyError: QUERY EPSILON 2 is more than BUDGET EPSILON 1. Hint: ...
    """
    where = where or {}
    _check_number(policy.budget_epsilon, "BUDGET EPSILON", where.get("budget_epsilon"), "epsilon")
    _check_number(policy.budget_delta, "BUDGET DELTA", where.get("budget_delta"), "delta")
    if policy.query_epsilon is not None:
        _check_number(policy.query_epsilon, "QUERY EPSILON", where.get("query_epsilon"), "epsilon")
    _check_number(policy.query_delta, "QUERY DELTA", where.get("query_delta"), "delta")
    for part in ("epsilon", "delta"):
        asked, total = getattr(policy, f"query_{part}"), getattr(policy, f"budget_{part}")
        if asked is not None and asked > total:
            raise _error(f"QUERY {part.upper()} {_number_text(asked)} is more than BUDGET "
                         f"{part.upper()} {_number_text(total)}", where.get(f"query_{part}"),
                         hint="a query may not cost more than the whole budget; lower it")
    for field, allowed in (("neighbours", ("unbounded", "bounded")),
                           ("noise", ("laplace", "gaussian")),
                           ("accounting", ("basic", "advanced", "zcdp"))):
        if getattr(policy, field) not in allowed:
            raise _error(f"{field} must be one of {allowed}, not {getattr(policy, field)!r}", None)
    if policy.noise == "gaussian" and policy.budget_delta == 0:
        raise _error("NOISE GAUSSIAN needs a budget delta greater than 0", where.get("noise"),
                     hint="write `BUDGET EPSILON e DELTA d;` with d > 0, or use NOISE LAPLACE")
    if policy.bias_share is not None and not (isinstance(policy.bias_share, Fraction) and 0 < policy.bias_share < 1):
        shown = _number_text(policy.bias_share) if isinstance(policy.bias_share, Fraction) else repr(policy.bias_share)
        raise _error(f"REPORT BIAS SHARE must be above 0 and below 1, not {shown}",
                     where.get("bias_share"), hint="write REPORT BIAS SHARE 0.05; (5% of each query's epsilon)")
    _check_analyst_budget(policy, where)
    _check_tables(policy, where)


def _check_analyst_budget(policy: Policy, where: Mapping) -> None:
    """BUDGET PER ANALYST fits in the total; ADVANCED and ZCDP have a delta to work with."""
    epsilon, delta = policy.analyst_budget_epsilon, policy.analyst_budget_delta
    budgets = [("BUDGET", "budget", policy.budget_delta)]
    if epsilon is not None:
        _check_number(epsilon, "BUDGET PER ANALYST EPSILON",
                      where.get("analyst_budget_epsilon"), "epsilon")
        budgets.append(("BUDGET PER ANALYST", "analyst_budget", delta))
    _check_number(delta, "BUDGET PER ANALYST DELTA", where.get("analyst_budget_delta"), "delta")
    if epsilon is None and delta:
        raise _error("a BUDGET PER ANALYST DELTA needs a BUDGET PER ANALYST EPSILON", None,
                     hint="set analyst_budget_epsilon too")
    for part in ("epsilon", "delta") if epsilon is not None else ():
        mine, total = getattr(policy, f"analyst_budget_{part}"), getattr(policy, f"budget_{part}")
        asked = getattr(policy, f"query_{part}")
        if asked is not None and asked > mine:
            raise _error(f"QUERY {part.upper()} {_number_text(asked)} is more than BUDGET PER "
                         f"ANALYST {part.upper()} {_number_text(mine)}", where.get(f"query_{part}"),
                         hint="a query may not cost more than an analyst's budget; lower it")
        if mine > total:
            raise _error(f"BUDGET PER ANALYST {part.upper()} {_number_text(mine)} is more than "
                         f"BUDGET {part.upper()} {_number_text(total)}",
                         where.get(f"analyst_budget_{part}"),
                         hint="an analyst can never spend more than the total; lower it")
    if policy.accounting == "basic":
        return
    for statement, key, budget_delta in budgets:
        if budget_delta == 0:
            raise _error(f"ACCOUNTING {policy.accounting.upper()} needs a {statement} DELTA "
                         "greater than 0", where.get("accounting", where.get(f"{key}_epsilon")),
                         hint=f"write `{statement} EPSILON e DELTA d;` with d > 0 (such as 1e-6), "
                              "or use ACCOUNTING BASIC")


def _check_number(value, what: str, position: Position | None, kind: str = "bound") -> None:
    """Exact numbers only, so that the privacy arithmetic built on them stays exact."""
    if isinstance(value, bool) or not isinstance(value, (int, Fraction)):
        raise _error(f"{what} must be an exact number (int or Fraction), not {value!r}",
                     position, hint="write Fraction('0.1') rather than 0.1")
    if kind == "epsilon" and value <= 0:
        raise _error(f"{what} must be greater than 0, not {_number_text(value)}", position,
                     hint="epsilon is a positive number such as 1 or 0.1")
    if kind == "delta" and not 0 <= value < 1:
        raise _error(f"{what} must be at least 0 and less than 1, not {_number_text(value)}",
                     position, hint="delta is a small probability such as 1e-6")


def _check_count(value, what: str, position: Position | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _error(f"{what} must be a whole number of at least 1, not {value!r}", position,
                     hint="a unit that may contribute nothing cannot be queried; write 1 or more")


def _check_tables(policy: Policy, where: Mapping) -> None:
    declared: dict[str, PrivateTable | PublicTable] = {}
    tables: tuple[PrivateTable | PublicTable, ...] = (*policy.private_tables, *policy.public_tables)
    for table in tables:
        first = declared.setdefault(table.name.lower(), table)
        if first is not table:
            where_first = (f" at line {first.position.line}, column {first.position.col}"
                           if first.position else "")
            raise _error(f"table {sql_name(table.name)} is declared twice", table.position,
                         hint=f"keep only the declaration{where_first}")
    for table in policy.private_tables:
        _check_private_table(table, declared, where)


def _check_private_table(table: PrivateTable, declared: Mapping, where: Mapping) -> None:
    t = table.name.lower()
    rows_at = where.get((t, "max_rows"), table.position)
    _check_count(table.max_rows_per_unit, "MAX ROWS PER UNIT", rows_at)
    if table.row_level and table.max_rows_per_unit != 1:
        raise _error(f"table {sql_name(table.name)} has PRIVACY UNIT ROW, so MAX ROWS PER UNIT must be 1, "
                     f"not {table.max_rows_per_unit}", rows_at,
                     hint="remove MAX ROWS PER UNIT, or name the unit: `PRIVACY UNIT <column>`")
    if table.max_groups_per_unit is not None:
        _check_count(table.max_groups_per_unit, "MAX GROUPS PER UNIT",
                     where.get((t, "max_groups"), table.position))
    if table.max_list_length is not None:  # a Policy built in Python is checked here too
        _check_count(table.max_list_length, "MAX LIST LENGTH", where.get((t, "max_list"), table.position))
    if table.max_string_length is not None:
        _check_count(table.max_string_length, "MAX STRING LENGTH", where.get((t, "max_string"), table.position))
    seen: set[str] = set()
    for rule in table.columns:
        c = rule.name.lower()
        if c in seen:
            raise _error(f"column {sql_name(rule.name)} of table {sql_name(table.name)} is ruled twice",
                         rule.position, hint="merge its rules into one")
        seen.add(c)
        if table.unit is not None and c == table.unit.lower():
            what = "LOCAL RR" if rule.local is not None else "BOUNDS or KEYS"
            raise _error(f"the privacy unit column {sql_name(rule.name)} of table {sql_name(table.name)} cannot have "
                         f"{what}", rule.position,
                         hint="remove the rule: the unit is never released or summed" + (
                             "; randomized response protects a value, never who reported it"
                             if rule.local is not None else ""))
        if rule.local is not None:
            _check_local(table, rule, where)
        if rule.bounds is not None:
            _check_bounds(table, rule, where.get((t, c, "bounds"), rule.position))
        if rule.unit_bounds is not None:
            _check_unit_bounds(table, rule, where.get((t, c, "unit_bounds"), rule.position))
        if rule.keys is not None:
            _check_keys(table, rule, declared, where.get((t, c, "keys"), rule.position))


def _check_local(table: PrivateTable, rule: ColumnRule, where: Mapping) -> None:
    """``LOCAL RR EPSILON e DOMAIN (...)``: e > 0, two or more distinct values, and no KEYS (the
    DOMAIN is the column's key domain)."""
    local = rule.local
    assert local is not None
    t, c = table.name.lower(), rule.name.lower()
    position = where.get((t, c, "local"), rule.position)
    name = f"{sql_name(table.name)}.{sql_name(rule.name)}"
    _check_number(local.epsilon, f"the LOCAL RR EPSILON of {name}", where.get((t, c, "local_epsilon"), position),
                  "epsilon")
    if isinstance(local.epsilon, Fraction) and finite_decimal(local.epsilon) is None:
        raise _error(f"the LOCAL RR EPSILON of {name} must be a decimal number, not {local.epsilon}",
                     position, hint="write the epsilon the reports were drawn at, such as Fraction('0.5')")
    domain = tuple(local.domain)
    if len(domain) < 2:
        raise _error(f"the LOCAL RR DOMAIN of {name} lists {len(domain)} value{'s' if len(domain) != 1 else ''}: "
                     "randomized response needs two or more", position,
                     hint="list every value a report can take, such as DOMAIN ('yes', 'no')")
    seen: set = set()
    for value in domain:
        if isinstance(value, bool) or not isinstance(value, (str, int, Fraction)):
            raise _error(f"the LOCAL RR DOMAIN of {name} lists {value!r}, neither text nor a number", position,
                         hint="list quoted text or numbers")
        shown = f"'{value}'" if isinstance(value, str) else _number_text(value)
        identity = (isinstance(value, str), value)
        if identity in seen:
            raise _error(f"the LOCAL RR DOMAIN of {name} lists {shown} twice", position,
                         hint="list each value once: k, the number of values, sets the report probabilities")
        seen.add(identity)
    if rule.keys is not None:
        raise _error(f"column {name} has both KEYS and LOCAL RR", where.get((t, c, "keys"), position),
                     hint="remove the KEYS: the LOCAL RR DOMAIN is the column's key domain")


def _check_bounds(table: PrivateTable, rule: ColumnRule, position: Position | None) -> None:
    if rule.bounds is None:
        return
    lower, upper = rule.bounds.lower, rule.bounds.upper
    _check_number(lower, f"the lower bound of {sql_name(rule.name)}", position)
    _check_number(upper, f"the upper bound of {sql_name(rule.name)}", position)
    if lower > upper:
        raise _error(f"the BOUNDS of column {sql_name(rule.name)} of table {sql_name(table.name)} are reversed: "
                     f"{_number_text(lower)} is more than {_number_text(upper)}", position,
                     hint="write the lower bound first")


def _check_unit_bounds(table: PrivateTable, rule: ColumnRule, position: Position | None) -> None:
    """``BOUNDS PER UNIT``: ordered finite numbers, on a column whose rows are bounded too (the
    per-unit total is of clamped row values, and the row bounds give the other model)."""
    assert rule.unit_bounds is not None
    name = f"{sql_name(table.name)}.{sql_name(rule.name)}"
    lower, upper = rule.unit_bounds.lower, rule.unit_bounds.upper
    _check_number(lower, f"the lower BOUNDS PER UNIT of {name}", position)
    _check_number(upper, f"the upper BOUNDS PER UNIT of {name}", position)
    if lower > upper:
        raise _error(f"the BOUNDS PER UNIT of {name} are reversed: {_number_text(lower)} is more than "
                     f"{_number_text(upper)}", position, hint="write the lower bound first")
    if rule.bounds is None:
        raise _error(f"column {name} has BOUNDS PER UNIT but no BOUNDS", position,
                     hint=f"add `{sql_name(rule.name)} BOUNDS lo TO hi`: each row's value is clamped first, "
                          "then each unit's total")


def _check_keys(table: PrivateTable, rule: ColumnRule, declared: Mapping,
                position: Position | None) -> None:
    keys = rule.keys
    if keys is None:
        return
    listed = keys.values is not None and keys.table is None and keys.column is None
    if listed:
        return
    if keys.values is not None or keys.table is None or keys.column is None:
        raise _error(f"the KEYS of column {sql_name(rule.name)} must name a table and column, or values",
                     position, hint="give KeyDomain(table=, column=) or KeyDomain(values=)")
    source = declared.get(keys.table.lower())
    if not isinstance(source, PublicTable):
        kind = "a private table" if source is not None else "not a declared table"
        raise _error(f"KEYS FROM {keys.table}.{keys.column} of column {sql_name(rule.name)} in table "
                     f"{sql_name(table.name)}: {keys.table} is {kind}", position,
                     hint=f"key domains must be public: declare `PUBLIC TABLE {keys.table};`, "
                          "or list the keys with KEYS ('a', 'b')")


# --- the policy against the database -----------------------------------------------------


def _check_unit_type(table: PrivateTable, type_name: str) -> None:
    """A privacy unit is compared by the engine's equality (partitions, joins, distinct units), so
    its type's equality must be the identity of the values an analyst reads back (DESIGN.md
    invariant 20): a DOUBLE unit would make -0.0 and 0.0 one unit, an INTERVAL unit '1 month'
    and '30 days'."""
    if equality_is_identity(type_name):
        return
    raise _error(f"the PRIVACY UNIT {sql_name(table.unit or '')} of table {sql_name(table.name)} is {type_name}, "
                 "whose equality takes values an analyst can tell apart for one (-0.0 and 0.0, nan and -nan, "
                 "'1 month' and '30 days', values inside lists): two people could become one unit",
                 table.position,
                 hint="store the unit as an integer, string, UUID, DATE/TIMESTAMP or BLOB column (a view "
                      "that casts it, e.g. CAST(id AS BIGINT), if every id is a whole number)")


def check_policy(policy: Policy, catalog: dict[str, dict[str, str]]) -> None:
    """Check that every table and column the policy names exists, with a fitting type.

    ``catalog`` maps lower-cased table names ('table', or 'schema.table' outside main) to
    {lower-cased column name: DuckDB type}, as ``dpsql.backends.duckdb.read_catalog`` returns.

    >>> from dpsql.policy.language import parse_policy
    >>> policy = parse_policy("BUDGET EPSILON 1; PRIVATE TABLE t (PRIVACY UNIT ROW, s KEYS (1));")
    >>> check_policy(policy, {"t": {"x": "INTEGER"}})
    Traceback (most recent call last):
    dpsql.errors.PolicyError: table t has no column s (line 1, column 54). Hint: its columns are x.
    """
    validate_policy(policy)
    tables = {name.lower(): {c.lower(): t for c, t in columns.items()}
              for name, columns in catalog.items()}
    for public in policy.public_tables:
        _columns_of(public.name, tables, public.position)
    for table in policy.private_tables:
        columns = _columns_of(table.name, tables, table.position)
        reserved = (PAD, ROW_UNIT) if table.row_level else (PAD,)  # columns the bounded copy adds
        for name in reserved:
            if name in columns:
                raise _error(f"table {sql_name(table.name)} has a column named {name}, a name dpsql's bounded copy "
                             "of the table uses itself", table.position,
                             hint="rename the column, or declare a view that renames it")
        if table.unit is not None:
            unit_type = _type_of(table.name, table.unit, columns, table.position, " for its PRIVACY UNIT")
            _check_unit_type(table, unit_type)
        for rule in table.columns:
            type_name = _type_of(table.name, rule.name, columns, rule.position)
            if rule.bounds is not None and not is_numeric_type(type_name):
                raise _error(f"BOUNDS need a numeric column, but {sql_name(table.name)}.{sql_name(rule.name)} is "
                             f"{type_name}", rule.position,
                             hint=f"remove the BOUNDS; to group by it, write `{sql_name(rule.name)} KEYS "
                                  "FROM <table>.<column>` or list its keys")
            if rule.bounds is not None:
                _check_bounds_fit(table.name, rule, rule.bounds, type_name)
            keys = rule.keys  # validate_policy has checked: a table and a column, or values
            if keys is not None and keys.table is not None and keys.column is not None:
                key_columns = _columns_of(keys.table, tables, rule.position)
                key_type = _type_of(keys.table, keys.column, key_columns, rule.position)
                _check_key_column(table.name, rule, f"{keys.table}.{keys.column}", type_name, key_type)
            elif keys is not None and keys.values is not None:
                for value in keys.values:
                    _check_key_value(table.name, rule, type_name, value)
            if rule.local is not None and family(type_name) not in ("string", "integer", "decimal"):
                raise _error(f"LOCAL RR needs a text, integer or DECIMAL column, but {sql_name(table.name)}."
                             f"{sql_name(rule.name)} is {type_name}", rule.position,
                             hint="store the reports as text or integers (a view that casts them), whose "
                                  "values the DOMAIN names exactly")
            for value in rule.local.domain if rule.local is not None else ():
                _check_key_value(table.name, rule, type_name, value, "LOCAL RR DOMAIN")


def _check_bounds_fit(table: str, rule: ColumnRule, bounds: Bounds, type_name: str) -> None:
    """BOUNDS the column's type can hold. Bounds beyond its range are refused: the clamp compares
    the column with them, which must not need a wider type (and they are a typo, or the wrong
    column). A non-integer bound on an integer column (or one finer than a DECIMAL's scale) is
    fine: the clamp rounds it inward onto the column's values (``dpsql.sql.types.inward``), so
    clamped values stay inside the declared bounds the analysis uses — unless no value of the
    type lies between them."""
    limits = value_range(type_name)
    if limits is None:
        return
    for bound in (bounds.lower, bounds.upper):
        if not limits[0] <= bound <= limits[1]:
            raise _error(f"the BOUNDS of {sql_name(table)}.{sql_name(rule.name)} ({_number_text(bounds.lower)} TO "
                         f"{_number_text(bounds.upper)}) reach beyond what its type {type_name} holds "
                         f"({_number_text(limits[0])} to {_number_text(limits[1])})", rule.position,
                         hint=f"write bounds within {_number_text(limits[0])} and {_number_text(limits[1])}")
    lower, upper = inward(bounds.lower, bounds.upper, type_name)
    if lower > upper:
        raise _error(f"the BOUNDS of {sql_name(table)}.{sql_name(rule.name)} ({_number_text(bounds.lower)} TO "
                     f"{_number_text(bounds.upper)}) hold no value of its type {type_name}",
                     rule.position, hint="widen the bounds to include a value the column can hold")


def _check_key_value(table: str, rule: ColumnRule, type_name: str, value, what: str = "KEYS") -> None:
    """A listed key of the column's own kind: a number for a numeric column (exactly one of its
    values: an integer for an integer type, within the type's range and scale), text for
    anything else. A key of another kind would be compared by an implicit coercion that can
    fail on one unit's value (``'x' = 1``), or name no value at all."""
    numeric = is_numeric_type(type_name)
    where = f"{what} of {sql_name(table)}.{sql_name(rule.name)} ({type_name})"
    if isinstance(value, str) == numeric:
        kind, want = ("the text", "numbers") if isinstance(value, str) else ("the number", "quoted text")
        shown = f"'{value}'" if isinstance(value, str) else _number_text(value)
        raise _error(f"the {where} list{'s' if what != 'KEYS' else ''} {kind} {shown}", rule.position,
                     hint=f"list keys of the column's type: {want}" + (
                         ", such as KEYS (1, 2, 3)" if numeric else ", such as KEYS ('a', 'b')"))
    limits, spacing = value_range(type_name), step(type_name)
    if not numeric or limits is None:  # every numeric type has a range: None only for text
        return
    value = Fraction(value)
    if not limits[0] <= value <= limits[1] or (spacing is not None and (value / spacing).denominator != 1):
        raise _error(f"the {where} list{'s' if what != 'KEYS' else ''} {_number_text(value)}, which is not a "
                     f"value of {type_name}",
                     rule.position, hint="list only values the column can hold")


def _check_key_column(table: str, rule: ColumnRule, source: str, type_name: str, key_type: str) -> None:
    """``KEYS FROM t.c``: the domain column's values are cast to the private column's type and
    compared there, so the two must be of one family with no lossy step: any integer into an
    integer (a key out of range names no row), integer into DECIMAL, a DECIMAL into one of at
    least its scale, FLOAT into DOUBLE, text (VARCHAR, ENUM) into text; other types only into
    the very same type. Never across families (string and number, float and integer, DATE and
    TIMESTAMP), where equal-looking values compare differently or fail to convert."""
    keys, column = family(key_type), family(type_name)
    same = key_type.upper() == type_name.upper()
    fits = same or (keys == column and keys in ("integer", "string")) \
        or (keys, column) == ("integer", "decimal") \
        or (keys == column == "decimal" and decimal_shape(key_type)[1] <= decimal_shape(type_name)[1]) \
        or (base_type(key_type), base_type(type_name)) in (("FLOAT", "DOUBLE"), ("REAL", "DOUBLE"))
    if not fits:
        raise _error(f"KEYS FROM {source} of {sql_name(table)}.{sql_name(rule.name)}: the key column is {key_type} "
                     f"and the private column {type_name}, which do not compare without a lossy or cross-type "
                     "conversion", rule.position,
                     hint=f"take keys from a column of type {type_name}, or list them with KEYS (...)")


def _columns_of(name: str, tables: Mapping, position: Position | None) -> dict[str, str]:
    key = name.lower()
    key = key[len("main."):] if key.startswith("main.") and key not in tables else key
    if key not in tables:
        known = ", ".join(sorted(tables)[:20]) or "none"
        raise _error(f"table {sql_name(name)} is not in the database", position,
                     hint=f"create it or fix the name; the database has tables: {known}")
    return tables[key]


def _type_of(table: str, column: str, columns: Mapping, position: Position | None,
             role: str = "") -> str:
    if column.lower() not in columns:
        raise _error(f"table {sql_name(table)} has no column {sql_name(column)}{role}", position,
                     hint=f"its columns are {', '.join(columns)}")
    return columns[column.lower()]
def _number_text(value, rounding=ROUND_HALF_EVEN) -> str:
    """Exact decimal text when there is one (always, for numbers parsed from text)."""
    value = Fraction(value)
    if value.denominator == 1:
        return str(value.numerator)
    exact = finite_decimal(value)
    if exact is not None:
        return str(exact)
    with localcontext() as context:  # no finite expansion: 17 digits, rounded as asked
        context.prec, context.rounding = 17, rounding
        return str(Decimal(value.numerator) / Decimal(value.denominator))
