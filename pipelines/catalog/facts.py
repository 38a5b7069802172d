"""The public facts of each dataset, derived once and rendered three ways (HTML page, README.md,
catalog.json) so the three always say the same thing.

Every fact here is a function of published markers and released files only
(:class:`pipelines.catalog.model.PublishedRelease`): what is released, the privacy unit and
neighbouring relations, mechanisms and noise, guarantees, budget scopes with the spend of the
published releases (:mod:`pipelines.catalog.budget`), thresholds and caveats.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from pipelines.catalog import budget as catalog_budget
from pipelines.catalog.about import About, about
from pipelines.catalog.model import Dataset, PublishedRelease, natural_key, scope_families


@dataclass(frozen=True, kw_only=True)
class ScopeRow:
    """One line of a dataset's budget table: a scope, or a family of per-period scopes.

    ``budget_text``: the budget as stated (a family with several budgets lists them);
    ``chart_budget``: the epsilon line of the chart (None when a family's budgets differ)."""

    name: str
    description: str
    family_size: int          # 1 for a single scope
    budget_text: str
    spent_epsilon: float
    remaining_epsilon: float
    share_spent: float
    releases: int
    series: tuple             # ((label, epsilon), ...)
    chart_budget: Optional[float]
    shared_with: tuple        # other datasets charged to the same scope(s)
    uses: tuple = ()          # the ScopeUse of each member (for the JSON export)


@dataclass(frozen=True, kw_only=True)
class DatasetFacts:
    dataset: Dataset
    slug: str
    latest: PublishedRelease
    outputs: tuple            # OutputTable, latest declaration of each released file name
    relations: tuple          # (measure name, neighbouring relation) of the latest release
    measure_sets: int         # distinct measure plans across the releases
    epsilon_range: tuple      # (smallest, largest) release epsilon
    scopes: tuple             # ScopeRow
    thresholds: tuple         # (parameter path, value)
    caveats: tuple            # sentences
    about: About              # description, licence, ... (configuration; pipelines.catalog.about)
    gaps: tuple = ()          # (release id, first day, last day): scheduled, due, not published

    @property
    def releases(self) -> tuple:
        return self.dataset.releases


def slugs(dataset_ids: Sequence[str]) -> dict[str, str]:
    """A file-name-safe, unique slug per dataset id."""
    out, used = {}, set()
    for dataset_id in dataset_ids:
        base = re.sub(r"[^A-Za-z0-9._-]+", "--", dataset_id).strip(".") or "dataset"
        slug, n = base, 2
        while slug.lower() in used:
            slug, n = f"{base}-{n}", n + 1
        used.add(slug.lower())
        out[dataset_id] = slug
    return out


def _budget_text(budgets: Sequence[tuple]) -> str:
    def one(eps, delta):
        return f"\u03b5={eps:.4g}" + (f", \u03b4={delta:.3g}" if delta else "")
    return "; ".join(one(*b) for b in budgets)


def _thresholds(parameters: Mapping, path: str = "") -> list[tuple]:
    out = []
    for key, value in sorted(parameters.items()):
        where = f"{path}.{key}" if path else str(key)
        if isinstance(value, Mapping):
            out.extend(_thresholds(value, where))
        elif "threshold" in str(key).lower() and isinstance(value, (int, float, str)) and \
                not isinstance(value, bool):
            out.append((where, value))
    return out


def _caveats(dataset: Dataset, latest: PublishedRelease, scope_rows, measure_sets: int) -> list:
    out = []
    for scope in (latest.summary or {}).get("guarantee_scopes", []) or []:
        if isinstance(scope, Mapping) and scope.get("configured") is False:
            out.append(f"{scope.get('scope', 'a scope')}: {scope.get('means', 'not configured')}")
    versions = sorted({r.release_id for r in dataset.releases if r.version > 1}, key=natural_key)
    if versions:
        many = len(versions) > 1
        out.append(f"{len(versions)} release{'s were' if many else ' was'} published again as a "
                   f"new version after {'their' if many else 'its'} input changed (e.g. "
                   f"{versions[0]}): every version is charged to the budget and its noise is "
                   "independent; use the latest version.")
    if any(r.guarantee.spends_nothing for r in dataset.releases):
        out.append("Some releases spend no budget (post-processing of published releases): their "
                   "guarantee is the releases they are computed from.")
    if measure_sets > 1:
        out.append(f"The release plan (measures or noise) changed across releases ({measure_sets} "
                   "plans): the mechanisms table shows the latest; each release row states its "
                   "own guarantee.")
    if any(r.guarantee.accountant == "pld" for r in dataset.releases):
        out.append("Budgets are composed with privacy loss distributions by the ledger; this "
                   "catalog composes the (\u03b5, \u03b4) each published measure states, a valid "
                   "bound that may be looser than the ledger's.")
    shared = sorted({d for row in scope_rows for d in row.shared_with})
    if shared:
        out.append("Some budget scopes are shared with other datasets ("
                   + ", ".join(shared) + "): their spend counts every dataset's releases.")
    out.append("Spent and remaining budgets count published releases only.")
    return out


def dataset_facts(dataset: Dataset, slug: str, uses: Mapping[str, catalog_budget.ScopeUse],
                  scope_datasets: Mapping[str, set], metadata: Mapping,
                  gaps: Sequence[tuple] = ()) -> DatasetFacts:
    """The facts of one dataset. ``uses``: {scope: ScopeUse} over every published release;
    ``scope_datasets``: {scope: dataset ids charged to it}; ``metadata``: the validated
    ``--metadata`` file ({} without one); ``gaps``: its scheduled releases that are due and
    not published (:func:`pipelines.catalog.schedule.public_gaps`)."""
    latest = dataset.releases[-1]
    outputs = {}
    for release in dataset.releases:
        for table in release.outputs:
            outputs[table.name] = table
    names = sorted({s.name for r in dataset.releases for s in r.scopes})
    rows = []
    for family, members in sorted(scope_families(names).items(), key=lambda kv: kv[0]):
        member_uses = [uses[m] for m in sorted(members)]
        others = tuple(sorted({d for m in members for d in scope_datasets.get(m, ())}
                              - {dataset.dataset_id}))
        if len(members) == 1 and family == members[0]:
            use = member_uses[0]
            b = use.scope.budget
            rows.append(ScopeRow(
                name=family, description=use.scope.description, family_size=1,
                budget_text=_budget_text([(b.epsilon, b.delta)]),
                spent_epsilon=use.spent.epsilon, remaining_epsilon=use.remaining.epsilon,
                share_spent=use.share_spent, releases=len(use.releases), series=use.series,
                chart_budget=b.epsilon, shared_with=others, uses=(use,)))
            continue
        summary = catalog_budget.family_summary(uses, sorted(members))
        ordered = sorted(member_uses, key=lambda u: u.scope.name)
        idx = catalog_budget.sample_indices(len(ordered), catalog_budget.MAX_POINTS)
        series = tuple((ordered[i].scope.name.rsplit(":", 1)[-1], ordered[i].spent.epsilon)
                       for i in idx)
        if len(idx) < len(ordered):  # sampled: show the largest spend of each stretch
            bounds = [*idx[1:], len(ordered)]
            series = tuple((ordered[i].scope.name.rsplit(":", 1)[-1],
                            max(u.spent.epsilon for u in ordered[i:max(j, i + 1)]))
                           for i, j in zip(idx, bounds))
        budgets = summary["budgets"]
        rows.append(ScopeRow(
            name=family, description=summary["description"], family_size=len(members),
            budget_text=("each " if len(budgets) == 1 else "") + _budget_text(budgets),
            spent_epsilon=summary["max_spent"], remaining_epsilon=summary["min_remaining"],
            share_spent=max(u.share_spent for u in member_uses),
            releases=len({v for u in member_uses for v in u.releases}), series=series,
            chart_budget=budgets[0][0] if len(budgets) == 1 else None, shared_with=others,
            uses=tuple(ordered)))
    plans = {tuple((m.measure.name, m.measure.mechanism, m.measure.epsilon, m.measure.delta,
                    m.noise_scale) for m in r.measures) for r in dataset.releases}
    epsilons = [r.guarantee.guarantee.epsilon for r in dataset.releases]
    thresholds = _thresholds(latest.parameters)
    rows_t = tuple(rows)
    return DatasetFacts(
        dataset=dataset, slug=slug, latest=latest, outputs=tuple(outputs.values()),
        relations=tuple((m.measure.name, m.measure.neighbouring) for m in latest.measures),
        measure_sets=len(plans), epsilon_range=(min(epsilons), max(epsilons)), scopes=rows_t,
        thresholds=tuple(thresholds),
        caveats=tuple(_caveats(dataset, latest, rows_t, len(plans))),
        about=about(dataset.dataset_id, dataset.jobs,
                    [m.measure.neighbouring for m in latest.measures], metadata,
                    outputs=tuple(outputs.values())),
        gaps=tuple(gaps))


def null_meaning(table) -> str:
    """What a null in a released file means, as its job declares it."""
    if "null" in table.description.lower():
        return table.description
    return "The job states no meaning for null in this file."


def all_facts(datasets: Sequence[Dataset], metadata: Optional[Mapping] = None,
              gaps: Optional[Mapping[str, Sequence[tuple]]] = None) -> list[DatasetFacts]:
    releases = [r for d in datasets for r in d.releases]
    uses = catalog_budget.scope_uses(releases)
    scope_datasets: dict = {}
    for release in releases:
        for scope in release.scopes:
            scope_datasets.setdefault(scope.name, set()).add(release.dataset_id)
    names = slugs([d.dataset_id for d in datasets])
    return [dataset_facts(d, names[d.dataset_id], uses, scope_datasets, metadata or {},
                          (gaps or {}).get(d.dataset_id, ())) for d in datasets]
