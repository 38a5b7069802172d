"""Input tables: Arrow, pandas and Polars DataFrames, dict rows -- and their schema before a run.

:func:`as_arrow_table` turns an element into an Arrow table without importing pandas or Polars
(a DataFrame's own module is loaded already when one is given). :func:`static_schema` reads the
schema of a PCollection whose contents are known at construction (``beam.Create`` of tables,
DataFrames or dicts; Beam schema'd rows), so a misspelt column fails when the pipeline is built,
naming the missing column and the columns present, instead of inside a worker.
"""
from __future__ import annotations

from typing import Optional

import apache_beam as beam
import pyarrow as pa


def _is_dataframe(element, module: str) -> bool:
    typ = type(element)
    return typ.__name__ == "DataFrame" and typ.__module__.split(".")[0] == module


def as_arrow_table(element) -> Optional[pa.Table]:
    """An Arrow table for an Arrow table / RecordBatch or a pandas / Polars DataFrame; None for
    anything else (dicts and Rows are batched by the caller)."""
    if isinstance(element, pa.Table):
        return element
    if isinstance(element, pa.RecordBatch):
        return pa.Table.from_batches([element])
    if _is_dataframe(element, "polars"):
        return element.to_arrow()
    if _is_dataframe(element, "pandas"):
        return pa.Table.from_pandas(element, preserve_index=False)
    return None


def static_schema(pcoll) -> Optional[pa.Schema]:
    """The schema of ``pcoll``'s rows if it is known before the run, else None."""
    element_type = getattr(pcoll, "element_type", None)
    fields = getattr(element_type, "_fields", None)
    if fields:  # a schema'd PCollection (beam.Row / NamedTuple with a schema)
        return pa.schema([pa.field(name, pa.null()) for name, _ in fields])
    # beam.Create expands into inner transforms: the producer is its last part.
    node, transform = getattr(pcoll, "producer", None), None
    while node is not None:
        if isinstance(getattr(node, "transform", None), beam.Create):
            transform = node.transform
            break
        node = getattr(node, "parent", None)
    values = getattr(transform, "values", None)
    if transform is None or not values or pcoll not in node.outputs.values():
        return None
    first = next(iter(values))
    table = as_arrow_table(first)
    if table is not None:
        return table.schema
    if isinstance(first, dict):
        return pa.schema([pa.field(name, pa.null()) for name in first])
    if hasattr(first, "_asdict"):
        return pa.schema([pa.field(name, pa.null()) for name in first._asdict()])
    return None
