"""One CentralNotice release at Wikipedia scale: this project on Beam vs Tumult Analytics on Spark.

    python benchmarks/centralnotice.py [--impression-rows 2000000] [--clicks 1000000] [--k 100]
        [--epsilon 1.0] [--clicks-dp user|row] [--max-clicks-per-user 5] [--seed 0]
        [--part-rows 131072] [--data-dir DIR] [--runner DirectRunner] [other Beam options]
        [--skip-tumult] [--setup-tumult] [--tumult-cores 2]
    python benchmarks/centralnotice.py --impression-rows 20000 --clicks 10000 --skip-tumult  # quick

One day of one campaign whose public keyset is large (banners x every country x every project of
the generator's catalogue, sized so the day has about ``--impression-rows`` impression rows) is
generated with :mod:`pipelines.centralnotice.data` (heavy-tailed impressions per key, clicks from
Zipf-heavy users), written as Parquet part files of ``--part-rows`` rows (as Spark writes a Hive
table), and released twice with the same configuration:

* ``ours``: ``python -m pipelines.centralnotice --release CAMPAIGN/DAY --testing_seed 1`` (same
  mechanics and noise path as a real release, minus the ledger) on the DirectRunner profile
  (the in-process FnApiRunner: one worker, so one core, unless Beam options say otherwise);
* ``tumult``: ``benchmarks/centralnotice_tumult/algorithms.py`` -- Algorithms 1 and 2 written with
  Tumult Analytics as Wikimedia did (impression rows exploded in Spark into blocks of k, a public
  KeySet, a sum clamped to [0, k]; clicks counted per key, per-user truncation with
  ``MaxRowsPerID`` for user-DP), run in its own virtualenv ``benchmarks/.venvs/tumult`` (Tumult
  pins older numpy and pandas) on local Spark with ``--tumult-cores`` cores (default 2, the
  whole machine) and a 4 GB driver. ``--setup-tumult`` creates the virtualenv; it needs Java.

Each leg is a fresh process, timed from start to exit (interpreter, Spark/JVM start-up and
output writing included). Peak memory is the largest sum of the resident set sizes of the leg's
whole process tree (the JVM included), sampled every 0.1 s from /proc. Both legs then must
cover the same keyset; the sanity line compares their noisy impressions on large keys.

The last line is ``speedup_vs_tumult=X`` with X = Tumult seconds / our seconds (``skipped``
with ``--skip-tumult``, ``unavailable`` when the Tumult leg cannot run, with the reason above).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from pipelines import quiet_beam_import  # noqa: E402

quiet_beam_import()  # no `apitools not found` warning as the first line

from accounting.calibration import NoiseKind, calibrate  # noqa: E402
from pipelines.centralnotice.config import parse_config  # noqa: E402
from pipelines.centralnotice.data import (COUNTRY_ORDER, generate_clicks,  # noqa: E402
                                          generate_impressions, project_catalogue,
                                          protected_countries_text, write_table)
from transforms import parquet_files  # noqa: E402

TUMULT_DIR = Path(__file__).resolve().parent / "centralnotice_tumult"
TUMULT_VENV = Path(__file__).resolve().parent / ".venvs" / "tumult"
TUMULT_REQUIREMENTS = TUMULT_DIR / "requirements.txt"
CAMPAIGN_ID = "C2026_bench_fr"
DAY = _dt.date(2026, 11, 26)
KEYS = ["campaign_id", "banner_id", "country", "project", "date"]


# --------------------------------------------------------------------------- data

def campaign_config(n_banners: int, *, k: int, epsilon: float, clicks_dp: str, m: int) -> dict:
    """One campaign, one day, every country and project: the configuration (JSON dict).

    Thresholds as in :mod:`pipelines.centralnotice.data`: an empty key is released spuriously
    with probability at most 1e-4 per measure.
    """
    projects = [str(p) for p in sorted(project_catalogue()[0].tolist())]
    imp_spec = calibrate(NoiseKind.DISCRETE_LAPLACE, epsilon=epsilon, l1_sensitivity=k)
    clk_sens = 1 if clicks_dp == "row" else m
    clk_spec = calibrate(NoiseKind.DISCRETE_LAPLACE, epsilon=epsilon, l1_sensitivity=clk_sens)
    clicks = {"noise": "discrete_laplace", "epsilon": epsilon, "neighbouring": clicks_dp,
              "release_threshold": float(math.ceil(clk_spec.ci_halfwidth(1 - 2e-4)))}
    if clicks_dp == "user":
        clicks.update(max_clicks_per_user=m, bound_per="period")
    total = 2 * epsilon * 1.001
    campaign = {
        "campaign_id": CAMPAIGN_ID,
        "banners": [f"{CAMPAIGN_ID}_b{j:02d}_{['dsk', 'mob', 'ipd', 'app'][j % 4]}" for j in range(n_banners)],
        "countries": sorted(COUNTRY_ORDER),
        "projects": projects,
        "start_date": DAY.isoformat(), "end_date": DAY.isoformat(), "schedule": "daily",
        "privacy": {
            "impressions": {"k": k, "epsilon": epsilon, "noise": "discrete_laplace",
                            "neighbouring": "period",
                            "release_threshold": float(math.ceil(imp_spec.ci_halfwidth(1 - 2e-4)))},
            "clicks": clicks,
            "budget": {"campaign_total": {"epsilon": total, "delta": 1e-9},
                       "per_period": {"epsilon": total, "delta": 1e-9}},
        },
    }
    return {"version": 1, "accountant": "basic", "protected_countries_file": "protected_countries.txt",
            "campaigns": [campaign]}


def write_parts(table: pa.Table, directory: Path, part_rows: int) -> None:
    """``table`` as Parquet part files of ``part_rows`` rows, laid out as a Hive table written by
    Spark would be (several files, one row group each)."""
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("part-*.parquet"):
        old.unlink()
    for i, start in enumerate(range(0, table.num_rows, part_rows)):
        write_table(table.slice(start, part_rows), str(directory / f"part-{i:05d}.parquet"))


def make_dataset(directory: Path, *, impression_rows: int, clicks: int, k: int, epsilon: float,
                 clicks_dp: str, m: int, seed: int, part_rows: int) -> dict:
    """Write campaigns.json, protected_countries.txt and the impressions/ and clicks/ part files."""
    directory.mkdir(parents=True, exist_ok=True)
    n_countries, n_projects = len(COUNTRY_ORDER), len(project_catalogue()[0])
    # Heavy-tailed draws fill a keyset unevenly: aim for rows = 60 % of the keys.
    n_banners = max(1, math.ceil(impression_rows / 0.6 / (n_countries * n_projects)))
    config = campaign_config(n_banners, k=k, epsilon=epsilon, clicks_dp=clicks_dp, m=m)
    paths = {name: directory / name for name in
             ("campaigns.json", "protected_countries.txt", "impressions", "clicks")}
    paths["protected_countries.txt"].write_text(protected_countries_text())
    paths["campaigns.json"].write_text(json.dumps(config, indent=1) + "\n")
    parsed = parse_config(config, str(paths["campaigns.json"]))
    rng = np.random.default_rng(seed)
    impressions = generate_impressions(parsed, impression_rows, rng)
    click_table = generate_clicks(impressions, clicks, rng)
    write_parts(impressions, paths["impressions"], part_rows)
    write_parts(click_table, paths["clicks"], part_rows)
    campaign = parsed.campaigns[0]
    return {"paths": {name: str(p) for name, p in paths.items()},
            "impression_rows": impressions.num_rows, "click_rows": click_table.num_rows,
            "impressions_total": int(pc.sum(impressions.column("impressions")).as_py()),
            "keyset": campaign.keyset_size(campaign.dates()), "banners": n_banners,
            "countries": len(campaign.released_countries()), "projects": n_projects,
            "release": f"{CAMPAIGN_ID}/{DAY.isoformat()}"}


def dataset(directory: Path, args) -> dict:
    """The dataset for these arguments, generated once and reused (``dataset.json`` records it)."""
    want = {"impression_rows": args.impression_rows, "clicks": args.clicks, "k": args.k,
            "epsilon": args.epsilon, "clicks_dp": args.clicks_dp, "m": args.max_clicks_per_user,
            "seed": args.seed, "part_rows": args.part_rows}
    record = directory / "dataset.json"
    if record.exists():
        stored = json.loads(record.read_text())
        if stored.get("parameters") == want and all(Path(p).exists() for p in stored["paths"].values()):
            return stored
    started = time.perf_counter()
    info = make_dataset(directory, **want)
    info["parameters"] = want
    info["generate_seconds"] = round(time.perf_counter() - started, 1)
    record.write_text(json.dumps(info, indent=1) + "\n")
    return info


# --------------------------------------------------------------------------- measuring a leg

def _tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants (from /proc; 0 once gone)."""
    total, stack, seen = 0, [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/statm") as handle:
                total += int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as handle:
                    stack.extend(int(c) for c in handle.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError):
            continue
    return total


def run_leg(name: str, argv: list[str], *, env: Optional[dict] = None, log: Path) -> dict:
    """Run ``argv`` to completion; wall seconds, peak process-tree RSS, exit code, log tail."""
    peak = [0]
    with open(log, "wb") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, **(env or {})})
        done = threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], _tree_rss(proc.pid))
                done.wait(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        code = proc.wait()
        seconds = time.perf_counter() - started
        done.set()
        sampler.join()
    tail = log.read_text(errors="replace").strip().splitlines()[-15:]
    return {"leg": name, "seconds": seconds, "peak_bytes": peak[0], "returncode": code, "log": str(log),
            "tail": tail}


# --------------------------------------------------------------------------- the legs

def ours_argv(info: dict, out_dir: Path, runner: str, extra: list[str]) -> list[str]:
    p = info["paths"]
    return [sys.executable, "-m", "pipelines.centralnotice", "--config", p["campaigns.json"],
            "--impressions", p["impressions"], "--clicks", p["clicks"],
            "--release", info["release"], "--output", str(out_dir), "--testing_seed", "1",
            "--runner", runner, *extra]


def tumult_python() -> Path:
    return TUMULT_VENV / "bin" / "python"


def setup_tumult() -> None:
    """Create the Tumult virtualenv (its own numpy/pandas/pyspark pins) from requirements.txt."""
    if not tumult_python().exists():
        subprocess.run(["python3", "-m", "venv", str(TUMULT_VENV)], check=True)
    subprocess.run([str(tumult_python()), "-m", "pip", "install", "-q", "-r", str(TUMULT_REQUIREMENTS)],
                   check=True)


def tumult_unavailable() -> Optional[str]:
    """Why the Tumult leg cannot run here, or None."""
    if not tumult_python().exists():
        return (f"no Tumult virtualenv at {TUMULT_VENV} (create it with --setup-tumult, i.e. "
                f"python3 -m venv + pip install -r {TUMULT_REQUIREMENTS.relative_to(ROOT)})")
    probe = subprocess.run([str(tumult_python()), "-c", "import tmlt.analytics, pyspark"],
                           capture_output=True, text=True)
    if probe.returncode:
        return "tmlt.analytics does not import in the Tumult virtualenv: " + \
            (probe.stderr.strip().splitlines() or ["?"])[-1]
    java = subprocess.run(["java", "-version"], capture_output=True, text=True)
    if java.returncode:
        return "no Java runtime for Spark (java -version failed)"
    return None


def tumult_argv(info: dict, out_dir: Path, cores: int) -> list[str]:
    p = info["paths"]
    return [str(tumult_python()), str(TUMULT_DIR / "algorithms.py"), "--config", p["campaigns.json"],
            "--impressions", p["impressions"], "--clicks", p["clicks"],
            "--release", info["release"], "--output", str(out_dir), "--cores", str(cores)]


# --------------------------------------------------------------------------- comparing outputs

def read_release(path: Path) -> pa.Table:
    table = parquet_files.read_table(path)
    columns = {k: table.column(k).cast(pa.string()) for k in KEYS}
    return pa.table({**columns, "impressions": table.column("impressions").cast(pa.float64()),
                     "clicks": table.column("clicks").cast(pa.float64())})


def compare(ours: pa.Table, tumult: pa.Table, info: dict) -> dict:
    """Keys outside the keyset, overlap of released keys, agreement of impressions on big keys."""
    truth = parquet_files.read_table(info["paths"]["impressions"])
    truth = pa.table({**{k: truth.column(k).cast(pa.string()) for k in KEYS},
                      "true": truth.column("impressions").cast(pa.float64())})
    config = json.loads(Path(info["paths"]["campaigns.json"]).read_text())["campaigns"][0]
    protected = {line.strip() for line in Path(info["paths"]["protected_countries.txt"]).read_text()
                 .splitlines() if line.strip() and not line.startswith("#")}

    def outside(t):
        ok = pc.is_in(t.column("banner_id"), pa.array(config["banners"])).to_numpy(zero_copy_only=False) & \
            pc.is_in(t.column("project"), pa.array(config["projects"])).to_numpy(zero_copy_only=False) & \
            ~pc.is_in(t.column("country"), pa.array(sorted(protected))).to_numpy(zero_copy_only=False)
        return int((~ok).sum())

    joined = ours.join(tumult, KEYS, join_type="inner", left_suffix="_ours", right_suffix="_tumult") \
        .join(truth, KEYS, join_type="left outer")
    both = joined.filter(pc.and_(pc.is_valid(joined.column("impressions_ours")),
                                 pc.is_valid(joined.column("impressions_tumult"))))
    true = pc.fill_null(both.column("true"), 0.0).to_numpy()
    big = true >= 100 * config["privacy"]["impressions"]["k"] / config["privacy"]["impressions"]["epsilon"]
    a = both.column("impressions_ours").to_numpy()[big]
    b = both.column("impressions_tumult").to_numpy()[big]
    rel = np.abs(a - b) / np.maximum(true[big], 1.0)
    return {"ours_rows": ours.num_rows, "tumult_rows": tumult.num_rows, "common_rows": joined.num_rows,
            "ours_outside_keyset": outside(ours), "tumult_outside_keyset": outside(tumult),
            "big_keys": int(big.sum()),
            "median_rel_diff_big": float(np.median(rel)) if big.any() else float("nan"),
            "ours_total_impressions": float(pc.sum(ours.column("impressions")).as_py() or 0),
            "tumult_total_impressions": float(pc.sum(tumult.column("impressions")).as_py() or 0),
            "ours_total_clicks": float(pc.sum(ours.column("clicks")).as_py() or 0),
            "tumult_total_clicks": float(pc.sum(tumult.column("clicks")).as_py() or 0)}


# --------------------------------------------------------------------------- main

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impression-rows", type=int, default=2_000_000)
    parser.add_argument("--clicks", type=int, default=1_000_000)
    parser.add_argument("--k", type=int, default=100, help="impressions per block (Algorithm 1)")
    parser.add_argument("--epsilon", type=float, default=1.0,
                        help="epsilon of each measure (impressions and clicks; discrete Laplace)")
    parser.add_argument("--clicks-dp", choices=("user", "row"), default="user")
    parser.add_argument("--max-clicks-per-user", type=int, default=5, help="m for user-DP clicks")
    parser.add_argument("--seed", type=int, default=0, help="data generator seed")
    parser.add_argument("--part-rows", type=int, default=131_072,
                        help="rows per Parquet part file (one row group each)")
    parser.add_argument("--data-dir", help="where the data is generated (reused if the parameters match); "
                                           "default: a temporary directory")
    parser.add_argument("--runner", default="DirectRunner", help="our leg's Beam runner profile")
    parser.add_argument("--tumult-cores", type=int, default=2, help="Spark local[N]")
    parser.add_argument("--skip-tumult", action="store_true")
    parser.add_argument("--setup-tumult", action="store_true",
                        help=f"create/update {TUMULT_VENV.relative_to(ROOT)} first (created anyway "
                             "when missing, unless --skip-tumult)")
    args, beam_extra = parser.parse_known_args(argv)

    if args.setup_tumult or (not args.skip_tumult and not tumult_python().exists()):
        setup_tumult()  # first use: Tumult's own virtualenv (a few minutes)
    with tempfile.TemporaryDirectory(prefix="cn_bench_") as tmp:
        tmp = Path(tmp)
        data_dir = Path(args.data_dir) if args.data_dir else tmp / "data"
        info = dataset(data_dir, args)
        print(f"data: one day ({DAY}) of campaign {CAMPAIGN_ID}: {info['impression_rows']:,} impression rows "
              f"({info['impressions_total']:,} impressions, k={args.k}), {info['click_rows']:,} clicks; "
              f"keyset {info['keyset']:,} keys = {info['banners']} banners x {info['countries']} countries "
              f"x {info['projects']} projects; clicks {args.clicks_dp}-DP"
              + (f" m={args.max_clicks_per_user}" if args.clicks_dp == "user" else "")
              + f"; epsilon {args.epsilon} per measure")
        rows = info["impression_rows"] + info["click_rows"]
        results = []
        ours = run_leg("ours (Beam " + args.runner + ")", ours_argv(info, tmp / "ours", args.runner, beam_extra),
                       log=tmp / "ours.log")
        results.append(ours)
        ours_out = tmp / "ours" / "testing-not-a-release" / info["release"] / "centralnotice.parquet"
        tumult, reason = None, None
        if not args.skip_tumult:
            reason = tumult_unavailable()
            if reason is None:
                tumult = run_leg(f"tumult (tmlt.analytics, Spark local[{args.tumult_cores}])",
                                 tumult_argv(info, tmp / "tumult", args.tumult_cores), log=tmp / "tumult.log")
                results.append(tumult)
                if tumult["returncode"]:
                    reason = f"the Tumult leg failed (exit {tumult['returncode']}): " + " | ".join(tumult["tail"][-5:])
        print(f"{'leg':<42} {'seconds':>9} {'rows/s':>11} {'peak MB':>9}")
        for r in results:
            status = "" if r["returncode"] == 0 else f"  FAILED (exit {r['returncode']}, log {r['log']})"
            print(f"{r['leg']:<42} {r['seconds']:>9.1f} {rows / r['seconds']:>11,.0f} "
                  f"{r['peak_bytes'] / 2**20:>9,.0f}{status}")
        for r in results:
            if r["returncode"]:
                print(f"--- {r['leg']}: last lines of its log\n" + "\n".join(r["tail"]), file=sys.stderr)
        if tumult is not None and tumult["returncode"] == 0 and ours["returncode"] == 0:
            print(f"memory_ratio_tumult_over_ours={tumult['peak_bytes'] / max(ours['peak_bytes'], 1):.2f}")
            c = compare(read_release(ours_out), read_release(tmp / "tumult" / "centralnotice.parquet"), info)
            print(f"sanity: released rows ours={c['ours_rows']:,} tumult={c['tumult_rows']:,} "
                  f"common={c['common_rows']:,}; outside keyset ours={c['ours_outside_keyset']} "
                  f"tumult={c['tumult_outside_keyset']}; median |ours-tumult|/true impressions on "
                  f"{c['big_keys']:,} big keys = {c['median_rel_diff_big']:.2e}; totals impressions "
                  f"{c['ours_total_impressions']:,.0f} vs {c['tumult_total_impressions']:,.0f} "
                  f"(true {info['impressions_total']:,}), clicks {c['ours_total_clicks']:,.0f} vs "
                  f"{c['tumult_total_clicks']:,.0f}")
        if args.skip_tumult:
            print("speedup_vs_tumult=skipped")
        elif reason is not None or ours["returncode"]:
            if ours["returncode"]:
                print(f"ours: failed (exit {ours['returncode']}); its log's last lines are above")
            if reason:
                print(f"tumult: unavailable: {reason}")
            print("speedup_vs_tumult=unavailable")
        else:
            print(f"speedup_vs_tumult={tumult['seconds'] / ours['seconds']:.2f}")
    return 0 if ours["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
