"""Attribution Reporting (ARA): summary reports, event-level reports, the configuration optimiser
and synthetic data.

Modules:

* :mod:`pipelines.ara.summary_reports` -- ``python -m pipelines.ara.summary_reports``: aggregatable reports into summary reports;
* :mod:`pipelines.ara.event_level_reports` -- ``python -m pipelines.ara.event_level_reports``: randomized event-level reports;
* :mod:`pipelines.ara.optimize` -- the configuration optimiser (contribution budgets, key hierarchy);
* :mod:`pipelines.ara.config` -- ``python -m pipelines.ara.config``: an optimised configuration for a summary-reports job;
* :mod:`pipelines.ara.event_tuning` -- ``python -m pipelines.ara.event_tuning``: event-level trigger data tuning;
* :mod:`pipelines.ara.synthetic` -- synthetic conversions for tests, tuning and benchmarks.
"""
