"""What privacy costs: the cost line under each answer, the budget table and the meter.

Budgets are read through their public attributes only (``total``, ``spent``, ``remaining``,
each with ``epsilon`` and ``delta``); a zCDP ``rho`` is shown when an accountant provides one.
Numbers here are for reading: the engine does the exact arithmetic.
"""

from __future__ import annotations

from typing import Any

from dpsql.shell.render import Answer, number, to_text


def cost_line(answer: Answer, budget: Any) -> str:
    """What the query cost and what remains, e.g. ``cost ε 0.1 · remaining ε 2.9 of 3``."""
    if answer.exact:
        cost = f"exact: {'your synthetic' if answer.synthetic else 'public'} tables only, no cost"
    elif answer.repeat:
        cost = "an earlier answer repeated, no cost"
    else:
        cost = f"cost ε {number(answer.cost_epsilon)}"
        if answer.cost_delta or budget.total.delta:
            cost += f", δ {number(answer.cost_delta)}"
    text = f"{cost} · remaining {remaining_text(budget)}"
    mine = analyst_budget(budget)
    if mine is not None:
        text += f" · yours {remaining_text(mine)}"
    return text + ("" if answer.exact or not answer.half_widths else " · ± and [low, high] are 95% intervals")


def remaining_text(budget: Any) -> str:
    """``ε 2.9 of 3, δ 1e-06 of 1e-06`` (δ only when the policy allows any; ρ when tracked)."""
    text = f"ε {number(budget.remaining.epsilon)} of {number(budget.total.epsilon)}"
    if budget.total.delta:
        text += f", δ {number(budget.remaining.delta)} of {number(budget.total.delta)}"
    rho = rho_of(budget)
    if rho is not None:
        text += f", ρ {number(rho[2])} of {number(rho[0])}"
    return text


def rho_of(budget: Any) -> tuple[Any, Any, Any] | None:
    """(total, spent, remaining) zCDP ρ when the budget tracks one (its total has a ρ), else None.

    Read defensively: which accountants track ρ is the engine's business.
    """
    total = getattr(budget.total, "rho", None)
    if total is None:
        return None
    spent = getattr(budget.spent, "rho", None) or 0
    remaining = getattr(budget.remaining, "rho", None)
    return total, spent, total - spent if remaining is None else remaining


def analyst_budget(budget: Any) -> Any | None:
    """The connected analyst's own budget, when the policy gives analysts one."""
    return getattr(budget, "analyst", None)


def left_fraction(budget: Any) -> float:
    """The share of the epsilon budget that remains, in [0, 1]."""
    total = float(budget.total.epsilon)
    return 0.0 if total <= 0 else min(1.0, max(0.0, float(budget.remaining.epsilon) / total))


def budget_meter(budget: Any, bar_width: int = 20) -> str:
    """A one-line budget gauge for the toolbar.

    >>> from types import SimpleNamespace as B
    >>> budget = B(total=B(epsilon=3, delta=0), remaining=B(epsilon=2.25, delta=0))
    >>> budget_meter(budget, 8)
    'budget ε ██████░░ 2.25 of 3 left'
    """
    filled = round(left_fraction(budget) * bar_width)
    bar = "█" * filled + "░" * (bar_width - filled)
    parts = [f"budget ε {bar} {number(budget.remaining.epsilon)} of {number(budget.total.epsilon)} left"]
    if budget.total.delta:
        parts.append(f"δ {number(budget.remaining.delta)} of {number(budget.total.delta)} left")
    rho = rho_of(budget)
    if rho is not None:
        parts.append(f"ρ {number(rho[2])} of {number(rho[0])} left")
    return " · ".join(parts)


def render_budget(budget: Any, *, width: int = 100, color: bool = False) -> str:
    """Total, spent and remaining of each tracked quantity, and the meter."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False, show_edge=False)
    table.add_column("", justify="left")
    for name in ("total", "spent", "remaining"):
        table.add_column(name, justify="right")
    table.add_row("epsilon", *(number(getattr(budget, p).epsilon) for p in ("total", "spent", "remaining")))
    table.add_row("delta", *(number(getattr(budget, p).delta) for p in ("total", "spent", "remaining")))
    rho = rho_of(budget)
    if rho is not None:
        table.add_row("rho (zCDP)", *(number(r) for r in rho))
    text = to_text(table, width=width, color=color) + budget_meter(budget) + "\n"
    accounting = getattr(budget, "accounting", "basic")
    if accounting != "basic":
        text += (f"{accounting} accounting: composition is sublinear, so remaining is the most "
                 "one more query may spend\n")
    mine = analyst_budget(budget)
    if mine is not None:
        owner = getattr(mine, "owner", None) or "you"
        text += f"\nyour own budget ({owner}):\n" + render_budget(mine, width=width, color=color)
    return text
