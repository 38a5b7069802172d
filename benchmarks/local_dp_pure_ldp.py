"""The pure-ldp leg of benchmarks/local_dp.py (runs inside benchmarks/.venvs/pure-ldp).

    python benchmarks/local_dp_pure_ldp.py TASKS.json RESULTS.json

Imports only numpy and pure_ldp (Samuel Maddock's pure-LDP, PyPI ``pure-ldp``), never this
project. Tasks (written by local_dp.py, arrays in .npy files next to TASKS.json):

* ``same_reports``: aggregate *our* randomized reports with pure-ldp's server (DEServer for GRR,
  UEServer for OUE/SUE), one ``aggregate`` call per report as its API takes them; return its
  estimates of every value and the aggregation time.
* ``own_olh``: pure-ldp's own OLH client (xxhash with a random seed per user) and server on the
  given true values, ``runs`` times; return every run's estimates and the client/server times.
* ``timing``: pure-ldp's client (``privatise`` per value) and server (``aggregate`` per report,
  then every estimate) for GRR, OUE or OLH on the given values; return both times.
"""
import json
import os
import sys
import time
import warnings

import numpy as np

warnings.filterwarnings("ignore")


def same_reports(task, folder):
    from pure_ldp.frequency_oracles.direct_encoding import DEServer
    from pure_ldp.frequency_oracles.unary_encoding import UEServer

    reports = np.load(os.path.join(folder, task["reports"]))
    d, epsilon = task["d"], task["epsilon"]
    if task["oracle"] == "grr":
        server = DEServer(epsilon, d)
    else:
        server = UEServer(epsilon, d, use_oue=task["oracle"] == "oue")
    start = time.perf_counter()
    for report in (reports.tolist() if reports.ndim == 1 else reports):
        server.aggregate(report)
    server.check_and_update_estimates()
    seconds = time.perf_counter() - start
    return {"estimates": np.asarray(server.estimated_data, dtype=float).tolist(),
            "seconds": seconds, "reports": int(len(reports))}


def own_olh(task, folder):
    from pure_ldp.frequency_oracles.local_hashing import LHClient, LHServer

    values = np.load(os.path.join(folder, task["values"]))
    d, epsilon = task["d"], task["epsilon"]
    np.random.seed(task["seed"])
    import random
    random.seed(task["seed"])
    client = LHClient(epsilon, d, use_olh=True)
    estimates, client_seconds, server_seconds = [], 0.0, 0.0
    items = (values + 1).tolist()  # pure-ldp's default index mapper is x - 1
    for _ in range(task["runs"]):
        server = LHServer(epsilon, d, use_olh=True)
        start = time.perf_counter()
        reports = [client.privatise(v) for v in items]
        client_seconds += time.perf_counter() - start
        start = time.perf_counter()
        for report in reports:
            server.aggregate(report)
        server.check_and_update_estimates()
        server_seconds += time.perf_counter() - start
        estimates.append(np.asarray(server.estimated_data, dtype=float).tolist())
    return {"estimates": estimates, "client_seconds": client_seconds,
            "server_seconds": server_seconds, "reports": int(len(values)) * task["runs"],
            "buckets": int(server.g)}


def timing(task, folder):
    from pure_ldp.frequency_oracles.direct_encoding import DEClient, DEServer
    from pure_ldp.frequency_oracles.local_hashing import LHClient, LHServer
    from pure_ldp.frequency_oracles.unary_encoding import UEClient, UEServer

    values = np.load(os.path.join(folder, task["values"]))
    d, epsilon, oracle = task["d"], task["epsilon"], task["oracle"]
    if oracle == "grr":
        client, server = DEClient(epsilon, d), DEServer(epsilon, d)
    elif oracle == "oue":
        client, server = UEClient(epsilon, d, use_oue=True), UEServer(epsilon, d, use_oue=True)
    else:
        client, server = LHClient(epsilon, d, use_olh=True), LHServer(epsilon, d, use_olh=True)
    items = (values + 1).tolist()
    start = time.perf_counter()
    reports = [client.privatise(v) for v in items]
    client_seconds = time.perf_counter() - start
    start = time.perf_counter()
    for report in reports:
        server.aggregate(report)
    server.check_and_update_estimates()
    return {"client_seconds": client_seconds, "server_seconds": time.perf_counter() - start,
            "reports": len(items)}


def main():
    import argparse

    parser = argparse.ArgumentParser(prog="python benchmarks/local_dp_pure_ldp.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("tasks", help="TASKS.json written by benchmarks/local_dp.py")
    parser.add_argument("results", help="where to write RESULTS.json")
    args = parser.parse_args()
    tasks_path, results_path = args.tasks, args.results
    folder = os.path.dirname(os.path.abspath(tasks_path))
    with open(tasks_path) as handle:
        tasks = json.load(handle)
    import pure_ldp  # noqa: F401  (fail early with the import error if the venv is broken)
    results = []
    for task in tasks:
        run = {"same_reports": same_reports, "own_olh": own_olh, "timing": timing}[task["kind"]]
        results.append(run(task, folder))
    with open(results_path, "w") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    main()
