"""The shop schema and policy the static tests check queries against (no data needed)."""

from dpsql.demo import SHOP_POLICY
from dpsql.policy.language import parse_policy

SHOP_CATALOG = {
    "visits": {"user_id": "INTEGER", "day": "DATE", "store": "VARCHAR", "amount": "DOUBLE",
               "age": "INTEGER", "zip": "VARCHAR"},
    "users": {"user_id": "INTEGER", "country": "VARCHAR", "plan": "VARCHAR", "signup": "DATE"},
    "stores": {"store": "VARCHAR", "city": "VARCHAR", "size": "INTEGER"},
    "secrets": {"user_id": "INTEGER", "password": "VARCHAR"},  # in the database, not in the policy
}
SHOP = parse_policy(SHOP_POLICY)


def attach_bounded_copies(connection, policy=SHOP, catalog=SHOP_CATALOG, salt: str = "ab") -> None:
    """Build the bounded copies (dpsql.backends.bounding) on a raw DuckDB connection, as an Engine does
    on first use, so generated SQL runs on it."""
    from dpsql.backends.bounding import attach_sql, bounded_tables, create_sql, fill_sql
    from dpsql.sql.names import table_key

    connection.execute(attach_sql())
    for table in bounded_tables(list(policy.private_tables), catalog, table_key):
        connection.execute(create_sql(table))
        connection.execute(fill_sql(table), {"salt": salt})
