"""Choosing k and epsilon before a CentralNotice release: expected error and suppression.

For each campaign of a configuration and each candidate (k, epsilon) for impressions (and each
candidate epsilon -- or rho, for zCDP clicks -- for clicks) the report gives the calibrated
noise (:func:`accounting.calibration.calibrate`: impressions with sensitivity k, clicks with 1
under row-DP or max_clicks_per_user under user-DP), its standard deviation and 95 % interval
half-width, and the expected share of keys suppressed by the release threshold:

    share suppressed = mean over the keyset of P(true value + noise <= threshold),

computed exactly from the noise distribution (:mod:`accounting.distributions`: discrete Laplace
in closed form; discrete Gaussian by summing its mass function; real-valued kinds on their grid /
by the normal CDF), with :func:`~accounting.distributions.spurious_rate`,
:func:`~accounting.distributions.suppressed_share` and
:func:`~accounting.distributions.threshold_for_rate`.
With ``--impressions`` / ``--clicks`` the true values per key come from those files (historic
or synthetic data; keys without rows are 0). Without them the report gives the share of
*empty* keys (true value 0) that would be released spuriously, P(noise > threshold).

The threshold is the configured ``release_threshold`` of the measure, or with
``--spurious-rate r`` the smallest threshold releasing an empty key with probability <= r
(then it follows the noise scale of each candidate).

Caution: with real data files the report is computed from raw data, so it is *not*
differentially private. It is for the operator only: do not publish it, and prefer last
period's data or synthetic data over the data about to be released.

    python -m pipelines.centralnotice.tuning --config campaigns.json [--impressions FILE]
        [--clicks FILE] --k 10,50,100 --epsilon 0.5,1,2 [--rho 0.005,0.01] --out DIR

writes ``tuning.txt`` (the table, also printed), ``tuning.csv`` and one
``tuning_<campaign>.png`` per campaign (std and suppression against k for each epsilon).
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from accounting.calibration import calibrate, calibrate_zcdp
from accounting.distributions import spurious_rate, suppressed_share, threshold_for_rate
from pipelines.centralnotice.config import KEY_COLUMNS, CampaignConfig, load_config
from pipelines.centralnotice.impressions import clean_impressions, sum_duplicates


# --------------------------------------------------------------------------- true values

def _align_dates(table: pa.Table) -> pa.Table:
    index = table.schema.get_field_index("date")
    if index >= 0 and table.schema.field(index).type != pa.date32():
        table = table.set_column(index, "date", pc.cast(table.column(index), pa.date32()))
    return table


def read_tables(patterns: str) -> pa.Table:
    """Every file of ``patterns`` (comma-separated paths, globs -- relative ones too -- or
    folders; resolved like a job's inputs, :func:`pipelines.release.inputs.resolve`), as one
    table."""
    from pipelines.release.errors import ReleaseRefused
    from pipelines.release.inputs import InputSpec, resolve

    try:
        files = resolve(InputSpec(name="tuning input", paths=tuple(
            p.strip() for p in patterns.split(",") if p.strip()), columns={}))
    except ReleaseRefused as err:
        raise ValueError(str(err)) from None
    tables = [_align_dates(read_table(path)) for path in files]
    return pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]


def read_table(path: str) -> pa.Table:
    """A Parquet or CSV file (local or gs://; chosen by extension). Downloaded bytes are copied
    into Arrow's memory before parsing: Arrow threads left holding Python bytes abort the process
    at exit (rc 134; see pipelines.release.arrow_files)."""
    if not path.endswith((".parquet", ".csv")):
        raise ValueError(f"input must end in .parquet or .csv, got {path!r}")
    fmt = "parquet" if path.endswith(".parquet") else "csv"
    if path.startswith("gs://"):
        from accounting import gcs
        from pipelines.release.arrow_files import arrow_owned, table_from_buffer

        return table_from_buffer(arrow_owned(gcs.blob(path).download_as_bytes()), fmt)
    if fmt == "parquet":
        from transforms import parquet_files

        # a path: Arrow opens the file itself, no Python object involved
        return parquet_files.read_table(path)
    from pyarrow import csv as pacsv

    return pacsv.read_csv(path)


def aggregate_impressions(impressions: pa.Table) -> pa.Table:
    """Per key: impressions with bad rows dropped and duplicate rows summed."""
    clean, _ = clean_impressions(_align_dates(impressions))
    return sum_duplicates(clean)


def aggregate_clicks(clicks: pa.Table) -> pa.Table:
    """Per key: the raw number of click rows (before any per-user bounding)."""
    missing = [c for c in KEY_COLUMNS if c not in clicks.column_names]
    if missing:
        raise ValueError(f"clicks table is missing column(s) {missing}; it has {clicks.column_names}")
    return _align_dates(clicks.select(list(KEY_COLUMNS))).group_by(list(KEY_COLUMNS), use_threads=False) \
        .aggregate([([], "count_all")]).rename_columns(list(KEY_COLUMNS) + ["clicks"])


def split_by_campaign(table: pa.Table) -> dict[str, pa.Table]:
    """The rows of each campaign_id (one pass: dictionary-encode, stable sort, slice)."""
    if table.num_rows == 0:
        return {}
    encoded = pc.dictionary_encode(table.column("campaign_id")).combine_chunks()
    index = encoded.indices.to_numpy(zero_copy_only=False)
    order = np.argsort(index, kind="stable")
    bounds = np.searchsorted(index[order], np.arange(len(encoded.dictionary) + 1))
    ordered = table.take(pa.array(order))
    return {name: ordered.slice(bounds[i], bounds[i + 1] - bounds[i])
            for i, name in enumerate(encoded.dictionary.to_pylist())}


def on_keyset(campaign: CampaignConfig, per_key: Optional[pa.Table], column: str) -> np.ndarray:
    """``column`` of ``per_key`` for every key of the campaign's keyset, in keyset order (absent = 0)."""
    keyset = campaign.keyset()
    if per_key is None or per_key.num_rows == 0:
        return np.zeros(keyset.num_rows)
    per_key = _align_dates(per_key.filter(pc.equal(per_key.column("campaign_id"), campaign.campaign_id)))
    keyset = keyset.append_column("_order", pa.array(np.arange(keyset.num_rows, dtype=np.int64)))
    joined = keyset.join(per_key.select(list(KEY_COLUMNS) + [column]), keys=list(KEY_COLUMNS),
                         join_type="left outer", use_threads=False).sort_by("_order")
    return pc.fill_null(joined.column(column), 0).to_numpy().astype(np.float64)


def impressions_per_key(campaign: CampaignConfig, impressions: pa.Table) -> np.ndarray:
    """True impressions of every keyset key (bad rows dropped, duplicates summed, absent = 0)."""
    return on_keyset(campaign, aggregate_impressions(impressions), "impressions")


def clicks_per_key(campaign: CampaignConfig, clicks: pa.Table) -> np.ndarray:
    """Raw click counts of every keyset key (before any per-user bounding; absent = 0)."""
    return on_keyset(campaign, aggregate_clicks(clicks), "clicks")


def true_values_by_campaign(campaigns: Sequence[CampaignConfig], impressions: Optional[pa.Table],
                            clicks: Optional[pa.Table]) -> dict[str, tuple]:
    """``{campaign_id: (true impressions, true clicks)}`` per keyset key (None if no table);
    each input table is aggregated once."""
    imp = None if impressions is None else split_by_campaign(aggregate_impressions(impressions))
    clk = None if clicks is None else split_by_campaign(aggregate_clicks(clicks))
    return {c.campaign_id: (None if imp is None else on_keyset(c, imp.get(c.campaign_id), "impressions"),
                            None if clk is None else on_keyset(c, clk.get(c.campaign_id), "clicks"))
            for c in campaigns}


# --------------------------------------------------------------------------- the report

@dataclass(frozen=True, kw_only=True)
class TuningRow:
    campaign_id: str
    measure: str
    k: Optional[int]
    epsilon: float
    delta: float
    rho: Optional[float]
    noise: str
    sensitivity: float
    scale: float
    std: float
    ci95: float
    threshold: float
    keys: int
    share_suppressed: Optional[float]  # with true values only
    spurious_rate: float  # P(an empty key is released)
    expected_spurious_keys: float  # spurious rate x number of empty keys (all keys if no data)


def _row(campaign, measure, k, spec, threshold_of, values, keys) -> TuningRow:
    threshold = threshold_of(spec)
    rate = spurious_rate(spec, threshold)
    empty = keys if values is None else int(np.sum(values == 0))
    return TuningRow(
        campaign_id=campaign.campaign_id, measure=measure, k=k, epsilon=spec.epsilon,
        delta=spec.delta, rho=spec.rho, noise=spec.kind.value,
        sensitivity=spec.l1_sensitivity if spec.l1_sensitivity is not None else spec.l2_sensitivity,
        scale=spec.scale, std=spec.std, ci95=spec.ci_halfwidth(0.95), threshold=threshold, keys=keys,
        share_suppressed=None if values is None else suppressed_share(spec, threshold, values),
        spurious_rate=rate, expected_spurious_keys=rate * empty)


#: The measure names of the rows of a campaign calibrated jointly to ``privacy.target``: the
#: noise its releases use, with the configured k and weights.
TARGET_ROW = {"impressions": "impressions (target)", "clicks": "clicks (target)"}

# Without --rho, zCDP clicks are compared at the configured rho and around it (a single candidate
# would be a single point: nothing to choose between).
DEFAULT_RHO_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)


def tune_campaign(campaign: CampaignConfig, ks: Sequence[int], epsilons: Sequence[float], *,
                  rhos: Optional[Sequence[float]] = None, true_impressions=None, true_clicks=None,
                  spurious: Optional[float] = None) -> list[TuningRow]:
    """Report rows for one campaign: impressions for every (k, epsilon), clicks for every
    epsilon (or rho, when the campaign's clicks are zCDP: ``rhos``, by default the configured one
    and :data:`DEFAULT_RHO_FACTORS` times it).

    ``true_impressions`` / ``true_clicks``: optional true values per keyset key (see
    :func:`true_values_by_campaign`); without them the report is for empty keys. A campaign with
    ``privacy.target`` gets two more rows (:data:`TARGET_ROW`): its measures as its releases
    calibrate them, jointly to the target (each candidate row is one measure alone).
    """
    if not ks or not epsilons:
        raise ValueError("give at least one k and one epsilon")
    keys = campaign.keyset_size()
    imp_values = None if true_impressions is None else np.asarray(true_impressions, dtype=np.float64)
    click_values = None if true_clicks is None else np.asarray(true_clicks, dtype=np.float64)
    for name, values in (("true_impressions", imp_values), ("true_clicks", click_values)):
        if values is not None and values.shape != (keys,):
            raise ValueError(f"{name} must have one value per keyset key ({keys}), got shape {values.shape}")

    def threshold_of(measure):
        configured = getattr(campaign, measure).release_threshold
        return (lambda spec: configured) if spurious is None else \
            (lambda spec: threshold_for_rate(spec, spurious))

    rows = []
    imp = campaign.impressions
    for epsilon in epsilons:
        for k in ks:
            spec = calibrate(imp.noise, epsilon=epsilon, delta=imp.budget.delta, l1_sensitivity=k,
                             l2_sensitivity=k)
            rows.append(_row(campaign, "impressions", int(k), spec, threshold_of("impressions"),
                             imp_values, keys))
    cl = campaign.clicks
    if cl.budget.is_zcdp:
        for rho in (rhos or [cl.budget.rho * f for f in DEFAULT_RHO_FACTORS]):
            spec = calibrate_zcdp(cl.noise, rho=rho, l2_sensitivity=cl.sensitivity, l0=cl.l0,
                                  delta_for_reporting=cl.budget.delta, l1_sensitivity=cl.sensitivity)
            rows.append(_row(campaign, "clicks", None, spec, threshold_of("clicks"), click_values, keys))
    else:
        for epsilon in epsilons:
            spec = calibrate(cl.noise, epsilon=epsilon, delta=cl.budget.delta, l1_sensitivity=cl.sensitivity,
                             l2_sensitivity=cl.sensitivity, l0=cl.l0)
            rows.append(_row(campaign, "clicks", None, spec, threshold_of("clicks"), click_values, keys))
    if campaign.target is not None:
        # The candidates above are each measure calibrated alone; a campaign calibrated jointly
        # to a target releases with the joint noise instead: its rows say what the release uses.
        specs = campaign.noise_specs()
        rows.append(_row(campaign, TARGET_ROW["impressions"], int(imp.k), specs["impressions"],
                         threshold_of("impressions"), imp_values, keys))
        rows.append(_row(campaign, TARGET_ROW["clicks"], None, specs["clicks"], threshold_of("clicks"),
                         click_values, keys))
    return rows


_COLUMNS = [("campaign_id", "campaign", "{}"), ("measure", "measure", "{}"), ("k", "k", "{}"),
            ("epsilon", "epsilon", "{:g}"), ("rho", "rho", "{:g}"), ("noise", "noise", "{}"),
            ("sensitivity", "sens", "{:g}"), ("std", "std", "{:.4g}"), ("ci95", "95% +-", "{:.4g}"),
            ("threshold", "threshold", "{:g}"), ("keys", "keys", "{}"),
            ("share_suppressed", "suppressed", "{:.2%}"), ("spurious_rate", "P(spurious)", "{:.2e}"),
            ("expected_spurious_keys", "E[spurious keys]", "{:.3g}")]


def format_table(rows: Sequence[TuningRow]) -> str:
    cells = [[title for _, title, _ in _COLUMNS]]
    for row in rows:
        data = asdict(row)
        cells.append(["-" if data[name] is None else fmt.format(data[name]) for name, _, fmt in _COLUMNS])
    widths = [max(len(r[i]) for r in cells) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_csv(rows: Sequence[TuningRow], path: str) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[f for f in TuningRow.__dataclass_fields__])
        writer.writeheader()
        for row in rows:
            writer.writerow(asdict(row))


# Series drawn on one panel differ in marker, line style and size (the first largest, hollow), so
# that lines lying on top of each other still show each of their points.
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_STYLES = ("-", "--", "-.", ":")


def _style(i: int, n: int) -> dict:
    return {"marker": _MARKERS[i % len(_MARKERS)], "linestyle": _STYLES[i % len(_STYLES)],
            "markersize": 4 + 2.5 * (n - 1 - i), "markerfacecolor": "none", "markeredgewidth": 1.5,
            "linewidth": 1.5, "color": f"C{i}"}


def coinciding(series: dict, tolerance: float) -> list[list]:
    """Groups (of two or more labels) of series whose values differ by at most ``tolerance`` at
    every point: lines a reader cannot tell apart on the plot."""
    groups = []
    for label, values in series.items():
        for group in groups:
            if np.max(np.abs(np.asarray(series[group[0]]) - np.asarray(values))) <= tolerance:
                group.append(label)
                break
        else:
            groups.append([label])
    return [g for g in groups if len(g) > 1]


def _note(ax, text: str) -> None:
    ax.text(0.03, 0.5, text, transform=ax.transAxes, fontsize=8.5, va="center", wrap=True,
            bbox={"boxstyle": "round", "facecolor": "lightyellow", "edgecolor": "0.6"})


def panel_summary(fig) -> list[dict]:
    """Each axis drawn: label, scale, limits, the finite data points of its lines and bars, and
    the notes written in it (tests: every panel shows data, or says why it does not)."""
    drawn, panels = [], {}
    for ax in fig.get_axes():  # a twin axis is part of the panel it shares a position with
        panels.setdefault(tuple(np.round(ax.get_position().bounds, 6)), []).append(ax)
    for ax in fig.get_axes():
        panel = panels[tuple(np.round(ax.get_position().bounds, 6))]
        points = sum(int(np.sum(np.isfinite(np.asarray(line.get_ydata(), dtype=float))))
                     for line in ax.get_lines())
        points += sum(1 for patch in ax.patches if np.isfinite(patch.get_height()))
        drawn.append({"title": next((a.get_title() for a in panel if a.get_title()), ""),
                      "label": ax.get_ylabel(), "scale": ax.get_yscale(),
                      "limits": tuple(ax.get_ylim()), "points": points,
                      "notes": [t.get_text() for a in panel for t in a.texts]})
    return drawn


def plot_campaign(rows: Sequence[TuningRow], path: str) -> list[dict]:
    """Impressions std and suppression against k (one line per epsilon); clicks against epsilon
    (or rho).

    Returns each y axis drawn (:func:`panel_summary`), so tests can hold the axes honest (shares
    and probabilities over their whole [0, 1] range, linear axes from 0) and check that every
    panel shows its data: lines that coincide get a note saying so, and a panel with a single
    candidate says that too.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    imp = [r for r in rows if r.measure == "impressions"]
    clicks = [r for r in rows if r.measure == "clicks"]
    with_data = any(r.share_suppressed is not None for r in imp)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    epsilons = sorted({r.epsilon for r in imp})
    shares = {}
    for i, epsilon in enumerate(epsilons):
        series = sorted((r for r in imp if r.epsilon == epsilon), key=lambda r: r.k)
        ks = [r.k for r in series]
        label = f"epsilon={epsilon:g}"
        axes[0].plot(ks, [r.std for r in series], label=label, **_style(i, len(epsilons)))
        shares[label] = [r.share_suppressed if with_data else r.spurious_rate for r in series]
        axes[1].plot(ks, shares[label], label=label, **_style(i, len(epsilons)))
    # Noise std spans orders of magnitude over k and epsilon: a labelled log axis over the whole
    # range (it cannot start at 0); the shares below use their whole [0, 1] range.
    axes[0].set(xlabel="k (impressions protected)", ylabel="noise std (log scale)",
                title="impressions: noise std", xscale="log", yscale="log")
    axes[1].set(xlabel="k (impressions protected)",
                ylabel="share of keys suppressed" if with_data else "P(empty key released)",
                title="impressions: " + ("suppressed keys" if with_data else "spurious releases"),
                xscale="log")
    if not with_data:  # probabilities down to 1e-6 on a symlog axis, still from 0 to 1
        axes[1].set_yscale("symlog", linthresh=1e-6)
        axes[1].set_ylabel("P(empty key released) (symlog scale)")
    # a share or a probability: the whole [0, 1] range, so a small difference does not look large
    axes[1].set_ylim(0, 1.02)
    tolerance = 0.01 if with_data else 1e-6
    for group in coinciding(shares, tolerance):
        names = "epsilon=" + ", ".join(label.split("=", 1)[1] for label in group)
        _note(axes[1], f"{names}: the lines coincide (within {tolerance:g}).\n" + (
            "Every epsilon suppresses the same keys: their true\nvalues lie far from the "
            "threshold, on either side." if with_data else
            "At every epsilon an empty key is as unlikely\nto be released: the threshold is far "
            "above the noise."))
    for ax in axes[:2]:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="upper left" if ax is axes[0] else "best", fontsize=8)
    if clicks:
        zcdp = clicks[0].rho is not None
        x = [r.rho if zcdp else r.epsilon for r in clicks]
        axes[2].plot(x, [r.std for r in clicks], label="noise std", **_style(0, 2))
        axes[2].set(xlabel="rho" if zcdp else "epsilon", ylabel="noise std",
                    title=f"clicks ({clicks[0].noise}, sensitivity {clicks[0].sensitivity:g})")
        twin = axes[2].twinx()
        known = clicks[0].share_suppressed is not None
        share = [r.share_suppressed if known else r.spurious_rate for r in clicks]
        twin.plot(x, share, label="suppressed" if known else "P(spurious)",
                  **dict(_style(1, 2), color="C4"))
        twin.set_ylabel("share of keys suppressed" if known else "P(empty key released)")
        twin.set_ylim(0, 1.02)  # a share or a probability: its whole range
        axes[2].set_ylim(bottom=0)  # noise std from zero: no zoomed-in axis
        axes[2].grid(True, alpha=0.3)
        lines = axes[2].get_legend_handles_labels()
        more = twin.get_legend_handles_labels()
        axes[2].legend(lines[0] + more[0], lines[1] + more[1], fontsize=8)
        if len(set(x)) == 1:
            _note(axes[2], f"one candidate ({'rho' if zcdp else 'epsilon'}={x[0]:g}):\n"
                           f"give --{'rho' if zcdp else 'epsilon'} with several values to compare")
    else:
        axes[2].set_axis_off()
        _note(axes[2], "no clicks rows: nothing to compare")
    fig.suptitle(f"Choosing k and epsilon: campaign {rows[0].campaign_id} ({rows[0].keys} keys)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    drawn = panel_summary(fig)
    plt.close(fig)
    return drawn


def _numbers(text: str, cast, name: str) -> list:
    try:
        values = [cast(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--{name} must be a comma-separated list, got {text!r}")
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"--{name} values must be positive, got {text!r}")
    return values


def run(config_path: str, out_dir: str, ks: Sequence[int], epsilons: Sequence[float], *,
        rhos: Optional[Sequence[float]] = None, impressions_path: Optional[str] = None,
        clicks_path: Optional[str] = None, campaign_ids: Optional[Sequence[str]] = None,
        spurious: Optional[float] = None, plots: bool = True) -> dict:
    config = load_config(config_path)
    campaigns = config.campaigns if not campaign_ids else [config.campaign(c) for c in campaign_ids]
    impressions = None if impressions_path is None else read_tables(impressions_path)
    clicks = None if clicks_path is None else read_tables(clicks_path)
    os.makedirs(out_dir, exist_ok=True)
    truth = true_values_by_campaign(campaigns, impressions, clicks)
    rows, pngs = [], []
    for campaign in campaigns:
        true_impressions, true_clicks = truth[campaign.campaign_id]
        campaign_rows = tune_campaign(campaign, ks, epsilons, rhos=rhos, true_impressions=true_impressions,
                                      true_clicks=true_clicks, spurious=spurious)
        rows.extend(campaign_rows)
        if plots:
            png = os.path.join(out_dir, f"tuning_{campaign.campaign_id}.png")
            plot_campaign(campaign_rows, png)
            pngs.append(png)
    text = format_table(rows)
    with open(os.path.join(out_dir, "tuning.txt"), "w") as handle:
        handle.write(text + "\n")
    write_csv(rows, os.path.join(out_dir, "tuning.csv"))
    return {"rows": rows, "text": text, "csv": os.path.join(out_dir, "tuning.csv"),
            "txt": os.path.join(out_dir, "tuning.txt"), "png": pngs}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.centralnotice.tuning",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="campaign configuration (JSON, local or gs://)")
    parser.add_argument("--impressions", help="historic/synthetic impressions (Parquet or CSV): "
                                              "paths, globs or folders, comma-separated")
    parser.add_argument("--clicks", help="historic/synthetic clicks (Parquet or CSV): paths, "
                                         "globs or folders, comma-separated")
    parser.add_argument("--k", required=True, type=lambda t: _numbers(t, int, "k"),
                        help="candidate k values, e.g. 10,50,100")
    parser.add_argument("--epsilon", required=True, type=lambda t: _numbers(t, float, "epsilon"),
                        help="candidate epsilons, e.g. 0.5,1,2")
    parser.add_argument("--rho", type=lambda t: _numbers(t, float, "rho"),
                        help="candidate rhos for zCDP clicks (default: the configured rho and "
                             "1/4, 1/2, 2 and 4 times it)")
    parser.add_argument("--campaign", action="append", help="campaign id (repeatable; default all)")
    parser.add_argument("--spurious-rate", type=float,
                        help="derive each threshold from this P(empty key released) instead of "
                             "the configured release_threshold")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--out", required=True, help="output directory")
    args = parser.parse_args(argv)
    result = run(args.config, args.out, args.k, args.epsilon, rhos=args.rho,
                 impressions_path=args.impressions, clicks_path=args.clicks,
                 campaign_ids=args.campaign, spurious=args.spurious_rate, plots=not args.no_plot)
    print(result["text"])
    print(f"\nwrote {result['txt']}, {result['csv']}" + "".join(f", {p}" for p in result["png"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
