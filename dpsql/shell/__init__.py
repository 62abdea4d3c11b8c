"""dpsql's interactive shell: ``dpsql shell DB``.

The pieces, each usable without a terminal:

- ``complete``: completion as a pure function from text to suggestions;
- ``commands``: the dot-command registry (``.help`` is generated from it);
- ``session``: what one input does (a dot command or SQL in, text out);
- ``render`` and ``chart``: tables with ±, csv/json/markdown, bar charts, errors with a caret;
- ``budget``: the cost under each answer, the budget table and the toolbar's meter;
- ``app``: the prompt_toolkit loop (keys, toolbar with the budget meter, history, pager).
"""

from dpsql.shell.app import run_shell
from dpsql.shell.session import handle_input
from dpsql.shell.state import ShellState, new_state

__all__ = ["run_shell", "handle_input", "ShellState", "new_state"]
