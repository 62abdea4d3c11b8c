"""The documentation's examples run, so README.md and docs/*.md cannot drift from the code.

Every fenced block in README.md and docs/*.md says what it is by its info string:

- ```` ```python ````: run. The blocks of one file run in order in one namespace, in a fresh
  folder that holds the demo shop database (``dpsql.demo``) as ``shop.duckdb`` and
  ``demo-data/shop.duckdb``, each beside its ``shop.policy`` with the demo's policy under a
  generous budget; every ``dpsql.connect`` without an ``rng`` gets a seeded one, so a run is
  deterministic. A block that cannot run here is preceded by ``<!-- not run: REASON -->``.
- ```` ```sql query ````: explained and answered on the demo data (seeded noise);
  ```` ```sql refused ````: refused with an ``UnsupportedQuery`` before anything is charged;
  ```` ```sql policy ````: a policy, checked against the demo database at connect.
- ```` ```toml ````: parsed.
- ```` ```sh ```` and ```` ```console ````: command lines and terminal sessions. Every ``dpsql``
  command line in them (``$ dpsql`` in a console) names a real subcommand and only options that
  subcommand has. In a console, a ``$ dpsql`` command with its output runs (exit 0, the header
  line shown), and a ``dpsql>`` session runs as a script through the ``dpsql shell`` command
  shown before it (the refusals shown are refused, the columns shown are printed); each after
  the ``dpsql init`` lines shown before it in the same file. A ``shop=>`` psql session runs
  against ``dpsql serve`` on the demo data (its ERRORs and NOTICEs checked). Other commands
  are not run.
- ```` ```text ````: output and diagrams.

A fence with any other info string, or none, fails the test, as does an example that raises.
"""

from __future__ import annotations

import re
import shlex
import textwrap
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from served import serve_shop

import dpsql
from dpsql.backends.spark.config import load_spark_config
from dpsql.cli import build_parser
from dpsql.demo import SHOP_POLICY, build_shop_database
from dpsql.mechanisms.noise import SeededSource
from dpsql.shell.commands import REGISTRY

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

GENEROUS_POLICY = SHOP_POLICY.replace("BUDGET EPSILON 3.0 DELTA 1e-6;", "BUDGET EPSILON 1000 DELTA 1e-2;")
assert GENEROUS_POLICY != SHOP_POLICY, "the demo policy's budget line changed: update GENEROUS_POLICY"

FENCE = re.compile(r"\s*(?P<ticks>`{3,})(?P<info>[^`]*)")  # CommonMark: no backtick in the info string
NOT_RUN = re.compile(r"<!--\s*not run:\s*(?P<reason>\S.*?)\s*-->")
KINDS = {"python", "sql query", "sql refused", "sql policy", "toml", "sh", "console", "text"}


@dataclass(frozen=True)
class Block:
    """One fenced block: its file, the line of its opening fence, info string and text."""

    path: Path
    line: int
    info: str
    text: str
    not_run: str | None  # the reason given by a `<!-- not run: ... -->` line just before it

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a markdown file, in order (``` fences only, as the docs use)."""
    found: list[Block] = []
    lines = path.read_text(encoding="utf-8").split("\n")
    index = 0
    while index < len(lines):
        opening = FENCE.fullmatch(lines[index])
        if opening:  # a fence, maybe indented under a list item
            info = " ".join(opening.group("info").split())
            ticks = opening.group("ticks")
            start = index
            index += 1
            while index < len(lines) and not re.fullmatch(r"\s*" + ticks + r"`*\s*", lines[index]):
                index += 1
            if index == len(lines):
                raise AssertionError(f"{path.relative_to(ROOT)}:{start + 1}: a fence that never closes")
            before = next((lines[i] for i in range(start - 1, -1, -1) if lines[i].strip()), "")
            marker = NOT_RUN.fullmatch(before.strip())
            text = textwrap.dedent("\n".join(lines[start + 1:index])) + "\n"
            found.append(Block(path, start + 1, info, text, marker.group("reason") if marker else None))
        index += 1
    return found


ALL_BLOCKS = [block for path in DOCS for block in blocks(path)]


def test_docs_are_found():
    """The README and the reference in docs/ are there and have examples of each kind that runs."""
    names = {path.name for path in DOCS}
    assert {"README.md", "THREAT_MODEL.md", "policy.md", "sql.md", "accuracy.md", "server.md"} <= names
    kinds = {block.info for block in ALL_BLOCKS}
    assert {"python", "sql query", "sql refused", "sql policy", "toml", "sh", "console"} <= kinds


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=lambda block: block.where)
def test_every_block_is_marked(block):
    """Each fence says what it is; only Python may be marked as not run, and then with a reason."""
    assert block.info in KINDS, (
        f"{block.where}: fence ```{block.info} is not one of {sorted(KINDS)}: mark what it is "
        "(```console for a terminal session, ```text for output) or make it run")
    if block.not_run is not None:
        assert block.info in ("python", "sql query"), f"{block.where}: a `not run` marker on ```{block.info}"


@pytest.fixture(scope="module")
def demo_database(tmp_path_factory) -> Path:
    """The demo shop database (the one ``dpsql demo`` writes), built once for this module."""
    path = tmp_path_factory.mktemp("docs-shop") / "shop.duckdb"
    build_shop_database(path)
    return path


def lay_out(folder: Path, database: Path) -> Path:
    """Put the demo database and the generous policy in ``folder`` and in ``folder/demo-data``;
    return the first database."""
    for where in (folder, folder / "demo-data"):
        where.mkdir(exist_ok=True)
        (where / "shop.duckdb").write_bytes(database.read_bytes())
        (where / "shop.policy").write_text(GENEROUS_POLICY, encoding="utf-8")
    return folder / "shop.duckdb"


@pytest.fixture
def seeded(monkeypatch):
    """``dpsql.connect`` with a seeded noise source unless the example gives its own."""
    real = dpsql.connect
    counter = iter(range(1, 1_000_000))

    def connect(*args, **kwargs):
        kwargs.setdefault("rng", SeededSource(next(counter)))
        return real(*args, **kwargs)

    monkeypatch.setattr(dpsql, "connect", connect)
    return real


SERVED = "127.0.0.1:5433"
"""Where the docs' examples find `dpsql serve` (its documented default port)."""

PYTHON_DOCS = [path for path in DOCS
               if any(b.info == "python" and b.not_run is None and b.path == path for b in ALL_BLOCKS)]


@pytest.mark.parametrize("path", PYTHON_DOCS, ids=lambda path: str(path.relative_to(ROOT)))
def test_python_examples_run(path, demo_database, tmp_path, monkeypatch, seeded):
    """Each file's Python blocks run in order, in one namespace, on the demo data; a file whose
    examples are a client of ``dpsql serve`` at 127.0.0.1:5433 gets one (the demo data, analyst
    alice, password PASSWORD) on a port the kernel picks, written in place of 5433."""
    lay_out(tmp_path, demo_database)
    monkeypatch.chdir(tmp_path)
    runnable = [block for block in blocks(path) if block.info == "python" and block.not_run is None]
    server = None
    if any(SERVED in block.text for block in runnable):
        served = tmp_path / "served"
        served.mkdir()
        server = serve_shop(lay_out(served, demo_database), served, GENEROUS_POLICY, "alice", "PASSWORD")
    namespace: dict = {"__name__": "__docs__"}
    ran = 0
    try:
        for block in runnable:
            text = block.text if server is None else block.text.replace(SERVED, f"127.0.0.1:{server.port}")
            code = compile(text, block.where, "exec")
            try:
                exec(code, namespace)
            except Exception as error:  # the example is wrong: say where
                raise AssertionError(f"{block.where}: the example raised {type(error).__name__}: {error}") from error
            ran += 1
    finally:
        for value in list(namespace.values()):
            if isinstance(value, dpsql.Connection):
                value.close()
            elif type(value).__name__ == "Engine" and hasattr(value, "dispose"):  # SQLAlchemy's
                value.dispose()
        if server is not None:
            server.stop()
            server.thread.join(10)
    assert ran, f"{path.relative_to(ROOT)}: every Python block is marked not run"


SQL_BLOCKS = [block for block in ALL_BLOCKS if block.info.startswith("sql ") and block.not_run is None]


@pytest.fixture(scope="module")
def shop_db(demo_database, tmp_path_factory):
    """One connection to a copy of the demo database under the generous policy, seeded noise."""
    database = lay_out(tmp_path_factory.mktemp("docs-sql"), demo_database)
    with dpsql.connect(str(database), policy=GENEROUS_POLICY, rng=SeededSource(23)) as db:
        yield db


@pytest.mark.parametrize("block", SQL_BLOCKS, ids=lambda block: block.where)
def test_sql_examples(block, shop_db, demo_database, tmp_path):
    """A query is explained and answered; a refused query is refused before any charge; a
    policy is accepted by the demo database."""
    if block.info == "sql policy":
        database = lay_out(tmp_path, demo_database)
        with dpsql.connect(str(database), policy=block.text, ledger=str(tmp_path / "policy.ledger")) as db:
            assert db.budget.total.epsilon > 0, block.where
        return
    spent = shop_db.budget.spent.epsilon
    if block.info == "sql refused":
        with pytest.raises(dpsql.UnsupportedQuery):
            shop_db.sql(block.text)
        assert shop_db.budget.spent.epsilon == spent, f"{block.where}: a refusal was charged"
        return
    assert block.info == "sql query", block.where
    try:
        plan = shop_db.explain(block.text)
        refused = getattr(plan, "refused", None)  # a free query (public data only) explains as text
        assert refused is None, f"{block.where}: {refused}"
        result = shop_db.sql(block.text)
    except dpsql.DPError as error:
        raise AssertionError(f"{block.where}: {type(error).__name__}: {error}") from error
    assert result.columns, block.where


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.info == "toml"], ids=lambda block: block.where)
def test_toml_examples_parse(block, tmp_path):
    """A configuration example is valid TOML and, when named ``*.spark.toml``, a Spark config
    dpsql reads (without starting Spark)."""
    assert tomllib.loads(block.text), block.where
    name = re.match(r"#\s*(\S+\.spark\.toml)\b", block.text)
    if name:
        (tmp_path / name.group(1)).write_text(block.text, encoding="utf-8")
        config = load_spark_config(tmp_path / name.group(1))
        assert config.master, block.where


def subcommand_options(parser) -> dict[str, set[str]]:
    """Each subcommand's option strings, with those of its own subcommands (``user add``)."""
    def options(sub) -> set[str]:
        found = set(sub._option_string_actions)
        for action in sub._actions:
            if action.choices and isinstance(action.choices, dict):
                for nested in action.choices.values():
                    found |= options(nested)
        return found

    commands = next(action for action in parser._actions if isinstance(action.choices, dict)).choices
    return {name: options(sub) for name, sub in commands.items()}


def command_lines(block: Block) -> list[str]:
    """The ``dpsql`` command lines of a shell block (``$ dpsql ...`` in a console session),
    continuation lines joined, comments left out."""
    text = re.sub(r"\\\n\s*", " ", block.text)
    prompt = "$ " if block.info == "console" else ""
    found = []
    for line in text.split("\n"):
        line = line.strip()
        if not line.startswith(prompt + "dpsql "):
            continue
        found.append(line[len(prompt):])
    return found


COMMAND_LINES = [(block, line) for block in ALL_BLOCKS if block.info in ("sh", "console")
                 for line in command_lines(block)]


@pytest.mark.parametrize("block,line", COMMAND_LINES,
                         ids=[f"{b.where}:{command.split()[1]}" for b, command in COMMAND_LINES])
def test_command_lines_name_real_options(block, line):
    """``dpsql X --opt`` in the docs: X is a subcommand and --opt one of its options."""
    known = subcommand_options(build_parser())
    words = shlex.split(line, comments=True)
    command = words[1]
    if command in ("--version", "--help"):
        return
    assert command in known, f"{block.where}: `dpsql {command}` is not a command ({sorted(known)})"
    for word in words[2:]:
        option = re.match(r"\[?(--[a-z][a-z0-9-]*)", word)
        if option:
            assert option.group(1) in known[command], (
                f"{block.where}: `dpsql {command}` has no option {option.group(1)}")


def test_command_lines_are_checked():
    """The check above sees the docs' command lines (it would pass vacuously on a parsing slip)."""
    commands = {line.split()[1] for _, line in COMMAND_LINES}
    assert {"demo", "init", "shell", "query", "serve", "user"} <= commands


def console_runs() -> list[tuple[Block, str, str | None]]:
    """Each ``$ dpsql ...`` of a console session (continuation lines joined) with the first
    line printed after it, when that line is a header (no digit: noise never changes it), else None."""
    found = []
    for block in ALL_BLOCKS:
        if block.info != "console":
            continue
        lines = re.sub(r"\\\n\s*", " ", block.text).split("\n")
        for index, line in enumerate(lines):
            if line.startswith("$ dpsql "):
                after = lines[index + 1] if index + 1 < len(lines) else ""
                found.append((block, line[2:], None if re.search(r"\d", after) or after.startswith("$") else after))
    return found


CONSOLE_RUNS = console_runs()


@pytest.mark.parametrize("block,line,header", CONSOLE_RUNS, ids=[b.where for b, _, _ in CONSOLE_RUNS])
def test_console_commands_run(block, line, header, demo_database, tmp_path, monkeypatch, capsys):
    """A ``$ dpsql`` command shown with its output runs on the demo data as ``make demo`` leaves
    it, after the ``dpsql init`` lines shown before it in the same file, exits 0 and prints the
    header shown."""
    from dpsql.cli import main

    lay_out(tmp_path, demo_database)
    monkeypatch.chdir(tmp_path)
    for earlier, command in COMMAND_LINES:
        words = shlex.split(command, comments=True)
        if (earlier.path == block.path and earlier.line < block.line and words[1] == "init"
                and Path(words[2]).exists()):  # an example, not the synopsis `dpsql init DB --policy P`
            assert main(words[1:]) == 0, f"{earlier.where}: `{command}` failed"
    capsys.readouterr()
    code = main(shlex.split(line)[1:])
    printed = capsys.readouterr()
    assert code == 0, f"{block.where}: `{line}` exited {code}: {printed.err}"
    if header is not None:
        assert printed.out.split("\n")[0] == header, f"{block.where}: `{line}` printed {printed.out[:200]!r}"


def test_console_commands_are_run():
    """The README's command-line example is among those run."""
    assert any(block.path.name == "README.md" and "query" in line for block, line, _ in CONSOLE_RUNS)


def test_dot_command_table_is_complete():
    """docs/shell-and-cli.md lists every dot command the shell declares, and no other."""
    text = (ROOT / "docs" / "shell-and-cli.md").read_text(encoding="utf-8")
    rows = [line for line in text.split("\n") if line.startswith("| `.")]
    documented = {name for row in rows for name in re.findall(r"`(\.[a-z_]+)", row.split(" | ")[0])}
    assert documented == set(REGISTRY), f"documented {sorted(documented)}, declared {sorted(REGISTRY)}"
    for command in REGISTRY.values():
        for alias in command.aliases:
            assert f"`{alias}`" in text, f"the alias {alias} of {command.name} is not documented"


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_slug_is_githubs():
    assert slug("Choosing bounds with DP") == "choosing-bounds-with-dp"
    assert slug("Serving analysts: `dpsql serve`") == "serving-analysts-dpsql-serve"
    assert slug("How costs add up: `ACCOUNTING`") == "how-costs-add-up-accounting"
    assert slug("The ± is noise only") == "the--is-noise-only"


def anchors(path: Path) -> set[str]:
    """The anchors of a markdown file's headings (outside fenced blocks)."""
    text = path.read_text(encoding="utf-8")
    for block in blocks(path):
        text = text.replace(block.text, "")
    return {slug(match.group(1)) for match in re.finditer(r"(?m)^#{1,6} (.+)$", text)}


LINKS = [(path, target) for path in DOCS
         for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text(encoding="utf-8"))
         if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("path,target", LINKS, ids=[f"{p.relative_to(ROOT)}->{t}" for p, t in LINKS])
def test_links_resolve(path, target):
    """A relative link names a file of the repository and, with #anchor, one of its headings."""
    file, _, anchor = target.partition("#")
    destination = (path.parent / file).resolve() if file else path
    assert destination.exists(), f"{path.relative_to(ROOT)}: the link {target} names no file"
    if anchor:
        assert anchor in anchors(destination), f"{path.relative_to(ROOT)}: {target}: no such heading"


def shell_script(block: Block) -> str:
    """The inputs typed in a ``dpsql>`` session, as a script: continuation lines (``...>``)
    joined, annotations (two spaces and ``--`` to the end of the line) dropped, and a word
    before ``<Tab>`` completed as the shell does, to the one demo table (after FROM or JOIN) or
    column it begins."""
    def complete(match: re.Match) -> str:
        keyword, word = match.group(1), match.group(2)
        names = DEMO_SCHEMA if keyword else {c for columns in DEMO_SCHEMA.values() for c in columns}
        found = sorted(name for name in names if name.startswith(word))
        assert len(found) == 1, f"{block.where}: {word}<Tab> completes to {found}"
        return (keyword or "") + found[0]

    inputs: list[str] = []
    for line in block.text.split("\n"):
        stripped = line.strip()
        for prompt, starts in (("dpsql> ", True), ("...> ", False)):
            if stripped.startswith(prompt):
                typed = re.sub(r"\s{2,}--.*$", "", stripped[len(prompt):])
                typed = re.sub(r"(?i)(\b(?:FROM|JOIN)\s+)?(\w+)<Tab>", complete, typed)
                if starts:
                    inputs.append(typed)
                else:
                    inputs[-1] += "\n" + typed
    return "\n".join(inputs) + "\n"


DEMO_SCHEMA = {"visits": ("user_id", "day", "store", "amount", "age", "zip"),
               "users": ("user_id", "country", "plan", "signup"), "stores": ("store", "city", "size")}
SESSIONS = [block for block in ALL_BLOCKS if block.info == "console" and "\ndpsql> " in "\n" + block.text]


@pytest.mark.parametrize("block", SESSIONS, ids=lambda block: block.where)
def test_shell_sessions_run(block, demo_database, tmp_path, monkeypatch, capsys):
    """A ``dpsql>`` session runs as a script through the ``dpsql shell`` command shown before it
    (after the ``dpsql init`` lines shown before it): the refusals shown are refused, everything
    else answers, and every column name of a table shown is in the output."""
    import io

    from dpsql.cli import main

    lay_out(tmp_path, demo_database)
    monkeypatch.chdir(tmp_path)
    shell = None
    for earlier, command in COMMAND_LINES:
        words = shlex.split(command, comments=True)
        if earlier.path != block.path or earlier.line > block.line or len(words) < 3 or not Path(words[2]).exists():
            continue
        if words[1] == "init":
            assert main(words[1:]) == 0, f"{earlier.where}: `{command}` failed"
        elif words[1] == "shell":
            shell = words[1:]
    assert shell is not None, f"{block.where}: no `dpsql shell` on a real database is shown before this session"
    monkeypatch.setattr("sys.stdin", io.StringIO(shell_script(block)))
    capsys.readouterr()
    refusals = sum(line.startswith("refused:") for line in block.text.split("\n"))
    code = main(shell)
    printed = capsys.readouterr().out
    assert "internal error" not in printed, f"{block.where}: {printed}"
    assert printed.count("\nrefused:") + printed.startswith("refused:") == refusals, f"{block.where}: {printed}"
    assert code == (2 if refusals else 0), f"{block.where}: exit {code}: {printed}"
    for line in block.text.split("\n"):
        if line.startswith("│") and not re.search(r"\d", line):
            for name in re.findall(r"\w+", line):
                assert name in printed, f"{block.where}: no column {name} in {printed[:500]}"


PSQL_SESSIONS = [block for block in ALL_BLOCKS if block.info == "console" and "\nshop=> " in "\n" + block.text]


def psql_steps(block: Block) -> list[tuple[str, list[str], list[str]]]:
    """(statement, NOTICE texts, ERROR texts) of each ``shop=>`` input of a psql session."""
    steps: list[tuple[str, list[str], list[str]]] = []
    for line in block.text.split("\n"):
        if line.startswith("shop=> "):
            steps.append((line[len("shop=> "):].rstrip(";"), [], []))
        elif line.startswith(("NOTICE:  ", "ERROR:  ")) and steps:
            kind, _, text = line.partition(":  ")
            steps[-1][1 if kind == "NOTICE" else 2].append(text)
    return steps


@pytest.mark.parametrize("block", PSQL_SESSIONS, ids=lambda block: block.where)
def test_psql_sessions_run(block, demo_database, tmp_path):
    """A psql session shown in the docs runs against ``dpsql serve`` on the demo data (analyst
    alice): a statement shown with an ERROR fails with that message, every other one answers,
    and a NOTICE shown arrives (up to its first ';': the rest depends on the budget left)."""
    import psycopg

    served = tmp_path / "served"
    served.mkdir()
    server = serve_shop(lay_out(served, demo_database), served, GENEROUS_POLICY, "alice", "PASSWORD")
    try:
        with psycopg.connect(host="127.0.0.1", port=server.port, dbname="shop", user="alice",
                             password="PASSWORD", autocommit=True, connect_timeout=5) as connection:
            notices: list[str] = []
            connection.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary or ""))
            for statement, shown_notices, shown_errors in psql_steps(block):
                notices.clear()
                if shown_errors:
                    with pytest.raises(psycopg.Error) as refused:
                        connection.execute(statement)
                    assert refused.value.diag.message_primary == shown_errors[0], (
                        f"{block.where}: {statement}: {refused.value.diag.message_primary}")
                    continue
                try:
                    connection.execute(statement).fetchall()
                except psycopg.Error as error:
                    raise AssertionError(f"{block.where}: {statement}: {error}") from error
                for shown in shown_notices:
                    start = shown.split(";")[0]
                    assert any(notice.startswith(start) for notice in notices), f"{block.where}: {notices}"
    finally:
        server.stop()
        server.thread.join(10)
