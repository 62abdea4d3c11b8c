"""A bundled sample database, its policy, and a demo that queries it through the public API.

The shop database is synthetic and deterministic: the same ``seed`` always gives the same
rows. It is shaped to exercise what makes differential privacy hard: a few users with
hundreds of visits beside many with one or two, amounts with outliers far above the policy
bound, NULL amounts, and quasi-identifiers (age, zip) that are constant per user.

``run_demo`` uses only ``dpsql.connect`` and what it returns, like any analyst would.

>>> format_noisy(1234.4, 41.3)
'1,234 ± 41'
>>> format_noisy(45.1234, 0.35)
'45.12 ± 0.35'
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, TextIO

import numpy as np
import pandas as pd

from dpsql.backends.duckdb import write_database
from dpsql.errors import DPError, SecondBudgetWarning

PLANS = ("free", "plus", "pro")
"""The plans a user can be on; the policy's public key domain of ``users.plan``."""

COUNTRIES = ("US", "CA", "MX", "GB", "DE", "FR")
"""Users' countries; the policy's public key domain of ``users.country``."""

STORES = (
    ("Back Bay", "Boston", 1800),
    ("Seaport", "Boston", 950),
    ("Fenway", "Boston", 1200),
    ("Loop", "Chicago", 2400),
    ("Wicker Park", "Chicago", 800),
    ("Hyde Park", "Chicago", 1100),
    ("LoDo", "Denver", 1500),
    ("Highlands", "Denver", 700),
    ("South Congress", "Austin", 1300),
    ("Domain", "Austin", 2100),
    ("Capitol Hill", "Seattle", 900),
    ("Ballard", "Seattle", 1000),
)
"""The public ``stores`` table: (store, city, size in square metres)."""

SHOP_POLICY = """\
BUDGET EPSILON 3.0 DELTA 1e-6;
NEIGHBOURS UNBOUNDED;
QUERY EPSILON 0.1;
PRIVATE TABLE visits (
    PRIVACY UNIT user_id,
    MAX ROWS PER UNIT 10,
    MAX GROUPS PER UNIT 5,
    amount BOUNDS 0 TO 500,
    age BOUNDS 18 TO 90,
    store KEYS FROM stores.store
);
PRIVATE TABLE users (
    PRIVACY UNIT user_id,
    MAX ROWS PER UNIT 1,
    plan KEYS ('free', 'plus', 'pro'),
    country KEYS ('US', 'CA', 'MX', 'GB', 'DE', 'FR')
);
PUBLIC TABLE stores;
"""
"""The policy of the shop database, in dpsql's policy language."""

DEMO_QUERIES: list[tuple[str, str, float | None]] = [
    ("Total visits", "SELECT COUNT(*) AS visits FROM visits", 0.1),
    (
        "Total and average amount",
        "SELECT SUM(amount) AS total, AVG(amount) AS average FROM visits",
        0.3,
    ),
    (
        "Visits per store (keys from the public stores table)",
        "SELECT store, COUNT(*) AS visits FROM visits GROUP BY store ORDER BY store",
        0.3,
    ),
    (
        "Average age of visits spending over 100",
        "SELECT AVG(age) AS average_age FROM visits WHERE amount > 100",
        0.2,
    ),
    (
        "Share of big visits",
        "SELECT SUM(CASE WHEN amount > 100 THEN 1 ELSE 0 END) AS big, COUNT(*) AS visits"
        " FROM visits",
        0.2,
    ),
    (
        "Users per plan",
        "SELECT plan, COUNT(*) AS users FROM users GROUP BY plan ORDER BY plan",
        0.2,
    ),
    (
        "Stores per city (public table: exact and free)",
        "SELECT city, COUNT(*) AS stores FROM stores GROUP BY city ORDER BY city",
        None,
    ),
    ("Raw rows of a private table (refused)", "SELECT user_id, amount FROM visits", None),
]
"""(title, sql, epsilon) of the queries the demo runs; ``None`` uses the policy's default."""

_COLUMN_TYPES = {
    "stores": {"store": "VARCHAR", "city": "VARCHAR", "size": "INTEGER"},
    "users": {"user_id": "INTEGER", "country": "VARCHAR", "plan": "VARCHAR", "signup": "DATE"},
    "visits": {
        "user_id": "INTEGER",
        "day": "DATE",
        "store": "VARCHAR",
        "amount": "DOUBLE",
        "age": "INTEGER",
        "zip": "VARCHAR",
    },
}


def build_shop_database(path: str | os.PathLike, *, users: int = 2000, seed: int = 7) -> None:
    """Write the sample shop database to ``path`` (a DuckDB file), replacing any old one.

    >>> import tempfile, duckdb
    >>> with tempfile.TemporaryDirectory() as d:
    ...     build_shop_database(f"{d}/shop.duckdb", users=50)
    ...     with duckdb.connect(f"{d}/shop.duckdb") as con:
    ...         con.sql("SELECT COUNT(*) FROM users").fetchall()
    [(50,)]
    """
    if users < 1:
        raise ValueError(f"users must be at least 1, got {users}")
    frames = _generate_shop(users, np.random.default_rng(seed))
    path = Path(path)
    for stale in (path, path.with_name(path.name + ".wal")):
        stale.unlink(missing_ok=True)
    write_database(path, {name: (frame, _COLUMN_TYPES[name]) for name, frame in frames.items()})


def _generate_shop(users: int, rng: np.random.Generator) -> dict[str, pd.DataFrame]:
    """The three tables as DataFrames, drawn from ``rng`` in a fixed order."""
    stores = pd.DataFrame(STORES, columns=["store", "city", "size"])

    user_id = np.arange(1, users + 1, dtype=np.int32)
    country = rng.choice(np.array(COUNTRIES), size=users, p=[0.4, 0.15, 0.1, 0.12, 0.12, 0.11])
    plan = rng.choice(np.array(PLANS), size=users, p=[0.6, 0.3, 0.1])
    # 2022-01-01 plus 0..1095 days: signed up before 2025, the year of the visits.
    signup = np.datetime64("2022-01-01") + rng.integers(0, 1096, size=users)
    age = rng.integers(18, 91, size=users)
    zip_code = np.array([f"{z:05d}" for z in rng.integers(0, 100_000, size=users)])
    home_store = rng.integers(0, len(STORES), size=users)

    # Heavy tail: most users 1-5 visits, some 6-30, about 2% hundreds (at least one).
    kind = rng.random(users)
    visits_per_user = rng.integers(1, 6, size=users)
    regular = kind >= 0.80
    visits_per_user[regular] = rng.integers(6, 31, size=int(regular.sum()))
    heavy = kind >= 0.98
    if not heavy.any():
        heavy[np.argmax(kind)] = True
    visits_per_user[heavy] = rng.integers(200, 801, size=int(heavy.sum()))

    owner = np.repeat(np.arange(users), visits_per_user)
    n = len(owner)
    day = np.datetime64("2025-01-01") + rng.integers(0, 365, size=n)
    store_index = np.where(
        rng.random(n) < 0.7, home_store[owner], rng.integers(0, len(STORES), size=n)
    )
    amount = np.round(rng.gamma(2.0, 30.0, size=n), 2)
    special = rng.permutation(n)
    outliers = special[: max(3, n // 500)]
    nulls = special[len(outliers) : len(outliers) + max(3, n // 200)]
    amount[outliers] = np.round(rng.uniform(600.0, 2500.0, size=len(outliers)), 2)
    missing = np.zeros(n, dtype=bool)
    missing[nulls] = True

    visits = pd.DataFrame(
        {
            "user_id": user_id[owner],
            "day": day,
            "store": np.array([s[0] for s in STORES])[store_index],
            "amount": pd.arrays.FloatingArray(amount, missing),
            "age": age[owner],
            "zip": zip_code[owner],
        }
    )
    # Stored like a visit log: by day, then user.
    visits = visits.iloc[np.lexsort((visits["user_id"], visits["day"]))].reset_index(drop=True)
    users_frame = pd.DataFrame(
        {"user_id": user_id, "country": country, "plan": plan, "signup": signup}
    )
    return {"stores": stores, "users": users_frame, "visits": visits}


def run_demo(
    directory: str | os.PathLike | None = None,
    out: TextIO = sys.stdout,
    *,
    connect: Callable[..., Any] | None = None,
) -> None:
    """Build the shop database in ``directory`` and run ``DEMO_QUERIES`` on it, printing each.

    ``directory`` defaults to ``demo-data/`` in the current directory. Any earlier ledger
    there is removed, so every run starts with the full budget; a policy stored with it (by
    ``dpsql init``) is stored again with the new ledger, so commands that relied on it still
    need no ``--policy``. ``connect`` defaults to ``dpsql.connect``; tests may pass a stand-in.
    """
    import dpsql

    directory = Path("demo-data" if directory is None else directory)
    directory.mkdir(parents=True, exist_ok=True)
    database = directory / "shop.duckdb"
    policy = directory / "shop.policy"
    ledger = database.with_name(database.name + ".ledger")
    stored = _stored_policy(database, ledger)
    build_shop_database(database)
    policy.write_text(SHOP_POLICY, encoding="utf-8")
    for suffix in ("", "-wal", "-shm", "-journal"):
        ledger.with_name(ledger.name + suffix).unlink(missing_ok=True)
    report = _make_report(out)
    kept = None
    if stored is not None:
        try:
            with _own_budget():
                dpsql.init_policy(str(database), stored, separate_budget=True)
            kept = stored
        except DPError as err:  # it no longer fits the rebuilt database: say so, use shop.policy
            report.error(f"the policy stored with the old ledger was not kept: {err}")
    if connect is None:
        connect = _demo_connect

    where = "the policy stored with its ledger (kept from before)" if kept else f"its policy in {policy}"
    report.text(f"dpsql demo: a sample shop database in {database}, {where}.")
    with connect(str(database), policy=None if kept else str(policy)) as db:
        report.text(f"Budget: {_format_budget(db.budget.total)}.")
        for title, sql, epsilon in DEMO_QUERIES:
            report.heading(title)
            report.text(f"  {sql}" + ("" if epsilon is None else f"    -- epsilon {epsilon:g}"))
            try:
                result = db.sql(sql) if epsilon is None else db.sql(sql, epsilon=epsilon)
                frame = result.df()
                accuracy = result.accuracy()
            except DPError as err:
                report.error(f"refused: {err}")
                report.text(f"remaining budget: {_format_budget(db.budget.remaining)}")
                continue
            report.table(*_render_result(frame, accuracy))
            report.text(
                f"cost: {_format_budget(result.cost)}; "
                f"remaining budget: {_format_budget(db.budget.remaining)}"
            )
        report.heading("Done")
        report.text(
            f"Spent {_format_budget(db.budget.spent)} of {_format_budget(db.budget.total)}. "
            "± is the 95% half-width of the noise; the policy keeps at most 10 visits per user,"
            " so counts and sums are of those visits only."
        )
    report.heading("Next")
    for line in next_commands(database, None if kept else policy):
        report.text(line)  # the console neither wraps nor reads markup: lines copy as printed


NEXT_QUERY = "SELECT store, COUNT(*) AS visits FROM visits GROUP BY store"
"""The query the demo's last lines suggest running with ``dpsql query``."""


def next_commands(database: Path, policy: Path | None, *, which: Callable[[str], str | None] = shutil.which,
                  executable: str = sys.executable, cwd: str | os.PathLike | None = None) -> list[str]:
    """What to run after the demo, written so that it runs from ``cwd`` as printed: ``dpsql``
    when the PATH finds this installation's, else the path of its script (``.venv/bin/dpsql``
    after ``make demo``, which does not put it on the PATH), with how to activate the venv.

    >>> lines = next_commands(Path("demo-data/shop.duckdb"), Path("demo-data/shop.policy"),
    ...                       which=lambda name: "/w/.venv/bin/dpsql", executable="/w/.venv/bin/python", cwd="/w")
    >>> print(lines[0].split("  #")[0])
    dpsql shell demo-data/shop.duckdb --policy demo-data/shop.policy
    >>> print(next_commands(Path("demo-data/shop.duckdb"), None, which=lambda name: None,
    ...                     executable="/w/.venv/bin/python", cwd="/w")[0].split("  #")[0])
    .venv/bin/dpsql shell demo-data/shop.duckdb
    """
    here = Path(os.getcwd() if cwd is None else cwd)
    folder = Path(executable).parent  # not resolved: a venv's python is a link to the base one
    script = folder / "dpsql"
    found = which("dpsql")
    on_path = found is not None and _same_file(Path(found), script)
    if on_path:
        program = "dpsql"
    elif script.is_file() or cwd is not None:
        program = shlex.quote(_shown_path(script, here))
    else:  # no script beside this interpreter (run from a source tree): the module runs anywhere
        program = f"{shlex.quote(_shown_path(Path(executable), here))} -m dpsql"
    options = [database.as_posix()] + ([] if policy is None else ["--policy", policy.as_posix()])
    given = " ".join(shlex.quote(part) for part in options)
    lines = [f"{program} shell {given}",
             f"{program} query {given} {shlex.quote(NEXT_QUERY)} --epsilon 0.2",
             f"{program} budget {shlex.quote(database.as_posix())}" + (
                 "" if policy is None else f" --policy {shlex.quote(policy.as_posix())}")]
    notes = ["  # explore: completion, answers with ±, .help lists the commands",
             "  # one answer, its cost on standard error", "  # what is spent and what remains"]
    lines = [line + note for line, note in zip(lines, notes)]
    if not on_path and (folder / "activate").is_file():
        lines.append(f"(or `source {shlex.quote(_shown_path(folder / 'activate', here))}` first, "
                     "then write dpsql alone)")
    return lines


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or a.samefile(b)
    except OSError:
        return False


def _shown_path(path: Path, here: Path) -> str:
    """``path`` relative to ``here`` when it is inside it (``.venv/bin/dpsql``), else absolute."""
    try:
        return path.absolute().relative_to(here.absolute()).as_posix()
    except ValueError:
        return path.absolute().as_posix()


def _demo_connect(*args: Any, **options: Any) -> Any:
    """``dpsql.connect`` for the demo's own database: each run builds new synthetic people, so its
    ledger is a budget of its own wherever an earlier demo left another (``separate_budget``)."""
    import dpsql

    with _own_budget():
        return dpsql.connect(*args, separate_budget=True, **options)


@contextmanager
def _own_budget() -> Iterator[None]:
    """No warning that a demo's ledger is a second budget: its people are new each run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SecondBudgetWarning)
        yield


def _stored_policy(database: Path, ledger: Path) -> str | None:
    """The policy text stored with an existing ledger (``dpsql init``), else ``None``."""
    if not (database.exists() and ledger.exists()):
        return None
    import dpsql

    try:
        with dpsql.connect(str(database)) as db:  # no policy given: the stored one, if any
            return db.policy_text()
    except DPError:  # none stored (or the files are not dpsql's): nothing to keep
        return None


def _render_result(frame: pd.DataFrame, accuracy: dict[str, float]) -> tuple[list, list, list]:
    """Column names, rows of text and alignments; noisy values read ``value ± half-width``."""
    columns = [str(c) for c in frame.columns]
    numeric = [pd.api.types.is_numeric_dtype(frame[c]) for c in frame.columns]
    rows = []
    for record in frame.itertuples(index=False, name=None):
        cells = []
        for column, value in zip(columns, record):
            half_width = accuracy.get(column)
            if isinstance(half_width, (int, float)):
                cells.append(format_noisy(value, half_width))
            else:
                cells.append(_format_plain(value))
        rows.append(cells)
    right = [numeric[i] or c in accuracy for i, c in enumerate(columns)]
    return columns, rows, right


def format_noisy(value: Any, half_width: float) -> str:
    """``value ± half-width``, both to two significant digits of the half-width.

    >>> format_noisy(31204, 38.1)
    '31,204 ± 38'
    >>> format_noisy(None, 3.0)
    'NULL'
    """
    if _is_missing(value):
        return "NULL"
    half_width = float(half_width)
    if math.isnan(half_width):
        return f"{_format_plain(value)} (derived, no ±)"
    if not math.isfinite(half_width) or half_width <= 0:
        return f"{_format_plain(value)} ± {half_width:g}"
    decimals = min(6, max(0, 1 - math.floor(math.log10(half_width))))
    return f"{float(value):,.{decimals}f} ± {half_width:,.{decimals}f}"


def _format_plain(value: Any) -> str:
    if _is_missing(value):
        return "NULL"
    if isinstance(value, (float, np.floating)):
        return f"{float(value):,.6g}"
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return f"{int(value):,}"
    return str(value)


def _is_missing(value: Any) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def _format_budget(amount: Any) -> str:
    """An (epsilon, delta) pair, e.g. a cost or what remains of the budget."""
    return f"epsilon {_format_number(amount.epsilon)}, delta {_format_number(amount.delta)}"


def _format_number(number: Fraction | float) -> str:
    return f"{float(number):g}"


def _make_report(out: TextIO) -> _PlainReport | _RichReport:
    """A rich report when rich is installed (it is optional), a plain-text one otherwise."""
    try:
        from rich.console import Console
    except ImportError:
        return _PlainReport(out)
    console = Console(file=out, highlight=False, markup=False, emoji=False, soft_wrap=True)
    return _RichReport(console)


class _PlainReport:
    """Writes the demo as plain text."""

    def __init__(self, out: TextIO):
        self.out = out

    def heading(self, title: str) -> None:
        print(f"\n== {title}", file=self.out)

    def text(self, line: str) -> None:
        print(line, file=self.out)

    def error(self, line: str) -> None:
        print(line, file=self.out)

    def table(self, columns: list[str], rows: list[list[str]], right: list[bool]) -> None:
        widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
        for cells in [columns, ["-" * w for w in widths], *rows]:
            aligned = (c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right))
            print("  " + "  ".join(aligned).rstrip(), file=self.out)


class _RichReport:
    """Writes the demo with rich: bold headings, boxed tables."""

    def __init__(self, console: Any):
        self.console = console

    def heading(self, title: str) -> None:
        self.console.print()
        self.console.print(title, style="bold")

    def text(self, line: str) -> None:
        self.console.print(line)

    def error(self, line: str) -> None:
        self.console.print(line, style="red")

    def table(self, columns: list[str], rows: list[list[str]], right: list[bool]) -> None:
        from rich.table import Table
        from rich.text import Text

        table = Table(header_style="bold")
        for column, align_right in zip(columns, right):
            table.add_column(Text(column), justify="right" if align_right else "left", no_wrap=True)
        for cells in rows:
            table.add_row(*(Text(cell) for cell in cells))
        self.console.print(table)
