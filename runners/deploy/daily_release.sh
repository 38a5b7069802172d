#!/usr/bin/env bash
# The daily CentralNotice run for cron (see runners/deploy/cron.example): whatever each
# campaign's own schedule has due on the day, then `python -m pipelines.catalog --check`.
#
#   runners/deploy/daily_release.sh SCHEDULE_FILE [YYYY-MM-DD]   # default day: yesterday (UTC),
#                                                                # the day the Airflow DAG's
#                                                                # 02:30 run releases too
#
# SCHEDULE_FILE is the schedule file the Airflow DAG reads too (runners/deploy/schedule.py
# documents it); runners.deploy.schedule decides what is due (a daily release on its day, a
# multi-day or whole-campaign release on its last day) and builds every command. The budget
# ledger charges each release once, so re-running a day reproduces it instead of spending again.
#   BEAM_DP_PYTHON   the interpreter with this project installed (default: python3)
#   BEAM_DP_DRY_RUN=1 prints the commands instead of running them.
set -euo pipefail

schedule="${1:?usage: daily_release.sh SCHEDULE_FILE [YYYY-MM-DD]}"
day="${2:-$(date -u -d yesterday +%F)}"
python="${BEAM_DP_PYTHON:-python3}"

if [[ -n "${BEAM_DP_DRY_RUN:-}" ]]; then
  exec "$python" -m runners.deploy.schedule --schedule="$schedule" --day="$day" --dry_run
fi
# One day at a time: a slow run must not overlap the next day's.
exec 9>"${TMPDIR:-/tmp}/beam-dp-daily-release.lock"
flock -n 9 || { echo "daily_release.sh: another release is running" >&2; exit 2; }
echo "$(date -u +%FT%TZ) daily release of $day ($schedule)"
"$python" -m runners.deploy.schedule --schedule="$schedule" --day="$day"
