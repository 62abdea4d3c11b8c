"""Joins of a private relation: with another private relation on the units, or with public data.

Private ⋈ private pairs rows of one unit only (an equality of the two unit columns, of one
type), each side first truncated to its k rows per unit. Private ⋈ public compares each key in
one lossless type (``join_comparison_type``), reads public rows stored once before the charge,
and multiplies a unit's rows by at most the largest multiplicity m of the keys in those stored
rows (DESIGN.md invariant 15: the multiplicity is measured on exactly the rows the join reads,
in the type it compares). Each join is one step of the relation's stability record
(``dpsql.analysis.stability``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from typing import TYPE_CHECKING

from sqlglot import exp

from dpsql.analysis.bind import (
    replace_column,
    resolve_column,
)
from dpsql.analysis.relation import PublicSide, Relation, as_source, unit_of
from dpsql.analysis.stability import (
    PUBLIC_JOIN,
    TRUNCATION,
    UNIT_JOIN,
    Step,
    check_fan_out,
    product,
)
from dpsql.errors import DPError
from dpsql.policy.model import Bounds, ColumnRule, KeyDomain, PrivateTable
from dpsql.sql.allowlist import check_row_level, refuse
from dpsql.sql.parse import DIALECT
from dpsql.sql.pieces import data_type, exact, key_text, salted_hash, star, total
from dpsql.sql.types import reads_as_number

if TYPE_CHECKING:  # the protocol only: the check asks the engine through it, never imports one
    from dpsql.backends.base import Backend


def join_relations(left, right, join: exp.Join, data: Backend | None,
                   max_multiplicity: int, max_rows: int) -> Relation:
    """The relation of ``left JOIN right``: refused unless it is an equality join on the units of
    two private relations, or of a private relation with public data on keys of one lossless type."""
    side = (join.args.get("side") or "").upper()
    kind = (join.args.get("kind") or "").upper()
    if kind in ("CROSS", "NATURAL", "SEMI", "ANTI", "ASOF", "POSITIONAL"):
        refuse(join, f"{kind} JOIN is not supported over private tables",
               "join with ON a = b equality conditions")
    condition = join.args.get("on")
    using = join.args.get("using")
    if condition is None and not using:
        refuse(join, "a join without ON would pair every private row with every other row",
               "join with ON a = b equality conditions")
    if isinstance(left, PublicSide) and isinstance(right, PublicSide):
        refuse(join, "two public tables joined before the private one are not supported",
               "name the private table first (FROM t JOIN p ON ... JOIN q ON ...), or join the public "
               "tables in a subquery: FROM t JOIN (SELECT ... FROM p JOIN q ON ...) AS pq ON ...")
    refuse_public_preserved(left, right, side, join)
    if side == "RIGHT":  # a RIGHT JOIN keeps the right side: the same as the mirrored LEFT JOIN
        left, right, side = right, left, "LEFT"
    names = _joined_names(left, right)
    scope = {**{k: names[("l", v)] for k, v in left.scope.items() if k[0] is not None},
             **{k: names[("r", v)] for k, v in right.scope.items() if k[0] is not None}}
    unqualified: dict[str, list[str]] = {}
    for side_tag, part in (("l", left), ("r", right)):
        for (q, c), v in part.scope.items():
            if q is None:
                unqualified.setdefault(c, []).append(names[(side_tag, v)])
    scope.update({(None, c): targets[0] for c, targets in unqualified.items() if len(targets) == 1})
    if using:  # JOIN ... USING (a, b): ON left.a = right.a AND ...; the merged column is the left one
        bound_condition = _using_condition(using, left, right, join)
        for identifier in using:
            scope[(None, identifier.name.lower())] = names[("l", left.scope[(None, identifier.name.lower())])]
    else:
        bound_condition = _bind_condition(condition, left, right, names)
    if isinstance(left, Relation) and isinstance(right, Relation):
        rule = _private_join_rule(left, right, _equalities(bound_condition), names, join)
        inputs = (left.rows_per_unit, right.rows_per_unit)
        k1, k2 = left.rule.max_rows_per_unit, right.rule.max_rows_per_unit
        groups = min(left.rule.groups_per_unit, right.rule.groups_per_unit)
        # Each side keeps at most its k rows per unit before the join, so one unit's rows
        # cannot make the join quadratic (a time that would tell whether the unit is there).
        left, right = _truncated(left), _truncated(right)
        # A joined row pairs a row of each side of the same unit (one row if LEFT and unmatched).
        held = product(left.rows_per_unit, right.rows_per_unit)
        check_fan_out(join, held, inputs, max_rows, f"this join of {right.label} on the privacy unit pairs "
                       f"each of one unit's rows on its left ({left.rows_per_unit} at most) with each on its right "
                       f"({right.rows_per_unit})", "join each private table once, or aggregate "
                       "per unit first in a subquery (SELECT unit, SUM(x) AS s FROM t GROUP BY unit), which "
                       "leaves one row per unit to join")
        on = _total_condition(bound_condition, (left.unit, right.unit))
        bounded = left.bounded | right.bounded
        step = Step(UNIT_JOIN, f"{left.label} ⋈ {right.label}", k1 * k2, groups, held,
                    f"{left.label} ⋈ {right.label} on the privacy unit: a joined row pairs a row of each side "
                    f"of the same unit, so a unit has at most k = {k1}·{k2} rows and touches at most "
                    f"{groups} groups")
        rule = step.limits(rule)
        stability = left.stability + right.stability + (step,)
    else:
        private, public = (left, right) if isinstance(left, Relation) else (right, left)
        tag = "l" if private is left else "r"
        if data is None:
            refuse(join, "joins need the database's public tables to bound their multiplicity",
                   "run the query through dpsql.connect")
        keys = _join_keys(bound_condition, private, public, tag, join, data)
        public = _stored(public, keys, "r" if tag == "l" else "l", join, data)
        left, right = (private, public) if tag == "l" else (public, private)
        # The most stored public rows sharing one value of the join keys (NULL keys never match).
        multiplicity = data.key_multiplicity(public.sql.name, [key.stored for key in keys])
        if multiplicity > max_multiplicity:
            refuse(join, f"a row of the private side can match up to {multiplicity} rows of "
                   f"{public.label} on this join's keys, more than the policy's MAX JOIN MULTIPLICITY "
                   f"{max_multiplicity}", "join on columns that identify the public rows (a key), or "
                   "aggregate the public side first in a subquery")
        rule = _public_join_rule(private, public, names, tag)
        # A private row becomes at most `multiplicity` rows (one if LEFT and unmatched): the
        # public rows were stored before the charge and the join compares, in one stated
        # type, exactly the keys the multiplicity was counted on — so the rows a unit holds
        # multiply by at most m, whatever the private data (DESIGN.md invariant 15).
        held = product(private.rows_per_unit, multiplicity)
        check_fan_out(join, held, (private.rows_per_unit,), max_rows, f"each of a unit's rows in {private.label} "
                       f"({private.rows_per_unit} at most) can match up to m = {multiplicity} rows of "
                       f"{public.label} on this join's keys", "join on columns that identify the public rows "
                       "(a key), aggregate the public side first in a subquery, or join fewer public tables")
        on = _keyed_condition(bound_condition, keys)
        bounded = private.bounded
        compared = ", ".join(sorted({k.comparison if k.comparison != "VARCHAR" else "VARCHAR (as bytes)"
                                     for k in keys}))
        # Each private row becomes at most `multiplicity` rows: a unit's k rows become k·m.
        step = Step(PUBLIC_JOIN, f"{private.label} ⋈ {public.label}", private.rule.max_rows_per_unit * multiplicity,
                    private.rule.max_groups_per_unit, held,
                    f"{private.label} ⋈ {public.label}: public rows stored before the charge; keys "
                    f"compared as {compared}; a private row matches at most m = {multiplicity} "
                    f"public rows (MAX JOIN MULTIPLICITY {max_multiplicity})")
        rule = step.limits(rule)
        stability = private.stability + (step,)
    select = exp.Select(expressions=[
        exp.alias_(exp.column(c, table=f"dp_{tag}", quoted=True), names[(tag, c)], quoted=True)
        for tag, part in (("l", left), ("r", right)) for c in part.columns])
    select = select.from_(exp.alias_(as_source(left.sql), "dp_l"))
    # the Join node as sqlglot parses "LEFT JOIN" / "INNER JOIN" (join_type= would parse that text)
    kind = {"side": "LEFT"} if side == "LEFT" else {"kind": "INNER"}
    select = select.join(exp.Join(this=exp.alias_(as_source(right.sql), "dp_r"), **kind), on=on)
    columns = {names[(t, c)]: typ for t, part in (("l", left), ("r", right)) for c, typ in part.columns.items()}
    return Relation(select, rule, columns, scope, f"{left.label} ⋈ {right.label}", bounded=bounded,
                    stability=stability)


def _truncated(relation: Relation) -> Relation:
    """The relation with at most k rows per unit, chosen by a keyed hash of each row's own values
    (ties between different rows broken by the values' exact identities): never by order."""
    unit, k = relation.unit, relation.rule.max_rows_per_unit
    if relation.rows_per_unit is not None and relation.rows_per_unit <= k:
        return relation  # at most k rows per unit already (a bounded copy)
    # Each column by its exact identity (a float with its sign, an INTERVAL by its parts), so
    # DuckDB-equal rows an analyst can tell apart never tie in an order their storage decides.
    values = [exact(exp.column(c, quoted=True), t) for c, t in relation.columns.items()]
    salted = salted_hash(*[v.copy() for v in values])
    rank = exp.Window(this=exp.RowNumber(), partition_by=[exp.column(unit, quoted=True)],
                      order=exp.Order(expressions=[exp.Ordered(this=salted)] +
                                      [exp.Ordered(this=v.copy()) for v in values]))
    ranked = exp.Select(expressions=[star(), exp.alias_(rank, "dp_n")]).from_(
        exp.alias_(as_source(relation.sql), "dp_t"))
    kept = exp.Select(expressions=[star(exclude=["dp_n"])]).from_(exp.Subquery(this=ranked))
    kept = kept.where(exp.LTE(this=exp.column("dp_n"), expression=exp.Literal.number(k)))
    step = Step(TRUNCATION, relation.label, k, relation.rule.max_groups_per_unit, k,
                f"{relation.label}: at most k = {k} rows of each unit kept before joining on the unit "
                "(chosen by a salted hash of each row's own values)")
    return replace(relation, sql=kept, stability=relation.stability + (step,))


def refuse_public_preserved(left, right, side: str, join: exp.Join) -> None:
    """Refuse an outer join (``side`` as written: LEFT, RIGHT or FULL) that keeps every row of a
    public side, or of both sides: a row kept without a match has no privacy unit. The refusal
    names the join as written and the one to write instead.

    >>> import sqlglot
    >>> from types import SimpleNamespace
    >>> visits = SimpleNamespace(label="visits")
    >>> stores = PublicSide(exp.to_table("stores"), {}, {}, "stores")
    >>> join = sqlglot.parse_one("SELECT 1 FROM visits RIGHT JOIN stores ON true").args["joins"][0]
    >>> try:  # doctest: +NORMALIZE_WHITESPACE
    ...     refuse_public_preserved(visits, stores, "RIGHT", join)
    ... except DPError as refused:
    ...     print(refused.message); print(refused.hint)
    RIGHT JOIN keeps every row of stores, a public table: those that match no row of visits would
    belong to no privacy unit
    write visits LEFT JOIN stores ON ... (it keeps every row of visits), or an inner JOIN
    """
    if side == "FULL":
        private = next((part for part in (left, right) if not isinstance(part, PublicSide)), left)
        public = right if private is left else left
        both = f"every row of {public.label}, a public table" if isinstance(public, PublicSide) \
            else f"the rows of both {left.label} and {right.label}"
        refuse(join, f"FULL JOIN keeps {both}: those that match no row of the other side would belong to no "
               "privacy unit", f"write {private.label} LEFT JOIN {public.label} ON ... (it keeps every row of "
               f"{private.label}), or an inner JOIN")
    kept, other = (left, right) if side == "LEFT" else (right, left)
    if side in ("LEFT", "RIGHT") and isinstance(kept, PublicSide):
        refuse(join, f"{side} JOIN keeps every row of {kept.label}, a public table: those that match no row of "
               f"{other.label} would belong to no privacy unit",
               f"write {other.label} LEFT JOIN {kept.label} ON ... (it keeps every row of {other.label}), "
               "or an inner JOIN")


def _joined_names(left, right) -> dict:
    """Unique relation column names for both sides (the bare name where it is unique)."""
    names, used = {}, set()
    for tag, part in (("l", left), ("r", right)):
        label = part.label.split(".")[-1].replace(" ", "")
        for column in part.columns:
            clash = column in (right.columns if tag == "l" else left.columns)
            name = f"{label}.{column}" if clash else column
            while name in used:
                name = f"{tag}.{name}"
            used.add(name)
            names[(tag, column)] = name
    return names


def _bind_condition(condition, left, right, names):
    """The ON condition with each column resolved to dp_l / dp_r and its source column."""
    bound = condition.copy()
    for column in list(bound.find_all(exp.Column)):
        hits = [(tag, resolved) for tag, part in (("l", left), ("r", right))
                for resolved in [resolve_column(column, part.scope, part.columns)] if resolved is not None]
        if len(hits) != 1:
            problem = "is ambiguous" if hits else "is unknown"
            refuse(column, f"column {column.sql(dialect=DIALECT)} in the join condition {problem}",
                   "qualify it with its table's alias")
        tag, resolved = hits[0]
        source = resolved if isinstance(resolved, exp.Column) else next(resolved.find_all(exp.Column))
        qualified = exp.column(source.name, table=f"dp_{tag}", quoted=True)
        if source is resolved:
            resolved = qualified
        else:  # a STRUCT field: struct_extract of the qualified column
            source.replace(qualified)
        replace_column(column, resolved)
    check_row_level(bound, "a join condition")
    return bound


def _using_condition(using: list, left, right, join) -> exp.Expr:
    parts = []
    for identifier in using:
        name = identifier.name.lower()
        if (None, name) not in left.scope or (None, name) not in right.scope:
            refuse(join, f"USING ({identifier.name}) names a column that is not on both sides",
                   "join ON a = b instead")
        parts.append(exp.EQ(this=exp.column(left.scope[(None, name)], table="dp_l", quoted=True),
                            expression=exp.column(right.scope[(None, name)], table="dp_r", quoted=True)))
    return exp.and_(*parts)


def _equalities(condition: exp.Expr) -> list[tuple[exp.Column, exp.Column]]:
    parts = list(condition.flatten()) if isinstance(condition, exp.And) else [condition]
    pairs = []
    for part in parts:
        part = part.unnest()
        if isinstance(part, exp.EQ) and isinstance(part.this, exp.Column) and isinstance(part.expression, exp.Column) \
                and part.this.table != part.expression.table:
            left, right = (part.this, part.expression) if part.this.table == "dp_l" else (part.expression, part.this)
            pairs.append((left, right))
    return pairs


def _total_condition(condition: exp.Expr, units: tuple[str, str]) -> exp.Expr:
    """A private⋈private join condition that cannot fail at run time: the equality of the two
    unit columns stays plain (the hash join's key; their types are the same), every other part
    becomes false where it would raise (an implicit cast of one unit's value, say)."""
    safe = []
    for part in _conjuncts(condition):
        on_units = isinstance(part, exp.EQ) and all(isinstance(x, exp.Column) for x in (part.this, part.expression)) \
            and {(part.this.table, part.this.name), (part.expression.table, part.expression.name)} == \
            {("dp_l", units[0]), ("dp_r", units[1])}
        safe.append(part if on_units else exp.func("COALESCE", total(part), exp.false()))
    return exp.and_(*safe)


def same_unit_type(relations: list, node, what: str) -> None:
    """Units meet only in one type: an implicit coercion could make two units one."""
    types = [r.columns.get(unit_of(r.rule).lower(), "") for r in relations]
    if len(set(types)) > 1:
        listed = " and ".join(f"{r.rule.unit} {t}" for r, t in zip(relations, types))
        refuse(node, f"{what} compares privacy units of different types ({listed}): a conversion "
               "could make different units equal", "the units need one type in every table (e.g. BIGINT): "
               "ask the curator to store or declare them so; dpsql pairs units only of identical types")


def _private_join_rule(left: Relation, right: Relation, equalities, names, join) -> PrivateTable:
    """The joined relation's unit and column rules (its limits are its ``Step``'s); refuses a
    join that is not on the units, or on units of different types."""
    for part in (left, right):
        if part.hidden_unit:
            refuse(join, f"each row of {part.label} is its own privacy unit, so it has no unit column to join "
                   "another private table on", "join row-level private tables only with public tables")
    on_units = any(a.name == left.unit and b.name == right.unit for a, b in equalities)
    if not on_units:
        refuse(join, f"two private tables can only be joined on their privacy units "
               f"({left.rule.unit} = {right.rule.unit}): any other join mixes different units' rows",
               f"add ON ... {left.rule.unit} = ... {right.rule.unit}")
    same_unit_type([left, right], join, "a join of two private tables")
    rules = [_renamed_rule(part.rule, names, tag) for tag, part in (("l", left), ("r", right))]
    return PrivateTable(
        name=f"{left.rule.name} ⋈ {right.rule.name}",
        unit=names[("l", left.unit)],
        columns=rules[0] + rules[1],
    )


@dataclass(frozen=True)
class _JoinKey:
    """One equality of a private⋈public join: a private expression equal to a public one,
    compared in one type both are cast to explicitly."""

    private: exp.Expression
    """The private side, over ``dp_l`` / ``dp_r`` columns."""
    public: exp.Expression
    """The public side, over the public relation's columns."""
    comparison: str
    """The type both sides are compared in (``VARCHAR`` compares their UTF-8 bytes)."""
    private_type: str
    """The private side's own type."""
    index: int
    """Its position: the stored public relation holds the public side as ``dp_jk<index>``."""

    @property
    def stored(self) -> str:
        return f"dp_jk{self.index}"


INTEGER_TYPES = frozenset({"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT",
                           "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT"})


FLOAT_TYPES = frozenset({"FLOAT", "REAL", "DOUBLE"})


SAME_TYPE_ONLY = ("DATE", "TIME", "TIMESTAMP", "TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP_NS",
                  "TIMESTAMP WITH TIME ZONE", "BOOLEAN", "UUID", "BLOB", "DECIMAL(")


def join_comparison_type(private_type: str, public_type: str) -> str | None:
    """The type a join compares a private and a public key in, or ``None`` when no type
    compares them without loss: DuckDB's implicit coercion would otherwise decide, and it
    makes many values equal one (ids near 2^53 as DOUBLE, '01' and ' 1' as INTEGER 1).

    >>> join_comparison_type("INTEGER", "BIGINT"), join_comparison_type("FLOAT", "DOUBLE")
    ('HUGEINT', 'DOUBLE')
    >>> join_comparison_type("VARCHAR", "INTEGER"), join_comparison_type("BIGINT", "DOUBLE")
    (None, None)
    >>> join_comparison_type("DECIMAL(9,2)", "DECIMAL(9,2)"), join_comparison_type("DATE", "TIMESTAMP")
    ('DECIMAL(9,2)', None)
    """
    a, b = private_type.upper(), public_type.upper()
    if a in INTEGER_TYPES and b in INTEGER_TYPES:
        return "HUGEINT"  # holds every value of both exactly
    if a in FLOAT_TYPES and b in FLOAT_TYPES:
        return "DOUBLE"
    if _is_string(a) and _is_string(b):
        return "VARCHAR"
    if a == b and a.startswith(SAME_TYPE_ONLY):
        return a
    return None


def _is_string(type_name: str) -> bool:
    return type_name == "VARCHAR" or type_name.startswith("ENUM(")


def _compared(node: exp.Expression, comparison: str, own_type: str) -> exp.Expression:
    """``node`` as the value the join compares: cast to the comparison type; strings as their
    UTF-8 bytes, so no collation (NOCASE, NOACCENT) can make different strings match."""
    if comparison == "VARCHAR":
        return key_text(node, own_type)  # a VARCHAR's cast to VARCHAR keeps its bytes: one form for every type
    if own_type.upper() == comparison:
        return node
    return exp.cast(node, data_type(comparison, DIALECT))


def _join_keys(condition: exp.Expr, private: Relation, public: PublicSide, tag: str, join,
               data: Backend) -> list[_JoinKey]:
    """The equalities of a private⋈public join condition between a private and a public
    expression, each with the one type it will be compared in (refused when there is none)."""
    mine, theirs = f"dp_{tag}", f"dp_{'r' if tag == 'l' else 'l'}"
    keys: list[_JoinKey] = []
    for part in _conjuncts(condition):
        if not isinstance(part, exp.EQ):
            continue
        sides = [{c.table for c in s.find_all(exp.Column)} for s in (part.this, part.expression)]
        if {frozenset(sides[0]), frozenset(sides[1])} != {frozenset({mine}), frozenset({theirs})}:
            continue
        private_side, public_side = (part.this, part.expression) if sides[0] == {mine} else \
            (part.expression, part.this)
        private_type = _type_of(private_side, private.sql, mine, data, join)
        public_type = _type_of(public_side, public.sql, theirs, data, join)
        comparison = join_comparison_type(private_type, public_type)
        if comparison is None:
            refuse(join, f"this join compares {private_type} with {public_type}: DuckDB would convert "
                   "one to the other, which can make different values equal or fail on some rows",
                   f"CAST one side so both have the same type, e.g. CAST(... AS {public_type})")
        keys.append(_JoinKey(private_side, public_side, comparison, private_type, len(keys)))
    if not keys:
        refuse(join, "a join with a public table needs an equality between a private and a public column",
               "join ON private.col = public.col")
    return keys


def _conjuncts(condition: exp.Expr) -> list[exp.Expr]:
    parts = list(condition.flatten()) if isinstance(condition, exp.And) else [condition]
    return [part.unnest() for part in parts]


def _type_of(node: exp.Expression, source: exp.Expression, alias: str, data: Backend, join) -> str:
    """The DuckDB type of an expression over one side of a join (binds the schema, reads nothing)."""
    select = exp.Select(expressions=[node.copy()]).from_(exp.alias_(as_source(source), alias))
    try:
        return data.describe(select)[0][1]
    except DPError as error:
        refuse(join, f"this join condition does not type-check: {error.message}",
               "compare columns of matching types")


def _stored(public: PublicSide, keys: list[_JoinKey], tag: str, join, data: Backend) -> PublicSide:
    """The public side of a join stored once, before the charge, with each join key already
    in its comparison type (``dp_jk<i>``): the join and every public fact the analysis reads
    about it (multiplicity, column ranges) then come from the same rows."""
    alias = f"dp_{tag}"
    items = [exp.alias_(exp.column(c, table=alias, quoted=True), c, quoted=True) for c in public.columns]
    for key in keys:
        own = _type_of(key.public, public.sql, alias, data, join)
        items.append(exp.alias_(_compared(key.public.copy(), key.comparison, own), key.stored, quoted=True))
    select = exp.Select(expressions=items).from_(exp.alias_(as_source(public.sql), alias))
    try:
        name = data.materialise(select)
    except Exception as error:  # public data only: DuckDB's own first line reveals nothing private
        message = error.message if isinstance(error, DPError) else str(error).strip().split("\n")[0]
        refuse(join, f"the public side of this join could not be computed: {message}",
               "check the public subquery or table on its own, as a query over public tables")
    return replace(public, sql=data.stored_reference(name), ranges=_ranges(name, public.columns, data))


def _ranges(stored: str, columns: dict, data: Backend) -> dict:
    """Bounds of the stored public rows' numeric columns: their exact min and max."""
    numeric = [c for c, typ in columns.items() if reads_as_number(typ)]
    # A float's exact value: the exact extreme.
    return {column: Bounds(Fraction(low), Fraction(high))
            for column, (low, high) in data.column_ranges(stored, numeric).items()}


def _keyed_condition(condition: exp.Expr, keys: list[_JoinKey]) -> exp.Expr:
    """The join condition that runs: each key equality compares the private side, cast
    (total: TRY where it could fail), with the stored public key; every other part is made
    total (an error becomes false)."""
    parts: list[exp.Expr] = []
    for part in _conjuncts(condition):
        key = next((k for k in keys if part is k.private.parent or part is k.public.parent), None)
        if key is None:
            parts.append(exp.func("COALESCE", total(part.copy()), exp.false()))
    for key in keys:
        public_alias = next(key.public.find_all(exp.Column)).table
        value: exp.Expr = _compared(key.private.copy(), key.comparison, key.private_type)
        if not isinstance(key.private, exp.Column):
            value = total(value)
        parts.insert(key.index, exp.EQ(this=value, expression=exp.column(key.stored, table=public_alias, quoted=True)))
    return exp.and_(*parts)


def _public_join_rule(private: Relation, public: PublicSide, names, tag) -> PrivateTable:
    """The joined relation's unit and column rules (its limits are its ``Step``'s)."""
    other = "r" if tag == "l" else "l"
    rule = private.rule
    public_rules = tuple(_public_column_rule(public, column, names[(other, column)]) for column in public.columns)
    return PrivateTable(
        name=f"{rule.name} ⋈ {public.label}",
        unit=names[(tag, private.unit)],  # row-level tables have their hidden unit too
        columns=_renamed_rule(rule, names, tag) + public_rules,
    )


def _renamed_rule(rule: PrivateTable, names: dict, tag: str) -> tuple[ColumnRule, ...]:
    return tuple(replace(c, name=names[(tag, c.name.lower())]) for c in rule.columns
                 if (tag, c.name.lower()) in names)


def _public_column_rule(public: PublicSide, column: str, name: str) -> ColumnRule:
    """A public column's bounds and key domain: public facts. Bounds are those of the stored
    rows the join reads, computed with the multiplicity (``_stored``)."""
    keys = KeyDomain(table=public.table, column=column, joined=public.tag) if public.table else None
    return ColumnRule(name=name, bounds=public.ranges.get(column), keys=keys)
