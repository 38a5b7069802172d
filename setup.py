"""Install the DP release toolkit (also used by Dataflow workers via --setup_file)."""
from setuptools import find_packages, setup

setup(
    name="beam-dp-release",
    version="0.1.0",
    description="Differentially private releases on Apache Beam: bounding, keysets, noisy "
                "aggregates, CentralNotice, reach & frequency, ARA summary reports.",
    python_requires=">=3.10",
    packages=find_packages(include=["transforms*", "accounting*", "pipelines*", "runners*"]),
    package_data={"pipelines": ["sample_data/*", "sample_data/**/*", "catalog/*.schema.json",
                              "centralnotice/*.schema.json",
                              "catalog/templates/*"]},
    install_requires=[
        "apache-beam>=2.60",
        "numpy>=1.24",
        "pyarrow>=14",
        "scipy>=1.10",
        # The multi-key dominating PLD (accounting/calibration.py) reads the PLD mass functions
        # (dp_accounting has no public accessor): the same fields in 0.4.4 (the Airflow lock's,
        # as Airflow's attrs excludes 0.6) and 0.6.0 (the main lock's), both run by the tests.
        "dp-accounting>=0.4.4,<0.7",
        "google-cloud-storage>=2.10",
        # AES (a PRF) drives every random choice of a release; keyed, so re-runs reproduce.
        "cryptography>=41",
        # Configuration files are checked against their published JSON Schemas
        # (pipelines/release/config_schema.py; the catalog's --metadata).
        "jsonschema>=4.18",
        # The catalog's pages are Jinja2 templates a portal can replace (pipelines/catalog/templates/).
        "jinja2>=3.1",
    ],
    extras_require={
        "gcp": ["apache-beam[gcp]>=2.60"],
        # The Dask runner (runners/profiles.py, profile DaskRunner): a local or remote cluster.
        "dask": ["dask[distributed]>=2024.4.2"],
        # What the tests import, no more: gs:// tests run Beam's GCS IO (google-cloud-storage, in
        # the base install) against a local emulator, and the offline Dataflow tests need Beam's
        # Dataflow client; the rest of apache-beam[gcp] (BigQuery, Pub/Sub, Spanner, Vertex AI,
        # ...) is for the worker container only.
        "test": ["google-cloud-dataflow-client>=0.13", "pytest>=7.4", "hypothesis>=6.80",
                 "pytest-xdist>=3.3", "gcp-storage-emulator>=2024.8.3", "matplotlib>=3.7",
                 "dask[distributed]>=2024.4.2",
                 # The catalog's DCAT export is parsed back as RDF.
                 "rdflib>=7.0",
                 # DataFrame input (DPAggregate accepts them without importing either).
                 "pandas>=2.0"],
        # Polars frames as input, tested by `make test-slow` (Polars alone is 180 MB: outside the
        # environment of `make setup`).
        "dataframes": ["pandas>=2.0", "polars>=1.0"],
        # PipelineDP and Tumult pin their own dependencies: the benchmarks install them in
        # virtualenvs of their own under benchmarks/.venvs/ (`make bench-peers`). Polars runs the
        # columnar floor the speed benchmarks compare with (benchmarks/columnar_floor.py); py-spy
        # samples every thread of a leg (a threaded DoFn's work included) when profiling one.
        "bench": ["matplotlib>=3.7", "polars>=1.0", "py-spy>=0.3"],
        "plot": ["matplotlib>=3.7"],
        # `make test-browser`: the catalog's pages in Debian's chromium (apt-get), driven through
        # Debian's chromedriver (never a browser download of a test tool's own).
        "browser": ["selenium>=4.20"],
        # `make lock`: requirements.lock compiled from this file.
        "lock": ["uv>=0.5"],
        # The example DAG (runners/deploy/airflow_dag.py); large, so not part of "test".
        "airflow": ["apache-airflow>=3", "apache-airflow-providers-apache-beam>=6.3",
                    "apache-airflow-providers-google"],
    },
)
