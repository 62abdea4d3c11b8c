"""The shop schema and policy the static tests check queries against (no data needed)."""

from dpsql.demo import SHOP_POLICY
from dpsql.policy import parse_policy

SHOP_CATALOG = {
    "visits": {"user_id": "INTEGER", "day": "DATE", "store": "VARCHAR", "amount": "DOUBLE",
               "age": "INTEGER", "zip": "VARCHAR"},
    "users": {"user_id": "INTEGER", "country": "VARCHAR", "plan": "VARCHAR", "signup": "DATE"},
    "stores": {"store": "VARCHAR", "city": "VARCHAR", "size": "INTEGER"},
    "secrets": {"user_id": "INTEGER", "password": "VARCHAR"},  # in the database, not in the policy
}
SHOP = parse_policy(SHOP_POLICY)
