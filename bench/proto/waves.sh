#!/bin/bash
# bench/proto/waves.sh: the storage scenario's waves, alone, with a look at
# the claim after each (issue 26, "A drain that does not wait for vacuum").
# Not part of bench/run.sh.  As root:
#
#   GK_PG_BIN=/work/pgcopy/NAME/usr/lib/postgresql/15/bin WAVES=6 N=300000 \
#       bash bench/proto/waves.sh [DIR]
#
# starts a throwaway cluster (bench/lib.sh's settings, gatekeeper.workers =
# WORKERS, default 0: external claimers only) in DIR (default a new
# temporary directory), loads WAVES waves of N 1 kB mails, each by one
# INSERT ... SELECT and drained by 4 pgbench clients looping
# bench/sql/drain.sql at batch 1000, and prints each wave's rate.  With
# EXPLAIN=1, before each wave's drain it prints the EXPLAIN (ANALYZE,
# BUFFERS) of the claim statement (src/claim.c, claim_sql, rolled back),
# mail_live's dead tuples and mail_due's size.  VACUUM=1 vacuums mail_live
# after each wave, outside the timing; NOAUTOVAC=1 turns autovacuum off
# for mail_live, so the waves show what the claims pay without it.
# HOLD=1 keeps a REPEATABLE READ transaction open from before the first
# wave to the end (what a long pg_dump or report query does): no row a
# claim deletes is dead to every transaction while it runs.  CLAIMERS
# (default 4) pgbench clients drain.  LOAD=direct loads each wave as the
# drain scenario does (bench_load: mail_live rows written by the loader,
# the triggers off) instead of by INSERT ... SELECT, whose mail waits in
# runs of mail_run that the claims move to live rows.  STATS=1 prints after each wave what
# the drain read: per index of the mail tables the entries returned
# (idx_tup_read) and index scans, per table the heap fetches of index scans
# (idx_tup_fetch) and dead rows.  The cluster is stopped and removed at
# exit unless KEEP=1.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${GK_PG_BIN:?GK_PG_BIN must name a PostgreSQL bin directory}
WAVES=${WAVES:-6}; N=${N:-300000}; WORKERS=${WORKERS:-0}
CLAIMERS=${CLAIMERS:-4}; STATS=${STATS:-0}
EXPLAIN=${EXPLAIN:-0}; LOAD=${LOAD:-insert}; VACUUM=${VACUUM:-0}; KEEP=${KEEP:-0}; NOAUTOVAC=${NOAUTOVAC:-0}; HOLD=${HOLD:-0}
HOLD_PID=
DIR=${1:-$(mktemp -d /tmp/gkwaves.XXXXXX)}
mkdir -p "$DIR"; chown postgres: "$DIR"
PORT=$((20000 + RANDOM % 20000))
as_pg() { runuser -u postgres -- env PATH="$BIN:$PATH" "$@"; }
P() { as_pg psql -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres -d bench "$@"; }
stop() {
	[ -z "$HOLD_PID" ] || kill "$HOLD_PID" 2>/dev/null || true
	as_pg pg_ctl -D "$DIR/data" -m fast -w stop >/dev/null 2>&1 || true
	[ "$KEEP" = 1 ] || rm -rf "$DIR"
}
trap stop EXIT
as_pg initdb -D "$DIR/data" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 >/dev/null
cat >>"$DIR/data/postgresql.conf" <<EOC
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$DIR'
max_connections = 50
shared_buffers = '${BK_SHARED_BUFFERS:-2GB}'
maintenance_work_mem = '512MB'
max_wal_size = '8GB'
min_wal_size = '1GB'
checkpoint_timeout = '30min'
shared_preload_libraries = 'gatekeeper'
gatekeeper.gate_memory = '1GB'
gatekeeper.database = 'bench'
gatekeeper.workers = $WORKERS
log_autovacuum_min_duration = 0
EOC
as_pg pg_ctl -D "$DIR/data" -l "$DIR/server.log" -w start >/dev/null
as_pg psql -X -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -c "CREATE DATABASE bench"
P -c "CREATE EXTENSION gatekeeper" -f "$HERE/../sql/setup.sql" >/dev/null
P -c "SELECT gatekeeper.alter_queue('bench', background => false)" \
  -c "SELECT gatekeeper.pause(name) FROM gatekeeper.queue WHERE name <> 'bench' AND NOT paused" >/dev/null
[ "$NOAUTOVAC" = 0 ] || P -c "ALTER TABLE gatekeeper.mail_live SET (autovacuum_enabled = off)"
P -c "VACUUM ANALYZE gatekeeper.mail, gatekeeper.mail_live, gatekeeper.mail_done" -c CHECKPOINT
# the claim statement of src/claim.c with its parameters filled in
claim=$(sed -n '/^static const char claim_sql\[\] =/,/;$/p' "$HERE/../../src/mail/claim.c" |
	sed '1d; s/^"//; s/" *$//; s/";$//' | tr -d '\n' |
	sed 's/" CLAIM_EXPIRED "/m.send_by < now()/g' |
	sed "s/\" CLAIM_MESSAGE_ID \"/coalesce(l.message_id, '<' || l.id || '@x>')/g" |
	sed "s/\\\$1/'bench'/g; s/\\\$2/1000/g; s/\\\$4/'w'/g; s/\\\$[789]/NULL/g")
if [ "$HOLD" = 1 ]; then
	# one transaction, ended when the cluster stops (or after an hour)
	P -c "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM gatekeeper.mail_live; SELECT pg_sleep(3600)" >/dev/null 2>&1 &
	HOLD_PID=$!
	sleep 1
fi
rates=
for w in $(seq 1 "$WAVES"); do
	if [ "$LOAD" = direct ]; then
		P -c "CALL bench_load($N, 's${w}_', 'bench', interval '0')"
	else
		P -c "INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
			  SELECT * FROM bench_rows($N, 's${w}_', 'bench', interval '0')"
	fi
	if [ "$EXPLAIN" = 1 ]; then
		echo "== before wave $w: $(P -c "SELECT format('mail_live n_dead_tup %s n_live_tup %s, heap %s, mail_due %s (%s pages), vacuums %s+%s',
			n_dead_tup, n_live_tup, pg_size_pretty(pg_relation_size('gatekeeper.mail_live')),
			pg_size_pretty(pg_relation_size('gatekeeper.mail_due')),
			pg_relation_size('gatekeeper.mail_due') / 8192, vacuum_count, autovacuum_count)
			FROM pg_stat_user_tables WHERE relid = 'gatekeeper.mail_live'::regclass")"
		P -c "SET enable_indexonlyscan = off" -c "BEGIN" -c "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) $claim" -c "ROLLBACK" |
			grep -E 'Buffers|Execution' | sed -n '1p;$p'
	fi
	P -c CHECKPOINT
	[ "$STATS" = 0 ] || P -c "SELECT pg_stat_reset()" >/dev/null
	t0=$(date +%s.%N)
	as_pg pgbench -n -M prepared -h 127.0.0.1 -p "$PORT" -U postgres -f "$HERE/../sql/drain.sql" -D batch=1000 \
		-c "$CLAIMERS" -j 2 -t $((N / 1000 / CLAIMERS)) bench >"$DIR/pgbench.$w.log" 2>&1 || { cat "$DIR/pgbench.$w.log"; exit 1; }
	t1=$(date +%s.%N)
	left=$(P -c "SELECT (SELECT count(*) FROM gatekeeper.mail_live) + (SELECT coalesce(sum(open), 0) FROM gatekeeper.mail_claim)")
	rate=$(echo "$N / ($t1 - $t0)" | bc)
	echo "wave $w: $rate mails/s (left $left)"
	rates="$rates $rate"
	if [ "$STATS" = 1 ]; then
		sleep 0.6	# the backends' statistics are flushed at most every 500 ms
		P -c "SELECT format('  %-22s scans %8s read %10s fetched %10s', indexrelname, idx_scan, idx_tup_read, idx_tup_fetch)
				FROM pg_stat_user_indexes WHERE schemaname = 'gatekeeper' AND (idx_scan > 0 OR idx_tup_read > 0) ORDER BY idx_tup_read DESC LIMIT 8"
		P -c "SELECT format('  %-22s heap fetches by index %10s, dead %8s, hot upd %8s, upd %8s, del %8s', relname, idx_tup_fetch, n_dead_tup, n_tup_hot_upd, n_tup_upd, n_tup_del)
				FROM pg_stat_user_tables WHERE schemaname = 'gatekeeper' AND (idx_tup_fetch > 0 OR n_tup_upd + n_tup_del > 0) ORDER BY idx_tup_fetch DESC LIMIT 8"
	fi
	[ "$VACUUM" = 0 ] || P -c "VACUUM gatekeeper.mail_live"
done
first=${rates# }; first=${first%% *}
echo "waves:$rates; last/first $(echo "scale=2; $rate / $first" | bc)"
echo "after: $(P -c "SELECT format('mail_live n_dead_tup %s, %s with indexes, vacuums %s+%s', n_dead_tup,
	pg_size_pretty(pg_total_relation_size('gatekeeper.mail_live')), vacuum_count, autovacuum_count)
	FROM pg_stat_user_tables WHERE relid = 'gatekeeper.mail_live'::regclass")"
