# Dataflow Flex Template LAUNCHER image for one job: Google's Python launcher base image with this
# project installed at the versions pinned in requirements.lock. It is not the worker image: the
# launcher only builds the job's pipeline and submits it (--submit_only, runners/deploy/
# flex_launcher.py); Dataflow's workers run the SDK worker image the repository's Dockerfile
# builds, named here by WORKER_IMAGE (passed to the workers as --sdk_container_image). Built
# elsewhere (no Docker engine here), from the repository root:
#
#   docker build -f runners/deploy/launcher.Dockerfile --build-arg JOB=centralnotice \
#       --build-arg BASE_DIGEST=sha256:<64 hex digits> \
#       --build-arg WORKER_IMAGE=REGISTRY/beam-dp-release:0.1.0 \
#       -t REGISTRY/beam-dp-release-launcher-centralnotice:0.1.0 .
#
# The base image's Python (3.11) equals the lock's, and the lock pins apache-beam, so the job
# graph is built by the same Beam version as the workers run (tests/runners/test_flex_template.py).
# The base image is pinned by digest, given at build time: BASE_DIGEST is the digest of the
# base image release chosen from Google's list of Flex Template base images (e.g. `docker
# buildx imagetools inspect gcr.io/dataflow-templates-base/python311-template-launcher-base:TAG`
# prints it). A build without it fails (an image reference ending in "@" is invalid), so no
# launcher is ever built from whatever a moving tag names that day. (No digest is written here:
# none could be verified from this repository's machines, which reach no container registry.)
ARG BASE_DIGEST
FROM gcr.io/dataflow-templates-base/python311-template-launcher-base@${BASE_DIGEST}

ARG JOB=centralnotice
ARG WORKER_IMAGE

WORKDIR /opt/beam-dp-release
COPY requirements.lock setup.py README.md ./
COPY accounting/ accounting/
COPY pipelines/ pipelines/
COPY runners/ runners/
COPY transforms/ transforms/
# The project with Beam's GCP extras (the Dataflow client, GCS), every dependency at its locked
# version; the launcher reads the ledger and key store on gs:// and creates the job.
RUN pip install --no-cache-dir --constraint requirements.lock ".[gcp]"

# What Google's launcher runs (FLEX_TEMPLATE_PYTHON_PY_FILE), which job it releases, and the
# workers' image (the DataflowRunner profile passes it as --sdk_container_image).
ENV FLEX_TEMPLATE_PYTHON_PY_FILE=/opt/beam-dp-release/runners/deploy/flex_launcher.py
ENV BEAM_DP_JOB=${JOB}
ENV BEAM_DP_WORKER_IMAGE=${WORKER_IMAGE}
# The entrypoint stays the base image's launcher (/opt/google/dataflow/python_template_launcher).
