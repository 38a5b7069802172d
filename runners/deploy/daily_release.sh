#!/usr/bin/env bash
# Daily CentralNotice release for every campaign, for cron (see runners/deploy/cron.example).
#
#   runners/deploy/daily_release.sh [YYYY-MM-DD]     # default: yesterday (UTC), the day the
#                                                    # Airflow DAG's 02:30 run releases too
#
# One `python -m pipelines.centralnotice` run per campaign, release id "<campaign>/<date>" (the
# campaigns' schedule must be daily): the
# budget ledger charges each release once, so re-running a day (after a failure) reproduces the
# same release instead of spending budget again. Configuration by environment, as for the Airflow
# DAG (runners/deploy/airflow_dag.py):
#   BEAM_DP_CAMPAIGNS (comma-separated, required), BEAM_DP_DATA, BEAM_DP_OUTPUT, BEAM_DP_CONFIG,
#   BEAM_DP_LEDGER, BEAM_DP_KEY_STORE, BEAM_DP_RUNNER (default DirectRunner),
#   BEAM_DP_RUNNER_ARGS (extra Beam options, e.g. "--flink_master=host:8081"),
#   BEAM_DP_PYTHON (interpreter with this project installed; default: python3),
#   BEAM_DP_DRY_RUN=1 prints the commands instead of running them.
set -euo pipefail

day="${1:-$(date -u -d yesterday +%F)}"
if ! [[ "$day" =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}$ ]]; then
  echo "daily_release.sh: date must be YYYY-MM-DD, got '$day'" >&2
  exit 2
fi
: "${BEAM_DP_CAMPAIGNS:?set BEAM_DP_CAMPAIGNS to the comma-separated campaign ids}"
data="${BEAM_DP_DATA:-/srv/centralnotice/input}"
output="${BEAM_DP_OUTPUT:-/srv/centralnotice/releases}"
config="${BEAM_DP_CONFIG:-/srv/centralnotice/campaigns.json}"
ledger="${BEAM_DP_LEDGER:-/srv/centralnotice/ledger.json}"
key_store="${BEAM_DP_KEY_STORE:-/srv/centralnotice/keys}"
runner="${BEAM_DP_RUNNER:-DirectRunner}"
python="${BEAM_DP_PYTHON:-python3}"
read -r -a runner_args <<< "${BEAM_DP_RUNNER_ARGS:-}"

# One day at a time: a slow run must not overlap the next day's.
if [[ -z "${BEAM_DP_DRY_RUN:-}" ]]; then
  exec 9>"${TMPDIR:-/tmp}/beam-dp-daily-release.lock"
  flock -n 9 || { echo "daily_release.sh: another release is running" >&2; exit 1; }
fi

status=0
IFS=',' read -r -a campaigns <<< "$BEAM_DP_CAMPAIGNS"
for campaign in "${campaigns[@]}"; do
  campaign="${campaign// /}"
  [[ -n "$campaign" ]] || continue
  cmd=("$python" -m pipelines.centralnotice
       --config="$config" --release="$campaign/$day"
       --impressions="$data/$day/impressions/" --clicks="$data/$day/clicks/"
       --output="$output" --ledger="$ledger" --key_store="$key_store"
       --runner="$runner" "${runner_args[@]}")
  if [[ -n "${BEAM_DP_DRY_RUN:-}" ]]; then
    printf '%q ' "${cmd[@]}"; echo
    continue
  fi
  echo "$(date -u +%FT%TZ) release $campaign/$day on $runner"
  # A failed campaign does not stop the others; the exit status reports it.
  "${cmd[@]}" || { echo "$(date -u +%FT%TZ) FAILED $campaign/$day" >&2; status=1; }
done
exit "$status"
