"""Helpers shared by the job and release-layer tests: small inputs, a small CentralNotice
configuration, and the checks every release test needs (published bytes unchanged, no secret
anywhere, the ledger untouched)."""
from __future__ import annotations

import json
import os
import re
from typing import Iterable, Mapping

CN_CAMPAIGN = "C1"
CN_DAY1, CN_DAY2 = "2026-11-01", "2026-11-02"
CN_RELEASE1 = f"{CN_CAMPAIGN}/{CN_DAY1}"
CN_BANNERS = ["C1_dsk", "C1_mob"]
CN_COUNTRIES = ["DE", "FR", "RU"]  # RU is on the protection list
CN_PROJECTS = ["de.wikipedia", "fr.wikipedia"]
CN_IMP_HEADER = ["campaign_id", "banner_id", "country", "project", "date", "impressions"]
CN_CLK_HEADER = ["campaign_id", "banner_id", "country", "project", "date", "user_id"]
LOW = -1e9  # a release threshold that suppresses nothing


def cn_campaign(*, clicks=None, budget=None, impressions=None, end=CN_DAY2, schedule="daily",
                countries=CN_COUNTRIES, campaign_id=CN_CAMPAIGN) -> dict:
    return {
        "campaign_id": campaign_id, "banners": list(CN_BANNERS), "countries": list(countries),
        "projects": list(CN_PROJECTS), "start_date": CN_DAY1, "end_date": end,
        "schedule": schedule,
        "privacy": {
            "impressions": {"k": 10, "epsilon": 1.0, "noise": "discrete_laplace",
                            "neighbouring": "period", "release_threshold": LOW,
                            **(impressions or {})},
            "clicks": clicks or {"noise": "discrete_laplace", "epsilon": 1.0,
                                 "neighbouring": "row", "release_threshold": LOW},
            "budget": budget or {"campaign_total": {"epsilon": 8.0}, "per_period": {"epsilon": 4.0}},
        },
    }


def cn_config(**campaign) -> dict:
    return {"version": 1, "protected_countries": ["RU"], "campaigns": [cn_campaign(**campaign)]}


def write_json(path, data) -> str:
    path = str(path)
    with open(path, "w") as handle:
        json.dump(data, handle)
    return path


def write_csv(path, header, rows) -> str:
    """Rows as CSV text; a row given as a str is written verbatim (malformed lines)."""
    lines = [",".join(header)]
    for row in rows:
        lines.append(row if isinstance(row, str) else
                     ",".join("" if v is None else str(v) for v in row))
    with open(str(path), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    return str(path)


def files_under(root) -> dict[str, bytes]:
    """{relative path: bytes} of every file below ``root`` (symlinks followed)."""
    out = {}
    root = str(root)
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as handle:
                out[os.path.relpath(path, root)] = handle.read()
    return out


def published(root) -> dict[str, bytes]:
    """The published files under an output root: release folders holding a marker."""
    files = files_under(root) if os.path.isdir(str(root)) else {}
    folders = {os.path.dirname(p) for p in files if os.path.basename(p) == "RELEASE.json"
               and not p.startswith(("testing-not-a-release", ".staging"))}
    return {p: b for p, b in files.items() if os.path.dirname(p) in folders}


def secrets_of(key_stores: Iterable) -> set[str]:
    """The secret hex of every key stored under the given key store folders (its key files:
    the store's control records -- the ledger's witness, key use records -- hold public
    digests and ids)."""
    found = set()
    for store in key_stores:
        if not os.path.isdir(str(store)):
            continue
        for name, data in files_under(store).items():
            if name.endswith(".key"):
                found.update(m.decode().lower() for m in re.findall(rb"[0-9a-fA-F]{32,}", data))
    return found


def assert_no_secret(secrets: set[str], texts: Iterable[str] = (), roots: Iterable = ()) -> None:
    """No secret key (hex, or its raw bytes) in any text or any file under ``roots``."""
    blobs = [t.encode("utf-8", "replace") for t in texts]
    for root in roots:
        if os.path.isdir(str(root)):
            blobs.extend(files_under(root).values())
        elif os.path.isfile(str(root)):
            with open(str(root), "rb") as handle:
                blobs.append(handle.read())
    for secret in secrets:
        raw = bytes.fromhex(secret) if len(secret) % 2 == 0 else None
        for blob in blobs:
            assert secret.encode() not in blob.lower(), "a secret key appears in an output"
            assert raw is None or raw not in blob, "a secret key's bytes appear in an output"


def read_json(path) -> Mapping:
    with open(str(path)) as handle:
        return json.load(handle)


def flip_value_byte(path, column: str, row_group: int = 0) -> None:
    """Flip one bit near the end of ``column``'s last data page in ``row_group`` of a Parquet
    file: its footer and page headers stay valid (written uncompressed without dictionary, the
    page then decodes to other numbers), so only a page checksum can tell
    (transforms/parquet_files.py)."""
    with open(str(path), "rb") as handle:
        data = bytearray(handle.read())
    data[value_byte_offset(bytes(data), column, row_group)] ^= 0x10
    with open(str(path), "wb") as handle:
        handle.write(bytes(data))


def value_byte_offset(data: bytes, column: str, row_group: int = 0) -> int:
    """The offset of a byte inside the last page of a column chunk of Parquet ``data``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(pa.BufferReader(data)).metadata
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    chunk = meta.row_group(row_group).column(names.index(column))
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    return start + chunk.total_compressed_size - 3



def kill_worker_once(marker: str):
    """A DoFn that passes its elements through, except that the first element it meets in a
    Dask worker kills that worker process (``os._exit``, like kill -9 mid-task), once per
    ``marker`` file: the worker that creates the marker dies; a retry, or a later run, finds it
    and passes. Outside a Dask worker it only passes. (A local class: pickled by value, so Dask
    workers need not import this module.)"""
    import apache_beam as beam

    class KillWorkerOnce(beam.DoFn):
        def __init__(self, path):
            self._marker = path

        def process(self, element):
            import os

            try:
                import distributed

                distributed.get_worker()  # never the test process itself: only a Dask worker
                fd = os.open(self._marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except (ImportError, ValueError, FileExistsError):
                yield element
                return
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            os._exit(137)

    return KillWorkerOnce(marker)


def unchain(ledger_path, keys_path, fmt: str) -> None:
    """Turn a chained ledger into what an older version wrote (``fmt``): no chain, no record
    numbers, and no chain key in the key store."""
    state = json.loads(open(str(ledger_path)).read())
    state.pop("chain")
    state["format"] = fmt
    for record in state["releases"].values():
        for field in ("seq", "prev", "digest", "hold"):
            record.pop(field, None)
    with open(str(ledger_path), "w") as handle:
        json.dump(state, handle)
    for name in os.listdir(str(keys_path)):
        if name.startswith("ledger-chain-"):
            os.remove(os.path.join(str(keys_path), name))
