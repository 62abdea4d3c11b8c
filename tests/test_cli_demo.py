"""The demo ends with what to run next, written so that it runs as printed (issue 23): after
``make demo`` the PATH does not find ``dpsql``, so the lines name the venv's script and say how
to activate the venv; where the PATH finds this installation's ``dpsql``, they say ``dpsql``."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dpsql import demo
from dpsql.demo import next_commands, run_demo

SCRIPT = Path(sys.executable).parent / "dpsql"


def printed_next(text: str) -> list[str]:
    """The lines after the demo's "Next" heading."""
    return [line for line in text.split("Next\n", 1)[1].splitlines() if line.strip()]


@pytest.mark.skipif(not SCRIPT.is_file(), reason="dpsql is not installed as a script beside this python")
def test_the_demos_next_commands_run_as_printed_without_dpsql_on_the_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(demo.shutil, "which", lambda name: None)  # as after `make demo`
    out = io.StringIO()
    run_demo(None, out)
    shell, query, budget, activate = printed_next(out.getvalue())
    assert all(line.startswith(f"{SCRIPT} ") for line in (shell, query, budget))
    assert "demo-data/shop.duckdb --policy demo-data/shop.policy" in shell
    assert activate == f"(or `source {SCRIPT.parent / 'activate'}` first, then write dpsql alone)"
    assert (SCRIPT.parent / "activate").is_file()
    environment = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NO_COLOR": "1", "DPSQL_HISTORY": ""}

    def run(line: str, stdin: str = "") -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", line], cwd=tmp_path, env=environment, input=stdin,
                              capture_output=True, text=True, timeout=120)

    answered = run(query)
    assert answered.returncode == 0, answered.stderr
    assert "Back Bay" in answered.stdout and "±" in answered.stdout and "cost" in answered.stderr
    spent = run(budget)
    assert spent.returncode == 0 and "remaining" in spent.stdout, spent.stderr
    explored = run(shell, "SELECT COUNT(*) AS n FROM visits;\n")
    assert explored.returncode == 0 and "±" in explored.stdout, explored.stderr
    assert "command not found" not in answered.stderr + spent.stderr + explored.stderr


def test_the_next_commands_say_dpsql_where_the_path_finds_this_installations(tmp_path):
    lines = next_commands(Path("demo-data/shop.duckdb"), None, which=lambda name: str(SCRIPT),
                          executable=str(SCRIPT.parent / "python"), cwd=tmp_path)
    assert [line.split()[:3] for line in lines] == [["dpsql", "shell", "demo-data/shop.duckdb"],
                                                    ["dpsql", "query", "demo-data/shop.duckdb"],
                                                    ["dpsql", "budget", "demo-data/shop.duckdb"]]
    assert "--policy" not in " ".join(lines)  # the policy was stored with the ledger: none needed


def test_another_dpsql_on_the_path_is_not_taken_for_this_one(tmp_path):
    """A dpsql of another installation on the PATH would run without this one's venv."""
    lines = next_commands(Path("shop.duckdb"), Path("shop.policy"), which=lambda name: "/usr/local/bin/dpsql",
                          executable=str(tmp_path / ".venv" / "bin" / "python"), cwd=tmp_path)
    assert lines[0].startswith(".venv/bin/dpsql shell shop.duckdb --policy shop.policy")
    assert not any(line.startswith("dpsql") for line in lines)


def test_paths_with_spaces_are_quoted_for_the_shell(tmp_path):
    database = tmp_path / "my data" / "shop.duckdb"
    lines = next_commands(database, database.with_suffix(".policy"), which=lambda name: str(SCRIPT),
                          executable=str(SCRIPT.parent / "python"), cwd=os.getcwd())
    assert f"'{database.as_posix()}'" in lines[0] and "--policy '" in lines[0]
