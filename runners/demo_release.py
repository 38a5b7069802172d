"""A runner check, never a release: noisy row counts per public key from a public testing seed.

    python -m runners.demo_release --input rows.csv --key_column campaign \
        --keys a,b,c --epsilon 1 --output out.csv --testing_seed 7 [--runner ...]

It takes a runner through a whole small DP computation (read, count, noise, write) so that the
runner's result can be compared with the in-process engine's. Its noise comes from a public seed,
so its output protects nothing and must not be published: real releases are made by the jobs
under ``pipelines/`` on the release layer (ledger charge, a fresh secret key bound to the input
digest, atomic publication). There is deliberately no option for a secret or stored key here: a
key used outside the ledger could be applied to changed input, and a fresh key per run would let
repeated runs be averaged.

Privacy: neighbouring datasets differ by one row (add/remove). Every row counts towards exactly one
key of a key list that is public (given on the command line, not read from the data), so the
vector of counts has L1 sensitivity 1 and discrete Laplace noise calibrated by
:func:`accounting.calibration.calibrate` makes the release ε-DP. Public keys without rows are
released too (a noisy zero), so the released key set says nothing about the data, and lines are
written sorted by key, so their order says nothing either. Rows whose key
is not public, or that have too few columns, are dropped and counted in Beam metrics (operator
logs only, never in the output).

Noise comes from streams keyed by (release key, "count", key)
(:class:`transforms.noise.RandomStreams`): a given key file gives the same release on every runner, however the runner bundles and orders
the data — which is what ``tests/runners/test_runners.py`` checks.
"""
from __future__ import annotations

import argparse
import csv
import io

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from accounting.calibration import NoiseKind, calibrate
from runners.profiles import pipeline_options_for
from accounting.keys import ReleaseKey
from transforms.noise import RandomStreams, add_noise

NAMESPACE = "demo_release"
PURPOSE = "count"


def read_header(pattern: str) -> list[str]:
    """Column names from the first line of the first file matching ``pattern``."""
    matches = FileSystems.match([pattern])[0].metadata_list
    if not matches:
        raise ValueError(f"--input matches no file: {pattern}")
    with FileSystems.open(sorted(m.path for m in matches)[0]) as handle:
        first = io.TextIOWrapper(handle, encoding="utf-8").readline()
    return next(csv.reader([first]))


class KeyOfRow(beam.DoFn):
    """The public key a CSV line counts towards; other lines are counted in metrics and dropped."""

    def __init__(self, column_index: int, public_keys):
        self._index = column_index
        self._public = frozenset(public_keys)
        self._unknown = Metrics.counter(NAMESPACE, "rows_with_unknown_key")
        self._short = Metrics.counter(NAMESPACE, "rows_with_too_few_columns")

    def process(self, line: str):
        fields = line.split(",")
        if len(fields) <= self._index:
            self._short.inc()
            return
        key = fields[self._index].strip()
        if key not in self._public:
            self._unknown.inc()
            return
        yield key


class AddCountNoise(beam.DoFn):
    """Adds keyed integer noise to all (key, count) pairs in one vectorised call, and emits them
    sorted by key: the output order is public (see :mod:`transforms.release`)."""

    def __init__(self, spec, release_key: ReleaseKey):
        self._spec = spec
        self._release_key = release_key

    def process(self, batch):
        batch = sorted(batch)
        keys = [key for key, _ in batch]
        counts = np.fromiter((count for _, count in batch), dtype=np.int64, count=len(batch))
        streams = RandomStreams.for_keys(self._release_key, PURPOSE, keys)
        noisy = add_noise(self._spec, counts, streams)
        yield from zip(keys, noisy.tolist())


class NoisyCountsPerKey(beam.PTransform):
    """Rows (CSV lines) -> (key, noisy count) for every public key."""

    def __init__(self, column_index: int, public_keys, spec, release_key: ReleaseKey):
        super().__init__()
        self._index = column_index
        self._keys = list(public_keys)
        self._spec = spec
        self._release_key = release_key

    def expand(self, lines):
        counts = (lines
                  | "KeyOfRow" >> beam.ParDo(KeyOfRow(self._index, self._keys))
                  | "One" >> beam.Map(lambda key: (key, 1)))
        zeros = (lines.pipeline
                 | "PublicKeys" >> beam.Create([(key, 0) for key in self._keys]))
        return ((counts, zeros)
                | "All" >> beam.Flatten()
                | "Count" >> beam.CombinePerKey(sum)
                | "Gather" >> beam.combiners.ToList()   # the public keys: a short list
                | "Noise" >> beam.ParDo(AddCountNoise(self._spec, self._release_key)))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m runners.demo_release", description=__doc__)
    parser.add_argument("--input", required=True, help="CSV file(s) with a header line")
    parser.add_argument("--output", required=True, help="output CSV file (key,noisy_count)")
    parser.add_argument("--key_column", required=True)
    parser.add_argument("--keys", required=True, help="comma-separated public keys")
    parser.add_argument("--epsilon", type=float, required=True)
    parser.add_argument("--testing_seed", type=int, required=True,
                        help="the public seed of the noise (a runner check is never a release)")
    return parser.parse_known_args(argv)


def build(pipeline: beam.Pipeline, args) -> None:
    header = read_header(args.input)
    if args.key_column not in header:
        raise ValueError(f"--key_column {args.key_column!r} is not a column of {args.input} "
                         f"(columns: {', '.join(header)})")
    keys = sorted({k.strip() for k in args.keys.split(",") if k.strip()})
    if not keys:
        raise ValueError("--keys must name at least one public key")
    spec = calibrate(NoiseKind.DISCRETE_LAPLACE, epsilon=args.epsilon, l1_sensitivity=1)
    release_key = ReleaseKey.for_testing(args.testing_seed)
    (pipeline
     | "Read" >> beam.io.ReadFromText(args.input, skip_header_lines=1)
     | "Release" >> NoisyCountsPerKey(header.index(args.key_column), keys, spec, release_key)
     | "Format" >> beam.MapTuple(lambda key, count: f"{key},{count}")
     | "Write" >> beam.io.WriteToText(args.output, num_shards=1, shard_name_template="",
                                      header="key,noisy_count"))


def run(argv=None, defaults=()):
    """Build and run the release; returns the PipelineResult (finished unless the runner
    only translates, as with Dataflow's dry run or a template)."""
    from runners.seam import run as run_on_runner

    args, beam_args = parse_args(argv)
    return run_on_runner(pipeline_options_for(beam_args, defaults),
                         lambda pipeline: build(pipeline, args))


def main(argv=None) -> None:
    run(argv)


if __name__ == "__main__":
    main()
