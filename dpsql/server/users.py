"""The analysts a server lets in: a users file of SCRAM-SHA-256 verifiers, never passwords.

Each line is ``name SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`` (base64
fields), the format PostgreSQL keeps in ``pg_authid``: from a verifier the server can check
a SCRAM proof (RFC 5802, RFC 7677) but cannot recover the password nor log in as the user.
The file is the curator's: written atomically, readable by its owner only, and refused
(``dpsql.budget.private_files``) when another user owns it or could read or change it.

>>> verifier = make_verifier("s3cret", salt=b"0123456789abcdef", iterations=4096)
>>> parse_verifier(verifier.text()) == verifier
True
>>> verifier.matches("s3cret"), verifier.matches("wrong")
(True, False)
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
import tempfile
import threading
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from dpsql.budget.private_files import FILE_MODE, refuse_exposed
from dpsql.errors import DPError

MECHANISM = "SCRAM-SHA-256"
ITERATIONS = 4096
"""PostgreSQL's default (``scram_iterations``); libpq and every driver accept any count."""
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.@-]{0,62}")
"""An analyst name: what a client sends as its user, and what the ledger records."""


@dataclass(frozen=True)
class Verifier:
    """What the server keeps of one password (RFC 5802 section 3)."""

    iterations: int
    """PBKDF2 rounds the client repeats to derive its key."""
    salt: bytes
    """Random per user, so equal passwords give unrelated verifiers."""
    stored_key: bytes
    """H(ClientKey): checks the client's proof without being able to make one."""
    server_key: bytes
    """Signs the server's final message, so the client knows the server held the verifier."""

    def text(self) -> str:
        """The verifier in PostgreSQL's ``pg_authid`` form."""
        b64 = _b64
        return (f"{MECHANISM}${self.iterations}:{b64(self.salt)}$"
                f"{b64(self.stored_key)}:{b64(self.server_key)}")

    def matches(self, password: str) -> bool:
        """True when ``password`` is the one this verifier was made from (for tests and tools)."""
        again = make_verifier(password, salt=self.salt, iterations=self.iterations)
        return hmac.compare_digest(again.stored_key, self.stored_key)


def make_verifier(password: str, *, salt: bytes | None = None, iterations: int = ITERATIONS) -> Verifier:
    """A verifier for ``password`` with a fresh random salt (or the one given)."""
    salt = os.urandom(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", prepare_password(password), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    return Verifier(iterations, salt, hashlib.sha256(client_key).digest(), server_key)


def prepare_password(password: str) -> bytes:
    """The password's bytes as clients hash them: SASLprep (RFC 4013) is NFKC normalisation
    plus mapping non-ASCII spaces to a space and dropping zero-width characters; libpq does the
    same, so a user can type a password with accents on any client."""
    mapped = "".join(" " if unicodedata.category(c) == "Zs" else c for c in password
                     if c not in "\u00ad\u200b\u2060\ufeff\u180e\u200c\u200d")
    return unicodedata.normalize("NFKC", mapped).encode("utf-8")


def parse_verifier(text: str) -> Verifier:
    """A verifier from its ``pg_authid`` text; ``DPError`` naming the problem otherwise."""
    match = re.fullmatch(rf"{MECHANISM}\$(\d+):([A-Za-z0-9+/=]+)\$([A-Za-z0-9+/=]+):([A-Za-z0-9+/=]+)", text)
    if match is None:
        raise DPError(f"not a {MECHANISM} verifier: {text[:40]!r}",
                      hint="recreate the user with `dpsql user add`")
    iterations, salt, stored, server = match.groups()
    return Verifier(int(iterations), base64.b64decode(salt), base64.b64decode(stored), base64.b64decode(server))


def check_name(name: str) -> str:
    """``name`` if it is a valid analyst name, else a ``DPError`` saying what is allowed."""
    if not isinstance(name, str) or NAME.fullmatch(name) is None:
        raise DPError(f"{name!r} is not a valid user name",
                      hint="use 1 to 63 letters, digits, '_', '.', '@' or '-', starting with a letter or '_'")
    return name


def load_users(path: str | os.PathLike) -> dict[str, Verifier]:
    """Name -> verifier of every user in the file (an absent file holds no users); refused
    before reading when anyone but its owner, the curator, could read or change it."""
    file = Path(path)
    if not refuse_exposed(file, "the users file"):
        return {}
    users = {}
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise DPError(f"{file}, line {number}: expected `name verifier`",
                          hint="manage the file with `dpsql user add` and `dpsql user remove`")
        users[check_name(parts[0])] = parse_verifier(parts[1])
    return users


class UserNames:
    """The names in a users file, read again whenever the file changes (another inode, size or
    modification time: ``save_users`` replaces the file whole, an editor rewrites it). The server
    asks before every query whether the session's user is still there (``dpsql user remove``
    applies at once); parsing every verifier for that cost time in proportion to the users.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "users"
    >>> names = UserNames(path)
    >>> save_users(path, {"ada": make_verifier("secret-1", iterations=1)})
    >>> sorted(names())
    ['ada']
    >>> save_users(path, {})
    >>> sorted(names())
    []
    """

    def __init__(self, path: str | os.PathLike):
        self._path = Path(path)
        self._lock = threading.Lock()
        self._seen: tuple[tuple, frozenset[str]] | None = None

    def __call__(self) -> frozenset[str]:
        try:
            stat = self._path.stat()
        except FileNotFoundError:
            return frozenset()
        signature = (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_mode, stat.st_uid)  # a chmod too
        with self._lock:
            if self._seen is not None and self._seen[0] == signature:
                return self._seen[1]
            # A change after the stat above is read now and kept under the older signature,
            # which the next call finds stale: it reads the file again.
            names = frozenset(load_users(self._path))
            self._seen = (signature, names)
            return names


def save_users(path: str | os.PathLike, users: dict[str, Verifier]) -> None:
    """Write the users file atomically, readable and writable by its owner only."""
    file = Path(path)
    text = "# dpsql users: name and SCRAM-SHA-256 verifier (no passwords). Edit with `dpsql user`.\n"
    text += "".join(f"{name} {verifier.text()}\n" for name, verifier in sorted(users.items()))
    # mkstemp creates the file 0600 (less under a strict umask) before a byte is written, and the
    # rename puts it in place whole: the verifiers are never readable by anyone else.
    handle, temporary = tempfile.mkstemp(dir=file.resolve().parent, prefix=f".{file.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            os.fchmod(out.fileno(), FILE_MODE)
            out.write(text)
        os.replace(temporary, file)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def add_user(path: str | os.PathLike, name: str, password: str) -> None:
    """Add ``name`` (or change their password) in the users file."""
    if not password:
        raise DPError("the password is empty", hint="give a password of at least 8 characters")
    if len(password) < 8:
        raise DPError("the password is shorter than 8 characters", hint="give a longer password")
    users = load_users(path)
    users[check_name(name)] = make_verifier(password)
    save_users(path, users)


def remove_user(path: str | os.PathLike, name: str) -> None:
    """Remove ``name`` from the users file; their ledger entries stay."""
    users = load_users(path)
    if name not in users:
        raise DPError(f"no user {name!r} in {path}", hint="list the users with `dpsql user list`")
    del users[name]
    save_users(path, users)


def decoy_key(users_path) -> bytes:
    """The secret keying unknown users' decoy verifiers, kept beside the users file (mode 0600,
    created once): every server on that file, before and after a restart, gives an unknown name
    the same salt, as a real user's never changes — with a key per process, a name's salt
    changing across a restart said that the user does not exist (an attacker's review)."""
    path = Path(f"{users_path}.decoy-key")
    if not path.exists():
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".decoy-")  # mode 0600
        with os.fdopen(descriptor, "w") as handle:
            os.fchmod(handle.fileno(), FILE_MODE)  # exactly 0600, whatever the umask
            handle.write(secrets.token_hex(32) + "\n")
        try:
            os.link(temporary, path)  # whole or not at all; a second server's link fails and reads ours
        except FileExistsError:
            pass
        finally:
            os.unlink(temporary)
    refuse_exposed(path, "the users file's decoy key")  # ours, or another server's: checked before reading
    try:
        key = bytes.fromhex(path.read_text().strip())
    except ValueError:
        key = b""
    if len(key) != 32:
        raise DPError(f"{path} does not hold a 32-byte key", hint=f"delete {path}; the server makes a new one")
    return key


def decoy_verifier(secret: bytes, name: str) -> Verifier:
    """A verifier for a user who does not exist: derived from a per-server secret and the
    name, so the same unknown name always gets the same salt (a real user's salt never
    changes either) and no password matches it. The SCRAM exchange then runs exactly as for
    a real user and fails at the same step, with the same message."""
    salt = hmac.digest(secret, b"salt:" + name.encode("utf-8"), "sha256")[:16]
    stored = hmac.digest(secret, b"stored:" + name.encode("utf-8"), "sha256")
    server = hmac.digest(secret, b"server:" + name.encode("utf-8"), "sha256")
    return Verifier(ITERATIONS, salt, stored, server)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
