"""The public site in the neighbouring-pair audit, like any released file.

The CentralNotice job's registered audit (tests/audit_kit.py) runs the job on a dataset and on
its adversarial neighbours; here every run also builds the public catalog of what it released
(``pipelines.catalog.site_files`` over the testing releases), and the site's files join the
released files: the same file names and count, and every page, README and catalog.json equal
once the values that depend on noisy bytes (a released file's sha256 and size) are masked. A
mutant site that shows an operator-only row counter must fail the audit.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile

from audit_kit import REGISTRY, TESTING_FOLDER, ReleaseLayerJob, read_released

from accounting.verification.audit import AuditResult, Change, Release, ReportRule, audit

SITE = "catalog-site"
#: What on the site depends on noisy values: released files' digests and sizes (and the digest
#: and size of each marker, which holds the released files' digests).
HTML_NOISY = (r"sha256:[0-9a-f]{64}", r'<span class="size">[^<]*</span>')
README_NOISY = (r"sha256:[0-9a-f]{64}", r"\b\d+ bytes\b")
JSON_NOISY = ("datasets.*.releases.*.files.*.sha256", "datasets.*.releases.*.files.*.size")


@dataclasses.dataclass(frozen=True, kw_only=True)
class WithCatalogSite(ReleaseLayerJob):
    """The job as its operators run it, then the catalog of what it published."""

    leak_counters: bool = False

    def __call__(self, dataset, seed, exact) -> Release:
        from pipelines.catalog import cli as catalog
        from pipelines.catalog import model as catalog_model
        from pipelines.release import ReleaseOptions

        folder = tempfile.mkdtemp(prefix="audit-site-")
        try:
            files = self.write(dataset, folder)
            output = os.path.join(folder, "out")
            self.module.run(self.request(files, ReleaseOptions(
                output=output, testing_seed=seed, exact_testing=exact)))
            released = read_released(os.path.join(output, TESTING_FOLDER))
            inputs = catalog_model.read_catalog(output, None, testing=True)
            site = catalog.site_files(inputs, title="audit")
            if self.leak_counters:   # the mutant: an operator counter on the index page
                reports = catalog_model.read_reports(os.path.join(output, TESTING_FOLDER,
                                                                  ".reports"))
                rows = sum(r.counters.get("clicks.read", 0) for r in reports.values())
                site["index.html"] = site["index.html"].replace(
                    "</main>", f"<p>{rows} click rows read</p></main>")
            reports = dict(released.reports)
            for path, text in site.items():
                reports[f"{SITE}/{path}"] = json.loads(text) if path.endswith(".json") else text
            return Release(tables=released.tables,
                           files=released.files + tuple(f"{SITE}/{p}" for p in sorted(site)),
                           reports=reports)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def _spec(entry, job):
    spec = entry.spec(list(entry.datasets()))
    rules = {f"{SITE}/*.html": ReportRule(noisy_patterns=HTML_NOISY),
             f"{SITE}/*.md": ReportRule(noisy_patterns=README_NOISY),
             f"{SITE}/catalog.json": ReportRule(noisy_fields=JSON_NOISY),
             f"{SITE}/catalog.schema.json": ReportRule(),
             f"{SITE}/dcat.jsonld": ReportRule()}  # no size or digest: nothing noisy
    return dataclasses.replace(spec, job=job, reports={**spec.reports, **rules})


def _job(entry, **kwargs):
    base = entry.job
    return WithCatalogSite(module=base.module, write=base.write, request=base.request, **kwargs)


def test_public_site_passes_the_neighbouring_pair_audit():
    entry = REGISTRY["centralnotice"]
    datasets = list(entry.datasets())
    spec = _spec(entry, _job(entry))
    exact = audit(dataclasses.replace(spec, modes=("exact",)), datasets,
                  changes=(Change.ADD_ALONE, Change.ADD_SPREAD))
    noisy = audit(dataclasses.replace(spec, modes=("noisy",)), datasets,
                  changes=(Change.ADD_ALONE,))
    result = AuditResult(violations=exact.violations + noisy.violations,
                         runs=exact.runs + noisy.runs, pairs=exact.pairs + noisy.pairs)
    result.assert_ok()
    assert len(result.pairs) == 3 and result.runs == 5


def test_a_site_showing_an_operator_counter_fails_the_audit():
    entry = REGISTRY["centralnotice"]
    spec = _spec(entry, _job(entry, leak_counters=True))
    result = audit(dataclasses.replace(spec, modes=("exact",)), list(entry.datasets()),
                   changes=(Change.ADD_ALONE,))
    assert result.violations
    assert any("index.html" in str(v) for v in result.violations)
