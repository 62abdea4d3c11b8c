"""Which policy rules a ledger, and what the ledger accounts for (``dpsql.connect``).

The policy stored with a ledger rules every connection to it (DESIGN.md invariant 18): a
different one given is refused, unless the curator is replacing it (``dpsql init --replace``).
What the ledger accounts for (its private tables and units) is recorded in the ledger and in the
curator's registry of ledgers (``dpsql.budget.registry``), and a second ledger over the same
tables is refused unless opened as a second budget on purpose: before anything is read or charged.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpsql.budget.ledger import Ledger, PolicyChange
from dpsql.budget.registry import Dataset, claim, dataset_identity, release, second_budget_note
from dpsql.errors import PolicyError, SecondBudgetWarning
from dpsql.policy.diff import policy_difference
from dpsql.policy.language import load_policy, policy_to_text
from dpsql.policy.model import Policy


def ruling_policy(ledger: Ledger, stored: str | None, policy: Any, replacing: bool) -> Policy:
    """The policy that rules a connection to ``ledger``: the one ``stored`` with it, if any; a
    different one given is refused, unless the curator is ``replacing`` the stored one."""
    if policy is None:
        if stored is None:
            raise PolicyError("no policy was given and none is stored with this database",
                              hint="pass policy='file.policy', or store one with `dpsql init DB --policy P`",
                              hints={surface: "give --policy FILE, or store one with `dpsql init DB --policy P`"
                                     for surface in ("cli", "shell")})
        return load_policy(stored)
    given = load_policy(policy)
    if stored is None or replacing:
        return given
    difference = policy_difference(load_policy(stored), given)
    if difference is not None:
        raise PolicyError(
            f"the policy given is not the one stored with the ledger at "
            f"{ledger.path or ':memory:'}: {difference}",
            hint="leave the policy out to use the stored one; to change it, the curator runs "
                 "`dpsql init DB --policy P --replace`, which keeps what was spent")
    return given


def store_policy(ledger: Ledger, policy: Policy, replace: bool) -> PolicyChange | None:
    """Keep ``policy`` with ``ledger`` (``Connection.store_policy``): the change recorded, or ``None``
    when the same rules are stored already; a different stored policy is replaced only with ``replace``."""
    stored = ledger.stored_policy()
    difference = None if stored is None else policy_difference(load_policy(stored), policy)
    if stored is not None and difference is None:
        return None  # the same rules, however they were written: nothing to record
    if difference is not None and not replace:
        raise PolicyError(
            f"a different policy is stored with the ledger at "
            f"{ledger.path or ':memory:'}: {difference}",
            hint="to replace it, keeping what was spent, run `dpsql init DB --policy P --replace`")
    return ledger.store_policy(policy_to_text(policy), replacing=stored)


@dataclass(frozen=True)
class Claim:
    """What opening a ledger claimed (``claim_dataset``)."""

    dataset: Dataset
    """What the ledger accounts for: the private tables (and units) of every policy it served."""
    second_budget: str | None
    """Set when the ledger was opened as a second budget on purpose (``separate_budget``): says so."""
    registered: Path | None
    """The ledger file this open registered anew (to forget if the open fails), else ``None``."""


def claim_dataset(ledger: Ledger, policy: Policy, file: Path | None, source: str, separate: bool) -> Claim:
    """Record what ``ledger`` accounts for, in the ledger and the curator's registry, refusing a
    second budget over the same tables (``SecondBudget``) unless ``separate`` (a warning says so)."""
    recorded = ledger.dataset()
    dataset = dataset_identity(policy)
    if recorded is not None:  # what it accounted for before stays accounted for
        dataset = dataset.union(Dataset.from_json(recorded))
    if file is None:  # a ledger in memory is a throwaway budget: it claims nothing
        return Claim(dataset, None, None)
    claimed = claim(file, dataset, source, separate=separate)
    try:
        if recorded != dataset.to_json():
            ledger.record_dataset(dataset.to_json())
        note = second_budget_note(claimed, dataset, file)
        if note is not None:
            warnings.warn(note, SecondBudgetWarning, stacklevel=5)
    except BaseException:
        if claimed.new:  # registered by this open, which failed: forget it
            release(file)
        raise
    return Claim(dataset, note, file if claimed.new else None)
