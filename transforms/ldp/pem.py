"""Prefix extending method (PEM) for heavy hitters under LDP: rounds, groups, candidates, top-k.

Wang, Li & Jha, "Locally Differentially Private Heavy Hitter Identification" (TDSC 2019); seed
``002_8efe61bb3e32549d.txt``. Values are ``m``-bit integers (MAXBITLEN); the goal is the top-k.

* Clients are split into g disjoint groups uniformly at random, independently of their values
  (:func:`assign_groups`); group r reports only the prefix of its value of length
  ``s_r = min(m, s_0 + (r + 1)·eta)`` through a frequency oracle over the 2^{s_r} prefixes, so
  every client reports once and the protocol is epsilon-LDP for every client.
* Round 0 estimates every prefix of length s_0 + eta (s_0 = ceil(log2 k) by default, so at most
  2^{s_0+eta} candidates). Round r > 0 estimates the candidates C_{r-1} x {0,1}^{s_r - s_{r-1}},
  where C_{r-1} holds the k prefixes with the largest round r-1 estimates. The server never
  enumerates the domain: OLH counts support against the candidates only.
* The output is the top-k of the last round, ranked by estimate (ties by smaller value, a public
  order). Group r's counts are scaled by n / n_r to population counts.

Oracles: GRR (as in the seed) and OLH (as in the paper). Unary encodings are not offered for
PEM: a unary report has 2^{s_r} bits (8 KB at 16 bits), which PEM exists to avoid. With OLH,
every round hashes the same number of 16-bit digits (those of an m-bit value) so all groups'
reports share one Arrow schema.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pyarrow as pa

from transforms.ldp import hashing
from transforms.ldp.estimators import SupportCounts, count_support, estimate_table
from transforms.ldp.oracles import Oracle, check_local_epsilon, make_oracle
from transforms.ldp.randomizers import randomize
from transforms.ldp.randomness import retry_u32, uniform_below
from transforms.randomness import RandomSource, SystemRandomness
from transforms.ldp.reports import report_arrays, report_fields

PEM_METADATA_KEY = b"ldp.pem"
PEM_ORACLES = ("grr", "olh")
MAX_ROUND_CANDIDATES = 1 << 20
GROUP_COLUMN = "group"


@dataclass(frozen=True, kw_only=True)
class PEMPlan:
    """PEM parameters: oracle, local epsilon, value bits m, top_k, bits per round (eta), start
    bits (s_0; default ceil(log2 top_k))."""

    oracle: str = "olh"
    epsilon: float
    value_bits: int
    top_k: int
    bits_per_round: int = 4
    start_bits: Optional[int] = None

    def __post_init__(self):
        if self.oracle not in PEM_ORACLES:
            raise ValueError(f"PEM supports the oracles {PEM_ORACLES}, got {self.oracle!r} (unary "
                             "reports grow with the prefix domain)")
        object.__setattr__(self, "epsilon", check_local_epsilon(self.epsilon))
        limit = 32 if self.oracle == "grr" else 64
        if isinstance(self.value_bits, bool) or not isinstance(self.value_bits, int) \
                or not 1 <= self.value_bits <= limit:
            raise ValueError(f"PEM with {self.oracle}: value_bits must be in [1, {limit}], got "
                             f"{self.value_bits!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1:
            raise ValueError(f"top_k must be a positive integer, got {self.top_k!r}")
        if isinstance(self.bits_per_round, bool) or not isinstance(self.bits_per_round, int) \
                or self.bits_per_round < 1:
            raise ValueError(f"bits_per_round must be a positive integer, got "
                             f"{self.bits_per_round!r}")
        start = self.start_bits
        if start is None:
            start = min(self.value_bits - 1, max(0, math.ceil(math.log2(self.top_k))))
            object.__setattr__(self, "start_bits", start)
        if isinstance(start, bool) or not isinstance(start, int) \
                or not 0 <= start < self.value_bits:
            raise ValueError(f"start_bits must be in [0, value_bits), got {start!r}")
        first = self.prefix_bits(0)
        if (1 << first) > MAX_ROUND_CANDIDATES:
            raise ValueError(f"round 0 would estimate 2^{first} prefixes; lower start_bits or "
                             "bits_per_round")
        if self.top_k << (self.bits_per_round) > MAX_ROUND_CANDIDATES:
            raise ValueError("top_k x 2^bits_per_round candidates per round is too many")

    # -- shape ------------------------------------------------------------------------------------
    @property
    def rounds(self) -> int:
        """g: the number of groups (rounds)."""
        return -(-(self.value_bits - self.start_bits) // self.bits_per_round)

    def prefix_bits(self, round_: int) -> int:
        return min(self.value_bits, self.start_bits + (round_ + 1) * self.bits_per_round)

    def _check_round(self, round_: int) -> int:
        if not 0 <= round_ < self.rounds:
            raise ValueError(f"round must be in [0, {self.rounds}), got {round_!r}")
        return round_

    def oracle_for_round(self, round_: int) -> Oracle:
        bits = self.prefix_bits(self._check_round(round_))
        options = {}
        if self.oracle == "olh":
            options["hash_digits"] = hashing.digits_for_bits(self.value_bits)
        return make_oracle(self.oracle, epsilon=self.epsilon, domain_size=1 << bits, **options)

    def prefixes(self, values: np.ndarray, round_: int) -> np.ndarray:
        """The length-s_r prefixes of m-bit ``values``."""
        shift = self.value_bits - self.prefix_bits(self._check_round(round_))
        return np.asarray(values, dtype=np.uint64) >> np.uint64(shift)

    def initial_candidates(self) -> np.ndarray:
        return np.arange(1 << self.prefix_bits(0), dtype=np.uint64)

    def extend(self, kept: np.ndarray, round_: int) -> np.ndarray:
        """Round ``round_ + 1``'s candidates: each kept prefix of round ``round_`` extended by
        every bit string of the length difference (sorted)."""
        grow = self.prefix_bits(round_ + 1) - self.prefix_bits(round_)
        kept = np.asarray(kept, dtype=np.uint64)
        ext = np.arange(1 << grow, dtype=np.uint64)
        return np.sort(((kept[:, None] << np.uint64(grow)) | ext[None, :]).reshape(-1))

    # -- description ------------------------------------------------------------------------------
    def metadata(self) -> str:
        return json.dumps({"oracle": self.oracle, "epsilon": self.epsilon,
                           "value_bits": self.value_bits, "top_k": self.top_k,
                           "bits_per_round": self.bits_per_round,
                           "start_bits": self.start_bits}, sort_keys=True)

    @classmethod
    def from_metadata(cls, text) -> "PEMPlan":
        if isinstance(text, bytes):
            text = text.decode()
        return cls(**json.loads(text))

    def describe(self) -> dict:
        last = self.oracle_for_round(self.rounds - 1)
        return {"method": "PEM (prefix extending method)", "oracle": self.oracle,
                "epsilon": self.epsilon, "realised_epsilon": last.realised_epsilon,
                "value_bits": self.value_bits, "top_k": self.top_k, "rounds": self.rounds,
                "prefix_bits": [self.prefix_bits(r) for r in range(self.rounds)],
                "privacy": (f"each client is in one group and sends one report: "
                            f"{last.realised_epsilon:.6g}-LDP per client; groups are assigned "
                            "independently of values")}

    def report_schema(self) -> pa.Schema:
        fields = report_fields(self.oracle_for_round(self.rounds - 1))
        fields.append(pa.field(GROUP_COLUMN, pa.uint16(), nullable=False))
        return pa.schema(fields, metadata={PEM_METADATA_KEY: self.metadata().encode()})


def check_pem_schema(plan: PEMPlan, schema: pa.Schema) -> None:
    meta = (schema.metadata or {}).get(PEM_METADATA_KEY)
    if meta is not None and PEMPlan.from_metadata(meta) != plan:
        raise ValueError(f"these reports were made for PEM plan {meta.decode()}, not "
                         f"{plan.metadata()}")
    if GROUP_COLUMN not in schema.names:
        raise ValueError(f"PEM reports need a {GROUP_COLUMN!r} column (the client's round)")


# ------------------------------------------------------------------------------------- clients

def assign_groups(source: RandomSource, ids, rounds: int) -> np.ndarray:
    """Uniform group per client (uint16), independent of its value."""
    words = source.words(ids, 1, "pem/group")[:, 0]
    return uniform_below(words & np.uint64(0xFFFFFFFF), rounds,
                         retry_u32(source, ids, "pem/group")).astype(np.uint16)


def client_reports(plan: PEMPlan, values, *, source: Optional[RandomSource] = None, ids=None,
                   groups=None) -> pa.Table:
    """Each client's PEM report: its group's prefix through its group's oracle (randomness from
    ``source``, by default the OS CSPRNG; keyed sources need integer ``ids``)."""
    source = SystemRandomness() if source is None else source
    if ids is None:
        if not isinstance(source, SystemRandomness):
            raise ValueError("keyed randomness needs one integer id per client (ids=...)")
        ids = np.arange(len(values), dtype=np.uint64)
    values = np.asarray(values, dtype=np.uint64)
    if values.size and int(values.max()) >> plan.value_bits:
        raise ValueError(f"values must be below 2^{plan.value_bits}")
    ids = np.asarray(ids)
    groups = assign_groups(source, ids, plan.rounds) if groups is None else np.asarray(groups)
    tables = []
    order = []
    for r in range(plan.rounds):
        rows = np.nonzero(groups == r)[0]
        if not rows.size:
            continue
        table = randomize(plan.oracle_for_round(r), plan.prefixes(values[rows], r),
                          source=source, ids=ids[rows])
        tables.append(table.append_column(GROUP_COLUMN, pa.array(np.full(rows.size, r, np.uint16))))
        order.append(rows)
    schema = plan.report_schema()
    if not tables:
        return schema.empty_table()
    combined = pa.concat_tables([t.replace_schema_metadata(None).cast(schema)
                                 for t in tables]).replace_schema_metadata(schema.metadata)
    # Back in client order (a public order: the ids), so output does not depend on groups' sizes.
    return combined.take(np.argsort(np.concatenate(order), kind="stable"))


# -------------------------------------------------------------------------------------- server

def split_groups(plan: PEMPlan, batch: pa.Table, *, on_invalid: str = "raise"):
    """Yield (round, ReportArrays) for each group present in a report batch; bad group ids are
    reported as round -1 with the count of such rows."""
    check_pem_schema(plan, batch.schema)
    group = batch.column(GROUP_COLUMN).to_numpy(zero_copy_only=False) \
        if batch.column(GROUP_COLUMN).null_count == 0 else None
    if group is None:
        raise ValueError("PEM reports: the group column must not contain nulls")
    group = group.astype(np.int64)
    bad = (group < 0) | (group >= plan.rounds)
    if bad.any():
        if on_invalid == "raise":
            raise ValueError(f"PEM reports: group ids must be in [0, {plan.rounds})")
        yield -1, int(bad.sum())
    stripped = batch.replace_schema_metadata(None)
    for r in range(plan.rounds):
        rows = np.nonzero(group == r)[0]
        if rows.size:
            yield r, report_arrays(plan.oracle_for_round(r), stripped.take(rows),
                                   on_invalid=on_invalid)


def round_support(plan: PEMPlan, round_: int, arrays, candidates: np.ndarray) -> SupportCounts:
    return count_support(plan.oracle_for_round(round_), arrays, candidates)


def round_estimates(plan: PEMPlan, round_: int, candidates: np.ndarray, counts: SupportCounts,
                    population: Optional[int] = None) -> pa.Table:
    """Estimates of one round's candidates (scaled to ``population`` clients when given)."""
    scale = population / counts.n if population and counts.n else 1.0
    table = estimate_table(plan.oracle_for_round(round_), candidates, counts, scale=scale)
    return table.append_column("round", pa.array(np.full(table.num_rows, round_, np.uint16)))


def top_k(table: pa.Table, k: int) -> pa.Table:
    """The k rows with the largest estimates (ties: smaller value first), with ``rank``."""
    estimate = table.column("estimate").to_numpy()
    value = table.column("value").to_numpy()
    order = np.lexsort((value, -estimate))[:k]
    out = table.take(order)
    return out.add_column(0, "rank", pa.array(np.arange(1, len(order) + 1, dtype=np.uint32)))


def next_candidates(plan: PEMPlan, round_: int, estimates: pa.Table) -> np.ndarray:
    kept = top_k(estimates, plan.top_k).column("value").to_numpy()
    return plan.extend(kept, round_)


def heavy_hitters(plan: PEMPlan, reports) -> tuple[pa.Table, list[pa.Table]]:
    """All rounds in memory (tests, benchmarks): the top-k table and each round's estimates.

    ``reports``: one PEM report table or an iterable of them.
    """
    batches = [reports] if isinstance(reports, pa.Table) else list(reports)
    per_round: list[list] = [[] for _ in range(plan.rounds)]
    total = 0
    for batch in batches:
        for r, arrays in split_groups(plan, batch):
            per_round[r].append(arrays)
            total += arrays.n
    candidates = plan.initial_candidates()
    rounds = []
    for r in range(plan.rounds):
        counts = SupportCounts.empty(candidates.size)
        for arrays in per_round[r]:
            counts = counts.merge(round_support(plan, r, arrays, candidates))
        estimates = round_estimates(plan, r, candidates, counts, total)
        rounds.append(estimates)
        if r + 1 < plan.rounds:
            candidates = next_candidates(plan, r, estimates)
    return top_k(rounds[-1], plan.top_k), rounds
