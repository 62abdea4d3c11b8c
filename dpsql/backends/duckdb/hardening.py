"""The settings that wall in every DuckDB database dpsql opens itself (DESIGN.md invariant 7).

No external access (no files, no network, no COPY, no extension INSTALL or LOAD), no replacement
scans of Python variables, no extension autoloading, no persistent secrets, a memory limit, and
the configuration locked (``dpsql.backends.duckdb.open_hardened`` applies them).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from dpsql.budget.private_files import DIRECTORY_MODE, refuse_exposed
from dpsql.errors import InvalidParameter

HARDENED_CONFIG = {
    "enable_external_access": False,
    "python_enable_replacements": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "allow_persistent_secrets": False,
}
"""DuckDB settings of every database dpsql opens itself (``lock_configuration`` is set last).
A curator who passes an open connection should open it with these too (THREAT_MODEL.md)."""


def default_memory_limit() -> str:
    """Half the machine's physical memory, as a DuckDB size: a runaway query fails with an
    out-of-memory error (a generic charged failure) instead of the process being killed.

    >>> default_memory_limit().endswith("MB")
    True
    """
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        total = 8 * 2**30
    return f"{max(total // 2 // 2**20, 256)}MB"


def hardened_config(memory_limit: str | None = None) -> dict[str, Any]:
    """``HARDENED_CONFIG`` with a memory limit, locked: the config of a database dpsql opens.

    >>> config = hardened_config("1GB")
    >>> config["enable_external_access"], config["memory_limit"], config["lock_configuration"]
    (False, '1GB', True)
    """
    if memory_limit is None:
        memory_limit = default_memory_limit()
    if not isinstance(memory_limit, str) or not memory_limit.strip():
        raise InvalidParameter(f"memory_limit must be a DuckDB size such as '4GB', got {memory_limit!r}",
                               hint="pass memory_limit='4GB', or leave it out")
    return {**HARDENED_CONFIG, "memory_limit": memory_limit, "lock_configuration": True}


SPILL_VARIABLE = "DPSQL_TEMP_DIRECTORY"
"""Environment variable naming the directory DuckDB spills to (``spill_directory``)."""


def spill_directory() -> tuple[str, bool]:
    """Where DuckDB writes what does not fit under its memory limit (a copy's build sorts, large
    aggregates), and whether dpsql made it (then it is removed when the engine closes, or the
    process ends).

    Spilled blocks are private rows, so the directory is the curator's alone: ``$DPSQL_TEMP_DIRECTORY``
    when set (refused when others can reach it; DuckDB makes files inside), else a new 0700 directory
    in the system's temporary directory (``$TMPDIR``; where that is a RAM disk, point either at a
    disk), never DuckDB's default ``<file>.tmp`` or ``.tmp``, made under the umask beside the data.

    >>> import stat
    >>> path, made = spill_directory()
    >>> made, stat.S_IMODE(os.stat(path).st_mode) == 0o700
    (True, True)
    >>> os.rmdir(path)
    """
    given = os.environ.get(SPILL_VARIABLE)
    if given:
        Path(given).mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
        refuse_exposed(given, "the temporary directory", directory=True)
        return given, False
    return tempfile.mkdtemp(prefix="dpsql-spill-"), True
