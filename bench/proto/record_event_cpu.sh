#!/bin/bash
# bench/proto/record_event_cpu.sh: the backend CPU that 50,000
# record_event() calls cost (issue 27, "record_event at 10,000/s").  Not
# part of bench/run.sh.  As root:
#
#   GK_PG_BIN=/work/pgcopy/NAME/usr/lib/postgresql/15/bin ROUNDS=3 \
#       bash bench/proto/record_event_cpu.sh
#
# starts a throwaway cluster in a new temporary directory, and in each
# round loads 50,000 mails as sent (bench/sql/setup.sql's bench_load, the
# reports scenario's Message-IDs), then runs the scenario's statement
# (one record_event() per mail, a webhook's 'delivered') in one backend and
# prints the user+system CPU that backend spent on it (/proc/PID/stat).
# CPU seconds move much less with the machine's load than wall-clock rates
# do.  With PERF=FILE the last round's statement runs under
# `perf record -g` into FILE.  The cluster is stopped and removed at exit.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${GK_PG_BIN:?GK_PG_BIN must name a PostgreSQL bin directory}
ROUNDS=${ROUNDS:-3}; N=${N:-50000}; PERF=${PERF:-}
DIR=$(mktemp -d /tmp/gkevcpu.XXXXXX)
chown postgres: "$DIR"; chmod 755 "$DIR"
PORT=$((20000 + RANDOM % 20000))
as_pg() { runuser -u postgres -- env PATH="$BIN:$PATH" "$@"; }
P() { as_pg psql -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres -d bench "$@"; }
stop() {
	as_pg pg_ctl -D "$DIR/data" -m fast stop >/dev/null 2>&1 || true
	rm -rf "$DIR"
}
trap stop EXIT
as_pg initdb -D "$DIR/data" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 >/dev/null
cat >>"$DIR/data/postgresql.conf" <<EOC
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$DIR'
shared_buffers = '512MB'
max_wal_size = '4GB'
shared_preload_libraries = 'gatekeeper'
gatekeeper.gate_memory = '64MB'
EOC
as_pg pg_ctl -D "$DIR/data" -l "$DIR/log" -w start >/dev/null
as_pg psql -X -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -c "CREATE DATABASE bench"
P -c "CREATE EXTENSION gatekeeper" -f "$HERE/../sql/setup.sql" -f "$HERE/../sql/reports.sql" >/dev/null
for round in $(seq 1 "$ROUNDS"); do
	P -c "TRUNCATE gatekeeper.mail, gatekeeper.mail_live, gatekeeper.mail_claim, gatekeeper.mail_key,
				   gatekeeper.mail_done, gatekeeper.event_log, gatekeeper.suppression_list RESTART IDENTITY" \
	  -c "CALL bench_load($N, 'ev', 'bench', interval '0', 'sent')" \
	  -c "UPDATE gatekeeper.mail_done SET message_id = '<' || id || '.5f3a9c@example.com>'" \
	  -c "VACUUM ANALYZE gatekeeper.mail_done" -c "CHECKPOINT" >/dev/null
	# the backend's pid first, then a second's pause for perf to attach
	P <<-EOS >"$DIR/out" &
		SELECT pg_backend_pid() AS pid \gset
		\setenv BPID :pid
		\! echo \$BPID > $DIR/pid; awk '{print \$14 + \$15}' /proc/\$BPID/stat > $DIR/t0
		SELECT pg_sleep(1);
		SELECT count(gatekeeper.record_event(d.message_id, 'delivered', '2.0.0', '250 2.0.0 Ok: queued'))
		  FROM gatekeeper.mail_done d;
		\! awk '{print \$14 + \$15}' /proc/\$BPID/stat > $DIR/t1
	EOS
	client=$!
	for _ in $(seq 1 50); do [ -s "$DIR/pid" ] && break; sleep 0.1; done
	perf_pid=
	if [ -n "$PERF" ] && [ "$round" = "$ROUNDS" ]; then
		perf record -g -p "$(cat "$DIR/pid")" -o "$PERF" >/dev/null 2>&1 &
		perf_pid=$!
	fi
	wait "$client"
	[ -z "$perf_pid" ] || { kill -INT "$perf_pid"; wait "$perf_pid" || true; }
	ticks=$(( $(cat "$DIR/t1") - $(cat "$DIR/t0") ))
	echo "round $round: $(tail -1 "$DIR/out") events, backend CPU $((ticks / 100)).$(printf %02d $((ticks % 100))) s, $((N * 100 / ticks)) events per CPU second"
	rm -f "$DIR/pid"
done
