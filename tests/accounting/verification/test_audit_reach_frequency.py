"""Neighbouring-pair audit of the reach_frequency job at L0 > 1: one person at several publishers
moves every scope they appear in -- each publisher's sketch and the union -- and each scope's
reach statistic by at most 1 (issue 40.7).

The registered audit (tests/audit_kit.py, ``reach_frequency``) checks structure, order, files and
marker text: the released reach is an estimate, a nonlinear function of the sketch's noisy
active-register count. This audit reads that count back from the release: the estimate is the n
whose expected active count equals the (noisy) count (transforms/sketches/estimators.py), so
``expected_active_registers(reach)`` recovers it -- in the exact testing mode, the exact count of
each scope. The bound is the plan's own: the job states one reach measure per scope (its
sensitivity from transforms/sketches/dp.py), and a person changes at most all of them, each by
its stated Linf (doubled under substitution, where the job states it so; a replaced person
still moves a reach by 1 at most). The neighbours put a person in up to three publishers at
once, under both relations the job offers; a sketch whose
registers depended on the publisher (a person landing in another register at each publisher)
keeps every publisher's reach within 1 and moves the union by one per publisher -- seen here
only (the mutant publisher-dependent-fingerprints).

The frequency histogram cannot be read back (the release holds its normalised distribution
only); the DP tester and the composition tests check its noise
(tests/transforms/sketches/test_sketches_dp.py).
"""
from __future__ import annotations

import numpy as np
import pytest
from audit_kit import AdaptedJob, JobAudit, audit_job, rows_as_csv

from accounting.verification.audit import Bound, Change, Table, TableRule, Units, synthetic_dataset
from pipelines.reach_frequency import job as reach_frequency
from transforms.sketches.estimators import expected_active_registers
from transforms.sketches.fingerprint import FingerprintSalt
from transforms.sketches.liquid_legions import LiquidLegionsSketch, SketchConfig

PUBLISHERS = ["pub_a", "pub_b", "pub_c", "pub_d"]
SKETCH = SketchConfig(num_registers=500)
ACTIVE = "active_registers"
OUTPUT = "*/reach_frequency.jsonl"


def with_active_registers(name: str, table: Table) -> Table:
    """The released table with each scope's active-register count read back from its reach."""
    if not name.endswith("reach_frequency.jsonl"):
        return table
    i = table.index("reach")
    rows = [(*row, int(round(float(expected_active_registers(row[i], SKETCH))))) for row in table.rows]
    return Table(columns=(*table.columns, ACTIVE), rows=rows, types=None)


def job(relation="add_remove"):
    def request(files, options):
        return reach_frequency.ReachFrequencyRequest(
            input=tuple(files["impressions"]), campaigns=("c1",), publishers=tuple(PUBLISHERS),
            epsilon=1.0, num_registers=SKETCH.num_registers, decay_rate=SKETCH.decay_rate,
            max_frequency=3, neighbouring=relation, options=options)
    return AdaptedJob(module=reach_frequency, write=rows_as_csv("impressions", ["publisher", "campaign", "vid"]),
                      request=request, adapt=with_active_registers)


UNITS = Units(column="vid", keys=("publisher",), public_keys=PUBLISHERS, heavy_keys=3, heavy_rows=3,
              row=lambda r: {**r, "campaign": "c1"})
#: The neighbours of each relation: a person added at three publishers (heavy, spread, under
#: three id types), at the one without rows, alone at a publisher; removed from two publishers,
#: or from one; replaced by a person at three publishers (spread, three id types) or at the one
#: without rows.
CHANGES = {"add_remove": (Change.ADD_HEAVY, Change.ADD_SPREAD, Change.ADD_MIXED_IDS,
                          Change.ADD_EMPTY_KEY, Change.REMOVE_HEAVY, Change.REMOVE_LONE,
                          Change.REBATCH),
           "substitute": (Change.SUBSTITUTE_SPREAD, Change.SUBSTITUTE_MIXED_IDS,
                          Change.SUBSTITUTE_EMPTY_KEY)}


def dataset():
    """Units at one or two of pub_a and pub_b, one alone at pub_c, pub_d without rows."""
    return synthetic_dataset(UNITS, seed=17, n_units=9, batches=2)


def reach_bound(planned) -> Bound:
    """What one person may move, from the plan: every scope's reach measure, each by its Linf."""
    reach = [m.sensitivities for p in planned for m in p.measures if m.name.endswith("/reach")]
    assert len(reach) == len(PUBLISHERS) + 1
    return Bound(l0=sum(int(s.l0) for s in reach), linf=max(float(s.linf) for s in reach),
                 l1=sum(float(s.l1) for s in reach))


@pytest.mark.parametrize("relation", ["add_remove", "substitute"])
def test_reach_frequency_audit_at_several_publishers_per_person(relation):
    data, audited = dataset(), job(relation)
    bound = reach_bound(audited.planned(data))
    assert bound.l0 > 1 and bound.linf == {"add_remove": 1.0, "substitute": 2.0}[relation]
    publishers_of = {}
    for r in data.rows():
        publishers_of.setdefault(r["vid"], set()).add(r["publisher"])
    assert max(map(len, publishers_of.values())) == 2   # the data has people at two publishers
    entry = JobAudit(
        name=f"reach_frequency/several_publishers/{relation}", job=audited, units=UNITS,
        datasets=lambda: [data], relation=relation,
        tables={OUTPUT: TableRule(
            keys=("scope", "publisher"), noisy=("reach", "frequency", "k_reach", "k_plus_reach", ACTIVE),
            bounds={ACTIVE: bound}, tolerance=1e-6,
            public_keys=[("publisher", p) for p in PUBLISHERS] + [("union", None)])},
        changes=CHANGES[relation], noisy_changes=())
    result = audit_job(entry)
    result.assert_ok()
    assert len(result.pairs) == len(CHANGES[relation])


def test_the_read_back_counts_are_the_sketches_active_registers():
    """The adapter recovers each scope's exact active-register count: the counts of sketches
    built here from the dataset's ids under the campaign's salt (shared by its publishers)."""
    data = dataset()
    released = job()(data, seed=1, exact=True).tables
    (table,) = [t for name, t in released.items() if name.endswith("reach_frequency.jsonl")]
    salt = FingerprintSalt.for_campaign("c1", b"")
    rows = data.rows()

    def active(vids):
        ids = np.array(sorted({int(v) for v in vids}), dtype=np.int64)
        return LiquidLegionsSketch.from_ids(SKETCH, salt, ids).active_registers() if ids.size else 0

    expected = {("union", None): active(r["vid"] for r in rows)}
    expected.update({("publisher", p): active(r["vid"] for r in rows if r["publisher"] == p)
                     for p in PUBLISHERS})
    got = {(r["scope"], r["publisher"]): r[ACTIVE] for r in table.records()}
    assert got == expected
