#!/bin/bash
# bench/proto/copy_rounds.sh: bulk enqueue rounds, COPY into gatekeeper.mail
# against pgmq's send_batch, alternated, with variants (issue 46, item 5).
# Not part of bench/run.sh.  As root:
#
#   GK_PG_BIN=/work/pg-NAME/usr/lib/postgresql/15/bin BK_PGMQ_SQL=/path/pgmq.sql \
#       ROUNDS=3 VARIANTS="base wm256" bash bench/proto/copy_rounds.sh
#
# starts a throwaway cluster (bench/lib.sh's settings), makes N (default
# 200,000) rows of the enqueue scenario's shape into a CSV file, and runs
# ROUNDS rounds; each round runs pgmq.send_batch() of the rows and, for each
# variant, a COPY of them into gatekeeper.mail, the order turned around
# every round, each from empty tables after a CHECKPOINT.  Variants:
#   base       the COPY as a user runs it
#   wm256      the COPY with work_mem = 256MB in its session (the insert
#              trigger's transition table stays in memory)
#   noinsvac   the COPY with autovacuum_vacuum_insert_threshold = -1 on
#              gatekeeper.mail's partitions (no vacuum after inserts)
# For every measurement: rows/s and the vacuums and analyzes that ran
# meanwhile.  The cluster is removed at exit.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${GK_PG_BIN:?GK_PG_BIN must name a PostgreSQL bin directory}
PGMQ=${BK_PGMQ_SQL:?BK_PGMQ_SQL must name the pgmq SQL install file}
ROUNDS=${ROUNDS:-3}; N=${N:-200000}; VARIANTS=${VARIANTS:-base}
DIR=$(mktemp -d /tmp/gkcopy.XXXXXX)
chown postgres: "$DIR"
PORT=$((20000 + RANDOM % 20000))
as_pg() { runuser -u postgres -- env PATH="$BIN:$PATH" "$@"; }
P() { as_pg psql -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres -d bench "$@"; }
stop() {
	as_pg pg_ctl -D "$DIR/data" -m fast -w stop >/dev/null 2>&1 || true
	rm -rf "$DIR"
}
trap stop EXIT
as_pg initdb -D "$DIR/data" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 >/dev/null
cat >>"$DIR/data/postgresql.conf" <<EOC
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$DIR'
shared_buffers = '${BK_SHARED_BUFFERS:-2GB}'
maintenance_work_mem = '512MB'
max_wal_size = '8GB'
min_wal_size = '1GB'
checkpoint_timeout = '30min'
shared_preload_libraries = 'gatekeeper'
log_autovacuum_min_duration = 0
EOC
as_pg pg_ctl -D "$DIR/data" -l "$DIR/server.log" -w start >/dev/null
as_pg psql -X -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -c "CREATE DATABASE bench"
P -c "CREATE EXTENSION gatekeeper" -f "$HERE/../sql/setup.sql" >/dev/null
sed -e '/^\\echo .*\\quit/d' -e 's/@extschema@/pgmq/g' "$PGMQ" | P -f - >/dev/null
P -c "SELECT pgmq.create('bench_e')" >/dev/null
P -c "CREATE TABLE bench_bulk AS
		SELECT 'bench'::text AS queue, 'e' || i || '@example.com' AS recipient,
			   rpad('Subject ' || i, 25, '.') AS subject, left(bench_body(i), 500) AS body
		  FROM generate_series(1, $N) AS i" -c "VACUUM ANALYZE bench_bulk"
P -c "COPY bench_bulk TO '$DIR/rows.csv' (FORMAT csv)"

# one measurement: LABEL SQL [SESSION-SETTING]; prints rows/s and what ran meanwhile
measure() {
	local label=$1 sql=$2 set=${3:-} t0 t1
	P -c "TRUNCATE gatekeeper.mail, pgmq.q_bench_e RESTART IDENTITY" -c CHECKPOINT >/dev/null
	t0=$(date +%s.%N)
	P -c "${set:-SELECT 1}" -c "$sql" >/dev/null
	t1=$(date +%s.%N)
	printf '  %-9s %8.0f rows/s  meanwhile: %s\n' "$label" "$(echo "$N / ($t1 - $t0)" | bc -l)" \
		"$(P -c "SELECT coalesce(string_agg(relname || CASE WHEN last_autovacuum >= to_timestamp($t0) THEN ' autovacuum' ELSE ' autoanalyze' END, ', '), '-')
				  FROM pg_stat_user_tables WHERE last_autovacuum >= to_timestamp($t0) OR last_autoanalyze >= to_timestamp($t0)")"
}
copy="COPY gatekeeper.mail (queue, recipient, subject, body) FROM '$DIR/rows.csv' (FORMAT csv)"
send="SELECT count(*) FROM pgmq.send_batch('bench_e', ARRAY(
		SELECT jsonb_build_object('recipient', recipient, 'subject', subject, 'body', body) FROM bench_bulk))"
insvac() {
	local v=$1 p
	for p in $(P -c "SELECT relid::regclass FROM pg_partition_tree('gatekeeper.mail') WHERE isleaf"); do
		if [ "$v" = off ]; then
			P -c "ALTER TABLE $p SET (autovacuum_vacuum_insert_threshold = -1)"
		else
			P -c "ALTER TABLE $p RESET (autovacuum_vacuum_insert_threshold)"
		fi
	done
}
for r in $(seq 1 "$ROUNDS"); do
	echo "round $r (load average $(cut -d' ' -f1-3 /proc/loadavg))"
	order="pgmq $VARIANTS"
	[ $((r % 2)) = 1 ] || order="$VARIANTS pgmq"
	for v in $order; do
		case $v in
		pgmq) measure pgmq "$send" ;;
		base) measure base "$copy" ;;
		wm256) measure wm256 "$copy" "SET work_mem = '256MB'" ;;
		noinsvac) insvac off; measure noinsvac "$copy"; insvac on ;;
		esac
	done
done
