"""Choose an ARA contribution configuration (count encoding, clip thresholds, budget split, K)
from training data.

The ad tech's side: reads *historical* attributed conversions (CSV or Parquet with source_id,
[order], dim_0..dim_{D-1}, [count], value), minimises the exact RMSRE_tau at the target
epsilon for each count encoding, keeps the best (``pipelines.ara.optimize``; the reason is
printed) and writes the configuration JSON that
``python -m pipelines.ara.summary_reports --config`` uses, optionally with the output-domain file.
Training data is the ad tech's own and is not released; the configuration is public.

  python -m pipelines.ara.config --train hist.parquet --slice_dimensions 2,90 --epsilon 8 \\
      --output config.json --output_domain domain.txt
"""
from __future__ import annotations

import argparse
import sys

import pyarrow.csv as pacsv

from pipelines.ara import optimize as opt
from transforms import parquet_files
from transforms.ara.contribution import ENCODINGS
from transforms.ara.summary import format_output_domain
from pipelines.ara.synthetic import ConversionData


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.ara.config", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", required=True, help="training conversions (.csv or .parquet)")
    parser.add_argument("--slice_dimensions", required=True,
                        help="comma-separated cardinalities of dim_0, dim_1, ...")
    parser.add_argument("--epsilon", type=float, required=True, help="target epsilon (<= 64)")
    parser.add_argument("--hierarchical", action="store_true",
                        help="one query level per prefix of the slice dimensions (root..leaves)")
    parser.add_argument("--output", required=True, help="configuration JSON to write")
    parser.add_argument("--output_domain", default=None, help="also write the declared buckets")
    parser.add_argument("--encodings", default=",".join(ENCODINGS),
                        help="count encodings to choose from (comma-separated; default: all): "
                             "separate (a count query with its own share) or padding (counts "
                             "derived from the value buckets plus a padding bucket)")
    args = parser.parse_args(argv)
    try:
        dims = tuple(int(x) for x in args.slice_dimensions.split(","))
        table = (parquet_files.read_table(args.train) if args.train.endswith(".parquet")
                 else pacsv.read_csv(args.train))
        data = ConversionData.from_arrow(table, dims)
        if len(data) == 0:
            raise ValueError("no valid training conversions")
        prefixes = tuple(range(len(dims) + 1)) if args.hierarchical else None
        workload = opt.workload_from_conversions(data, prefixes)
        result = opt.optimize(workload, args.epsilon,
                              encodings=tuple(args.encodings.split(",")))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    config, err = result.config, result.error
    with open(args.output, "w") as f:
        f.write(config.to_json() + "\n")
    if args.output_domain:
        with open(args.output_domain, "w") as f:
            f.write(format_output_domain(config.output_domain()))
    print(f"wrote {args.output}: encoding={config.encoding} K={config.reports_per_source} "
          f"clip={config.clip_thresholds} budgets={config.budgets} "
          f"estimate_scales={tuple(round(float(g), 4) for g in config.scale_array)}; "
          f"training RMSRE_tau "
          f"(exact closed form) = {err:.4f}")
    print(f"why: {result.reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
