#!/usr/bin/env bash
# bench/worker_cpu.sh: the background worker's CPU time per delivered mail
# (issue 26's target: below 50 us), as root:
#
#   GK_PG_BIN=/usr/lib/postgresql/15/bin bash bench/worker_cpu.sh [MAILS] [RUNS]
#
# With the gatekeeper installed in GK_PG_BIN's PostgreSQL: a throwaway
# cluster (as postgres, in a fresh temporary directory, Unix socket only)
# with one worker and 16 connections to Postfix's smtp-sink on a free
# loopback port; each run commits MAILS (default 20,000) due mails of
# 700-byte bodies into a paused queue, resumes it, waits until every mail
# is recorded sent, and prints the worker's utime + stime
# (/proc/<pid>/stat) over the run divided by MAILS: everything the worker
# process did for them (claim, message building, SMTP, recording; the
# claim and the ack run in the worker itself).  Bounded: each run waits at
# most 120 s; everything started is stopped on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
. "$ROOT/scripts/lib.sh"

N=${1:-20000}
RUNS=${2:-3}
WORK=$(mktemp -d /tmp/gk-worker-cpu.XXXXXX)
SINK_PID=
cleanup() {
	[ -n "$SINK_PID" ] && kill "$SINK_PID" 2>/dev/null || true
	runuser -u postgres -- "$GK_PG_BIN/pg_ctl" -D "$WORK/data" -m immediate stop >/dev/null 2>&1 || true
	rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

SPORT=$(gk_free_port)
mkdir -p "$WORK/sink"
chown -R postgres "$WORK"
chmod 755 "$WORK"
runuser -u postgres -- "$GK_PG_BIN/initdb" -D "$WORK/data" --no-locale -E UTF8 >/dev/null
cat >>"$WORK/data/postgresql.conf" <<EOF
listen_addresses = ''
unix_socket_directories = '$WORK'
shared_preload_libraries = 'gatekeeper'
gatekeeper.database = 'postgres'
gatekeeper.smtp_url = 'smtp://127.0.0.1:$SPORT'
gatekeeper.smtp_connections = 16
gatekeeper.default_sender = 'bench@example.com'
EOF
(cd "$WORK/sink" && exec runuser -u postgres -- timeout 3600 /usr/sbin/smtp-sink -c -m 64 "127.0.0.1:$SPORT" 256 >/dev/null 2>&1) &
SINK_PID=$!
runuser -u postgres -- "$GK_PG_BIN/pg_ctl" -D "$WORK/data" -l "$WORK/log" -w start >/dev/null

sql() { runuser -u postgres -- "$GK_PG_BIN/psql" -X -q -At -h "$WORK" -d postgres -c "$1"; }

sql "CREATE EXTENSION gatekeeper"
PID=
for _ in $(seq 1 100); do
	PID=$(sql "SELECT pid FROM pg_stat_activity WHERE backend_type LIKE 'gatekeeper%' LIMIT 1")
	[ -n "$PID" ] && break
	sleep 0.1
done
[ -n "$PID" ] || gk_die "no gatekeeper worker started"
cpu_us() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%d\n", ($14 + $15) * 1000000 / hz }' "/proc/$PID/stat"; }

for run in $(seq 1 "$RUNS"); do
	sql "SELECT gatekeeper.pause('default')" >/dev/null
	sql "INSERT INTO gatekeeper.mail (recipient, subject, body)
		 SELECT 'r${run}_' || i || '@example.com', 'Subject line ' || i, repeat('x', 700)
		   FROM generate_series(1, $N) i"
	c0=$(cpu_us)
	t0=$(date +%s.%N)
	sql "SELECT gatekeeper.resume('default')" >/dev/null
	left=$N
	for _ in $(seq 1 1200); do
		left=$(sql "SELECT count(*) FROM gatekeeper.mail_status WHERE state <> 'sent'")
		[ "$left" = 0 ] && break
		sleep 0.1
	done
	c1=$(cpu_us)
	t1=$(date +%s.%N)
	[ "$left" = 0 ] || gk_die "run $run: $left mails not sent after 120 s"
	perl -e 'printf "run %d: %d mails, %.1f us worker CPU per mail, %.0f mails/s until all recorded\n",
		$ARGV[0], $ARGV[1], ($ARGV[3] - $ARGV[2]) / $ARGV[1], $ARGV[1] / ($ARGV[5] - $ARGV[4])' \
		"$run" "$N" "$c0" "$c1" "$t0" "$t1"
done
