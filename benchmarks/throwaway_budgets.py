"""Benchmarks open many throwaway ledger files over the same tables (a fresh budget per run, per
worker, per variant): each is a second budget on purpose, so a benchmark keeps its own registry of
ledgers (``dpsql.budget.registry``) in a fresh curator home instead of the curator's ``~/.dpsql``.
Imported for that effect by ``bench_scale`` and ``flights``, which every benchmark opening a ledger
file imports; its subprocesses inherit the setting, and a benchmark run by another gets its own."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# A fresh home for each benchmark process that imports this (its workers inherit it): a home
# shared with the process that started it would hold that process's ledgers over the same tables.
os.environ["DPSQL_HOME"] = tempfile.mkdtemp(prefix="dpsql-bench-home-")
atexit.register(shutil.rmtree, os.environ["DPSQL_HOME"], ignore_errors=True)
