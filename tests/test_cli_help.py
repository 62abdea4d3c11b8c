"""Each command's ``--help`` lists the exit codes that command can end with, and what each means
there: ``dpsql user --help`` listed the query command's "the query was refused" (issue 23)."""

from __future__ import annotations

import re

import pytest
from cli_run import run

from dpsql import cli


def listed_codes(capsys, *argv: str) -> dict[int, str]:
    code, out, _ = run(capsys, *argv, "--help")
    assert code == 0
    block = out.split("exit codes:\n", 1)[1]
    return {int(number): meaning for number, meaning in re.findall(r"^  (\d)  (.+)$", block, re.M)}


@pytest.mark.parametrize("name", ["user", "serve", "budget", "init", "demo"])
def test_a_command_that_answers_no_query_lists_only_success_and_error(capsys, name):
    codes = listed_codes(capsys, name)
    assert sorted(codes) == [0, 1]
    assert not any("query" in meaning or "budget" in meaning for meaning in codes.values())


@pytest.mark.parametrize("name", ["query", "explain", "suggest", "shell"])
def test_a_command_that_answers_or_charges_lists_refused_and_over_budget(capsys, name):
    codes = listed_codes(capsys, name)
    assert sorted(codes) == [0, 1, 2, 3]
    assert "refused" in codes[2] and "budget" in codes[3]


def test_the_overview_still_lists_every_code_and_each_code_is_one_exit_code_gives(capsys):
    assert sorted(listed_codes(capsys)) == [0, 1, 2, 3]
    mapped = {code for _, code in cli.EXIT_CODES} | {cli.EXIT_OK, cli.EXIT_ERROR}
    for command in cli.COMMANDS:
        assert {code for code, _ in command.exits} <= mapped and {0, 1} <= {code for code, _ in command.exits}


def test_user_without_a_name_ends_with_a_code_its_help_lists(capsys, tmp_path):
    code, _, err = run(capsys, "user", "add", str(tmp_path / "users"))
    assert code in listed_codes(capsys, "user") and "needs the analyst's name" in err
