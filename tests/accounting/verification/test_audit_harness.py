"""The neighbouring-pair audit harness itself (accounting/verification/audit.py, no Beam) and the exact
(noise-free) testing mode it runs jobs in, which no real release may use."""
from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

from accounting.verification import audit as A
from accounting.calibration import calibrate
from accounting.keys import ReleaseKey
from transforms.noise import RandomStreams, add_noise

KEYS = ["a", "b", "c", "d"]
UNITS = A.Units(column="u", keys=("k",), public_keys=KEYS, fresh_keys=["z"],
                values={"v": [1.0, 50.0]}, heavy_keys=2, heavy_rows=3)


def _count_job(*, linf=2, l0=2, order=sorted, tagged_ids=False, positional=False, noise=None):
    """A tiny pure-Python 'release': per public key, a unit's rows counted after bounding (its
    ``l0`` smallest keys, ``linf`` rows per key; ids canonicalised unless ``tagged_ids``; rows
    chosen by content, or by their batch position when ``positional`` -- then the sum of the
    kept values is released), in ``order``; ``noise(seed, key)`` is added when not exact."""
    def job(dataset, seed, exact):
        rows = []
        for batch in dataset.batches:
            listed = list(batch) if positional else sorted(batch, key=lambda r: (str(r["k"]), r["v"]))
            rows.extend(r for r in listed if r["k"] in KEYS)
        unit_of = (lambda r: (type(r["u"]).__name__, r["u"])) if tagged_ids else (lambda r: A._id_text(r["u"]))
        keys_of = {}
        for r in rows:
            keys_of.setdefault(unit_of(r), set()).add(r["k"])
        counts, per_pair = {k: 0 for k in KEYS}, {}
        for r in rows:
            unit = unit_of(r)
            if r["k"] not in sorted(keys_of[unit])[:l0] or per_pair.get((unit, r["k"]), 0) >= linf:
                continue
            per_pair[(unit, r["k"])] = per_pair.get((unit, r["k"]), 0) + 1
            counts[r["k"]] += min(r["v"], 2) if positional else 1
        keys = order(counts, key=str)
        out = [(k, counts[k] + (0 if exact or noise is None else noise(seed, k))) for k in keys]
        return A.Release(tables={"t": A.Table(columns=["k", "n"], rows=out, types=["string", "int64"])},
                         files=["t.csv"], reports={"meta": {"rows": len(out), "note": "fixed"}})
    return job


def _spec(job, **rule):
    return A.AuditSpec(job=job, units=UNITS, reports={"meta": A.ReportRule()},
                       tables={"t": A.TableRule(keys="k", noisy="n", public_keys=KEYS,
                                                bounds={"n": A.Bound(l0=2, linf=2)}, **rule)})


def _data(seed=0):
    # "c" is the public key without rows (in the middle of the public order)
    return A.synthetic_dataset(UNITS, seed=seed, n_units=6, batches=3, keys=["a", "b", "d", "c"])


def test_neighbours_are_what_they_say():
    data = _data()
    rows = data.rows()
    by = {n.change: n.dataset for n in A.build_neighbours(data, UNITS, list(A.Change))}
    assert set(by) == set(A.Change)
    rebatched = by[A.Change.REBATCH]
    assert sorted(map(repr, rebatched.rows())) == sorted(map(repr, rows))
    assert [len(b) for b in rebatched.batches] != [len(b) for b in data.batches] or \
        rebatched.rows() != rows
    mixed = by[A.Change.ADD_MIXED_IDS].rows()[len(rows):]
    assert {type(r["u"]) for r in mixed} == {int, float, str}
    assert len({A._id_text(r["u"]) for r in mixed}) == 1
    empty = by[A.Change.ADD_EMPTY_KEY].rows()[len(rows):]
    assert {r["k"] for r in empty} == {"c"}   # the public key without rows
    assert {r["k"] for r in by[A.Change.ADD_ALONE].rows()[len(rows):]} == {"z"}
    spread = by[A.Change.ADD_SPREAD]
    new = max(A._id_text(r["u"]) for r in spread.rows())
    assert all(any(A._id_text(r["u"]) == new for r in b) for b in spread.batches)
    removed = by[A.Change.REMOVE_HEAVY].rows()
    assert len({A._id_text(r["u"]) for r in removed}) == len({A._id_text(r["u"]) for r in rows}) - 1
    substituted = by[A.Change.SUBSTITUTE_EMPTY_KEY].rows()
    assert len({A._id_text(r["u"]) for r in substituted}) == len({A._id_text(r["u"]) for r in rows})
    replaced = by[A.Change.REPLACE_VALUES]   # the same units, ids, keys and batches; one unit's values
    assert [len(b) for b in replaced.batches] == [len(b) for b in data.batches]
    changed = [(a, b) for a, b in zip(rows, replaced.rows()) if a != b]
    assert changed and len({A._id_text(a["u"]) for a, _ in changed}) == 1
    assert all(a["u"] == b["u"] and a["k"] == b["k"] and a["v"] != b["v"] for a, b in changed)


def test_a_sound_release_passes_exact_and_noisy():
    noise = lambda seed, k: (seed * 7 + ord(k)) % 5 - 2   # noqa: E731 (keyed by seed and key)
    result = A.audit(_spec(_count_job(noise=noise)), [_data(0), _data(1)])
    result.assert_ok()
    assert result.runs == 2 * 2 * (1 + len(A.ADD_REMOVE_CHANGES))


@pytest.mark.parametrize("broken, change, check", [
    (dict(order=lambda counts, key: sorted(counts, key=lambda k: (counts[k] == 0, k))),
     A.Change.ADD_EMPTY_KEY, "order"),
    (dict(tagged_ids=True), A.Change.ADD_MIXED_IDS, "sensitivity linf"),
    (dict(linf=5), A.Change.ADD_HEAVY, "sensitivity linf"),
    (dict(l0=3), A.Change.ADD_HEAVY, "sensitivity l0"),
    (dict(positional=True), A.Change.REBATCH, "unchanged"),
])
def test_broken_releases_fail(broken, change, check):
    spec = _spec(_count_job(**broken))
    result = A.audit(spec, [_data()], changes=[change])
    assert check in result.checks_failed(), str(result)
    with pytest.raises(A.AuditFailure):
        result.assert_ok()


def test_structural_checks():
    def released(rows, files=("t.csv",), note="fixed", types=("string", "int64")):
        return A.Release(tables={"t": A.Table(columns=["k", "n"], rows=rows, types=types)},
                         files=files, reports={"meta": {"note": note}})

    spec = _spec(lambda d, s, e: None)
    base = released([(k, 1) for k in KEYS])
    assert A.compare(spec, base, released([(k, 2) for k in KEYS]), exact=False) == []
    checks = lambda other, **kw: {c for c, _ in A.compare(spec, base, other, **kw)}  # noqa: E731
    assert "key set" in checks(released([(k, 1) for k in KEYS[:3]]), exact=False)
    assert "key outside the keyset" in checks(released([(k, 1) for k in KEYS + ["zz"]]), exact=False)
    assert "duplicate keys" in checks(released([(k, 1) for k in KEYS + ["a"]]), exact=False)
    assert "files" in checks(released([(k, 1) for k in KEYS], files=("t.csv", "extra.csv")), exact=False)
    assert "report text" in checks(released([(k, 1) for k in KEYS], note="3 rows dropped"), exact=False)
    assert "schema" in checks(released([(k, 1) for k in KEYS], types=("string", "double")), exact=False)
    assert "outcome" in {c for c, _ in A.compare(spec, base, A._Failed(error="ValueError: x"), exact=False)}
    moved = released([("a", 4), ("b", 4), ("c", 4), ("d", 1)])
    assert {"sensitivity l0", "sensitivity linf", "sensitivity l1", "changed keys"} <= checks(moved, exact=True)
    assert checks(moved, exact=False) == set()   # noisy mode: values are noisy
    masked = A.ReportRule(noisy_fields=("outputs.*.sha256",), noisy_patterns=(r"\d+ keys",))
    assert masked.mask({"outputs": {"f": {"sha256": "x", "rows": 3}}, "t": "9 keys out"}) == \
        {"outputs": {"f": {"sha256": A.NOISY, "rows": 3}}, "t": f"{A.NOISY} out"}


def test_rules_match_names_by_pattern_and_undeclared_outputs_fail():
    spec = A.AuditSpec(job=lambda d, s, e: None, units=UNITS,
                       tables={"*/t.csv": A.TableRule(keys="k", noisy="n")})
    assert spec.table_rule("rel/2026/t.csv") is not None and spec.table_rule("t2.csv") is None
    extra = A.Release(tables={"rel/t.csv": A.Table(columns=["k", "n"], rows=[]),
                              "other.csv": A.Table(columns=["k"], rows=[])})
    assert "undeclared table" in {c for c, _ in A.compare(spec, extra, extra, exact=False)}


def test_a_job_releasing_nothing_declared_is_not_audited():
    spec = _spec(lambda d, s, e: A.Release(tables={}))
    with pytest.raises(RuntimeError, match="nothing to audit"):
        A.audit(spec, [_data()])


def test_repeated_noise():
    def table(values):
        return A.Table(columns=["k", "n"], rows=list(zip(KEYS, values)))

    exact_a, exact_b = table([3, 4, 0, 1]), table([3, 5, 0, 1])
    same = A.repeated_noise(table([5, 3, 1, 1]), table([5, 4, 1, 1]), exact_a, exact_b,
                            keys="k", columns="n")
    assert same and "noise-free" in same[0]
    assert A.repeated_noise(table([5, 3, 1, 1]), table([2, 7, 0, 3]), exact_a, exact_b,
                            keys="k", columns="n") == []
    # the same input twice (a re-run) reproduces its noise: not a finding
    assert A.repeated_noise(table([5, 3, 1, 1]), table([5, 3, 1, 1]), exact_a, exact_a,
                            keys="k", columns="n") == []


# --------------------------------------------------------------------------------------------
# Released/suppressed indicators, sampled over seeds (issue 30)
# --------------------------------------------------------------------------------------------

def _threshold_job(*, on_exact=False, epsilon=0.5, threshold=0.5, mode="key"):
    """Per public key, its number of units (each unit in its 2 smallest keys: L0 = 2, L1 = 2)
    plus Laplace(L1 / epsilon) noise keyed by (seed, key); a key (``mode="key"``) or its value
    (``mode="value"``, null) is suppressed when the noisy count -- or, ``on_exact``, the exact
    count -- is not above ``threshold``. The exact mode adds no noise."""
    def job(dataset, seed, exact):
        keys_of = {}
        for r in dataset.rows():
            if r["k"] in KEYS:
                keys_of.setdefault(A._id_text(r["u"]), set()).add(r["k"])
        counts = {k: 0 for k in KEYS}
        for keys in keys_of.values():
            for k in sorted(keys)[:2]:
                counts[k] += 1
        rows = []
        for k in KEYS:
            noise = 0.0 if exact else np.random.default_rng([seed, ord(k)]).laplace(0.0, 2 / epsilon)
            decided = counts[k] if on_exact else counts[k] + noise
            if decided > threshold:
                rows.append((k, counts[k] + noise))
            elif mode == "value":
                rows.append((k, None))
        return A.Release(tables={"t": A.Table(columns=["k", "n"], rows=rows)})
    return job


def _threshold_spec(job, mode="key", **kwargs):
    rule = A.TableRule(keys="k", noisy="n", public_keys=KEYS, keys_private=mode == "key",
                       thresholded=("n",) if mode == "value" else (),
                       indicator_claim=(0.5, 0.0), bounds={"n": A.Bound(l0=2, linf=1)})
    return A.AuditSpec(job=job, units=UNITS, tables={"t": rule},
                       indicator_changes=(A.Change.REMOVE_LONE,), **kwargs)


@pytest.mark.parametrize("mode", ["key", "value"])
def test_a_threshold_on_the_exact_value_fails_the_indicator_check(mode):
    """The lone unit's key holds one unit in D and none in D': with the threshold compared
    against the exact count, that key (or its value) is released on every seed of D and on none
    of D'. The structural and exact checks pass it (in the testing mode exact equals noisy, and
    keys may come and go under a threshold); the sampled indicators do not."""
    changes = [A.Change.REMOVE_LONE, A.Change.ADD_HEAVY, A.Change.REBATCH]
    sound = A.audit(_threshold_spec(_threshold_job(mode=mode), mode), [_data()], changes=changes)
    sound.assert_ok()
    broken = _threshold_spec(_threshold_job(mode=mode, on_exact=True), mode)
    assert A.audit(dataclasses.replace(broken, modes=("exact", "noisy")), [_data()], changes=changes).passed
    result = A.audit(broken, [_data()], changes=changes)
    assert result.checks_failed() == {"released indicator"}, str(result)
    ((violation,),) = [[v for v in result.violations]]
    assert violation.mode == "indicators" and violation.change is A.Change.REMOVE_LONE
    label = "released[d]" if mode == "key" else "n[d] released"
    n = (result.runs - 2 * 4) // 2           # exact and noisy: D and 3 neighbours each
    assert label in violation.detail and f"({n}/{n})" in violation.detail and f"(0/{n})" in violation.detail
    assert result.runs == sound.runs


def test_indicator_runs_default_to_the_least_that_catch_a_deterministic_indicator():
    from accounting.verification.dp_tester import indicator_runs_needed

    spec = _threshold_spec(_threshold_job(), indicator_runs=None)
    result = A.audit(dataclasses.replace(spec, modes=("indicators",)), [_data()])
    # 1 + 4 keys indicators, the audit's whole false-failure budget on its one check
    n = indicator_runs_needed(epsilon=0.5, indicators=5, confidence=0.999)
    assert result.runs == 2 * n and result.pairs == (("synthetic(seed=0)", A.Change.REMOVE_LONE),)
    broken = dataclasses.replace(spec, job=_threshold_job(on_exact=True), modes=("indicators",))
    assert not A.audit(broken, [_data()]).passed
    # one run fewer per side, and the same deterministic indicator is within the claim's bounds
    fewer = dataclasses.replace(broken, indicator_runs=n - 1)
    assert A.audit(fewer, [_data()]).passed


def test_indicator_check_declarations():
    with pytest.raises(ValueError, match="indicator_claim"):
        A.AuditSpec(job=lambda d, s, e: None, units=UNITS, tables={"t": A.TableRule(keys="k")},
                    indicator_changes=(A.Change.REMOVE_LONE,))
    with pytest.raises(ValueError, match="declared noisy"):
        A.TableRule(keys="k", noisy="n", thresholded=("m",))
    from accounting.budget import PrivacyBudget
    from accounting.composition import EpsDelta

    rule = A.TableRule(keys="k", noisy="n", indicator_claim=(1.0, 1e-6))
    assert rule.indicator_claim == EpsDelta(1.0, 1e-6)
    budget = A.TableRule(keys="k", noisy="n", indicator_claim=PrivacyBudget(epsilon=2.0, delta=1e-9))
    assert budget.indicator_claim == EpsDelta(2.0, 1e-9)


# --------------------------------------------------------------------------------------------
# The exact testing mode: noise-free, and never a release
# --------------------------------------------------------------------------------------------

def test_exact_testing_key_adds_no_noise_and_stays_a_testing_key():
    key = ReleaseKey.for_exact_testing(3)
    assert key.is_testing and key.noise_free and key != ReleaseKey.for_testing(3)
    assert key.derive("x").noise_free and pickle.loads(pickle.dumps(key)).noise_free
    assert not pickle.loads(pickle.dumps(ReleaseKey.for_testing(3))).noise_free
    values = np.array([3, 0, 7], dtype=np.int64)
    spec = calibrate("discrete_laplace", epsilon=0.1, l1_sensitivity=1)
    exact = add_noise(spec, values, RandomStreams.for_range(key, "m", 3))
    assert exact.tolist() == [3, 0, 7]
    noisy = add_noise(spec, np.zeros(200, np.int64), RandomStreams.for_range(ReleaseKey.for_testing(3), "m", 200))
    assert np.any(noisy != 0)
    with pytest.raises(ValueError, match="only a testing key"):
        ReleaseKey(b"\0" * 32, noise_free=True)
    with pytest.raises(ValueError):
        key.save("/nonexistent/never-written")


def test_a_real_release_refuses_the_exact_mode(tmp_path):
    from pipelines.ara import summary_reports
    from pipelines.release import ReleaseOptions, ReleaseRefused

    with pytest.raises(ReleaseRefused, match="exact_testing"):
        ReleaseOptions(output=str(tmp_path), ledger=str(tmp_path / "l.json"),
                       key_store=str(tmp_path / "k"), exact_testing=True)
    with pytest.raises(ReleaseRefused):
        ReleaseOptions(output=str(tmp_path), exact_testing=True)
    assert ReleaseOptions(output=str(tmp_path), testing_seed=1, exact_testing=True).testing
    # no CLI flag reaches it
    from pipelines.release.cli import build_parser, parse_request

    with pytest.raises(ReleaseRefused, match="unknown flag --exact_testing"):
        parse_request(summary_reports.JOB, [
            "--input", "x.jsonl", "--epsilon", "1", "--batch_id", "b", "--output", str(tmp_path),
            "--testing_seed", "1", "--exact_testing"])
    assert "exact_testing" not in build_parser(summary_reports.JOB)[0].format_help()
    fields = {f.name: f for f in dataclasses.fields(ReleaseOptions)}
    assert fields["exact_testing"].metadata["cli"] is False


def test_selection_is_deterministic_and_monotone_under_the_exact_key():
    from accounting.sensitivity import ContributionBounds
    from transforms.selection import PrivateSelection, SelectionStrategy, Selector

    counts = np.arange(0, 60, dtype=np.int64)
    for strategy in SelectionStrategy:
        selector = Selector.for_bounds(PrivateSelection(strategy=strategy), 2.0, 1e-3,
                                       ContributionBounds(max_partitions=2, max_contributions_per_partition=1))
        keep = [selector.keep(counts, RandomStreams.for_range(ReleaseKey.for_exact_testing(s), "sel", 60))
                for s in (1, 2)]
        assert keep[0].tolist() == keep[1].tolist(), strategy        # no randomness
        assert not keep[0][0] and keep[0][-1], strategy               # 0 units never, many always
        assert np.all(np.diff(keep[0].astype(int)) >= 0), strategy    # monotone in the count


# ---- L0 > 1 (issue 40.7): a change that moves several keys at once ----------------------------

WIDE_UNITS = A.Units(column="u", keys=("k",), public_keys=KEYS, fresh_keys=["z"],
                     heavy_keys=len(KEYS), heavy_rows=1)


def _selection_job(scale):
    """Private selection of the public keys: each key's number of units plus Laplace(``scale``)
    noise keyed by (seed, key) must exceed 4 (every key of the data holds 3 units; the heavy
    unit added moves all 4 keys to 4, so each key's keep probability doubles)."""
    def job(dataset, seed, exact):
        units = {k: set() for k in KEYS}
        for r in dataset.rows():
            units[r["k"]].add(A._id_text(r["u"]))
        rows = []
        for k in KEYS:
            noise = 0.0 if exact else np.random.default_rng([seed, ord(k)]).laplace(0.0, scale)
            if len(units[k]) + noise > 4:
                rows.append((k, len(units[k]) + noise))
        return A.Release(tables={"t": A.Table(columns=["k", "n"], rows=rows)})
    return job


def test_joint_indicators_catch_a_selection_calibrated_for_one_of_the_keys_a_unit_moves():
    """One unit moves L0 = 4 keys: a selection noised for one changed key (Laplace(1 / eps))
    meets the claim on each key's own indicator -- exactly e^eps between the two datasets -- and
    carries 4 eps on "every moved key released" / "no moved key released"; calibrated for the
    4 keys (Laplace(4 / eps)) it passes all of them."""
    rows = [{"u": f"{k}{i}", "k": k} for k in KEYS for i in range(3)]
    data = A.Dataset(batches=[rows[0::2], rows[1::2]], name="three-units-per-key")
    rule = A.TableRule(keys="k", noisy="n", public_keys=KEYS, keys_private=True,
                       indicator_claim=(1.0, 0.0))
    spec = A.AuditSpec(job=_selection_job(scale=len(KEYS) / 1.0), units=WIDE_UNITS,
                       tables={"t": rule}, modes=("indicators",),
                       indicator_changes=(A.Change.ADD_HEAVY,), indicator_runs=1500)
    A.audit(spec, [data]).assert_ok()
    broken = A.audit(dataclasses.replace(spec, job=_selection_job(scale=1 / 1.0)), [data])
    assert broken.checks_failed() == {"released indicator"}, str(broken)
    assert all("moved key" in v.detail for v in broken.violations), str(broken)
