"""The curator's secret files: made owner-only whatever the umask, refused when anyone else
could read or change them (invariant 21).

The ledger (the salt, the policy, every analyst's SQL and stored answer) and SQLite's files
beside it, the users file (SCRAM verifiers) and its decoy key, and the persisted copies
directory (private rows) all pass through ``refuse_exposed`` before anything is read from them:
a file another user owns, or one whose group or other bits are set, is refused with the
``chmod`` that fixes it. Refusing rather than fixing: a loose file may already have been read,
or written, by someone else, which only the curator can judge.

A new file is created with ``create_owner_only``: ``O_CREAT | O_EXCL`` with mode 0600 and then
exactly 0600, never a moment wider, and without touching the process umask (other threads
create files meanwhile). SQLite gives the ``-wal``, ``-shm`` and ``-journal`` files it makes
later the main file's mode (its unix VFS copies it and ``fchmod``s past the umask), so a ledger
created 0600 keeps its side files 0600 too (``tests/test_secret_files.py`` checks it).

>>> import tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "x.ledger")
>>> create_owner_only(path), oct(stat.S_IMODE(os.stat(path).st_mode)), refuse_exposed(path, "the ledger")
(True, '0o600', True)
>>> os.chmod(path, 0o644)
>>> refuse_exposed(path, "the ledger")  # doctest: +ELLIPSIS
Traceback (most recent call last):
dpsql.errors.InsecureFile: the ledger ...x.ledger has mode 0644: other users can read it; ... `chmod 600 ...x.ledger`.
"""

from __future__ import annotations

import os
import shlex
import stat

from dpsql.errors import InsecureFile

FILE_MODE = 0o600
"""The mode of every secret file: its owner reads and writes, nobody else anything."""
DIRECTORY_MODE = 0o700
"""The mode of a secret directory (the persisted copies)."""
_OTHERS = 0o077
"""The group and other bits: any of them set lets another user in."""


def create_owner_only(path: str | os.PathLike) -> bool:
    """Create an empty file at ``path`` with mode exactly 0600, unless something is there
    already (``False``: check it with ``refuse_exposed``); ``True`` when created."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                             FILE_MODE)  # the umask can only take bits away: never wider than 0600
    except FileExistsError:
        return False
    try:
        os.fchmod(descriptor, FILE_MODE)  # a umask like 0o277 took bits the owner needs
    finally:
        os.close(descriptor)
    return True


def refuse_exposed(path: str | os.PathLike, what: str, *, directory: bool = False) -> bool:
    """Raise ``InsecureFile`` when another user owns ``path`` or its mode lets anyone but its
    owner in; ``False`` when nothing is there, ``True`` when it is the curator's alone.

    ``what`` names it in the message ("the ledger"); ``directory``: the fix is ``chmod 700``.
    Reads only the file's status (links followed), never its content."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return False
    mode, owner = stat.S_IMODE(status.st_mode), status.st_uid
    wanted = DIRECTORY_MODE if directory else FILE_MODE
    fix = f"chmod {wanted:o} {shlex.quote(os.fspath(path))}"
    if owner != os.geteuid():
        raise InsecureFile(
            f"{what} {os.fspath(path)} belongs to another user (uid {owner}); dpsql will not use it",
            hint=f"run dpsql as its owner, or have root make it yours alone: "
                 f"`chown {os.geteuid()} {shlex.quote(os.fspath(path))} && {fix}`")
    if mode & _OTHERS:
        raise InsecureFile(
            f"{what} {os.fspath(path)} has mode {mode:04o}: other users can {_reach(mode, directory)} it; "
            "dpsql will not use it",
            hint=f"make it yours alone: `{fix}`")
    return True


def _reach(mode: int, directory: bool) -> str:
    """What the group and other bits of ``mode`` let other users do.

    >>> _reach(0o644, False), _reach(0o666, False), _reach(0o711, True)
    ('read', 'read and change', 'enter')
    """
    verbs = [verb for bits, verb in ((0o044, "list" if directory else "read"),
                                     (0o022, "change"),
                                     (0o011, "enter" if directory else "run"))
             if mode & bits]
    return " and ".join(verbs)
