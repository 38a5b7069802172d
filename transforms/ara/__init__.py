"""Attribution Reporting API (ARA) summary reports.

The four algorithms of the summary-report model (Aksu et al., PoPETs 2024):

* A, contribution vectors (``contribution.contribution_vectors``): the ad tech clips each
  measured value to ``[0, C_i]``, scales it by ``b_i / C_i`` and rounds it randomly.
* C, contribution bounding (``contribution.bound_contributions``): the browser drops a source's
  reports once they would exceed its L1 budget of 65,536.
* S, summary report (``summary``): the aggregation service sums per declared bucket and adds
  discrete Laplace noise of scale 65,536 / epsilon; each report id is aggregated once over all
  batches, and a source's budget holds over all of them (the release ledger's consumed-id
  records, ``pipelines.ara.summary_reports``).
* R, reconstruction (``summary.reconstruct``): the ad tech rescales by ``C_i / b_i``, times an
  optional estimate scale per measure fitted on training data (``contribution``).

``hierarchy`` makes nested slice estimates consistent, ``reports`` parses JSON aggregatable
reports and ``beam`` wires everything into Beam PTransforms. The count can be a query of its own
or be derived from padded value buckets (``contribution``: encodings).

Event-level reports: ``event_level`` (a source's output states and the API's k-ary randomized
response), ``event_debias`` (unbiased aggregate conversion counts and their variance) and
``event_beam`` (PTransforms over Arrow tables; the job is
``pipelines.ara.event_level_reports``). The ad tech's tooling lives beside
its jobs: ``pipelines.ara.optimize`` chooses ``C_i`` and the budget split from training data and
``pipelines.ara.synthetic`` generates the paper's synthetic data.
"""
from transforms.ara.contribution import (
    CONTRIBUTION_BUDGET,
    ENCODINGS,
    ContributionConfig,
    bound_contributions,
    contribution_vectors,
    rank_within_source,
)

__all__ = [
    "CONTRIBUTION_BUDGET",
    "ENCODINGS",
    "ContributionConfig",
    "bound_contributions",
    "contribution_vectors",
    "rank_within_source",
]
