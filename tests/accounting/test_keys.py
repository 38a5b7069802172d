"""One secret, one use (issue 30 item 2): key claims per secret for the whole process, derive(),
one SharedBudget per key, ledger keys that drive their own release only, keys per release from
the key store, and the daily-release example of accounting/keystore.py run as written."""
import copy
import pickle
import re
import textwrap
import threading

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest

import accounting.keystore
from accounting.verification.audit import Table, repeated_noise
from accounting.budget import PrivacyBudget
from accounting.calibration import calibrate
from accounting.keys import KeyReuseError, ReleaseKey, audit_world
from accounting.keystore import KeyStore
from accounting.ledger import BudgetLedger, ReleaseRequest, Scope
from accounting.measures import Measure
from accounting.sensitivity import ContributionBounds, Sensitivities
from accounting.shared_budget import SharedBudget
from transforms.aggregate import Compute, DPAggregate, Keys, Output
from transforms.keyset import PublicKeyset
from transforms.metrics import Count
from transforms.noise import RandomStreams, add_noise

ONE = ContributionBounds(max_partitions=1, max_contributions_per_partition=1)


def _aggregate(budget, release_key=None, label=None):
    return DPAggregate(
        compute=Compute(metrics=[Count()]),
        keys=Keys(privacy_unit="u", columns=["k"], keyset=PublicKeyset.from_keys(["x"], ["k"])),
        bounds=ONE,
        budget=budget,
        release_key=release_key,
        label=label)


def _rows(pipeline, label, n):
    return pipeline | label >> beam.Create([pa.table({"u": list(range(n)), "k": ["x"] * n})])


# --------------------------------------------------------------------------- claims per secret

def test_claims_belong_to_the_secret_not_the_key_object(tmp_path):
    """A key loaded twice, unpickled, copied or rebuilt from its bytes is the same secret: it
    shares the first object's claims (main f02cb62 kept claims per object)."""
    key = ReleaseKey.generate()
    key.save(str(tmp_path / "k.hex"))
    key.claim("noise:count", "day 1")
    for same in (ReleaseKey.load(str(tmp_path / "k.hex")), ReleaseKey.load(str(tmp_path / "k.hex")),
                 pickle.loads(pickle.dumps(key)), copy.deepcopy(key),
                 ReleaseKey(key.secret_bytes())):
        with pytest.raises(KeyReuseError, match="day 1"):
            same.claim("noise:count", "day 2")
        same.claim(f"other:{id(same)}")  # other purposes stay free
    ReleaseKey.generate().claim("noise:count")  # another secret is another key


def test_the_error_names_the_real_remedy():
    key = ReleaseKey.generate()
    key.claim("p")
    with pytest.raises(KeyReuseError) as err:
        ReleaseKey(key.secret_bytes()).claim("p")
    text = str(err.value)
    assert "fresh key per release" in text and "KeyStore.issue" in text and "ledger" in text
    assert "derive" not in text.replace("derived again", "")  # derive is what reused the key
    assert key.secret_bytes().hex() not in text


def test_claims_are_thread_safe():
    """Eight threads claim one purpose with eight copies of one key: exactly one wins."""
    key = ReleaseKey.generate()
    copies = [ReleaseKey(key.secret_bytes()) for _ in range(8)]
    barrier, won, lost = threading.Barrier(8), [], []

    def claim(k):
        barrier.wait()
        try:
            k.claim("race")
            won.append(k)
        except KeyReuseError:
            lost.append(k)

    threads = [threading.Thread(target=claim, args=(k,)) for k in copies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(lost) == 7


def test_a_second_day_under_a_reloaded_key_is_refused_at_construction(tmp_path):
    """Day 1's pipeline runs (its DoFns pickled and unpickled in this process: workers do not
    claim); day 2 with the same key loaded from its file is refused before any work."""
    key = ReleaseKey.generate()
    key.save(str(tmp_path / "k.hex"))
    with beam.Pipeline(runner="FnApiRunner") as p:
        _rows(p, "Day1", 5) | _aggregate(PrivacyBudget(epsilon=1.0), key)
    p = beam.Pipeline()
    with pytest.raises(KeyReuseError, match="bounding"):
        _rows(p, "Day2", 6) | _aggregate(PrivacyBudget(epsilon=1.0), ReleaseKey.load(str(tmp_path / "k.hex")))


def test_testing_keys_are_scoped_per_construction_but_one_object_drives_a_purpose_once():
    """Tests and the neighbouring-pair audits build the same public key per run; one testing
    key object (and its copies) still drives each purpose once."""
    first = ReleaseKey.for_testing(4)
    first.claim("noise:x")
    ReleaseKey.for_testing(4).claim("noise:x")  # another run of the same public key
    for same in (first, pickle.loads(pickle.dumps(first))):
        with pytest.raises(KeyReuseError):
            same.claim("noise:x")


# --------------------------------------------------------------------------- derive

def test_the_same_label_is_derived_once_and_children_share_claims():
    key = ReleaseKey.generate()
    child = key.derive("day")
    with pytest.raises(KeyReuseError, match="derive/day"):
        key.derive("day")
    with pytest.raises(KeyReuseError, match="derive/day"):
        ReleaseKey(key.secret_bytes()).derive("day")  # a copy of the parent: the same label
    child.claim("noise:count")
    with pytest.raises(KeyReuseError):  # the same child, however it was made again
        key.subkey("day").claim("noise:count")
    key.derive("other day").claim("noise:count")  # another label is another key
    assert child == key.subkey("day")
    with pytest.raises(ValueError, match="noise engine"):
        key.derive("stream:noise:count")  # the parent's own cipher keys are never handed out


def test_derived_keys_of_two_days_cannot_carry_the_same_noise():
    """The issue's reproduction: day 2 released under day 1's job key through derive(label)."""
    job_key = ReleaseKey.generate()
    p = beam.Pipeline()
    _rows(p, "Day1", 5) | "Release1" >> _aggregate(PrivacyBudget(epsilon=1.0), job_key.derive("counts"))
    with pytest.raises(KeyReuseError):
        _rows(p, "Day2", 6) | "Release2" >> _aggregate(PrivacyBudget(epsilon=1.0),
                                                         job_key.derive("counts"))


DAY_KEYS = [f"k{i:02d}" for i in range(16)]


def _released(rows, key=None):
    """One DPAggregate release of ``rows`` (count per public key) as an audit Table; no key:
    the exact (testing) answer."""
    from aggregate_kit import run_and_collect

    transform = DPAggregate(
        compute=Compute(metrics=[Count()]),
        keys=Keys(privacy_unit="u", columns=["k"], keyset=PublicKeyset.from_keys(DAY_KEYS, ["k"])),
        output=Output(num_shards=1),
        bounds=ONE,
        budget=PrivacyBudget(epsilon=1.0),
        release_key=key,
        testing=key is None)
    tables = run_and_collect(lambda p: p | beam.Create([pa.Table.from_pylist(rows)],
                                                       reshuffle=False) | transform)
    return Table.from_arrow(pa.concat_tables(tables).sort_by("k"))


def test_two_days_under_one_label_derived_twice_never_share_their_noise():
    """The issue's reproduction checked as the audits check key reuse (accounting.verification.audit.
    repeated_noise): day 1 and day 2 (one more unit) each released under
    ``job_key.derive("counts")``. Were both released, their noise must differ -- identical noise
    makes the difference of the days the exact change; the second derivation is refused."""
    job_key = ReleaseKey.for_testing(30)
    days = [[{"u": u, "k": DAY_KEYS[u % len(DAY_KEYS)]} for u in range(n)] for n in (40, 41)]
    noisy = []
    for rows in days:
        try:
            key = job_key.derive("counts")
        except KeyReuseError:
            break
        noisy.append(_released(rows, key))
    if len(noisy) == 2:
        exact = [_released(rows) for rows in days]
        assert repeated_noise(*noisy, *exact, keys=["k"], columns=["count"]) == []
    assert len(noisy) == 1, "the label was derived a second time"


# --------------------------------------------------------------------------- holders

def test_a_second_shared_budget_over_one_key_is_refused():
    """A SharedBudget built once per day with one key handed its parts the same derived keys:
    two days carried identical noise (main f02cb62)."""
    key = ReleaseKey.generate()
    total = PrivacyBudget(epsilon=1.0)
    day1 = SharedBudget(total, weights={"counts": 1}, release_key=key)
    p = beam.Pipeline()
    _rows(p, "Day1", 5) | "Release1" >> _aggregate(day1.part("counts"))
    for same in (key, ReleaseKey(key.secret_bytes()), pickle.loads(pickle.dumps(key))):
        with pytest.raises(KeyReuseError, match="SharedBudget"):
            SharedBudget(total, weights={"counts": 1}, release_key=same)
    with pytest.raises(KeyReuseError, match="part:counts"):
        key.derive("part:counts")  # a part's key cannot be derived a second time either


@pytest.mark.parametrize("holder", ["DPAggregate", "SummaryReport", "EncodeConversions",
                                    "RandomizeLabels", "ReleaseReachFrequency", "HelperAggregate",
                                    "ShareRecords"])
def test_every_key_holder_refuses_a_key_another_holder_drives(holder):
    """Each transform that holds a key claims its purposes when applied; the same secret in a
    second holder of the same kind (a copy: another day's object) is refused."""
    key = ReleaseKey.generate()
    twin = ReleaseKey(key.secret_bytes())
    build, source = _holders()[holder]
    p = beam.Pipeline()
    inputs = source(p)
    inputs | "First" >> build(key)
    with pytest.raises(KeyReuseError):
        inputs | "Second" >> build(twin)


def _holders():
    from transforms.ara.beam import EncodeConversions, SummaryReport
    from transforms.ara.contribution import CONTRIBUTION_BUDGET, ContributionConfig
    from transforms.lark.beam import HelperAggregate, ShareRecords
    from transforms.lark.randomness import BrowserRandomness
    from transforms.lark.params import AggregationParams
    from transforms.ldp.beam import RandomizeLabels
    from transforms.ldp.labels import LabelRandomizer
    from transforms.sketches.beam import ReleaseReachFrequency
    from transforms.sketches.dp import ReachFrequencyNoise
    from transforms.sketches.liquid_legions import SketchConfig

    def empty(p):
        return p | "Empty" >> beam.Create([])

    def summary_inputs(p):
        return {"contributions": p | "C" >> beam.Create([]), "domain": p | "D" >> beam.Create([])}

    return {
        "DPAggregate": (lambda key: _aggregate(PrivacyBudget(epsilon=1.0), key), empty),
        "SummaryReport": (lambda key: SummaryReport(1.0, key), summary_inputs),
        "EncodeConversions": (lambda key: EncodeConversions(ContributionConfig(
            measures=("value",), clip_thresholds=(10.0,), slice_dimensions=(), prefixes=(0,),
            budgets=((CONTRIBUTION_BUDGET,),)), key), empty),
        "RandomizeLabels": (lambda key: RandomizeLabels(
            LabelRandomizer(epsilon=1.0, labels=("a", "b")), label_column="label",
            id_column="id", release_key=key), empty),
        "ReleaseReachFrequency": (lambda key: ReleaseReachFrequency(
            SketchConfig(num_registers=100, decay_rate=10.0),
            ReachFrequencyNoise(budget=PrivacyBudget(epsilon=1.0), num_publishers=1), key,
            max_frequency=3), empty),
        "HelperAggregate": (lambda key: HelperAggregate(
            AggregationParams(lower=0, upper=100, fraction_bits=8, epsilon=1.0, k=5), helper=0,
            release_key=key), empty),
        "ShareRecords": (lambda key: ShareRecords(randomness=BrowserRandomness.keyed(key),
                                                  num_features=2), empty),
    }


# --------------------------------------------------------------------------- ledger keys

def _request(release_id, digest):
    spec = calibrate("discrete_laplace", epsilon=1.0, l1_sensitivity=1)
    return ReleaseRequest(release_id=release_id, input_digest=digest,
                          scopes=[Scope(name="pageviews", budget=PrivacyBudget(epsilon=10.0))],
                          measures=[Measure.of_noise("count", spec,
                                                     Sensitivities(l0=1, linf=1.0, l1=1.0, l2=1.0))])


def _noise(key):
    spec = calibrate("discrete_laplace", epsilon=1.0, l1_sensitivity=1)
    return add_noise(spec, np.zeros(3, np.int64), RandomStreams.for_keys(key, "count", ["a", "b", "c"]))


def test_a_ledger_key_drives_its_own_release_only(tmp_path):
    """Every path by which a key the ledger issued for one release could drive a second input
    or release: re-runs reproduce (same input, new session), the same reservation's key twice
    is refused, other releases and take-overs get fresh keys, and the key file loaded outside
    the ledger drives nothing."""
    ledger = BudgetLedger(str(tmp_path / "ledger.json"), str(tmp_path / "keys"))
    [day1] = ledger.reserve(_request("pageviews/2024-05-01", "sha256:d1"))
    day1.key.claim("count", "release of day 1")
    with pytest.raises(KeyReuseError):  # the same reservation's key on a second input
        day1.key.claim("count", "a second input")

    [rerun] = ledger.reserve(_request("pageviews/2024-05-01", "sha256:d1"))
    assert rerun.resumed and rerun.key == day1.key
    rerun.key.claim("count", "the re-run")  # same release, same input: reproduces it
    assert np.array_equal(_noise(rerun.key), _noise(day1.key))
    with pytest.raises(KeyReuseError):
        rerun.key.claim("count", "the re-run again")

    [day2] = ledger.reserve(_request("pageviews/2024-05-02", "sha256:d2"))
    assert day2.key != day1.key
    day2.key.claim("count")
    [taken] = ledger.reserve(_request("pageviews/2024-05-02", "sha256:d2-fixed"))
    assert taken.taken_over and taken.key != day2.key  # unpublished: taken over with a fresh key

    uri = day1.key_refs["release"].uri
    for loaded in (ReleaseKey.load(uri), KeyStore(str(tmp_path / "keys")).load(day1.key_refs["release"]),
                   pickle.loads(pickle.dumps(ReleaseKey.load(uri)))):
        assert loaded == day1.key and loaded.issued_for == "pageviews/2024-05-01"
        with pytest.raises(KeyReuseError, match="was issued for release"):
            loaded.claim("other purpose", "a library pipeline")
        with pytest.raises(KeyReuseError, match="was issued for release"):
            SharedBudget(PrivacyBudget(epsilon=1.0), weights={"a": 1}, release_key=loaded)
        with pytest.raises(KeyReuseError, match="was issued for release"):
            loaded.derive("day 2")
    with pytest.raises(KeyReuseError, match="one key, one release"):
        ReleaseKey.load(uri).bound("elsewhere", issued_for="pageviews/2024-05-02")


# --------------------------------------------------------------------------- audit worlds

def _two_worlds(ledger_root, claim):
    """The sequence audits' shape: per world its own ledger, the same seeded keys."""
    for world in ("without the unit", "with the unit"):
        with audit_world():
            ledger = BudgetLedger(str(ledger_root / world / "ledger.json"),
                                  str(ledger_root / world / "keys"))
            [day] = ledger.reserve(_request("pageviews/2024-05-01", f"sha256:{world}"))
            claim(day.key, world)


def test_audit_worlds_share_public_seed_keys_and_nothing_else(tmp_path, monkeypatch):
    """tests/sequence_kit.py runs the two worlds of a pair with the same ledger keys in one
    process: public-seed keys are claimed per world (copies, reloads, ledger bindings and
    children included); within a world, and for every other key, claims stay process-wide."""
    monkeypatch.setattr(ReleaseKey, "generate", classmethod(
        lambda cls: cls.from_public_seed("world-test/0")))  # each world's one ledger key

    def claim(key, world):
        key.claim("count", world)
        key.derive("part").claim("count", world)
        with pytest.raises(KeyReuseError):  # within one world: once, as in production
            ReleaseKey(key.secret_bytes()).bound("again").claim("count", "again")
        with pytest.raises(KeyReuseError):
            key.derive("part")

    _two_worlds(tmp_path, claim)  # the same secret drives both worlds
    seeded = ReleaseKey.from_public_seed("world-test/0")
    assert not seeded.is_testing and not seeded.noise_free
    seeded.claim("outside")  # outside a world: process-wide
    with audit_world():
        with pytest.raises(RuntimeError, match="nest"):
            with audit_world():
                pass
    with pytest.raises(KeyReuseError):
        ReleaseKey.from_public_seed("world-test/0").claim("outside")


def test_an_audit_world_does_not_exempt_a_secret_key(tmp_path):
    """The production guard is not scoped: a CSPRNG key (or one loaded from a store) claimed in
    one world is refused in the next, and a key claimed outside is refused inside."""
    key = ReleaseKey.generate()
    store = KeyStore(str(tmp_path / "keys"))
    ref = store.save(key, "day")
    with audit_world():
        key.claim("count", "world 1")
        key.derive("part")
    with audit_world():
        for same in (key, store.load(ref), pickle.loads(pickle.dumps(key))):
            with pytest.raises(KeyReuseError, match="world 1"):
                same.claim("count", "world 2")
            with pytest.raises(KeyReuseError):
                same.derive("part")
    issued, _ = store.issue("pageviews/2024-05-03")
    issued.claim("noise")
    with audit_world():
        with pytest.raises(KeyReuseError):
            issued.claim("noise")


def test_the_key_store_issues_one_key_per_release_name(tmp_path):
    store = KeyStore(str(tmp_path / "keys"))
    key, ref = store.issue("pageviews/2024-05-01")
    assert store.load(ref) == key and not key.is_testing
    assert key.issued_for == store.load(ref).issued_for == "pageviews/2024-05-01"
    with pytest.raises(FileExistsError, match="pageviews/2024-05-01"):
        store.issue("pageviews/2024-05-01")
    other, _ = store.issue("pageviews/2024-05-02")
    assert other != key


@pytest.mark.parametrize("failing", [1, 2])
def test_a_full_key_store_leaves_no_key_and_no_issue_record(tmp_path, monkeypatch, failing):
    """Fault injection (issue 40.5): the disk fills at the ``failing``-th file write of
    ``KeyStore.issue`` (1: the issue record, 2: the key file). The error names errno 28 and the
    file; nothing of the key is left behind (no key file, no record, no temporary file), so the
    same release name is issued once space is back."""
    import errno
    import os

    store = KeyStore(str(tmp_path / "keys"))
    real, writes = os.fdopen, []

    class _Full:
        def __init__(self, handle):
            self._handle = handle

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self._handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._handle.close()

    def fdopen(fd, *args, **kwargs):
        writes.append(fd)
        handle = real(fd, *args, **kwargs)
        return _Full(handle) if len(writes) == failing else handle

    monkeypatch.setattr(os, "fdopen", fdopen)
    with pytest.raises(OSError) as raised:
        store.issue("pageviews/2024-05-01", input_digest="sha256:" + "0" * 64)
    monkeypatch.setattr(os, "fdopen", real)
    assert raised.value.errno == errno.ENOSPC
    assert len(writes) == failing
    assert sorted(os.listdir(tmp_path / "keys")) == [], "a key or record left behind"
    key, ref = store.issue("pageviews/2024-05-01", input_digest="sha256:" + "0" * 64)
    assert store.load(ref) == key


# --------------------------------------------------------------------------- the documented example

def _example() -> str:
    doc = accounting.keystore.__doc__
    block = re.search(r"Example \(a daily release.*?::\n\n(.*?)\n\n(?=\S)", doc, re.S)
    assert block, "the daily-release example is missing from accounting/keystore.py"
    return textwrap.dedent(block.group(1))


def test_the_daily_release_example_runs_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(_example(), "accounting/keystore.py (example)", "exec"), {"__name__": "example"})
    out = capsys.readouterr().out
    assert "2024-05-01 released" in out and "2024-05-02 released" in out
    assert "refused: a key was already issued" in out and "refused: KeyReuseError" in out
    assert len(list((tmp_path / "release-keys").glob("*.key"))) == 2
