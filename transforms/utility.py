"""Utility analysis before a release, and contribution bounds chosen privately.

:func:`analyze` answers, for a :class:`~transforms.aggregate.DPAggregate` configuration and a
few candidate (bounds, budget) pairs, *before anything is released*: what share of the rows
contribution bounding drops, how far each key's released value is expected to be from its
true value (bias of bounding and clamping plus noise), and what share of keys thresholds or
private key selection are expected to suppress. It runs in-process on the data or a sample
(an Arrow table, a pandas / Polars DataFrame or a list of dicts) through the transform's own
bounding code, so it sees exactly the rows a release would keep (up to the secret priorities:
it bounds with a fixed testing key). **It reads raw data and its results are not DP**: they
are for the data owner choosing parameters, never for publication. Use a sample, or a
previous period's data, to keep the choice itself from depending on the released data.

Per key and metric (count, sum, mean, privacy-unit count):

* ``true``: the aggregate of all valid rows (no bounding, no clamping);
* ``expected``: the aggregate of the bounded, clamped rows (what the noise is added to);
* ``noise_std``: the noise's standard deviation (a mean's by the delta method, from the noisy
  count and normalized sum it is derived from);
* ``rmse = sqrt((expected - true)^2 + noise_std^2)``, ``relative_error = rmse / max(|true|, 1)``;
* ``p_suppressed``: the probability that the key is not released: its metric's noisy value not
  above the threshold (the continuous Laplace / Gaussian distribution approximates the discrete
  one) or, with private selection, the selector's drop probability for its unit count.

:func:`choose_bounds` picks ``max_partitions`` and ``max_contributions_per_partition`` with
differential privacy: each as the candidate (powers of two by default) whose cell ``(c_prev, c]``
holds the ``quantile`` of the per-unit statistic (keys per unit; largest row count of a unit in
one key), chosen by :mod:`transforms.private_quantile` -- permute-and-flip over the rank
distance, sampled exactly, its exponent ``epsilon d / (2 max(q, 1 - q))`` under add/remove (the
score is monotone up to a constant: no further factor 2; ``epsilon d`` at the median) and
``epsilon d / 2`` under substitution -- each bound with half the given epsilon. One unit adds or
removes one entry of each statistic, so this is the neighbouring relation the proof there needs.
The choice spends budget, so it takes a part of the job's
:class:`~accounting.shared_budget.SharedBudget` (a plain budget is refused: it would be composed
nowhere); the part's guarantee (``shared.guarantee()``) includes the choice.
"""
from __future__ import annotations

import collections
import csv
from dataclasses import dataclass, field, replace
from typing import Mapping, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from accounting.budget import PrivacyBudget, ReleasePlan, check_spendable
from accounting.keys import ReleaseKey
from accounting.measures import Measure
from accounting.sensitivity import ContributionBounds, Neighbouring

__all__ = ["Candidate", "UtilityReport", "analyze", "choose_bounds", "BoundsChoice",
           "bound_statistics", "bound_utilities"]

_ANALYSED = ("count", "sum", "mean", "privacy_unit_count")
_HUGE = 2 ** 40


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One parameter choice to compare: contribution bounds and budget."""

    name: str
    bounds: ContributionBounds
    budget: PrivacyBudget


@dataclass(frozen=True, kw_only=True)
class UtilityReport:
    """Per-key rows and a per-(candidate, metric) summary (see the module docstring); the lists
    are filled by :func:`analyze`."""

    per_key: list = field(default_factory=list)
    summary: list = field(default_factory=list)

    SUMMARY_COLUMNS = ("candidate", "metric", "rows_dropped_by_bounding", "keys",
                       "median_relative_error", "mean_relative_error", "share_keys_suppressed")
    PER_KEY_COLUMNS = ("candidate", "key", "metric", "true", "expected", "bias", "noise_std", "rmse",
                       "relative_error", "p_suppressed")

    def table(self) -> str:
        """The summary as aligned text."""
        rows = [self.SUMMARY_COLUMNS] + [tuple(_fmt(r[c]) for c in self.SUMMARY_COLUMNS) for r in self.summary]
        widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)

    def write_csv(self, path: str, per_key: bool = False) -> None:
        columns = self.PER_KEY_COLUMNS if per_key else self.SUMMARY_COLUMNS
        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns)
            writer.writeheader()
            for row in (self.per_key if per_key else self.summary):
                writer.writerow({c: row[c] for c in columns})

    def plot(self, path: str) -> list[dict]:
        """Three panels across candidates, each on its full scale from zero: rows dropped by
        bounding (a share, [0, 1]), median relative error per metric (from 0) and keys
        suppressed ([0, 1]). Every bar is labelled with its value, so a zero shows as "0"; a
        panel whose values are all zero, or the same for every metric, says so in it.

        Returns each panel drawn (title, its bars' values, the notes written in it).
        """
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt

        candidates = list(dict.fromkeys(r["candidate"] for r in self.summary))
        metrics = list(dict.fromkeys(r["metric"] for r in self.summary))
        rows = {(r["candidate"], r["metric"]): r for r in self.summary}
        x = np.arange(len(candidates))
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
        notes = {0: [], 1: [], 2: []}

        def bars(ax, column, per_metric):
            """Grouped bars (one per metric, hatched apart) or one bar per candidate."""
            shown = metrics if per_metric else metrics[:1]
            width = 0.8 / len(shown)
            for j, metric in enumerate(shown):
                values = [rows[(c, metric)][column] for c in candidates]
                drawn = ax.bar(x + (j - (len(shown) - 1) / 2) * width, values, width,
                               label=metric if per_metric else None, color=f"C{j}",
                               hatch=("", "//", "..", "xx", "\\\\", "oo")[j % 6], edgecolor="0.25")
                ax.bar_label(drawn, labels=[f"{v:.2g}" for v in values], fontsize=7.5, padding=1)

        def same_for_every_metric(column):
            return all(len({rows[(c, m)][column] for m in metrics}) == 1 for c in candidates)

        # Rows dropped is a property of the bounds, the same for every metric: one bar each.
        bars(axes[0], "rows_dropped_by_bounding", per_metric=False)
        if all(rows[(c, metrics[0])]["rows_dropped_by_bounding"] == 0 for c in candidates):
            notes[0].append("no row dropped: every privacy unit\nis within each candidate's bounds")
        bars(axes[1], "median_relative_error", per_metric=True)
        # Keys are suppressed by a threshold on the key (or private selection): usually the same
        # for every metric; per metric only when thresholds apply to values.
        by_metric = not same_for_every_metric("share_keys_suppressed")
        bars(axes[2], "share_keys_suppressed", per_metric=by_metric)
        if all(r["share_keys_suppressed"] == 0 for r in self.summary):
            notes[2].append("no key expected to be suppressed:\nno threshold and a public keyset")
        elif not by_metric and len(metrics) > 1:
            notes[2].append("the same for every metric:\nthresholds suppress whole keys")
        titles = ("rows dropped by bounding (share)", "median relative error per key",
                  "keys suppressed (expected share)")
        for i, (ax, title) in enumerate(zip(axes, titles)):
            ax.set_xticks(x, candidates, rotation=20)
            ax.set_title(title)
            ax.grid(True, axis="y", alpha=0.3)
            for k, text in enumerate(notes[i]):
                ax.text(0.5, 0.62 - 0.2 * k, text, transform=ax.transAxes, ha="center",
                        va="center", fontsize=8.5, bbox={"boxstyle": "round",
                                                         "facecolor": "lightyellow",
                                                         "edgecolor": "0.6"})
        axes[0].set_ylim(0, 1.05)
        axes[1].set_ylim(0, max([r["median_relative_error"] for r in self.summary] + [0]) * 1.15
                         or 1)
        axes[2].set_ylim(0, 1.05)
        axes[1].legend(fontsize=8)
        fig.suptitle("Utility before release (not DP: for choosing parameters)")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        drawn = [{"title": ax.get_title(), "values": [p.get_height() for p in ax.patches],
                  "notes": [t.get_text() for t in ax.texts if t.get_bbox_patch() is not None]}
                 for ax in axes]
        plt.close(fig)
        return drawn


def _fmt(value):
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _as_table(data) -> pa.Table:
    from transforms.tables import as_arrow_table

    table = as_arrow_table(data)
    if table is None:
        table = pa.Table.from_pylist(list(data))
    return table


def _partials(config, table: pa.Table) -> Optional[pa.Table]:
    """Per-key partials through DPAggregate's own bounding DoFns (no runner)."""
    from transforms.bounding_stage import _BoundRowsFn, _PrepareAndBound, _ShardPartials
    from transforms.partials import sum_partials

    combine = _BoundRowsFn(config.bounds.max_partitions, config.bounds.max_contributions_per_partition)
    by_shard = collections.defaultdict(combine.create_accumulator)
    for shard, part in _PrepareAndBound(config)._prepare(table, None)[0]:
        by_shard[shard] = combine.add_input(by_shard[shard], part)
    pieces = [t for shard, accumulator in by_shard.items()
              for t in _ShardPartials(config).process((shard, combine.extract_output(accumulator)))]
    return sum_partials(pieces, list(config.keys))


def _p_below(spec, mean: np.ndarray, threshold: float) -> np.ndarray:
    """P(mean + noise <= threshold), continuous approximation of the spec's noise."""
    from scipy import stats

    if spec.kind.is_gaussian:
        return stats.norm.cdf(threshold, loc=mean, scale=spec.scale)
    scale = spec.scale
    return stats.laplace.cdf(threshold, loc=mean, scale=scale)


def analyze(data, *, privacy_unit: str, keys: Sequence[str], metrics, candidates: Sequence[Candidate],
            value: str = None, keyset=None, selection=None,
            neighbouring=Neighbouring.ADD_REMOVE) -> UtilityReport:
    """Utility of each candidate on ``data`` (module docstring). Metrics other than count,
    sum, mean and privacy-unit count are planned (they share the budget) but not analysed."""
    from transforms.aggregate import Compute, DPAggregate, Keys

    if not candidates:
        raise ValueError("give at least one Candidate")
    table = _as_table(data)
    keys = [keys] if isinstance(keys, str) else list(keys)
    report = UtilityReport()
    for candidate in candidates:
        if not isinstance(candidate, Candidate):
            raise TypeError(f"candidates must be Candidate objects, got {type(candidate).__name__}")
        aggregate = DPAggregate(
            compute=Compute(metrics=metrics, value=value),
            keys=Keys(privacy_unit=privacy_unit, columns=keys, keyset=keyset, selection=selection),
            bounds=candidate.bounds,
            budget=_analysed(candidate.budget),
            release_key=ReleaseKey.for_testing(0),
            neighbouring=neighbouring)
        aggregate.check_schema(table.schema)
        config = aggregate._config
        bounded = _partials(config, table)
        low_high = (-1e300, 1e300) if config.value else (None, None)
        raw_config = replace(config, bounds=ContributionBounds(
            max_partitions=_HUGE, max_contributions_per_partition=_HUGE,
            min_value=low_high[0], max_value=low_high[1]), midpoint=0.0)
        raw = _partials(raw_config, table)
        key_list = _keys_of(aggregate, raw, keys)
        b = _by_key(bounded, keys, key_list)
        r = _by_key(raw, keys, key_list)
        rows_total = float(r["count"].sum())
        dropped = 1.0 - float(b["count"].sum()) / rows_total if rows_total else 0.0
        specs = {m.name: m.noise for m in aggregate.plan.measures}
        keep = None
        if aggregate.selector is not None:
            keep = np.array([aggregate.selector.keep_probability(int(n)) for n in b["units"]])
        suppressed_any = np.zeros(len(key_list)) if keep is None else 1 - keep
        analysed = []
        for metric in aggregate._metrics:
            kind = metric.kind.value
            if kind not in _ANALYSED:
                continue
            name = metric.column
            if kind in ("count", "privacy_unit_count", "sum"):
                column = {"count": "count", "privacy_unit_count": "units", "sum": "sum"}[kind]
                std = np.full(len(key_list), aggregate._single_noise(metric)[0])
                true, expected = r[column], b[column]
            else:
                low, high = candidate.bounds.value_range()
                mid = (low + high) / 2
                n_true = np.maximum(r["count"], 1)
                n = np.maximum(b["count"], 1)
                true = r["sum"] / n_true
                expected = mid + b["nsum"] / n
                count_spec = specs[aggregate.moments.count]
                nsum_spec = specs[aggregate.moments.nsum]
                std = np.sqrt(nsum_spec.std ** 2 + (b["nsum"] / n) ** 2 * count_spec.std ** 2) / n
                std = np.minimum(std, (high - low) / 2)
            bias = expected - true
            rmse = np.sqrt(bias ** 2 + std ** 2)
            relative = rmse / np.maximum(np.abs(true), 1.0)
            p_supp = np.zeros(len(key_list))
            if metric.threshold is not None and name in specs:
                p_supp = _p_below(specs[name], expected, metric.threshold)
                if aggregate._output.threshold_mode == "key":
                    suppressed_any = 1 - (1 - suppressed_any) * (1 - p_supp)
            if keep is not None:
                p_supp = 1 - keep * (1 - p_supp)
            analysed.append((name, p_supp))
            for i, key in enumerate(key_list):
                report.per_key.append({
                    "candidate": candidate.name, "key": key, "metric": name, "true": float(true[i]),
                    "expected": float(expected[i]), "bias": float(bias[i]), "noise_std": float(std[i]),
                    "rmse": float(rmse[i]), "relative_error": float(relative[i]),
                    "p_suppressed": float(p_supp[i])})
            report.summary.append({
                "candidate": candidate.name, "metric": name, "rows_dropped_by_bounding": dropped,
                "keys": len(key_list),
                "median_relative_error": float(np.median(relative)) if len(key_list) else 0.0,
                "mean_relative_error": float(np.mean(relative)) if len(key_list) else 0.0,
                "share_keys_suppressed": float(np.mean(p_supp)) if len(key_list) else 0.0})
        if aggregate._output.threshold_mode == "key":  # a key is dropped when any threshold fails
            for row in report.summary:
                if row["candidate"] == candidate.name and len(key_list):
                    row["share_keys_suppressed"] = float(np.mean(suppressed_any))
    return report


def _analysed(budget):
    """A candidate's budget for the analysis (which spends nothing): a SharedBudget part's
    budget is analysed as the plain budget of its values."""
    if isinstance(budget, PrivacyBudget) and budget.part is not None:
        return PrivacyBudget(epsilon=budget.epsilon, delta=budget.delta, rho=budget.rho)
    return budget


def _keys_of(aggregate, raw: Optional[pa.Table], keys) -> list:
    if aggregate.keyset is not None and aggregate.keyset.in_memory:
        table = aggregate.keyset.batch_at(0, max_rows=aggregate.keyset.size())
    elif raw is not None:
        table = raw.select(keys)
    else:
        return []
    return sorted(tuple(row[k] for k in keys) if len(keys) > 1 else row[keys[0]]
                  for row in table.select(keys).to_pylist())


def _by_key(partials: Optional[pa.Table], keys, key_list) -> dict:
    """partial column -> array aligned with key_list (zeros for keys without rows)."""
    out = collections.defaultdict(lambda: np.zeros(len(key_list)))
    if partials is None:
        return out
    index = {k: i for i, k in enumerate(key_list)}
    rows = partials.to_pylist()
    columns = [c for c in partials.column_names if c not in keys]
    arrays = {c: np.zeros(len(key_list)) for c in columns}
    for row in rows:
        key = tuple(row[k] for k in keys) if len(keys) > 1 else row[keys[0]]
        if key in index:
            for c in columns:
                arrays[c][index[key]] = row[c] or 0
    out.update(arrays)
    return out


# --------------------------------------------------------------------------- private bounds

@dataclass(frozen=True, kw_only=True)
class BoundsChoice:
    """Contribution bounds chosen with DP, and what the choice cost."""

    max_partitions: int
    max_contributions_per_partition: int
    plan: ReleasePlan
    selector = None

    def bounds(self, **kwargs) -> ContributionBounds:
        return ContributionBounds(max_partitions=self.max_partitions,
                                  max_contributions_per_partition=self.max_contributions_per_partition,
                                  **kwargs)

    def guarantee(self):
        return self.plan.guarantee("basic")

    def explain(self) -> str:
        return (f"contribution bounds chosen privately: max_partitions={self.max_partitions}, "
                f"max_contributions_per_partition={self.max_contributions_per_partition}\n"
                + self.plan.explain())


def bound_statistics(data, *, privacy_unit: str, keys: Sequence[str]) -> dict[str, np.ndarray]:
    """Per privacy unit (one entry each, canonical ids; rows with a null id or key dropped): the
    number of keys it contributes to (``max_partitions``) and its largest row count in one key
    (``max_contributions_per_partition``) -- the statistics :func:`choose_bounds` picks a
    quantile of. Adding or removing one unit adds or removes one entry of each."""
    from transforms.bounding_stage import check_schema
    from transforms.privacy_units import canonical_unit_ids

    keys = [keys] if isinstance(keys, str) else list(keys)
    table = _as_table(data)
    check_schema(table.schema, privacy_unit, keys, None)
    table = table.select([privacy_unit, *keys])
    table = table.set_column(0, privacy_unit, canonical_unit_ids(table.column(0), privacy_unit))
    valid = pc.is_valid(table.column(0))
    for k in keys:
        valid = pc.and_(valid, pc.is_valid(table.column(k)))
    table = table.filter(valid)
    pairs = table.group_by([privacy_unit, *keys], use_threads=False).aggregate([([], "count_all")])
    per_unit = pairs.group_by([privacy_unit], use_threads=False).aggregate(
        [([], "count_all"), ("count_all", "max")])
    return {"max_partitions": per_unit.column("count_all").to_numpy(),
            "max_contributions_per_partition": per_unit.column("count_all_max").to_numpy()}


def bound_utilities(statistics: Mapping[str, np.ndarray], candidates: Sequence[int],
                    quantile: float) -> dict[str, np.ndarray]:
    """Each bound's candidate utilities (:func:`transforms.private_quantile.rank_utility`) from
    :func:`bound_statistics`."""
    from transforms.private_quantile import rank_utility

    out = {}
    for name, stat in statistics.items():
        at_or_below = np.array([(stat <= c).sum() for c in candidates])
        out[name] = rank_utility(at_or_below, len(stat), quantile)
    return out


def choose_bounds(data, *, privacy_unit: str, keys: Sequence[str], budget, release_key: ReleaseKey = None,
                  quantile: float = 0.9, candidates: Sequence[int] = tuple(2 ** i for i in range(11)),
                  neighbouring=Neighbouring.ADD_REMOVE) -> BoundsChoice:
    """Choose L0 and Linf with DP (module docstring). ``budget``: a part of the job's
    SharedBudget (``shared.part(name)``, an (epsilon, delta) part; pure epsilon is used): the
    choice registers with it, so the job's guarantee includes it. ``release_key``: the key the
    choice draws from (default: the part's, else a fresh one)."""
    from accounting.shared_budget import BudgetPart
    from transforms.noise import RandomStreams
    from transforms.private_quantile import (GRID_BITS, choose_candidate, grid_epsilon,
                                             grid_quantile, score_scale)

    if not isinstance(budget, BudgetPart):
        check_spendable(budget, "choose_bounds")
        raise TypeError("choose_bounds spends privacy budget: give it a part of the job's "
                        "SharedBudget (budget=shared.part(name)) so the job's guarantee composes "
                        f"it; a plain {type(budget).__name__} would be composed nowhere")
    part = budget
    budget = part.spendable_budget(uses_delta=False)  # permute-and-flip: pure epsilon
    if budget.is_zcdp:
        raise ValueError("choose_bounds needs an (epsilon, delta) budget part (pure epsilon is used)")
    quantile = grid_quantile(quantile) / (1 << GRID_BITS)
    candidates = sorted({int(c) for c in candidates})
    if not candidates or candidates[0] < 1:
        raise ValueError("candidates must be positive integers")
    neighbouring = Neighbouring(neighbouring)
    epsilon = budget.epsilon / 2
    grid_epsilon(epsilon)  # refuse before any claim
    if release_key is None:
        release_key = part.release_key if part.release_key else ReleaseKey.generate()
    statistics = bound_statistics(data, privacy_unit=privacy_unit, keys=keys)
    chosen = []
    for name, stat in statistics.items():
        purpose = f"bounds:{name}"
        release_key.claim(purpose, owner="choose_bounds")
        at_or_below = np.array([(stat <= c).sum() for c in candidates])
        streams = RandomStreams.for_range(release_key, purpose, 1)
        index = choose_candidate(at_or_below, len(stat), quantile, epsilon, neighbouring, streams)[0]
        chosen.append(candidates[int(index)])
    scale = score_scale(quantile, neighbouring)
    why = ("the score is monotone up to a constant" if neighbouring is Neighbouring.ADD_REMOVE
           else "sensitivity 1, not monotone")
    plan = ReleasePlan(budget=PrivacyBudget(epsilon=budget.epsilon, delta=budget.delta))
    for name, stat_text in (("max_partitions", "keys per unit"),
                            ("max_contributions_per_partition", "largest rows of a unit in one key")):
        plan = plan.with_measures(Measure(
            name=f"bounds.{name}", mechanism="permute_and_flip", epsilon=epsilon,
            neighbouring=neighbouring,
            description=f"{name}: the candidate whose cell holds the {quantile:g} quantile of "
                        f"{stat_text} (on the 2^-{GRID_BITS} grid), permute-and-flip over the "
                        f"rank distance d sampled exactly, exponent epsilon d / {scale:g} "
                        f"({why}), candidates {candidates}"))
    choice = BoundsChoice(max_partitions=chosen[0], max_contributions_per_partition=chosen[1], plan=plan)
    part.register(choice)
    return choice
