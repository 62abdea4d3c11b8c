"""smartnoise-synth's side of ``bench_synth.py``: its MST and AIM synthesizers on the same data and ε.

Run under the python of a venv with smartnoise-synth 1.0.8 (never dpsql's), with a spec written
by ``bench_synth.py``: ``synth_peer.py spec.json``. It imports nothing from dpsql.

The spec gives a Parquet file whose columns are already integer codes 0..k-1 of the public
domains (KEYS values, or bins chosen from the policy's BOUNDS), each column's domain size k, the
methods, the epsilons, delta and the number of runs. The synthesizers get the public domains as a
pre-fitted ``TableTransformer`` of ``LabelTransformer``s fitted on 0..k-1 (so no cell of the domain
is learnt from the data, no preprocessing epsilon is spent, and both tools model the same cube).
Each fit is at (epsilon, delta) — smartnoise converts it to zCDP ρ with its ``cdp_rho``, as dpsql
does — with its defaults otherwise (AIM: all 2-way marginals as workload, max_model_size 80,
max_cells 10000, rounds 16·d; MST: its 1-way marginals, the max spanning tree of 2-way ones).
The sample has the table's true row count (smartnoise keeps ``len(data)``: a number the
comparison gives it for free). Its unit is a row: it has no notion of a person with several rows.

Prints one JSON line per fit: method, epsilon, run, seconds (fit + sample), the sample's joint
histogram over the domain (row-major), and the process's peak RSS in MiB so far.
"""

from __future__ import annotations

import json
import resource
import sys
import time
import warnings
from pathlib import Path


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def transformer(columns: list[str], sizes: list[int]):
    """The public domains as a fitted TableTransformer: one LabelTransformer per column, on 0..k-1."""
    import pandas as pd
    from snsynth.transform import LabelTransformer, TableTransformer

    longest = max(sizes)
    cube = pd.DataFrame({c: [i % k for i in range(longest)] for c, k in zip(columns, sizes)})
    table = TableTransformer([LabelTransformer(nullable=False) for _ in columns])
    table.fit(cube)
    return table


def joint_histogram(frame, columns: list[str], sizes: list[int]) -> list[int]:
    import numpy as np

    index = np.ravel_multi_index([frame[c].to_numpy(dtype=np.int64) for c in columns], sizes)
    return np.bincount(index, minlength=int(np.prod(sizes))).tolist()


def main() -> None:
    import pandas as pd
    from snsynth import Synthesizer

    warnings.filterwarnings("ignore")
    spec = json.loads(Path(sys.argv[1]).read_text())
    columns, sizes = spec["columns"], spec["sizes"]
    frame = pd.read_parquet(spec["data"], columns=columns)
    loaded = peak_mib()
    for method in spec["methods"]:
        for epsilon in spec["epsilons"]:
            for run in range(spec["runs"]):
                started = time.perf_counter()
                synthesizer = Synthesizer.create(method, epsilon=float(epsilon), delta=float(spec["delta"]),
                                                 verbose=False)
                synthesizer.fit(frame, transformer=transformer(columns, sizes), preprocessor_eps=0.0)
                sample = synthesizer.sample(len(frame))
                seconds = time.perf_counter() - started
                sample.columns = columns
                print(json.dumps({"method": method, "epsilon": epsilon, "run": run, "seconds": seconds,
                                  "rows": len(sample), "joint": joint_histogram(sample, columns, sizes),
                                  "peak_mib": peak_mib(), "loaded_mib": loaded}), flush=True)


if __name__ == "__main__":
    main()
