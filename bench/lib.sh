# bench/lib.sh: helpers for bench/run.sh.  Sourced, not run.
#
# Everything here runs as root.  The PostgreSQL server runs as the postgres
# user (initdb refuses root) from a data directory below $BK_WORK, listening
# on 127.0.0.1 only; every client (psql, pgbench, redis-benchmark,
# smtp-source) runs as root and connects over TCP loopback.

# ------------------------------------------------------------------ results
#
# $BK_WORK/results.tsv holds one line per measurement:
#	value	FIGURE	RUN	VALUE		a measured figure (figure ids: see report.pl)
#	skip	FIGURE	-	REASON		a figure that could not be measured, and why
#	note	SCENARIO	-	TEXT	an observation printed under the scenario
#	info	KEY	-	TEXT		a line of the machine's description

bk_record() { printf 'value\t%s\t%s\t%s\n' "$1" "$2" "$3" >>"$BK_WORK/results.tsv"; }
bk_skip()   { printf 'skip\t%s\t-\t%s\n' "$1" "$2" >>"$BK_WORK/results.tsv"; gk_warn "$1 not measured: $2"; }
bk_note()   { printf 'note\t%s\t-\t%s\n' "$1" "$2" >>"$BK_WORK/results.tsv"; }
bk_info()   { printf 'info\t%s\t-\t%s\n' "$1" "$2" >>"$BK_WORK/results.tsv"; }

# bk_now: seconds since the epoch, to the nanosecond.
bk_now() { date +%s.%N; }

# bk_rate COUNT START END: COUNT / (END - START), rounded.
bk_rate() { perl -e 'printf "%.1f\n", $ARGV[0] / ($ARGV[2] - $ARGV[1])' "$@"; }

# bk_elapsed START END: END - START in seconds.
bk_elapsed() { perl -e 'printf "%.3f\n", $ARGV[1] - $ARGV[0]' "$@"; }

# ------------------------------------------------------------------ clients

# bk_psql [psql args]: psql to the bench database as postgres, unaligned,
# tuples only, stopping at the first error.
bk_psql() {
	psql -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$BK_PGPORT" -U postgres -d "${BK_DB:-bench}" "$@"
}

# bk_sql SQL: run SQL (one or more statements) and print the result.
bk_sql() { bk_psql -c "$1"; }

# bk_pgbench LOG PGBENCH-ARGS...: run pgbench against $BK_DB (bench unless set),
# always -n (no vacuum) and -M prepared, output in LOG.  Fails when pgbench
# fails or reports aborted clients or failed transactions.
bk_pgbench() {
	local log=$1
	shift
	if ! pgbench -n -M prepared -h 127.0.0.1 -p "$BK_PGPORT" -U postgres "$@" "${BK_DB:-bench}" >"$log" 2>&1; then
		tail -n 20 "$log" >&2
		gk_warn "pgbench failed (log: $log)"
		return 1
	fi
	if grep -Eq 'number of failed transactions: [1-9]|aborted' "$log"; then
		tail -n 20 "$log" >&2
		gk_warn "pgbench reported failures (log: $log)"
		return 1
	fi
}

# bk_jobs CLIENTS: pgbench threads for CLIENTS clients (no more than cores).
bk_jobs() {
	local n
	n=$(nproc)
	if [ "$1" -lt "$n" ]; then echo "$1"; else echo "$n"; fi
}

# bk_settle: make the next measurement start from the same place as every
# other: flush dirty buffers and start a new checkpoint cycle, so each run
# pays the same full-page writes.
bk_settle() { bk_sql "CHECKPOINT" >/dev/null; }

# ------------------------------------------------------------------ cluster

# bk_cluster_init: initdb a throwaway cluster in $BK_WORK/data.
bk_cluster_init() {
	BK_DATA=$BK_WORK/data
	BK_PGPORT=$(gk_free_port)
	gk_log "initdb $BK_DATA (port $BK_PGPORT)"
	(cd "$BK_WORK" && gk_run_as_postgres initdb -D "$BK_DATA" -U postgres --auth=trust \
		--encoding=UTF8 --locale=C.UTF-8 >"$BK_WORK/initdb.log" 2>&1) ||
		{ cat "$BK_WORK/initdb.log" >&2; gk_die "initdb failed"; }
	# The settings that matter, in one place; report.pl prints them.
	cat >>"$BK_DATA/postgresql.conf" <<-EOF
		# --- bench/run.sh ---
		listen_addresses = '127.0.0.1'
		port = $BK_PGPORT
		unix_socket_directories = '$BK_WORK'
		max_connections = 50
		shared_buffers = '$BK_SHARED_BUFFERS'
		maintenance_work_mem = '512MB'
		max_wal_size = '8GB'
		min_wal_size = '1GB'
		checkpoint_timeout = '30min'
		synchronous_commit = on
		fsync = on
		full_page_writes = on
		shared_preload_libraries = 'gatekeeper'
		# every run passes recipients of its own, and passes outlive it
		gatekeeper.gate_memory = '1GB'
		logging_collector = off
		log_min_messages = warning
		log_autovacuum_min_duration = 0
		include_if_exists = 'bench_scenario.conf'
	EOF
	: >"$BK_DATA/bench_scenario.conf"
	chown postgres: "$BK_DATA/bench_scenario.conf"
	bk_huge_pages
}

# bk_huge_pages: put the server's shared memory in huge pages, as a
# production server of this size runs (PostgreSQL's "Managing Kernel
# Resources"): the size the server asks for (postgres -C
# shared_memory_size_in_huge_pages, gatekeeper's gates included) is added
# to the machine's pool for the run, huge_pages = on, and bk_huge_pages_release
# gives the pages back at the end.  Every figure of the run, gatekeeper's
# and the PostgreSQL peers' alike (PgQ, pgmq, the raw UPDATE, the plain
# COPY), is measured in that one server.  Where the pool cannot grow (not
# root, a read-only /proc/sys, memory too fragmented) the server runs in
# 4 kB pages and the report says so.  BK_HUGE_PAGES=off asks for that.
BK_HUGE_POOL_WAS=
bk_huge_pages() {
	local need total setting=off why
	if [ "${BK_HUGE_PAGES:-on}" = off ]; then
		why="off (BK_HUGE_PAGES=off)"
	elif ! need=$(cd "$BK_WORK" && gk_run_as_postgres postgres -D "$BK_DATA" \
			-C shared_memory_size_in_huge_pages 2>/dev/null) || ! [ "${need:-0}" -gt 0 ] 2>/dev/null; then
		why="off (the server did not say how many it needs)"
	else
		# 64 more: the scenarios that restart the server with a worker
		# or two ask for a little more shared memory
		BK_HUGE_POOL_WAS=$(cat /proc/sys/vm/nr_hugepages)
		if echo $((BK_HUGE_POOL_WAS + need + 64)) >/proc/sys/vm/nr_hugepages 2>/dev/null &&
			total=$(cat /proc/sys/vm/nr_hugepages) && [ "$total" -ge $((BK_HUGE_POOL_WAS + need + 64)) ]; then
			setting=on
			why="on: the server needs $need pages of $(awk '/^Hugepagesize:/ { print $2 / 1024 " MB" }' /proc/meminfo); the pool was grown for the run (vm.nr_hugepages $BK_HUGE_POOL_WAS -> $total) and given back at the end"
		else
			bk_huge_pages_release
			why="off (the machine's pool could not grow by the $need pages the server needs)"
		fi
	fi
	printf "huge_pages = %s\n" "$setting" >>"$BK_DATA/postgresql.conf"
	BK_HUGE_PAGES_INFO=$why
}

# bk_huge_pages_release: give back what bk_huge_pages added to the pool
# (the server stopped first).
bk_huge_pages_release() {
	[ -n "$BK_HUGE_POOL_WAS" ] || return 0
	echo "$BK_HUGE_POOL_WAS" >/proc/sys/vm/nr_hugepages 2>/dev/null || true
	BK_HUGE_POOL_WAS=
}

# bk_cluster_conf LINES: the per-scenario settings (replaces the previous
# scenario's); takes effect at the next bk_cluster_start.
bk_cluster_conf() {
	printf '%s\n' "$1" >"$BK_DATA/bench_scenario.conf"
	chown postgres: "$BK_DATA/bench_scenario.conf"
}

# bk_cluster_start: start the server.  The library it preloads is
# fingerprinted at each start: another `make install` between two starts
# (the delivery scenario restarts the server) is noted in the report.
bk_cluster_start() {
	local so sum
	so=$("$GK_PG_CONFIG" --pkglibdir)/gatekeeper.so
	sum=$(md5sum <"$so" | cut -c1-12)
	if [ -n "${BK_SO_SUM:-}" ] && [ "$sum" != "$BK_SO_SUM" ]; then
		bk_note "${BK_SCENARIO:-setup}" "gatekeeper.so changed on disk since the run started (now $sum, modified $(date -u -r "$so" '+%H:%M:%S UTC')): from here on the server runs another build"
		gk_warn "gatekeeper.so was reinstalled during the run"
	fi
	BK_SO_SUM=$sum
	(cd "$BK_WORK" && gk_run_as_postgres pg_ctl -D "$BK_DATA" -l "$BK_WORK/server.log" -w -t 60 start >/dev/null) ||
		{ tail -n 30 "$BK_WORK/server.log" >&2; gk_die "the server did not start"; }
}

bk_cluster_stop() {
	[ -f "$BK_DATA/postmaster.pid" ] || return 0
	(cd "$BK_WORK" && gk_run_as_postgres pg_ctl -D "$BK_DATA" -m fast -w -t 120 stop >/dev/null) || true
}

bk_cluster_restart() {
	bk_cluster_stop
	bk_cluster_start
}

# bk_db_make DB [SQL]: drop and recreate DB with gatekeeper in it, SQL run
# right after CREATE EXTENSION, then bench/sql/setup.sql.
bk_db_make() {
	BK_DB=postgres bk_sql "DROP DATABASE IF EXISTS $1 WITH (FORCE)" >/dev/null
	BK_DB=postgres bk_sql "CREATE DATABASE $1" >/dev/null
	BK_DB=$1 bk_sql "CREATE EXTENSION gatekeeper${2:+; $2}" >/dev/null
	BK_DB=$1 bk_sql "$(cat "$BENCH/sql/setup.sql")" >/dev/null
}


# ------------------------------------------------------------------ servers we start

# bk_start_bg NAME DIR CMD...: start CMD in DIR in the background, output
# in $BK_WORK/NAME.out and .err; its PID goes to $BK_WORK/bg.pids, so the
# exit trap stops it even when a scenario (a subshell) failed.
bk_start_bg() {
	local name=$1 dir=$2
	shift 2
	(cd "$dir" && exec "$@") >"$BK_WORK/$name.out" 2>"$BK_WORK/$name.err" &
	echo "$!" >>"$BK_WORK/bg.pids"
	eval "BK_PID_$name=$!"
}

# bk_stop_bg NAME: stop what bk_start_bg NAME started.
bk_stop_bg() {
	local var="BK_PID_$1" pid
	pid=${!var:-}
	[ -n "$pid" ] || return 0
	kill "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	eval "BK_PID_$1="
}

# bk_wait_port PORT: wait up to 10 s for something to accept on PORT.
bk_wait_port() {
	local i
	for i in $(seq 1 100); do
		gk_port_free "$1" || return 0
		sleep 0.1
	done
	return 1
}
