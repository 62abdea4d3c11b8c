"""What a synthesizer releases: one synthetic table and the record of what was measured to make it.

The synthesizer (``db.synthesize``, AIM or MST over the bounded copy) builds this after its one
charge; the store keeps it for the analyst who paid, who then queries it at no cost. Everything
in it is a DP release or public (the policy's domains and bounds, the analyst's own options), so
it may be shown to its owner in full.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Measured", "SyntheticRelease"]


@dataclass(frozen=True)
class Measured:
    """One noisy marginal the synthesizer measured."""

    columns: tuple[str, ...]
    """The marginal's columns, in the synthetic table's names."""
    rho: float
    """The zCDP ρ spent on it (its Gaussian noise has σ = Δ₂ / √(2ρ))."""
    sigma: float
    """The standard deviation of the Gaussian noise added to each of its cells."""
    selection_rho: float = 0.0
    """The zCDP ρ spent choosing it (AIM's or MST's exponential mechanism, ε²/8), 0 when it was
    measured without a choice: the release's ``rho`` is the sum of every entry's ``rho`` and
    ``selection_rho`` (the row count is the entry with no columns)."""


@dataclass(frozen=True)
class SyntheticRelease:
    """A synthetic table and how it was made."""

    name: str
    """The name its owner queries it by (``FROM name``)."""
    source: str
    """The private table it imitates."""
    method: str
    """``"aim"`` or ``"mst"``."""
    table: Any
    """The synthetic rows (a pandas DataFrame), columns in the order asked for."""
    rows: int
    """Its row count: a noisy count of the source's rows (or the analyst's ``rows``)."""
    epsilon: float
    delta: float
    rho: float
    """What was charged: the (ε, δ) the analyst asked for, and the zCDP ρ it converts to."""
    measured: tuple[Measured, ...]
    """Every marginal measured, in order (MST's one-way and tree marginals, AIM's rounds)."""
    bins: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Column -> the labels of its cells: KEYS values, or a numeric column's bins (``[lo, hi)``),
    each chosen from the policy alone."""
    analyst: str | None = None
    """Who paid for it (None: the local curator's connection)."""
    created: str = ""
    """When it was released (ISO 8601, UTC)."""
    error_estimates: dict[tuple[str, ...], float] = field(default_factory=dict)
    """Marginal columns -> AIM's estimate of that marginal's error, where it has one."""
