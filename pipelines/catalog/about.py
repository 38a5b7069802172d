"""What a data portal publishes beside the numbers: each dataset's description, licence, publisher,
contact, citation, methodology, privacy unit in words, and its columns' descriptions and units.

All of it comes from configuration (``--metadata FILE``, format
``beam-dp-release/dataset-metadata/v1``), checked against the published schema
``pipelines/catalog/dataset_metadata.schema.json`` (:mod:`pipelines.release.config_schema`:
messages name the file and the field, never its content). ``defaults`` applies to every dataset;
``datasets[<dataset id>]`` overrides it field by field (``columns`` column by column). What no
configuration states is shown as :data:`NOT_STATED`, never guessed -- with three exceptions that
are facts of the releases themselves: the privacy unit defaults to the neighbouring relations the
releases' measures state; the methodology always lists the source documents behind each
job's mechanisms (:data:`SOURCES`, by public name), after any configured links; and the error
columns (:mod:`transforms.error_columns`) describe themselves: ``<c>_std``, ``<c>_ci95_low`` and
``<c>_ci95_high`` get their meaning and ``<c>``'s unit unless configured (an approximate
interval, as its value's errors statement says, is described as one), and a value column
whose job states its error (``RELEASE.json``'s ``errors``: its error columns, or why it has
none) gets that statement after its description.

Nothing here is read from data: a description is public by construction (an operator writes it).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from pipelines.catalog.model import CatalogInputError
from pipelines.release import config_schema, textfiles

NOT_STATED = "not stated"
METADATA_FORMAT = "beam-dp-release/dataset-metadata/v1"
SCHEMA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           "dataset_metadata.schema.json")


@dataclass(frozen=True, kw_only=True)
class Link:
    """A named reference, linked when its URL is known."""

    name: str
    url: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class Agent:
    """A publisher or a contact point."""

    name: str
    url: Optional[str] = None
    email: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class ColumnAbout:
    description: str = NOT_STATED
    unit: str = NOT_STATED


#: The source documents behind each job's mechanisms, by public name (the project's seed
#: documents). Every dataset's methodology lists those of its jobs.
_ADVERTISING = Link(name="Ghazi and Manurangsi, \u201cPrivacy in Web Advertising: Analytics & "
                         "Modeling\u201d (tutorial, Google Research)")
SOURCES = {
    "centralnotice": (Link(name="Wikimedia Foundation, \u201cDifferential privacy/Active/"
                                "CentralNotice/Feasibility report\u201d (Algorithms 1 and 2)"),),
    "summary_reports": (Link(name="\u201cOptimizing summary reports in the Privacy Sandbox "
                                  "Attribution Reporting API\u201d (article)"), _ADVERTISING),
    "event_level_reports": (_ADVERTISING,),
    "reach_frequency": (_ADVERTISING,),
    "ldp_frequencies": (Link(name="Shao, \u201cDifferential Privacy in Applications\u201d (slides: "
                                  "PEM heavy hitters with GRR, OUE, OLH)"), _ADVERTISING),
    "ldp_heavy_hitters": (Link(name="Shao, \u201cDifferential Privacy in Applications\u201d "
                                    "(slides: PEM heavy hitters with GRR, OUE, OLH)"),),
    "shuffle_sum": (_ADVERTISING,),
    "label_dp": (_ADVERTISING,),
    **{job: (Link(name="Pfeiffer et al., \u201cMasked LARk: Masked Learning, Aggregation and "
                       "Reporting worKflow\u201d (Microsoft)"),)
       for job in ("masked_lark_share", "masked_lark_helper", "masked_lark_combine",
                   "masked_lark_train")},
}


@dataclass(frozen=True, kw_only=True)
class About:
    """One dataset's description as a portal shows it (every field set: configured, derived from
    the releases as stated above, or :data:`NOT_STATED` / None)."""

    description: str
    license: Optional[Link]
    publisher: Optional[Agent]
    contact: Optional[Agent]
    citation: str
    keywords: tuple
    privacy_unit: str
    methodology: tuple          # Link
    columns: Mapping[str, ColumnAbout] = field(default_factory=dict)

    def column(self, name: str) -> ColumnAbout:
        return self.columns.get(name, ColumnAbout())


def read_metadata(path: Optional[str]) -> Mapping:
    """The ``--metadata`` file, checked against its schema ({} without one)."""
    if not path:
        return {}
    try:
        data = textfiles.read(path, "--metadata").json()
        config_schema.validate(data, SCHEMA_FILE, f"--metadata {path}")
    except (textfiles.TextFileError, config_schema.ConfigSchemaError) as err:
        raise CatalogInputError(str(err)) from None
    return data


def _link(value: Optional[Mapping]) -> Optional[Link]:
    return None if not value else Link(name=value["name"], url=value.get("url"))


def _agent(value: Optional[Mapping]) -> Optional[Agent]:
    return None if not value else Agent(name=value["name"], url=value.get("url"),
                                        email=value.get("email"))


_ERROR_MEANING = {"_std": "standard deviation of the noise in {}",
                  "_ci95_low": "lower end of the 95% noise interval around {}",
                  "_ci95_high": "upper end of the 95% noise interval around {}"}
_NOISE_SOURCE = (" (public: computed from the stated noise distribution, never from data; it "
                 "describes the noise only, not the bias of bounding or clamping)")
#: Error columns of a value whose errors statement says its interval is approximate (randomized
#: response's plug-in intervals: transforms.error_columns.approximate_statement).
_APPROXIMATE_MEANING = {"_std": "plug-in standard deviation of {}",
                        "_ci95_low": "lower end of the approximate 95% interval around {}",
                        "_ci95_high": "upper end of the approximate 95% interval around {}"}
_APPROXIMATE_SOURCE = (" (computed from released values only, plug-in variance and normal "
                       "approximation: its coverage is approximate; see {}'s error statement)")


def _with_errors(columns: dict, outputs) -> dict:
    """``columns`` ({name: ColumnAbout}) with the released tables' error columns and error
    statements (module docstring); ``outputs``: the dataset's OutputTables."""
    from transforms import error_columns

    out = dict(columns)
    for table in outputs:
        names = [c for c, _ in table.columns]
        approximate = {n for n, statement in table.errors if error_columns.APPROXIMATE in statement}
        for name in names:
            base = error_columns.base_column(name, names)
            if base is None or name in columns:
                continue
            suffix = name[len(base):]
            if base in approximate:
                text = _APPROXIMATE_MEANING[suffix].format(base) + _APPROXIMATE_SOURCE.format(base)
            else:
                text = _ERROR_MEANING[suffix].format(base) + _NOISE_SOURCE
            out[name] = ColumnAbout(description=text, unit=columns.get(base, ColumnAbout()).unit)
        for name, statement in table.errors:
            told = out.get(name, ColumnAbout())
            if "Error: " not in told.description:
                out[name] = ColumnAbout(description=f"{told.description}. Error: {statement}",
                                        unit=told.unit)
    return dict(sorted(out.items()))


def about(dataset_id: str, jobs: Sequence[str], relations: Sequence[str],
          metadata: Mapping, outputs: Sequence = ()) -> About:
    """The description of one dataset: ``defaults`` and then ``datasets[dataset_id]`` of the
    (validated) metadata; ``relations``: the neighbouring relations its measures state;
    ``outputs``: its released tables (OutputTable), for their error columns."""
    own = (metadata.get("datasets") or {}).get(dataset_id) or {}
    merged = {**(metadata.get("defaults") or {}), **own}
    shared = (metadata.get("defaults") or {}).get("columns") or {}
    columns = {name: {**shared.get(name, {}), **(own.get("columns") or {}).get(name, {})}
               for name in {*shared, *(own.get("columns") or {})}}
    configured = tuple(_link(m) for m in merged.get("methodology") or ())
    sources = tuple(dict.fromkeys(s for job in jobs for s in SOURCES.get(job, ())))
    unit = merged.get("privacy_unit") or "; ".join(dict.fromkeys(relations)) or NOT_STATED
    return About(
        description=merged.get("description", NOT_STATED), license=_link(merged.get("license")),
        publisher=_agent(merged.get("publisher")), contact=_agent(merged.get("contact")),
        citation=merged.get("citation", NOT_STATED), keywords=tuple(merged.get("keywords") or ()),
        privacy_unit=unit,
        methodology=configured + tuple(s for s in sources if s not in configured),
        columns=_with_errors({name: ColumnAbout(description=c.get("description", NOT_STATED),
                                                unit=c.get("unit", NOT_STATED))
                              for name, c in sorted(columns.items())}, outputs))
