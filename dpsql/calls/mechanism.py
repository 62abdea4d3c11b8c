"""What a mechanism called from SQL is: the ``Call`` an analyst wrote, and the ``Mechanism`` that
answers it (``dpsql.calls.registry`` maps each name to its mechanism and reads a statement into a call).

A mechanism's module defines its ``MECHANISM`` with this class alone, and the registry imports
the module: imports point one way, from the registry down to the mechanisms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Call", "Mechanism"]


@dataclass(frozen=True)
class Call:
    """A mechanism's call as the analyst wrote it."""

    name: str
    """The mechanism, lower-cased."""
    queries: list[str]
    """The query texts, in order."""
    options: dict[str, Any] = field(default_factory=dict)
    """Option name (lower-cased) -> value: Fraction or int for numbers, str, bool or None."""


@dataclass(frozen=True)
class Mechanism:
    """What answers (and explains) a call of one name."""

    answer: Callable[[Any, list[str], dict[str, Any]], Any]
    """``answer(connection, queries, options)`` -> ``DPResult``."""
    explain: Callable[[Any, list[str], dict[str, Any]], str] | None = None
    """``explain(connection, queries, options)`` -> text; reads no data."""
    options: tuple[str, ...] = ()
    """The option names it takes (any other is refused, with this list)."""
