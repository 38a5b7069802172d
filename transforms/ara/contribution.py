"""Algorithms A (contribution vectors) and C (contribution bounding) of ARA summary reports.

Pure numpy; the Beam wiring is in ``transforms.ara.beam``.

Terminology. A *measure* is a per-conversion quantity (conversion count, conversion value). A
*level* is a slicing granularity: the slice of a conversion at level ``l`` is given by the first
``prefixes[l]`` impression-side slice dimensions (prefix 0 is the whole campaign). A *query*
is one (level, measure) pair; every conversion contributes one bucket per query. Measure ``m``
is clipped at ``C_m`` (shared by all levels, so the clipped sums of nested slices stay
consistent) and query ``(l, m)`` gets the integer budget ``b[l, m]`` per report.

Encodings of the count (``ContributionConfig.encoding``):

* ``separate``: the count is a measure like any other, with its own bucket and budget share;
  estimate = noisy sum x C / b.
* ``padding``: the count gets no share of its own. Every report spends *exactly* its level's
  budget ``B_l = sum_m b[l, m]``: the value measures contribute as usual and the count measure's
  bucket (the padding bucket) receives the rest, ``b[l, count] + sum_v (b[l, v] - c[l, v])``.
  The sum over a slice's buckets is then ``B_l`` times its number of reports, exactly (no
  rounding error), so count = ``C_count x (sum of the slice's noisy buckets) / B_l``, unbiased
  for the reports kept (``C_count <= 1`` shrinks it; 1 is unbiased). Sound because algorithm C
  and the aggregation service treat the padding bucket like any other: the report's L1 total is
  ``sum b <= 65,536 / K`` as for ``separate``; the count is post-processing of released sums.
  The count measure's values are not read: each report counts once.

  Optionally a value measure is *split* at ``rho_m C_m`` (``split_fractions``, 0 < rho <= 1):
  the padded (main) bucket takes ``min(v, rho C)`` on budget ``b[l, m]``, and an *overflow*
  bucket takes the rest, ``min(v, C) - rho C`` when positive, on its own budget
  ``overflow_budgets[l, m]`` -- without padding. The count stays exact (main buckets plus padding
  still total B_l per report) while reports whose values stay below the split spend only B_l:
  with most values far below the clip, algorithm C then fits more reports per source, as with
  ``separate``. The value estimate is the sum of both parts: ``S_main rho C / b +
  S_overflow (1 - rho) C / b_overflow``. ``rho = 1`` (the default) is plain padding.

Estimate scales (``estimate_scales``, both encodings): algorithm R multiplies measure m's
estimate by ``gamma_m`` (default 1). The ad tech fits gamma on training data: above 1 it makes up
on average for what clipping and algorithm C's dropped reports remove, below 1 it shrinks a
noise-dominated estimate (as ``C_count < 1`` does for a padded count). Pure post-processing of
the released sums: contributions, budgets and the L1 sensitivity are unchanged.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Sequence

import numpy as np

#: L1 contribution budget of one source (impression) across all its aggregatable reports.
CONTRIBUTION_BUDGET = 65536

_MAX_BUCKET_KEY = (1 << 128) - 1
#: Slices of one level: its mixed-radix code is an int64 (bits 0..63 of a bucket key).
MAX_SLICES = (1 << 63) - 1

#: How the count is encoded (see the module docstring).
ENCODINGS = ("separate", "padding")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ContributionConfig:
    """The ad tech's encoding choices (what algorithms A and R need).

    measures: names of the per-conversion measures (value columns of the input).
    clip_thresholds: C_m > 0 per measure.
    slice_dimensions: cardinality of each impression-side slice dimension.
    prefixes: levels, as numbers of leading slice dimensions (flat slicing: ``(len(dims),)``).
    budgets: integer budget per report for each query, shape (levels, measures); their sum
      times ``reports_per_source`` is at most 65,536.
    reports_per_source: K, the number of reports of one source that are sure to fit in its
      budget (algorithm C may accept more when earlier reports rounded down).
    encoding: ``separate`` or ``padding`` (module docstring). With ``padding`` the measures
      include ``count``, its budgets are the padding bucket's guaranteed part (>= 0, usually 0)
      and its clip threshold, in (0, 1], scales the count estimate.
    split_fractions: ``padding`` only: rho_m in (0, 1] per measure (1 for the count; empty: all
      1, no split).
    overflow_budgets: ``padding`` only: integer budget per report of each split measure's
      overflow bucket, shape (levels, measures), >= 1 where rho < 1 and 0 elsewhere (empty: no
      overflow). Budgets and overflow budgets together, times K, are at most 65,536.
    estimate_scales: gamma_m > 0 per measure, algorithm R's final factor (module docstring;
      empty: all 1). Post-processing: no effect on contributions or sensitivity.

    Buckets: column ``m < M`` is measure m's (main or padding) bucket, column ``M + m`` its
    overflow bucket; a bucket key holds the column in bits 96..127.
    """

    measures: tuple[str, ...]
    clip_thresholds: tuple[float, ...]
    slice_dimensions: tuple[int, ...]
    prefixes: tuple[int, ...]
    budgets: tuple[tuple[int, ...], ...]
    reports_per_source: int = 1
    encoding: str = "separate"
    split_fractions: tuple[float, ...] = ()
    overflow_budgets: tuple[tuple[int, ...], ...] = ()
    estimate_scales: tuple[float, ...] = ()

    def __post_init__(self):
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS}, got {self.encoding!r}")
        m = len(self.measures)
        if m == 0 or len(set(self.measures)) != m:
            raise ValueError(f"measures must be distinct and non-empty, got {self.measures!r}")
        if len(self.clip_thresholds) != m:
            raise ValueError("clip_thresholds needs one threshold per measure")
        for name, c in zip(self.measures, self.clip_thresholds):
            if not (isinstance(c, (int, float)) and math.isfinite(c) and c > 0):
                raise ValueError(f"clip_thresholds[{name}] must be positive and finite, got {c!r}")
        for d in self.slice_dimensions:
            if not isinstance(d, (int, np.integer)) or d < 1:
                raise ValueError(f"slice_dimensions must be positive integers, got "
                                 f"{self.slice_dimensions!r}")
        if not self.prefixes or len(set(self.prefixes)) != len(self.prefixes):
            raise ValueError(f"prefixes must be distinct and non-empty, got {self.prefixes!r}")
        for p in self.prefixes:
            if not 0 <= p <= len(self.slice_dimensions):
                raise ValueError(f"prefix {p} outside 0..{len(self.slice_dimensions)}")
            if math.prod(int(d) for d in self.slice_dimensions[:p]) > MAX_SLICES:
                raise ValueError(f"slice_dimensions {list(self.slice_dimensions)}: the first {p} "
                                 f"make more than {MAX_SLICES} slices, more than a bucket key's "
                                 "63-bit slice code holds")
        b = np.asarray(self.budgets)
        if b.shape != (len(self.prefixes), m):
            raise ValueError(f"budgets must have shape (levels, measures) = "
                             f"{(len(self.prefixes), m)}, got {b.shape}")
        if not np.issubdtype(b.dtype, np.integer):
            raise ValueError("budgets must be integers")
        pad = self.padding_measure
        own = np.ones(m, dtype=bool)
        if pad is not None:
            own[pad] = False
            if (b[:, pad] < 0).any():
                raise ValueError("padding budgets (the count column) must not be negative")
            if not 0 < self.clip_thresholds[pad] <= 1:
                raise ValueError("with encoding='padding' the count's clip threshold scales the "
                                 "count estimate and must lie in (0, 1]")
            if m < 2:
                raise ValueError("encoding='padding' needs at least one value measure")
        if (b[:, own] < 1).any():
            raise ValueError("budgets must be positive integers")
        self._check_split(b.shape)
        if self.estimate_scales and (len(self.estimate_scales) != m or not all(
                isinstance(g, (int, float)) and math.isfinite(g) and g > 0
                for g in self.estimate_scales)):
            raise ValueError(f"estimate_scales needs one positive finite factor per measure, got "
                             f"{self.estimate_scales!r}")
        k = self.reports_per_source
        if not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"reports_per_source must be a positive integer, got {k!r}")
        total = int(b.sum()) + int(self.overflow_array.sum())
        if total * int(k) > CONTRIBUTION_BUDGET:
            raise ValueError(f"budgets sum to {total} per report; times reports_per_source="
                             f"{k} that exceeds the L1 contribution budget {CONTRIBUTION_BUDGET}")

    def _check_split(self, shape) -> None:
        if not self.split_fractions and not self.overflow_budgets:
            return
        if self.encoding != "padding":
            raise ValueError("split_fractions and overflow_budgets need encoding='padding'")
        rho = np.asarray(self.split_fractions, dtype=np.float64)
        if rho.shape != (shape[1],) or not np.isfinite(rho).all() \
                or ((rho <= 0) | (rho > 1)).any():
            raise ValueError("split_fractions needs one fraction in (0, 1] per measure")
        if rho[self.padding_measure] != 1:
            raise ValueError("the count is not split: its split fraction must be 1")
        over = np.asarray(self.overflow_budgets)
        if over.shape != shape or not np.issubdtype(over.dtype, np.integer):
            raise ValueError(f"overflow_budgets must be integers of shape (levels, measures) = "
                             f"{shape}")
        split = rho < 1
        if (over[:, split] < 1).any() or (over[:, ~split] != 0).any():
            raise ValueError("overflow_budgets must be >= 1 for split measures and 0 otherwise")

    @property
    def padding_measure(self) -> int | None:
        """Index of the count measure when it is derived by padding, else None."""
        if self.encoding != "padding":
            return None
        if "count" not in self.measures:
            raise ValueError("encoding='padding' derives the count: measures must include 'count'")
        return self.measures.index("count")

    def level_totals(self) -> np.ndarray:
        """B_l: the budget one report spends at each level (exactly, with ``padding``)."""
        return self.budget_array.sum(axis=1)

    @property
    def budget_array(self) -> np.ndarray:
        return np.asarray(self.budgets, dtype=np.int64)

    @property
    def split_array(self) -> np.ndarray:
        """rho per measure (all 1 without a split)."""
        if not self.split_fractions:
            return np.ones(len(self.measures))
        return np.asarray(self.split_fractions, dtype=np.float64)

    @property
    def overflow_array(self) -> np.ndarray:
        """Overflow budgets (levels, measures); zeros without a split."""
        if not self.overflow_budgets:
            return np.zeros((len(self.prefixes), len(self.measures)), dtype=np.int64)
        return np.asarray(self.overflow_budgets, dtype=np.int64)

    @property
    def scale_array(self) -> np.ndarray:
        """gamma per measure (all 1 when ``estimate_scales`` is empty)."""
        if not self.estimate_scales:
            return np.ones(len(self.measures))
        return np.asarray(self.estimate_scales, dtype=np.float64)

    @property
    def split_measures(self) -> list[int]:
        return [m for m, r in enumerate(self.split_array) if r < 1]

    @property
    def columns(self) -> list[int]:
        """Bucket columns (key bits 96..127): every measure's, then the split measures'
        overflow buckets (``M + m``)."""
        return list(range(len(self.measures))) + [len(self.measures) + m
                                                  for m in self.split_measures]

    def contributions(self, values: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
        """Algorithm A for this configuration: (n, L, len(columns)) integer contributions.

        uniforms: (n, L, len(columns)) independent U[0, 1). Columns follow ``columns``; every
        report's total is at most ``sum(budgets) + sum(overflow_budgets)`` (exactly
        ``sum(budgets)`` over its first M columns with ``padding``).
        """
        values = np.asarray(values, dtype=np.float64)
        n, m = values.shape[0], len(self.measures)
        cols = self.columns
        levels = len(self.prefixes)
        uniforms = np.asarray(uniforms, dtype=np.float64)
        if uniforms.shape != (n, levels, len(cols)):
            raise ValueError(f"uniforms must have shape {(n, levels, len(cols))}")
        rho, clip = self.split_array, self.clip_array
        clean = np.clip(np.nan_to_num(values, nan=0.0, posinf=np.inf, neginf=0.0), 0.0, clip)
        main = contribution_vectors(clean, rho * clip, self.budget_array, uniforms[:, :, :m],
                                    self.padding_measure)
        if len(cols) == m:
            return main
        split = self.split_measures
        over = np.maximum(clean[:, split] - rho[split] * clip[split], 0.0)
        extra = contribution_vectors(over, (1 - rho[split]) * clip[split],
                                     self.overflow_array[:, split], uniforms[:, :, m:])
        return np.concatenate([main, extra], axis=2)

    def column_scales(self) -> np.ndarray:
        """(L, len(columns)): algorithm R's factor gamma C / b of each bucket column (for the
        padding bucket: gamma C_count / B_l, applied to the sum of the slice's first M columns;
        an overflow column: its measure's gamma)."""
        m = len(self.measures)
        rho, clip = self.split_array, self.clip_array
        b = self.budget_array.astype(np.float64)
        scales = np.empty((len(self.prefixes), len(self.columns)))
        with np.errstate(divide="ignore"):
            scales[:, :m] = (rho * clip)[None, :] / b
        pad = self.padding_measure
        if pad is not None:
            scales[:, pad] = clip[pad] / self.level_totals()
        for j, v in enumerate(self.split_measures):
            scales[:, m + j] = (1 - rho[v]) * clip[v] / self.overflow_array[:, v]
        gamma = self.scale_array
        return scales * np.concatenate([gamma, gamma[self.split_measures]])[None, :]

    @property
    def clip_array(self) -> np.ndarray:
        return np.asarray(self.clip_thresholds, dtype=np.float64)

    @property
    def n_queries(self) -> int:
        """Contributions per report: levels x bucket columns (one keyed uniform each)."""
        return len(self.prefixes) * len(self.columns)

    def level_sizes(self) -> list[int]:
        """Number of slices (buckets per measure) at each level."""
        return [math.prod(int(d) for d in self.slice_dimensions[:p]) for p in self.prefixes]

    def domain_size(self) -> int:
        """How many buckets :meth:`output_domain` declares (computed without building them)."""
        return sum(self.level_sizes()) * len(self.columns)

    def slice_codes(self, features: np.ndarray) -> np.ndarray:
        """Mixed-radix code of each row's slice at every level: int64 array (n, levels).

        ``features`` is (n, len(slice_dimensions)) of integers in ``[0, dim)`` (checked by the
        caller: out-of-range rows are a row-level fault, see ``valid_feature_rows``).
        """
        features = np.asarray(features, dtype=np.int64)
        out = np.zeros((features.shape[0], len(self.prefixes)), dtype=np.int64)
        for j, p in enumerate(self.prefixes):
            code = np.zeros(features.shape[0], dtype=np.int64)
            for d in range(p):
                code = code * self.slice_dimensions[d] + features[:, d]
            out[:, j] = code
        return out

    def valid_feature_rows(self, features: np.ndarray) -> np.ndarray:
        """Boolean mask of rows whose slice features are inside the declared dimensions."""
        features = np.asarray(features)
        dims = np.asarray(self.slice_dimensions, dtype=np.int64)
        return ((features >= 0) & (features < dims)).all(axis=1)

    def bucket_key(self, level: int, column: int, code: int) -> int:
        """128-bit bucket key of bucket ``column`` (a measure's index, or ``M + m`` for measure
        m's overflow bucket) at ``level`` for the slice with mixed-radix ``code``.

        Layout: bits 96..127 column, 64..95 level prefix, 0..63 slice code.
        """
        return (column << 96) | (self.prefixes[level] << 64) | int(code)

    def bucket_keys_hi_lo(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """High and low 64-bit halves of the bucket keys, each (n, levels, columns) uint64."""
        codes = np.asarray(codes, dtype=np.int64)
        n = codes.shape[0]
        levels, cols = len(self.prefixes), np.asarray(self.columns, dtype=np.uint64)
        hi = (cols[None, None, :] << np.uint64(32)) \
            | np.asarray(self.prefixes, dtype=np.uint64)[None, :, None]
        hi = np.broadcast_to(hi, (n, levels, cols.size)).copy()
        lo = np.broadcast_to(codes.astype(np.uint64)[:, :, None], (n, levels, cols.size)).copy()
        return hi, lo

    def output_domain(self) -> list[int]:
        """Every declared bucket key (all bucket columns, all slices), ascending."""
        keys = []
        for level, size in enumerate(self.level_sizes()):
            for column in self.columns:
                base = self.bucket_key(level, column, 0)
                keys.extend(base + c for c in range(size))
        return sorted(keys)

    def query_of_key(self, key: int) -> tuple[int, int, int]:
        """(level, bucket column, slice code) of a declared bucket key; KeyError for a key of
        no bucket of this configuration."""
        column, prefix, code = key >> 96, (key >> 64) & 0xFFFFFFFF, key & ((1 << 64) - 1)
        if column not in self.columns or prefix not in self.prefixes:
            raise KeyError(f"bucket key {key:#x} belongs to no query of this configuration")
        level = self.prefixes.index(prefix)
        if code >= self.level_sizes()[level]:
            raise KeyError(f"bucket key {key:#x} names a slice outside the declared dimensions")
        return level, int(column), int(code)

    def scale_of_key(self, key: int) -> float:
        """Algorithm R's factor for the bucket key (``column_scales``)."""
        level, column, _ = self.query_of_key(key)
        return float(self.column_scales()[level, self.columns.index(column)])

    def reconstruct_estimates(self, keys, noisy_sums) -> np.ndarray:
        """Algorithm R for declared buckets ``keys`` with released ``noisy_sums`` (same order).

        ``separate``, and value buckets without a split: noisy sum x C / b. The padding bucket
        of a slice carries the slice's count: C_count x (sum of the slice's M main buckets) / B_l.
        A split measure's main bucket carries its whole value estimate (main part plus overflow
        part); the overflow bucket's own estimate is NaN (it is part of the main one). NaN
        wherever a needed bucket of the slice is not declared. Every estimate is then multiplied
        by its measure's ``estimate_scales`` factor. Post-processing only.
        """
        keys = [int(k) for k in keys]
        noisy = np.asarray(noisy_sums, dtype=np.float64)
        if noisy.shape != (len(keys),):
            raise ValueError("noisy_sums needs one value per key")
        queries = [self.query_of_key(k) for k in keys]
        scales = self.column_scales()
        index = {c: j for j, c in enumerate(self.columns)}
        out = np.array([noisy[i] * scales[level, index[col]]
                        for i, (level, col, _) in enumerate(queries)])
        pad, m = self.padding_measure, len(self.measures)
        if pad is None:
            return out
        by_slice = {}
        for (level, col, code), v in zip(queries, noisy):
            by_slice.setdefault((level, code), {})[col] = v
        for i, (level, col, code) in enumerate(queries):
            cells = by_slice[(level, code)]
            if col == pad:
                main = [cells.get(c) for c in range(m)]
                out[i] = np.nan if any(v is None for v in main) else \
                    sum(main) * scales[level, index[pad]]
            elif col >= m:
                out[i] = np.nan
            elif col in self.split_measures:
                over = cells.get(m + col)
                out[i] = np.nan if over is None else \
                    out[i] + over * scales[level, index[m + col]]
        return out

    def estimate_coefficients(self, keys) -> list:
        """Per declared bucket of ``keys``: the public coefficients of the noisy sums its
        :meth:`reconstruct_estimates` estimate is a linear combination of (one for a rescaled
        bucket, M for a padding bucket's count, two for a split measure's value), or None where
        the estimate is null. Depends on the configuration and the declared keys only."""
        keys = [int(k) for k in keys]
        queries = [self.query_of_key(k) for k in keys]
        scales = self.column_scales()
        index = {c: j for j, c in enumerate(self.columns)}
        declared = {(level, code, col) for level, col, code in queries}
        pad, m = self.padding_measure, len(self.measures)
        out = []
        for level, col, code in queries:
            own = scales[level, index[col]]
            if pad is None:
                out.append((own,))
            elif col == pad:
                main = [c for c in range(m) if (level, code, c) in declared]
                out.append((own,) * m if len(main) == m else None)
            elif col >= m:
                out.append(None)
            elif col in self.split_measures:
                out.append((own, scales[level, index[m + col]])
                           if (level, code, m + col) in declared else None)
            else:
                out.append((own,))
        return out

    def to_json(self) -> str:
        return json.dumps({
            "measures": list(self.measures),
            "clip_thresholds": [float(c) for c in self.clip_thresholds],
            "slice_dimensions": [int(d) for d in self.slice_dimensions],
            "prefixes": [int(p) for p in self.prefixes],
            "budgets": [[int(x) for x in row] for row in self.budgets],
            "reports_per_source": int(self.reports_per_source),
            "encoding": self.encoding,
            **({"split_fractions": [float(r) for r in self.split_fractions],
                "overflow_budgets": [[int(x) for x in row] for row in self.overflow_budgets]}
               if self.split_fractions else {}),
            **({"estimate_scales": [float(g) for g in self.estimate_scales]}
               if self.estimate_scales else {}),
        }, indent=2)

    @classmethod
    def from_json(cls, text: str) -> "ContributionConfig":
        """Parse :meth:`to_json`'s format (see :meth:`from_dict`)."""
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:  # e.msg is a fixed phrase
            raise ValueError(f"invalid contribution config: not valid JSON: {e.msg} at line "
                             f"{e.lineno} column {e.colno}") from None
        return cls.from_dict(d)

    @classmethod
    def from_dict(cls, d) -> "ContributionConfig":
        """A parsed :meth:`to_json` object. Errors name the field, never a value: the object may
        come from the wrong file (a secret)."""
        if not isinstance(d, dict):
            raise ValueError("invalid contribution config: not a JSON object")

        def read(name, convert, default=None):
            if name not in d and default is None:
                raise ValueError(f"invalid contribution config: field {name!r} is missing")
            try:
                return convert(d.get(name, default))
            except (TypeError, ValueError):
                raise ValueError(f"invalid contribution config: field {name!r} does not hold "
                                 "values of the expected type") from None

        numbers = lambda v: tuple(float(x) for x in v)  # noqa: E731
        integers = lambda v: tuple(int(x) for x in v)  # noqa: E731
        rows = lambda v: tuple(tuple(int(x) for x in row) for row in v)  # noqa: E731
        return cls(measures=read("measures", tuple),
                   clip_thresholds=read("clip_thresholds", numbers),
                   slice_dimensions=read("slice_dimensions", integers),
                   prefixes=read("prefixes", integers),
                   budgets=read("budgets", rows),
                   reports_per_source=read("reports_per_source", int, 1),
                   encoding=read("encoding", str, "separate"),
                   split_fractions=read("split_fractions", numbers, ()),
                   overflow_budgets=read("overflow_budgets", rows, ()),
                   estimate_scales=read("estimate_scales", numbers, ()))


def split_budget(shares: Sequence[float] | np.ndarray, reports_per_source: int,
                 total: int = CONTRIBUTION_BUDGET) -> np.ndarray:
    """Integer per-report budgets proportional to ``shares`` with sum <= total // K, each >= 1.

    Largest-remainder rounding of ``shares * (total // K)``, so the L1 budget is never exceeded.
    """
    shares = np.asarray(shares, dtype=np.float64)
    if (shares < 0).any() or not np.isfinite(shares).all() or shares.sum() <= 0:
        raise ValueError(f"budget shares must be non-negative with a positive sum, got {shares}")
    per_report = total // int(reports_per_source)
    if per_report < shares.size:
        raise ValueError(f"reports_per_source={reports_per_source} leaves fewer budget units "
                         f"({per_report}) than queries ({shares.size})")
    target = shares / shares.sum() * (per_report - shares.size)
    base = np.floor(target).astype(np.int64)
    remainder = (per_report - shares.size) - int(base.sum())
    order = np.argsort(-(target - base), kind="stable")
    base[order[:remainder]] += 1
    return (base + 1).reshape(shares.shape)


def contribution_vectors(values: np.ndarray, clip_thresholds: np.ndarray, budgets: np.ndarray,
                         uniforms: np.ndarray, padding_measure: int | None = None) -> np.ndarray:
    """Algorithm A: integer contributions of each conversion to each query.

    values: (n, M) measured values (negative and NaN values are treated as 0: algorithm A clips
      to [0, C]; callers count them as row-level faults). clip_thresholds: (M,). budgets:
      (L, M) integers. uniforms: (n, L, M) independent U[0, 1) draws.
    Returns int64 (n, L, M): ``floor(min(max(v, 0), C_m) * b[l, m] / C_m + U)``, so each entry
    lies in ``[0, b[l, m]]``, its expectation is exactly ``clip(v) * b / C`` and every report's
    total is at most ``budgets.sum()``.
    With ``padding_measure`` (the count, encoding ``padding``) that measure's entries are the
    padding ``b[l, pad] + sum_v (b[l, v] - c[l, v])`` instead, so every report's total at level
    l is exactly ``budgets[l].sum()`` (its uniforms and values are not used).
    """
    values = np.asarray(values, dtype=np.float64)
    clip_thresholds = np.asarray(clip_thresholds, dtype=np.float64)
    budgets = np.asarray(budgets, dtype=np.int64)
    uniforms = np.asarray(uniforms, dtype=np.float64)
    n, m = values.shape
    if clip_thresholds.shape != (m,) or budgets.ndim != 2 or budgets.shape[1] != m:
        raise ValueError("shapes: values (n, M), clip_thresholds (M,), budgets (L, M)")
    if uniforms.shape != (n,) + budgets.shape:
        raise ValueError(f"uniforms must have shape {(n,) + budgets.shape}, got {uniforms.shape}")
    clipped = np.clip(np.nan_to_num(values, nan=0.0, posinf=np.inf, neginf=0.0),
                      0.0, clip_thresholds)
    scaled = clipped[:, None, :] * (budgets / clip_thresholds)[None, :, :]
    out = np.floor(scaled + uniforms).astype(np.int64)
    # scaled == b exactly plus U < 1 floors to b; guard float round-off at the upper end.
    out = np.minimum(out, budgets[None, :, :])
    if padding_measure is not None:
        out[:, :, padding_measure] = 0
        out[:, :, padding_measure] = budgets.sum(axis=1)[None, :] - out.sum(axis=2)
    return out


def rank_within_source(source_ids: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """0-based position of each report among its source's reports (by ``order``, then index)."""
    source_ids = np.asarray(source_ids)
    n = source_ids.shape[0]
    order = np.arange(n) if order is None else np.asarray(order)
    idx = np.lexsort((np.arange(n), order, source_ids))
    sorted_src = source_ids[idx]
    starts = np.ones(n, dtype=bool)
    starts[1:] = sorted_src[1:] != sorted_src[:-1]
    group_start = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
    rank = np.empty(n, dtype=np.int64)
    rank[idx] = np.arange(n) - group_start
    return rank


def bound_contributions(source_ids: np.ndarray, report_totals: np.ndarray,
                        order: np.ndarray | None = None,
                        budget: int = CONTRIBUTION_BUDGET) -> np.ndarray:
    """Algorithm C: which reports the browser keeps (boolean mask).

    Source ids are canonicalised (``transforms.privacy_units``) unless they are integers already.
    Reports of one source are taken in ``order`` (ties by position); a report is kept when its
    total fits in what is left of the source's budget, otherwise it is dropped whole and the
    budget is unchanged (a later, smaller report may still fit). So the kept totals of every
    source sum to at most ``budget``. Vectorised over sources, one step per report rank.
    """
    source_ids = np.asarray(source_ids)
    if source_ids.shape[0] == 0:
        return np.zeros(0, dtype=bool)
    if not np.issubdtype(source_ids.dtype, np.integer):
        # One canonical form before grouping: 7, 7.0 and "7" are one source.
        from transforms.privacy_units import canonical_unit_column
        source_ids = np.asarray(canonical_unit_column(source_ids.tolist(), "source_id")
                                .to_pylist(), dtype=object)
        if any(s is None for s in source_ids):
            raise ValueError("source_ids must not be null")
    _, src = np.unique(source_ids, return_inverse=True)
    return bound_ranked_contributions(src, rank_within_source(src, order), report_totals, budget)


def bound_ranked_contributions(source_index: np.ndarray, rank: np.ndarray,
                               report_totals: np.ndarray,
                               budget: int = CONTRIBUTION_BUDGET) -> np.ndarray:
    """Algorithm C on dense source indices (0..S-1) with precomputed ranks (see
    ``rank_within_source``); for simulations that bound the same reports many times."""
    totals = np.asarray(report_totals, dtype=np.int64)
    if (totals < 0).any():
        raise ValueError("report totals must be non-negative")
    n = totals.shape[0]
    keep = np.zeros(n, dtype=bool)
    if n == 0:
        return keep
    by_rank = np.argsort(rank, kind="stable")
    rank_sorted = rank[by_rank]
    bounds = np.searchsorted(rank_sorted, np.arange(rank_sorted[-1] + 2))
    spent = np.zeros(int(source_index.max()) + 1, dtype=np.int64)
    for r in range(int(rank_sorted[-1]) + 1):
        rows = by_rank[bounds[r]:bounds[r + 1]]  # at most one report per source
        s = source_index[rows]
        fits = spent[s] + totals[rows] <= budget
        keep[rows] = fits
        spent[s[fits]] += totals[rows[fits]]
    return keep


def parse_bucket_key(text) -> int:
    """A 128-bit bucket key from an int, a decimal string or a ``0x`` hex string."""
    if isinstance(text, bool):
        raise ValueError("bucket key must be an integer, not a boolean")
    if isinstance(text, (int, np.integer)):
        key = int(text)
    elif isinstance(text, str):
        s = text.strip()
        try:
            key = int(s, 16) if s.lower().startswith("0x") else int(s, 10)
        except ValueError as e:
            raise ValueError(f"bucket key {text!r} is not a decimal or 0x-hex integer") from e
    else:
        raise ValueError(f"bucket key must be an integer or string, got {type(text).__name__}")
    if not 0 <= key <= _MAX_BUCKET_KEY:
        raise ValueError(f"bucket key {text!r} does not fit in 128 bits")
    return key
