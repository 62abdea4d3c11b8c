"""One local Spark session for every test module that needs one (starting one costs 10-20 s).

``session()`` starts it on first use (``local[2]``, ``dpsql.backends.spark.session``); tests that
need it are marked ``spark`` and skip when pyspark or Java is missing.
"""

from __future__ import annotations

import shutil

import pytest

_SESSION = None


def session():
    """The shared local session (pytest skips the caller when Spark cannot start here)."""
    global _SESSION
    if _SESSION is None:
        pytest.importorskip("pyspark")
        if shutil.which("java") is None:
            pytest.skip("Java is not installed")
        from dpsql.backends.spark.session import local_session

        _SESSION = local_session(app="dpsql-tests", config={"spark.sql.shuffle.partitions": "2",
                                                            "spark.default.parallelism": "2"})
    return _SESSION
