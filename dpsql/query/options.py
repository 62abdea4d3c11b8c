"""Privacy options of one query: the caller's arguments and the SQL's written OPTIONS, checked.

Pure functions of (policy, parameters): no database, no ledger. ``dpsql.query.prepare`` calls them
before anything is planned, so a wrong epsilon or a conflicting option is refused the same way
by ``db.sql`` and ``db.explain`` (DESIGN.md invariant 14: finite, > 0, delta < 1, within what
the policy allows; never a refund).
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import Any

from dpsql.analysis.analyse import PrivacyOptions
from dpsql.analysis.plan import PrivateQuery
from dpsql.answer.explain import plural
from dpsql.errors import InvalidParameter, UnsupportedQuery, surface_hints
from dpsql.policy.model import Policy
from dpsql.sql.numbers import exact_parameter

NOISE_FAMILIES = ("laplace", "gaussian")

MIN_EPSILON = Fraction(1, 10**12)
"""The smallest epsilon a query may ask for: below it even a COUNT's discrete Laplace scale
(1/epsilon) exceeds what the exact samplers draw (``dpsql.analysis.analyse.SAMPLER_LIMITS``)."""
MIN_DELTA = Fraction(1, 10**1000)
"""The smallest positive delta: smaller ones are exact but absurd, and their decimal text
alone would exceed Python's integer-to-text limit."""


def _shown(value: Fraction) -> str:
    """A tiny exact parameter as text, without converting it to a float (1e-400 is 0.0 as one)."""
    return f"{float(value):.3g}" if value > Fraction(1, 10**300) else "far below 1e-300"


def merge_options(written: dict, epsilon: Any, delta: Any, noise: str | None) -> tuple[Any, Any, str | None]:
    """Options written in the SQL and passed as arguments mean the same; a conflict is an error."""
    merged: list[Any] = []
    for name, given in (("epsilon", epsilon), ("delta", delta), ("noise", noise)):
        option = written.get(name)
        if option is None:
            merged.append(given)
            continue
        _check_written(name, option)
        if given is not None:
            same = given == option.value if name == "noise" else exact_parameter(given, name) == option.value
            if not same:
                raise InvalidParameter(
                    f"{name} is given twice: {option.value} in the SQL and {given} as an argument",
                    line=option.line, col=option.col, hint=f"give {name} once, in the SQL or as an argument",
                    hints={"cli": f"give {name} once, in the SQL or with --{name}",
                           "shell": f"give {name} once, in the SQL or with .{name}"})
        merged.append(option.value)
    return merged[0], merged[1], merged[2]


def _check_written(name: str, option) -> None:
    """An epsilon or delta written in the SQL is refused at its own position."""
    value = option.value
    if name == "epsilon" and not value > 0:
        raise InvalidParameter(f"epsilon must be greater than 0, got {value}", line=option.line,
                               col=option.col, hint="write epsilon = 0.5")
    if name == "delta" and not 0 <= value < 1:
        raise InvalidParameter(f"delta must be at least 0 and below 1, got {value}", line=option.line,
                               col=option.col, hint="write delta = 1e-7")


def apply_contribution_options(query: PrivateQuery, written: dict) -> PrivateQuery:
    """BigQuery's max_rows_contributed / max_groups_contributed / privacy_unit_column options.

    The contribution limits replace the policy's for this query: the rewrite enforces whatever
    limit is used and the sensitivity is derived from it, so any limit is safe. The privacy
    unit is the curator's choice and cannot be changed, only restated."""
    rule = query.rule
    unit = written.get("privacy_unit_column")
    named = "ROW" if query.hidden_unit or rule.unit is None else rule.unit  # a row-level table's unit is each row
    if unit is not None and named.lower() != unit.value.lower():
        raise UnsupportedQuery(
            f"the privacy unit of {query.table} is {named}, not {unit.value}",
            line=unit.line, col=unit.col, hint=f"write privacy_unit_column = {named}, or leave it out")
    changes: dict[str, Any] = {}
    for option, field_name in (("max_rows_contributed", "max_rows_per_unit"),
                               ("max_groups_contributed", "max_groups_per_unit")):
        given = written.get(option)
        if given is None:
            continue
        value = given.value
        if value.denominator != 1 or not 1 <= value <= 10**6:
            raise UnsupportedQuery(f"{option} must be a whole number from 1 to 1000000, got {value}",
                                   line=given.line, col=given.col, hint=f"write {option} = 5")
        held = query.rows_per_unit
        if option == "max_rows_contributed" and held is not None and value > held:
            # The table is read through a copy keeping `held` rows per unit (dpsql.backends.bounding):
            # a larger limit would add noise for rows that are not there.
            kept = f"each row of {query.table} is its own privacy unit" if query.hidden_unit else \
                f"the policy keeps at most {plural(held, 'row')} of each unit of {query.table}"
            joined = f", with at most {plural(held, 'row')} after its joins" if query.hidden_unit and held > 1 else ""
            raise UnsupportedQuery(f"{kept}{joined}; max_rows_contributed can lower that, not raise it",
                                   line=given.line, col=given.col, hint=f"write max_rows_contributed = {held} or less")
        changes[field_name] = int(value)
    return replace(query, rule=replace(rule, **changes)) if changes else query


def privacy_options(policy: Policy, epsilon: Any, delta: Any, noise: str | None,
                    weights: dict | None = None) -> PrivacyOptions:
    """A query's epsilon, delta, noise family and aggregate weights, from the caller's values
    (validated: finite, positive, within the samplers' reach, DESIGN.md invariant 14) or the
    policy's defaults.

    >>> from dpsql.policy.language import load_policy
    >>> options = privacy_options(load_policy("BUDGET EPSILON 1; QUERY EPSILON 0.25;"), None, None, None)
    >>> options.epsilon, options.delta, options.noise
    (Fraction(1, 4), Fraction(0, 1), 'laplace')
    """
    if epsilon is None:
        if policy.query_epsilon is None:
            raise InvalidParameter("no epsilon given and the policy sets no QUERY EPSILON",
                                   **surface_hints("{epsilon}, or add `QUERY EPSILON 0.1;` to the policy",
                                                   epsilon="0.1"))
        epsilon = policy.query_epsilon
    epsilon = exact_parameter(epsilon, "epsilon")
    if epsilon <= 0:
        raise InvalidParameter(f"epsilon must be greater than 0, got {float(epsilon)}",
                               **surface_hints("{epsilon}: a positive epsilon", epsilon="0.1"))
    if epsilon < MIN_EPSILON:  # no query's noise fits the exact samplers below it
        raise InvalidParameter(f"epsilon {_shown(epsilon)} is below {_shown(MIN_EPSILON)}, too small for any "
                               "query: its noise would be beyond what the exact samplers draw",
                               hint="use a larger epsilon, e.g. 0.001 or more")
    delta = policy.query_delta if delta is None else exact_parameter(delta, "delta")
    if not 0 <= delta < 1:
        raise InvalidParameter(f"delta must be at least 0 and below 1, got {float(delta)}",
                               **surface_hints("{delta}: a small delta, or 0", delta="1e-7"))
    if 0 < delta < MIN_DELTA:
        raise InvalidParameter(f"delta {_shown(delta)} is below the smallest positive delta, 1e-1000",
                               **surface_hints("{delta} for pure epsilon-DP, or a delta such as 1e-10",
                                               delta="0"))
    if noise is not None and noise not in NOISE_FAMILIES:
        raise InvalidParameter(f"unknown noise {noise!r}", hint="use 'laplace' or 'gaussian'")
    if noise == "gaussian" and delta == 0:
        raise InvalidParameter("Gaussian noise needs delta > 0", **surface_hints("{delta} as well", delta="1e-7"))
    family = noise or ("gaussian" if policy.noise == "gaussian" and delta > 0 else "laplace")
    options = PrivacyOptions(epsilon=epsilon, delta=delta, noise=family)
    if not weights:
        return options
    if not isinstance(weights, dict):
        raise InvalidParameter("weights must be a dict of aggregate name to weight",
                               hint="pass weights={'n': 2, 'avg(amount)': 1}")
    pairs = tuple((str(k), exact_parameter(v, f"the weight of {k}")) for k, v in weights.items())
    return replace(options, weights=pairs)


def max_keys(policy: Policy, written: dict) -> tuple[int, Any]:
    """The limit on released keys: the policy's MAX RELEASED KEYS, or the query's lower
    ``max_keys`` option (it can lower the curator's limit, not raise it)."""
    limit = policy.max_released_keys
    option = written.get("max_keys")
    if option is None:
        return limit, None
    value = option.value
    if value.denominator != 1 or not 1 <= value <= limit:
        raise UnsupportedQuery(f"max_keys must be a whole number from 1 to the policy's MAX RELEASED KEYS, "
                               f"{limit}, got {value}", line=option.line, col=option.col,
                               hint=f"write max_keys = {min(limit, 1000)}, or leave it out")
    return int(value), option
