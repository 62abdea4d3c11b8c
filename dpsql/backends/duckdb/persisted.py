"""Bounded copies kept on disk beside the ledger, so a new process does not rebuild them.

Opt-in (``dpsql.connect(path, persist_copies=True)``, ``dpsql query --persist-copies``): the
bounding database (``dpsql.backends.bounding.DATABASE``) is then a DuckDB file in a directory
``<ledger>.copies`` beside the ledger instead of in memory. The copies hold private rows, so
they are protected like the ledger: the directory is the curator's alone (created 0700, and
refused when another user owns it, since a planted file could feed dpsql forged rows, or when
anyone else could list, enter or change it: ``dpsql.budget.private_files``), and its files are
made owner-only (0600) after every build. DuckDB creates those files under the process umask,
but inside a 0700 directory nobody else can reach them, so they are never readable by others.

A stored copy is read only when it is exactly the copy this connection would build now. Each
copy has a row in ``MANIFEST`` recording, when it was built:

- the *recipe*: a digest of the SQL that builds it (``fill_sql``, ``raw_rows_sql``), which names
  the table, its columns and their types, the unit, MAX ROWS PER UNIT, the list and string
  limits and dpsql's own construction, so a new policy or a new dpsql rebuilds;
- the *salt*: a digest of the ledger's secret salt, so a copy made under another ledger is
  never read (the salt itself is never stored);
- the *fingerprint* of the data the copy is made from (``fingerprint_sql``): its row count and
  the sums of the two 64-bit halves of the MD5 of a secret key (from the salt) and each row's
  canonical text (``bounding._row_text``), an order-independent multiset hash of exactly the
  relation the fill reads. Any change to a value an analyst could read back (-0.0 for 0.0, one
  byte of a string, a NULL, a row added, removed or duplicated) changes it, except with the
  chance of guessing a keyed MD5 (DuckDB's ``hash()`` was used first: its collisions can be
  chosen, so an edit could keep a stale copy in use). A file's size and modification time are
  not used: an edit in place within one clock tick keeps both.

One difference from a copy in memory: DuckDB's checkpoint writes every NaN as the positive one,
so a ``-nan`` the raw table holds only in its WAL (a database not checkpointed since) is read
back from the stored copy as ``nan``. The rows kept were chosen on the exact values before that,
and the change is a function of each value alone, so the stored copy is still a per-unit
transformation of the data (stable: privacy holds); only such a NaN's sign is lost.

The fingerprint is computed on every connection that reads a stored copy. While dpsql has the
database open read-only, DuckDB's file lock keeps other processes from writing it, so the
fingerprint taken before a build describes the rows that build reads.

The row fingerprint costs a keyed MD5 of every row's text: at 100M rows more than the build it
would spare. So a *base table* of the database file dpsql opened (not a view, no generated
column: everything DuckDB reads of it is in the file) is fingerprinted instead by the *file
digest* (``file_digest``): an HMAC-SHA256, keyed by the salt, of the DuckDB version and the bytes
of the database file and its write-ahead logs, read once per connection (0.65 s of CPU for a
0.96 GB file). Rows DuckDB reads are a function of those bytes, that DuckDB and dpsql's recipe,
so equal digests mean an equal copy; it misses a change only through an HMAC-SHA256 collision
(about 2^-128, and no one can search for one without the salt). It also changes when nothing an
analyst reads did (another table, a checkpoint rewriting blocks): that costs a rebuild, never a
stale copy. Used when the file is at most ``FILE_BYTES_PER_ROW`` bytes per row of the table (a
small table in a large file keeps the row fingerprint), and only while the file is the one
DuckDB opened (same device and inode).

Why not DuckDB's ``hash()`` of the typed columns, keyed by combining it with a secret: the key is
combined with each value's hash, so two values ``hash()`` takes for equal (-0.0 and 0.0, a
HUGEINT's XORed halves, solved-for strings: ``tests/test_persisted.py``'s twins) give equal
fingerprints under every key, and the combination (multiply and XOR) lets whoever can write two
rows cancel a change across them without the key.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from pathlib import Path

import duckdb

from dpsql.backends.bounding import (
    BoundedTable,
    _copied_columns,
    _row_text,
    fill_sql,
    raw_rows_sql,
)
from dpsql.budget.private_files import DIRECTORY_MODE, FILE_MODE, refuse_exposed
from dpsql.errors import InvalidParameter
from dpsql.sql.names import quoted_table

FILE = "copies.duckdb"
"""The bounding database's file inside the copies directory."""
MANIFEST = "dp_persisted"
"""The table (in the bounding database) recording how each stored copy was built."""
FINGERPRINT_KEY = "fingerprint"
"""Appended to the salt to key the fingerprint's hash (so it is not the copy's order)."""


def copies_directory(ledger: str | os.PathLike) -> Path:
    """Where the persisted copies of the database whose ledger is ``ledger`` live.

    >>> copies_directory("/data/shop.duckdb.ledger").as_posix()
    '/data/shop.duckdb.ledger.copies'
    """
    return Path(f"{os.fspath(ledger)}.copies")


def prepare_directory(directory: Path) -> Path:
    """Create ``directory`` owner-only; return the database file.

    Refused when another user owns the directory or a file in it, or when others could reach the
    directory: copies written there might be read by others, and copies found there might be
    forged. Its files' own modes are made 0600 (``protect``): the directory kept others out."""
    directory.mkdir(mode=DIRECTORY_MODE, exist_ok=True)  # the umask can only take bits away
    refuse_exposed(directory, "the persisted copies directory", directory=True)
    owner = os.geteuid()
    for path in (directory, *directory.iterdir()):
        status = path.lstat()
        if status.st_uid != owner or stat.S_ISLNK(status.st_mode):
            raise InvalidParameter(
                f"{path} is not a file of this user's own (owner uid {status.st_uid}, or a link): dpsql will "
                "not keep private copies there",
                hint="remove it, or leave persist_copies off",
                hints={"cli": "remove it, or leave --persist-copies out"})
    protect(directory)
    return directory / FILE


def protect(directory: Path) -> None:
    """The directory owner-only (0700) and every file in it 0600."""
    os.chmod(directory, DIRECTORY_MODE)
    for path in directory.iterdir():
        if path.is_file() and not path.is_symlink():
            os.chmod(path, FILE_MODE)


def manifest_sql(database: str) -> str:
    """The manifest table, if it is not there yet."""
    return (f"CREATE TABLE IF NOT EXISTS {database}.main.{MANIFEST} "
            "(copy VARCHAR PRIMARY KEY, recipe VARCHAR, salt VARCHAR, fingerprint VARCHAR)")


def recipe(table: BoundedTable) -> str:
    """A digest of everything besides the salt and the data that decides the copy's rows."""
    statements = [fill_sql(table)] + ([] if table.row_level else [raw_rows_sql(table)])
    return hashlib.sha256("\n;\n".join(statements).encode()).hexdigest()


def salt_digest(salt: str) -> str:
    """What the manifest stores of the salt: a digest (the salt is the ledger's secret)."""
    return hashlib.sha256(f"dpsql persisted copies\n{salt}".encode()).hexdigest()


def fingerprint_sql(table: BoundedTable) -> str:
    """One row: the count of the rows the fill reads and two sums over the rows of 64-bit numbers
    of the MD5 of the secret key (parameter ``$fingerprint``: ``fingerprint_keys``) and each
    row's canonical text (``bounding._row_text``: self-delimiting, so two rows have one text
    exactly when nothing read back tells them apart).

    A cryptographic hash keyed by a secret, not DuckDB's ``hash()``: values whose ``hash()`` is
    equal (a HUGEINT's two halves are XORed, a string's 8-byte blocks can be solved for, NULL
    hashes to a constant with twins) would give equal fingerprints whatever the key, and a
    stale copy would be read after such an edit (an attacker's review). It reads the relation
    ``fill_sql`` reads (``_copied_columns``: strings byte for byte, values cut as the copy holds
    them), so it changes exactly when the copy's input may change.
    """
    digest = f"md5(${FINGERPRINT_KEY} || '|' || {_row_text(table)})"  # hex text: 3x faster than md5_number
    # Two 64-bit numbers of each row's digest: ``hash`` of the digest text, and of it extended. A
    # collision of either needs two digests that ``hash`` takes for equal, which no one can steer:
    # the digests are keyed by a secret.
    sums = ", ".join(f"CAST(SUM({number}) AS VARCHAR)" for number in
                     ("hash(dp_digest)", "hash(dp_digest || '|')"))
    return f"SELECT CAST(COUNT(*) AS VARCHAR), {sums} FROM (SELECT {digest} AS dp_digest FROM (SELECT " \
           f"{_copied_columns(table)} FROM {quoted_table(table.source)}))"


def fingerprint_keys(salt: str) -> dict[str, str]:
    """The fingerprint's parameter: the salt with ``FINGERPRINT_KEY``."""
    return {FINGERPRINT_KEY: f"{salt}|{FINGERPRINT_KEY}"}


def fingerprint_text(row: tuple) -> str:
    """The fingerprint row as the manifest stores it.

    >>> fingerprint_text(("3", "12", None))
    '3:12:N'
    """
    return ":".join("N" if value is None else str(value) for value in row)


FILE_BYTES_PER_ROW = 256
"""The file digest fingerprints a table when the database file holds at most this many bytes per
row of it (the row fingerprint costs about a keyed MD5 of a row's text per row, the file digest
an HMAC-SHA256 of the file: ~0.7 ns a byte here, ~150 ns a row)."""
WAL_SUFFIXES = (".wal", ".wal.checkpoint", ".wal.recovery")
"""DuckDB's write-ahead logs beside a database file: DuckDB replays them when it opens the file."""
_CHUNK = 1 << 22


def file_digest_pays(file_bytes: int, rows: int) -> bool:
    """Whether the file digest is the cheaper fingerprint of a table of ``rows`` rows in a file of
    ``file_bytes`` bytes.

    >>> file_digest_pays(961_294_336, 100_000_000), file_digest_pays(800_000, 42)
    (True, False)
    """
    return file_bytes <= FILE_BYTES_PER_ROW * max(rows, 1)


def file_identity(path: Path) -> tuple[int, int]:
    """The device and inode of ``path``: which file DuckDB opened, should the name be moved."""
    status = os.stat(path)
    return status.st_dev, status.st_ino


def file_digest(path: Path, identity: tuple[int, int], salt: str) -> str | None:
    """``file:`` and the HMAC-SHA256, keyed by the salt, of DuckDB's version, the database file's
    bytes and those of its write-ahead logs (each named, its length first); ``None`` when the file
    at ``path`` is no longer the one with ``identity`` (another file was moved in: its bytes are not
    what DuckDB reads).

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "d").write_bytes(b"data")
    >>> one = file_digest(folder / "d", file_identity(folder / "d"), "salt")
    >>> one.startswith("file:"), one == file_digest(folder / "d", file_identity(folder / "d"), "other")
    (True, False)
    >>> _ = (folder / "d.wal").write_bytes(b"")
    >>> one == file_digest(folder / "d", file_identity(folder / "d"), "salt")  # an empty log is a log
    False
    """
    digest = hmac.new(f"{salt}|file digest".encode(), digestmod=hashlib.sha256)
    digest.update(f"dpsql database file\nduckdb {duckdb.__version__}\n".encode())
    with open(path, "rb") as file:
        if file_identity_of(file) != identity:
            return None
        _update(digest, "", file)
    for suffix in WAL_SUFFIXES:
        try:
            with open(f"{os.fspath(path)}{suffix}", "rb") as log:
                _update(digest, suffix, log)
        except FileNotFoundError:
            digest.update(f"no {suffix}\n".encode())
    return "file:" + digest.hexdigest()


def file_identity_of(file) -> tuple[int, int]:
    status = os.fstat(file.fileno())
    return status.st_dev, status.st_ino


def _update(digest, name: str, file) -> None:
    """Add a named file to ``digest``: its name and length first, so two files' bytes split one way."""
    digest.update(f"{name or 'database'} {os.fstat(file.fileno()).st_size}\n".encode())
    while chunk := file.read(_CHUNK):
        digest.update(chunk)
