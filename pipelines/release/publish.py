"""Publication is owned: where releases go, their markers, and atomic, never-overwriting publication.

Layout under ``--output`` (OUTPUT), public, and beside the ledger (LEDGER), private::

    OUTPUT/<release id>/v<N>/<files>         a published release version ...
    OUTPUT/<release id>/v<N>/RELEASE.json    ... and its marker (public metadata), written last
    OUTPUT/testing-not-a-release/<release id>/     testing runs (--testing_seed) only
    LEDGER.bindings/<root digest>.json       which ledger (id and path) owns the output root
    <LEDGER's folder>/staging/<release id>/v<N>.<attempt>/   private staging (the default
                                             --staging_dir): the release's files, and its row
                                             counters (COUNTERS, operator-only: never published)

Nothing but releases is in OUTPUT: the binding and staging are control files and operator
data. A root of an older version (``OUTPUT/.ledger-binding.json``, ``OUTPUT/.staging/``) is
migrated on its next release: the binding is checked, written beside the ledger, then removed
from OUTPUT, with the empty folders of the old staging root. Control files are written
atomically (:mod:`accounting.durable`); an empty or cut binding is recognised as this toolkit's
own interrupted write and written again -- never taken for another ledger's.

Rules:

* A folder is a published release exactly when its marker exists. The marker names the release
  (id, version, job), the ledger that charged it, its keys' public fingerprints, a keyed binding
  to its input digest (verifiable by the key holder only: a plain digest of raw data would let
  anyone test a guess of the input), the guarantee and the files with their digests.
* A run never writes into a folder that holds another release's marker; a published release is
  never replaced by different bytes (a re-run that reproduces it exactly is a no-op).
* Testing runs write only under ``testing-not-a-release/``; a real release refuses that prefix
  and a testing run refuses a path inside a real release.
* The output root is bound to one ledger on its first release. A root whose binding names
  another ledger, or whose ledger is missing, or that holds release markers of another ledger
  (or markers while the ledger is missing), is refused, naming both: a deleted, emptied,
  replaced or mistyped ledger must never re-charge and re-release a published day with a fresh
  key (new noise on top of the published noise lets averaging remove it). Every marker of the
  release id must be in the ledger too.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
from typing import Mapping, Optional

from pipelines.release import names, storage
from pipelines.release.errors import ReleaseFailed, ReleaseRefused
from pipelines.release.layout import MARKER, MARKER_FORMAT, STAGING, TESTING_PREFIX

#: Where an output root's ledger binding was kept by older versions (migrated: see above).
BINDING = ".ledger-binding.json"
#: The folder beside the ledger holding the bindings of its output roots.
BINDINGS_SUFFIX = ".bindings"
#: The staging root (layout.STAGING) is beside the ledger (``<ledger's folder>/staging``) by
#: default, and ``OUTPUT/testing-not-a-release/.staging`` for testing runs; ``OUTPUT/.staging``
#: in older versions.
PRIVATE_STAGING = "staging"
#: A release's row counters, staged beside its files for the operator (pipelines.release.counters);
#: publication leaves them behind.
COUNTERS = ".counters.json"


def release_folder(output: str, release_id: str, version: int, testing: bool) -> str:
    parts = names.release_path(release_id)
    if testing:
        return storage.join(output, TESTING_PREFIX, *parts)
    return storage.join(output, *parts, f"v{version}")


def staging_folder(root: str, release_id: str, version: int, attempt: str) -> str:
    return storage.join(root, *names.release_path(release_id), f"v{version}.{attempt}")


def staging_attempts(root: str, release_id: str, version: int) -> list[str]:
    """Staging folders of earlier attempts at this release version (to delete)."""
    base = storage.join(root, *names.release_path(release_id))
    prefix = storage.join(base, f"v{version}.")
    return sorted({path[:path.index("/", len(prefix))] for path in storage.list_files(base)
                   if path.startswith(prefix) and "/" in path[len(prefix):]})


def marker_bytes(marker: Mapping) -> bytes:
    return (json.dumps(marker, indent=1, sort_keys=True, default=str) + "\n").encode("utf-8")


def read_marker(folder: str) -> Optional[dict]:
    data = storage.read_bytes(storage.join(folder, MARKER))
    return None if data is None else json.loads(data.decode("utf-8"))


# --------------------------------------------------------------------------- ownership checks

def check_output_root(output: str, testing: bool) -> None:
    """Refuse an output root inside the testing prefix (for a release) or inside a release."""
    parts = output.replace("gs://", "", 1).split("/")
    if not testing and TESTING_PREFIX in parts:
        raise ReleaseRefused(f"--output {output} is inside a {TESTING_PREFIX}/ folder: a release "
                             "never goes there")
    if storage.is_gcs(output):
        return
    folder = output
    while True:
        if os.path.isfile(os.path.join(folder, MARKER)):
            raise ReleaseRefused(f"--output {output} is inside the published release "
                                 f"{folder} ({MARKER}): choose the output root, not a release")
        up = os.path.dirname(folder)
        if up == folder:
            return
        folder = up


def _release_base(output: str, release_id: str, testing: bool) -> str:
    parts = names.release_path(release_id)
    return storage.join(output, TESTING_PREFIX, *parts) if testing else storage.join(output, *parts)


def check_tree(output: str, staging_root: str, release_ids, testing: bool, *,
               reports: Optional[str] = None, error=ReleaseRefused) -> None:
    """Refuse a symbolic link inside the output tree on the way to a release (local paths).

    A release folder is ``OUTPUT/<release id>/v<N>``, staged under ``STAGING/<release id>/``;
    a symlink at any level below ``--output`` (or ``--staging_dir``), in a release's folder or
    as the ledger binding would carry the release, or read its ownership, outside the tree the
    operator named. The roots themselves may be links (where the operator keeps the tree).
    ``error``: ReleaseRefused before the charge, ReleaseFailed after it (nothing published)."""
    after = "; nothing was charged" if error is ReleaseRefused else "; nothing was published"

    def below(root):
        return [storage.join(root, *names.release_path(r)) for r in release_ids]

    checks = [(output, "--output", [_release_base(output, r, testing) for r in release_ids]
               + ([] if testing else [storage.join(output, BINDING)])),
              (staging_root, "--staging_dir", below(staging_root))]
    if reports:
        checks.append((reports, "--report_dir", below(reports)))
    for root, flag, paths in checks:
        if storage.is_gcs(root):
            continue
        inside = not os.path.relpath(root, output).startswith(os.pardir)  # e.g. OUTPUT/.staging
        for path in paths:
            link = (storage.symlink_below(output, path) if inside else None) \
                or storage.symlink_below(root, path) or _link_inside(path)
            if link:
                raise error(f"{flag} {root}: {link} is a symbolic link inside the output tree; a "
                            f"release is published only below {flag} itself: remove the link"
                            + after)
            real = os.path.realpath(path)
            if not real.startswith(os.path.realpath(root).rstrip(os.sep) + os.sep):
                raise error(f"{flag} {root}: {path} resolves to {real}, outside it" + after)


def _link_inside(folder: str) -> Optional[str]:
    """A symbolic link among the entries below a local folder (not followed), or None."""
    if not os.path.isdir(folder) or os.path.islink(folder):
        return None
    for top, dirs, files in os.walk(folder):
        for name in sorted(dirs + files):
            if os.path.islink(os.path.join(top, name)):
                return os.path.join(top, name)
    return None


def _real_markers(output: str) -> list[str]:
    return [p for p in storage.list_files(output)
            if p.endswith("/" + MARKER) and f"/{TESTING_PREFIX}/" not in p and f"/{STAGING}/" not in p]


def binding_path(output: str, ledger_path: str) -> str:
    """Where the binding of ``output`` lives: beside the ledger, named by a digest of the root."""
    digest = hashlib.sha256(output.rstrip("/").encode("utf-8")).hexdigest()[:24]
    return ledger_path + BINDINGS_SUFFIX + "/" + digest + ".json"


def _read_binding(path: str, output: str, ledger) -> Optional[dict]:
    """The binding at ``path``; None when there is none -- or when it is empty or cut, this
    toolkit's own interrupted write (deleted here, written again by :func:`bind`)."""
    data = storage.read_bytes(path)
    if data is None:
        return None
    try:
        binding = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        if data.strip() and not data.lstrip().startswith(b"{"):
            binding = None  # not JSON and not a cut JSON object: not ours
        else:
            storage.delete_file(path)  # empty or cut: an interrupted write of the binding
            return None
    if not (isinstance(binding, dict) and isinstance(binding.get("ledger_id"), str)
            and isinstance(binding.get("ledger"), str)):
        raise ReleaseRefused(f"{path} is not a ledger binding (it records which ledger owns "
                             f"the releases under {output}); refusing to charge {ledger.path}")
    return binding


def check_binding(output: str, ledger) -> Optional[dict]:
    """Refuse a missing or replaced ledger next to existing releases; returns the binding."""
    from accounting.ledger import LedgerError

    paths = (binding_path(output, ledger.path), storage.join(output, BINDING))
    try:
        ledger_id = ledger.ledger_id()
    except LedgerError as err:
        if not any(storage.read_bytes(p) for p in paths) and not _real_markers(output):
            raise
        raise ReleaseRefused(
            f"output root {output} holds published releases (ledger binding {paths[0]}), but "
            f"the ledger cannot be read: {err}. Refusing to charge anything for published "
            "releases")
    for path in paths:
        binding = _read_binding(path, output, ledger)
        if binding is None:
            continue
        if ledger_id is None:
            raise ReleaseRefused(
                f"output root {output} holds releases charged by ledger {binding['ledger_id']} "
                f"(recorded in {path}, ledger path {binding['ledger']}), but the ledger "
                f"{ledger.path} does not exist: deleted or mistyped? Refusing to charge a new "
                "ledger for published releases")
        if ledger_id != binding["ledger_id"]:
            raise ReleaseRefused(
                f"output root {output} belongs to ledger {binding['ledger_id']} (recorded in "
                f"{path}, ledger path {binding['ledger']}); {ledger.path} is another ledger "
                f"({ledger_id}): replaced? Refusing")
        return binding
    for marker_path in _real_markers(output):
        marker = json.loads(storage.read_bytes(marker_path).decode("utf-8"))
        if ledger_id is None or marker.get("ledger_id") != ledger_id:
            raise ReleaseRefused(
                f"output root {output} holds published releases of ledger "
                f"{marker.get('ledger_id')} (e.g. {marker_path}) and no ledger binding "
                f"({paths[0]}); ledger {ledger.path} "
                + ("does not exist" if ledger_id is None else f"is another ledger ({ledger_id})")
                + ": refusing to charge it for them")
    return None


def bind(output: str, ledger) -> None:
    """Record the output root's ledger beside the ledger (first release; a concurrent first run
    binds once), and migrate a root of an older version (its binding and empty staging folders
    leave OUTPUT)."""
    path = binding_path(output, ledger.path)
    body = json.dumps({"ledger_id": ledger.ledger_id(), "ledger": ledger.path,
                       "output": output}, indent=1, sort_keys=True).encode("utf-8") + b"\n"
    if not storage.write_bytes(path, body, exclusive=True):
        check_binding(output, ledger)
    legacy = storage.join(output, BINDING)
    if storage.read_bytes(legacy) is not None:
        storage.delete_file(legacy)
        storage.delete_empty_dirs(storage.join(output, STAGING))


def check_markers_in_ledger(output: str, release_id: str, ledger) -> None:
    """Every published version of ``release_id`` under ``output`` must be in the ledger."""
    base = storage.join(output, *names.release_path(release_id))
    for path in storage.list_files(base):
        if not path.endswith("/" + MARKER):
            continue
        marker = json.loads(storage.read_bytes(path).decode("utf-8"))
        if marker.get("testing"):
            continue
        record = ledger.get(marker["release_id"], marker["version"])
        fingerprints = None if record is None else \
            {n: k["fingerprint"] for n, k in record["keys"].items()}
        if record is None or fingerprints != marker.get("key_fingerprints"):
            raise ReleaseRefused(
                f"{path} is a published release that ledger {ledger.path} does not hold (or "
                "holds with other keys); refusing to release it again")


# --------------------------------------------------------------------------- publish

def _same(staged: dict, published: dict) -> bool:
    return staged == published


def digests(folder: str) -> dict[str, str]:
    """{file name: sha256} of every file in a folder (a staged :data:`COUNTERS` file aside)."""
    prefix = folder.rstrip("/") + "/"
    return {path[len(prefix):]: storage.sha256_of(path) for path in storage.list_files(folder)
            if path[len(prefix):] != COUNTERS}


def check_publishable(staging: str, final: str, *, testing: bool) -> str:
    """``"new"``, ``"identical"`` (a re-run reproduced it) or ``"resume"`` (a crashed GCS
    publication to complete); raises ReleaseFailed if it would replace different bytes."""
    if testing:
        return "new"
    existing = storage.list_files(final)
    if not existing:
        return "new"
    staged, published = digests(staging), digests(final)
    if MARKER in published:
        if _same(staged, published):
            return "identical"
        changed = sorted(n for n in set(staged) | set(published) if staged.get(n) != published.get(n))
        raise ReleaseFailed(f"{final} is published with other bytes ({', '.join(changed)}); a "
                            "published release is never replaced (did the code or the "
                            "configuration change? a new version needs --new_release)")
    for name, digest in published.items():  # a crashed publication: what is there must match
        if staged.get(name) != digest:
            raise ReleaseFailed(f"{final} holds a partly published release with other bytes "
                                f"({name}); refusing to complete it")
    return "resume"


def publish(staging: str, final: str, *, testing: bool, root: Optional[str] = None) -> str:
    """Move a staged release into place (see the module docstring); returns the outcome.
    ``root``: the output root, below which a local release is renamed into place without
    following any symbolic link (storage.rename_dir)."""
    if root is not None and not storage.is_gcs(final):
        link = storage.symlink_below(root, final) or _link_inside(final) or _link_inside(staging)
        if link:
            raise ReleaseFailed(f"{link} is a symbolic link inside the output tree; nothing was "
                                "published")
    outcome = check_publishable(staging, final, testing=testing)
    if outcome == "identical":
        storage.delete_tree(staging)
        return outcome
    storage.delete_file(storage.join(staging, COUNTERS))  # read by then; the operator's only
    if testing:
        storage.delete_tree(final)
    if not storage.is_gcs(final) and not storage.is_gcs(staging) and outcome == "new":
        storage.fsync_tree(staging)
        try:
            storage.rename_dir(staging, final, root=root)
            return outcome
        except OSError as err:  # a concurrent run of the same release got there first
            if err.errno == errno.EXDEV:  # staging on another file system: copied below
                return _copy(staging, final, testing=testing, outcome=outcome)
            if root is not None and storage.symlink_below(root, final):
                raise ReleaseFailed(f"{storage.symlink_below(root, final)} is a symbolic link "
                                    "inside the output tree; nothing was published") from None
            if not os.path.isdir(final):
                raise
        outcome = check_publishable(staging, final, testing=testing)  # raises if different
        if outcome == "identical":
            storage.delete_tree(staging)
            return outcome
    return _copy(staging, final, testing=testing, outcome=outcome)


def _copy(staging: str, final: str, *, testing: bool, outcome: str) -> str:
    """GCS (or across file systems): files first, the marker last; never overwrite."""
    prefix = staging.rstrip("/") + "/"
    files = sorted(storage.list_files(staging), key=lambda p: p.endswith("/" + MARKER))
    for path in files:
        target = storage.join(final, path[len(prefix):])
        data = storage.read_bytes(path)
        if not storage.write_bytes(target, data, exclusive=not testing):
            if storage.read_bytes(target) != data:
                raise ReleaseFailed(f"{target} appeared with other bytes during publication")
    storage.delete_tree(staging)
    return outcome
