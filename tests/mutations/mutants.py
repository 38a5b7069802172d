"""The mutation suite's mutants: named broken variants of the real code, one per known class of
leak, each of which the privacy tests must catch (``make test-mutations``; runner: run.py).

A mutant is a declarative edit: in ``file`` (relative to the repository root) the exact text
``snippet`` -- which must occur exactly once -- becomes ``replacement``. The runner applies it to
a scratch copy of the tree (never the working tree) and runs the mutant's ``tests`` there,
stopping at the first failure. The mutant is *caught* when that failure is an assertion of a
privacy test (an ``AssertionError``, ``AuditFailure`` included); it *survives* when every selected
test passes; a crash (any other exception) or a collection error catches nothing -- a mutant must
leak, not break the code. A snippet that is not found exactly once fails the suite too ("no
longer applies": the code moved; retarget the spec).

Retargeting after code moves: change ``file`` and ``snippet`` (copy the line(s) from the new
place; keep the snippet as short as uniqueness allows, one line where possible) and, if the
catching test moved, ``tests``. ``leak`` says what the mutant stands for, so a retargeted mutant
keeps representing the same leak.

Which tests count (``PRIVACY_TESTS``): the neighbouring-pair audits, the DP tester's tests of
the real mechanisms and the privacy unit tests of bounding, canonical ids, randomizers and Masked
LARk. Byte pins (``BYTE_PINS``: tests that compare released bytes with stored digests) never count:
a pin is re-pinned whenever behaviour changes on purpose, so a leak caught only there is a leak
the next re-pin ships. A mutant's ``tests`` may name only files of ``PRIVACY_TESTS``; list the
cheapest, most targeted test first (the run stops at the first failure).

A leak class whose fix is still on another branch is listed in ``PLANNED`` (named in the run's
output, not applied) until the fix is merged; today every class of issue 30 has its mutant.
"""
from __future__ import annotations

from dataclasses import dataclass

#: Test files whose failures count as catching a mutant (path -> what it checks).
PRIVACY_TESTS = {
    "tests/accounting/verification/test_audits.py": "neighbouring-pair audits of every job and transform",
    "tests/accounting/verification/test_audit_harness.py": "the audit harness on toy jobs",
    "tests/accounting/verification/test_dp_tester.py": "the DP tester on the project's noise mechanisms",
    "tests/accounting/verification/test_dp_tester_aggregate.py": "the DP tester on sampled DPAggregate releases",
    "tests/accounting/verification/test_dp_tester_quantile.py": "the DP tester on the quantile mechanism",
    "tests/transforms/ldp/test_ldp_dp.py": "the DP tester on every local randomizer",
    "tests/transforms/sketches/test_sketches_dp.py": "the DP tester on the sketches' noise",
    "tests/transforms/test_bounding.py": "contribution bounding's invariants (privacy unit tests)",
    "tests/transforms/test_privacy_units.py": "canonical privacy-unit ids (privacy unit tests)",
    "tests/transforms/lark/test_lark.py": "Masked LARk's k-anonymity, noise and masks (privacy unit tests)",
    "tests/transforms/test_selection.py": "private key selection (privacy unit tests)",
    "tests/pipelines/release/test_release_privacy.py": "the release layer's privacy rules",
    "tests/accounting/test_keys.py": "one secret, one use: key claims, derive, key reuse across releases",
    "tests/accounting/verification/test_audit_sequences.py": "neighbouring-pair audits of two-batch sequences",
    "tests/pipelines/release/test_publication_decisions.py": "one unit's faulty rows never decide publication",
    "tests/accounting/verification/test_stated_guarantees.py":
        "stated guarantees against independent dp_accounting computations",
    "tests/accounting/ledger/test_ledger_integrity.py": "a ledger in its latest state, written by this "
                                                        "toolkit only; one key, one use across processes",
    "tests/transforms/ara/test_ara_summary.py": "the DP tester on ARA summary reports' noise",
    "tests/transforms/ara/test_ara_event_level.py": "the DP tester on ARA event-level randomized response",
    "tests/transforms/lark/test_central_dp_sgd.py": "the DP tester on one central DP-SGD step",
    "tests/accounting/verification/test_sketch_exact.py":
        "exact enumerations: the sketches' reach sensitivity and distributed noise's delta",
    "tests/accounting/verification/test_audit_reach_frequency.py":
        "the reach_frequency audit at L0 > 1: each scope's reach statistic read back",
}

#: Tests that pin released bytes: never a mutant's selection, never a catch.
BYTE_PINS = ("tests/test_release_digests.py",)


@dataclass(frozen=True, kw_only=True)
class Mutant:
    name: str          # short id, printed in the table
    leak: str          # the class of leak it represents
    file: str          # relative to the repository root
    snippet: str       # exact text, found exactly once in ``file``
    replacement: str
    tests: tuple       # pytest node ids or files (of PRIVACY_TESTS), cheapest first

    def file_of(self, test: str) -> str:
        return test.split("::", 1)[0]


AUDIT = "tests/accounting/verification/test_audits.py::test_registered_audit_passes_on_the_real_code"
STATED = "tests/accounting/verification/test_stated_guarantees.py"

MUTANTS = (
    Mutant(
        name="rows-in-data-order",
        leak="bounding keeps a unit's rows by their position in the batch instead of keyed "
             "priorities of their content: which rows survive depends on batching and order",
        file="transforms/bounding.py",
        snippet=".append_column(ROW, pa.array(row_words[:, 0]))",
        replacement=".append_column(ROW, pa.array(np.arange(table.num_rows, dtype=np.uint64)))",
        tests=("tests/transforms/test_bounding.py::test_kept_rows_do_not_depend_on_batching_or_order",
               f"{AUDIT}[dp_aggregate/keyset]"),
    ),
    Mutant(
        name="ids-not-canonical",
        leak="privacy-unit ids taken as written: 7, 7.0 and '7' (or ' A7' and 'a7') are "
             "bounded as different units, one person contributes several times",
        file="transforms/privacy_units.py",
        snippet="canonical = pc.dictionary_encode(canonical_unit_ids(raw.dictionary, name))",
        replacement="canonical = pc.dictionary_encode(pc.cast(raw.dictionary, pa.string()))",
        tests=("tests/transforms/test_privacy_units.py", f"{AUDIT}[centralnotice]"),
    ),
    Mutant(
        name="noise-scale-halved",
        leak="Laplace-family noise drawn at half the scale its calibration states",
        file="transforms/noise/mechanisms.py",
        snippet="return discrete_laplace(streams, spec.unit_scale)",
        replacement="return discrete_laplace(streams, spec.unit_scale / 2)",
        tests=("tests/accounting/verification/test_dp_tester.py::test_project_mechanism_satisfies_its_claim",),
    ),
    Mutant(
        name="quantile-score-scale-halved",
        leak="the quantile mechanism's score scale halved (max(q, 1 - q) for the monotone "
             "bound's 2 max(q, 1 - q)): twice the exponent its epsilon allows",
        file="transforms/private_quantile.py",
        snippet="return 2 * max(int(quantile_units), _ONE - int(quantile_units))",
        replacement="return max(int(quantile_units), _ONE - int(quantile_units))",
        tests=("tests/accounting/verification/test_dp_tester_quantile.py::"
               "test_dp_tester_passes_the_quantile_mechanism_at_its_stated_epsilon",
               "tests/accounting/verification/test_dp_tester_quantile.py::"
               "test_no_small_neighbour_pair_exceeds_the_stated_epsilon"),
    ),
    Mutant(
        name="no-l0-bound",
        leak="no bound on the number of keys a unit contributes to (L0): one unit moves "
             "every key it touches",
        file="transforms/bounding.py",
        snippet="keep = (row_rank < max_per_partition) & (pair_rank < max_partitions)",
        replacement="keep = row_rank < max_per_partition",
        tests=("tests/transforms/test_bounding.py::test_bound_invariants", f"{AUDIT}[dp_aggregate/keyset]"),
    ),
    Mutant(
        name="rr-probability-off",
        leak="generalized randomized response keeps the true value with the binary "
             "probability e^eps / (e^eps + 1), ignoring the domain size",
        file="transforms/ldp/oracles.py",
        snippet="return threshold_floor(e / (e + choices - 1))",
        replacement="return threshold_floor(e / (e + 1))",
        tests=("tests/transforms/ldp/test_ldp_dp.py::test_grr_passes",),
    ),
    Mutant(
        name="exact-value-threshold",
        leak="the release threshold compared against the exact value instead of the noisy "
             "one: whether a key or value is released is a deterministic function of the data",
        file="transforms/release.py",
        snippet="below = ~(np.asarray(values, dtype=float) > column.threshold)",
        replacement="below = ~(np.asarray(column.values({m.name: m.exact(table) for m in "
                    "self._s.measures}), dtype=float) > column.threshold)",
        tests=("tests/accounting/verification/test_dp_tester_aggregate.py::"
               "test_a_threshold_on_the_exact_value_is_caught_by_the_released_indicator",
               f"{AUDIT}[dp_aggregate/keyset/thresholds]", f"{AUDIT}[centralnotice/thresholds]"),
    ),
    Mutant(
        name="exact-value-selection",
        leak="private key selection compares the exact unit count with its threshold: whether "
             "a key is released is a deterministic function of the data",
        file="transforms/selection.py",
        snippet="noisy = add_noise(self.noise, units, streams)",
        replacement="noisy = units",
        tests=(f"{AUDIT}[dp_aggregate/selection/thresholds]",),
    ),
    Mutant(
        name="lark-k-anonymity-dropped",
        leak="Masked LARk helpers release keys with k or fewer reports",
        file="transforms/lark/helper.py",
        snippet="keep = partial.counts > params.k",
        replacement="keep = partial.counts > 0",
        tests=("tests/transforms/lark/test_lark.py::test_k_anonymity_releases_only_more_than_k_reports",
               f"{AUDIT}[masked_lark_helper]"),
    ),
    Mutant(
        name="key-reused-through-derive",
        leak="ReleaseKey.derive(label) hands out a child that does not share its parent's "
             "claims (each derived child its own claim scope, the label derivable again): two "
             "days released under one job key's child carry identical noise",
        file="accounting/keys.py",
        snippet="        self.claim(_DERIVE + label, owner=owner)\n        return self._child(label)",
        replacement="        child = self._child(label)\n"
                    "        child._binding, child._session = \"derived\", _new_session()\n"
                    "        return child",
        tests=("tests/accounting/test_keys.py::test_two_days_under_one_label_derived_twice_never_share_their_noise",),
    ),
    Mutant(
        name="overlapping-ara-batch",
        leak="ARA summary reports without the consumed-id check (report ids at most once, a "
             "source's L1 budget across batches): a batch re-including consumed reports is "
             "charged and released again",
        file="pipelines/ara/summary_reports.py",
        snippet="(at most once) and the sources' budgets (see the module docstring).\"\"\"\n",
        replacement="(at most once) and the sources' budgets (see the module docstring).\"\"\"\n"
                    "        return []\n",
        tests=("tests/accounting/verification/test_audit_sequences.py::test_summary_reports_second_batch_adds_nothing",),
    ),
    Mutant(
        name="ledger-witness-skipped",
        leak="a rolled-back ledger (an older copy, chain and MAC valid) is accepted: the releases "
             "charged since are forgotten, their budget spent again and their consumed reports "
             "published a second time",
        file="accounting/ledger/witness.py",
        snippet="            self._check(state, generation)\n",
        replacement="            pass\n",
        tests=("tests/accounting/ledger/test_ledger_integrity.py::test_a_rolled_back_ledger_is_refused_and_a_deliberate_restore_is_recorded",
               "tests/accounting/ledger/test_ledger_integrity.py::test_on_gcs_a_rollback_is_refused_and_a_restore_accepted"),
    ),
    Mutant(
        name="ledger-chain-key-followed-anywhere",
        leak="the head's chain-key reference is taken at face value: whoever can write the ledger "
             "reseals it (records deleted, spend lowered) with a key of their own stored elsewhere",
        file="accounting/ledger/sealing.py",
        snippet="                key = self.key_store.load(self.key_store.resolve(KeyRef.from_json(ref),\n"
                "                                                                 chain_key_name(ledger_id)))\n",
        replacement="                key = self.key_store.load(KeyRef.from_json(ref))\n",
        tests=("tests/accounting/ledger/test_ledger_integrity.py::test_a_ledger_resealed_with_a_key_outside_the_key_store_is_refused",),
    ),
    Mutant(
        name="key-use-record-ignored",
        leak="a ledger key's use record is written but not compared: a second process (a restored "
             "or copied ledger) draws the same noise on another input, and the difference of the "
             "two releases is exact",
        file="accounting/keystore.py",
        snippet="            if {k: recorded.get(k) for k in wanted} != wanted:\n",
        replacement="            if False:\n",
        tests=("tests/accounting/ledger/test_ledger_integrity.py::test_two_processes_one_key_the_second_is_refused_for_anything_else",),
    ),
    Mutant(
        name="issued-key-any-input",
        leak="a key from KeyStore.issue drives its release on any input in another process: day 1's "
             "key on day 2's data repeats day 1's noise",
        file="accounting/keystore.py",
        snippet='        if recorded.get("input_digest") not in (None, input_digest):\n',
        replacement="        if False:\n",
        tests=("tests/accounting/ledger/test_ledger_integrity.py::test_a_key_store_issued_key_is_bound_to_its_release_and_input_in_every_process",),
    ),
    Mutant(
        name="dropped-rows-gate-on-exact-counts",
        leak="whether a release is published decided by exact counts of dropped rows: one "
             "unit's faulty rows push an input over --max_dropped_fraction (or leave it without "
             "eligible rows) and the release is withheld, deterministically",
        file="pipelines/release/lifecycle.py",
        snippet="    return Ruled(computed=computed, counts=counts, shares=shares, alerts=alerts)\n",
        replacement="    if any(alerts.values()):\n"
                    "        raise ReleaseFailed(\"rows dropped: nothing published\")\n"
                    "    return Ruled(computed=computed, counts=counts, shares=shares, alerts=alerts)\n",
        tests=("tests/pipelines/release/test_publication_decisions.py::"
               "test_one_units_faulty_rows_do_not_push_a_release_over_the_dropped_share",
               "tests/pipelines/release/test_publication_decisions.py"),
    ),
    Mutant(
        name="moments-split-overspent",
        leak="the shared moment measures (count, normalised sum) each noised at the moments' "
             "whole budget share while the plan states their split: together they spend twice "
             "the budget, and the derived sum S + midpoint N moves by more than the claim allows",
        file="transforms/metrics.py",
        snippet="    specs = {m.name: m.noise for m in plan.measures}\n",
        replacement="    specs = {m.name: (plan.calibrated(m.name, m.noise.kind, share, m.sensitivities).noise\n"
                    "                     if moments_plan is not None and m.name in moments_plan.names\n"
                    "                     else m.noise) for m in plan.measures}\n",
        tests=("tests/accounting/verification/test_dp_tester_aggregate.py::"
               "test_count_and_sum_derived_from_one_count_and_one_normalised_sum_keep_the_claim",),
    ),
    Mutant(
        name="keyset-keys-selected-too",
        leak="a public keyset with private selection beside it sends the keyset's own keys "
             "through the selection as well: those keys are released twice, each with noise of "
             "its own, so their measures are spent twice",
        file="transforms/aggregate.py",
        snippet="    keep = (keyset.positions(table) < 0) & ~keyset.excluded_mask(table)\n",
        replacement="    keep = ~keyset.excluded_mask(table)\n",
        tests=(f"{AUDIT}[dp_aggregate/keyset_and_selection]",),
    ),
    Mutant(
        name="lark-faulty-record-dropped",
        leak="one Masked LARk record's bad value decides whether its report exists: the record "
             "is dropped instead of neutralised, so the report count of its key -- public under "
             "the helpers' relation, compared with k -- moves with one record's content",
        file="transforms/lark/browser.py",
        snippet="    removed = (faults.reason >= 0) & (faults.reason < identity_reasons)\n",
        replacement="    removed = faults.reason >= 0\n",
        tests=("tests/pipelines/release/test_publication_decisions.py::"
               "test_one_lark_records_faulty_value_neither_fails_nor_moves_a_key_across_k",),
    ),
    Mutant(
        name="pld-wrong-sensitivity",
        leak="the PLD accountant is given a Gaussian measure's noise scale without its "
             "sensitivity (sigma instead of sigma / sensitivity): the tightest-accountant figure "
             "states far less epsilon than the noise buys",
        file="accounting/calibration.py",
        snippet="from_gaussian_mechanism(self.unit_scale / self.unit_sensitivity, sensitivity=1",
        replacement="from_gaussian_mechanism(self.unit_scale, sensitivity=1",
        tests=(f"{STATED}::test_composed_guarantee_is_at_least_the_independent_pld",),
    ),
    Mutant(
        name="exact-curve-wrong-sensitivity",
        leak="a rho-calibrated Gaussian states the exact curve of a sensitivity-1 shift, not of "
             "its own (grid-unit) sensitivity: its stated epsilon is below the true one",
        file="accounting/calibration.py",
        snippet="exact = gaussian_epsilon(unit_scale, delta, unit_sensitivity)",
        replacement="exact = gaussian_epsilon(unit_scale, delta, 1)",
        tests=(f"{STATED}::test_rho_calibrated_gaussian_states_its_exact_curve",),
    ),
    Mutant(
        name="selection-threshold-for-one-key",
        leak="truncated geometric selection calibrated for L0 = 1 when one unit moves L0 > 1 "
             "keys: each key's decision spends the whole (epsilon, delta)",
        file="transforms/selection.py",
        snippet="self.probabilities = truncated_geometric_probabilities(epsilon, delta, max_partitions)",
        replacement="self.probabilities = truncated_geometric_probabilities(epsilon, delta, 1)",
        tests=(f"{STATED}::test_selection_per_key_budget_composes_within_the_budget",
               "tests/transforms/test_selection.py::test_single_unit_key_is_rarely_released"),
    ),
    Mutant(
        name="selection-per-key-delta-uncomposed",
        leak="the per-key selection budget's search checks the L0-fold composition against "
             "L0 times delta: the keys' decisions together spend more delta than the budget",
        file="transforms/selection.py",
        snippet="if _composed_delta(eps_key, mid, k, epsilon) <= delta:",
        replacement="if _composed_delta(eps_key, mid, k, epsilon) <= delta * k:",
        tests=(f"{STATED}::test_selection_per_key_budget_composes_within_the_budget",),
    ),
    Mutant(
        name="pure-part-delta-counted-twice",
        leak="a SharedBudget gives a pure part its weight's share of delta although that delta "
             "already went to the parts that use it: the parts' deltas add up past the total",
        file="accounting/shared_budget.py",
        snippet="return {n: PrivacyBudget(epsilon=s.epsilon, delta=s.delta) for n, s in shares.items()}",
        replacement="return {n: PrivacyBudget(epsilon=s.epsilon, delta=s.delta or "
                    "total.delta * s.fraction) for n, s in shares.items()}",
        tests=(f"{STATED}::test_shared_budget_gives_delta_only_where_it_is_used_and_never_more_than_the_total",),
    ),
    Mutant(
        name="joint-calibration-over-budget",
        leak="calibration to a target keeps a multiplier without checking that the measures "
             "still compose within the target: together they spend more than the budget",
        file="accounting/target.py",
        snippet="        if not guarantee.within(spent.guarantee, epsilon, delta):\n            return None\n",
        replacement="",
        tests=(f"{STATED}::test_joint_calibration_fits_its_target_by_an_independent_accountant",),
    ),
    Mutant(
        name="multi-key-pld-unit-shifts",
        leak="the multi-key discrete Gaussian's PLD calibration takes every key as shifted by at "
             "most 1 (the per-key sensitivity of one click, not the user's m clicks on one key): "
             "its sigma is calibrated for a much weaker pair than the worst one",
        file="accounting/calibration.py",
        snippet="    top = int(math.floor(min(l2 * (1 + 1e-12), sum_cap)))\n",
        replacement="    top = 1\n",
        tests=(f"{STATED}::test_epsilon_delta_calibrated_multi_key_discrete_gaussian_meets_every_split",),
    ),
    Mutant(
        name="multi-key-pld-last-split-only",
        leak="a rho-configured multi-key discrete Gaussian states the epsilon of the last shift "
             "pattern composed (all keys shifted by one) instead of the worst over the patterns",
        file="accounting/calibration.py",
        snippet="            worst = max(worst, _lattice_epsilon_for_delta(lower, probs, infinity, tail, "
                "delta, d))\n",
        replacement="            worst = _lattice_epsilon_for_delta(lower, probs, infinity, tail, delta, "
                    "d)\n",
        tests=(f"{STATED}::test_rho_calibrated_multi_key_discrete_gaussian_states_its_worst_split",),
    ),
    Mutant(
        name="multi-key-delta-last-pattern",
        leak="the multi-key discrete Gaussian's calibration checks delta on the last shift pattern "
             "convolved (every key shifted by one) instead of the worst over the patterns: its "
             "sigma meets the target on a weaker pair than the worst one",
        file="accounting/calibration.py",
        snippet="            worst = max(worst, tail + (1.0 - tail) * (infinity + float(terms.sum())))\n",
        replacement="            worst = tail + (1.0 - tail) * (infinity + float(terms.sum()))\n",
        tests=(f"{STATED}::test_epsilon_delta_calibrated_multi_key_discrete_gaussian_meets_every_split",),
    ),
    Mutant(
        name="multi-key-sigma-search-twice-delta",
        leak="the multi-key discrete Gaussian's sigma search takes a probe as passing when its delta "
             "is up to twice the target: the calibrated sigma spends twice the delta it states",
        file="accounting/calibration.py",
        snippet="        if found <= delta:\n",
        replacement="        if found <= 2 * delta:\n",
        tests=(f"{STATED}::test_epsilon_delta_calibrated_multi_key_discrete_gaussian_meets_every_split",),
    ),
    Mutant(
        name="draw-time-delta-given-twice",
        leak="a SharedBudget allocating delta as parts are drawn shares out the whole total at "
             "every draw, not what earlier draws left: the parts' deltas add up past the total",
        file="accounting/shared_budget.py",
        snippet="        return max(0.0, self.total.delta - math.fsum(self._budgets[n].delta for n in self._drawn))\n",
        replacement="        return self.total.delta\n",
        tests=(f"{STATED}::test_shared_budget_draw_time_delta_never_exceeds_the_total_in_any_order",),
    ),
    Mutant(
        name="draw-time-delta-to-pure-part",
        leak="a part drawn as pure (its mechanisms use no delta) is still given its weight's share "
             "of delta, which the parts that use delta then lack (the waste issue 39.4 removes)",
        file="accounting/shared_budget.py",
        snippet="            delta = self._delta_if_drawn(name) if uses_delta else 0.0\n",
        replacement="            delta = self._delta_if_drawn(name)\n",
        tests=(f"{STATED}::test_shared_budget_draw_time_delta_never_exceeds_the_total_in_any_order",),
    ),
)

# ---- Issue 40.7: every calibration parameter has a mutant the privacy tests catch -----------
# Private selection (each strategy's split of epsilon and delta over the L0 keys one unit
# moves), the count's sensitivities at L0 > 1, the local randomizers' client-side parameters,
# and the within-batch rule of the release layer (issue 40.3).

SELECTION_L0 = ("tests/transforms/test_selection.py::"
                "test_selection_at_l0_above_one_meets_its_claim_on_the_joint_keys")
DP_TESTER_L0 = ("tests/accounting/verification/test_dp_tester.py::"
                "test_project_mechanism_at_l0_above_one_meets_its_claim")
LDP_DP = "tests/transforms/ldp/test_ldp_dp.py"

MUTANTS += (
    Mutant(
        name="selection-one-changed-key",
        leak="private selection calibrated as if a unit moved one key: at L0 > 1 a unit "
             "moves L0 keys, each at the full selection epsilon",
        file="transforms/selection.py",
        snippet="return privacy_unit_count_sensitivity(bounds, neighbouring).l0",
        replacement="return 1",
        tests=(SELECTION_L0,),
    ),
    Mutant(
        name="selection-geometric-epsilon-not-split",
        leak="truncated geometric selection spends the whole epsilon on every one of the L0 keys",
        file="transforms/selection.py",
        snippet="    basic = (epsilon / k, delta / k)\n    if k == 1:",
        replacement="    basic = (epsilon, delta / k)\n    if True:",
        tests=(f"{SELECTION_L0}[truncated_geometric]",),
    ),
    Mutant(
        name="selection-geometric-delta-not-split",
        leak="truncated geometric selection grants every one of the L0 keys the whole delta: a "
             "key of one unit is released with probability delta, not delta / L0",
        file="transforms/selection.py",
        snippet="    basic = (epsilon / k, delta / k)\n    if k == 1:",
        replacement="    basic = (epsilon / k, delta)\n    if True:",
        tests=("tests/transforms/test_selection.py::test_single_unit_key_is_rarely_released",),
    ),
    Mutant(
        name="selection-laplace-l1-of-one-key",
        leak="Laplace thresholding's noise calibrated for an L1 sensitivity of 1 instead of L0",
        file="transforms/selection.py",
        snippet="l1_sensitivity=max_partitions)",
        replacement="l1_sensitivity=1)",
        tests=(f"{SELECTION_L0}[laplace_thresholding]",),
    ),
    Mutant(
        name="selection-laplace-threshold-delta-not-split",
        leak="Laplace thresholding's threshold at the whole delta instead of delta / L0",
        file="transforms/selection.py",
        snippet="discrete_laplace_quantile(self.noise.unit_scale, delta / max_partitions)",
        replacement="discrete_laplace_quantile(self.noise.unit_scale, delta)",
        tests=("tests/transforms/test_selection.py::test_single_unit_key_is_rarely_released",),
    ),
    Mutant(
        name="selection-gaussian-l2-of-one-key",
        leak="Gaussian thresholding's noise calibrated for an L2 sensitivity of 1 instead of "
             "sqrt(L0)",
        file="transforms/selection.py",
        snippet="l2_sensitivity=math.sqrt(max_partitions), l0=max_partitions)",
        replacement="l2_sensitivity=1.0, l0=max_partitions)",
        tests=(f"{SELECTION_L0}[gaussian_thresholding]",),
    ),
    Mutant(
        name="count-l1-of-one-partition",
        leak="a count's L1 sensitivity taken as one partition's Linf: noise calibrated for a "
             "unit that moves one key, while it moves L0",
        file="accounting/sensitivity.py",
        snippet="l1=float(l0 * linf), l2=math.sqrt(l0) * linf)",
        replacement="l1=float(linf), l2=math.sqrt(l0) * linf)",
        tests=(f"{DP_TESTER_L0}[discrete_laplace]", DP_TESTER_L0),
    ),
    Mutant(
        name="count-l2-of-one-partition",
        leak="a count's L2 sensitivity taken as Linf instead of sqrt(L0) Linf",
        file="accounting/sensitivity.py",
        snippet="l1=float(l0 * linf), l2=math.sqrt(l0) * linf)",
        replacement="l1=float(l0 * linf), l2=float(linf))",
        tests=(f"{DP_TESTER_L0}[discrete_gaussian]", DP_TESTER_L0),
    ),
    Mutant(
        name="oue-zero-bit-at-twice-epsilon",
        leak="optimized unary encoding sets a zero bit with probability 1 / (e^(2 eps) + 1): "
             "each client's report is 2 eps-LDP, not eps",
        file="transforms/ldp/oracles.py",
        snippet="return 0.5, 1.0 / (math.exp(self.epsilon) + 1.0)",
        replacement="return 0.5, 1.0 / (math.exp(2 * self.epsilon) + 1.0)",
        tests=(f"{LDP_DP}::test_unary_encodings_pass",),
    ),
    Mutant(
        name="sue-per-bit-epsilon",
        leak="symmetric unary encoding (RAPPOR) spends eps per bit instead of eps / 2: two bits "
             "change, the report is 2 eps-LDP",
        file="transforms/ldp/oracles.py",
        snippet="h = math.exp(self.epsilon / 2)\n            return h / (1.0 + h)",
        replacement="h = math.exp(self.epsilon)\n            return h / (1.0 + h)",
        tests=(f"{LDP_DP}::test_unary_encodings_pass",),
    ),
    Mutant(
        name="olh-keep-among-two",
        leak="local hashing keeps the true bucket with the binary probability e^eps / (e^eps + "
             "1), ignoring its g buckets",
        file="transforms/ldp/oracles.py",
        snippet='object.__setattr__(self, "keep_threshold", _grr_keep_threshold(self.epsilon, g))',
        replacement='object.__setattr__(self, "keep_threshold", _grr_keep_threshold(self.epsilon, 2))',
        tests=(f"{LDP_DP}::test_olh_passes",),
    ),
    Mutant(
        name="label-rr-keep-among-two",
        leak="label randomized response keeps the label with e^eps / (e^eps + 1) whatever the "
             "number of labels in its support",
        file="transforms/ldp/labels.py",
        snippet="threshold_floor(e / (e + k - 1)) if k > 1 else TWO32)",
        replacement="threshold_floor(e / (e + 1)) if k > 1 else TWO32)",
        tests=(f"{LDP_DP}::test_label_randomization_passes_including_undeclared_labels",),
    ),
    Mutant(
        name="ara-summary-sensitivity-halved",
        leak="ARA summary noise calibrated for half a source's 65,536 L1 contribution budget",
        file="transforms/ara/summary.py",
        snippet="l1_sensitivity=CONTRIBUTION_BUDGET)",
        replacement="l1_sensitivity=CONTRIBUTION_BUDGET // 2)",
        tests=("tests/transforms/ara/test_ara_summary.py::"
               "test_summary_noise_passes_dp_tester_for_a_full_budget_source",),
    ),
    Mutant(
        name="repeated-report-refuses-the-batch",
        leak="a report sent twice within a batch refuses the whole batch: one row decides "
             "whether a release is published (issue 40.3)",
        file="pipelines/release/consumption.py",
        snippet="    ids, identical, repeated = repeats(c.ids, c.content)\n",
        replacement="    ids, identical, repeated = repeats(c.ids, c.content)\n"
                    "    if len(repeated) or len(identical):\n"
                    "        raise ReleaseRefused(f\"{c.label}: repeated {c.noun}\")\n",
        tests=("tests/pipelines/release/test_publication_decisions.py::"
               "test_summary_reports_a_report_sent_twice_or_an_uncanonical_id_does_not_decide_the_batch",),
    ),
    Mutant(
        name="repeat-keeps-the-first-copy",
        leak="an id repeated within a batch keeps one copy (the first in time and content "
             "order) even when the copies differ, instead of one copy of identical copies "
             "only: an added copy that sorts first replaces a report -- a substitution, twice "
             "the add/remove sensitivity (issue 40.3)",
        file="pipelines/release/consumption.py",
        snippet="    one_content = pc.equal(copies.column(\"contents\"), 1)\n",
        replacement="    one_content = pc.greater_equal(copies.column(\"contents\"), 1)\n",
        tests=("tests/pipelines/release/test_publication_decisions.py::"
               "test_summary_reports_an_identical_copy_changes_nothing_a_conflicting_one_removes_one",),
    ),
    Mutant(
        name="label-dp-copies-compared-by-label",
        leak="label DP keeps one copy of an example given twice alike and removes it when the "
             "copies' labels differ: whether an example is exported depends on its private "
             "labels (issue 40.3: the content rule is for add/remove relations only)",
        file="pipelines/ldp/label_dp.py",
        snippet="        ids, faults = canonical_ids(inputs[\"rows\"], request.id_column)\n"
                "        return [Consumes(namespace=f\"{NAME}/{request.label_column}/example\", ids=ids,\n",
        replacement="        from pipelines.release.consumption import scan_ids\n"
                    "        scanned = scan_ids(inputs[\"rows\"], request.id_column)\n"
                    "        ids, faults = scanned.ids, scanned.faults\n"
                    "        return [Consumes(namespace=f\"{NAME}/{request.label_column}/example\", ids=ids,\n"
                    "                         content=scanned.content,\n",
        tests=("tests/pipelines/release/test_publication_decisions.py::"
               "test_label_dp_an_example_given_twice_alike_is_removed_whatever_its_labels",),
    ),
    Mutant(
        name="uncanonical-id-refuses-the-batch",
        leak="a row whose id has no canonical form refuses the whole export: one row decides "
             "whether a release is published (issue 40.3)",
        file="transforms/privacy_units.py",
        snippet="            if faults is None:\n                raise\n",
        replacement="            raise\n",
        tests=("tests/pipelines/release/test_publication_decisions.py::"
               "test_label_dp_a_repeated_or_uncanonical_example_id_does_not_decide_the_export",),
    ),
    Mutant(
        name="error-std-from-data",
        leak="an error column computed from the released value (a plug-in std, sqrt of the "
             "count) instead of the stated noise only: declared public, it moves with the data "
             "(issue 39.6)",
        file="transforms/error_columns.py",
        snippet="    s = np.where(np.isnan(v), np.nan, np.broadcast_to(np.asarray(std, dtype=np.float64), v.shape))\n",
        replacement="    s = np.sqrt(np.abs(v))\n",
        tests=(f"{AUDIT}[centralnotice]", f"{AUDIT}[shuffle_sum]"),
    ),
)


# ---- Issue 40.7, continued: the calibration inventory (calibrations.py) ------------------------
# Each calibration parameter the inventory lists without a mutant above: Gaussian selection's
# delta split, Masked LARk's sensitivities, clip and local noise, the sketches' budget split,
# sensitivities and Polya shares, split-and-mix's noise, ARA event-level randomized response,
# value clamping and vector clipping, the sum and unit-count sensitivities, CentralNotice's,
# the quantile tree's and the vector sum's L1 across their coordinates.

SELECTION_DELTAS = f"{STATED}::test_gaussian_selection_noise_and_threshold_deltas_fit_the_budget_together"
LARK = "tests/transforms/lark/test_lark.py"
LARK_GRADIENT_DP = f"{LARK}::test_masked_gradient_helper_is_dp_in_one_reports_label"
SKETCHES = "tests/transforms/sketches/test_sketches_dp.py"
SKETCH_BUDGET = (f"{SKETCHES}::test_a_campaigns_statistics_compose_within_its_budget_by_an_"
                 "independent_computation")
SHUFFLE_DELTA = f"{LDP_DP}::test_split_and_mix_meets_the_requested_delta_by_an_independent_computation"
EVENT_LEVEL = "tests/transforms/ara/test_ara_event_level.py"
DP_TESTER_AGGREGATE = "tests/accounting/verification/test_dp_tester_aggregate.py"
PLANNED_NOISE = ("tests/accounting/verification/test_audits.py::"
                 "test_every_planned_measure_is_noised_for_the_sensitivities_it_states")

MUTANTS += (
    Mutant(
        name="selection-gaussian-noise-delta-not-split",
        leak="Gaussian thresholding's noise calibrated at the selection's whole delta while the "
             "threshold spends delta / 2 as well: together 1.5 delta",
        file="transforms/selection.py",
        snippet="epsilon=epsilon, delta=delta / 2,",
        replacement="epsilon=epsilon, delta=delta,",
        tests=(SELECTION_DELTAS,),
    ),
    Mutant(
        name="selection-gaussian-threshold-delta-not-split",
        leak="Gaussian thresholding's threshold at delta / L0 instead of delta / (2 L0): the L0 "
             "new keys of one unit are released with probability delta, beside the noise's "
             "delta / 2",
        file="transforms/selection.py",
        snippet="discrete_gaussian_quantile(self.noise.scale, delta / (2 * max_partitions))",
        replacement="discrete_gaussian_quantile(self.noise.scale, delta / max_partitions)",
        tests=(SELECTION_DELTAS,),
    ),
    Mutant(
        name="lark-aggregation-range-of-one-column",
        leak="Masked LARk helpers' noise calibrated for one value column's range (U - L) while "
             "one report moves all d columns of its key: d times the epsilon",
        file="transforms/lark/params.py",
        snippet="return self.dimension * (high - low)",
        replacement="return high - low",
        tests=(f"{LARK}::test_helper_noise_covers_one_reports_values_in_every_column",),
    ),
    Mutant(
        name="lark-values-not-clipped",
        leak="the Masked LARk browser encodes a value outside [lower, upper] as it is: one "
             "report moves its key's sums by more than U - L",
        file="transforms/lark/browser.py",
        snippet="    ring = params.codec.encode(np.clip(checked.values, params.lower, params.upper))",
        replacement="    ring = params.codec.encode(checked.values)",
        tests=(f"{LARK}::test_helper_noise_covers_one_reports_values_in_every_column",),
    ),
    Mutant(
        name="ara-source-budget-not-accumulated",
        leak="ARA Algorithm C checks each report against the whole 65,536 budget instead of what "
             "its source has left: a source's reports together exceed the L1 budget",
        file="transforms/ara/contribution.py",
        snippet="        fits = spent[s] + totals[rows] <= budget\n",
        replacement="        fits = totals[rows] <= budget\n",
        tests=("tests/transforms/ara/test_ara_summary.py::"
               "test_summary_noise_passes_dp_tester_for_a_full_budget_source",),
    ),
    Mutant(
        name="lark-gradient-sensitivity-of-one-gradient",
        leak="Masked LARk gradient noise calibrated for psi, one clipped gradient, while "
             "replacing a report's features and label moves the sum by 2 psi",
        file="transforms/lark/params.py",
        snippet="return 2 * self.cap_units",
        replacement="return self.cap_units",
        tests=(LARK_GRADIENT_DP,),
    ),
    Mutant(
        name="lark-gradient-not-clipped",
        leak="per-record gradients never clipped to the L1 norm psi the helpers' noise assumes",
        file="transforms/lark/model.py",
        snippet="    over = norms > cap\n",
        replacement="    over = norms < 0\n",
        tests=(f"{LARK}::test_clipped_integer_gradients_respect_the_cap", LARK_GRADIENT_DP),
    ),
    Mutant(
        name="lark-local-feature-noise-for-half-the-range",
        leak="the browser's local feature noise calibrated for half the byte range: each "
             "feature 2 epsilon-LDP",
        file="transforms/lark/local_dp.py",
        snippet="return BYTE_MAX / self.epsilon_per_feature",
        replacement="return BYTE_MAX / 2 / self.epsilon_per_feature",
        tests=(f"{LARK}::test_local_feature_noise_is_epsilon_dp_per_feature",),
    ),
    Mutant(
        name="sketch-epsilon-not-split-over-scopes",
        leak="each scope's sketch statistics noised at the campaign's whole epsilon: a person at "
             "every publisher moves P + 1 scopes, (P + 1) epsilon in all",
        file="transforms/sketches/dp.py",
        snippet="eps = self.budget.epsilon * fraction / self.num_scopes",
        replacement="eps = self.budget.epsilon * fraction",
        tests=(SKETCH_BUDGET,),
    ),
    Mutant(
        name="sketch-histogram-takes-the-whole-scope",
        leak="the frequency histogram noised at the scope's whole share beside the reach's "
             "fraction of it: the two together spend more than the scope's budget",
        file="transforms/sketches/dp.py",
        snippet="return self._spec(1.0 - self.reach_fraction, HISTOGRAM_SENSITIVITY,",
        replacement="return self._spec(1.0, HISTOGRAM_SENSITIVITY,",
        tests=(SKETCH_BUDGET,),
    ),
    Mutant(
        name="sketch-gaussian-delta-not-split-over-scopes",
        leak="discrete Gaussian sketch noise: each scope's statistics at the campaign's whole "
             "delta share, (P + 1) times the delta in all",
        file="transforms/sketches/dp.py",
        snippet="delta=self.budget.delta * fraction / self.num_scopes",
        replacement="delta=self.budget.delta * fraction",
        tests=(SKETCH_BUDGET,),
    ),
    Mutant(
        name="sketch-substitute-not-doubled",
        leak="sketch noise under replace-one-person calibrated for adding one: a replaced "
             "person moves two histogram bins",
        file="transforms/sketches/dp.py",
        snippet="        sens = sens.scaled(factor)\n",
        replacement="",
        tests=(SKETCH_BUDGET,),
    ),
    Mutant(
        name="sketch-histogram-sensitivity-halved",
        leak="the frequency histogram noised for half a bin's change (on the integer grid a "
             "figure below 1 rounds up to 1: it leaks where substitution doubles it, two bins "
             "moving for the noise of one)",
        file="transforms/sketches/dp.py",
        snippet="HISTOGRAM_SENSITIVITY = Sensitivities(l0=1, linf=1.0, l1=1.0, l2=1.0)",
        replacement="HISTOGRAM_SENSITIVITY = Sensitivities(l0=1, linf=0.5, l1=0.5, l2=0.5)",
        tests=(SKETCH_BUDGET,),
    ),
    Mutant(
        name="sketch-polya-shares-for-twice-the-helpers",
        leak="distributed sketch noise: each helper draws Polya(1 / 2n) for n helpers, so the "
             "summed shares carry half the discrete Laplace variance",
        file="transforms/sketches/dp.py",
        snippet="polya_table(num_helpers, noise.reach_spec().unit_scale)",
        replacement="polya_table(2 * num_helpers, noise.reach_spec().unit_scale)",
        tests=(f"{SKETCHES}::test_helper_shares_come_from_each_helpers_own_key",),
    ),
    Mutant(
        name="shuffle-noise-for-a-unit-value",
        leak="split-and-mix's binomial noise calibrated for a client moving the sum by 1, not "
             "by the value bound B",
        file="transforms/ldp/shuffle.py",
        snippet="binomial_share_for(n, epsilon, delta - shuffle_delta, bound)",
        replacement="binomial_share_for(n, epsilon, delta - shuffle_delta, 1)",
        tests=(SHUFFLE_DELTA,),
    ),
    Mutant(
        name="shuffle-summation-delta-not-split",
        leak="split-and-mix's noise calibrated at the whole delta although the secure "
             "summation spends (1 + e^eps) 2^-sigma of it",
        file="transforms/ldp/shuffle.py",
        snippet="binomial_share_for(n, epsilon, delta - shuffle_delta, bound)",
        replacement="binomial_share_for(n, epsilon, delta, bound)",
        tests=(SHUFFLE_DELTA,),
    ),
    Mutant(
        name="shuffle-client-adds-half-its-coins",
        leak="each split-and-mix client adds half the binomial trials the calibration planned "
             "(client side): the summed noise is too small for the stated epsilon",
        file="transforms/ldp/shuffle.py",
        snippet="        k = self.noise_trials_per_client\n",
        replacement="        k = max(self.noise_trials_per_client // 2, 1)\n",
        tests=(f"{LDP_DP}::test_each_client_adds_the_planned_binomial_noise",),
    ),
    Mutant(
        name="event-level-flip-of-binary-rr",
        leak="ARA event-level randomized response flips with the binary probability 2 / (e^eps "
             "+ 1) whatever the number of output states",
        file="transforms/ara/event_level.py",
        snippet="return states / (states + math.expm1(epsilon))",
        replacement="return 2 / (2 + math.expm1(epsilon))",
        tests=(f"{EVENT_LEVEL}::test_dp_tester_accepts_the_randomizer_and_catches_a_broken_one",),
    ),
    Mutant(
        name="event-level-states-without-no-report",
        leak="ARA event-level states counted without the 'no report' symbol: the uniform draw "
             "misses outputs, and a source whose reports map there is never hidden",
        file="transforms/ara/event_level.py",
        snippet="return math.comb(trigger_data_cardinality * report_windows + max_reports, max_reports)",
        replacement="return math.comb(trigger_data_cardinality * report_windows + max_reports - 1, max_reports)",
        tests=(f"{EVENT_LEVEL}::test_dp_tester_on_the_sources_own_report_multisets",),
    ),
    Mutant(
        name="values-not-clamped",
        leak="values summed without clamping to [min_value, max_value]: a unit's sum moves by "
             "far more than the sensitivity the noise is calibrated for",
        file="transforms/bounding_stage.py",
        snippet="bounding.VALUE, pa.array(np.clip(values, low, high)))",
        replacement="bounding.VALUE, pa.array(values))",
        tests=(f"{AUDIT}[dp_aggregate/keyset/direct_sum]",),
    ),
    Mutant(
        name="sum-sensitivity-halved",
        leak="a sum's per-row magnitude taken as half the largest |bound|",
        file="accounting/sensitivity.py",
        snippet="    magnitude = max(abs(low), abs(high))\n",
        replacement="    magnitude = max(abs(low), abs(high)) / 2\n",
        tests=(f"{AUDIT}[dp_aggregate/keyset/direct_sum]",),
    ),
    Mutant(
        name="unit-count-l1-of-one-key",
        leak="a privacy-unit count's L1 sensitivity taken as 1 while a unit counts in L0 keys",
        file="accounting/sensitivity.py",
        snippet="Sensitivities(l0=l0, linf=1.0, l1=float(l0), l2=math.sqrt(l0))",
        replacement="Sensitivities(l0=l0, linf=1.0, l1=1.0, l2=math.sqrt(l0))",
        tests=(f"{AUDIT}[dp_aggregate/keyset]",),
    ),
    Mutant(
        name="vector-not-clipped",
        leak="vector sums without clipping each row to max_norm",
        file="transforms/bounding_stage.py",
        snippet="clipped = clip(matrix, c.vector.max_norm, c.vector.norm)",
        replacement="clipped = matrix",
        tests=(f"{AUDIT}[dp_aggregate/keyset/vector_sum_l1]",),
    ),
    Mutant(
        name="centralnotice-impressions-half-a-block",
        leak="CentralNotice impressions noised for half a block of k impressions",
        file="pipelines/centralnotice/config.py",
        snippet="l1_sensitivity=self.k, l2_sensitivity=self.k)",
        replacement="l1_sensitivity=self.k / 2, l2_sensitivity=self.k / 2)",
        tests=(PLANNED_NOISE,),
    ),
    Mutant(
        name="centralnotice-user-clicks-of-one-row",
        leak="CentralNotice user-DP clicks noised for one click row instead of a user's m",
        file="pipelines/centralnotice/config.py",
        snippet='return 1 if self.neighbouring == "row" else int(self.max_clicks_per_user)',
        replacement="return 1",
        tests=(PLANNED_NOISE,),
    ),
    Mutant(
        name="quantile-tree-l1-of-one-level",
        leak="a quantile tree's node counts noised for one level's change (the count's L1) while "
             "one unit's rows move one node on every level: depth times the epsilon",
        file="transforms/quantiles.py",
        snippet="l1=count.l1 * depth,",
        replacement="l1=count.l1,",
        tests=(f"{DP_TESTER_AGGREGATE}::test_quantile_tree_node_counts_are_noised_for_a_units_rows_on_every_level",),
    ),
    Mutant(
        name="vector-sum-l1-of-one-column",
        leak="an L2-clipped vector sum noised for the per-column bound max_norm while one row of "
             "norm max_norm moves the d columns together by up to sqrt(d) max_norm in L1",
        file="transforms/vectors.py",
        snippet='l1_factor = c * (math.sqrt(spec.dimension) if spec.norm == "l2" else 1.0)',
        replacement="l1_factor = c",
        tests=(f"{DP_TESTER_AGGREGATE}::test_vector_sum_is_noised_for_the_l1_norm_across_its_columns",),
    ),
    Mutant(
        name="multi-key-dominating-pld-last-pattern",
        leak="the PLD a multi-key discrete Gaussian composes by keeps the profile of the last "
             "shift pattern (every key shifted by one) instead of the maximum over the patterns: "
             "a release composing it states the count at a weaker pair than the worst one",
        file="accounting/calibration.py",
        snippet="            np.maximum(worst, tail + (1.0 - tail) * curve, out=worst)\n",
        replacement="            worst = tail + (1.0 - tail) * curve\n",
        tests=(f"{STATED}::test_multi_key_dominating_pld_is_never_below_any_shift",),
    ),
    Mutant(
        name="multi-key-dominating-pld-one-click",
        leak="a multi-key discrete Gaussian's composition PLD built for the shifts of L2 = 1 (one "
             "key moved by one click) instead of the unit's L2: composed with a release's other "
             "measures, the count counts as a single click",
        file="accounting/calibration.py",
        snippet="return _multi_key_patterns(self.kind, self.l0, self.unit_sensitivity, self.l1_sensitivity,",
        replacement="return _multi_key_patterns(self.kind, self.l0, 1, self.l1_sensitivity,",
        tests=(f"{STATED}::test_mixed_release_with_a_multi_key_count_composes_on_its_curve",
               f"{STATED}::test_multi_key_dominating_pld_is_never_below_any_shift"),
    ),
)

#: Leak classes of issue 30 whose mutants wait for other branches' fixes: none (all applied).
PLANNED = ()


# ---- Issue 40.7, mutants40: the gaps of the calibration inventory ------------------------------
# The L2 (Gaussian-kind) sensitivities of the quantile tree and the vector sums, central DP-SGD's
# 2 psi, distributed sketch noise's sampler delta, and the sketches' shared register of a person
# across publishers (caught by the reach_frequency audit at L0 > 1 only).

MUTANTS += (
    Mutant(
        name="quantile-tree-l2-of-one-level",
        leak="a Gaussian quantile tree's node counts noised for one level's L2 (the count's) "
             "while one unit's rows move one node on every level: L2 sqrt(depth) times larger",
        file="transforms/quantiles.py",
        snippet="l2=count.l2 * math.sqrt(depth))",
        replacement="l2=count.l2)",
        tests=(f"{DP_TESTER_AGGREGATE}::test_gaussian_quantile_tree_is_noised_for_the_l2_norm_of_"
               "a_units_rows_on_every_level",),
    ),
    Mutant(
        name="vector-sum-l2-without-the-clip-norm",
        leak="a Gaussian vector sum noised for the row count's L2 without the clip norm C: one "
             "row of norm C moves the columns by C in L2",
        file="transforms/vectors.py",
        snippet="l2=count.l2 * c)",
        replacement="l2=count.l2)",
        tests=(f"{DP_TESTER_AGGREGATE}::test_gaussian_vector_sum_is_noised_for_the_l2_norm_of_its_"
               "clipped_rows",),
    ),
    Mutant(
        name="central-dp-sgd-sensitivity-of-one-gradient",
        leak="the central DP-SGD baseline's Laplace noise calibrated for psi, one clipped "
             "gradient, while replacing a record moves the clipped sum by 2 psi: twice the "
             "epsilon its comparison states",
        file="transforms/lark/training.py",
        snippet="l1_sensitivity=2 * config.clip_norm,",
        replacement="l1_sensitivity=config.clip_norm,",
        tests=("tests/transforms/lark/test_central_dp_sgd.py::"
               "test_one_central_dp_sgd_step_is_dp_under_one_replaced_record",),
    ),
    Mutant(
        name="sketch-sampler-delta-not-charged",
        leak="distributed sketch noise charged as exact discrete Laplace (pure DP): the Polya "
             "shares come from a truncated integer table whose summed law has a bounded support, "
             "so the release's true delta is positive while it states none",
        file="transforms/sketches/dp.py",
        snippet="    return (1 + math.exp(spec.epsilon)) * num_values * table.tv_per_value\n",
        replacement="    return 0.0\n",
        tests=("tests/accounting/verification/test_sketch_exact.py::"
               "test_distributed_sketch_noise_meets_the_delta_it_charges_exactly",),
    ),
    Mutant(
        name="publisher-dependent-fingerprints",
        leak="a person's sketch register depends on the publisher (each publisher fingerprints "
             "ids under a salt of its own): every publisher's reach still moves by 1, but the "
             "union counts a person once per publisher -- L0 times the reach's sensitivity, "
             "visible only when one person is at several publishers",
        file="transforms/sketches/impressions.py",
        snippet="LiquidLegionsSketch.from_fingerprints(config, salt, fingerprint(group_ids, salt))",
        replacement="LiquidLegionsSketch.from_fingerprints(config, salt, fingerprint(group_ids, "
                    "salt_of(f\"{campaign}/{publisher}\")))",
        tests=("tests/accounting/verification/test_audit_reach_frequency.py::"
               "test_reach_frequency_audit_at_several_publishers_per_person",),
    ),
    Mutant(
        name="sketch-histogram-kept-under-substitution",
        leak="the frequency histogram marked as one whose change under replace-one-person stays "
             "within add/remove's (as the reach's does): a replaced person moves two bins, or "
             "one bin by 2, noised for one",
        file="transforms/sketches/dp.py",
        snippet="coordinates=2,\n                          doubles_under_substitution=True)",
        replacement="coordinates=2,\n                          doubles_under_substitution=False)",
        tests=(SKETCH_BUDGET,),
    ),
)

# -- issue 39.2: CentralNotice releases calibrated jointly to a target (privacy.target)
MUTANTS = MUTANTS + (
    Mutant(
        name="centralnotice-target-delta-ignored",
        leak="a CentralNotice target's delta ignored: the release budget's delta (per period, else "
             "the campaign total) taken for it, so every release is calibrated -- and stated -- "
             "at more delta than the target the configuration asks for",
        file="pipelines/centralnotice/config.py",
        snippet="target=None if target is None else _budget(target), accountant=accountant)",
        replacement="target=None if target is None else PrivacyBudget(epsilon=float(target["
                    "\"epsilon\"]), delta=float((per_period or privacy[\"budget\"][\"campaign_total\"])"
                    ".get(\"delta\", 0.0))), accountant=accountant)",
        tests=(f"{STATED}::test_a_centralnotice_release_calibrated_to_a_target_composes_within_it",),
    ),
)
