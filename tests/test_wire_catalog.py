"""psql's catalog commands, SQLAlchemy's reflection and pgjdbc's DatabaseMetaData against
``dpsql serve`` (issue 23, item 7): each answers from the schema-only catalog — names, types
and the policy's rules as comments, never a row count, a size or a value of a private table.

Every command and call here failed before with a DuckDB binder error (``relforcerowsecurity``,
``datcollate``, ``pg_table_size``, ``json_build_object``, ``_pg_expandarray``...).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from served import serve_shop

from dpsql.demo import SHOP_POLICY

PSQL = shutil.which("psql")
PASSWORD = "alice-secret"
COLUMNS = {"user_id": "integer", "day": "date", "store": "character varying", "amount": "double precision",
           "age": "integer", "zip": "character varying"}
"""visits' columns as PostgreSQL names their types."""
DESCRIPTIONS = {"user_id": "privacy unit", "day": "", "store": "keys from stores.store",
                "amount": "clamped to [0, 500]", "age": "clamped to [18, 90]", "zip": ""}
"""visits' columns' comments: the policy's rules for each."""


@pytest.fixture(scope="module")
def server(built, tmp_path_factory):
    server = serve_shop(built, tmp_path_factory.mktemp("catalog"), SHOP_POLICY, "alice", PASSWORD)
    yield server
    server.stop()
    server.thread.join(10)


def psql(server, command: str) -> str:
    """psql's output for one command, after checking it ran without an error."""
    environment = {**os.environ, "PGPASSWORD": PASSWORD, "PGCONNECT_TIMEOUT": "5"}
    done = subprocess.run([PSQL, "-h", "127.0.0.1", "-p", str(server.port), "-U", "alice", "-d", "shop", "-X",
                           "-v", "ON_ERROR_STOP=1", "-c", command], env=environment, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0 and "ERROR" not in done.stderr, (command, done.stderr)
    return done.stdout


def cells(output: str) -> list[list[str]]:
    """The rows of psql's aligned table, each a list of trimmed cells."""
    return [[cell.strip() for cell in line.split("|")] for line in output.splitlines() if "|" in line]


needs_psql = pytest.mark.skipif(PSQL is None, reason="psql is not installed")


@needs_psql
def test_psql_describes_a_table_with_postgres_type_names(server):
    output = psql(server, r"\d visits")
    assert 'Table "main.visits"' in output
    rows = cells(output)
    assert rows[0] == ["Column", "Type", "Collation", "Nullable", "Default"]
    assert {row[0]: row[1] for row in rows[1:]} == COLUMNS


@needs_psql
def test_psql_describes_a_table_in_detail_with_the_policys_rules(server):
    rows = cells(psql(server, r"\d+ visits"))
    assert rows[0] == ["Column", "Type", "Collation", "Nullable", "Default", "Storage", "Compression",
                       "Stats target", "Description"]
    assert {row[0]: row[8] for row in rows[1:]} == DESCRIPTIONS
    assert all(row[7] == "" for row in rows[1:])  # no statistics target
    users = cells(psql(server, r"\d+ users"))
    assert users[2][0] == "country" and users[2][8] == "keys 'US', 'CA', 'MX', 'GB', 'DE', 'FR'"


@needs_psql
def test_psql_lists_the_declared_tables_with_no_size(server):
    rows = cells(psql(server, r"\dt+"))
    assert rows[0][:3] == ["Schema", "Name", "Type"] and rows[0][6] == "Size"
    assert [row[1] for row in rows[1:]] == ["stores", "users", "visits"]  # not `secrets`, not bounded copies
    assert all(row[6] == "" for row in rows[1:])  # a size would count a private table's rows
    assert [row[7] for row in rows[1:]] == ["public: answered exactly, at no cost",
                                            "private: privacy unit user_id, at most 1 row per unit",
                                            "private: privacy unit user_id, at most 10 rows and 5 groups per unit"]


@needs_psql
def test_psql_lists_the_served_database_and_its_schema(server):
    databases = cells(psql(server, r"\l"))
    assert [row[0] for row in databases[1:]] == ["shop"]
    schemas = cells(psql(server, r"\dn"))
    assert [row[0] for row in schemas[1:]] == ["main"]
    assert [row[1] for row in cells(psql(server, r"\d"))[1:]] == ["stores", "users", "visits"]


@needs_psql
def test_the_catalog_names_the_served_database_and_main_everywhere(server):
    """current_database() said "memory" (DuckDB's name of the schema-only database) and
    information_schema named it too; the schema is ``main``, as DuckDB users expect, in every listing."""
    output = psql(server, "SELECT current_database(), pg_catalog.current_database() AS qualified, "
                          "current_catalog() AS cat, current_schema() AS schema, "
                          "array_to_string(current_schemas(false), ',') AS path")
    assert cells(output)[0][0] == "current_database"  # PostgreSQL's name for the column, not the macro's
    assert cells(output)[1] == ["shop", "shop", "shop", "main", "main"]
    tables = cells(psql(server, "SELECT DISTINCT table_catalog, table_schema FROM information_schema.tables"))
    assert tables[1:] == [["shop", "main"]]
    columns = cells(psql(server, "SELECT DISTINCT c.table_catalog, c.table_schema FROM information_schema.columns c"))
    assert columns[1:] == [["shop", "main"]]
    schemata = cells(psql(server, "SELECT catalog_name, schema_name FROM information_schema.schemata ORDER BY 2"))
    assert schemata[1:] == [["shop", "information_schema"], ["shop", "main"], ["shop", "pg_catalog"]]
    assert [row[0] for row in cells(psql(server, r"\dn"))[1:]] == ["main"]
    assert {row[0] for row in cells(psql(server, r"\dt"))[1:]} == {"main"}
    assert "memory" not in psql(server, "SELECT * FROM information_schema.tables") + psql(server, r"\l")


@needs_psql
def test_psql_lists_roles_and_extensions(server):
    assert [row[0] for row in cells(psql(server, r"\du"))[1:]] == ["curator"]  # never the analysts' names
    assert cells(psql(server, r"\dx"))[1:] == []


def test_a_catalog_look_up_beyond_the_emulated_catalog_says_what_to_ask_instead(server):
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(host="127.0.0.1", port=server.port, dbname="shop", user="alice", password=PASSWORD,
                         connect_timeout=5, autocommit=True) as connection:
        for sql in ("SELECT * FROM pg_catalog.pg_cast", "SELECT 'x'::int FROM pg_catalog.pg_class"):
            with pytest.raises(psycopg.Error) as refused:
                connection.execute(sql)
            assert refused.value.diag.message_primary.startswith("this catalog look-up")
            assert "information_schema.columns" in refused.value.diag.message_hint
            assert "compares and combines" not in refused.value.diag.message_hint  # the old, unrelated hint


@needs_psql
def test_catalog_statistics_count_nothing(server):
    """What a client reads as a table's size or row count is empty or unknown, not the data's."""
    output = psql(server, "SELECT c.relname, c.reltuples, c.relpages, pg_catalog.pg_table_size(c.oid) AS size, "
                          "pg_catalog.pg_total_relation_size(c.oid) AS total FROM pg_catalog.pg_class c "
                          "WHERE c.relname IN ('visits', 'users') ORDER BY 1")
    assert cells(output)[1:] == [["users", "-1.0", "0", "", ""], ["visits", "-1.0", "0", "", ""]]  # -1: never counted


def test_sqlalchemy_reflects_tables_and_columns(server):
    sqlalchemy = pytest.importorskip("sqlalchemy")
    engine = sqlalchemy.create_engine(f"postgresql+psycopg://alice:{PASSWORD}@127.0.0.1:{server.port}/shop")
    try:
        inspector = sqlalchemy.inspect(engine)
        assert inspector.get_table_names() == ["stores", "users", "visits"]
        columns = inspector.get_columns("visits")
        assert [c["name"] for c in columns] == list(COLUMNS)
        assert [type(c["type"]).__name__ for c in columns] == ["INTEGER", "DATE", "VARCHAR", "DOUBLE_PRECISION",
                                                               "INTEGER", "VARCHAR"]
        assert all(c["nullable"] and c["default"] is None for c in columns)
        assert {c["name"]: c["comment"] or "" for c in columns} == DESCRIPTIONS
        assert inspector.get_table_comment("stores") == {"text": "public: answered exactly, at no cost"}
        assert inspector.get_pk_constraint("visits")["constrained_columns"] == []
        assert inspector.get_foreign_keys("visits") == inspector.get_indexes("visits") == []
        table = sqlalchemy.Table("stores", sqlalchemy.MetaData(), autoload_with=engine)
        assert list(table.c.keys()) == ["store", "city", "size"]
        metadata = sqlalchemy.MetaData()
        metadata.reflect(engine)
        assert sorted(metadata.tables) == ["stores", "users", "visits"]
    finally:
        engine.dispose()


JDBC_JARS = sorted(Path.home().glob(".m2/repository/org/postgresql/postgresql/*/postgresql-*.jar")) \
    + sorted(Path("/usr/share/java").glob("postgresql*.jar"))
METADATA_PROGRAM = """
import java.sql.*;
public class Metadata {
  public static void main(String[] a) throws Exception {
    try (Connection c = DriverManager.getConnection(a[0], a[1], a[2])) {
      DatabaseMetaData m = c.getMetaData();
      try (ResultSet r = m.getColumns(null, null, "visits", "%")) {
        while (r.next()) System.out.println("column " + r.getString("COLUMN_NAME") + " " + r.getInt("DATA_TYPE")
                                            + " " + r.getString("REMARKS"));
      }
      try (ResultSet r = m.getPrimaryKeys(null, null, "visits")) { while (r.next()) System.out.println("key"); }
      try (ResultSet r = m.getIndexInfo(null, null, "visits", false, false)) {
        while (r.next()) System.out.println("index");
      }
      try (ResultSet r = m.getSchemas()) { while (r.next()) System.out.println("schema " + r.getString(1)); }
      try (ResultSet r = m.getCatalogs()) { while (r.next()) System.out.println("catalog " + r.getString(1)); }
      try (ResultSet r = m.getTables(null, null, "stores", new String[]{"TABLE"})) {
        while (r.next()) System.out.println("table " + r.getString("TABLE_NAME") + " " + r.getString("REMARKS"));
      }
    }
  }
}
"""


@pytest.mark.skipif(shutil.which("java") is None or not JDBC_JARS, reason="needs java and a pgjdbc jar")
def test_pgjdbc_metadata_columns_keys_schemas_catalogs(server, tmp_path):
    (tmp_path / "Metadata.java").write_text(METADATA_PROGRAM)
    done = subprocess.run(["java", "-cp", str(JDBC_JARS[0]), str(tmp_path / "Metadata.java"),
                           f"jdbc:postgresql://127.0.0.1:{server.port}/shop", "alice", PASSWORD],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # java.sql.Types: INTEGER 4, DATE 91, VARCHAR 12, DOUBLE 8
    assert done.stdout.split("\n") == [
        "column user_id 4 privacy unit", "column day 91 null", "column store 12 keys from stores.store",
        "column amount 8 clamped to [0, 500]", "column age 4 clamped to [18, 90]", "column zip 12 null",
        "schema main", "catalog shop", "table stores public: answered exactly, at no cost", ""]


@pytest.mark.parametrize("sql", [
    "SELECT current_setting('temp_directory')",  # answered from the fixed settings: NULL
    "SELECT pg_catalog.current_setting('memory_limit')",
])
def test_settings_a_catalog_look_up_reads_are_the_fixed_ones(server, sql):
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(host="127.0.0.1", port=server.port, dbname="shop", user="alice", password=PASSWORD,
                         connect_timeout=5, autocommit=True) as connection:
        assert connection.execute(sql).fetchall() == [(None,)]
        assert connection.execute("SELECT current_setting('default_table_access_method')").fetchall() == [("heap",)]


@pytest.mark.parametrize("sql", [
    "SELECT \"current_setting\"('temp_directory')",  # DuckDB's own: the catalog database's paths
    "SELECT main.current_setting('temp_directory')",
    "SELECT * FROM pg_catalog.generate_series(1, 100000000)",
    "SELECT pg_catalog.generate_series(1, 100000000)",
    # DuckDB's table functions, however qualified (an attacker's review: query() ran any SELECT,
    # read_text read the server's .tmp folder, duckdb_settings showed its paths)
    "SELECT * FROM pg_catalog.query('SELECT version() AS v')",
    "SELECT name, value FROM pg_catalog.duckdb_settings()",
    "SELECT t.* FROM pg_catalog.pg_namespace c, LATERAL read_text('notes/*') t",
    "SELECT * FROM pg_catalog.pg_class c JOIN LATERAL pg_catalog.query_table('pg_class') q ON true",
    "SELECT * FROM information_schema.read_blob('notes/*')",
])
def test_catalog_look_ups_cannot_read_duckdbs_settings_or_count_far(server, sql):
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(host="127.0.0.1", port=server.port, dbname="shop", user="alice", password=PASSWORD,
                         connect_timeout=5, autocommit=True) as connection:
        with pytest.raises(psycopg.Error) as refused:
            connection.execute(sql)
    assert refused.value.sqlstate in ("0A000", "42P01", "42601"), refused.value
    assert not re.search(r"/tmp|\.tmp|memory_limit =", str(refused.value))


def connect(server):
    psycopg = pytest.importorskip("psycopg")
    return psycopg.connect(host="127.0.0.1", port=server.port, dbname="shop", user="alice", password=PASSWORD,
                           connect_timeout=5, autocommit=True)


ENGINE_WORDS = re.compile(r"(Catalog|Binder|Conversion|Parser|INTERNAL) Error|does not exist!|duckdb", re.IGNORECASE)
"""DuckDB's own words in an error: what an analyst must never read (issue 35)."""


def test_current_user_and_its_synonyms_answer_the_signed_in_analyst(server):
    """``SELECT current_user`` answered DuckDB's user, "duckdb"."""
    psycopg = pytest.importorskip("psycopg")
    with connect(server) as connection:
        cursor = connection.execute("SELECT current_user, user, session_user, current_role, current_user() AS called")
        assert [column.name for column in cursor.description] == ["current_user", "user", "session_user",
                                                                  "current_role", "called"]
        assert cursor.fetchall() == [("alice",) * 5]
        assert connection.execute("SELECT 1 AS user WHERE current_user = 'alice'").fetchall() == [(1,)]
        for sql in ('SELECT "user"', "SELECT main.current_user()", "SELECT system.main.session_user()"):
            with pytest.raises(psycopg.Error) as refused:  # DuckDB's own spellings: never "duckdb"
                connection.execute(sql)
            assert refused.value.sqlstate == "0A000" and not ENGINE_WORDS.search(str(refused.value)), sql


PGCLI_STARTUP = [
    "show time zone",
    "SELECT * FROM unnest(current_schemas(true))",
    "SELECT n.nspname, c.relname FROM pg_catalog.pg_class c LEFT JOIN pg_catalog.pg_namespace n "
    "ON n.oid = c.relnamespace WHERE c.relkind = ANY('{r,p,f}') ORDER BY 1, 2",
    "SELECT nsp.nspname, cls.relname, att.attname, att.atttypid::regtype::text AS type_name, "
    "pg_catalog.pg_get_expr(def.adbin, def.adrelid, true) AS dflt FROM pg_catalog.pg_attribute att "
    "JOIN pg_catalog.pg_class cls ON att.attrelid = cls.oid JOIN pg_catalog.pg_namespace nsp "
    "ON cls.relnamespace = nsp.oid LEFT JOIN pg_attrdef def ON def.adrelid = att.attrelid AND def.adnum = att.attnum "
    "WHERE cls.relkind = ANY('{v,m}') AND NOT att.attisdropped AND att.attnum > 0 ORDER BY 1, 2, att.attnum",
    "SELECT n.nspname, p.proname, p.proargnames, COALESCE(proallargtypes::regtype[], proargtypes::regtype[])::text[], "
    "prorettype::regtype::text, p.prokind = 'a', p.proretset, d.deptype = 'e', pg_get_expr(proargdefaults, 0) "
    "FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace "
    "LEFT JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e' "
    "WHERE p.prorettype::regtype != 'trigger'::regtype ORDER BY 1, 2",
]
"""What pgcli asks on connecting (its completions), in its forms: a text array literal compared
with ``= ANY``, ``::regtype[]`` casts (which did not parse, so the look-up went to dpsql)."""


@pytest.mark.parametrize("sql", PGCLI_STARTUP, ids=lambda sql: sql[:40])
def test_what_pgcli_asks_on_connecting_is_answered(server, sql):
    with connect(server) as connection:
        cursor = connection.execute(sql)
        assert cursor.description is not None
        rows = cursor.fetchall()
    if "ANY('{r,p,f}')" in sql:
        assert rows == [("main", "stores"), ("main", "users"), ("main", "visits")]
    if "pg_proc" in sql:
        assert rows == []  # DuckDB's functions (read_text, glob...) are not the database's


def test_pgcli_4s_bound_look_ups_answer_as_postgresql_would(server):
    """pgcli 4 (psycopg 3) binds its look-ups' values server-side: ``relkind = ANY($1)`` with an
    array's text, which DuckDB read as one string (its completion listed no table), and
    ``$1::regclass`` / ``$1::regproc`` for ``\\sv`` and ``\\sf``."""
    psycopg = pytest.importorskip("psycopg")
    relations = ("SELECT n.nspname, c.relname FROM pg_catalog.pg_class c LEFT JOIN pg_catalog.pg_namespace n "
                 "ON n.oid = c.relnamespace WHERE c.relkind = ANY(%s) ORDER BY 1, 2")
    view = "WITH v AS (SELECT %s::pg_catalog.regclass::pg_catalog.oid AS v_oid) SELECT relname, relkind, " \
           "pg_catalog.pg_get_viewdef(c.oid, true) FROM pg_catalog.pg_class c JOIN v ON c.oid = v.v_oid"
    with connect(server) as connection:
        assert connection.execute(relations, [["r", "p", "f"]]).fetchall() == \
            [("main", "stores"), ("main", "users"), ("main", "visits")]
        assert connection.execute(relations, [["v", "m"]]).fetchall() == []  # not DuckDB's own views
        assert connection.execute(view, ["visits"]).fetchall() == [("visits", "r", "")]
        assert connection.execute(view, ["main.visits"]).fetchall() == [("visits", "r", "")]
        with pytest.raises(psycopg.errors.UndefinedTable) as unknown:
            connection.execute(view, ["nosuch"])
        with pytest.raises(psycopg.errors.UndefinedFunction):
            connection.execute("SELECT pg_catalog.pg_get_functiondef(%s::pg_catalog.regproc::pg_catalog.oid)",
                               ["visits"])
    assert unknown.value.diag.message_primary.startswith('unknown table "nosuch"')


@pytest.mark.parametrize("cast", ["{}::regclass", "{}::pg_catalog.regclass", "CAST({} AS regclass)"])
def test_a_regclass_literal_answers_as_the_bound_form_does(server, cast):
    """psql writes ``'visits'::regclass`` into its text where psycopg binds ``$1::regclass``: the
    literal was refused as a cast DuckDB does not do (0A000)."""
    psycopg = pytest.importorskip("psycopg")
    with connect(server) as connection:
        oid = connection.execute("SELECT %s::regclass::oid", ["visits"]).fetchone()[0]
        written = cast.format("'visits'")
        assert connection.execute(f"SELECT {written}::oid").fetchone()[0] == oid
        assert connection.execute(f"SELECT {cast.format(chr(39) + 'main.visits' + chr(39))}::oid").fetchone()[0] == oid
        assert connection.execute(f"SELECT pg_catalog.obj_description({written}, 'pg_class')").fetchone() == \
            connection.execute("SELECT pg_catalog.obj_description(%s::regclass, 'pg_class')", ["visits"]).fetchone()
        assert connection.execute(f"SELECT count(*) FROM pg_catalog.pg_attribute WHERE attrelid = {written} "
                                  "AND attnum > 0").fetchone() == (len(COLUMNS),)
        for table in ("nosuch", "other.visits"):
            with pytest.raises(psycopg.errors.UndefinedTable) as unknown:
                connection.execute(f"SELECT {cast.format(chr(39) + table + chr(39))}::oid")
            assert unknown.value.diag.message_primary.startswith(f'unknown table "{table}"')
        with pytest.raises(psycopg.errors.UndefinedFunction):
            connection.execute(f"SELECT {cast.replace('regclass', 'regproc').format(chr(39) + 'foo' + chr(39))}::oid")
        assert connection.execute("SELECT 'pg_class'::regclass").fetchone() == ("1259",)  # pgjdbc's, as before


@needs_psql
def test_psqls_literal_regclass_answers_and_its_sf_of_an_unknown_function_is_undefined_function(server):
    assert psql(server, "SELECT 'visits'::regclass::oid AS v").split()[:3][-1].isdigit()
    assert "private: privacy unit user_id" in psql(server, "SELECT obj_description('visits'::regclass, 'pg_class')")
    environment = {**os.environ, "PGPASSWORD": PASSWORD, "PGCONNECT_TIMEOUT": "5"}
    done = subprocess.run([PSQL, "-h", "127.0.0.1", "-p", str(server.port), "-U", "alice", "-d", "shop", "-X",
                           "-c", r"\sf foo"], env=environment, capture_output=True,
                          text=True, timeout=30)
    # psql prints a look-up's error without its code; the code (42883) is checked through psycopg above
    assert 'ERROR:  unknown function "foo": this database has no functions of its own' in done.stderr, done.stderr
    assert not ENGINE_WORDS.search(done.stderr), done.stderr


def test_pg_settings_holds_the_fixed_settings_only(server):
    """pg_settings was refused as an unknown table; it is SHOW's fixed settings, never DuckDB's."""
    psycopg = pytest.importorskip("psycopg")
    with connect(server) as connection:
        rows = dict(connection.execute("SELECT name, setting FROM pg_catalog.pg_settings").fetchall())
        assert rows["TimeZone"] == "UTC" and rows["server_version"] == "16.0"
        assert not {"memory_limit", "temp_directory", "threads", "home_directory"} & {name.lower() for name in rows}
        with pytest.raises(psycopg.Error) as refused:  # a reference the server cannot point at the fixed ones
            connection.execute("WITH pg_settings AS (SELECT 1 AS x) SELECT * FROM pg_settings")
        assert refused.value.sqlstate == "0A000"


@needs_psql
@pytest.mark.parametrize("command", [r"\df", r"\df+", r"\da", r"\dT+", r"\dconfig", r"\dconfig *zone*"])
def test_psql_lists_functions_types_and_settings(server, command):
    """Each failed with DuckDB's words (a missing ``pg_get_function_result``, type ``pg_catalog.text``,
    table ``pg_settings``)."""
    output = psql(server, command)
    if command == r"\dconfig *zone*":
        assert [row[:2] for row in cells(output)[1:]] == [["TimeZone", "UTC"]]


@needs_psql
@pytest.mark.parametrize("command", [r"\dc", r"\dC", r"\dd", r"\dL", r"\do", r"\dO", r"\dX", r"\dy",
                                     "SELECT 'x'::int", "SELECT * FROM information_schema.routines"])
def test_a_catalog_command_beyond_the_emulated_catalog_is_refused_in_dpsqls_words(server, command):
    """They answered with DuckDB's error text ("Catalog Error: Table with name pg_cast does not exist!")."""
    environment = {**os.environ, "PGPASSWORD": PASSWORD, "PGCONNECT_TIMEOUT": "5"}
    done = subprocess.run([PSQL, "-h", "127.0.0.1", "-p", str(server.port), "-U", "alice", "-d", "shop", "-X",
                           "-c", command], env=environment, capture_output=True, text=True, timeout=30)
    assert "ERROR:  this catalog look-up " in done.stderr, done.stderr
    assert not ENGINE_WORDS.search(done.stderr), done.stderr
