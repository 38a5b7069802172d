"""Fetch the runners' external artifacts into the cache (see :mod:`runners.cache`).

    python -m runners.fetch flink [--flink_version 2.2] [--method beam|maven]
    python -m runners.fetch spark
    python -m runners.fetch prism
    python -m runners.fetch all                      # or several: prism flink
    python -m runners.fetch flink spark --best_effort  # report, but exit 0, if unavailable

Job server jars come from Maven Central, through Beam's own download helper (``--method beam``,
the default: the same code path Beam uses at run time, with its Google mirror fallback) or through
Maven (``--method maven``: honours ``~/.m2/settings.xml`` mirrors and proxies). Prism is built from
the Go module proxy with ``go install github.com/apache/beam/sdks/v2/go/cmd/prism@v<beam version>``
into the Prism cache directory. Every step is idempotent: a cached artifact is reported, not
fetched again. The command prints what it did, how long it took and how big the result is, and
exits non-zero if anything could not be had.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runners import cache


@dataclasses.dataclass(frozen=True, kw_only=True)
class FetchResult:
    name: str
    path: Path | None
    seconds: float
    bytes: int
    was_cached: bool
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def row(self) -> str:
        status = "cached" if self.was_cached else ("fetched" if self.ok else "FAILED")
        size = f"{self.bytes / 2**20:8.1f}" if self.ok else "       -"
        where = str(self.path) if self.ok else self.error
        return f"{self.name:40s} {status:8s} {self.seconds:8.1f} {size}  {where}"


def _timed(name: str, cached, produce) -> FetchResult:
    start = time.perf_counter()
    existing = cached()
    if existing is not None:
        return FetchResult(name=name, path=existing, seconds=time.perf_counter() - start,
                           bytes=existing.stat().st_size, was_cached=True)
    try:
        path = produce()
    except (RuntimeError, OSError, subprocess.CalledProcessError, ValueError) as exc:
        return FetchResult(name=name, path=None, seconds=time.perf_counter() - start, bytes=0,
                           was_cached=False, error=_short(exc))
    return FetchResult(name=name, path=path, seconds=time.perf_counter() - start,
                       bytes=path.stat().st_size, was_cached=False)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _fetch_with_beam(artifact: str, beam_version: str) -> Path:
    from apache_beam.utils.subprocess_server import JavaJarServer
    url = JavaJarServer.path_to_beam_jar(cache.gradle_target(artifact), version=beam_version)
    target_dir = cache.jar_dir()
    target_dir.mkdir(parents=True, exist_ok=True)
    path = Path(JavaJarServer.local_jar(url, cache_dir=str(target_dir)))
    partial = Path(str(path) + ".tmp")
    if partial.exists():  # a failed download leaves its partial file behind
        partial.unlink()
    return path


def _fetch_with_maven(artifact: str, beam_version: str) -> Path:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("mvn not found on PATH (install Maven or use --method beam)")
    target_dir = cache.jar_dir()
    target_dir.mkdir(parents=True, exist_ok=True)
    coordinates = f"{cache.BEAM_GROUP_ID}:{artifact}:{beam_version}:jar"
    # dependency:copy needs no project; running it from an empty directory keeps any pom.xml in
    # the caller's working directory out of it.
    with tempfile.TemporaryDirectory() as empty:
        done = subprocess.run(
            [mvn, "-B", "-q", "-Dstyle.color=never",
             "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy",
             f"-Dartifact={coordinates}", f"-DoutputDirectory={target_dir}"],
            cwd=empty, capture_output=True, text=True)
    if done.returncode != 0:
        errors = [re.sub(r"\x1b\[[0-9;]*m|\[0m", "", line)
                  for line in done.stdout.splitlines() if "ERROR" in line]
        raise RuntimeError(f"mvn could not copy {coordinates}: "
                           + (errors[0] if errors else done.stderr.strip()[:300]))
    return target_dir / cache.jar_name(artifact, beam_version)


def fetch_jar(artifact: str, *, method: str = "beam",
              beam_version: str = cache.BEAM_VERSION) -> FetchResult:
    """Fetch one job server jar into :func:`runners.cache.jar_dir` unless it is cached."""
    fetchers = {"beam": _fetch_with_beam, "maven": _fetch_with_maven}
    if method not in fetchers:
        raise ValueError(f"method must be one of {sorted(fetchers)}, got {method!r}")
    return _timed(cache.jar_name(artifact, beam_version),
                  lambda: cache.cached_jar(artifact, beam_version),
                  lambda: fetchers[method](artifact, beam_version))


def fetch_flink(flink_version: str = cache.DEFAULT_FLINK_VERSION, **kwargs) -> FetchResult:
    return fetch_jar(cache.flink_artifact(flink_version), **kwargs)


def fetch_spark(**kwargs) -> FetchResult:
    return fetch_jar(cache.SPARK_ARTIFACT, **kwargs)


def prism_module(beam_version: str = cache.BEAM_VERSION) -> str:
    if "dev" in beam_version:
        raise ValueError(f"apache-beam {beam_version} is a development build: no released Prism "
                         "module matches it; pass --prism_location to a binary you built")
    tag = beam_version.replace("rc", "-RC") if "rc" in beam_version else beam_version
    return f"github.com/apache/beam/sdks/v2/go/cmd/prism@v{tag}"


def _build_prism(beam_version: str) -> Path:
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("go not found on PATH: install Go >= 1.21 to build Prism")
    target_dir = cache.prism_dir(beam_version)
    target_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GOBIN=str(target_dir), CGO_ENABLED="0")
    done = subprocess.run([go, "install", prism_module(beam_version)], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"go install failed: {done.stderr.strip()[-500:]}")
    return cache.prism_binary(beam_version)


def build_prism(beam_version: str = cache.BEAM_VERSION) -> FetchResult:
    """Build the Prism binary matching ``beam_version`` unless it is cached."""
    return _timed(f"prism (go install, v{beam_version})",
                  lambda: cache.cached_prism(beam_version),
                  lambda: _build_prism(beam_version))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runners.fetch",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("what", nargs="+", choices=["flink", "spark", "prism", "all"])
    parser.add_argument("--flink_version", default=cache.DEFAULT_FLINK_VERSION,
                        choices=cache.PUBLISHED_FLINK_VERSIONS)
    parser.add_argument("--method", choices=["beam", "maven"], default="beam",
                        help="how to download job server jars (default: Beam's own helper)")
    parser.add_argument("--best_effort", action="store_true",
                        help="exit 0 even if something could not be had (it is still reported; "
                             "tests of that runner then skip)")
    args = parser.parse_args(argv)
    wanted = {"flink", "spark", "prism"} if "all" in args.what else set(args.what)

    results = []
    if "flink" in wanted:
        results.append(fetch_flink(args.flink_version, method=args.method))
    if "spark" in wanted:
        results.append(fetch_spark(method=args.method))
    if "prism" in wanted:
        results.append(build_prism())
    print(f"{'artifact':40s} {'status':8s} {'seconds':>8s} {'MiB':>8s}  path")
    for result in results:
        print(result.row())
    return 0 if args.best_effort or all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
