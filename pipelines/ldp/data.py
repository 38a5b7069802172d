"""Simulated client inputs for the local- and shuffle-DP jobs (sample data, never a release).

    python -m pipelines.ldp.data reports --out reports.parquet --oracle olh --epsilon 2 \\
        --domain_size 1024 --clients 1000000 --distribution zipf1.1
    python -m pipelines.ldp.data pem --out pem.parquet --epsilon 4 --value_bits 16 --top_k 9 \\
        --clients 1000000 --distribution poisson5
    python -m pipelines.ldp.data shares --out shares.parquet --clients 1000 --value_bound 10 \\
        --epsilon 1 --delta 1e-6
    python -m pipelines.ldp.data training --out training.csv --rows 2000 --labels no,yes
    python -m pipelines.ldp.data --sample     # regenerate pipelines/sample_data/ldp

Clients' values come from the seed's distributions (``poisson5``, ``poisson100``, ``uniform14``,
``uniform100``) or ``zipf<exponent>``; their randomness from the public ``--seed``
(``transforms/ldp/sample_data.py``), so the files are reproducible simulations.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

SAMPLE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sample_data", "ldp")


def generate_sample(folder: str = SAMPLE_DIR) -> list[str]:
    """The bundled sample (fixed seeds; see sample_data/ldp/README.md)."""
    from transforms.ldp import sample_data as s

    paths = [os.path.join(folder, n) for n in ("reports_oue.parquet", "pem_reports.parquet",
                                               "shares.parquet", "training.csv")]
    s.frequency_reports(paths[0], oracle="oue", epsilon=2.0, domain_size=32, clients=5000, seed=1)
    s.pem_reports(paths[1], clients=20000, seed=2)
    s.shuffle_shares(paths[2], clients=1000, seed=3)
    s.training_rows(paths[3], rows=2000, seed=4)
    return paths


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipelines.ldp.data",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample", action="store_true",
                        help=f"regenerate the bundled sample in {SAMPLE_DIR}")
    kinds = parser.add_subparsers(dest="kind")

    def common(sub, clients=True):
        sub.add_argument("--out", required=True, help="output file (.parquet, .csv or .jsonl)")
        sub.add_argument("--seed", type=int, default=0, help="public simulation seed")
        if clients:
            sub.add_argument("--clients", type=int, default=100_000)
        return sub

    reports = common(kinds.add_parser("reports", help="frequency-oracle client reports"))
    reports.add_argument("--oracle", required=True,
                         choices=["binary_rr", "grr", "sue", "oue", "rappor", "olh"])
    reports.add_argument("--epsilon", type=float, required=True)
    reports.add_argument("--domain_size", type=int, required=True)
    reports.add_argument("--distribution", default="zipf1.1")
    pem = common(kinds.add_parser("pem", help="PEM client reports with their group"))
    pem.add_argument("--oracle", choices=["grr", "olh"], default="olh")
    pem.add_argument("--epsilon", type=float, required=True)
    pem.add_argument("--value_bits", type=int, default=16)
    pem.add_argument("--top_k", type=int, default=9)
    pem.add_argument("--bits_per_round", type=int, default=4)
    pem.add_argument("--distribution", default="poisson5")
    shares = common(kinds.add_parser("shares", help="shuffled split-and-mix shares"))
    shares.add_argument("--value_bound", type=int, default=10)
    shares.add_argument("--epsilon", type=float, default=1.0)
    shares.add_argument("--delta", type=float, default=1e-6)
    training = common(kinds.add_parser("training", help="training rows with a label column"),
                      clients=False)
    training.add_argument("--rows", type=int, default=2000)
    training.add_argument("--labels", default="no,yes", help="comma-separated label values")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    from transforms.ldp import sample_data as s

    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.sample:
            for path in generate_sample():
                print(path)
            return 0
        if args.kind == "reports":
            table = s.frequency_reports(args.out, oracle=args.oracle, epsilon=args.epsilon,
                                        domain_size=args.domain_size, clients=args.clients,
                                        distribution=args.distribution, seed=args.seed)
        elif args.kind == "pem":
            from transforms.ldp.pem import PEMPlan

            plan = PEMPlan(oracle=args.oracle, epsilon=args.epsilon, value_bits=args.value_bits,
                           top_k=args.top_k, bits_per_round=args.bits_per_round)
            table = s.pem_reports(args.out, plan=plan, clients=args.clients,
                                  distribution=args.distribution, seed=args.seed)
        elif args.kind == "shares":
            from transforms.ldp.shuffle import SplitAndMix

            spec = SplitAndMix(num_clients=args.clients, value_bound=args.value_bound,
                               epsilon=args.epsilon, delta=args.delta)
            table = s.shuffle_shares(args.out, spec=spec, clients=args.clients, seed=args.seed)
        elif args.kind == "training":
            table = s.training_rows(args.out, rows=args.rows,
                                    labels=[v for v in args.labels.split(",") if v],
                                    seed=args.seed)
        else:
            parser.error("choose reports, pem, shares or training (or --sample)")
    except ValueError as err:
        print(f"ldp_data: error: {err}", file=sys.stderr)
        return 2
    print(f"{args.out}: {table.num_rows} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
