"""Beam wiring for sketch-based reach and frequency (thin: the math lives in the sibling modules).

    batches of impression rows (pyarrow Tables)
      | BuildSketches          -> ((campaign, publisher), partial sketch) per batch and key,
      |                           plus an empty sketch per declared key (the merge identity)
      | CombinePerKey(SketchUnionFn)             -> one sketch per (campaign, publisher)
      | UnionAcrossPublishers                    -> + one union sketch per campaign
      | ReleaseReachFrequency (global noise, or n helper stages adding Polya shares)
      -> dict per (campaign, scope): noisy reach and frequency distribution 1..K (K = "K+")

Every (campaign, scope) is keyed as ``(campaign, (scope_kind, publisher))`` with scope kind
"publisher" or "union" (publisher "" for the union).

Output order (the rule of :mod:`transforms.release`): the released records are one per declared
(campaign, scope), a set fixed by the declared campaigns and publishers, never by the data; a
sink that writes them to one file sorts them by :func:`release_order` (campaign, the union
first, then publishers by name), never by arrival order.
"""
from __future__ import annotations

import functools
from typing import Iterable, Mapping

import apache_beam as beam

from accounting.keys import ReleaseKey
from transforms.counting import Counted, Counters, CountingDoFn
from transforms.keyset import PublicKeyset
from transforms.sketches import dp
from transforms.sketches.estimators import (estimate_reach, frequency_distribution, k_plus_reach,
                                            k_reach)
from transforms.sketches.fingerprint import FingerprintSalt
from transforms.sketches.impressions import IdType, ImpressionColumns, partial_sketches
from transforms.sketches.liquid_legions import LiquidLegionsSketch, SketchConfig

__all__ = ["SketchUnionFn", "BuildSketches", "UnionAcrossPublishers", "ReleaseKeys",
           "ReleaseReachFrequency", "ReachFrequency", "PUBLISHER", "UNION", "estimate_record",
           "release_order", "declared_keys"]

PUBLISHER = "publisher"
UNION = "union"
_NAMESPACE = "reach_frequency"


class SketchUnionFn(beam.CombineFn):
    """Union of LiquidLegions sketches: register-wise count sum and unique-merge of keys.

    The accumulator is None (nothing seen) or a sketch owned by the accumulator; the merge is
    associative and commutative, so any runner may combine in any order and lift the combine
    before the shuffle.
    """

    def create_accumulator(self):
        return None

    def add_input(self, accumulator, sketch):
        if accumulator is None:
            return sketch.copy()
        return accumulator.merge_in_place(sketch)

    def merge_accumulators(self, accumulators):
        # Only the first accumulator may be modified (Beam's contract); others are copied.
        accumulators = iter(accumulators)
        merged = next(accumulators, None)
        for acc in accumulators:
            if acc is None:
                continue
            merged = acc.copy() if merged is None else merged.merge_in_place(acc)
        return merged

    def extract_output(self, accumulator):
        return accumulator


def _declared(values, name: str) -> list[str]:
    if values is None or isinstance(values, str):
        raise ValueError(f"{name}: declare the released {name} as a list of names (the released "
                         f"keys are public and never read from the data)")
    names = sorted({str(v) for v in values})
    if not names or any(not n.strip() for n in names):
        raise ValueError(f"{name}: must be a non-empty list of non-blank names, got {values!r}")
    return names


@functools.lru_cache(maxsize=4096)
def _salt(campaign: str, shared_secret: bytes) -> FingerprintSalt:
    return FingerprintSalt.for_campaign(campaign, shared_secret)


class _SketchBatches(CountingDoFn):
    """One Arrow batch -> partial sketches per (campaign, publisher); row rules -> counters."""

    def __init__(self, config, columns, id_type, campaigns, publishers, shared_secret):
        self._config = config
        self._columns = columns
        self._id_type = IdType(id_type)
        self._campaigns = None if campaigns is None else tuple(campaigns)
        self._publishers = None if publishers is None else tuple(publishers)
        self._secret = shared_secret
        self._counters = Counters(_NAMESPACE, prefix="rows_")

    def process(self, batch):
        sketches, counts = partial_sketches(
            batch, config=self._config, salt_of=lambda c: _salt(c, self._secret),
            columns=self._columns, id_type=self._id_type, campaigns=self._campaigns,
            publishers=self._publishers)
        self._counters.inc("read", counts.rows)
        for name in ("used", "missing_id", "missing_key", "undeclared_key"):
            self._counters.inc(name, getattr(counts, name))
        yield from sketches


def declared_keys(campaigns, publishers) -> list[tuple[str, str]]:
    """Every declared (campaign, publisher): the public keyset of the per-publisher sketches."""
    keyset = PublicKeyset.cross_product({"campaign": list(campaigns), "publisher": list(publishers)})
    return [(row["campaign"], row["publisher"]) for row in keyset.to_table().to_pylist()]


class BuildSketches(beam.PTransform):
    """PCollection of pyarrow Tables/RecordBatches -> ((campaign, publisher), sketch).

    The released keys are never read from the data: every declared (campaign, publisher) pair
    gets a sketch even without rows (an empty publisher releases pure noise) and rows of
    undeclared campaigns or publishers are dropped and counted.
    """

    def __init__(self, config: SketchConfig, *, columns: ImpressionColumns = ImpressionColumns(),
                 id_type: IdType | str = IdType.INT, campaigns: Iterable[str],
                 publishers: Iterable[str], shared_secret: bytes = b""):
        super().__init__()
        self._config = config
        self._columns = columns
        self._id_type = IdType(id_type)
        self._campaigns = _declared(campaigns, "campaigns")
        self._publishers = _declared(publishers, "publishers")
        self._secret = shared_secret.encode() if isinstance(shared_secret, str) else shared_secret

    def expand(self, batches):
        partials = batches | "SketchBatches" >> Counted(_SketchBatches(
            self._config, self._columns, self._id_type, self._campaigns, self._publishers,
            self._secret))
        config, secret = self._config, self._secret
        identities = (
            batches.pipeline
            | "DeclaredKeys" >> beam.Create(declared_keys(self._campaigns, self._publishers))
            | "EmptySketches" >> beam.Map(
                lambda key: (key, LiquidLegionsSketch.empty(config, _salt(key[0], secret)))))
        partials = (partials, identities) | "WithDeclaredKeys" >> beam.Flatten()
        return partials | "UnionPerPublisher" >> beam.CombinePerKey(SketchUnionFn())


class UnionAcrossPublishers(beam.PTransform):
    """((campaign, publisher), sketch) -> (campaign, (scope kind, publisher)) for every publisher
    sketch plus one union sketch per campaign (scope ("union", ""))."""

    def expand(self, publisher_sketches):
        per_publisher = publisher_sketches | "PublisherScope" >> beam.MapTuple(
            lambda key, sketch: ((key[0], (PUBLISHER, key[1])), sketch))
        union = (publisher_sketches
                 | "ByCampaign" >> beam.MapTuple(lambda key, sketch: (key[0], sketch))
                 | "UnionPerCampaign" >> beam.CombinePerKey(SketchUnionFn())
                 | "UnionScope" >> beam.MapTuple(
                     lambda campaign, sketch: ((campaign, (UNION, "")), sketch)))
        return (per_publisher, union) | "AllScopes" >> beam.Flatten()


def estimate_record(campaign: str, scope: tuple[str, str], noisy: dp.SketchStatistics,
                    config: SketchConfig, noise: dp.ReachFrequencyNoise,
                    noise_mode: str) -> dict:
    """The released row of one (campaign, scope): post-processing of the noisy statistics."""
    reach = estimate_reach(noisy.active_registers, config)
    dist = frequency_distribution(noisy.histogram)
    kind, publisher = scope
    return {
        "campaign": campaign,
        "scope": kind,
        "publisher": publisher if kind == PUBLISHER else None,
        "reach": round(reach, 3),
        "max_frequency": len(dist),
        "frequency": [round(float(f), 6) for f in dist],
        "k_reach": [round(float(v), 3) for v in k_reach(reach, dist)],
        "k_plus_reach": [round(float(v), 3) for v in k_plus_reach(reach, dist)],
        "noise": noise_mode,
        "epsilon_reach": noise.reach_spec().epsilon,
        "epsilon_frequency": noise.histogram_spec().epsilon,
    }


def release_order(record: dict) -> tuple:
    """Sort key of released records: campaign, then the union scope, then publishers by name."""
    return (record["campaign"], record["scope"] != UNION, record["publisher"] or "")


class _Statistics(beam.DoFn):
    def __init__(self, max_frequency):
        self._k = max_frequency

    def process(self, element):
        (campaign, scope), sketch = element
        yield (campaign, scope), dp.SketchStatistics.of(sketch, self._k)


class _GlobalNoise(beam.DoFn):
    def __init__(self, noise, release_keys):
        self._noise, self._keys = noise, release_keys

    def process(self, element):
        (campaign, scope), stats = element
        yield (campaign, scope), dp.add_global_noise(stats, self._noise,
                                                     self._keys.for_campaign(campaign),
                                                     campaign, scope)


class _HelperShare(beam.DoFn):
    """One helper: adds its Polya-difference share from its own key; it never sees the others'."""

    def __init__(self, helper_key, num_helpers, noise):
        self._key, self._n, self._noise = helper_key, num_helpers, noise

    def process(self, element):
        (campaign, scope), stats = element
        yield (campaign, scope), dp.add_helper_share(stats, self._key, self._n, self._noise,
                                                     campaign, scope)


class ReleaseKeys:
    """The release key of each campaign: one key for all, or one per campaign (e.g. one per
    budget-ledger reservation)."""

    def __init__(self, keys: ReleaseKey | Mapping[str, ReleaseKey]):
        if isinstance(keys, ReleaseKey):
            self._default, self._by_campaign = keys, {}
        elif isinstance(keys, Mapping) and keys and \
                all(isinstance(k, ReleaseKey) for k in keys.values()):
            self._default, self._by_campaign = None, {str(c): k for c, k in keys.items()}
        else:
            raise TypeError("release_key: a transforms.noise.ReleaseKey or a non-empty mapping "
                            "campaign -> ReleaseKey")

    def covers(self, campaigns: Iterable[str]) -> bool:
        return self._default is not None or all(c in self._by_campaign for c in campaigns)

    def for_campaign(self, campaign: str) -> ReleaseKey:
        return self._default if self._default is not None else self._by_campaign[campaign]

    def any_key(self) -> ReleaseKey:
        """The default key, or the first campaign's (for testing-only derivations)."""
        return self._default if self._default is not None else \
            self._by_campaign[min(self._by_campaign)]

    def claim(self, purpose: str, owner: str) -> None:
        """Claim ``purpose`` once on every distinct key object (see ReleaseKey.claim): a
        transform holding these keys cannot be applied twice."""
        keys = [self._default] if self._default is not None else list(self._by_campaign.values())
        for key in {id(k): k for k in keys}.values():
            key.claim(purpose, owner=owner)


class ReleaseReachFrequency(beam.PTransform):
    """(campaign, scope) sketches -> released dicts (see :func:`estimate_record`).

    Global noise by one trusted aggregator (the default), or distributed noise: one stage per
    helper, each adding a Polya share drawn from the helper's own key (``helper_keys``: helper
    name -> ReleaseKey; their sum is the same discrete Laplace noise, within the total-variation
    bound of :mod:`transforms.sketches.dp`, whose extra delta :meth:`guarantee` includes).
    ``num_helpers = n`` without ``helper_keys`` is for tests only: it derives the helpers' keys
    from a *testing* release key and refuses a secret one. ``release_key``: one key, or a
    mapping campaign -> key (global noise).
    """

    def __init__(self, config: SketchConfig, noise: dp.ReachFrequencyNoise,
                 release_key: ReleaseKey | Mapping[str, ReleaseKey], *, max_frequency: int,
                 num_helpers: int = 0, helper_keys: Mapping[str, ReleaseKey] = None):
        super().__init__()
        keys = release_key if isinstance(release_key, ReleaseKeys) else ReleaseKeys(release_key)
        if isinstance(num_helpers, bool) or int(num_helpers) != num_helpers or num_helpers < 0:
            raise ValueError(f"num_helpers: must be an integer >= 0, got {num_helpers!r}")
        if helper_keys is not None:
            if not isinstance(helper_keys, Mapping) or not helper_keys or \
                    not all(isinstance(k, ReleaseKey) for k in helper_keys.values()):
                raise TypeError("helper_keys: a non-empty mapping helper name -> ReleaseKey")
            if num_helpers not in (0, len(helper_keys)):
                raise ValueError(f"num_helpers: {num_helpers} but {len(helper_keys)} helper keys")
            if len({id(k) for k in helper_keys.values()}) != len(helper_keys) or \
                    len(set(helper_keys.values())) != len(helper_keys):
                raise ValueError("helper_keys: every helper needs a key of its own")
            helper_keys = {str(h): helper_keys[h] for h in sorted(helper_keys, key=str)}
        elif num_helpers:
            helper_keys = dp.helper_keys_for_testing(keys.any_key(), int(num_helpers))
        if helper_keys and noise.kind.value != "discrete_laplace":
            raise ValueError("num_helpers: distributed Polya noise needs discrete_laplace noise")
        if isinstance(max_frequency, bool) or int(max_frequency) != max_frequency \
                or max_frequency < 1:
            raise ValueError(f"max_frequency: must be an integer >= 1, got {max_frequency!r}")
        self._config, self._noise, self._keys = config, noise, keys
        self._helpers = helper_keys or {}
        self._k, self._n = int(max_frequency), len(self._helpers)

    def guarantee(self):
        """Each campaign's (epsilon, delta), distributed noise's sampler slack included."""
        return self._noise.total(self._n, self._k)

    def expand(self, scoped_sketches):
        owner = f"{type(self).__name__} {self.label!r}"
        stats = scoped_sketches | "Statistics" >> beam.ParDo(_Statistics(self._k))
        if self._n == 0:
            self._keys.claim(dp.NOISE_PURPOSE, owner)
            noisy = stats | "GlobalNoise" >> beam.ParDo(_GlobalNoise(self._noise, self._keys))
            mode = "global"
        else:
            noisy = stats
            for i, (name, key) in enumerate(self._helpers.items()):
                key.claim(dp.SHARE_PURPOSE, owner)
                noisy = noisy | f"Helper{i}AddsShare" >> beam.ParDo(
                    _HelperShare(key, self._n, self._noise))
            mode = f"distributed/{self._n}"
        config, noise = self._config, self._noise
        return noisy | "Estimate" >> beam.MapTuple(
            lambda key, s: estimate_record(key[0], key[1], s, config, noise, mode))


class ReachFrequency(beam.PTransform):
    """Impression batches -> released reach and frequency per campaign, publisher and union."""

    def __init__(self, config: SketchConfig, noise: dp.ReachFrequencyNoise,
                 release_key: ReleaseKey | Mapping[str, ReleaseKey], *, max_frequency: int,
                 num_helpers: int = 0, helper_keys: Mapping[str, ReleaseKey] = None,
                 columns: ImpressionColumns = ImpressionColumns(),
                 id_type: IdType | str = IdType.INT, campaigns: Iterable[str],
                 publishers: Iterable[str], shared_secret: bytes = b""):
        super().__init__()
        if len(_declared(publishers, "publishers")) != noise.num_publishers:
            raise ValueError(f"publishers: {len(_declared(publishers, 'publishers'))} declared "
                             f"but the budget is split for {noise.num_publishers}")
        keys = ReleaseKeys(release_key)
        if not keys.covers(_declared(campaigns, "campaigns")):
            raise ValueError("release_key: no key for some declared campaigns")
        self._build = BuildSketches(config, columns=columns, id_type=id_type,
                                    campaigns=campaigns, publishers=publishers,
                                    shared_secret=shared_secret)
        self._release = ReleaseReachFrequency(config, noise, keys,
                                              max_frequency=max_frequency,
                                              num_helpers=num_helpers, helper_keys=helper_keys)

    def guarantee(self):
        """Each campaign's (epsilon, delta) (see ReleaseReachFrequency.guarantee)."""
        return self._release.guarantee()

    def expand(self, batches):
        return (batches
                | "BuildSketches" >> self._build
                | "UnionAcrossPublishers" >> UnionAcrossPublishers()
                | "Release" >> self._release)

