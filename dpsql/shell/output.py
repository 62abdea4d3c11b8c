"""Where ``.output`` may write: never the curator's files, never a file it did not create.

``.output FILE`` writes analyst-chosen text to a path the analyst types. Left unchecked it
truncated ``<db>.ledger``, and the next session had the whole budget back and a fresh salt.
So the shell refuses (DESIGN.md invariant 18):

- the curator's files (``Connection.curator_files``): the database and its ``.wal``, the
  ledger and SQLite's ``-wal``, ``-shm`` and ``-journal`` beside it, the policy file the
  session was opened with — through any symbolic link or ``..`` that leads to them;
- under the directories holding them, any name ending like them (``*.ledger``,
  ``*.ledger-wal``, ``*.policy``, ``*.duckdb``, ...), so another database's ledger kept
  beside this one, or in a folder below, is safe too;
- any existing file that this session did not create: a file is created here with
  ``O_CREAT | O_EXCL`` and remembered by its device and inode, and only those are written
  again. Hard links, symbolic links and files swapped in later are existing files, refused.

Each rule is a pure function of paths, so it is tested without a shell.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dpsql.errors import DPError

SIDE_ENDINGS = ("-wal", "-shm", "-journal", ".wal")
"""What SQLite and DuckDB append to a file's name for their logs and journals."""

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
_APPEND = os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)


@dataclass(frozen=True)
class OutputRules:
    """What ``.output`` may not write, derived once from the connection."""

    protected: frozenset[Path]
    """The curator's files, resolved."""
    directories: frozenset[Path]
    """Directories holding them: names ending like them are refused anywhere under these."""
    endings: tuple[str, ...]
    """Lower-case name endings refused in those directories (``.ledger``, ``.policy``, ...)."""


def output_rules(curator_files) -> OutputRules:
    """The rules for a session whose curator files are ``curator_files``.

    >>> rules = output_rules([Path("/data/shop.duckdb"), Path("/data/shop.duckdb.ledger")])
    >>> sorted(rules.endings)[:4], sorted(map(str, rules.directories))
    (['.duckdb', '.duckdb-journal', '.duckdb-shm', '.duckdb-wal'], ['/data'])
    """
    protected = frozenset(Path(os.path.realpath(path)) for path in curator_files)
    endings = set()
    for path in protected:
        suffix = path.suffix.lower()
        if suffix and not suffix.endswith(SIDE_ENDINGS):
            endings.update([suffix] + [suffix + side for side in SIDE_ENDINGS])
    if any(path.suffix.lower() == ".ledger" for path in protected):
        endings.add(".policy")  # the policy is stored in the ledger, and often kept beside it
    return OutputRules(protected, frozenset(path.parent for path in protected), tuple(sorted(endings)))


def refuse_output(path: Path, rules: OutputRules, created: frozenset[tuple[int, int]]) -> Path:
    """``path`` resolved, if ``.output`` may write it; else a ``DPError`` saying why and what
    to write instead. ``created``: (device, inode) of files this session created."""
    target = Path(os.path.realpath(path.expanduser()))
    hint = "write to a new file elsewhere, e.g. .output answers.csv in your own directory"
    if target in rules.protected:
        raise DPError(f"{path} is one of the curator's files (database, ledger or policy); "
                      ".output never writes it", hint=hint)
    under = next((d for d in sorted(rules.directories) if d in target.parents), None)
    if under is not None and target.name.lower().endswith(rules.endings):
        raise DPError(f"{path} is named like a database, ledger or policy file under {under}; "
                      ".output never writes such files there", hint=hint)
    existing = _identity(path.expanduser())
    if existing is not None and existing not in created:
        raise DPError(f"{path} already exists and was not created by this session; "
                      ".output does not overwrite files",
                      hint="choose a new file name, or remove the file yourself first")
    return target


def create_output(path: Path, created: frozenset[tuple[int, int]]) -> tuple[int, int]:
    """Create ``path`` afresh (or empty a file this session created) and return its identity.
    Raises ``OSError`` when it cannot be written, ``FileExistsError`` if it appeared meanwhile."""
    if _identity(path) in created:
        descriptor = os.open(path, _APPEND | os.O_TRUNC)
    else:
        descriptor = os.open(path, _CREATE, 0o644)
    try:
        status = os.fstat(descriptor)
    finally:
        os.close(descriptor)
    return status.st_dev, status.st_ino


def append_output(path: Path, text: str, identity: tuple[int, int]) -> None:
    """Append ``text`` to the file ``.output`` created, if it is still that file."""
    descriptor = os.open(path, _APPEND)
    try:
        status = os.fstat(descriptor)
        if (status.st_dev, status.st_ino) != identity:
            raise DPError(f"{path} was replaced by another file after .output created it; "
                          "nothing was written to it", hint="choose a new file with .output FILE")
        with os.fdopen(descriptor, "a", encoding="utf-8", closefd=False) as file:
            file.write(text)
    finally:
        os.close(descriptor)


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of what ``path`` names itself (a link is not followed), or ``None``."""
    try:
        status = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return status.st_dev, status.st_ino
