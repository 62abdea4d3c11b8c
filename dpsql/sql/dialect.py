"""dpsql's SQL dialect: DuckDB, plus BigQuery's differential-privacy clause after SELECT.

    SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5, delta = 1e-7) store, COUNT(*) ...

The clause is parsed by sqlglot (no text pre-processing) into a ``DPOptions`` node; everything
else parses exactly as in sqlglot's DuckDB dialect, because no valid DuckDB query has ``WITH``
right after ``SELECT``. The parser only checks the clause's shape; ``dp_options`` decides what
it means and refuses what it cannot use (unknown or repeated options, computed values, the
clause on an inner SELECT), each refusal at its position. ``strip_dp_options`` gives the plain
DuckDB query back: call both on entry, so no later stage ever sees the clause.

The node lives in the SELECT's ``hint`` argument, the slot sqlglot parses and generates right
after the SELECT keyword (DuckDB has no query hints, so the slot is otherwise always empty).
sqlglot allows no argument outside a node's ``arg_types`` (it raises under test), so a new
``dp_options`` argument is not an option; find the clause with ``tree.find(DPOptions)``.
Plain DuckDB cannot generate a tree that still holds the clause: it raises, never drops it.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from sqlglot import exp
from sqlglot.dialects.duckdb import DuckDB
from sqlglot.tokens import TokenType

from dpsql.errors import UnsupportedQuery


class DPOptions(exp.Expression):
    """``WITH DIFFERENTIAL_PRIVACY [OPTIONS (name = value, ...)]``; items are ``exp.EQ``
    whose ``this`` is an ``exp.Var`` carrying the option name's source position."""

    arg_types = {"expressions": False}


class PerGroupBounded:
    """An aggregate call carrying BigQuery's ``contribution_bounds_per_group => (lower, upper)``:
    the interval each privacy unit's contribution to one group is clamped into (SUM: the unit's
    total there; AVG: the unit's own average there). ``bounds`` holds the ``exp.Kwarg`` as
    written; ``contribution_bounds`` reads it."""

    CONTRIBUTION = "contribution_bounds_per_group"


class PerGroupBoundedSum(exp.Sum, PerGroupBounded):
    """``SUM(x, contribution_bounds_per_group => (lo, hi))``: a SUM (its family classifies it)."""

    arg_types = {"this": True, "bounds": True}
    _sql_names = ["SUM"]


class PerGroupBoundedAvg(exp.Avg, PerGroupBounded):
    """``AVG(x, contribution_bounds_per_group => (lo, hi))``: an AVG (its family classifies it)."""

    arg_types = {"this": True, "bounds": True}
    _sql_names = ["AVG"]


def _per_group_bounded(plain: type[exp.Func], bounded: type[exp.Func]):
    """A parser builder of ``plain``'s calls that takes one named argument more, the per-group
    contribution bounds; any other second argument is left to ``plain`` (which refuses it)."""
    def build(args: list) -> exp.Expr:
        if len(args) == 2 and isinstance(args[1], exp.Kwarg):
            return bounded(this=args[0], bounds=args[1])
        return plain.from_arg_list(args)
    return build


def contribution_bounds(call: exp.Expression) -> tuple[Fraction, Fraction] | None:
    """The (lower, upper) of a call's ``contribution_bounds_per_group``, None without one;
    refuses, at the call, a misspelt name, a bound that is not a number, or lower > upper.

    >>> import sqlglot
    >>> tree = sqlglot.parse_one("SELECT SUM(x, contribution_bounds_per_group => (-1, 2.5)) FROM t",
    ...                          read=READ_DIALECT)
    >>> contribution_bounds(tree.expressions[0])
    (Fraction(-1, 1), Fraction(5, 2))
    """
    if not isinstance(call, PerGroupBounded):
        return None
    kwarg = call.args["bounds"]
    line, col = _position(call)
    function = "SUM" if isinstance(call, exp.Sum) else "AVG"
    example = f"write e.g. {function}(x, contribution_bounds_per_group => (0, 100))"
    if kwarg.this.name.lower() != PerGroupBounded.CONTRIBUTION:
        raise UnsupportedQuery(f"unknown named argument {kwarg.this.name!r} of {function}",
                               line=line, col=col, hint=example)
    pair = kwarg.expression
    values = [_literal(v) for v in pair.expressions] if isinstance(pair, exp.Tuple) else []
    if len(values) != 2 or not all(isinstance(v, Fraction) for v in values):
        raise UnsupportedQuery(f"contribution_bounds_per_group must be two numbers, found {_shorten(pair)}",
                               line=line, col=col, hint=example)
    lower, upper = values
    assert isinstance(lower, Fraction) and isinstance(upper, Fraction)
    if lower > upper:
        raise UnsupportedQuery(f"contribution_bounds_per_group ({lower}, {upper}) has its lower bound above "
                               "its upper bound", line=line, col=col, hint="give (lower, upper)")
    return lower, upper


def _dp_options_sql(generator, expression: DPOptions) -> str:
    # Rendered in the hint slot of select_sql, whose text starts with its own space.
    options = generator.expressions(expression, flat=True)
    return f" WITH DIFFERENTIAL_PRIVACY{f' OPTIONS ({options})' if options else ''}"


class DPDuckDB(DuckDB):
    """sqlglot's DuckDB dialect, plus the differential-privacy clause; registered as "dpduckdb"."""

    # sqlglot 30 declares DuckDB.Parser / .Generator as class attributes, which mypy will not
    # take as base classes; at run time they are the dialect's own classes.
    class Parser(DuckDB.Parser):  # type: ignore[valid-type, misc]
        def _parse_hint(self):
            # sqlglot's one hook between the SELECT keyword and DISTINCT / the select list,
            # exactly where BigQuery puts the clause. INSERT/UPDATE/DELETE call it too, hence the
            # check on the previous token; WITH must be followed by DIFFERENTIAL_PRIVACY, so a
            # CTE (which never follows SELECT) cannot be taken for the clause.
            if (
                self._prev
                and self._prev.token_type == TokenType.SELECT
                and self._curr
                and self._curr.token_type == TokenType.WITH
                and self._next
                and self._next.token_type == TokenType.VAR
                and self._next.text.upper() == "DIFFERENTIAL_PRIVACY"
            ):
                return self._parse_dp_options()
            return super()._parse_hint()

        def _parse_dp_options(self) -> DPOptions:
            with_token = self._curr
            self._advance(2)
            items = []
            if self._match_text_seq("OPTIONS"):
                self._match_l_paren()
                if not self._match(TokenType.R_PAREN):
                    items = self._parse_csv(self._parse_dp_option)
                    self._match_r_paren()
            return self.expression(DPOptions(expressions=items), token=with_token)

        def _parse_dp_option(self) -> exp.EQ:
            # Any word is taken as a name here, so that a misspelt or unknown one is refused by
            # dp_options with a useful hint rather than as a syntax error.
            literal = self._curr is not None and self._curr.token_type in (TokenType.STRING, TokenType.NUMBER)
            if literal or not self._advance_any():
                self.raise_error("Expected an option name such as epsilon")
            name = self.expression(exp.Var(this=self._prev.text), token=self._prev)
            if not self._match(TokenType.EQ):
                self.raise_error(f"Expected '=' after the option name {name.name}")
            value = self._parse_disjunction()
            if value is None:
                self.raise_error(f"Expected a value for the option {name.name}")
            return self.expression(exp.EQ(this=name, expression=value))

        FUNCTIONS = {**DuckDB.Parser.FUNCTIONS,
                     "SUM": _per_group_bounded(exp.Sum, PerGroupBoundedSum),
                     "AVG": _per_group_bounded(exp.Avg, PerGroupBoundedAvg)}

    class Generator(DuckDB.Generator):  # type: ignore[valid-type, misc]
        TRANSFORMS = {**DuckDB.Generator.TRANSFORMS, DPOptions: _dp_options_sql}


READ_DIALECT = DPDuckDB
"""The dialect analyst SQL is read in (``read=READ_DIALECT``): DuckDB plus the clause."""

DIALECT = "duckdb"
"""The dialect dpsql generates SQL in (``dialect=DIALECT``): plain DuckDB, so a tree that still
held the clause would raise rather than lose it. Every stage strips the clause on entry."""


@dataclass(frozen=True)
class OptionValue:
    """One option of the clause, as written."""

    value: Fraction | str | bool
    """A Fraction for numbers (exact: ``1e-7`` is 1/10**7), a str for names and strings."""
    line: int | None
    """1-based line of the option's name in the SQL."""
    col: int | None
    """1-based column of the option's name in the SQL."""


def _number(value: object) -> str | None:
    return None if isinstance(value, Fraction) else "must be a number"


def _whole_number(value: object) -> str | None:
    if isinstance(value, Fraction) and value.denominator == 1:
        return None
    return "must be a whole number"


def _name(value: object) -> str | None:
    return None if isinstance(value, str) else "must be a column name"


def _noise(value: object) -> str | None:
    if isinstance(value, str) and value.lower() in ("laplace", "gaussian"):
        return None
    return "must be laplace or gaussian"


def _share(value: object) -> str | None:
    if isinstance(value, bool) or (isinstance(value, Fraction) and 0 <= value < 1):
        return None
    return "must be true, false or a share of epsilon from 0 to below 1"


def _flag(value: object) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


OPTIONS = {
    "epsilon": _number,
    "delta": _number,
    "max_groups_contributed": _whole_number,
    "max_rows_contributed": _whole_number,
    "max_keys": _whole_number,
    "privacy_unit_column": _name,
    "noise": _noise,
    "report_bias": _share,
    "unit_bounds_share": _number,  # a share of epsilon choosing bounds per unit first (dpsql.query.unit_bounds)
    "intervals": _flag,  # presentation only: the server adds <column>_low/_high (db.sql: res.intervals())
    "show_outside": _flag,  # presentation only: the KEYS outside cell in every footer (dpsql.query.outside)
    "scale_sample": _flag,  # post-processing: totals from a TABLESAMPLE POISSON scaled by 1/p (dpsql.query.scaling)
    "max_error": _number,  # refuse before the charge when a predicted 95% ± is wider (dpsql.query.prediction)
    "expected_rows": _whole_number,  # the fewest values expected in a group: ratios' ± judged there
}
"""The options dpsql understands, each with the check of its kind of value.

Only the kind is checked here; ranges (epsilon > 0, delta < 1, ...) are the policy's business.
"""

_KNOWN = "the options are " + ", ".join(list(OPTIONS)[:-1]) + f" and {list(OPTIONS)[-1]}"
_EXAMPLE = "write e.g. OPTIONS (epsilon = 0.5, delta = 1e-7, privacy_unit_column = user_id)"


def dp_options(tree: exp.Expression) -> dict[str, OptionValue]:
    """The differential-privacy options of the outermost SELECT of ``tree``; {} without a clause.

    Names are lower-cased; ``noise`` is lower-cased too. Refuses, at the offending option: an
    unknown or repeated name, a value that is not a literal or a plain name, a value of the
    wrong kind, and the clause on any SELECT but the outermost one.

    >>> import sqlglot
    >>> sql = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5, delta = 1e-7) COUNT(*) FROM t"
    >>> tree = sqlglot.parse_one(sql, read=READ_DIALECT)
    >>> dp_options(tree)["delta"]
    OptionValue(value=Fraction(1, 10000000), line=1, col=58)
    >>> strip_dp_options(tree).sql(dialect=DIALECT)
    'SELECT COUNT(*) FROM t'
    >>> dp_options(sqlglot.parse_one("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (eps = 1) 1", read=READ_DIALECT))
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    dpsql.errors.UnsupportedQuery: unknown differential-privacy option 'eps' (line 1, column 43). Hint: ...
    """
    for nested in tree.find_all(DPOptions):
        if nested.parent is not tree:
            line, col = _position(nested)
            raise UnsupportedQuery(
                "WITH DIFFERENTIAL_PRIVACY is allowed only on the outermost SELECT of a query",
                line=line, col=col, construct="DPOptions",
                hint="move the clause to the main query's first SELECT (not a subquery, CTE or UNION part)",
            )
    clause = tree.args.get("hint") if isinstance(tree, exp.Select) else None
    clause = clause if isinstance(clause, DPOptions) else None
    found: dict[str, OptionValue] = {}
    for item in clause.expressions if clause else []:
        name = item.this.name.lower()
        line, col = _position(item.this)
        if name not in OPTIONS:
            raise UnsupportedQuery(
                f"unknown differential-privacy option {name!r}", line=line, col=col, hint=_KNOWN,
            )
        if name in found:
            first = found[name]
            raise UnsupportedQuery(
                f"the option {name!r} is given twice, first at line {first.line}, column {first.col}",
                line=line, col=col, hint="give each option once",
            )
        value = _literal(item.expression)
        problem = "must be a literal or a name" if value is None else OPTIONS[name](value)
        if problem or value is None:
            raise UnsupportedQuery(
                f"the option {name!r} {problem}, found {_shorten(item.expression)}",
                line=line, col=col, hint=_EXAMPLE,
            )
        if name == "noise" and isinstance(value, str):  # _noise has checked it is a str
            value = value.lower()
        found[name] = OptionValue(value, line, col)
    return found


def strip_dp_options(tree: exp.Expression) -> exp.Expression:
    """``tree`` without any differential-privacy clause, as a copy when it had one: plain DuckDB SQL.

    >>> import sqlglot
    >>> tree = sqlglot.parse_one("SELECT WITH DIFFERENTIAL_PRIVACY x FROM t", read=READ_DIALECT)
    >>> strip_dp_options(tree).sql(dialect=DIALECT), tree.sql(dialect=READ_DIALECT)
    ('SELECT x FROM t', 'SELECT WITH DIFFERENTIAL_PRIVACY x FROM t')
    """
    if tree.find(DPOptions) is None:  # nothing to strip: copying a tree costs more than parsing it
        return tree
    tree = tree.copy()
    for clause in list(tree.find_all(DPOptions)):
        clause.pop()
    return tree


def _literal(node: exp.Expression) -> Fraction | str | bool | None:
    """The value of a literal, boolean or plain name; None for anything computed."""
    sign = 1
    if isinstance(node, exp.Neg):
        sign, node = -1, node.this
    if isinstance(node, exp.Literal) and node.is_number:
        try:
            return sign * Fraction(node.this)
        except ValueError:
            return None
    if sign == -1:
        return None
    if isinstance(node, exp.Literal) and node.is_string:
        return node.this
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if isinstance(node, exp.Column) and not node.table and isinstance(node.this, exp.Identifier):
        return node.name
    return None


def _position(node: exp.Expression) -> tuple[int | None, int | None]:
    """(line, column) where the token of ``node`` starts; sqlglot records the column it ends at."""
    meta = node.meta
    if "line" not in meta:
        return None, None
    return meta["line"], meta["col"] - (meta["end"] - meta["start"])


def _shorten(node: exp.Expression) -> str:
    """The analyst's own value, regenerated and cut short, for a refusal message."""
    text = node.sql(dialect=READ_DIALECT)
    return repr(text if len(text) <= 40 else text[:37] + "...")
