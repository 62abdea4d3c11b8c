"""The public key domains a grouped query releases: read once per connection, refused when too many.

A query grouped by keys with public domains (``KEYS``, a public table's column) releases one row
per key of the product of those domains, each narrowed by the query's WHERE
(``dpsql.analysis.domains``); the domains are public data, read from the engine once and kept
until ``Connection.refresh``. More keys than the limit (``dpsql.query.options.max_keys``) are
refused before the product is built.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

from dpsql.analysis.domains import domain_parts, key_text, product_text
from dpsql.analysis.plan import PrivateQuery
from dpsql.backends.base import Backend
from dpsql.backends.rewrite import domain_sql
from dpsql.errors import UnsupportedQuery
from dpsql.policy.model import KeyDomain, Policy
from dpsql.query.options import max_keys


class KeyDomains:
    """The public key domains of one connection's queries, read once each (module docstring)."""

    def __init__(self, policy: Policy, engine: Backend, read_keys: Callable[[list[tuple], list], list[tuple]]) -> None:
        self.policy = policy
        self._engine = engine
        self._read_keys = read_keys
        self._read: dict[str, list] = {}
        self._texts: dict[tuple, str] = {}

    def clear(self) -> None:
        """Forget every domain read: the wrapped database changed (``Connection.refresh``)."""
        self._read.clear()
        self._texts.clear()

    def domain(self, query: PrivateQuery, written: dict | None = None) -> list[tuple]:
        """Every released key: the product of the public key domains, each narrowed by the
        query's WHERE (``dpsql.analysis.domains``; public data only). More keys than the limit
        (``dpsql.query.options.max_keys``) are refused before the product is built."""
        if not query.keys:
            return [()]
        # Keys from one public table take the combinations that table holds (a city with its
        # stores), not the product of their separate domains; other keys combine freely.
        parts = []
        for indices in domain_parts(query.keys):
            keys = [query.keys[i] for i in indices]
            domain = self.text(keys, [query.column_type(k.expression.name) for k in keys])
            if domain not in self._read:  # public data: read once per connection
                self._read[domain] = [tuple(row) for row in self._read_keys(self._engine.fetch(domain), keys)]
            parts.append((indices, self._read[domain]))
        self._check_size(query, [(indices, len(values)) for indices, values in parts], written or {})
        if len(parts) == 1 and parts[0][0] == list(range(len(query.keys))):
            return list(parts[0][1])  # one table's keys in query order: its rows are the keys
        released = []
        for combination in itertools.product(*(values for _, values in parts)):
            key = [None] * len(query.keys)
            for (indices, _), values in zip(parts, combination):
                for i, value in zip(indices, values):
                    key[i] = value
            released.append(tuple(key))
        return released

    def text(self, keys: list, types: list[str]) -> str:
        """``domain_sql`` of these keys, kept by what it is made of when no WHERE narrows them
        (each key's domain, form and type): rendering it costs more, about 1.5 ms, than the rest
        of answering a small grouped query from a domain already read."""
        if any(key.narrowed_by or key.narrowing_columns for key in keys):
            return domain_sql(keys, types, dialect=self._engine.dialect)
        shape = (tuple((exact_domain(key.domain), key.form) for key in keys), tuple(types))
        text = self._texts.get(shape)
        if text is None:
            text = self._texts[shape] = domain_sql(keys, types, dialect=self._engine.dialect)
        return text

    def _check_size(self, query: PrivateQuery, parts: list[tuple[list[int], int]], written: dict) -> None:
        """Refuse, before the charge, a public domain of more keys than the limit allows: the
        domain, its size and the limit, and how to narrow it. ``parts``: each domain part's key
        indices and the number of its keys or combinations (``domain_parts``)."""
        limit, option = max_keys(self.policy, written)
        size = math.prod(count for _, count in parts)
        if size <= limit:
            return
        names = product_text(query.keys, parts)
        narrow = " AND ".join(f"{key_text(k)} IN (...)" for k in query.keys)
        message = f"GROUP BY would release {size:,} keys: {names}, beyond the limit of {limit:,} keys"
        hint = f"narrow the keys with WHERE {narrow}, or "
        if option is not None:  # refused at the option, else at the first key (located at the boundary)
            raise UnsupportedQuery(f"{message} (max_keys in the query's OPTIONS)", line=option.line, col=option.col,
                                   hint=hint + "raise max_keys")
        raise UnsupportedQuery(f"{message} (the policy's MAX RELEASED KEYS)", node=query.keys[0].expression,
                               hint=hint + "ask the curator to raise MAX RELEASED KEYS in the policy")


def exact_domain(domain: KeyDomain) -> tuple:
    """A key domain as a dictionary key that tells apart every domain that reads differently:
    literal keys by type and text, since Python takes ``1``, ``1.0`` and ``True`` for one key
    but ``TRY_CAST`` of each to VARCHAR gives three.

    >>> exact_domain(KeyDomain(values=(1,))) == exact_domain(KeyDomain(values=(True,)))
    False
    """
    values = None if domain.values is None else tuple((type(v).__qualname__, repr(v)) for v in domain.values)
    return domain.table, domain.column, values, domain.implied_by, domain.joined
