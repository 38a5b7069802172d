# SDK worker container for Flink, Spark and Dataflow workers (and Dask workers on Kubernetes):
# Beam's own Python SDK image, with this project installed from setup.py at the versions pinned in
# requirements.lock (`make lock` regenerates it from setup.py). Built and run elsewhere:
#
#   docker build -t REGISTRY/beam-dp-release:0.1.0 .
#   docker push REGISTRY/beam-dp-release:0.1.0
#   python -m pipelines.centralnotice ... --runner DataflowRunner \
#       --sdk_container_image=REGISTRY/beam-dp-release:0.1.0
#
# (or BEAM_DP_WORKER_IMAGE=REGISTRY/beam-dp-release:0.1.0 for every remote runner profile).
# The Beam version and Python version below must equal the lock's (tests/runners/test_worker_container.py).
ARG PYTHON_VERSION=3.11
ARG BEAM_VERSION=2.77.0
FROM apache/beam_python${PYTHON_VERSION}_sdk:${BEAM_VERSION}

WORKDIR /opt/beam-dp-release
COPY requirements.lock setup.py README.md ./
COPY accounting/ accounting/
COPY pipelines/ pipelines/
COPY runners/ runners/
COPY transforms/ transforms/
# The project with what workers need (GCS IO, Dask), every dependency at its locked version;
# the lock pins apache-beam to the base image's, so Beam itself is not reinstalled.
RUN pip install --no-cache-dir --constraint requirements.lock ".[gcp,dask]"

# Same hash seed on every worker process (whatever depends on Python's hash(), e.g. the order of a
# set of strings, is then the same on every worker; Dask bag shuffles place keys by dask's tokenize).
ENV PYTHONHASHSEED=0
# The entrypoint stays the base image's SDK harness boot (/opt/apache/beam/boot).
