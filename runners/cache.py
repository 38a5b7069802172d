"""Where the runners' external artifacts live on this machine.

Flink and Spark run Beam pipelines through a Java job server jar; Prism is a Go binary. They are
fetched once (``python -m runners.fetch``) into a cache and found here by the runner profiles, so
no pipeline run downloads anything.

Layout under the cache root (``$BEAM_DP_CACHE``, default ``~/.apache_beam/cache``, Beam's own):

* ``jars/`` — job server jars, named exactly as on Maven Central and as Beam caches them, so Beam
  itself also finds them there (``$BEAM_DP_JAR_CACHE`` overrides this directory alone);
* ``prism/go-v<beam version>/prism`` — the Prism binary built by ``go install``
  (``$BEAM_DP_PRISM_DIR`` overrides the directory).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from apache_beam.version import __version__ as BEAM_VERSION

# Flink versions for which Beam publishes a job server, newest last (FlinkRunnerOptions agrees).
PUBLISHED_FLINK_VERSIONS = ("1.19", "1.20", "2.0", "2.1", "2.2")
DEFAULT_FLINK_VERSION = PUBLISHED_FLINK_VERSIONS[-1]
BEAM_GROUP_ID = "org.apache.beam"


def cache_root() -> Path:
    return Path(os.environ.get("BEAM_DP_CACHE", "~/.apache_beam/cache")).expanduser()


def jar_dir() -> Path:
    override = os.environ.get("BEAM_DP_JAR_CACHE")
    return Path(override).expanduser() if override else cache_root() / "jars"


def prism_dir(beam_version: str = BEAM_VERSION) -> Path:
    override = os.environ.get("BEAM_DP_PRISM_DIR")
    if override:
        return Path(override).expanduser()
    return cache_root() / "prism" / f"go-v{beam_version}"


def flink_artifact(flink_version: str) -> str:
    if flink_version not in PUBLISHED_FLINK_VERSIONS:
        raise ValueError(f"flink_version must be one of {', '.join(PUBLISHED_FLINK_VERSIONS)}, "
                         f"got {flink_version!r}")
    return f"beam-runners-flink-{flink_version}-job-server"


SPARK_ARTIFACT = "beam-runners-spark-3-job-server"


def gradle_target(artifact: str) -> str:
    """Beam's gradle target for a job server artifact (what its jar helpers take)."""
    match = re.fullmatch(r"beam-runners-(flink-([\d.]+)|spark-3)-job-server", artifact)
    if not match:
        raise ValueError(f"not a Beam job server artifact: {artifact}")
    if match.group(2):
        return f":runners:flink:{match.group(2)}:job-server:shadowJar"
    return ":runners:spark:3:job-server:shadowJar"


def jar_name(artifact: str, beam_version: str = BEAM_VERSION) -> str:
    return f"{artifact}-{beam_version}.jar"


def cached_jar(artifact: str, beam_version: str = BEAM_VERSION) -> Path | None:
    path = jar_dir() / jar_name(artifact, beam_version)
    return path if path.is_file() and path.stat().st_size > 0 else None


def cached_flink_versions(beam_version: str = BEAM_VERSION) -> list[str]:
    """Flink versions whose job server jar is cached, oldest first."""
    return [v for v in PUBLISHED_FLINK_VERSIONS if cached_jar(flink_artifact(v), beam_version)]


def prism_binary(beam_version: str = BEAM_VERSION) -> Path:
    return prism_dir(beam_version) / "prism"


def cached_prism(beam_version: str = BEAM_VERSION) -> Path | None:
    path = prism_binary(beam_version)
    return path if path.is_file() and os.access(path, os.X_OK) else None
