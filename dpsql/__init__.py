"""dpsql: differentially private SQL over DuckDB.

>>> import dpsql
>>> sorted(name for name in dpsql.__all__ if name.endswith("Error"))
['DPError', 'PolicyError']
"""

from dpsql.answer.result import Budget, DPResult
from dpsql.budget.ledger import Spend
from dpsql.connection import Connection, connect, init_policy
from dpsql.errors import (
                     BudgetExceeded,
                     DPError,
                     InvalidParameter,
                     MissingDependency,
                     PolicyError,
                     QueryFailed,
                     SecondBudget,
                     TooInaccurate,
                     UnsupportedQuery,
)
from dpsql.policy.language import load_policy, parse_policy
from dpsql.policy.model import (
                     Bounds,
                     ColumnRule,
                     KeyDomain,
                     LocalRR,
                     Policy,
                     PrivateTable,
                     PublicTable,
)

__version__ = "0.1.0"
"""The package version (``pyproject.toml`` says the same; ``dpsql --version`` prints it)."""

__all__ = [
    "connect", "init_policy", "Connection", "DPResult", "Budget", "Spend",
    "DPError", "UnsupportedQuery", "PolicyError", "BudgetExceeded", "InvalidParameter", "QueryFailed",
    "MissingDependency", "SecondBudget", "TooInaccurate",
    "Policy", "PrivateTable", "PublicTable", "ColumnRule", "Bounds", "KeyDomain",
    "LocalRR",
    "parse_policy", "load_policy",
]
