"""Where synthetic tables are kept: with the ledger, for the analyst who paid for each.

A ``SyntheticRelease`` (``dpsql.mechanisms.synthetic_release``) is a DP release: once made it is
public to the analyst who paid for it, and to nobody else. The store keeps each one under its
owner (an analyst's name, or ``None`` for the curator's local connection) and its name, in memory
or, for a ledger file, on disk beside it in an owner-only directory (``<ledger>.synthetic``: a
folder per owner, one owner-only DuckDB file per table, ``dpsql.backends.duckdb.synthetic``;
``dpsql.budget.private_files``). Disk is the truth: several server processes may share one
ledger, so a name not found in memory is looked up on disk, and a listing reads the owner's
folder (only theirs: how long it takes says nothing of anyone else's tables).

Names are case-insensitive, as DuckDB's are. A synthetic table may not take the name of a
declared table (private or public) nor of another of its owner's synthetic tables; the
synthesizer calls ``check_name`` before its charge, so a clash is refused with nothing spent.

>>> import pandas as pd
>>> from dpsql.mechanisms.synthetic_release import SyntheticRelease
>>> store = SyntheticTables(None, ["visits"])
>>> release = SyntheticRelease(name="fake", source="visits", method="mst", table=pd.DataFrame({"a": [1]}),
...                            rows=1, epsilon=1.0, delta=1e-6, rho=0.1, measured=(), analyst="alice")
>>> store.keep(release).name, store.keep(release).name  # the second, kept after a clash, renamed
('fake', 'fake_2')
>>> store.names("alice"), store.names("bob"), store.made("bob", "FAKE")
(['fake', 'fake_2'], [], None)
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import threading
from collections.abc import Iterable, Iterator
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from dpsql.backends.duckdb.synthetic import read_synthetic_meta, read_synthetic_rows, write_synthetic_file
from dpsql.budget.private_files import DIRECTORY_MODE, FILE_MODE, refuse_exposed
from dpsql.errors import InternalError, InvalidParameter
from dpsql.mechanisms.synthetic_release import Measured, SyntheticRelease
from dpsql.sql.names import table_key

__all__ = ["SyntheticTables", "synthetic_directory"]

MAX_NAME = 63
"""The longest name a synthetic table may have (PostgreSQL's identifiers are at most 63 bytes)."""
RESERVED_PREFIXES = ("dp_", "pg_")
"""Names a synthetic table may not start with: dpsql's own tables (the listing's sandbox table) and
PostgreSQL's catalog (a server answers ``pg_...`` names from its schema-only catalog)."""
FORMAT = 1
"""The version of a stored synthetic table's ``meta`` JSON."""
SUFFIX = ".duckdb"
"""A stored synthetic table's file: one DuckDB file (``dpsql.backends.duckdb.synthetic``)."""


def synthetic_directory(ledger: str | os.PathLike) -> Path:
    """Where the synthetic tables of the database whose ledger is ``ledger`` are kept.

    >>> synthetic_directory("/data/shop.duckdb.ledger").as_posix()
    '/data/shop.duckdb.ledger.synthetic'
    """
    return Path(f"{os.fspath(ledger)}.synthetic")


def name_key(name: str) -> str:
    """How a table name is compared: case-insensitively, as DuckDB does.

    >>> name_key("Fake_Visits")
    'fake_visits'
    """
    return name.lower()


def _owner_part(analyst: str | None) -> str:
    """The owner's folder: the curator's, or the analyst's name in hex (any text is a name, and hex
    keeps it a file name without clashes; a name too long for that, its SHA-256).

    >>> _owner_part(None), _owner_part("al"), len(_owner_part("x" * 200))
    ('curator', 'a-616c', 66)
    """
    if analyst is None:
        return "curator"
    encoded = analyst.encode()
    return "a-" + encoded.hex() if len(encoded) <= 100 else "h-" + hashlib.sha256(encoded).hexdigest()


def _file_name(name: str) -> str:
    """The file of the synthetic table ``name``, in its owner's folder.

    >>> _file_name("T")
    '74.duckdb'
    """
    return f"{name_key(name).encode().hex()}{SUFFIX}"


class SyntheticTables:
    """Every owner's synthetic tables (module docstring): one store per connection, shared by
    every ``acting_for`` view of it, as the ledger is."""

    def __init__(self, ledger_path: str | os.PathLike | None, declared: Iterable[str]):
        self.directory = None if ledger_path is None else synthetic_directory(os.path.abspath(ledger_path))
        """The owner-only directory of the stored tables (``None``: kept in memory only)."""
        self._declared = {table_key(name) for name in declared}  # `main.visits` is visits
        self._made: dict[tuple[str | None, str], SyntheticRelease] = {}
        """What was made, by (owner, name): kept whole in memory, or without its rows (``table``
        None) when they are on disk. Releases never change, so this cache never goes stale."""
        self._lock = threading.Lock()

    def check_name(self, analyst: str | None, name: str) -> None:
        """Refuse (``InvalidParameter``) ``name`` for a new synthetic table of ``analyst``: not a
        declared table's, not one of theirs already. Reads only the policy and the owner's own
        tables, so it says nothing of anyone else's; call it before charging."""
        self._check_form(name)
        if self.directory is not None:
            self._prepared_directory(analyst)  # a folder that cannot be made fails now, before any charge
        if self.made(analyst, name) is not None:
            raise InvalidParameter(f"you already have a synthetic table named {name}",
                                   hint=f"name the new one otherwise, such as {name}_2")

    def _check_form(self, name: str) -> None:
        """Refuse ``name`` for any synthetic table: not a plain name, reserved, or a declared table's."""
        if not isinstance(name, str) or not name.strip() or not name.isidentifier() or len(name) > MAX_NAME:
            raise InvalidParameter(f"a synthetic table's name must be a plain SQL name of at most {MAX_NAME} "
                                   f"characters, got {name!r}",
                                   hint="name it with letters, digits and underscores, such as visits_synthetic")
        if name_key(name).startswith(RESERVED_PREFIXES):
            raise InvalidParameter(f"{name} starts with {name[:3]}, which dpsql and PostgreSQL's "
                                   "catalog keep for their own tables",
                                   hint=f"name it otherwise, such as my_{name}")
        if name_key(name) in self._declared:
            raise InvalidParameter(f"{name} is the name of a table of the database: a synthetic table needs its own",
                                   hint=f"name it otherwise, such as {name}_synthetic")

    def keep(self, release: SyntheticRelease) -> SyntheticRelease:
        """Keep ``release`` for its analyst (on disk with a ledger file, else in memory) and return it
        as kept. Its name was checked before the charge (``check_name``); should a table of that name
        have been kept since (the same analyst's other call, maybe in another process), the release
        is not lost, whose cost is spent, nor is the other overwritten: it is kept under the first
        free name of ``name_2``, ``name_3``, ... (the returned release says which)."""
        self._check_form(release.name)  # checked before the charge: a refusal here is a bug
        for name in _candidate_names(release.name):
            if name_key(name) in self._declared:
                continue
            candidate = replace(release, name=name)
            key = (release.analyst, name_key(name))
            if self.directory is not None:
                if not self._write(candidate):  # outside the lock: a large table takes seconds to write
                    continue
                with self._lock:
                    self._made[key] = replace(candidate, table=None)
                return candidate
            with self._lock:
                if key not in self._made:
                    self._made[key] = candidate
                    return candidate
        raise InvalidParameter(f"you have too many synthetic tables named {release.name}_N to keep another",
                               hint="name the next one otherwise")

    def made(self, analyst: str | None, name: str) -> SyntheticRelease | None:
        """How ``analyst``'s synthetic table ``name`` was made, its rows left out (``table`` None)
        when they are on disk; ``None`` when they have none of that name (another owner's too)."""
        key = (analyst, name_key(name))
        with self._lock:
            found = self._made.get(key)
            if found is None and self.directory is not None:
                folder = self.directory / _owner_part(analyst)
                path = folder / _file_name(name)
                if folder.is_dir() and refuse_exposed(path, "a synthetic table's file"):
                    found = self._made[key] = _from_json(json.loads(read_synthetic_meta(path)))
            return found

    def find(self, analyst: str | None, name: str) -> SyntheticRelease | None:
        """``analyst``'s synthetic table ``name`` with its rows, or ``None`` (another owner's is ``None`` too)."""
        found = self.made(analyst, name)
        if found is None or found.table is not None:
            return found
        source = self.source(analyst, name)
        return replace(found, table=read_synthetic_rows(source) if isinstance(source, Path) else source)

    def source(self, analyst: str | None, name: str) -> Any:
        """Where the rows of ``analyst``'s synthetic table ``name`` are, for the sandbox: a DataFrame
        held in memory, or its file."""
        found = self.made(analyst, name)
        if found is None:
            raise InternalError(f"no synthetic table {name} of this analyst to read")
        if found.table is not None:
            return found.table
        assert self.directory is not None
        return self.directory / _owner_part(analyst) / _file_name(name)

    def names(self, analyst: str | None) -> list[str]:
        """The (lower-case) names of ``analyst``'s synthetic tables, sorted."""
        with self._lock:
            found = {name for owner, name in self._made if owner == analyst}
            folder = None if self.directory is None else self.directory / _owner_part(analyst)
            if folder is not None and folder.is_dir():  # their own folder only: nothing of anyone else's
                found.update(bytes.fromhex(path.name[:-len(SUFFIX)]).decode() for path in folder.iterdir()
                             if path.name.endswith(SUFFIX) and not path.name.startswith("."))
        return sorted(found)

    def of(self, analyst: str | None) -> dict[str, SyntheticRelease]:
        """How each of ``analyst``'s synthetic tables was made (``made``), by name."""
        tables = {}
        for name in self.names(analyst):
            release = self.made(analyst, name)
            if release is not None:
                tables[name] = release
        return tables

    # -- on disk ------------------------------------------------------------------------------

    def _prepared_directory(self, analyst: str | None) -> Path:
        """The owner's folder, made owner-only (0700) as the directory holding it."""
        assert self.directory is not None
        folder = self.directory / _owner_part(analyst)
        for directory in (self.directory, folder):
            try:
                directory.mkdir(mode=DIRECTORY_MODE, exist_ok=True)  # the umask can only take bits away
            except OSError as error:
                raise InvalidParameter(f"synthetic tables cannot be kept beside the ledger: {directory} cannot be "
                                       f"made ({error.strerror})",
                                       hint="let the user running dpsql write in the ledger's folder") from None
            refuse_exposed(directory, "the synthetic tables directory", directory=True)
        return folder

    def _write(self, release: SyntheticRelease) -> bool:
        """Write ``release`` to a fresh file, then link it under its name: atomic, and never over a
        table another call kept under that name meanwhile (``False``: one did; nothing written)."""
        directory = self._prepared_directory(release.analyst)
        final = directory / _file_name(release.name)
        temporary = directory / f".writing-{secrets.token_hex(8)}{SUFFIX}"
        try:
            write_synthetic_file(temporary, release.table, json.dumps(_to_json(release)))
            os.chmod(temporary, FILE_MODE)  # the directory kept others out meanwhile
            try:
                os.link(temporary, final)
            except FileExistsError:
                return False
            return True
        finally:
            for leftover in (temporary, Path(f"{temporary}.wal")):
                leftover.unlink(missing_ok=True)


def _candidate_names(name: str, tries: int = 100) -> Iterator[str]:
    """``name``, then ``name_2``, ``name_3``, ... (cut to fit ``MAX_NAME``).

    >>> list(_candidate_names("t", 3)), len(list(_candidate_names("x" * 63, 3))[2])
    (['t', 't_2', 't_3'], 63)
    """
    yield name
    for number in range(2, tries + 1):
        suffix = f"_{number}"
        yield name[:MAX_NAME - len(suffix)] + suffix


def _to_json(release: SyntheticRelease) -> dict:
    """What ``release`` says besides its rows, as JSON."""
    return {
        "format": FORMAT, "name": release.name, "source": release.source, "method": release.method,
        "rows": release.rows, "epsilon": release.epsilon, "delta": release.delta, "rho": release.rho,
        "measured": [{f.name: getattr(m, f.name) for f in fields(Measured)} for m in release.measured],
        "bins": {column: list(labels) for column, labels in release.bins.items()},
        "analyst": release.analyst, "created": release.created,
        "error_estimates": [{"columns": list(columns), "error": error}
                            for columns, error in release.error_estimates.items()],
    }


def _measured(stored: dict) -> Measured:
    """A ``Measured`` as ``_to_json`` wrote it (every field it has; one added later keeps its default)."""
    known = {f.name for f in fields(Measured)}
    values: dict[str, Any] = {name: tuple(value) if name == "columns" else value
                              for name, value in stored.items() if name in known}
    return Measured(**values)


def _from_json(stored: dict) -> SyntheticRelease:
    """The release ``_to_json`` wrote, without its rows."""
    return SyntheticRelease(
        name=stored["name"], source=stored["source"], method=stored["method"], table=None,
        rows=stored["rows"], epsilon=stored["epsilon"], delta=stored["delta"], rho=stored["rho"],
        measured=tuple(_measured(m) for m in stored["measured"]),
        bins={column: tuple(labels) for column, labels in stored["bins"].items()},
        analyst=stored["analyst"], created=stored["created"],
        error_estimates={tuple(e["columns"]): e["error"] for e in stored["error_estimates"]})
