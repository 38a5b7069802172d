"""Several outputs from one ParDo without Beam's tagged outputs.

A DoFn that would ``yield TaggedOutput(tag, value)`` yields ``(tag, value)`` instead, and
:class:`ByTag` gives one PCollection per tag (a FlatMap per tag that keeps its own values).
Beam's DaskRunner does not keep tagged outputs apart (every tag's values reach every consumer:
runners/README.md, "Dask"), so the jobs that must run there fan out this way. On runners that
fuse stages (in-process, Dataflow, Flink, Spark) the per-tag FlatMaps are fused with the
producer: the values are computed once and only their references are passed on; on Dask the
producer's partitions are one graph node that every tag's FlatMap reads.
"""
from __future__ import annotations

from typing import Sequence

import apache_beam as beam


def _values_of(element, tag):
    if element[0] == tag:
        yield element[1]


class ByTag(beam.PTransform):
    """``(tag, value)`` elements -> ``{tag: PCollection of values}`` for each of ``tags``.

    A tag outside ``tags`` is refused (a value that no output would keep is an error, never
    silently lost)."""

    def __init__(self, tags: Sequence[str], label: str = None):
        super().__init__(label)
        if len(set(tags)) != len(tags) or not tags:
            raise ValueError(f"tags must be distinct and non-empty, got {list(tags)}")
        self._tags = tuple(tags)

    def expand(self, pcoll):
        known = frozenset(self._tags)

        def checked(element):
            if element[0] not in known:
                raise ValueError(f"value tagged {element[0]!r}, not one of {sorted(known)}")
            return element

        tagged = pcoll | "CheckTags" >> beam.Map(checked)
        return {tag: tagged | f"Only_{tag}" >> beam.FlatMap(_values_of, tag) for tag in self._tags}
