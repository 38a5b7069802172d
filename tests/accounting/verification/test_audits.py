"""Neighbouring-pair audits of every transform and job (issue 10), and the broken variants they
must catch.

Each registered audit (tests/audit_kit.py) runs the real code on small datasets and their
adversarial neighbours, exact and noisy testing modes, and -- for jobs that threshold or select
keys -- samples the released/suppressed indicators over many seeds (issue 30). Then each of
issue 10's points 1, 2, 4, 5 and 6, and issue 30's thresholds on exact values, is re-introduced
here only (monkeypatching the library in this process: the in-process engine runs the patched
code) and the audit, or the refusal / key-reuse check, must fail on it.
"""
from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from audit_kit import REGISTRY, audit_job, exact_aggregate_job_type

from accounting.verification.audit import Change, Table, repeated_noise
from accounting.budget import PrivacyBudget
from accounting.keys import KeyReuseError, ReleaseKey
from accounting.sensitivity import ContributionBounds
from transforms.metrics import Count, PrivacyUnitCount
from transforms.selection import PrivateSelection


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if REGISTRY[n].slow else n
                                  for n in sorted(REGISTRY)])
def test_registered_audit_passes_on_the_real_code(name):
    """Every registered audit (tests/audit_kit.py; tests/test_layout.py checks that every job
    under pipelines/ has one)."""
    result = audit_job(name)
    result.assert_ok()
    assert result.pairs and result.runs >= 3


def test_every_planned_measure_is_noised_for_the_sensitivities_it_states():
    """The audits check each job's exact outputs against the sensitivities its Measures state;
    the noise each Measure adds must be calibrated for at least those: the L1 norm (Laplace
    kinds) or the L2 norm (Gaussian kinds) of what one unit moves, at the scale that norm and
    the charged epsilon give. A calibration from a smaller figure (one row for one user's clicks,
    half a block of impressions) passes every audit and leaks."""
    from audit_kit import ReleaseLayerJob

    checked = set()
    for name, entry in sorted(REGISTRY.items()):
        if not isinstance(entry.job, ReleaseLayerJob):
            continue
        for planned in entry.job.planned(entry.datasets()[0]):
            for measure in planned.measures:
                noise, stated = measure.noise, measure.sensitivities
                if noise is None:
                    continue        # local randomizers: the DP tester's tests of each oracle
                if noise.kind.is_gaussian:
                    assert noise.l2_sensitivity >= stated.l2 * (1 - 1e-12), (name, measure.name)
                else:
                    assert noise.l1_sensitivity >= stated.l1 * (1 - 1e-12), (name, measure.name)
                    assert noise.l1_sensitivity / noise.scale <= noise.epsilon * (1 + 1e-9), (name, measure.name)
                checked.add(name)
    assert {"centralnotice", "reach_frequency", "summary_reports", "masked_lark_train"} <= checked


# --------------------------------------------------------------------------------------------
# Broken variants (issue 10's points), each re-introduced in this test only
# --------------------------------------------------------------------------------------------

def _fails(result, *checks):
    assert not result.passed, "the audit passed on a broken variant"
    assert result.checks_failed() & set(checks), str(result)


def test_point1_output_order_showing_which_keys_had_data(monkeypatch):
    """The join's order (keys with rows first) instead of the sorted public order."""
    import transforms.release as release

    monkeypatch.setattr(release, "sorted_by_keys", lambda table, keys: table)
    result = audit_job("dp_aggregate/keyset", changes=[Change.ADD_EMPTY_KEY])
    _fails(result, "order")


def test_point2_unit_ids_of_three_types_as_three_units(monkeypatch):
    """A type-tagged id encoding: 7, 7.0 and "7" are bounded as three units."""
    import transforms.bounding_stage as stage

    canonical = stage.canonical_unit_dictionary

    def tagged(column, name="privacy unit"):
        ids = canonical(column, name).dictionary_decode().to_pylist()
        return pa.array([None if v is None else f"{column.type}:{v}" for v in ids],
                        pa.string()).dictionary_encode()

    monkeypatch.setattr(stage, "canonical_unit_dictionary", tagged)
    result = audit_job("dp_aggregate/keyset", changes=[Change.ADD_MIXED_IDS])
    _fails(result, "sensitivity linf", "sensitivity l1", "sensitivity l0")


def test_point2_in_a_job_through_the_release_layer(monkeypatch):
    """CentralNotice user-DP clicks with ids taken as written ("7", "7.0", " 7" three users)."""
    import transforms.bounding_stage as stage

    monkeypatch.setattr(stage, "canonical_unit_dictionary",
                        lambda column, name="privacy unit":
                        pa.compute.cast(column, pa.string()).dictionary_encode())
    result = audit_job("centralnotice", changes=[Change.ADD_MIXED_IDS])
    _fails(result, "sensitivity l1", "sensitivity linf")


def test_point5_batch_position_row_priority(monkeypatch):
    """Row priorities that mix the row's position in its batch: the same rows in other batches
    keep other rows when a bound binds (REBATCH must change nothing)."""
    import transforms.bounding as bounding

    prioritize = bounding.prioritize

    def positional(table, *args, **kwargs):
        out = prioritize(table, *args, **kwargs)
        i = out.schema.get_field_index(bounding.ROW)
        position = np.arange(out.num_rows, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        words = out.column(i).to_numpy() ^ position
        return out.set_column(i, bounding.ROW, pa.array(words))

    monkeypatch.setattr(bounding, "prioritize", positional)
    result = audit_job("dp_aggregate/keyset", changes=[Change.REBATCH])
    _fails(result, "unchanged")


def _selection_aggregate(metrics):
    from transforms.aggregate import Compute, DPAggregate, Keys, Output

    return DPAggregate(
        compute=Compute(metrics=metrics),
        keys=Keys(privacy_unit="u", columns=["k"], selection=PrivateSelection()),
        bounds=ContributionBounds(max_partitions=1, max_contributions_per_partition=1),
        budget=PrivacyBudget(epsilon=1.0, delta=1e-5))


def spend_findings(make) -> list[str]:
    """The refusal check of a DPAggregate configuration: refused, or its stated spend (measures
    and key selection) within the declared budget, with no measure on the selection's stream."""
    from transforms.release import SELECTION_PURPOSE

    try:
        transform = make()
    except ValueError:
        return []   # refused before anything runs
    found = []
    spent, budget = transform.guarantee(), transform.plan.budget
    if spent.epsilon > budget.epsilon * (1 + 1e-9) or spent.delta > budget.delta * (1 + 1e-9) + 1e-15:
        found.append(f"spends {spent} beyond the declared {budget}")
    if SELECTION_PURPOSE in transform.measures:
        found.append(f"a measure named {SELECTION_PURPOSE!r} shares key selection's stream")
    return found


def test_point6_a_metric_named_key_selection(monkeypatch):
    # a measure of its own (counts share one noisy count: transforms.moments)
    make = lambda: _selection_aggregate([Count(), PrivacyUnitCount(name="key_selection")])  # noqa: E731
    assert spend_findings(make) == []                       # the real code refuses it
    assert spend_findings(lambda: _selection_aggregate([Count()])) == []
    import transforms.metrics as metrics

    # The old code: no reserved names and no budget check covering selection.
    monkeypatch.setattr(metrics, "check_metric_name", lambda column: column)
    monkeypatch.setattr(metrics, "check_within_budget", lambda plan, selection: None)
    assert spend_findings(make), "the refusal check passed on a broken variant"


# ---- point 4: one key applied to two inputs ----------------------------------------------

DAY1 = [{"user": u, "k": k} for u in range(1, 13) for k in ("a", "b", "c") if (u + ord(k)) % 3]
DAY2 = DAY1 + [{"user": 99, "k": "b"}]          # one added user


def _two_days(make, same_instance: bool):
    """Two inputs through one pipeline; ``make()`` builds a DPAggregate (one instance for both
    when ``same_instance``). Returns the two released tables (audit.Table)."""
    from aggregate_kit import run_and_collect

    first = make()
    second = first if same_instance else make()

    def build(p):
        tagged = []
        for day, (rows, transform) in enumerate(((DAY1, first), (DAY2, second))):
            tagged.append(p | f"Day{day}" >> beam.Create([pa.Table.from_pylist(rows)], reshuffle=False)
                          | f"Aggregate{day}" >> transform
                          | f"Tag{day}" >> beam.Map(lambda t, d=day: t.append_column(
                              "day", pa.array([d] * t.num_rows, pa.int64()))))
        return tagged | beam.Flatten()

    table = pa.concat_tables(run_and_collect(build))
    out = []
    for day in (0, 1):
        part = table.filter(pa.compute.equal(table.column("day"), day)).drop_columns(["day"])
        out.append(Table.from_arrow(part.sort_by("k")))
    return out


def key_reuse_findings(make_noisy, make_exact) -> list[str]:
    """Apply one transform instance (holding one key) to two inputs: it must be refused, or the
    two releases must not carry the same noise."""
    try:
        noisy = _two_days(make_noisy, same_instance=True)
    except KeyReuseError:
        return []
    exact = _two_days(make_exact, same_instance=False)
    return repeated_noise(*noisy, *exact, keys=["k"], columns=["count"])


def test_point4_one_key_applied_to_two_inputs(monkeypatch):
    from transforms.aggregate import Compute, DPAggregate, Keys, Output
    from transforms.keyset import PublicKeyset

    keyset = PublicKeyset.from_keys(["a", "b", "c"], ["k"])

    def make(exact=False):
        key = ReleaseKey.for_testing(4)
        return lambda: DPAggregate(
            compute=Compute(metrics=[Count()]),
            keys=Keys(privacy_unit="user", columns=["k"], keyset=keyset),
            output=Output(num_shards=1),
            bounds=ContributionBounds(max_partitions=1, max_contributions_per_partition=1),
            budget=PrivacyBudget(epsilon=1.0),
            release_key=key if not exact else None,
            testing=exact)

    assert key_reuse_findings(make(), make(exact=True)) == []   # the real code refuses
    # The old code: a key drives the same streams any number of times.
    monkeypatch.setattr(ReleaseKey, "claim", lambda self, purpose, owner="a transform": None)
    findings = key_reuse_findings(make(), make(exact=True))
    assert findings and "noise-free" in findings[0]


def test_exact_aggregate_job_uses_a_noise_free_key():
    job_type = exact_aggregate_job_type()
    from transforms.metrics import Count as C

    job = job_type(metrics=[C()], bounds=ContributionBounds(max_partitions=1, max_contributions_per_partition=1),
                   budget=PrivacyBudget(epsilon=1.0, delta=1e-3), selection=PrivateSelection())
    assert job.transform(ReleaseKey.for_testing(1), True).release_key.noise_free
    assert not job.transform(ReleaseKey.for_testing(1), False).release_key.noise_free


def test_label_randomness_keyed_by_batch_position_is_caught(monkeypatch):
    """label_dp with each label's draw keyed by its row's position in the batch instead of its
    example id: the same examples in other batches get other labels (REBATCH), and a changed
    label no longer stays on its example only when rows move."""
    import transforms.ldp.beam as ldp_beam

    real = ldp_beam.randomize_label_table

    def positional(randomizer, table, *, label_column, id_column, source, unbiased_column=None):
        index = table.column_names.index(id_column)
        ids = table.column(index)
        moved = table.set_column(index, id_column, pa.array(range(table.num_rows), pa.int64()))
        out, undeclared = real(randomizer, moved, label_column=label_column, id_column=id_column,
                               source=source, unbiased_column=unbiased_column)
        return out.set_column(out.column_names.index(id_column), id_column, ids), undeclared

    monkeypatch.setattr(ldp_beam, "randomize_label_table", positional)
    _fails(audit_job("label_dp", changes=[Change.REBATCH]), "unchanged")


def test_lark_browser_without_clipping_is_caught(monkeypatch):
    """Masked LARk browsers that share a value beyond [lower, upper] unclipped: the helpers cannot
    see it (shares are uniform), and the decoded sum moves by more than the helpers' stated
    sensitivity U - L (the combine audit's exact check)."""
    import transforms.lark.browser as browser

    class NoClip:
        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def clip(values, lower, upper):
            return values

    monkeypatch.setattr(browser, "np", NoClip())
    _fails(audit_job("masked_lark_combine", changes=[Change.REPLACE_VALUES]),
           "sensitivity linf", "sensitivity l1")


@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_vector_sum_without_clipping_is_caught(monkeypatch, norm):
    """Vector sums whose rows are not clipped to max_norm: a unit's far-out vectors move a
    coordinate by more than the stated sensitivity (the exact mode's bound check)."""
    import transforms.bounding_stage as stage

    monkeypatch.setattr(stage, "clip", lambda matrix, max_norm, norm: matrix)
    _fails(audit_job(f"dp_aggregate/keyset/vector_sum_{norm}", changes=[Change.ADD_HEAVY]),
           "sensitivity linf", "sensitivity l1")


# ---- issue 30: thresholds and selection decided on exact values ----------------------------

# The registered audits run the sampled indicators on the real code in make test; these broken
# variants (the mutation suite's exact-value-threshold and exact-value-selection) rerun them.
@pytest.mark.slow
@pytest.mark.parametrize("name", ["dp_aggregate/keyset/thresholds", "centralnotice/thresholds"])
def test_a_threshold_on_the_exact_value_is_caught_by_the_sampled_indicators(monkeypatch, name):
    """Release thresholds compared against the exact value, released values noisy (the classic
    leak; key mode in DPAggregate, value mode in CentralNotice): the lone unit's key is released
    (or its clicks are) on every seed with the unit and on none without it. The exact and noisy
    checks cannot see it -- in the testing mode exact equals noisy, and a threshold may move
    keys -- the sampled released/suppressed indicators can."""
    import transforms.release as release
    from aggregate_kit import thresholds_on_exact_values

    monkeypatch.setattr(release._NoiseAndRelease, "_release",
                        thresholds_on_exact_values(release._NoiseAndRelease._release))
    result = audit_job(name, changes=[Change.REMOVE_LONE])
    assert result.checks_failed() == {"released indicator"}, str(result)
    assert all(v.mode == "indicators" for v in result.violations)


@pytest.mark.slow
def test_private_selection_on_the_exact_count_is_caught_by_the_sampled_indicators(monkeypatch):
    """Laplace-thresholding selection that compares the exact unit count with its threshold:
    the key at the threshold is kept on every seed once one unit joins it, on none before."""
    import transforms.selection as selection

    monkeypatch.setattr(selection, "add_noise", lambda spec, values, streams: np.asarray(values))
    result = audit_job("dp_aggregate/selection/thresholds", changes=[Change.ADD_HEAVY])
    assert result.checks_failed() == {"released indicator"}, str(result)


def test_choose_bounds_counting_unit_key_pairs_as_units_is_caught(monkeypatch):
    """choose_bounds whose statistics count one entry per (unit, key) pair instead of one per
    unit: a unit in many keys moves the candidates' utilities by more than their sensitivity 1."""
    import pyarrow.compute as pc

    import transforms.utility as utility

    real = utility.bound_statistics

    def per_pair(data, *, privacy_unit, keys):
        table = data.append_column("pair", pc.binary_join_element_wise(
            pc.cast(data.column(privacy_unit), pa.string()), *[pc.cast(data.column(k), pa.string())
                                                               for k in keys], "/"))
        return real(table, privacy_unit="pair", keys=keys)

    monkeypatch.setattr(utility, "bound_statistics", per_pair)
    _fails(audit_job("dp_aggregate/choose_bounds", changes=[Change.ADD_HEAVY]),
           "sensitivity linf", "sensitivity l1")
