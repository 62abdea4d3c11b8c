"""SmartNoise's side of ``bench_workload.py``: SmartNoise SQL, each query of a workload at its
share of ε; or (``"synth": true`` in the spec) smartnoise-synth's MWEM synthesizer at the whole ε,
the queries then answered from its synthetic rows.

Run under the python of a venv with smartnoise-sql (never dpsql's), with a spec written by
``bench_workload.py``: ``workload_peer.py spec.json``. The data comes as a Parquet file, loaded
into an in-memory DuckDB and read through ``peers.DuckDBAsPostgres``. Every query costs the
spec's ``epsilon`` in total (SmartNoise's per-mechanism epsilon scaled so, as ``peers.py`` does),
delta 1e-6 / m; GROUP BY keys are not censored (``censor_dims: False``: the domains are public),
and a key SmartNoise does not return counts 0. Prints one JSON line: per run, every scalar answer.

The synthesizer's privacy unit is a row (it has no notion of a person with several rows), a weaker
guarantee than dpsql's per-person one wherever a unit has more than one row; it is fitted on the
KEYS columns (ordinal, with their domains' bounds) and sampled with the table's true row count
(a number the comparison gives it for free).
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import DuckDBAsPostgres  # noqa: E402


def main() -> None:
    import duckdb
    import snsql

    spec = json.loads(Path(sys.argv[1]).read_text())
    if spec.get("synth"):
        return synthesize(spec)
    connection = duckdb.connect()
    connection.execute(f"CREATE SCHEMA bench; CREATE TABLE bench.{spec['table']} AS SELECT * FROM "
                       f"read_parquet('{spec['data']}')")
    adapter = DuckDBAsPostgres(connection)
    rows = connection.execute(f"SELECT COUNT(*) FROM bench.{spec['table']}").fetchone()[0]
    columns = {c: {"type": "string" if isinstance(values[0], str) else "int"} for c, values in spec["domains"].items()}
    for column in columns.values():
        if column["type"] == "int":
            column.update(lower=0, upper=100)
    table = {"max_ids": spec["rows"], "sample_max_ids": True, "rows": rows, "censor_dims": False,
             spec["unit"]: {"type": "int", "private_id": True}, **columns}
    metadata = {"db": {"bench": {spec["table"]: table}}}
    delta = 1e-6 / len(spec["queries"])

    def reader(epsilon: float):
        return snsql.from_connection(adapter, engine="postgres", metadata=metadata,
                                     privacy=snsql.Privacy(epsilon=epsilon, delta=delta))

    prepared = []
    for sql, keys in spec["queries"]:
        text = sql.replace(f"FROM {spec['table']}", f"FROM bench.{spec['table']}")
        cost = float(reader(1.0).get_privacy_cost(text)[0])
        prepared.append((text, keys, reader(spec["epsilon"] / cost)))
    runs = []
    for _ in range(spec["runs"]):
        answers = []
        for text, keys, chosen in prepared:
            frame = chosen.execute_df(text)
            if not keys:
                answers.append(float(frame.iloc[0, -1]))
                continue
            found = {tuple(row[:-1]): float(row[-1]) for row in frame.itertuples(index=False, name=None)}
            cells = itertools.product(*(spec["domains"][k] for k in keys))
            answers += [found.get(tuple(cell), 0.0) for cell in cells]
        runs.append(answers)
    print(json.dumps({"runs": runs}))


def synthesize(spec: dict) -> None:
    """smartnoise-synth's MWEM at the workload's whole ε, queries answered on its sample."""
    import duckdb
    from snsynth import Synthesizer

    connection = duckdb.connect()
    columns = list(spec["domains"])
    frame = connection.sql(f"SELECT {', '.join(columns)} FROM read_parquet('{spec['data']}')").df()
    runs = []
    for _ in range(spec["runs"]):
        synthesizer = Synthesizer.create("mwem", epsilon=spec["total_epsilon"], verbose=False)
        codes = frame.copy()
        for column in columns:   # categories as their index in the public domain (outside: one more)
            index = {value: i for i, value in enumerate(spec["domains"][column])}
            codes[column] = frame[column].map(lambda v, index=index: index.get(v, len(index)))
        synthesizer.fit(codes, categorical_columns=columns)
        sample = synthesizer.sample(len(frame))
        for column in columns:
            values = spec["domains"][column]
            sample[column] = sample[column].map(
                lambda i, values=values: values[int(i)] if int(i) < len(values) else None)
        connection.register(spec["table"], sample)
        answers = []
        for sql, keys in spec["queries"]:
            rows = connection.sql(sql).fetchall()
            if not keys:
                answers.append(float(rows[0][-1]))
                continue
            found = {tuple(row[:-1]): float(row[-1]) for row in rows}
            answers += [found.get(tuple(cell), 0.0) for cell in itertools.product(*(spec["domains"][k] for k in keys))]
        runs.append(answers)
    print(json.dumps({"runs": runs}))


if __name__ == "__main__":
    main()
