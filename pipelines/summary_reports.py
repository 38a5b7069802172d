"""ARA summary reports on Beam: contribution vectors (A), bounding (C), summary (S), reconstruction (R).

Inputs (``--input_format``):
  csv / parquet  attributed conversions: columns source_id, [order], dim_0..dim_{D-1}, and one
                 column per measure of ``--config`` (``count`` may be absent: 1 per row);
                 algorithm A encodes them with the configuration (clip thresholds, budgets).
  reports        JSON lines of cleartext aggregatable reports (see transforms/ara/reports.py).

Output (``--output`` prefix, one CSV shard): ``bucket,noisy_sum[,estimate]`` per declared bucket
(hex key; ``estimate`` = algorithm R when ``--config`` is given). The output domain is
``--output_domain`` (one key per line), or for conversions, every bucket of the configuration.

Privacy: one source (impression) contributes at most 65,536 in L1 (algorithm C, re-applied here),
each declared bucket gets DLap(65,536 / epsilon): the summary is epsilon-DP w.r.t. adding or
removing a source. ``--batch_id`` is claimed in ``--batch_registry_dir`` before the run; a second
aggregation of the same batch is refused.

Example:
  python -m pipelines.summary_reports --input conv.parquet --input_format parquet \\
      --config config.json --epsilon 8 --output out/summary --batch_id 2026-11-21 \\
      --batch_registry_dir ~/ara-batches --release_key_file ~/keys/release.key
"""
from __future__ import annotations

import argparse
import logging
import sys

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from transforms.ara.beam import (ROUNDING_PURPOSE, SUMMARY_PURPOSE, BoundSourceContributions,
                                 EncodeConversions, ParseReports, ReadConversionBatches,
                                 Reconstruct, SummaryReport, batch_purpose,
                                 check_conversion_schema)
from transforms.ara.contribution import ContributionConfig
from transforms.ara.registry import BatchAlreadyAggregated, BatchRegistry
from transforms.ara.summary import check_summary_epsilon, key_bytes, parse_output_domain


REQUIRED = ("input", "input_format", "epsilon", "output", "batch_id", "batch_registry_dir")


def argument_parser() -> argparse.ArgumentParser:
    """The job's own arguments. They are deliberately not a PipelineOptions subclass: Beam adds
    every subclass's flags to one parser, so generic names (--input, --output) defined by two
    pipelines imported in one process would conflict. Beam's options (--runner, ...) pass
    through to PipelineOptions."""
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.summary_reports", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--input", required=True, help="input file pattern")
    add("--input_format", required=True, choices=["csv", "parquet", "reports"],
        help="conversions (csv/parquet) or JSON-lines aggregatable reports")
    add("--config", default=None,
        help="contribution configuration JSON (clip thresholds, budgets, slice dimensions; "
             "see python -m pipelines.ara_config); required for conversions, enables "
             "reconstruction for reports")
    add("--output_domain", default=None,
        help="declared bucket keys, one per line (decimal or 0x hex); required for reports")
    add("--epsilon", required=True, type=float,
        help="privacy budget of this summary report (0 < epsilon <= 64)")
    add("--output", required=True, help="output path prefix")
    add("--batch_id", required=True, help="id of this report batch: aggregated at most once")
    add("--batch_registry_dir", required=True,
        help="local directory recording aggregated batch ids")
    add("--release_key_file", default=None,
        help="hex release key (ReleaseKey.save); default: a fresh secret key")
    add("--testing_seed", type=int, default=None,
        help="TESTING ONLY: derive a public, non-secret key from this seed")
    add("--max_reports_per_source", type=int, default=1024,
        help="reports kept per source before budget bounding (memory bound)")
    add("--runner", default=None,
        help="Beam runner (default: FnApiRunner, in-process); other Beam pipeline options "
             "(e.g. --flink_master, --project) are passed through")
    return parser


def parse_args(argv) -> tuple[argparse.Namespace, PipelineOptions]:
    """(job arguments, Beam pipeline options); argparse exits with a usage error on bad flags."""
    opts, beam_args = argument_parser().parse_known_args(argv)
    options = PipelineOptions(beam_args)
    # DirectRunner would first try to download Prism; run in-process unless told otherwise.
    options.view_as(StandardOptions).runner = opts.runner or "FnApiRunner"
    return opts, options


def _read_text(path: str) -> str:
    with FileSystems.open(path) as f:
        return f.read().decode("utf-8")


def _first_match(pattern: str) -> str:
    matches = FileSystems.match([pattern])[0].metadata_list
    if not matches:
        raise ValueError(f"--input {pattern!r} matches no file")
    return sorted(m.path for m in matches)[0]


def _input_schema(pattern: str, fmt: str):
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq
    from apache_beam.io.filesystem import CompressionTypes
    path = _first_match(pattern)
    if fmt == "parquet":
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            return pq.ParquetFile(f).schema_arrow
    with FileSystems.open(path) as f:
        return pacsv.open_csv(f).schema


def _release_key(opts):
    from accounting.keys import ReleaseKey
    if opts.release_key_file and opts.testing_seed is not None:
        raise ValueError("give --release_key_file or --testing_seed, not both")
    if opts.release_key_file:
        return ReleaseKey.load(opts.release_key_file)
    if opts.testing_seed is not None:
        logging.warning("--testing_seed: noise derived from a PUBLIC seed; not a private release")
        return ReleaseKey.for_testing(opts.testing_seed)
    return ReleaseKey.generate()


def _format_row(row) -> str:
    key = f"{int.from_bytes(row[0], 'big'):#034x}"
    return ",".join([key] + [repr(x) if isinstance(x, float) else str(x) for x in row[1:]])


def validate(opts) -> tuple[ContributionConfig | None, list[int]]:
    """Every check that can fail before data is read; returns (config, declared keys)."""
    for name in REQUIRED:
        if getattr(opts, name, None) is None:
            raise ValueError(f"--{name} is required")
    check_summary_epsilon(opts.epsilon)
    if opts.max_reports_per_source < 1:
        raise ValueError("--max_reports_per_source must be positive")
    config = ContributionConfig.from_json(_read_text(opts.config)) if opts.config else None
    if opts.input_format in ("csv", "parquet"):
        if config is None:
            raise ValueError("--config is required for conversions input")
        check_conversion_schema(_input_schema(opts.input, opts.input_format), config)
    elif not opts.output_domain:
        raise ValueError("--output_domain is required for reports input")
    if opts.output_domain:
        keys = parse_output_domain(_read_text(opts.output_domain)).keys
    else:
        keys = config.output_domain()
    if config is not None:
        for k in keys:
            config.scale_of_key(k)  # every declared bucket must belong to a configured query
    return config, keys


def build(pipeline, opts, config, keys, release_key):
    if opts.input_format == "reports":
        reports = (pipeline | "ReadReports" >> beam.io.ReadFromText(opts.input)
                   | "ParseReports" >> ParseReports())
    else:
        reports = (pipeline
                   | "ReadConversions" >> ReadConversionBatches(opts.input, opts.input_format)
                   | "ContributionVectors" >> EncodeConversions(
                       config, release_key, batch_purpose(ROUNDING_PURPOSE, opts.batch_id)))
    contributions = reports | "ContributionBounding" >> BoundSourceContributions(
        opts.max_reports_per_source)
    domain = pipeline | "Domain" >> beam.Create([key_bytes(k) for k in keys])
    noisy = ({"contributions": contributions, "domain": domain}
             | "SummaryReport" >> SummaryReport(
                 opts.epsilon, release_key, batch_purpose(SUMMARY_PURPOSE, opts.batch_id)))
    if config is not None:
        rows = noisy | "Reconstruct" >> Reconstruct(config)
        header = "bucket,noisy_sum,estimate"
    else:
        rows = noisy | "AsRows" >> beam.Map(lambda kv: (kv[0], kv[1]))
        header = "bucket,noisy_sum"
    return (rows | "Format" >> beam.Map(_format_row)
            | "Write" >> beam.io.WriteToText(opts.output, file_name_suffix=".csv",
                                            num_shards=1, header=header))


def run(opts: argparse.Namespace, options: PipelineOptions) -> None:
    config, keys = validate(opts)
    release_key = _release_key(opts)
    BatchRegistry(opts.batch_registry_dir).claim(
        opts.batch_id, epsilon=opts.epsilon, output=opts.output, input=opts.input,
        release_key_fingerprint=release_key.fingerprint(), declared_buckets=len(keys))
    with beam.Pipeline(options=options) as p:
        build(p, opts, config, keys, release_key)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    opts, options = parse_args(argv)
    logging.getLogger().setLevel(logging.INFO)
    try:
        run(opts, options)
    except (ValueError, BatchAlreadyAggregated) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
