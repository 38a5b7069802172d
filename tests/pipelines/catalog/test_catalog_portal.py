"""The catalog as a data portal publishes and harvests it (issue 42), on real releases
(tests/catalog_kit.py): each dataset page's description, licence, publisher, contact, citation,
methodology and column descriptions and units from ``--metadata`` ("not stated" without it),
download links that resolve, the privacy unit beside every epsilon, a schema.org ``Dataset`` in
every dataset page and the DCAT export parsed back as RDF by rdflib; a bad metadata file refused
naming the file and the field, never its content."""
from __future__ import annotations

import json
import os
import pathlib
import re
import urllib.parse

import pytest
from catalog_kit import files_of, make_releases

from pipelines.catalog import about as catalog_about
from pipelines.catalog import cli as catalog
from pipelines.catalog import linked_data

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SAMPLE = os.path.join(ROOT, "pipelines", "sample_data", "centralnotice", "datasets.json")
PAGE = "datasets/centralnotice--C1/index.html"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return make_releases(tmp_path_factory.mktemp("portal"))


def _metadata(tmp_path, **own) -> str:
    data = json.load(open(SAMPLE))
    data["datasets"] = {"centralnotice/C1": {
        "description": "Campaign C1 <b>only</b>", "privacy_unit": "a block of k impressions",
        "columns": {"clicks": {"unit": "clicks per day"}}, **own}}
    path = tmp_path / "datasets.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.fixture(scope="module")
def site(made, tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    metadata = _metadata(out)
    site = str(out / "site")
    assert catalog.main(made.args("--output", site, "--metadata", metadata, "--page_size", "2")) == 0
    return site


def test_dataset_pages_state_what_the_configuration_says_and_not_stated_otherwise(made, site, tmp_path):
    page = files_of(site)[PAGE]
    assert "Campaign C1 &lt;b&gt;only&lt;/b&gt;" in page               # escaped, own over defaults
    assert '<a href="https://creativecommons.org/publicdomain/zero/1.0/">CC0 1.0</a>' in page
    assert '<a href="mailto:privacy@example.org">privacy@example.org</a>' in page
    assert "Example Foundation. CentralNotice banner statistics" in page
    assert "Wikimedia Foundation, \u201cDifferential privacy/Active/CentralNotice/Feasibility" in page
    assert "clicks per day" in page and "banner clicks, with noise" in page  # column by column
    c2 = files_of(site)["datasets/centralnotice--C2/index.html"]
    assert "Daily banner statistics of a CentralNotice campaign" in c2   # the defaults
    bare = tmp_path / "bare"
    assert catalog.main(made.args("--output", str(bare))) == 0
    plain = files_of(str(bare))[PAGE]
    for label in ("Publisher", "Contact", "Licence", "Citation", "Keywords"):
        assert re.search(rf"<dt>{label}</dt><dd>not stated</dd>", plain), label
    assert '<p class="description">not stated</p>' in plain
    assert plain.count("<div>not stated</div>") >= 2                    # column description, unit


def test_error_columns_describe_themselves_and_values_state_their_error(site):
    """Without configuration, each error column says what it is and takes its value's unit;
    each value column's description ends with its job's error statement (RELEASE.json's
    ``errors``), after the configured text."""
    readme = files_of(site)["datasets/centralnotice--C1/README.md"]
    rows = {line.split("|")[1].strip(" `"): [c.strip() for c in line.split("|")[2:-1]]
            for line in readme.splitlines() if line.startswith("| `")}
    assert rows["clicks_std"][2:] == [
        "standard deviation of the noise in clicks (public: computed from the stated noise "
        "distribution, never from data; it describes the noise only, not the bias of bounding or "
        "clamping)", "clicks per day"]
    assert rows["clicks_ci95_low"][2].startswith("lower end of the 95% noise interval around clicks")
    assert rows["impressions_ci95_high"][3] == "impressions"          # the value's unit
    assert rows["clicks"][2].startswith("banner clicks, with noise. Error: clicks_std = ")
    assert "clicks -/+ " in rows["clicks"][2]


def test_every_epsilon_has_its_privacy_unit_beside_it(site):
    files = files_of(site)
    for name in ("index.html", PAGE, "datasets/centralnotice--C1/releases-2.html"):
        page = files[name]
        epsilons = page.count('<span class="epsilon"')
        assert epsilons and page.count('</span> <span class="unit muted">per privacy unit: ') >= epsilons
    assert "per privacy unit: a block of k impressions" in files[PAGE]     # configured
    c2 = files["datasets/centralnotice--C2/index.html"]
    assert "per privacy unit: (Geo, Project, k)-DP" in c2                 # the measures' relation


def test_download_links_resolve_by_default(made, site):
    files = files_of(site)
    links = re.findall(r'<a href="([^"]+)" download>', files[PAGE])
    assert links and any(link.endswith("/RELEASE.json") for link in links)
    for link in links:
        target = os.path.normpath(os.path.join(site, "datasets", "centralnotice--C1",
                                               urllib.parse.unquote(link)))
        assert os.path.isfile(target) and target.startswith(os.path.abspath(made.releases)), link


def _jsonld(page: str) -> dict:
    found = re.findall(r'<script type="application/ld\+json">(.*?)</script>', page, re.S)
    assert len(found) == 1
    return json.loads(found[0])


def test_every_dataset_page_holds_a_schema_org_dataset(made, site):
    files = files_of(site)
    pages = [p for p in files if p.startswith("datasets/centralnotice--C1/") and p.endswith(".html")]
    assert len(pages) == 2                                              # page 1 and page 2
    for name in pages:
        doc = _jsonld(files[name])
        assert doc["@context"] == "https://schema.org/" and doc["@type"] == "Dataset"
        assert doc["license"] == "https://creativecommons.org/publicdomain/zero/1.0/"
        assert doc["temporalCoverage"] == "2026-11-01/2026-11-02"
        assert doc["publisher"]["name"] == "Example Foundation (demo data)"
        assert "per privacy unit: a block of k impressions" in doc["measurementTechnique"]
        assert {v["name"]: v["unitText"] for v in doc["variableMeasured"]}["clicks"] == "clicks per day"
        downloads = doc["distribution"]
        assert downloads and all(d["@type"] == "DataDownload" for d in downloads)
        for d in downloads:
            path = os.path.join(site, "datasets", "centralnotice--C1", d["contentUrl"])
            assert os.path.isfile(os.path.normpath(path)), d
    assert "<b>" not in files[PAGE].split("<script", 1)[1].split("</script>", 1)[0]


def test_the_dcat_export_parses_as_rdf_with_catalog_datasets_and_distributions(made, site):
    rdflib = pytest.importorskip("rdflib")
    from rdflib.namespace import DCAT, DCTERMS, RDF

    graph = rdflib.Graph()
    base = pathlib.Path(site).as_uri() + "/"     # where a harvester found the file
    graph.parse(data=open(os.path.join(site, linked_data.DCAT_FILE)).read(), format="json-ld",
                base=base)
    catalogs = list(graph.subjects(RDF.type, DCAT.Catalog))
    assert catalogs == [rdflib.URIRef(base + "dcat.jsonld")]
    datasets = set(graph.objects(catalogs[0], DCAT.dataset))
    assert datasets == set(graph.subjects(RDF.type, DCAT.Dataset))
    assert {str(graph.value(d, DCTERMS.identifier)) for d in datasets} == {"centralnotice/C1",
                                                                           "centralnotice/C2"}
    c1 = rdflib.URIRef(base + PAGE)
    assert graph.value(c1, DCTERMS.license) == rdflib.URIRef(
        "https://creativecommons.org/publicdomain/zero/1.0/")
    period = graph.value(c1, DCTERMS.temporal)
    assert graph.value(period, DCAT.startDate).toPython().isoformat() == "2026-11-01"
    distributions = list(graph.objects(c1, DCAT.distribution))
    assert distributions and all((d, RDF.type, DCAT.Distribution) in graph for d in distributions)
    for d in distributions:
        url = str(graph.value(d, DCAT.downloadURL))
        assert url.startswith(pathlib.Path(made.releases).as_uri() + "/C1/"), url
        assert os.path.isfile(urllib.parse.unquote(urllib.parse.urlparse(url).path))


def test_an_absolute_site_and_releases_url_make_absolute_identifiers(made, tmp_path):
    site = tmp_path / "site"
    assert catalog.main(made.args("--output", str(site), "--site_url", "https://p.example/dp",
                                  "--releases_url", "https://files.example/rel")) == 0
    doc = _jsonld(files_of(str(site))[PAGE])
    assert doc["@id"] == "https://p.example/dp/" + PAGE
    assert all(d["contentUrl"].startswith("https://files.example/rel/C1/")
               for d in doc["distribution"])
    dcat = json.loads((site / linked_data.DCAT_FILE).read_text())
    assert dcat["@id"] == "https://p.example/dp/dcat.jsonld"


@pytest.mark.parametrize("edit, field, why", [
    ({"defaults": {"license": {"name": "x", "url": "javascript:secret-value-here"}}},
     "defaults.license.url", "an http(s) URL"),
    ({"defaults": {"contact": {"name": "x", "phone": "secret-value-here"}}},
     "defaults.contact", "unknown field(s); the fields are email, name, url"),
    ({"datasets": {"centralnotice/C1": {"columns": {"clicks": {"unit": 3}}}}},
     'datasets["centralnotice/C1"].columns.clicks.unit', "must be string"),
    ({"format": "secret-value-here"}, "format", 'must be "beam-dp-release/dataset-metadata/v1"'),
])
def test_bad_metadata_is_refused_naming_the_file_and_the_field(made, tmp_path, capsys, edit,
                                                               field, why):
    data = {"format": catalog_about.METADATA_FORMAT, **edit}
    path = tmp_path / "meta.json"
    path.write_text(json.dumps(data))
    assert catalog.main(made.args("--output", str(tmp_path / "s"), "--metadata", str(path))) == 2
    err = capsys.readouterr().err
    assert f"--metadata {path}" in err and f"{field}: {why}" in err, err
    assert "secret-value-here" not in err and not (tmp_path / "s").exists()


def test_the_published_schema_is_the_one_checked_and_the_sample_follows_it():
    from jsonschema import Draft202012Validator

    schema = json.load(open(catalog_about.SCHEMA_FILE))
    Draft202012Validator.check_schema(schema)
    assert schema["properties"]["format"]["const"] == catalog_about.METADATA_FORMAT
    assert catalog_about.read_metadata(SAMPLE)["defaults"]["license"]["name"] == "CC0 1.0"


def test_methodology_lists_configured_links_then_each_jobs_sources():
    told = catalog_about.about("ara-summary-reports", ["summary_reports"], ["r"], {"defaults": {
        "methodology": [{"name": "Our method note", "url": "https://example.org/m"}]}})
    names = [m.name for m in told.methodology]
    assert names[0] == "Our method note" and len(names) == 3 and "Ghazi and Manurangsi" in names[2]
    assert told.privacy_unit == "r" and told.license is None and told.citation == "not stated"
    assert catalog_about.about("x", ["own_job"], [], {}).methodology == ()


def test_missing_and_refused_days_are_public_gaps_without_a_reason(made, tmp_path):
    site = tmp_path / "site"
    assert catalog.main(made.args("--output", str(site), "--as_of", "2026-11-06")) == 0
    files = files_of(str(site))
    gaps = {}
    for campaign in ("C1", "C2"):
        page = files[f"datasets/centralnotice--{campaign}/index.html"]
        part = page.split('<h2 id="gaps">', 1)[1]
        gaps[campaign] = re.findall(r'<span class="release-id">([^<]+)</span>', part)
        for why in ("over budget", "failed", "missing", "reserved", "checksum"):
            assert why not in part, (campaign, why)
    # C1's third day was refused over budget; C2's second failed, its third never ran.
    assert gaps == {"C1": ["C1/2026-11-03"], "C2": ["C2/2026-11-02", "C2/2026-11-03"]}
    doc = json.loads(files["catalog.json"])
    assert [g["release_id"] for d in doc["datasets"] for g in d["gaps"]] == [
        "C1/2026-11-03", "C2/2026-11-02", "C2/2026-11-03"]
    assert "- `C2/2026-11-03` (2026-11-03)" in files["datasets/centralnotice--C2/README.md"]
    # Before they are due there is no gap, and the table says so.
    early = tmp_path / "early"
    assert catalog.main(made.args("--output", str(early), "--as_of", "2026-11-02")) == 0
    page = files_of(str(early))[PAGE]
    assert '<h2 id="gaps">' in page and "<div class=\"muted\">none</div>" in page.split('id="gaps"')[1]


def test_a_portal_restyles_the_pages_with_its_own_templates(made, tmp_path, capsys):
    own = tmp_path / "templates"
    own.mkdir()
    (own / "catalog.css").write_text("body{background:#fdf6e3}\n")
    site = tmp_path / "site"
    assert catalog.main(made.args("--output", str(site), "--templates", str(own))) == 0
    files = files_of(str(site))
    for name in ("index.html", PAGE):
        assert "<style>body{background:#fdf6e3}\n</style>" in files[name]
        assert "--accent:#0a58a6" not in files[name]                 # the catalog's own CSS
        assert files[name].startswith("<!doctype html>")             # its page.html still
    (own / "page.html").write_text("<html><title>{{ title }}</title>{{ body }}"
                                   "<p>Published by the portal</p></html>\n")
    assert catalog.main(made.args("--output", str(site), "--templates", str(own))) == 0
    page = (site / PAGE).read_text()
    assert page.endswith("<p>Published by the portal</p></html>\n")
    assert '<span class="release-id">C1/2026-11-01</span>' in page   # the body, not re-escaped
    # A page's body is a template too: a portal's dataset.html, with the catalog's macros,
    # lays the dataset page out its own way; values stay escaped (autoescaping).
    (own / "dataset.html").write_text(
        '{% import "macros.html" as m with context %}<h1 class="portal">{{ f.dataset.title }}'
        '</h1><p>{{ "<b>" }}{{ num(f.releases|length) }} releases</p>'
        '{{ m.releases_table(f, rows, files_base) }}\n')
    assert catalog.main(made.args("--output", str(site), "--templates", str(own))) == 0
    page = (site / PAGE).read_text()
    assert '<h1 class="portal">' in page and "<p>&lt;b&gt;3 releases</p>" in page
    assert '<span class="release-id">C1/2026-11-01</span>' in page
    other = (site / "datasets" / "centralnotice--C2" / "index.html").read_text()
    for text in (page, other):                                     # every dataset's first page
        assert '<h1 class="portal">' in text and 'id="mechanisms"' not in text
    (own / "dataset.html").unlink()
    capsys.readouterr()
    (own / "page.html").write_text("<html>\n{% if %}\n</html>\n")
    assert catalog.main(made.args("--output", str(tmp_path / "s2"), "--templates", str(own))) == 2
    assert f"--templates {own}: page.html line 2: not a valid Jinja2 template" in capsys.readouterr().err
    (own / "page.html").write_text("{{ no_such_value }}\n")
    assert catalog.main(made.args("--output", str(tmp_path / "s3"), "--templates", str(own))) == 2
    assert "could not be rendered (UndefinedError)" in capsys.readouterr().err
    assert not (tmp_path / "s2").exists() and not (tmp_path / "s3").exists()
