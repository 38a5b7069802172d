"""Small sample inputs for the local/shuffle DP release kinds (simulated clients, public seeds).

Each function writes one input file a job reads -- the format from the file name (``.parquet``,
``.csv``, ``.jsonl``; unary and OLH reports hold binary/list columns, so Parquet only) -- and
returns the table written. Everything is derived from the public ``seed`` through
``KeyedRandomness.for_testing``: sample data, never a release.

* :func:`frequency_reports` -- reports of one oracle (frequency oracle aggregation);
* :func:`pem_reports` -- PEM reports with their ``group`` column (heavy hitters);

both with each report's ``client_id`` (a release counts a client's report once per collection);
* :func:`shuffle_shares` -- the shuffled split-and-mix shares (shuffle summation);
* :func:`training_rows` -- an example table with a label column (label randomization export).
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from transforms import parquet_files
from transforms.ldp import simulate
from transforms.ldp.oracles import make_oracle
from transforms.ldp.pem import PEMPlan, client_reports
from transforms.ldp.randomizers import randomize
from transforms.ldp.randomness import KeyedRandomness
from transforms.ldp.shuffle import SplitAndMix, shares_table


def write_table(table: pa.Table, path: str) -> pa.Table:
    """Write ``table`` in the format named by ``path``'s extension."""
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    if path.endswith(".parquet"):
        parquet_files.write_table(table, path)
    elif path.endswith(".csv"):
        _check_flat(table, "CSV")
        pacsv.write_csv(table, path)
    elif path.endswith(".jsonl"):
        _check_flat(table, "JSON lines")
        import json
        with open(path, "w") as handle:
            for row in table.to_pylist():
                handle.write(json.dumps(row) + "\n")
    else:
        raise ValueError(f"{path}: use .parquet, .csv or .jsonl")
    return table


def _check_flat(table: pa.Table, fmt: str) -> None:
    for field in table.schema:
        if not (pa.types.is_integer(field.type) or pa.types.is_boolean(field.type)
                or pa.types.is_floating(field.type) or pa.types.is_string(field.type)):
            raise ValueError(f"column {field.name!r} ({field.type}) cannot be written as {fmt}; "
                             "use .parquet")


def frequency_reports(path: str, *, oracle: str = "oue", epsilon: float = 2.0,
                      domain_size: int = 32, clients: int = 5000,
                      distribution: str = "zipf1.3", seed: int = 0) -> pa.Table:
    """Reports of ``clients`` simulated clients under one oracle."""
    mechanism = make_oracle(oracle, epsilon=epsilon, domain_size=domain_size)
    sim = simulate.Simulation(distribution=simulate.distribution_by_name(distribution, domain_size),
                              num_clients=clients, seed=seed, domain_size=domain_size)
    ids = np.arange(clients, dtype=np.uint64)
    table = randomize(mechanism, sim.values(ids),
                      source=KeyedRandomness.for_testing(seed, "sample-clients"), ids=ids)
    return write_table(with_client_ids(table, ids), path)


def with_client_ids(table: pa.Table, ids) -> pa.Table:
    """Reports with their clients' ids (``client_id``), as a collector receives them."""
    return table.append_column(pa.field("client_id", pa.uint64()),
                               pa.array(np.asarray(ids, dtype=np.uint64))
                               ).replace_schema_metadata(table.schema.metadata)


def pem_reports(path: str, *, plan: Optional[PEMPlan] = None, clients: int = 20_000,
                distribution: str = "poisson5", seed: int = 0) -> pa.Table:
    """PEM reports (the seed's 16-bit values, top 9, OLH at epsilon 4 by default)."""
    plan = plan or PEMPlan(oracle="olh", epsilon=4.0, value_bits=16, top_k=9)
    sim = simulate.Simulation(distribution=simulate.distribution_by_name(distribution),
                              num_clients=clients, seed=seed,
                              domain_size=1 << plan.value_bits)
    ids = np.arange(clients, dtype=np.uint64)
    table = client_reports(plan, sim.values(ids),
                           source=KeyedRandomness.for_testing(seed, "sample-clients"), ids=ids)
    return write_table(with_client_ids(table, ids), path)


def shuffle_shares(path: str, *, spec: Optional[SplitAndMix] = None, clients: int = 1000,
                   seed: int = 0) -> pa.Table:
    """The shuffler's output for ``clients`` clients holding values in [0, B] (sorted shares)."""
    spec = spec or SplitAndMix(num_clients=clients, value_bound=10, epsilon=1.0, delta=1e-6)
    if clients < spec.num_clients:
        raise ValueError("fewer clients than the noise is planned for")
    values = np.random.default_rng(seed).integers(0, spec.value_bound + 1, clients)
    shares = spec.encode(values, source=KeyedRandomness.for_testing(seed, "sample-shares"),
                         ids=np.arange(clients))
    return write_table(shares_table(shares, spec), path)


def training_rows(path: str, *, rows: int = 2000, labels: Sequence = ("no", "yes"),
                  seed: int = 0) -> pa.Table:
    """A training example table: ``example_id``, two features and a ``label`` column."""
    rng = np.random.default_rng(seed)
    x1 = rng.normal(size=rows)
    x2 = rng.normal(size=rows)
    score = x1 + 0.5 * x2 + rng.normal(scale=0.5, size=rows)
    cuts = np.quantile(score, np.linspace(0, 1, len(labels) + 1)[1:-1])
    label = np.asarray(list(labels), dtype=object)[np.searchsorted(cuts, score)]
    table = pa.table({"example_id": pa.array(np.arange(rows, dtype=np.int64)),
                      "feature_1": pa.array(np.round(x1, 6)),
                      "feature_2": pa.array(np.round(x2, 6)),
                      "label": pa.array(label.tolist())})
    return write_table(table, path)
