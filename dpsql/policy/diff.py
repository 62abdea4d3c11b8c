"""What differs between two policies, said in one line.

Local mode is the curator's (DESIGN.md invariant 18): the policy stored with a database's
ledger rules it, and a connection that names a different one is refused. The refusal says
what differs so the curator can tell a stale file from a deliberate change; both policies
are compared in their canonical text (``policy_to_text``), so spacing, comments, keyword case
and number spelling never count as a difference.

>>> from dpsql.policy.language import parse_policy
>>> stored = parse_policy("BUDGET EPSILON 10; PUBLIC TABLE stores;")
>>> policy_difference(stored, parse_policy("budget epsilon 10.0; -- same\\npublic table stores;")) is None
True
>>> policy_difference(stored, parse_policy("BUDGET EPSILON 100; PUBLIC TABLE stores;"))
'it has `BUDGET EPSILON 100;` where the stored policy has `BUDGET EPSILON 10;`'
"""

from __future__ import annotations

import difflib

from dpsql.policy.language import policy_to_text
from dpsql.policy.model import Policy


def policy_difference(stored: Policy, given: Policy) -> str | None:
    """The first difference of ``given`` from ``stored`` (and how many more), or ``None``."""
    old, new = _lines(stored), _lines(given)
    changes = [op for op in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes()
               if op[0] != "equal"]
    if not changes:
        return None
    tag, old_start, _, new_start, _ = changes[0]
    if tag == "replace":
        text = f"it has `{new[new_start]}` where the stored policy has `{old[old_start]}`"
    elif tag == "insert":
        text = f"it adds `{new[new_start]}`, which the stored policy does not have"
    else:
        text = f"it lacks the stored policy's `{old[old_start]}`"
    more = sum(max(o2 - o1, n2 - n1) for _, o1, o2, n1, n2 in changes) - 1
    return text + (f" (and {more} more line{'s' if more != 1 else ''} differ)" if more > 0 else "")


def _lines(policy: Policy) -> list[str]:
    return [line.strip() for line in policy_to_text(policy).splitlines() if line.strip()]
