"""The release catalog: a public static site of what was published, an operator view, and
schedule health.

    python -m pipelines.catalog --ledger private/ledger.json --releases out/releases \\
        --config campaigns.json --output out/site [--operator private/catalog] \\
        [--check --as_of 2026-11-30 --grace 1]

* ``--output SITE``: the public site (:mod:`pipelines.catalog.site`): an index of datasets and,
  per dataset, what is released, the privacy unit and neighbouring relation, mechanisms and
  noise, each release's guarantee, the budget scopes with spent and remaining and a
  budget-over-time chart per scope (inline SVG), thresholds, caveats and the paginated releases
  with their files (size, sha256, download link); with ``--metadata``, the description,
  licence, publisher, contact, citation, methodology and column descriptions and units a portal
  publishes (:mod:`pipelines.catalog.about`, "not stated" where none is given); a schema.org
  ``Dataset`` (JSON-LD) in every dataset page and ``dcat.jsonld``, the catalog in DCAT
  (:mod:`pipelines.catalog.linked_data`); ``catalog.json`` with ``catalog.schema.json``, and a
  ``README.md`` per dataset. Static, no executable script, no external asset: it opens from
  ``file://`` and from any static host. Only what the published markers and files and the
  metadata file make public reaches it (:mod:`pipelines.catalog.model`).
* ``--operator DIR``: the operator view (:mod:`pipelines.catalog.operator`), never inside the
  site: failures, take-overs, reservations without publication, row counters and dropped-row
  shares, key fingerprints, coverage alarms, the schedule.
* ``--check``: schedule health (:mod:`pipelines.catalog.schedule`): every slot the
  configurations (``--config``: CentralNotice campaigns, or a schedule file) and ``--cadence``
  flags schedule, against the ledger. Exit 1 naming each slot whose period ended more than
  ``--grace`` days before ``--as_of`` and that is not published (over-budget refusals named as
  such); 0 otherwise -- the line a cron job or an Airflow task alarms on. Before a schedule's
  first charge there is no ledger yet: ``--check`` alone (no ``--output``/``--operator``) then
  checks every slot as never run -- exit 0 with a line saying so while nothing is overdue, 1
  naming the overdue ones -- as long as no release marker lies under ``--releases`` (a ledger
  missing next to its releases is refused, exit 2).

Exit codes: 0 done (and, with ``--check``, nothing overdue); 1 ``--check`` found overdue slots;
2 bad flags or inputs (the message names the file, never its content); 3 the site or the
operator view could not be written. The site is written to a temporary folder beside
``--output`` and swapped in whole, so a static host never serves half a catalog.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import secrets
import shutil
import sys
import time
from typing import Optional, Sequence

EXIT_OK, EXIT_OVERDUE, EXIT_BAD_INPUT, EXIT_WRITE_FAILED = 0, 1, 2, 3
SITE_STAMP = ".release-catalog"
OPERATOR_STAMP = ".release-catalog-operator"
DEFAULT_TITLE = "Differentially private releases"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # exit 2 with the message, as argparse does, but named
        self.print_usage(sys.stderr)
        print(f"catalog: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


#: The days a schedule may be checked at, and the most days of grace: a schedule's slots are
#: counted from their cadence's start to ``--as_of`` (a year 1 or a grace of millions of days
#: would reach outside the calendar's range; an exit 1 must only ever mean "late").
AS_OF_RANGE = (_dt.date(1970, 1, 1), _dt.date(9998, 12, 31))
MAX_GRACE_DAYS = 36_525


def _date(text: str) -> _dt.date:
    try:
        day = _dt.date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a date YYYY-MM-DD") from None
    if not AS_OF_RANGE[0] <= day <= AS_OF_RANGE[1]:
        raise argparse.ArgumentTypeError(f"must be a day from {AS_OF_RANGE[0]} to "
                                         f"{AS_OF_RANGE[1]}")
    return day


def _grace(text: str) -> int:
    value = _non_negative(text)
    if value > MAX_GRACE_DAYS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_GRACE_DAYS} days (100 years)")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a whole number of days") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _positive(text: str) -> int:
    value = _non_negative(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m pipelines.catalog", allow_abbrev=False,
                     description=__doc__.split("\n\n")[0],
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     epilog="Exit codes: 0 done (with --check: nothing overdue); 1 --check found "
                            "overdue slots; 2 bad flags or inputs; 3 could not write the output.")

    def flag(name, **kwargs):
        spellings = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
        parser.add_argument(*spellings, dest=name, **kwargs)

    flag("ledger", required=True, metavar="LEDGER",
         help="the budget ledger (local path or gs://) the releases were charged to")
    flag("releases", required=True, metavar="OUTPUT_ROOT",
         help="the jobs' --output root holding the published releases (local or gs://)")
    flag("config", action="append", default=[], metavar="CONFIG",
         help="a CentralNotice configuration or a schedule file (format "
              "beam-dp-release/schedule/v1) whose slots --check and the operator view assess; "
              "repeatable")
    flag("cadence", action="append", default=[], metavar="TEMPLATE=EVERY:START[:END]",
         help="a release cadence of another job, e.g. 'summary_reports/{date}=daily:2026-11-01' "
              "(EVERY: daily, weekly or Nd); repeatable")
    flag("output", metavar="SITE", help="the public site's folder (replaced whole)")
    flag("operator", metavar="DIR",
         help="the operator view's folder (private; never inside the site)")
    flag("reports", metavar="DIR",
         help="the operator reports (default: reports/ beside the ledger, as the jobs write them)")
    flag("check", action="store_true",
         help="exit 1 naming every slot overdue by more than --grace days and not published")
    flag("as_of", type=_date, metavar="DATE", help="the day the schedule is checked at "
         "(default: today, UTC)")
    flag("grace", type=_grace, default=1, metavar="DAYS",
         help="days a slot may be late before it is overdue (default: 1)")
    flag("coverage_window", type=_positive, default=3, metavar="N",
         help="coverage alarm: a key value with rows earlier and none in the last N releases "
              "(default: 3)")
    flag("page_size", type=_positive, default=100, metavar="N",
         help="releases per page (default: 100)")
    flag("title", default=DEFAULT_TITLE, help="the site's title")
    flag("releases_url", metavar="URL",
         help="public base URL of OUTPUT_ROOT: released files are linked there (default: "
              "relative links from the site to a local OUTPUT_ROOT, for a site published beside "
              "its releases)")
    flag("metadata", metavar="FILE",
         help="dataset descriptions for the public pages: description, licence, publisher, "
              "contact, citation, methodology, privacy unit, column descriptions and units "
              "(format beam-dp-release/dataset-metadata/v1; schema "
              "pipelines/catalog/dataset_metadata.schema.json); without it they say 'not stated'")
    flag("templates", metavar="DIR",
         help="a portal's own templates (Jinja2), used instead of the catalog's "
              "(pipelines/catalog/templates/) to restyle the public site: page.html (the page "
              "around each body), catalog.css, and the bodies index.html, dataset.html, "
              "releases.html with their macros.html and releases_listing.html")
    flag("site_url", metavar="URL",
         help="public base URL of the site: the identifiers of its JSON-LD and DCAT export "
              "(default: relative to each file)")
    return parser


# --------------------------------------------------------------------------- writing

def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_folders(args) -> None:
    """Refuse outputs that would mix the public and the private, or overwrite something that is
    not a catalog (raises CatalogInputError)."""
    from pipelines.catalog.model import CatalogInputError
    from pipelines.release.layout import MARKER

    for flag, path, stamp in (("--output", args.output, SITE_STAMP),
                              ("--operator", args.operator, OPERATOR_STAMP)):
        if not path:
            continue
        if path.startswith("gs://"):
            raise CatalogInputError(f"{flag} {path}: the catalog writes a local folder (copy it "
                                    "to a bucket with gsutil rsync)")
        if os.path.exists(path) and (not os.path.isdir(path) or (
                os.listdir(path) and not os.path.exists(os.path.join(path, stamp)))):
            raise CatalogInputError(f"{flag} {path} exists and is not a folder this command "
                                    "wrote: refusing to replace it")
        probe = os.path.abspath(path)
        while True:
            if os.path.isfile(os.path.join(probe, MARKER)):
                raise CatalogInputError(f"{flag} {path} is inside the published release {probe}")
            up = os.path.dirname(probe)
            if up == probe:
                break
            probe = up
    if args.output and args.operator and (_inside(args.output, args.operator)
                                          or _inside(args.operator, args.output)):
        raise CatalogInputError("--operator and --output must be apart (neither inside the "
                                "other): the operator view is private")
    if args.operator and not args.releases.startswith("gs://") and \
            _inside(args.operator, args.releases):
        raise CatalogInputError(f"--operator {args.operator} is inside the published output "
                                f"root {args.releases}: the operator view is private")
    for private in filter(None, [args.reports, os.path.dirname(os.path.abspath(args.ledger))
                                 if not args.ledger.startswith("gs://") else None]):
        if args.output and not private.startswith("gs://") and _inside(private, args.output):
            raise CatalogInputError(f"--output {args.output} would hold the private "
                                    f"{private} (ledger or reports): choose another folder")


def check_templates(folder: Optional[str]) -> None:
    """A portal's ``--templates`` folder: it exists, and every template in it parses (Jinja2),
    before anything is written; an error names the template and its line."""
    from pipelines.catalog.html import environment
    from pipelines.catalog.model import CatalogInputError

    if folder is None:
        return
    if not os.path.isdir(folder):
        raise CatalogInputError(f"--templates {folder} is not a folder")
    import jinja2

    env = environment(os.path.abspath(folder))
    for name in sorted(os.listdir(folder)):
        if name.endswith((".html", ".css")):
            try:
                env.get_template(name)
            except jinja2.TemplateSyntaxError as err:
                raise CatalogInputError(f"--templates {folder}: {name} line {err.lineno}: not a "
                                        "valid Jinja2 template") from None


def write_tree(folder: str, files: dict, stamp: str) -> None:
    """Write ``files`` ({relative path: text}) as ``folder``, replacing it whole: into a
    temporary sibling first, then swapped in."""
    folder = os.path.abspath(folder)
    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    token = secrets.token_hex(4)
    tmp = os.path.join(parent, f".{os.path.basename(folder)}.tmp-{token}")
    old = os.path.join(parent, f".{os.path.basename(folder)}.old-{token}")
    try:
        for rel, text in files.items():
            path = os.path.join(tmp, *rel.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8", newline="\n") as handle:
                handle.write(text)
        with open(os.path.join(tmp, stamp), "w") as handle:
            handle.write("written by python -m pipelines.catalog; replaced whole on each run\n")
        if os.path.exists(folder):
            os.rename(folder, old)
        os.rename(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------- the command

def site_files(inputs, *, title: str = DEFAULT_TITLE, page_size: int = 100,
               files_base: Optional[str] = None, metadata=None,
               site_url: Optional[str] = None, gaps=None,
               templates: Optional[str] = None) -> dict:
    """{relative path: text} of the public site of ``inputs`` (a
    :class:`pipelines.catalog.model.CatalogInputs`): the Python API of ``--output``. Built from
    the published releases and the (validated) dataset ``metadata`` only; ``files_base``: the
    released files' URL base, absolute or relative to the site's root (:func:`files_base`). A
    testing catalog (``read_catalog(..., testing=True)``) says on every page that it is not a
    release. ``gaps``: {dataset id: scheduled releases due and not published}
    (:func:`pipelines.catalog.schedule.public_gaps`)."""
    from pipelines.catalog import export as catalog_export
    from pipelines.catalog import facts as catalog_facts
    from pipelines.catalog import linked_data
    from pipelines.catalog import site as catalog_site

    from pipelines.catalog.html import environment

    environment.cache_clear()  # templates are read afresh by each build (a portal edits them)
    all_facts = catalog_facts.all_facts(inputs.datasets, metadata, gaps)
    structured = {f.dataset.dataset_id: linked_data.script(linked_data.schema_org(
        f, files_base=files_base, site_url=site_url, newest=page_size)) for f in all_facts}
    files = catalog_site.site_pages(all_facts, title=title, page_size=page_size,
                                    files_base=files_base, testing=inputs.testing,
                                    structured=structured, templates=templates)
    files.update(catalog_export.export_files(all_facts, title=title, testing=inputs.testing))
    files[linked_data.DCAT_FILE] = linked_data.dcat(all_facts, title=title, files_base=files_base,
                                                    site_url=site_url, newest=page_size)
    return files


def files_base(releases: str, output: str, releases_url: Optional[str]) -> Optional[str]:
    """Where the site links released files from: ``--releases_url``, else the local releases
    root relative to the site's root (a site published beside its releases keeps working from
    ``file://`` and any static host); None for ``gs://`` releases without a URL."""
    if releases_url:
        return releases_url
    if releases.startswith("gs://"):
        return None
    rel = os.path.relpath(os.path.abspath(releases), os.path.abspath(output))
    return "/".join(rel.split(os.sep))


def build(args, out=None) -> int:
    """Run the command (see the module docstring). Python's cyclic garbage collector is paused
    for the run: a catalog build allocates millions of small objects that live until it ends,
    and each collection would rescan the whole parsed ledger (a third of the time at 55,000
    releases)."""
    import gc

    enabled = gc.isenabled()
    gc.disable()
    try:
        return _build(args, out)
    finally:
        if enabled:
            gc.enable()


def _build(args, out=None) -> int:
    from pipelines.catalog import about as catalog_about
    from pipelines.catalog import coverage as catalog_coverage
    from pipelines.catalog import model as catalog_model
    from pipelines.catalog import operator as catalog_operator
    from pipelines.catalog import schedule as catalog_schedule
    from pipelines.catalog.model import CatalogInputError

    out = out or sys.stdout
    started = time.perf_counter()
    check_folders(args)
    metadata = catalog_about.read_metadata(args.metadata)
    check_templates(args.templates)
    first_check = args.check and not (args.output or args.operator) and \
        not catalog_model.ledger_exists(args.ledger)
    ledger = None if first_check else catalog_model.read_ledger(args.ledger)
    reports = args.reports or (os.path.join(os.path.dirname(os.path.abspath(args.ledger)),
                                            "reports")
                               if not args.ledger.startswith("gs://") else
                               args.ledger.rsplit("/", 1)[0] + "/reports")
    # The operator reports are the operator view's and the schedule's (failures): a public
    # site alone never reads them.
    if first_check:  # a schedule's first run: nothing charged yet (see before_first_charge)
        inputs = catalog_model.before_first_charge(args.releases, args.ledger)
    else:
        inputs = catalog_model.read_catalog(args.releases, ledger, reports_root=reports
                                            if args.operator or args.check else None)
    as_of = args.as_of or _dt.datetime.now(_dt.timezone.utc).date()
    slots = catalog_schedule.slots_from(args.config, args.cadence, as_of, inputs)
    health = catalog_schedule.assess(slots, inputs, as_of, args.grace)
    if args.output:
        import jinja2

        templates = os.path.abspath(args.templates) if args.templates else None
        try:
            files = site_files(inputs, title=args.title, page_size=args.page_size,
                               files_base=files_base(args.releases, args.output, args.releases_url),
                               metadata=metadata, site_url=args.site_url,
                               gaps=catalog_schedule.public_gaps(health), templates=templates)
        except jinja2.TemplateError as err:  # only a portal's own templates can fail
            raise CatalogInputError(f"--templates {args.templates}: the pages could not be "
                                    f"rendered ({type(err).__name__})") from None
        write_tree(args.output, files, SITE_STAMP)
        index = os.path.join(os.path.abspath(args.output), "index.html")
        print(f"catalog: {len(inputs.releases())} releases in {len(inputs.datasets)} datasets; "
              f"open file://{index}", file=out)
    if args.operator:
        alarms = catalog_coverage.alarms(inputs.datasets, inputs.reports, args.coverage_window)
        files = catalog_operator.operator_files(inputs, health, alarms,
                                                page_size=args.page_size, as_of=as_of,
                                                grace=args.grace)
        write_tree(args.operator, files, OPERATOR_STAMP)
        print(f"catalog: operator view (private) file://"
              f"{os.path.join(os.path.abspath(args.operator), 'index.html')}"
              + (f"; {len(alarms)} coverage alarm(s)" if alarms else ""), file=out)
    if first_check:
        print(f"catalog: no ledger yet at {args.ledger} and no release under --releases: "
              "nothing has been charged so far (a schedule's first run); every slot is checked "
              "as never run", file=out)
    else:
        print(f"catalog: ledger {args.ledger}: structure and record chain verified, and every "
              "release's marker cross-checked with it; NOT verified: the head's MAC and the "
              "witness of its latest write (they need the key store: python -m accounting.ledger "
              f"verify --ledger {args.ledger} --key_store KEY_STORE)", file=out)
    if inputs.excluded:
        print(f"catalog: {len(inputs.excluded)} marker(s) left out of the public site (not "
              "releases of this ledger; see the operator view)", file=out)
    if args.check:
        late = catalog_schedule.overdue(health)
        tally = catalog_schedule.counts(health)
        print(f"catalog: schedule as of {as_of} (grace {args.grace} day(s)): "
              + ", ".join(f"{k} {v}" for k, v in tally.items() if v), file=out)
        for h in late:
            print(f"OVERDUE {h.line()}", file=out)
        if late:
            return EXIT_OVERDUE
    print(f"catalog: done in {time.perf_counter() - started:.1f} s", file=out)
    return EXIT_OK


def main(argv: Optional[Sequence[str]] = None) -> int:
    from pipelines.catalog.model import CatalogInputError

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:
        return int(done.code or 0)
    if not (args.output or args.operator or args.check):
        print("catalog: error: nothing to do: give --output, --operator or --check",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return build(args)
    except CatalogInputError as err:
        print(f"catalog: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as err:
        print(f"catalog: error: could not write ({type(err).__name__}: {err.strerror} "
              f"{err.filename or ''})", file=sys.stderr)
        return EXIT_WRITE_FAILED


if __name__ == "__main__":
    sys.exit(main())
