"""CentralNotice Algorithms 1 and 2 with Tumult Analytics on local Spark (the benchmark's baseline).

    benchmarks/.venvs/tumult/bin/python benchmarks/centralnotice_tumult/algorithms.py \\
        --config campaigns.json --impressions impressions.parquet --clicks clicks.parquet \\
        --release CAMPAIGN/YYYY-MM-DD --output DIR [--cores 2]

Runs in its own virtualenv (``requirements.txt`` beside this file: Tumult pins older numpy and
pandas than the project), reads the same configuration and Parquet files as
``python -m pipelines.centralnotice`` and writes ``DIR/centralnotice.parquet`` (a Spark output
directory) with the same columns: campaign_id, banner_id, country, project, date, impressions,
clicks (null where suppressed; a key with both suppressed is absent).

What it does, as Wikimedia's CentralNotice report describes the Tumult implementation
(seed 001_4177a0bca025ff82.txt):

* Algorithm 1: every impressions row (n impressions of one key) is split in Spark -- an explode,
  not Python -- into floor(n/k) rows of k and one row of n mod k; Tumult sums them per key with
  clamping bounds [0, k] over the public KeySet (banners x countries x projects x the day, minus
  the protected countries): sensitivity k under ``AddOneRow`` (one block), Laplace noise (Tumult's
  geometric noise for an integer column under pure DP) of scale k/epsilon.
* Algorithm 2: clicks counted per key over the same KeySet, row-DP (``AddOneRow``) or user-DP
  (``AddRowsWithID("user_id")`` and ``MaxRowsPerID(m)``: at most m clicks per user in the period),
  noise scale 1/epsilon or m/epsilon.
* One Session holds both tables with a pure-DP budget equal to the sum of the two epsilons; each
  query spends its measure's epsilon. Noisy values not above the configured release thresholds
  are suppressed afterwards (post-processing, in Spark).

Only discrete-Laplace (pure DP) measures are implemented here; the benchmark configures them.
Tumult draws its noise from its own secure source; there is no seed.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import tempfile
import time
from pathlib import Path

KEYS = ["campaign_id", "banner_id", "country", "project", "date"]


def load_campaign(config_path: str, release: str) -> tuple[dict, _dt.date, list[str]]:
    """The campaign of ``release`` (CAMPAIGN/YYYY-MM-DD, a daily release), its day, protected countries."""
    config = json.loads(Path(config_path).read_text())
    campaign_id, _, day = release.partition("/")
    campaign = next((c for c in config["campaigns"] if c["campaign_id"] == campaign_id), None)
    if campaign is None:
        raise SystemExit(f"--release: no campaign {campaign_id!r} in {config_path}")
    if campaign["schedule"] != "daily":
        raise SystemExit("--release: only daily releases are implemented here")
    date = _dt.date.fromisoformat(day)
    if not _dt.date.fromisoformat(campaign["start_date"]) <= date <= _dt.date.fromisoformat(campaign["end_date"]):
        raise SystemExit(f"--release: {day} is outside the campaign")
    protected = set(config.get("protected_countries", []))
    if config.get("protected_countries_file"):
        text = (Path(config_path).parent / config["protected_countries_file"]).read_text()
        protected |= {line.split("#")[0].strip() for line in text.splitlines()} - {""}
    for measure in ("impressions", "clicks"):
        spec = campaign["privacy"][measure]
        if spec["noise"] != "discrete_laplace" or "epsilon" not in spec:
            raise SystemExit(f"{measure}: only discrete_laplace with epsilon is implemented here")
    return campaign, date, sorted(protected)


def spark_session(cores: int, scratch: str):
    """Local Spark for Tumult: the worker Python is this interpreter, scratch space under ``scratch``."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(f"local[{cores}]").appName("centralnotice-tumult")
             .config("spark.driver.memory", os.environ.get("TUMULT_DRIVER_MEMORY", "4g"))
             .config("spark.sql.shuffle.partitions", str(4 * cores))
             .config("spark.default.parallelism", str(4 * cores))
             .config("spark.sql.warehouse.dir", os.path.join(scratch, "warehouse"))
             .config("spark.local.dir", os.path.join(scratch, "local"))
             .config("spark.ui.enabled", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def impression_blocks(spark, path: str, campaign_id: str, day: _dt.date, k: int):
    """Algorithm 1's split: each row of n impressions -> floor(n/k) rows of k and one of n mod k."""
    from pyspark.sql import functions as F

    rows = (spark.read.parquet(path).select(*KEYS, "impressions")
            .where((F.col("campaign_id") == campaign_id) & (F.col("date") == F.lit(day))
                   & F.col("impressions").isNotNull() & (F.col("impressions") >= 0)))
    full = F.floor(F.col("impressions") / k).cast("long")
    return (rows.withColumn("full", full)
            .withColumn("block", F.explode(F.sequence(F.lit(0).cast("long"), F.col("full"))))
            .select(*KEYS, F.when(F.col("block") < F.col("full"), F.lit(k).cast("long"))
                    .otherwise(F.col("impressions") - F.col("full") * k).alias("impressions"))
            .where(F.col("impressions") > 0))


def click_rows(spark, path: str, campaign_id: str, day: _dt.date, user_dp: bool):
    from pyspark.sql import functions as F

    columns = KEYS + (["user_id"] if user_dp else [])
    rows = spark.read.parquet(path).select(*columns) \
        .where((F.col("campaign_id") == campaign_id) & (F.col("date") == F.lit(day)))
    if user_dp:
        rows = rows.where(F.col("user_id").isNotNull() & (F.trim(F.col("user_id")) != ""))
    return rows


def release(spark, campaign: dict, day: _dt.date, protected: list[str], impressions_path: str,
            clicks_path: str):
    """Both measures over the public KeySet, thresholds applied: a Spark DataFrame of released rows."""
    from pyspark.sql import functions as F
    from tmlt.analytics import (AddOneRow, AddRowsWithID, KeySet, MaxRowsPerID, PureDPBudget,
                                QueryBuilder, Session)

    imp, clk = campaign["privacy"]["impressions"], campaign["privacy"]["clicks"]
    k, user_dp = int(imp["k"]), clk["neighbouring"] == "user"
    keyset = KeySet.from_dict({"campaign_id": [campaign["campaign_id"]], "banner_id": campaign["banners"],
                               "country": campaign["countries"], "project": campaign["projects"],
                               "date": [day]}) - KeySet.from_dict({"country": protected})
    builder = Session.Builder()
    if user_dp:
        builder = builder.with_id_space("users")
    session = (builder
               .with_privacy_budget(PureDPBudget(float(imp["epsilon"]) + float(clk["epsilon"])))
               .with_private_dataframe("impressions",
                                       impression_blocks(spark, impressions_path, campaign["campaign_id"], day, k),
                                       protected_change=AddOneRow())
               .with_private_dataframe("clicks",
                                       click_rows(spark, clicks_path, campaign["campaign_id"], day, user_dp),
                                       protected_change=AddRowsWithID("user_id", id_space="users") if user_dp else AddOneRow())
               .build())
    impressions = session.evaluate(
        QueryBuilder("impressions").groupby(keyset)
        .sum("impressions", low=0, high=k, name="impressions", mechanism="laplace"),
        PureDPBudget(float(imp["epsilon"])))
    clicks_query = QueryBuilder("clicks")
    if user_dp:
        clicks_query = clicks_query.enforce(MaxRowsPerID(int(clk["max_clicks_per_user"])))
    clicks = session.evaluate(clicks_query.groupby(keyset).count(name="clicks", mechanism="laplace"),
                              PureDPBudget(float(clk["epsilon"])))

    def above(column, threshold):
        return F.when(F.col(column) > F.lit(float(threshold)), F.col(column).cast("long"))

    return (impressions.join(clicks, KEYS, "full_outer")
            .select(*KEYS, above("impressions", imp["release_threshold"]).alias("impressions"),
                    above("clicks", clk["release_threshold"]).alias("clicks"))
            .where(F.col("impressions").isNotNull() | F.col("clicks").isNotNull()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--impressions", required=True, help="Parquet file or directory")
    parser.add_argument("--clicks", required=True, help="Parquet file or directory")
    parser.add_argument("--release", required=True, help="CAMPAIGN/YYYY-MM-DD")
    parser.add_argument("--output", required=True, help="directory; writes OUTPUT/centralnotice.parquet")
    parser.add_argument("--cores", type=int, default=2, help="Spark local[N]")
    args = parser.parse_args(argv)
    campaign, day, protected = load_campaign(args.config, args.release)
    started = time.perf_counter()
    os.makedirs(args.output, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tumult_scratch_") as scratch:
        spark = spark_session(args.cores, scratch)
        try:
            result = release(spark, campaign, day, protected, args.impressions, args.clicks)
            out = os.path.join(args.output, "centralnotice.parquet")
            result.orderBy(*KEYS).coalesce(1).write.mode("overwrite").parquet(out)
            released = spark.read.parquet(out).count()
        finally:
            from tmlt.analytics.utils import cleanup

            cleanup()
            spark.stop()
    print(f"tumult: released {released} keys of campaign {campaign['campaign_id']} on {day} "
          f"to {out} in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
