#!/bin/bash
# bench/router_ratio.sh: routed enqueue against direct enqueue into one
# shard, as docs/sharding.md's table measures it (bench/scenarios.sh,
# scenario shards: bench/sql/shard_enqueue.sql, one enqueue per
# transaction, 4 pgbench clients), without the scenario's bulk and claim
# parts: a throwaway cluster with four shard databases and a router,
# then RUNS rounds of direct and routed alternated, each N calls; prints
# every rate and the medians.  Run as the postgres OS user:
#   PATH=$PG_BIN:$PATH bash bench/router_ratio.sh [RUNS] [N] [WORKDIR]
set -euo pipefail
RUNS=${1:-3}
N=${2:-8000}
W=${3:-$(mktemp -d)}
HERE=$(cd "$(dirname "$0")" && pwd)
PORT=$((20000 + RANDOM % 10000))
initdb -D "$W/data" --encoding=UTF8 --no-locale >/dev/null
cat >>"$W/data/postgresql.conf" <<CONF
port = $PORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$W'
shared_preload_libraries = 'gatekeeper'
gatekeeper.database = 'postgres'
synchronous_commit = on
max_connections = 100
CONF
pg_ctl -D "$W/data" -l "$W/log" -w start >/dev/null
trap 'pg_ctl -D "$W/data" -m fast stop >/dev/null' EXIT
q() { psql -X -q -At -h 127.0.0.1 -p "$PORT" -d "$1" -c "$2"; }
opts=""
for i in 0 1 2 3; do
	q postgres "CREATE DATABASE shard_$i"
	q shard_$i "CREATE EXTENSION gatekeeper; SELECT gatekeeper.shard($i, 4); SELECT gatekeeper.create_queue('bench')" >/dev/null
	opts="$opts${opts:+, }p$i 'host=127.0.0.1 port=$PORT dbname=shard_$i'"
done
q postgres "CREATE DATABASE router"
q router "CREATE EXTENSION gatekeeper_router CASCADE;
	CREATE SERVER gatekeeper FOREIGN DATA WRAPPER plproxy OPTIONS ($opts);
	CREATE USER MAPPING FOR PUBLIC SERVER gatekeeper OPTIONS (user '$(whoami)')"
for run in $(seq 1 "$RUNS"); do
	for k in direct routed; do
		db=$([ $k = direct ] && echo shard_0 || echo router)
		q postgres CHECKPOINT
		rate=$(pgbench -n -M prepared -h 127.0.0.1 -p "$PORT" -f "$HERE/sql/shard_enqueue.sql" \
			-c 4 -j 2 -t $((N / 4)) "$db" 2>&1 | sed -n 's/^tps = \([0-9.]*\) .*/\1/p')
		echo "$k $run $rate"
	done
done | tee "$W/rates" 
awk '{r[$1] = r[$1] " " $3} END {
	for (k in r) { n = split(r[k], a, " "); for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
		m[k] = a[int((n + 1) / 2)]; printf "%s median %.0f calls/s (%s)\n", k, m[k], r[k] }
	printf "routed/direct %.2fx\n", m["routed"] / m["direct"] }' "$W/rates"
uptime
