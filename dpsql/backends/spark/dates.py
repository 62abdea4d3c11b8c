"""Per-node rewrites of date parts, truncations and differences: DuckDB's meaning in Spark's terms.

As ``dpsql.backends.spark.rewrites`` (whose ``Writer`` they use): children are rewritten first,
types read with ``typed``. What differs, measured on pyspark 4.3 against DuckDB 2.0:

* parts are BIGINTs on DuckDB and INTs on Spark, so each is cast;
* DuckDB's day of week counts from Sunday = 0, Spark's ``dayofweek`` from Sunday = 1; the ISO day
  of week (Monday = 1) is Spark's ``weekday`` + 1 (sqlglot writes ``(dayofweek % 7) + 1``,
  which is 2 for a Sunday); ``yearweek`` is the ISO year times 100 plus the ISO week;
* ``yearweek`` of an ISO year <= 0 subtracts the week (0000-12-31 is -52 on DuckDB);
* ``EXTRACT(second ...)`` is whole seconds on DuckDB, a DECIMAL with the fraction on Spark;
* ``dayname`` / ``monthname`` are 'Sunday' / 'January' on DuckDB, 'Sun' / 'Jan' on Spark;
* ``date_trunc`` of a DATE or TIMESTAMP is a TIMESTAMP on DuckDB, an instant on Spark;
* ``date_diff`` counts the boundaries crossed on DuckDB (31 Jan to 1 Feb is one month), whole
  units on Spark (zero months), so it is computed from the parts.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.backends.spark.infer import typed
from dpsql.backends.spark.rewrites import Writer, days_between, need, with_type
from dpsql.backends.spark.text import part_name

_FUNCTIONS = {
    "year": "year", "month": "month", "day": "dayofmonth", "quarter": "quarter", "doy": "dayofyear",
    "week": "weekofyear", "hour": "hour", "minute": "minute", "second": "second",
}
"""dpsql's part name -> the Spark function giving it as DuckDB does (all but the weekdays)."""

_CLASSES = {
    exp.Year: "year", exp.Month: "month", exp.Day: "day", exp.DayOfMonth: "day", exp.Quarter: "quarter",
    exp.DayOfYear: "doy", exp.WeekOfYear: "week", exp.Hour: "hour", exp.Minute: "minute", exp.Second: "second",
    exp.DayOfWeek: "dow", exp.DayOfWeekIso: "isodow", exp.Week: "week",
}
_ANONYMOUS = {"isodow": "isodow", "yearweek": "yearweek", "week": "week", "hour": "hour", "minute": "minute",
              "second": "second"}


def date_part(w: Writer, node: exp.Expr) -> exp.Expr:
    """Any date part (a function, EXTRACT or date_part) as a BIGINT computed as DuckDB does."""
    if isinstance(node, exp.Extract) or (isinstance(node, exp.Anonymous) and node.name.lower() in ("date_part",
                                                                                                  "datepart")):
        part = part_name(node)
        value = node.expression if isinstance(node, exp.Extract) else node.expressions[1]
    elif isinstance(node, exp.Anonymous):
        part, value = _ANONYMOUS[node.name.lower()], node.expressions[0]
    else:
        part, value = next(p for kind, p in _CLASSES.items() if type(node) is kind), node.this
    need(node, value)
    if part in ("hour", "minute", "second") and typed(value) == "DATE":  # midnight, also past the TIMESTAMP range
        return w.cast(exp.Mul(this=w.fn("unix_date", value), expression=exp.Literal.number(0)), "BIGINT",
                      fallible=False)
    return w.cast(part_of(w, str(part), value), "BIGINT", fallible=False)


def part_of(w: Writer, part: str, value: exp.Expr) -> exp.Expr:
    if part == "dow":
        return exp.Sub(this=w.fn("dayofweek", value), expression=exp.Literal.number(1))
    if part == "isodow":
        return exp.Add(this=w.fn("weekday", value), expression=exp.Literal.number(1))
    if part == "yearweek":  # DuckDB: ISO year * 100 + ISO week, the week subtracted for years <= 0
        def yearweek(v) -> exp.Expr:
            year = exp.Extract(this=exp.Var(this="YEAROFWEEK"), expression=v.use())
            hundreds = exp.Mul(this=year, expression=exp.Literal.number(100))
            week = w.fn("weekofyear", v.use())
            return exp.If(this=exp.GT(this=year.copy(), expression=exp.Literal.number(0)),
                          true=exp.Add(this=hundreds, expression=week),
                          false=exp.Sub(this=hundreds.copy(), expression=week.copy()))
        return w.let([value], yearweek)
    return w.fn(_FUNCTIONS[part], value)


_DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December"]


def day_name(w: Writer, node: exp.Expr) -> exp.Expr:
    """English names by number (Spark's date_format raises for years past 9999 and before 1)."""
    value = node.expressions[0] if isinstance(node, exp.Anonymous) else node.this
    monthly = isinstance(node, exp.Monthname) or (isinstance(node, exp.Anonymous) and node.name.lower() == "monthname")
    index = w.fn("month" if monthly else "dayofweek", value)
    names = [exp.If(this=exp.Literal.number(k), true=exp.Literal.string(n))
             for k, n in enumerate(_MONTHS if monthly else _DAYS, start=1)]
    return with_type(exp.Case(this=index, ifs=names), "VARCHAR")


def truncation(w: Writer, node: exp.Expr) -> exp.Expr:
    """date_trunc in DuckDB's type: a TIMESTAMP for a DATE or TIMESTAMP (Spark: an instant, here
    read in UTC and cast back), an instant for a TIMESTAMP WITH TIME ZONE."""
    need(node, node.this)
    unit = exp.Literal.string(node.args["unit"].name.upper())
    source = typed(node.this)
    if source == "TIMESTAMP WITH TIME ZONE":
        return with_type(w.fn("date_trunc", unit, node.this), source)
    return w.cast(w.fn("date_trunc", unit, w.as_type(node.this, "TIMESTAMP")), "TIMESTAMP", fallible=False)


def difference(w: Writer, node: exp.Expr) -> exp.Expr:
    """date_diff(unit, start, end) as DuckDB counts it: boundaries crossed (sqlglot's ``this``
    is the end, ``expression`` the start)."""
    unit = node.args["unit"].name.upper()
    end, start = node.this, node.expression
    if unit == "DAY":
        return days_between(w, w.as_type(end, "DATE"), w.as_type(start, "DATE"))
    per_year = {"MONTH": ("month", 12), "QUARTER": ("quarter", 4), "YEAR": (None, 1)}[unit]

    def counted(e, s) -> exp.Expr:
        years = exp.Sub(this=w.cast(w.fn("year", e.use()), "BIGINT", fallible=False),
                        expression=w.fn("year", s.use()))
        if per_year[0] is None:
            return years
        parts = exp.Sub(this=w.fn(per_year[0], e.use()), expression=w.fn(per_year[0], s.use()))
        return exp.Add(this=exp.Mul(this=exp.Paren(this=years), expression=exp.Literal.number(per_year[1])),
                       expression=exp.Paren(this=parts))
    return w.cast(w.let([end, start], counted), "BIGINT", fallible=False)


def last_day(w: Writer, node: exp.Expr) -> exp.Expr:
    """The month's last day by arithmetic (Spark's last_day raises for years past 9999)."""
    def last(d) -> exp.Expr:
        year = w.fn("year", d.use())
        def divides(n: int) -> exp.Expr:
            return exp.EQ(this=w.fn("pmod", year.copy(), exp.Literal.number(n)), expression=exp.Literal.number(0))
        leap = exp.or_(exp.and_(divides(4), exp.not_(divides(100))), divides(400))
        lengths: list[exp.Expr] = [exp.Literal.number(n) for n in (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)]
        lengths[1] = exp.If(this=leap, true=exp.Literal.number(29), false=exp.Literal.number(28))
        days = w.fn("element_at", exp.Array(expressions=lengths), w.fn("month", d.use()))
        return w.fn("date_add", d.use(), exp.Sub(this=days, expression=w.fn("dayofmonth", d.use())))
    return with_type(w.let([w.as_type(node.this, "DATE")], last), "DATE")
