"""Running the ``dpsql`` command line in-process, for tests."""

from dpsql import cli


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``dpsql *argv``."""
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err
