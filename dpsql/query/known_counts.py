"""Counts already released to this analyst, at which a ratio's ± can be told before the charge.

An AVG's (VARIANCE's, STDDEV's) ± shrinks as the count n of values in a group grows, and n is
private until released (``dpsql.query.prediction``). When the analyst was already given a noisy
count of exactly those values — an earlier answer of theirs, from the ledger, of ``COUNT(x)``
over the same relation, WHERE, GROUP BY keys and contribution limits — the prediction can be
stated there for free: reading one's own released values is post-processing. The smallest count
that answer released is used (its group's ± is the widest), noise and all: it estimates n, it
does not bound it, and EXPLAIN says which answer it came from.

The look-up must stay cheap whatever the ledger holds (it runs on free requests): each answer
carries, from its release, a public descriptor of its plain counts (``counted``: a digest of
what each counts, in the normal form the repeat key uses, and the output column holding it), so
finding one is a substring search of the stored texts and a read of the one answer that matches;
no earlier query is prepared again. Answers stored before descriptors were kept are not used.

An answer whose rows were filtered or cut (HAVING, LIMIT, OFFSET), or read from a sample, may
lack the smallest group or count other rows, and gets no descriptor. Two-argument ratios
(COVAR_*) count pairs, which no COUNT(x) states: they need ``expected_rows``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from sqlglot import exp

from dpsql.analysis.aggregates.registry import family_of
from dpsql.analysis.plan import Plan, PrivateQuery
from dpsql.answer.result import decode_answer
from dpsql.sql.normalise import normalise

RECENT = 200
"""How many of the analyst's latest answers are searched (newest first)."""
READ = 4
"""How many matching answers are read at most per look-up (one per ratio suffices unless an answer
cannot be read back)."""


@dataclass(frozen=True)
class KnownCount:
    """The smallest count of a ratio's values that an earlier answer released."""

    count: int
    """The released (noisy) count."""
    key: tuple
    """The group it was released for (``()`` ungrouped)."""
    entry: int
    """Which of the analyst's own answers it is, numbered from 1 among theirs as ``SHOW ledger``
    numbers them (the ledger's global ids would tell how often others asked)."""
    sql: str
    """That answer's normalised SQL."""


def counted_descriptor(query: PrivateQuery) -> dict | None:
    """The public descriptor of ``query``'s plain ``COUNT(x)`` outputs, kept with its stored
    answer: ``{"of": {digest: column, ...}, "keys": [key columns]}``; None when it has none, or
    its rows are cut or its keys not all shown. From the query's text alone: no data."""
    keys = _key_columns(query)
    if keys is None or any(query.post.args.get(part) for part in ("where", "limit", "offset")):
        return None
    counts = [(counted_digest(query, a.argument), column) for a in query.aggregates
              if a.function == "count" and a.argument is not None
              for column in [_output_column(query, a.name)] if column is not None]
    return {"of": dict(counts), "keys": keys} if counts else None


def with_counted(answer: str, descriptor: dict | None) -> str:
    """A stored answer's JSON with its query's ``counted_descriptor`` added, if it has one."""
    if descriptor is None:
        return answer
    record = json.loads(answer)
    record["counted"] = descriptor
    return json.dumps(record, separators=(",", ":"))


def counted_digest(query: PrivateQuery, argument: exp.Expression) -> str:
    """What a count of ``argument`` in ``query`` counts: its relation, contribution limits, WHERE,
    keys and argument, each in normal form (``60 < age`` and ``age > 60`` are one), hashed."""
    def text(node: exp.Expression | None) -> str | None:
        return None if node is None else normalise(node).sql(dialect="duckdb")

    rule = query.rule
    what = [query.table, rule.unit, rule.max_rows_per_unit, rule.max_groups_per_unit, text(query.source),
            text(query.where), [text(k.expression) for k in query.keys], text(argument)]
    return hashlib.sha256(json.dumps(what, separators=(",", ":")).encode("utf-8")).hexdigest()


def known_counts(plan: Plan, released: Sequence[tuple[int, str, str | None]]) -> dict[str, KnownCount]:
    """Per one-argument ratio aggregate of ``plan`` (a0, ...), the ``KnownCount`` of the newest of
    ``released`` — the analyst's own (entry id, normalised SQL, stored answer), oldest first — that
    released a count of its values. Reads at most ``READ`` answers; prepares nothing."""
    query = plan.query
    wanted = {a.name: counted_digest(query, a.argument) for a, release in zip(query.aggregates, plan.aggregates)
              if a.argument is not None and family_of(release).counted and family_of(release).arity == 1}
    found: dict[str, KnownCount] = {}
    reads = 0
    numbered = [(number, sql, answer) for number, (_, sql, answer) in enumerate(released, start=1)]
    for entry, sql, answer in reversed(numbered[-RECENT:]):
        if len(found) == len(wanted) or reads == READ:
            break
        if answer is None:
            continue
        # A digest is an object key only in the descriptor: the rows' JSON has no keys but tags ("$date").
        matching = {name: digest for name, digest in wanted.items() if name not in found and f'"{digest}":' in answer}
        if not matching:
            continue
        reads += 1
        smallest = _smallest_counts(answer, set(matching.values()))
        for name, digest in matching.items():
            if digest in smallest:
                count, key = smallest[digest]
                found[name] = KnownCount(count, key, entry, sql)
    return found


def _smallest_counts(answer: str, digests: set[str]) -> dict[str, tuple[int, tuple]]:
    """Per digest of ``digests`` the stored answer's descriptor names, the smallest count released
    in its column and that row's keys."""
    try:
        descriptor = json.loads(answer)["counted"]
        columns = {str(digest): int(column) for digest, column in descriptor["of"].items()}
        keys = [int(k) for k in descriptor["keys"]]
    except (ValueError, TypeError, KeyError, AttributeError):
        return {}
    decoded = decode_answer(answer)
    if decoded is None:
        return {}
    _, rows, _ = decoded
    smallest = {}
    for digest in digests & columns.keys():
        column = columns[digest]
        counts = [(int(row[column]), tuple(row[k] for k in keys)) for row in rows
                  if len(row) > max([column, *keys]) and isinstance(row[column], int)
                  and not isinstance(row[column], bool)]
        if counts:
            smallest[digest] = min(counts, key=lambda pair: pair[0])
    return smallest


def _key_columns(query: PrivateQuery) -> list[int] | None:
    """The output positions of the keys (g0, ...), in key order; None when one is not shown."""
    shown = {item.unalias().name: i for i, item in enumerate(query.post.expressions)
             if isinstance(item.unalias(), exp.Column)}
    positions = [shown.get(key.name) for key in query.keys]
    return None if any(p is None for p in positions) else [p for p in positions if p is not None]


def _output_column(query: PrivateQuery, name: str) -> int | None:
    """The output position of aggregate ``name`` shown as it is (no expression around it), or None."""
    return next((i for i, item in enumerate(query.post.expressions)
                 if isinstance(item.unalias(), exp.Column) and item.unalias().name == name), None)
