"""Empirical privacy auditing: Clopper-Pearson lower bounds on the privacy loss of events.

For a mechanism M claimed (epsilon, delta)-DP and neighbours D, D', every event S satisfies
P[M(D) in S] <= e^epsilon P[M(D') in S] + delta. From n releases on each side, with a and b
of them in S, Clopper-Pearson gives p_low <= P[M(D) in S] and q_high >= P[M(D') in S], each
failing with probability at most ``ALPHA``; then ln((p_low - delta) / q_high) is a lower
bound on the privacy loss that the claim must cover. ``loss_lower_bound`` takes the largest
such bound over a family of events fixed before sampling, in both directions; with m events
it is wrong with probability at most 4·m·ALPHA, so a correct mechanism "fails" an audit (bound
above its epsilon) with probability below 1e-7 for the families used here (m <= 2,050).

Why it catches bugs: the events are thresholds on the released value, and for Laplace-type
noise the threshold event at the neighbour's exact value has loss exactly epsilon; a scale off
by two doubles it, a missing contribution bound multiplies it.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
from scipy import stats

ALPHA = 1e-11
"""Failure probability of each one-sided Clopper-Pearson bound."""


def cp_lower(successes: int, trials: int, alpha: float = ALPHA) -> float:
    """Clopper-Pearson lower bound: P[p < bound] <= alpha.

    >>> cp_lower(0, 100), round(cp_lower(50, 100, alpha=0.025), 3)
    (0.0, 0.398)
    """
    if successes <= 0:
        return 0.0
    return float(stats.beta.ppf(alpha, successes, trials - successes + 1))


def cp_upper(successes: int, trials: int, alpha: float = ALPHA) -> float:
    """Clopper-Pearson upper bound: P[p > bound] <= alpha.

    >>> cp_upper(100, 100), round(cp_upper(50, 100, alpha=0.025), 3)
    (1.0, 0.602)
    """
    if successes >= trials:
        return 1.0
    return float(stats.beta.ppf(1 - alpha, successes + 1, trials - successes))


def loss_lower_bound(first: np.ndarray, second: np.ndarray, events: Sequence[Callable[[np.ndarray], np.ndarray]],
                     delta: float = 0.0) -> float:
    """The largest lower confidence bound on ln((P[M(D) in S] - delta) / P[M(D') in S]) over the
    events S and both orders of (D, D'); 0 when no event gives a positive bound.

    >>> rng = np.random.default_rng(0)
    >>> same = loss_lower_bound(rng.normal(size=5000), rng.normal(size=5000), [lambda x: x > 0])
    >>> same
    0.0
    """
    best = 0.0
    for event in events:
        in_first, in_second = int(np.count_nonzero(event(first))), int(np.count_nonzero(event(second)))
        for (a, n), (b, m) in (((in_first, len(first)), (in_second, len(second))),
                               ((in_second, len(second)), (in_first, len(first)))):
            low = cp_lower(a, n) - delta
            high = cp_upper(b, m)
            if low > 0:
                best = max(best, math.log(low / high))
    return best


def thresholds(values: Sequence[float], count: int = 24) -> list[Callable[[np.ndarray], np.ndarray]]:
    """Events {x >= t} and {x <= t} for ``count`` values of t spread over [min, max] of
    ``values`` (which must not come from the samples the events are tested on)."""
    low, high = min(values), max(values)
    events = []
    for t in np.linspace(low, high, count):
        events.append(lambda x, t=t: x >= t)
        events.append(lambda x, t=t: x <= t)
    return events


class ReleaseCapture:
    """Records the arguments of every ``release_measures`` call a connection makes: the plan,
    the public domain, the exact bounded rows and the histograms (a monkeypatch)."""

    def __init__(self, monkeypatch):
        import dpsql.query.answering

        self.calls: list[dict] = []
        release = dpsql.query.answering.release_measures

        def capture(plan, domain, exact, source=None, histograms=None):
            self.calls.append({"plan": plan, "domain": domain, "exact": [tuple(r) for r in exact],
                               "histograms": {k: [tuple(r) for r in v] for k, v in (histograms or {}).items()}})
            return release(plan, domain, exact, source, histograms)

        monkeypatch.setattr(dpsql.query.answering, "release_measures", capture)
