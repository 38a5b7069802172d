"""Where releases and their reports live: the names every writer and reader of a release agrees on.

The release layer writes this layout (:mod:`pipelines.release.publish`, :mod:`pipelines.release.report`)
and the catalog reads it (:mod:`pipelines.catalog.model`); both import the names from here, so
they cannot drift apart. Plain constants, no Beam: a reader of published releases imports this
module (with :mod:`pipelines.release.storage` and :mod:`pipelines.release.names`) without the
release layer's Beam side.

* ``OUTPUT/<release id>/v<N>/`` holds a published release: its files and, written last, its
  ``MARKER`` (format ``MARKER_FORMAT``);
* ``OUTPUT/TESTING_PREFIX/<release id>/`` holds testing output (``--testing_seed``), never a release;
* ``OUTPUT/STAGING/`` is private staging, removed or completed by the next run;
* ``<reports>/<release id>/v<N>/REPORT`` (or ``FAILURE``) is the operator's report of a release.
"""
MARKER = "RELEASE.json"
MARKER_FORMAT = "beam-dp-release/release/v1"
TESTING_PREFIX = "testing-not-a-release"
STAGING = ".staging"
REPORT = "report.json"
FAILURE = "failure.json"
