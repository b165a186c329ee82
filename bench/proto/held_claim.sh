#!/bin/bash
# bench/proto/held_claim.sh: what one claim(1000) costs after WAVES waves of
# N mails were drained under a held REPEATABLE READ snapshot (issue 46,
# item 4).  Not part of bench/run.sh.  As root:
#
#   GK_PG_BIN=/work/pg-NAME/usr/lib/postgresql/15/bin WAVES=4 N=100000 \
#       bash bench/proto/held_claim.sh
#
# starts a throwaway cluster (bench/lib.sh's settings, no worker), holds the
# snapshot, enqueues and drains the waves (claim(1000) + ack_batch), then
# enqueues one more wave and times CLAIMS (default 30) claim(1000) calls in
# one session, each rolled back (so each finds the same entries), by
# clock_timestamp() around the call: prints their median and the
# mail_run_due entries the last one read.  The cluster is removed at exit.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${GK_PG_BIN:?GK_PG_BIN must name a PostgreSQL bin directory}
WAVES=${WAVES:-4}; N=${N:-100000}; CLAIMS=${CLAIMS:-30}
DIR=$(mktemp -d /tmp/gkheld.XXXXXX)
chown postgres: "$DIR"
PORT=$((20000 + RANDOM % 20000))
HOLD_PID=
as_pg() { runuser -u postgres -- env PATH="$BIN:$PATH" "$@"; }
P() { as_pg psql -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres -d bench "$@"; }
stop() {
	[ -z "$HOLD_PID" ] || kill "$HOLD_PID" 2>/dev/null || true
	as_pg pg_ctl -D "$DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
	rm -rf "$DIR"
}
trap stop EXIT
as_pg initdb -D "$DIR/data" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 >/dev/null
cat >>"$DIR/data/postgresql.conf" <<EOC
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$DIR'
shared_buffers = '${BK_SHARED_BUFFERS:-2GB}'
max_wal_size = '8GB'
checkpoint_timeout = '30min'
shared_preload_libraries = 'gatekeeper'
gatekeeper.workers = 0
EOC
as_pg pg_ctl -D "$DIR/data" -l "$DIR/server.log" -w start >/dev/null
as_pg psql -X -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -c "CREATE DATABASE bench"
P -c "CREATE EXTENSION gatekeeper" -f "$HERE/../sql/setup.sql" >/dev/null
P -c "SELECT gatekeeper.pause(name) FROM gatekeeper.queue WHERE name <> 'bench' AND NOT paused" >/dev/null
P -c "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1 FROM gatekeeper.mail LIMIT 1; SELECT pg_sleep(3600)" >/dev/null 2>&1 &
HOLD_PID=$!
sleep 1
for w in $(seq 1 "$WAVES"); do
	P -c "INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
		  SELECT * FROM bench_rows($N, 'w${w}_', 'bench', interval '0')"
	as_pg pgbench -n -M prepared -h 127.0.0.1 -p "$PORT" -U postgres -f "$HERE/../sql/drain.sql" -D batch=1000 \
		-c 2 -j 2 -t $((N / 1000 / 2)) bench >/dev/null 2>&1
done
P -c "INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
	  SELECT * FROM bench_rows($N, 'last_', 'bench', interval '0')"
P -c "SELECT gatekeeper.ack_batch(array_agg(id), array_agg(attempt)) FROM gatekeeper.claim('bench', 1000)" >/dev/null
P <<EOS
CREATE TEMP TABLE t (ms float8);
$(for i in $(seq 1 "$CLAIMS"); do
	echo "SELECT pg_stat_force_next_flush() \\g /dev/null"
	echo "BEGIN; SELECT clock_timestamp() AS t0 \\gset"
	echo "SELECT count(*) FROM gatekeeper.claim('bench', 1000) \\g /dev/null"
	echo "SELECT extract(epoch FROM clock_timestamp() - :'t0'::timestamptz) * 1000 AS ms \\gset"
	echo "SELECT pg_stat_get_xact_tuples_returned('gatekeeper.mail_run_due'::regclass) AS read \\gset"
	echo "ROLLBACK;"
	echo "INSERT INTO t VALUES (:ms);"
done)
SELECT format('claim(1000), %s calls rolled back: median %s ms (min %s), mail_run_due entries read by the last %s',
	count(*), round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 2),
	round(min(ms)::numeric, 2), :read) FROM t;
EOS
echo "load average $(cut -d' ' -f1-3 /proc/loadavg)"
