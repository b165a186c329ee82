# bench/scenarios.sh: the scenarios of bench/run.sh.  Sourced, not run.
#
# Each scenario_NAME function runs in a subshell with `set -e`, records its
# measurements with bk_record (figure ids are listed in report.pl) and stops
# whatever servers it started.  Sizes come from run.sh.

SQL=$BENCH/sql

# bk_machine_info: describe the machine and the cluster for the report.
bk_machine_info() {
	local mem cpu
	mem=$(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)
	cpu=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)
	bk_info cores "$(nproc)"
	bk_info memory "$mem"
	bk_info cpu "${cpu:-unknown}"
	bk_info kernel "$(uname -sr)"
	bk_info hypervisor "$(bk_hypervisor)"
	bk_info "first touch" "$(bk_first_touch)"
	bk_info "huge pages" "$BK_HUGE_PAGES_INFO; the server has huge_pages = $(bk_sql "SHOW huge_pages")"
	bk_info postgresql "$(bk_sql "SHOW server_version")"
	bk_info settings "$(bk_sql "SELECT string_agg(name || ' = ' || current_setting(name), ', ' ORDER BY name)
		FROM pg_settings WHERE name IN ('shared_buffers', 'synchronous_commit', 'fsync', 'full_page_writes',
			'wal_level', 'max_wal_size', 'checkpoint_timeout', 'autovacuum', 'maintenance_work_mem', 'work_mem')")"
	bk_info wal_sync "$(bk_sql "SHOW wal_sync_method"); data on $(df -T "$BK_WORK" | awk 'NR == 2 { print $2 }')"
	bk_info peers "PgQ $(bk_sql "SELECT default_version FROM pg_available_extensions WHERE name = 'pgq'"), $(redis-server --version | awk '{ print $1, $2, $3 }'), Postfix $(postconf -d -h mail_version 2>/dev/null || echo '?') smtp-source/smtp-sink"
	bk_info gatekeeper "$(bk_sql "SELECT default_version FROM pg_available_extensions WHERE name = 'gatekeeper'"); repository at $(git -C "$ROOT" -c safe.directory="$ROOT" describe --always --dirty 2>/dev/null || echo '?'); gatekeeper.so installed $(date -u -r "$("$GK_PG_CONFIG" --pkglibdir)/gatekeeper.so" '+%Y-%m-%d %H:%M:%S UTC'), md5 $BK_SO_SUM"
}

# bk_hypervisor: what the kernel says it runs under, if anything.
bk_hypervisor() {
	local hv
	hv=$(dmesg 2>/dev/null | sed -n 's/.*Hypervisor detected: *//p' | head -n 1)
	[ -n "$hv" ] || hv=$(cat /sys/hypervisor/type 2>/dev/null)
	[ -n "$hv" ] || hv=$(grep -qw hypervisor /proc/cpuinfo && echo 'yes (kernel does not say which)')
	echo "${hv:-none seen}"
}

# bk_first_touch: what a process pays to read a page of shared memory
# another wrote, the first time and the second (bench/first_touch.c).
bk_first_touch() {
	local r
	if cc -O2 -o "$BK_WORK/first_touch" "$ROOT/bench/first_touch.c" 2>/dev/null &&
		r=$("$BK_WORK/first_touch" 64) && [ -n "$r" ]; then
		set -- $r
		echo "a process's first read of a page of shared memory another wrote: $1 us; the same page again: $2 us (bench/first_touch.c)"
	else
		echo "not measured (bench/first_touch.c did not build or run)"
	fi
}

# bk_reset_mail: empty gatekeeper's tables (and the references'), ready
# for a new measurement.  Claimed mail is in mail_claim and dedupe keys
# in mail_key: a claim left there would share its (id, attempt) with a
# new mail once the ids restart.
bk_reset_mail() {
	bk_sql "TRUNCATE gatekeeper.mail, gatekeeper.mail_live, gatekeeper.mail_run, gatekeeper.mail_claim, gatekeeper.mail_key, gatekeeper.mail_done, gatekeeper.event_log, gatekeeper.gate_log, bench_raw, bench_plain, bench_pass RESTART IDENTITY" >/dev/null
}

# bk_scheduled: how many mails are scheduled: rows of mail_live and the
# mails of mail_run's runs.
bk_scheduled() {
	bk_sql "SELECT (SELECT count(*) FROM gatekeeper.mail_live)
				 + (SELECT coalesce(sum(last_id - id + 1), 0) FROM gatekeeper.mail_run)"
}

# bk_drain_rest BATCH: claim and ack, one round at a time, what a fixed
# number of pgbench rounds left: a claim can come back short while another
# claimer holds the rest of a run it took part of (mail_run,
# docs/storage.md).  Prints how many mails were left; at most 1,000 rounds.
bk_drain_rest() {
	local i left
	left=$(bk_unfinished)
	echo "$left"
	for i in $(seq 1 1000); do
		[ "$(bk_unfinished)" = 0 ] && return 0
		bk_sql "SELECT gatekeeper.ack_batch(coalesce(array_agg(id), '{}'), coalesce(array_agg(attempt), '{}'))
				  FROM gatekeeper.claim('bench', $1)" >/dev/null
	done
}

# bk_unfinished: how many mails are not finished yet: scheduled (live rows
# and runs) or claimed (open in a batch of mail_claim).
bk_unfinished() {
	bk_sql "SELECT (SELECT count(*) FROM gatekeeper.mail_live)
				 + (SELECT coalesce(sum(last_id - id + 1), 0) FROM gatekeeper.mail_run)
				 + (SELECT coalesce(sum(open), 0) FROM gatekeeper.mail_claim)"
}

# bk_only_queue NAME: pause every queue but NAME, so a claim's fair share
# goes to the one queue that holds the benchmark's mail.
bk_only_queue() {
	bk_sql "SELECT gatekeeper.pause(name) FROM gatekeeper.queue WHERE name <> '$1' AND NOT paused;
			SELECT gatekeeper.resume('$1')" >/dev/null
}

# bk_own_senders_begin / bk_own_senders_end: run the next waves as a
# deployment with its own senders does: one background worker in the
# database for housekeeping (it reaps, purges and has mail_live vacuumed
# after a burst), the bench queue reserved for external senders
# (background => false), the other queues paused.  _end puts the cluster
# back as the other scenarios expect it.
bk_own_senders_begin() {
	bk_cluster_conf "gatekeeper.database = 'bench'
gatekeeper.workers = 1"
	bk_cluster_restart
	bk_sql "SELECT gatekeeper.alter_queue('bench', background => false)" >/dev/null
	bk_reset_mail
	bk_only_queue bench
	bk_sql "VACUUM ANALYZE gatekeeper.mail, gatekeeper.mail_live, gatekeeper.mail_done"
}
bk_own_senders_end() {
	bk_sql "SELECT gatekeeper.alter_queue('bench', background => true)" >/dev/null
	bk_reset_mail
	bk_cluster_conf ""
	bk_cluster_restart
}

# bk_checkpoints: checkpoints begun since the statistics were reset
# (timed or requested, max_wal_size among them).
bk_checkpoints() {
	bk_sql "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
}

# bk_background_work SINCE: the vacuums and analyzes of user tables that
# ran between SINCE (bk_now) and now: finished since then, or running now
# (one running since before SINCE that is still running is counted too).
# A VACUUM's own TOAST table is not named for a manual one (gatekeeper's
# vacuum worker's of mail_live); autovacuum's are.
bk_background_work() {
	bk_sql "SELECT coalesce(string_agg(DISTINCT w, ', '), '')
			  FROM (SELECT relname || ' autovacuum' AS w FROM pg_stat_all_tables
					 WHERE last_autovacuum >= to_timestamp($1)
					   AND schemaname NOT IN ('pg_catalog', 'information_schema')
					UNION ALL
					SELECT relname || ' autoanalyze' FROM pg_stat_all_tables
					 WHERE last_autoanalyze >= to_timestamp($1)
					   AND schemaname NOT IN ('pg_catalog', 'information_schema')
					UNION ALL
					SELECT relname || ' vacuum' FROM pg_stat_all_tables
					 WHERE last_vacuum >= to_timestamp($1)
					   AND schemaname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
					UNION ALL
					SELECT p.relid::regclass::text || ' vacuum running' FROM pg_stat_progress_vacuum p
					UNION ALL
					SELECT p.relid::regclass::text || ' analyze running' FROM pg_stat_progress_analyze p) s"
}

# bk_live_vacuums: how often mail_live has been vacuumed by anything but
# autovacuum (gatekeeper's vacuum worker, in these scenarios).
bk_live_vacuums() {
	bk_sql "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = 'gatekeeper.mail_live'::regclass"
}

# ================================================================== enqueue
#
# What a bulk enqueue round waited on (issue 46, item 5): enq_probe_begin
# starts a sampler (one session, a procedure that commits after every
# sample, so each reads pg_stat_activity afresh) of the wait events of the
# backend whose application_name is bench_timed, every 20 ms, and notes
# pg_stat_wal and the checkpoints so far; enq_probe_end LABEL stops it and
# notes for the round: the samples by wait event, the WAL written (bytes,
# full-page images, writes because wal_buffers were full), checkpoints
# begun, background vacuums and analyzes, and the size of the hash index
# on recipient of the segment's partition.
enq_probe_begin() {
	ENQ_WAL0=$(bk_sql "SELECT wal_bytes || ' ' || wal_fpi || ' ' || wal_buffers_full FROM pg_stat_wal")
	ENQ_CKPT0=$(bk_checkpoints)
	ENQ_T0=$(bk_now)
	bk_sql "TRUNCATE bench_waits" >/dev/null
	bk_start_bg enq_sampler "$BK_WORK" psql -X -q -h 127.0.0.1 -p "$BK_PGPORT" -U postgres -d bench \
		-c "SET application_name = 'bench_sampler'" -c "CALL bench_sample_waits(600)"
}
enq_probe_end() {
	local label=$1 wal1 ckpt1
	bk_sql "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'bench_sampler'" >/dev/null
	bk_stop_bg enq_sampler
	wal1=$(bk_sql "SELECT wal_bytes || ' ' || wal_fpi || ' ' || wal_buffers_full FROM pg_stat_wal")
	ckpt1=$(bk_checkpoints)
	bk_note enqueue "$label: $(bk_sql "SELECT format('waits (of %s samples, 20 ms apart) %s', coalesce(sum(n), 0),
			coalesce(string_agg(w || ' ' || n, ', ' ORDER BY n DESC), 'none'))
		  FROM (SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') AS w, count(*) AS n
				  FROM bench_waits GROUP BY 1) s"); $(perl -e '
			my @a = split / /, $ARGV[0]; my @b = split / /, $ARGV[1];
			printf "WAL %.0f MB, %d full-page images, %d writes for full wal_buffers",
				($b[0] - $a[0]) / 1048576, $b[1] - $a[1], $b[2] - $a[2]' "$ENQ_WAL0" "$wal1"); checkpoints begun $((ckpt1 - ENQ_CKPT0)); background: $(bk_background_work "$ENQ_T0"); $(bk_sql "SELECT coalesce(string_agg(format('%s %s', c.relname, pg_size_pretty(pg_relation_size(c.oid))), ', '), 'no hash index')
			FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam
		   WHERE a.amname = 'hash' AND i.indrelid IN (SELECT relid FROM pg_partition_tree('gatekeeper.mail'))
			 AND pg_relation_size(c.oid) > 65536")"
}

# enq_timed SQL: run SQL as the backend the sampler watches.
enq_timed() { PGAPPNAME=bench_timed bk_sql "$1"; }

#
# Bulk enqueue (issue 26): ENQ_ROWS rows of the issue's shape (a recipient,
# a 25-character subject, a 500-byte body; queue bench, due now), loaded
# into bench_bulk first (not timed).  Each run, in turn: a server-side COPY
# of them (a CSV file) into bench_plain (same columns, identity primary key,
# nothing else: the ceiling), the same COPY into gatekeeper.mail, one
# INSERT ... SELECT from bench_bulk into gatekeeper.mail, and, when
# BK_PGMQ_SQL loads pgmq (see pgmq_setup), one pgmq.send_batch() of the
# same rows as jsonb messages, built in the same statement; then ENQ_CALLS
# enqueue() calls in one transaction (one statement over generate_series).
# Every measurement starts from empty tables after a CHECKPOINT.
# enq_copy_gk RUN CSV: one COPY round into gatekeeper.mail, probed.
enq_copy_gk() {
	local run=$1 csv=$2 t0 t1
	bk_reset_mail
	bk_settle
	enq_probe_begin
	t0=$(bk_now)
	enq_timed "COPY gatekeeper.mail (queue, recipient, subject, body) FROM '$csv' (FORMAT csv)"
	t1=$(bk_now)
	enq_probe_end "run $run COPY $(printf '%.0f' "$(bk_rate "$ENQ_ROWS" "$t0" "$t1")") rows/s"
	[ "$(bk_scheduled)" = "$ENQ_ROWS" ] || gk_die "COPY lost rows"
	bk_record enqueue.copy_gk "$run" "$(bk_rate "$ENQ_ROWS" "$t0" "$t1")"
}

scenario_enqueue() {
	local run t0 t1 csv=$BK_WORK/enqueue.csv
	bk_sql "CREATE TABLE bench_bulk AS
			SELECT 'bench'::text AS queue, 'e' || i || '@example.com' AS recipient,
				   rpad('Subject ' || i, 25, '.') AS subject, left(bench_body(i), 500) AS body
			  FROM generate_series(1, $ENQ_ROWS) AS i" >/dev/null
	bk_sql "VACUUM ANALYZE bench_bulk"
	bk_sql "COPY bench_bulk TO '$csv' (FORMAT csv)"
	bk_sql "CREATE TABLE IF NOT EXISTS bench_waits (wait_event_type text, wait_event text);
			CREATE OR REPLACE PROCEDURE bench_sample_waits(secs float8) LANGUAGE plpgsql AS \$\$
			DECLARE
				stop timestamptz := clock_timestamp() + secs * interval '1 second';
			BEGIN
				WHILE clock_timestamp() < stop LOOP
					INSERT INTO bench_waits
					SELECT wait_event_type, wait_event FROM pg_stat_activity
					 WHERE application_name = 'bench_timed' AND state = 'active';
					COMMIT;
					PERFORM pg_sleep(0.02);
				END LOOP;
			END \$\$" >/dev/null
	pgmq_setup enqueue
	if [ "$PGMQ" = 1 ]; then
		bk_sql "SELECT pgmq.drop_queue(queue_name) FROM pgmq.list_queues() WHERE queue_name = 'bench_e';
				SELECT pgmq.create('bench_e')" >/dev/null
	fi
	for run in $(seq 1 "$RUNS"); do
		bk_reset_mail
		bk_settle
		t0=$(bk_now)
		bk_sql "COPY bench_plain (queue, recipient, subject, body) FROM '$csv' (FORMAT csv)"
		t1=$(bk_now)
		bk_record enqueue.copy_plain "$run" "$(bk_rate "$ENQ_ROWS" "$t0" "$t1")"

		# odd runs COPY into gatekeeper.mail before pgmq, even runs after
		[ $((run % 2)) = 0 ] || enq_copy_gk "$run" "$csv"

		bk_reset_mail
		bk_settle
		t0=$(bk_now)
		bk_sql "INSERT INTO gatekeeper.mail (queue, recipient, subject, body)
				SELECT queue, recipient, subject, body FROM bench_bulk"
		t1=$(bk_now)
		[ "$(bk_scheduled)" = "$ENQ_ROWS" ] || gk_die "INSERT lost rows"
		bk_record enqueue.insert_gk "$run" "$(bk_rate "$ENQ_ROWS" "$t0" "$t1")"

		if [ "$PGMQ" = 1 ]; then
			bk_reset_mail
			bk_sql "TRUNCATE pgmq.q_bench_e" >/dev/null
			bk_settle
			enq_probe_begin
			t0=$(bk_now)
			enq_timed "SELECT count(*) FROM pgmq.send_batch('bench_e', ARRAY(
						SELECT jsonb_build_object('recipient', recipient, 'subject', subject, 'body', body)
						  FROM bench_bulk))" >/dev/null
			t1=$(bk_now)
			enq_probe_end "run $run pgmq $(printf '%.0f' "$(bk_rate "$ENQ_ROWS" "$t0" "$t1")") rows/s"
			[ "$(bk_sql "SELECT count(*) FROM pgmq.q_bench_e")" = "$ENQ_ROWS" ] || gk_die "pgmq lost rows"
			bk_sql "TRUNCATE pgmq.q_bench_e" >/dev/null
			bk_record enqueue.pgmq "$run" "$(bk_rate "$ENQ_ROWS" "$t0" "$t1")"
		fi
		[ $((run % 2)) = 1 ] || enq_copy_gk "$run" "$csv"

		bk_reset_mail
		bk_settle
		t0=$(bk_now)
		bk_sql "SELECT count(gatekeeper.enqueue('f' || i || '@example.com', 'Subject ' || i, bench_body(i), 'bench'))
				  FROM generate_series(1, $ENQ_CALLS) AS i" >/dev/null
		t1=$(bk_now)
		[ "$(bk_sql "SELECT count(*) FROM gatekeeper.mail")" = "$ENQ_CALLS" ] || gk_die "enqueue lost rows"
		bk_record enqueue.fn "$run" "$(bk_rate "$ENQ_CALLS" "$t0" "$t1")"
	done
	if [ "$PGMQ" = 1 ]; then
		bk_sql "SELECT pgmq.drop_queue('bench_e')" >/dev/null
	fi
	bk_sql "DROP TABLE bench_bulk, bench_waits; DROP PROCEDURE bench_sample_waits" >/dev/null
	rm -f "$csv"
	bk_reset_mail
}

# ================================================================== drain
#
# For batch 100 and 1000 and 1/2/4/8 claimers:
#   raw    DRAIN_N rows of bench_raw (a copy of the preloaded mail) marked
#          sent by id range, one UPDATE per batch, by the same number of
#          clients;
#   gk     DRAIN_N due mails drained by claim(batch) + ack_batch(ids, attempts);
#   gated  the same through a queue gated by smart_sending, every recipient
#          distinct (so every mail passes: this is the gate's overhead);
#   pgq    DRAIN_N PgQ events inserted by the same number of producers in
#          transactions of `batch` events with a tick after each, then
#          consumed by one consumer (PgQ's unit of parallelism is the
#          consumer; every consumer reads every event) with next_batch /
#          get_batch_events / finish_batch; rate = events / (insert + consume).
# Every rate is rows per second of wall time of the pgbench runs.

# drain_preload QUEUE [PREFIX]: DRAIN_N due mails in QUEUE to recipients
# PREFIX<i>@example.com (PREFIX d by default), and the same rows in
# bench_raw, vacuumed and analyzed.  Gate passes outlive the truncation of
# gatekeeper.gate_log, so a gated drain needs recipients of its own.
drain_preload() {
	bk_reset_mail
	bk_sql "CALL bench_load($DRAIN_N, '${2:-d}', '$1', interval '-1 minute')"
	bk_sql "INSERT INTO bench_raw SELECT * FROM gatekeeper.mail_status" >/dev/null
	[ "$(bk_sql "SELECT min(id) || ' ' || max(id) FROM bench_raw")" = "1 $DRAIN_N" ] ||
		gk_die "preloaded ids are not 1..$DRAIN_N"
	bk_sql "VACUUM ANALYZE gatekeeper.mail, gatekeeper.mail_live, gatekeeper.mail_done"
	bk_sql "VACUUM ANALYZE bench_raw"
}

# drain_gk FIGURE RUN BATCH CLIENTS QUEUE: drain the preloaded mail.
drain_gk() {
	local fig=$1 run=$2 b=$3 k=$4 q=$5 t0 t1 left
	bk_only_queue "$q"
	bk_settle
	t0=$(bk_now)
	bk_pgbench "$BK_WORK/pgbench.$fig.$run.log" -f "$SQL/drain.sql" -D batch="$b" \
		-c "$k" -j "$(bk_jobs "$k")" -t $((DRAIN_N / b / k))
	t1=$(bk_now)
	left=$(bk_sql "SELECT count(*) FILTER (WHERE state <> 'sent') || ' ' || count(*) FROM gatekeeper.mail_status")
	if [ "$left" != "0 $DRAIN_N" ]; then
		bk_sql "SELECT state, count(*) FROM gatekeeper.mail_status GROUP BY 1" >&2
		gk_die "$fig: not every mail was sent ($left)"
	fi
	bk_record "$fig" "$run" "$(bk_rate "$DRAIN_N" "$t0" "$t1")"
}

# drain_raw FIGURE RUN BATCH CLIENTS
drain_raw() {
	local fig=$1 run=$2 b=$3 k=$4 t0 t1
	bk_settle
	t0=$(bk_now)
	bk_pgbench "$BK_WORK/pgbench.$fig.$run.log" -f "$SQL/raw_update.sql" -D batch="$b" -D clients="$k" -D i=0 \
		-c "$k" -j "$(bk_jobs "$k")" -t $((DRAIN_N / b / k))
	t1=$(bk_now)
	[ "$(bk_sql "SELECT count(*) FROM bench_raw WHERE state = 'sent'")" = "$DRAIN_N" ] ||
		gk_die "$fig: the raw UPDATE missed rows"
	bk_record "$fig" "$run" "$(bk_rate "$DRAIN_N" "$t0" "$t1")"
}

# drain_pgq FIGURE RUN BATCH CLIENTS
drain_pgq() {
	local fig=$1 run=$2 b=$3 k=$4 t0 t1 t2 batches pending
	bk_sql "SELECT pgq.drop_queue(queue_name, true) FROM pgq.get_queue_info() WHERE queue_name = 'bench_q'" >/dev/null
	bk_sql "SELECT pgq.create_queue('bench_q');
			SELECT pgq.set_queue_config('bench_q', 'ticker_max_count', '$b');
			SELECT pgq.set_queue_config('bench_q', 'ticker_max_lag', '1 hour');
			SELECT pgq.register_consumer('bench_q', 'bench')" >/dev/null
	bk_settle
	t0=$(bk_now)
	bk_pgbench "$BK_WORK/pgbench.$fig.insert.$run.log" -f "$SQL/pgq_insert.sql" -D batch="$b" -D i=0 \
		-c "$k" -j "$(bk_jobs "$k")" -t $((DRAIN_N / b / k))
	# close the last batch, whatever the ticker left open
	bk_sql "SELECT pgq.force_tick('bench_q')" >/dev/null
	bk_sql "SELECT pgq.ticker('bench_q')" >/dev/null
	batches=$(bk_sql "SELECT count(*) FROM pgq.tick t JOIN pgq.queue q ON q.queue_id = t.tick_queue
					   WHERE q.queue_name = 'bench_q'
						 AND t.tick_id > (SELECT last_tick FROM pgq.get_consumer_info('bench_q', 'bench'))")
	t1=$(bk_now)
	bk_pgbench "$BK_WORK/pgbench.$fig.consume.$run.log" -f "$SQL/pgq_consume.sql" -c 1 -t "$batches"
	t2=$(bk_now)
	pending=$(bk_sql "SELECT coalesce(pending_events, 0) + coalesce(lag > interval '1 hour', false)::int
						FROM pgq.get_consumer_info('bench_q', 'bench')")
	[ "$pending" = 0 ] || gk_die "$fig: PgQ consumer left $pending events"
	bk_record "$fig" "$run" "$(bk_rate "$DRAIN_N" "$t0" "$t2")"
	bk_record "${fig/pgq/pgqc}" "$run" "$(bk_rate "$DRAIN_N" "$t1" "$t2")"
}

# drain_pgmq FIGURE RUN BATCH CLIENTS: the optional pgmq peer.  DRAIN_N
# messages with the same payload sent (not timed), then drained by k
# consumers looping read(batch) and delete(ids).
drain_pgmq() {
	local fig=$1 run=$2 b=$3 k=$4 t0 t1 left
	bk_sql "SELECT pgmq.drop_queue(queue_name) FROM pgmq.list_queues() WHERE queue_name = 'bench_m'" >/dev/null
	bk_sql "SELECT pgmq.create('bench_m')" >/dev/null
	bk_sql "SELECT count(*) FROM generate_series(0, $DRAIN_N - 1, 10000) AS s,
			LATERAL pgmq.send_batch('bench_m', ARRAY(
				SELECT jsonb_build_object('to', 'm' || g || '@example.com', 'body', bench_body(g))
				  FROM generate_series(s + 1, least(s + 10000, $DRAIN_N)) AS g))" >/dev/null
	bk_sql "VACUUM ANALYZE pgmq.q_bench_m"
	bk_settle
	t0=$(bk_now)
	bk_pgbench "$BK_WORK/pgbench.$fig.$run.log" -f "$SQL/pgmq_drain.sql" -D batch="$b" \
		-c "$k" -j "$(bk_jobs "$k")" -t $((DRAIN_N / b / k))
	t1=$(bk_now)
	left=$(bk_sql "SELECT count(*) FROM pgmq.q_bench_m")
	[ "$left" = 0 ] || gk_die "$fig: pgmq left $left messages"
	bk_record "$fig" "$run" "$(bk_rate "$DRAIN_N" "$t0" "$t1")"
}

# pgmq_setup [SCENARIO]: load the user's pgmq SQL install file, if
# BK_PGMQ_SQL names one and it is not loaded yet (notes go to SCENARIO,
# default drain).  Prints nothing and fails when there is none or it does not load.
PGMQ=0
pgmq_setup() {
	local sc=${1:-drain}
	[ -n "${BK_PGMQ_SQL:-}" ] || return 0
	if [ "$PGMQ" = 1 ]; then
		return 0
	fi
	if [ ! -r "$BK_PGMQ_SQL" ]; then
		bk_note "$sc" "BK_PGMQ_SQL=$BK_PGMQ_SQL is not a readable file: pgmq not measured"
		return 0
	fi
	if bk_sql "SELECT 1 FROM pg_namespace WHERE nspname = 'pgmq'" | grep -q 1 ||
		sed -e '/^\\echo .*\\quit/d' -e 's/@extschema@/pgmq/g' "$BK_PGMQ_SQL" |
		bk_psql -f - >"$BK_WORK/pgmq-install.log" 2>&1; then
		PGMQ=1
		bk_note "$sc" "pgmq loaded from the user's $BK_PGMQ_SQL: $(bk_sql "SELECT count(*) FROM pg_proc WHERE pronamespace = 'pgmq'::regnamespace") functions"
	else
		bk_note "$sc" "BK_PGMQ_SQL=$BK_PGMQ_SQL did not load (see pgmq-install.log): pgmq not measured"
	fi
}

scenario_drain() {
	local run b k c
	bk_sql "CREATE EXTENSION IF NOT EXISTS pgq" >/dev/null
	pgmq_setup
	for run in $(seq 1 "$RUNS"); do
		for c in $DRAIN_CONFIGS; do
			b=${c%:*} k=${c#*:}
			DRAIN_N=$((b == 100 ? DRAIN_N_100 : DRAIN_N_1000))
			gk_log "drain run $run: $DRAIN_N mails, batch $b, $k claimer(s)"
			drain_preload bench
			drain_gk "drain.gk.b$b.k$k" "$run" "$b" "$k" bench
			drain_raw "drain.raw.b$b.k$k" "$run" "$b" "$k"
			drain_preload bench_gated "g${run}b${b}k${k}_"
			drain_gk "drain.gated.b$b.k$k" "$run" "$b" "$k" bench_gated
			drain_pgq "drain.pgq.b$b.k$k" "$run" "$b" "$k"
			if [ "$PGMQ" = 1 ]; then
				drain_pgmq "drain.pgmq.b$b.k$k" "$run" "$b" "$k"
			fi
		done
	done
	bk_sql "SELECT pgq.drop_queue(queue_name, true) FROM pgq.get_queue_info() WHERE queue_name = 'bench_q'" >/dev/null
	bk_reset_mail
}

# ================================================================== held_snapshot
#
# Issue 46, item 4: the drain while a snapshot is held open.  A session
# holds `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1 FROM
# gatekeeper.mail LIMIT 1;` open (a long report, pg_dump, a lagging
# logical slot) from before the first wave to after the last, so no row a
# claim deletes or an ack updates is dead to every transaction and
# nothing can be vacuumed.  HELD_WAVES waves of HELD_N mails, each
# enqueued by one INSERT ... SELECT (not timed) and drained by
# HELD_CLAIMERS pgbench clients looping claim(1000) + ack_batch; no worker
# in the database.  The reference is the same waves without the held
# snapshot, in the same run; odd runs measure the reference first, even
# runs the held side first.  Each side starts from empty tables.  Besides
# the rate, the server's CPU time per mail (every process of the cluster,
# supp_cpu) over each wave's drain: on a loaded machine, where the rate
# follows the other work and the disk's flushes, it shows what the claims
# themselves cost.

# held_side FIGURE RUN HOLD: one side's waves; HOLD=1 holds the snapshot.
held_side() {
	local fig=$1 run=$2 hold=$3 w t0 t1 c0 c1 cpu cpus= rest rate rates= xmin
	bk_reset_mail
	bk_sql "VACUUM ANALYZE gatekeeper.mail, gatekeeper.mail_live, gatekeeper.mail_claim, gatekeeper.mail_done" >/dev/null
	if [ "$hold" = 1 ]; then
		bk_start_bg held_snapshot "$BK_WORK" psql -X -q -h 127.0.0.1 -p "$BK_PGPORT" -U postgres -d bench \
			-c "SET application_name = 'bench_held_snapshot'" \
			-c "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1 FROM gatekeeper.mail LIMIT 1; SELECT pg_sleep(3600)"
		for w in $(seq 1 100); do
			xmin=$(bk_sql "SELECT count(*) FROM pg_stat_activity
							WHERE application_name = 'bench_held_snapshot' AND backend_xmin IS NOT NULL
							  AND query LIKE '%pg_sleep%'")
			[ "$xmin" = 1 ] && break
			sleep 0.1
		done
		[ "$xmin" = 1 ] || gk_die "held_snapshot: the holding session did not start"
	fi
	for w in $(seq 1 "$HELD_WAVES"); do
		bk_sql "INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
				SELECT * FROM bench_rows($HELD_N, 'h${run}${hold}w${w}_', 'bench', interval '0')"
		bk_settle
		c0=$(supp_cpu)
		t0=$(bk_now)
		bk_pgbench "$BK_WORK/pgbench.$fig.$run.$w.log" -f "$SQL/drain.sql" -D batch=1000 \
			-c "$HELD_CLAIMERS" -j "$(bk_jobs "$HELD_CLAIMERS")" -t $((HELD_N / 1000 / HELD_CLAIMERS))
		rest=$(bk_drain_rest 1000)
		t1=$(bk_now)
		c1=$(supp_cpu)
		[ "$(bk_unfinished)" = 0 ] || gk_die "$fig wave $w left mail unsent"
		rate=$(bk_rate "$HELD_N" "$t0" "$t1")
		cpu=$(perl -e 'printf "%.1f", ($ARGV[1] - $ARGV[0]) * 1e6 / $ARGV[2]' "$c0" "$c1" "$HELD_N")
		rates="$rates${rates:+ }$(printf '%.0f' "$rate")"
		cpus="$cpus${cpus:+ }$cpu"
		[ "$w" != 1 ] || bk_record "$fig.first" "$run" "$rate"
		[ "$rest" = 0 ] || bk_note held_snapshot "$fig run $run wave $w: $rest mails left by the fixed rounds, claimed after them (timed)"
	done
	bk_record "$fig.last" "$run" "$rate"
	bk_record "$fig.last.cpu" "$run" "$cpu"
	bk_note held_snapshot "run $run, $fig: waves $rates mails/s, server CPU $cpus us a mail; $(bk_sql "SELECT format('mail_live %s dead rows, mail_claim %s, load average %s',
		(SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'gatekeeper.mail_live'::regclass),
		pg_size_pretty(pg_total_relation_size('gatekeeper.mail_claim')),
		'$(cut -d' ' -f1-3 /proc/loadavg)')")"
	if [ "$hold" = 1 ]; then
		# the backend sleeps on after its psql is gone: end it, or the
		# next TRUNCATE waits for its lock
		bk_sql "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				 WHERE application_name = 'bench_held_snapshot'" >/dev/null
		bk_stop_bg held_snapshot
	fi
}

scenario_held_snapshot() {
	local run
	bk_only_queue bench
	for run in $(seq 1 "$RUNS"); do
		gk_log "held_snapshot run $run: $HELD_WAVES waves of $HELD_N mails, $HELD_CLAIMERS claimers, batch 1000"
		if [ $((run % 2)) = 1 ]; then
			held_side held_snapshot.none "$run" 0
			held_side held_snapshot.held "$run" 1
		else
			held_side held_snapshot.held "$run" 1
			held_side held_snapshot.none "$run" 0
		fi
	done
	bk_reset_mail
}

# ================================================================== suppression
#
# Opt-in (--only suppression; not in a full run).  Issue 12: the claim
# probes the suppression list once per distinct recipient of its batch,
# in the same transaction as the gates.  SUPP_N due mails through
# bench_gated (smart_sending, every recipient distinct), drained by
# SUPP_CLAIMERS claimers at batch SUPP_BATCH, three ways in each run:
#   none   the suppression list empty (the reference);
#   miss   SUPP_LIST global hard_bounce entries, none of them a drained
#          recipient;
#   hit10  SUPP_LIST entries, one in ten drained recipients among them
#          (those mails end suppressed, the others sent).
# The list is loaded (not timed), vacuumed and analyzed before it is
# measured; rate = mails finished (sent or suppressed) / wall time.  Also
# the median latency of the claim+ack rounds (pgbench's per-transaction
# log), and the server's CPU time per mail (every process of the cluster),
# which bursts of load from elsewhere on the machine move less.

# supp_cpu: CPU seconds the cluster has used so far: the postmaster's
# children still running, and (cutime, cstime) those it has reaped.
supp_cpu() {
	local pm
	pm=$(head -n 1 "$BK_DATA/postmaster.pid")
	{
		awk '{ print $14 + $15 + $16 + $17 }' "/proc/$pm/stat"
		for c in $(ps -o pid= --ppid "$pm"); do
			awk '{ print $14 + $15 }' "/proc/$c/stat" 2>/dev/null || true
		done
	} | awk -v hz="$(getconf CLK_TCK)" '{ t += $1 } END { printf "%.2f\n", t / hz }'
}

# supp_drain FIGURE RUN PREFIX SUPPRESSED: drain the preloaded mail, check
# that SUPPRESSED mails ended suppressed and the rest sent.
supp_drain() {
	local fig=$1 run=$2 prefix=$3 want=$4 t0 t1 got c0 c1
	DRAIN_N=$SUPP_N drain_preload bench_gated "$prefix"
	bk_only_queue bench_gated
	bk_settle
	t0=$(bk_now)
	rm -f "$BK_WORK/txlog.$fig.$run".*
	c0=$(supp_cpu)
	bk_pgbench "$BK_WORK/pgbench.$fig.$run.log" -f "$SQL/drain.sql" -D batch="$SUPP_BATCH" \
		-c "$SUPP_CLAIMERS" -j "$(bk_jobs "$SUPP_CLAIMERS")" -t $((SUPP_N / SUPP_BATCH / SUPP_CLAIMERS)) \
		-l --log-prefix="$BK_WORK/txlog.$fig.$run"
	t1=$(bk_now)
	# the claimers' backends have exited once only this session is left
	for _ in $(seq 1 50); do
		[ "$(bk_sql "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")" = 1 ] && break
		sleep 0.1
	done
	c1=$(supp_cpu)
	got=$(bk_sql "SELECT count(*) FILTER (WHERE state = 'sent') || ' ' || count(*) FILTER (WHERE state = 'suppressed')
				   FROM gatekeeper.mail_status")
	if [ "$got" != "$((SUPP_N - want)) $want" ]; then
		bk_sql "SELECT state, count(*) FROM gatekeeper.mail_status GROUP BY 1" >&2
		gk_die "$fig: expected $((SUPP_N - want)) sent and $want suppressed, got $got"
	fi
	bk_record "$fig" "$run" "$(bk_rate "$SUPP_N" "$t0" "$t1")"
	# the median claim(batch)+ack round of the clients: a burst of load
	# from elsewhere on the machine moves it less than the wall time
	bk_record "$fig.round" "$run" "$(perl "$BENCH/report.pl" --latency-median "$BK_WORK/txlog.$fig.$run".*)"
	# and the server CPU a mail cost (every process of the cluster, over
	# the drain): what load elsewhere on the machine moves least
	bk_record "$fig.cpu" "$run" "$(perl -e 'printf "%.2f", ($ARGV[1] - $ARGV[0]) * 1e6 / $ARGV[2]' "$c0" "$c1" "$SUPP_N")"
}

# supp_list_gone: the list holds SUPP_LIST entries none of which is a
# drained recipient.  supp_list_hits PREFIX: one in ten of the recipients
# PREFIX<i>@example.com replace as many of those entries (still SUPP_LIST).
supp_list_gone() {
	bk_sql "TRUNCATE gatekeeper.suppression_list;
			INSERT INTO gatekeeper.suppression_list (address, reason, detail)
			SELECT 'gone' || i || '@bounced.example', 'hard_bounce', '550 5.1.1 User unknown'
			  FROM generate_series(1, $SUPP_LIST) AS i" >/dev/null
	bk_sql "VACUUM ANALYZE gatekeeper.suppression_list"
}
supp_list_hits() {
	bk_sql "DELETE FROM gatekeeper.suppression_list
			 WHERE address IN (SELECT 'gone' || i || '@bounced.example' FROM generate_series(1, $SUPP_N / 10) AS i);
			INSERT INTO gatekeeper.suppression_list (address, reason, detail)
			SELECT '$1' || i || '@example.com', 'hard_bounce', '550 5.1.1 User unknown'
			  FROM generate_series(10, $SUPP_N, 10) AS i" >/dev/null
	[ "$(bk_sql "SELECT count(*) FROM gatekeeper.suppression_list")" = "$SUPP_LIST" ] ||
		gk_die "the suppression list does not hold $SUPP_LIST entries"
	bk_sql "VACUUM ANALYZE gatekeeper.suppression_list"
}

# Odd runs go none, miss, hit10; even runs hit10, miss, none, so that no
# variant always comes first (one load of the list a run either way).
scenario_suppression() {
	local run hits=$((SUPP_N / 10))
	for run in $(seq 1 "$RUNS"); do
		gk_log "suppression run $run: $SUPP_N mails, batch $SUPP_BATCH, $SUPP_CLAIMERS claimers; list of $SUPP_LIST"
		if [ $((run % 2)) = 1 ]; then
			bk_sql "TRUNCATE gatekeeper.suppression_list" >/dev/null
			supp_drain suppression.none "$run" "sn${run}_" 0
			supp_list_gone
			supp_drain suppression.miss "$run" "sm${run}_" 0
			supp_list_hits "sh${run}_"
			supp_drain suppression.hit10 "$run" "sh${run}_" "$hits"
			if [ "$run" = 1 ]; then
				bk_note suppression "$(supp_explain "sh${run}_")"
			fi
		else
			supp_list_gone
			supp_list_hits "sh${run}_"
			supp_drain suppression.hit10 "$run" "sh${run}_" "$hits"
			supp_list_gone
			supp_drain suppression.miss "$run" "sm${run}_" 0
			bk_sql "TRUNCATE gatekeeper.suppression_list" >/dev/null
			supp_drain suppression.none "$run" "sn${run}_" 0
		fi
	done
	bk_sql "TRUNCATE gatekeeper.suppression_list" >/dev/null
	bk_reset_mail
}

# supp_explain PREFIX: the claim's suppression probe for one batch of
# distinct recipients (as src/suppression.c runs it), with the list loaded:
# its plan, and buffers and time as EXPLAIN (ANALYZE, BUFFERS) reports them.
supp_explain() {
	bk_sql "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY ON)
			SELECT s.address, s.queue, s.reason FROM gatekeeper.suppression_list s
			 WHERE s.address = ANY (ARRAY(SELECT '$1' || i || '@example.com'
										   FROM generate_series(1, $SUPP_BATCH) AS i))" |
		tr -s ' ' | paste -sd ';' | sed 's/;/; /g' | sed 's/^/probe of a batch of '"$SUPP_BATCH"' recipients: /'
}

# ================================================================== backlog
#
# claim(1000) + ack_batch latency of one client (pgbench -M prepared, per-
# transaction log), with BACKLOG_TXNS rounds a run, over a due pool big
# enough for every run, at three backlogs:
#   small  BACKLOG_SMALL not-yet-due mails (send_at a day ahead)
#   big    BACKLOG_BIG not-yet-due mails
#   sent   BACKLOG_SMALL not-yet-due and BACKLOG_BIG sent mails retained
# All in the one queue the claim walks.  Each backlog has a database of its
# own (backlog_small, backlog_big, backlog_sent), loaded, vacuumed and
# analyzed once; then every run measures the three in turn, the order
# reversed in even runs, so that a drift of the machine's speed over the
# minutes of the scenario falls on the three alike.  The figure is the
# median transaction latency of each run.  No gatekeeper worker runs in
# these databases.

# backlog_measure DB FIGURE RUN: one run of BACKLOG_TXNS claim+ack rounds.
backlog_measure() {
	local db=$1 fig=$2 run=$3 log
	bk_settle
	log=$BK_WORK/pgbench.$fig.$run
	rm -f "$log".*
	BK_DB=$db bk_pgbench "$log.out" -f "$SQL/drain.sql" -D batch=1000 -c 1 -t "$BACKLOG_TXNS" -l --log-prefix="$log"
	bk_record "$fig" "$run" "$(perl "$BENCH/report.pl" --latency-median "$log".*[0-9])"
}

# backlog_load DB FUTURE SENT: a database DB with FUTURE not-yet-due and
# SENT sent mails in the bench queue, and enough due mails for every run.
backlog_load() {
	local db=$1 future=$2 sent=$3 due=$((RUNS * BACKLOG_TXNS * 1000 + 1000))
	bk_db_make "$db"
	BK_DB=$db bk_sql "CALL bench_load($future, 'w', 'bench', interval '1 day')"
	if [ "$sent" -gt 0 ]; then
		BK_DB=$db bk_sql "CALL bench_load($sent, 's', 'bench', interval '-1 day', 'sent')"
	fi
	BK_DB=$db bk_sql "CALL bench_load($due, 'n', 'bench', interval '-1 minute')"
	BK_DB=$db bk_only_queue bench
	BK_DB=$db bk_sql "VACUUM ANALYZE gatekeeper.mail, gatekeeper.mail_live, gatekeeper.mail_done"
	bk_note backlog "$(BK_DB=$db bk_sql "SELECT format('%s not-yet-due, %s sent, %s due: gatekeeper.mail is %s, its indexes %s; mail_live %s, mail_done %s (with indexes)',
		$future, $sent, $due,
		pg_size_pretty((SELECT sum(pg_table_size(relid)) FROM pg_partition_tree('gatekeeper.mail'))),
		pg_size_pretty((SELECT sum(pg_indexes_size(relid)) FROM pg_partition_tree('gatekeeper.mail'))),
		pg_size_pretty(pg_total_relation_size('gatekeeper.mail_live')),
		pg_size_pretty((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('gatekeeper.mail_done'))))")"
}

scenario_backlog() {
	local run fig order
	gk_log "backlog: loading $BACKLOG_SMALL not-yet-due"
	backlog_load backlog_small "$BACKLOG_SMALL" 0
	gk_log "backlog: loading $BACKLOG_BIG not-yet-due"
	backlog_load backlog_big "$BACKLOG_BIG" 0
	gk_log "backlog: loading $BACKLOG_SMALL not-yet-due, $BACKLOG_BIG sent retained"
	backlog_load backlog_sent "$BACKLOG_SMALL" "$BACKLOG_BIG"
	for run in $(seq 1 "$RUNS"); do
		order="small big sent"
		[ $((run % 2)) = 1 ] || order="sent big small"
		for fig in $order; do
			backlog_measure "backlog_$fig" "backlog.$fig" "$run"
		done
		gk_log "backlog run $run ($order) done"
	done
	for fig in small big sent; do
		BK_DB=postgres bk_sql "DROP DATABASE backlog_$fig WITH (FORCE)" >/dev/null
	done
}

# ================================================================== sustained
#
# SUSTAINED_WAVES consecutive waves: SUSTAINED_N mails enqueued by one
# INSERT ... SELECT (the bulk path, validation trigger and all), then
# drained by 4 claimers at batch 1000.  Default autovacuum, no VACUUM or
# CHECKPOINT between waves, sent mail retained.  As the storage scenario,
# a deployment with its own senders (bk_own_senders_begin): gatekeeper's
# background worker in the database does its housekeeping, nothing else.
# Run once, whatever --runs.
scenario_sustained() {
	local w t0 t1 t2 rate first= rates= vacuums rest
	bk_own_senders_begin
	vacuums=$(bk_live_vacuums)
	bk_settle
	for w in $(seq 1 "$SUSTAINED_WAVES"); do
		t0=$(bk_now)
		bk_sql "INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
				SELECT * FROM bench_rows($SUSTAINED_N, 'w${w}_', 'bench', interval '0')"
		t1=$(bk_now)
		bk_pgbench "$BK_WORK/pgbench.sustained.$w.log" -f "$SQL/drain.sql" -D batch=1000 \
			-c 4 -j "$(bk_jobs 4)" -t $((SUSTAINED_N / 1000 / 4))
		rest=$(bk_drain_rest 1000)
		t2=$(bk_now)
		[ "$rest" = 0 ] || bk_note sustained "wave $w: $rest mails left by the fixed rounds, claimed after them (timed)"
		[ "$(bk_unfinished)" = 0 ] ||
			gk_die "sustained wave $w left mail unsent"
		rate=$(bk_rate "$SUSTAINED_N" "$t1" "$t2")
		rates="$rates${rates:+, }$(printf '%.0f' "$rate")"
		gk_log "wave $w: enqueue $(bk_rate "$SUSTAINED_N" "$t0" "$t1")/s, drain $rate/s"
		[ -n "$first" ] || { first=$rate; bk_record sustained.first 1 "$rate"; }
		bk_note sustained "wave $w: enqueue $(printf '%.0f' "$(bk_rate "$SUSTAINED_N" "$t0" "$t1")") mails/s, drain $(printf '%.0f' "$rate") mails/s"
	done
	bk_record sustained.last 1 "$rate"
	bk_note sustained "$(bk_sql "SELECT format('after the waves: gatekeeper.mail is %s (indexes %s), mail_live %s, mail_done %s, mail_claim %s (with indexes and TOAST); autovacuum ran %s times, autoanalyze %s; %s dead tuples left',
		pg_size_pretty((SELECT sum(pg_table_size(relid)) FROM pg_partition_tree('gatekeeper.mail'))),
		pg_size_pretty((SELECT sum(pg_indexes_size(relid)) FROM pg_partition_tree('gatekeeper.mail'))),
		pg_size_pretty(pg_total_relation_size('gatekeeper.mail_live')),
		pg_size_pretty((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('gatekeeper.mail_done'))),
		pg_size_pretty(pg_total_relation_size('gatekeeper.mail_claim')),
		sum(autovacuum_count), sum(autoanalyze_count), sum(n_dead_tup))
		FROM pg_stat_user_tables WHERE schemaname = 'gatekeeper' AND relname ~ '^mail'")"
	bk_note sustained "during the waves mail_live was vacuumed $(($(bk_live_vacuums) - vacuums)) times by gatekeeper's vacuum worker"
	bk_own_senders_end
}

# ================================================================== storage
#
# STORAGE_WAVES waves of STORAGE_N mails with 1 kB bodies, each enqueued by
# one INSERT ... SELECT and drained to completion by 4 claimers at batch
# 1000, finished mail retained.  Then the on-disk size of the mail (heap,
# TOAST and indexes of gatekeeper.mail, mail_live, mail_done, mail_claim
# and mail_key) against
# the same rows' content in a plain table (bench_plain: identity primary
# key, nothing else), and the drain rate of the last wave against the
# first.  As a deployment with its own senders runs (bk_own_senders_begin).
# Each wave's drain takes about two seconds, so one wave's rate is a noisy
# sample (this machine's speed drifts by a third over minutes): the
# scenario runs --runs times like every other (five in a full run), each
# from empty tables, and reports medians.
#
# Between a wave's enqueue and its drain the mail tables are vacuumed (not
# timed into the drain; the VACUUM's own time is a figure, first wave and
# last).  The line asks whether the mail retained slows the drain.  Every
# row here is less than a minute old, so without this the first vacuum of
# all of it (autovacuum's, one pass a minute, a run lasting about as long)
# fell into one late wave and was counted as the drain's; in a deployment
# retained mail has been vacuumed long before, and each vacuum covers what
# came since the last.  PARALLEL 0 as autovacuum runs it: a manual VACUUM
# of a table with two indexes otherwise zeroes a parallel dead-item array
# sized by the whole table, a cost that grows with retention and that
# autovacuum never pays.  bench/notes.md, 2026-11-30.
scenario_storage() {
	local run w t0 t1 tv vac rate vacuums cp0 cps fpi0 fpi waves background rest
	bk_own_senders_begin
	vacuums=$(bk_live_vacuums)
	for run in $(seq 1 "$RUNS"); do
		bk_reset_mail
		bk_settle
		waves=
		for w in $(seq 1 "$STORAGE_WAVES"); do
			# a checkpoint the enqueue's WAL begins goes on through the drain
			cp0=$(bk_checkpoints)
			bk_sql "INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
					SELECT * FROM bench_rows($STORAGE_N, 's${w}_', 'bench', interval '0')"
			tv=$(bk_now)
			bk_sql "VACUUM (PARALLEL 0) gatekeeper.mail, gatekeeper.mail_live, gatekeeper.mail_run, gatekeeper.mail_claim,
					gatekeeper.mail_key, gatekeeper.mail_done"
			vac=$(bk_elapsed "$tv" "$(bk_now)")
			[ "$w" -gt 1 ] || bk_record storage.vacuum_first "$run" "$(perl -e 'print $ARGV[0] * 1000' "$vac")"
			[ "$w" -lt "$STORAGE_WAVES" ] || bk_record storage.vacuum_last "$run" "$(perl -e 'print $ARGV[0] * 1000' "$vac")"
			fpi0=$(bk_sql "SELECT wal_fpi FROM pg_stat_wal")
			t0=$(bk_now)
			bk_pgbench "$BK_WORK/pgbench.storage.$run.$w.log" -f "$SQL/drain.sql" -D batch=1000 \
				-c 4 -j "$(bk_jobs 4)" -t $((STORAGE_N / 1000 / 4))
			rest=$(bk_drain_rest 1000)
			t1=$(bk_now)
			[ "$rest" = 0 ] || bk_note storage "run $run wave $w: $rest mails left by the fixed rounds, claimed after them (timed)"
			cps=$(($(bk_checkpoints) - cp0))
			fpi=$(($(bk_sql "SELECT wal_fpi FROM pg_stat_wal") - fpi0))
			background=$(bk_background_work "$t0")
			[ "$(bk_unfinished)" = 0 ] ||
				gk_die "storage wave $w left mail unsent"
			rate=$(bk_rate "$STORAGE_N" "$t0" "$t1")
			gk_log "storage run $run wave $w: drain $rate/s"
			[ "$w" -gt 1 ] || bk_record storage.first "$run" "$rate"
			waves="$waves${waves:+, }$(printf '%.0f' "$rate")"
			waves="$waves (drain from $(date -u -d "@${t0%.*}" +%T) UTC after a VACUUM of $vac s, $fpi full-page images written during the drain"
			[ "$cps" = 0 ] || waves="$waves, $cps checkpoints began during its enqueue or drain"
			[ -z "$background" ] || waves="$waves; during it: $background"
			waves="$waves)"
		done
		bk_record storage.last "$run" "$rate"
		bk_note storage "run $run: waves drained at $waves mails/s"
		bk_sql "INSERT INTO bench_plain (queue, recipient, subject, body, send_at)
				SELECT queue, recipient, subject, body, send_at FROM gatekeeper.mail" >/dev/null
		bk_record storage.size_plain "$run" "$(bk_sql "SELECT pg_total_relation_size('bench_plain') / 1048576.0")"
		bk_record storage.size_gk "$run" "$(bk_sql "SELECT sum(pg_total_relation_size(t.relid)) / 1048576.0
			FROM (SELECT relid FROM pg_partition_tree('gatekeeper.mail')
				  UNION ALL SELECT relid FROM pg_partition_tree('gatekeeper.mail_done')
				  UNION ALL SELECT 'gatekeeper.mail_live'::regclass
				  UNION ALL SELECT 'gatekeeper.mail_claim'::regclass
				  UNION ALL SELECT 'gatekeeper.mail_key'::regclass) t")"
	done
	bk_note storage "$(bk_sql "SELECT format('the last run, after %s waves of %s: gatekeeper.mail %s (heap and TOAST %s, indexes %s), mail_live %s, mail_done %s, mail_claim %s, mail_key %s (with indexes and TOAST); the same rows in a plain table %s',
		$STORAGE_WAVES, $STORAGE_N,
		pg_size_pretty(sum(pg_total_relation_size(relid)) FILTER (WHERE t = 'mail')),
		pg_size_pretty(sum(pg_table_size(relid)) FILTER (WHERE t = 'mail')),
		pg_size_pretty(sum(pg_indexes_size(relid)) FILTER (WHERE t = 'mail')),
		pg_size_pretty(sum(pg_total_relation_size(relid)) FILTER (WHERE t = 'live')),
		pg_size_pretty(sum(pg_total_relation_size(relid)) FILTER (WHERE t = 'done')),
		pg_size_pretty(sum(pg_total_relation_size(relid)) FILTER (WHERE t = 'claim')),
		pg_size_pretty(sum(pg_total_relation_size(relid)) FILTER (WHERE t = 'key')),
		pg_size_pretty(pg_total_relation_size('bench_plain')))
		FROM (SELECT 'mail' AS t, relid FROM pg_partition_tree('gatekeeper.mail')
			  UNION ALL SELECT 'done', relid FROM pg_partition_tree('gatekeeper.mail_done')
			  UNION ALL SELECT 'live', 'gatekeeper.mail_live'::regclass
			  UNION ALL SELECT 'claim', 'gatekeeper.mail_claim'::regclass
			  UNION ALL SELECT 'key', 'gatekeeper.mail_key'::regclass) p")"
	bk_note storage "$(bk_sql "SELECT format('during the waves mail_live was vacuumed %s times by gatekeeper''s vacuum worker; autovacuum %s times since the database was made',
		vacuum_count - $vacuums, autovacuum_count) FROM pg_stat_user_tables WHERE relid = 'gatekeeper.mail_live'::regclass")"
	bk_own_senders_end
}

# ================================================================== stats
#
# What a Prometheus scrape costs: the latency of SELECT * FROM
# gatekeeper.queue_stats and of gatekeeper.worker_status (pgbench, one
# client, STATS_CALLS calls a run, per-call log; median per run) with
# STATS_SMALL and then STATS_BIG finished mails retained (mail_done), plus
# 2,000 mails enqueued through the trigger of which 1,000 are claimed and
# acked (so the totals count something) and 1,000 left due.  The retained
# mail is loaded in bulk past the triggers (short content: only its
# number matters here).  At STATS_BIG also one scrape of Debian's
# prometheus-postgres-exporter with monitoring/queries.yaml, when it is
# installed, and the reference: the count over the finished mail that
# queue_stats did before it kept totals.  Then the same views with a live
# backlog added: STATS_BIG mails scheduled for tomorrow, STATS_SMALL due.

# stats_load_done N: add N finished mails (sent, failed, suppressed) to
# the retained ones, in slices of a million.
stats_load_done() {
	local n=$1 from to
	from=$(($(bk_sql "SELECT coalesce(max(id), 0) FROM gatekeeper.mail") + 1))
	while [ "$n" -gt 0 ]; do
		to=$((from + (n > 1000000 ? 1000000 : n) - 1))
		bk_sql "SET session_replication_role = replica;
			WITH m AS (
				INSERT INTO gatekeeper.mail (id, queue, recipient, subject, body, send_at)
				SELECT i, 'bench', 'd' || i || '@example.com', 's', 'b', now() - interval '1 day'
				  FROM generate_series($from, $to) AS i
				RETURNING id, queue, send_at, segment)
			INSERT INTO gatekeeper.mail_done (id, queue, state, attempt, send_at, finished_at, segment)
			SELECT id, queue, (ARRAY['sent', 'sent', 'sent', 'failed', 'suppressed'])[1 + id % 5]::gatekeeper.state,
				   1, send_at, now() - interval '1 hour', segment
			  FROM m" >/dev/null
		n=$((n - (to - from + 1)))
		from=$((to + 1))
	done
	bk_sql "SELECT setval('gatekeeper.mail_id_seq', (SELECT max(id) FROM gatekeeper.mail))" >/dev/null
}

# stats_load_live N DUE_IN: add N scheduled mails, due at now() + DUE_IN,
# with their live rows, in slices of a million, past the insert trigger
# (the live counts' triggers count them).
stats_load_live() {
	local n=$1 due_in=$2 from to
	from=$(($(bk_sql "SELECT coalesce(max(id), 0) FROM gatekeeper.mail") + 1))
	while [ "$n" -gt 0 ]; do
		to=$((from + (n > 1000000 ? 1000000 : n) - 1))
		bk_sql "SET session_replication_role = replica;
			WITH m AS (
				INSERT INTO gatekeeper.mail (id, queue, recipient, subject, body, send_at)
				SELECT i, 'bench', 'l' || i || '@example.com', 's', 'b', now() + interval '$due_in'
				  FROM generate_series($from, $to) AS i
				RETURNING id, queue, priority, send_at, segment)
			INSERT INTO gatekeeper.mail_live (id, queue, priority, send_at, segment)
			SELECT id, queue, priority, send_at, segment FROM m" >/dev/null
		n=$((n - (to - from + 1)))
		from=$((to + 1))
	done
	bk_sql "SELECT setval('gatekeeper.mail_id_seq', (SELECT max(id) FROM gatekeeper.mail))" >/dev/null
}

# stats_reference FIGURE SQL: RUNS runs of 3 calls of SQL, a count that
# a view did before it kept its numbers.
stats_reference() {
	local fig=$1 sql=$2 run log
	printf '%s\n' "$sql" >"$BK_WORK/$fig.sql"
	for run in $(seq 1 "$RUNS"); do
		log=$BK_WORK/pgbench.$fig.$run
		rm -f "$log".*
		bk_pgbench "$log.out" -f "$BK_WORK/$fig.sql" -c 1 -t 3 -l --log-prefix="$log"
		bk_record "$fig" "$run" "$(perl "$BENCH/report.pl" --latency-median "$log".*[0-9])"
	done
}

# stats_measure SIZE: RUNS runs of STATS_CALLS calls of each view.
stats_measure() {
	local size=$1 run view log plan
	bk_sql "VACUUM ANALYZE gatekeeper.mail, gatekeeper.mail_live, gatekeeper.mail_done" >/dev/null
	bk_note stats "$(bk_sql "SELECT format('%s finished mails retained (mail_done %s with indexes), %s live; queue_stats of bench: %s',
		(SELECT count(*) FROM gatekeeper.mail_done),
		pg_size_pretty((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('gatekeeper.mail_done'))),
		(SELECT count(*) FROM gatekeeper.mail_live),
		(SELECT row_to_json(s) FROM gatekeeper.queue_stats s WHERE queue = 'bench'))")"
	# what the plans read: the live mail, the queues, functions; never mail_done
	for view in queue_stats worker_status; do
		plan=$(bk_sql "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) SELECT * FROM gatekeeper.$view")
		bk_note stats "$size: $view's plan: $(printf '%s\n' "$plan" |
			grep -oE '(Seq|Index|Index Only|Bitmap Heap|Function) Scan( using [a-z_]+)? on [a-z_]+' |
			sort -u | paste -sd, -) (first buffers line, planning's when execution read none: $(printf '%s\n' "$plan" | grep -m1 -oE 'shared hit=[0-9]+( read=[0-9]+)?' || echo 'no buffers'))"
	done
	printf 'SELECT * FROM gatekeeper.queue_stats;\n' >"$BK_WORK/stats_queue.sql"
	printf 'SELECT * FROM gatekeeper.worker_status;\n' >"$BK_WORK/stats_worker.sql"
	for run in $(seq 1 "$RUNS"); do
		for view in queue worker; do
			log=$BK_WORK/pgbench.stats.$view.$size.$run
			rm -f "$log".*
			bk_pgbench "$log.out" -f "$BK_WORK/stats_$view.sql" -c 1 -t "$STATS_CALLS" -l --log-prefix="$log"
			bk_record "stats.$view.$size" "$run" "$(perl "$BENCH/report.pl" --latency-median "$log".*[0-9])"
		done
	done
}

# stats_scrape_once URL: the wall time of one GET of URL, in ms.
stats_scrape_once() {
	perl -MHTTP::Tiny -MTime::HiRes=time -e '
		my $t = time; my $r = HTTP::Tiny->new(timeout => 30)->get($ARGV[0]);
		die "scrape failed: $r->{status}\n" unless $r->{success};
		printf "%.3f\n", (time - $t) * 1000' "$1"
}

# stats_scrape FIGURE QUERIES [FLAGS...]: start the exporter with the
# queries file QUERIES (none when empty) and FLAGS, scrape it once to
# warm up (it connects to the server then), then RUNS times as FIGURE.
stats_scrape() {
	local fig=$1 queries=$2 port run
	shift 2
	port=$(gk_free_port "$BK_PGPORT")
	DATA_SOURCE_NAME="host=127.0.0.1 port=$BK_PGPORT user=postgres dbname=bench sslmode=disable" \
		bk_start_bg exporter "$BK_WORK" /usr/bin/prometheus-postgres-exporter \
		--web.listen-address="127.0.0.1:$port" ${queries:+--extend.query-path="$queries"} "$@"
	bk_wait_port "$port" || { bk_stop_bg exporter; gk_die "the exporter did not listen on $port"; }
	stats_scrape_once "http://127.0.0.1:$port/metrics" >/dev/null
	if [ -n "$queries" ] && ! perl -MHTTP::Tiny -e 'exit(HTTP::Tiny->new->get($ARGV[0])->{content} =~ /^gatekeeper_queue_sent_total/m ? 0 : 1)' \
		"http://127.0.0.1:$port/metrics"; then
		bk_stop_bg exporter
		gk_die "the exporter serves no gatekeeper_queue_sent_total"
	fi
	for run in $(seq 1 "$RUNS"); do
		if [ -n "$fig" ]; then
			bk_record "$fig" "$run" "$(stats_scrape_once "http://127.0.0.1:$port/metrics")"
		else
			bk_note stats "a scrape of the exporter started as the README starts it (its own database and bgwriter collectors on too): $(stats_scrape_once "http://127.0.0.1:$port/metrics") ms"
			break
		fi
	done
	bk_stop_bg exporter
}

scenario_stats() {
	local run log
	bk_reset_mail
	bk_only_queue bench
	bk_sql "INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
			SELECT * FROM bench_rows(2000, 'st', 'bench', interval '-1 minute')" >/dev/null
	bk_sql "SELECT count(*) FILTER (WHERE gatekeeper.ack(c.id, c.attempt))
			  FROM gatekeeper.claim('bench-stats', 1000, '5 minutes', '{bench}') AS c" >/dev/null
	stats_load_done "$STATS_SMALL"
	stats_measure small
	gk_log "stats: loading $STATS_BIG finished mails"
	stats_load_done $((STATS_BIG - STATS_SMALL))
	stats_measure big
	if [ -x /usr/bin/prometheus-postgres-exporter ]; then
		# gatekeeper's queries alone (the exporter's own collectors off), then
		# the exporter with nothing to query (its own cost), then as the
		# README starts it (its database collector sizes every database)
		stats_scrape stats.scrape.big "$ROOT/monitoring/queries.yaml" --disable-default-metrics \
			--disable-settings-metrics --no-collector.database --no-collector.bgwriter
		stats_scrape stats.scrape.bare "" --disable-default-metrics \
			--disable-settings-metrics --no-collector.database --no-collector.bgwriter
		stats_scrape "" "$ROOT/monitoring/queries.yaml"
	else
		bk_skip stats.scrape.big "/usr/bin/prometheus-postgres-exporter is not installed"
	fi
	stats_reference stats.scan.big 'SELECT d.queue, d.state, count(*) FROM gatekeeper.mail_done d GROUP BY 1, 2;'
	# a live backlog as well: STATS_BIG mails scheduled for tomorrow and
	# STATS_SMALL due now, and the reference: the count over the live mail
	# that queue_stats did before it kept live counts
	gk_log "stats: loading $STATS_BIG scheduled mails"
	stats_load_live "$STATS_BIG" '1 day'
	stats_load_live "$STATS_SMALL" '-1 minute'
	stats_measure live
	stats_reference stats.livescan.live 'SELECT l.queue, l.state, count(*) FROM gatekeeper.mail_live l GROUP BY 1, 2;'
	bk_reset_mail
}

# ================================================================== gates
#
#   batch     gate_pass_batch(gate, text[]) with 1,000 new recipients a call, 4
#             clients, GATE_BATCH_TXNS calls each: passes/s
#   ceiling   the same keys INSERTed ... ON CONFLICT DO NOTHING into a bare
#             2-column table (informative: the machine's ceiling)
#   single    gate_pass(gate, recipient) for new recipients, 4 clients,
#             GATE_SINGLE_TXNS calls each, synchronous_commit on and off
#   redis     redis-server (no persistence) on loopback, redis-benchmark
#             SET key:__rand_int__ v NX EX 57600 (16 hours, as smart
#             sending) with -r 100000000, 4 clients, pipelined -P 64 and not
#
# Gate passes live in shared memory and are logged in gatekeeper.gate_log;
# truncating the log between measurements does not empty the gates, so
# every measurement passes recipients of its own (the run number, and for
# single calls which of the two it is, is part of every name).
scenario_gates() {
	local run t0 t1 port out rps
	port=$(gk_free_port "$BK_PGPORT")
	mkdir -p "$BK_WORK/redis"
	bk_start_bg redis "$BK_WORK/redis" redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
		--dir "$BK_WORK/redis" --daemonize no --loglevel warning
	bk_wait_port "$port" || gk_die "redis-server did not start (see $BK_WORK/redis.err)"
	bk_only_queue bench
	for run in $(seq 1 "$RUNS"); do
		bk_reset_mail
		bk_settle
		t0=$(bk_now)
		bk_pgbench "$BK_WORK/pgbench.gates.batch.$run.log" -f "$SQL/gate_batch.sql" -D run="$run" -D i=0 \
			-c 4 -j "$(bk_jobs 4)" -t "$GATE_BATCH_TXNS"
		t1=$(bk_now)
		[ "$(bk_sql "SELECT sum(cardinality(recipients)) FROM gatekeeper.gate_log WHERE NOT released")" = $((4 * GATE_BATCH_TXNS * 1000)) ] ||
			gk_die "batch gate_pass did not pass every new recipient"
		bk_record gates.batch "$run" "$(bk_rate $((4 * GATE_BATCH_TXNS * 1000)) "$t0" "$t1")"

		bk_settle
		t0=$(bk_now)
		bk_pgbench "$BK_WORK/pgbench.gates.ceiling.$run.log" -f "$SQL/gate_ceiling.sql" -D run="$run" -D i=0 \
			-c 4 -j "$(bk_jobs 4)" -t "$GATE_BATCH_TXNS"
		t1=$(bk_now)
		bk_record gates.ceiling "$run" "$(bk_rate $((4 * GATE_BATCH_TXNS * 1000)) "$t0" "$t1")"

		bk_reset_mail
		bk_settle
		t0=$(bk_now)
		bk_pgbench "$BK_WORK/pgbench.gates.single_on.$run.log" -f "$SQL/gate_single.sql" -D run="$((run * 10 + 1))" -D i=0 \
			-c 4 -j "$(bk_jobs 4)" -t "$GATE_SINGLE_TXNS"
		t1=$(bk_now)
		bk_record gates.single_on "$run" "$(bk_rate $((4 * GATE_SINGLE_TXNS)) "$t0" "$t1")"

		bk_reset_mail
		bk_settle
		t0=$(bk_now)
		PGOPTIONS='-c synchronous_commit=off' \
			bk_pgbench "$BK_WORK/pgbench.gates.single_off.$run.log" -f "$SQL/gate_single.sql" -D run="$((run * 10 + 2))" -D i=0 \
			-c 4 -j "$(bk_jobs 4)" -t "$GATE_SINGLE_TXNS"
		t1=$(bk_now)
		[ "$(bk_sql "SELECT sum(cardinality(recipients)) FROM gatekeeper.gate_log WHERE NOT released")" = $((4 * GATE_SINGLE_TXNS)) ] ||
			gk_die "single gate_pass did not pass every new recipient"
		bk_record gates.single_off "$run" "$(bk_rate $((4 * GATE_SINGLE_TXNS)) "$t0" "$t1")"

		for p in 64 1; do
			redis-cli -h 127.0.0.1 -p "$port" FLUSHALL >/dev/null
			out=$(redis-benchmark -h 127.0.0.1 -p "$port" -q -c 4 -P "$p" -r 100000000 \
				-n "$([ "$p" = 1 ] && echo "$REDIS_N" || echo "$REDIS_P_N")" \
				SET key:__rand_int__ v NX EX 57600 2>&1 | tr '\r' '\n' | grep 'requests per second' | tail -n 1)
			rps=$(printf '%s\n' "$out" | sed -n 's/.*: \([0-9.]*\) requests per second.*/\1/p')
			[ -n "$rps" ] || gk_die "could not read redis-benchmark's result: $out"
			bk_record "gates.redis_p$p" "$run" "$rps"
		done
	done
	bk_stop_bg redis
	bk_reset_mail
}

# ================================================================== reports
#
# Issue 27: a bounce storm.  REPORTS_N mails loaded as sent (with the
# Message-IDs gatekeeper writes, keyed since issue 44), then:
#   ingest    one DSN per mail (bench_dsn: Postfix's shape, about 4 kB,
#             half 5.1.1, half 5.2.2) through ingest_report(), by one
#             statement in one backend: reports/s on one core, every one
#             recorded (an event, and a suppression or a soft-bounce count)
#   event     EVENTS_N record_event() calls (a webhook's 'delivered') by one
#             statement: events/s
#   enqueue   the same number of enqueue() calls by one statement, in the
#             same run: the reference
scenario_reports() {
	local run t0 t1 n
	bk_sql "$(cat "$SQL/reports.sql")" >/dev/null
	for run in $(seq 1 "$RUNS"); do
		bk_reset_mail
		bk_sql "TRUNCATE gatekeeper.event_log, gatekeeper.suppression_list" >/dev/null
		bk_sql "CALL bench_load($REPORTS_N, 'rp', 'bench', interval '0', 'sent')" >/dev/null
		bk_sql "UPDATE gatekeeper.mail_done SET message_id = gatekeeper._message_id(id, NULL, 'example.com', '');
				DROP TABLE IF EXISTS bench_dsns;
				CREATE TABLE bench_dsns AS
				SELECT 'bounces+' || gatekeeper._verp_token(m.id) || '@bounce.example.com' AS envelope_to,
					   bench_dsn(gatekeeper._verp_token(m.id), m.recipient, gatekeeper._message_id(m.id, NULL, 'example.com', ''),
								 CASE WHEN m.id % 2 = 0 THEN '5.1.1' ELSE '5.2.2' END, m.id) AS message
				  FROM gatekeeper.mail m" >/dev/null
		bk_sql "VACUUM ANALYZE bench_dsns" >/dev/null
		bk_settle
		t0=$(bk_now)
		n=$(bk_sql "SELECT count(*) FROM bench_dsns d, LATERAL gatekeeper.ingest_report(d.message, d.envelope_to) r")
		t1=$(bk_now)
		[ "$n" = "$REPORTS_N" ] || gk_die "ingest_report recorded $n of $REPORTS_N reports"
		bk_record reports.ingest "$run" "$(bk_rate "$REPORTS_N" "$t0" "$t1")"
		bk_note reports "run $run: $(bk_sql "SELECT avg(octet_length(message))::int FROM bench_dsns") octets per DSN; $(bk_sql "SELECT count(*) FROM gatekeeper.suppression") suppressions written"

		bk_reset_mail
		bk_sql "TRUNCATE gatekeeper.event_log, gatekeeper.suppression_list" >/dev/null
		bk_sql "CALL bench_load($EVENTS_N, 'ev', 'bench', interval '0', 'sent')" >/dev/null
		bk_sql "UPDATE gatekeeper.mail_done SET message_id = gatekeeper._message_id(id, NULL, 'example.com', '')" >/dev/null
		bk_sql "VACUUM ANALYZE gatekeeper.mail_done" >/dev/null
		bk_settle
		t0=$(bk_now)
		n=$(bk_sql "SELECT count(gatekeeper.record_event(d.message_id, 'delivered', '2.0.0', '250 2.0.0 Ok: queued'))
					  FROM gatekeeper.mail_done d")
		t1=$(bk_now)
		[ "$(bk_sql "SELECT count(*) FROM gatekeeper.event_log WHERE event = 'delivered'")" = "$EVENTS_N" ] ||
			gk_die "record_event lost events"
		bk_record reports.record_event "$run" "$(bk_rate "$EVENTS_N" "$t0" "$t1")"

		bk_reset_mail
		bk_settle
		t0=$(bk_now)
		bk_sql "SELECT count(gatekeeper.enqueue('q' || i || '@example.com', 'Subject ' || i, bench_body(i), 'bench'))
				  FROM generate_series(1, $EVENTS_N) AS i" >/dev/null
		t1=$(bk_now)
		bk_record reports.enqueue "$run" "$(bk_rate "$EVENTS_N" "$t0" "$t1")"
	done
	bk_sql "DROP TABLE IF EXISTS bench_dsns; TRUNCATE gatekeeper.event_log, gatekeeper.suppression_list" >/dev/null
	bk_reset_mail
}

# ================================================================== delivery
#
# The cluster is restarted with the worker in the bench database,
# smtp_url at a loopback smtp-sink, 16 connections.  Then:
#   rate      DELIVERY_N due mails committed in one INSERT; time from the
#             commit until smtp-sink has counted them all
#   latency   one due mail committed (enqueue); time until smtp-sink counts
#             it; DELIVERY_LAT times: median and p99
#   reference smtp-source -s 16 -d -m DELIVERY_N -l BODY_BYTES into the same
#             sink (16 parallel sessions, each reusing its connection)
# smtp-sink throws the mail away and counts it (-c).

# sink_count: messages smtp-sink has received so far.
sink_count() {
	perl "$BENCH/sink.pl" count "$BK_WORK/sink.out"
}

# delivery_settled: wait up to 60 s for the worker to record every outcome.
delivery_settled() {
	local i
	for i in $(seq 1 300); do
		[ "$(bk_unfinished)" = 0 ] && return 0
		sleep 0.2
	done
	return 1
}

# delivery_rate FIGURE RUN PREFIX: commit DELIVERY_N due mails and record
# FIGURE, the rate until smtp-sink has counted them all; then wait for the
# worker(s) to record every outcome.  Fails, with what went wrong in
# DELIVERY_MISSED, when they do not all arrive in time.
DELIVERY_MISSED=
delivery_rate() {
	local fig=$1 run=$2 prefix=$3 c0 t0 t1
	bk_reset_mail
	bk_settle
	c0=$(sink_count)
	bk_sql "INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
			SELECT * FROM bench_rows($DELIVERY_N, '$prefix', 'default', interval '0')"
	t0=$(bk_now)
	if ! t1=$(perl "$BENCH/sink.pl" wait "$BK_WORK/sink.out" $((c0 + DELIVERY_N)) $((60 + DELIVERY_N / 100))); then
		DELIVERY_MISSED="$(($(sink_count) - c0)) of $DELIVERY_N mails reached smtp-sink in time ($(bk_sql "SELECT string_agg(state || ' ' || n, ', ') FROM (SELECT state, count(*) n FROM gatekeeper.mail_status GROUP BY 1) s"))"
		return 1
	fi
	bk_record "$fig" "$run" "$(bk_rate "$DELIVERY_N" "$t0" "$t1")"
	# let the worker(s) record every outcome before the next measurement
	delivery_settled || gk_warn "the worker had not recorded every outcome after 60 s"
}

scenario_delivery() {
	local port run t0 t1 c0 res reason=
	port=$(gk_free_port "$BK_PGPORT")
	mkdir -p "$BK_WORK/sink"
	chmod 777 "$BK_WORK/sink"
	bk_start_bg sink "$BK_WORK/sink" /usr/sbin/smtp-sink -u postfix -c -m 64 "127.0.0.1:$port" 256
	bk_wait_port "$port" || gk_die "smtp-sink did not start"
	bk_cluster_conf "gatekeeper.database = 'bench'
gatekeeper.smtp_url = 'smtp://127.0.0.1:$port'
gatekeeper.smtp_connections = 16
gatekeeper.default_sender = 'bench@example.com'"
	bk_cluster_restart
	bk_only_queue default
	bk_reset_mail

	# is there a worker that delivers?  One mail, 30 seconds.
	c0=$(sink_count)
	bk_sql "SELECT gatekeeper.enqueue('probe@example.com', 'probe', 'probe')" >/dev/null
	if ! perl "$BENCH/sink.pl" wait "$BK_WORK/sink.out" $((c0 + 1)) 30 >/dev/null; then
		reason="no mail reached smtp-sink within 30 s of a commit ($(bk_sql "SELECT coalesce(string_agg(state || ': ' || coalesce(last_error, '-'), '; '), 'no mail') FROM gatekeeper.mail_status"))"
	fi
	bk_sql "SELECT 1 FROM pg_stat_activity WHERE backend_type LIKE 'gatekeeper%' LIMIT 1" | grep -q 1 ||
		reason="${reason:-}${reason:+; }no gatekeeper worker in pg_stat_activity"

	for run in $(seq 1 "$RUNS"); do
		c0=$(sink_count)
		t0=$(bk_now)
		/usr/sbin/smtp-source -s 16 -d -m "$DELIVERY_N" -l "$BODY_BYTES" -f bench@example.com \
			-t sink@example.com "127.0.0.1:$port" >/dev/null 2>&1 || gk_die "smtp-source failed"
		t1=$(bk_now)
		[ "$(sink_count)" -ge $((c0 + DELIVERY_N)) ] || gk_die "smtp-sink did not count smtp-source's mail"
		bk_record delivery.smtp_source "$run" "$(bk_rate "$DELIVERY_N" "$t0" "$t1")"

		if [ -n "$reason" ]; then
			continue
		fi
		if ! delivery_rate delivery.rate "$run" "r${run}_"; then
			reason="run $run: $DELIVERY_MISSED"
			continue
		fi

		res=$(perl "$BENCH/sink.pl" latency "$BK_WORK/sink.out" "$DELIVERY_LAT" 10 -- \
			psql -X -q -At -h 127.0.0.1 -p "$BK_PGPORT" -U postgres -d bench -c \
			"SELECT gatekeeper.enqueue('lat@example.com', 'latency', bench_body(1))" -c \
			"SELECT extract(epoch FROM clock_timestamp())") || {
			reason="run $run: a single mail did not reach smtp-sink within 10 s"
			continue
		}
		bk_record delivery.lat_median "$run" "${res% *}"
		bk_record delivery.lat_p99 "$run" "${res#* }"
	done
	if [ -n "$reason" ]; then
		for f in delivery.rate delivery.lat_median delivery.lat_p99; do
			bk_skip "$f" "$reason"
		done
	fi

	# the same 16 connections, shared by two workers
	if [ -z "$reason" ]; then
		bk_cluster_conf "gatekeeper.database = 'bench'
gatekeeper.smtp_url = 'smtp://127.0.0.1:$port'
gatekeeper.workers = 2
gatekeeper.smtp_connections = 8
gatekeeper.default_sender = 'bench@example.com'"
		bk_cluster_restart
		for run in $(seq 1 "$RUNS"); do
			if ! delivery_rate delivery.rate_2w "$run" "w${run}_"; then
				bk_skip delivery.rate_2w "run $run: $DELIVERY_MISSED"
				break
			fi
		done
	fi
	bk_stop_bg sink
	bk_cluster_conf ""
	bk_cluster_restart
	bk_reset_mail
}

# ================================================================== relays
#
# The relays a user meets (issue 10), each measured twice in the same run,
# through the same endpoint: the worker (smtp_connections = 16; time from
# the commit of N due mails until smtp-sink has counted them) and
# smtp-source -s 16 -d (16 sessions, connections reused, the same body
# size):
#   loopback  smtp-sink -c on loopback
#   rtt20     the same smtp-sink behind t/delay_proxy.py, which adds 10 ms to
#             every chunk each way: a relay 20 ms away.  The proxy counts
#             the chunks each client wrote (about one per round trip it
#             waited for): noted per mail for both clients.
#   slow_eod  smtp-sink -c -W .:1, a second for each end-of-data: the
#             parallel bound is 16 connections / 1 s = 16 mails/s
# smtp-sink counts and discards (-c).

# relays_port_ok NAME PORT: wait up to 10 s until what bk_start_bg NAME
# started accepts on PORT; false at once if it exited (a port taken since
# gk_free_port looked, e.g. by the local end of a loopback connection).
relays_port_ok() {
	local var="BK_PID_$1" i
	for i in $(seq 1 100); do
		kill -0 "${!var}" 2>/dev/null || return 1
		gk_port_free "$2" || return 0
		sleep 0.1
	done
	return 1
}

# relays_sink NAME [ARGS...]: start smtp-sink -c on a free port, set
# RELAYS_PORT to it; its counter is read from $BK_WORK/NAME.out.
relays_sink() {
	local name=$1 try
	shift
	mkdir -p "$BK_WORK/$name"
	chmod 777 "$BK_WORK/$name"
	for try in 1 2 3 4 5; do
		RELAYS_PORT=$(gk_free_port "$BK_PGPORT")
		bk_start_bg "$name" "$BK_WORK/$name" /usr/sbin/smtp-sink -u postfix -c "$@" "127.0.0.1:$RELAYS_PORT" 256
		relays_port_ok "$name" "$RELAYS_PORT" && return 0
		bk_stop_bg "$name"
	done
	gk_die "smtp-sink $name did not start (see $BK_WORK/$name.err)"
}

# relays_proxy NAME TARGET: the delaying proxy, 10 ms each way, to
# 127.0.0.1:TARGET, on a free port: RELAYS_PORT.
relays_proxy() {
	local try
	for try in 1 2 3 4 5; do
		RELAYS_PORT=$(gk_free_port "$2")
		bk_start_bg "$1" "$BK_WORK" /usr/bin/python3 "$ROOT/t/delay_proxy.py" --listen "$RELAYS_PORT" \
			--target "$2" --delay-ms 10 --log "$BK_WORK/$1.log" --lifetime 3600
		relays_port_ok "$1" "$RELAYS_PORT" && return 0
		bk_stop_bg "$1"
	done
	gk_die "delay proxy $1 did not start (see $BK_WORK/$1.err)"
}

# relays_chunks NAME: the chunks the proxy's clients wrote (its exit line).
relays_chunks() {
	sed -n 's/.*exit: .* chunks_up=\([0-9]*\).*/\1/p' "$BK_WORK/$1.log" | tail -n 1
}

# relays_source VARIANT N SINK PORT TIMEOUT: smtp-source -s 16 -d, N mails
# through 127.0.0.1:PORT (counted by SINK), RUNS times: relays.VARIANT.source.
relays_source() {
	local v=$1 n=$2 sink=$3 port=$4 timeout=$5 run c0 t0 t1
	for run in $(seq 1 "$RUNS"); do
		c0=$(perl "$BENCH/sink.pl" count "$BK_WORK/$sink.out")
		t0=$(bk_now)
		timeout "$timeout" /usr/sbin/smtp-source -s 16 -d -m "$n" -l "$BODY_BYTES" -f bench@example.com \
			-t sink@example.com "127.0.0.1:$port" >/dev/null 2>&1 || gk_die "smtp-source failed ($v)"
		t1=$(bk_now)
		[ "$(perl "$BENCH/sink.pl" count "$BK_WORK/$sink.out")" -ge $((c0 + n)) ] ||
			gk_die "smtp-sink did not count smtp-source's mail ($v)"
		bk_record "relays.$v.source" "$run" "$(bk_rate "$n" "$t0" "$t1")"
	done
}

# relays_worker VARIANT N SINK PORT TIMEOUT: the worker (16 connections),
# N due mails committed in one INSERT, until SINK has counted them, RUNS
# times: relays.VARIANT.gk, or why it is missing.  Restarts the cluster
# before (the new smtp_url) and after (closing the worker's connections).
relays_worker() {
	local v=$1 n=$2 sink=$3 port=$4 timeout=$5 run c0 t0 t1 reason=
	bk_cluster_conf "gatekeeper.database = 'bench'
gatekeeper.smtp_url = 'smtp://127.0.0.1:$port'
gatekeeper.smtp_connections = 16
gatekeeper.helo_name = 'bench.example.com'
gatekeeper.default_sender = 'bench@example.com'"
	bk_cluster_restart
	bk_only_queue default
	bk_reset_mail
	c0=$(perl "$BENCH/sink.pl" count "$BK_WORK/$sink.out")
	bk_sql "SELECT gatekeeper.enqueue('probe@example.com', 'probe', 'probe')" >/dev/null
	if ! perl "$BENCH/sink.pl" wait "$BK_WORK/$sink.out" $((c0 + 1)) 30 >/dev/null; then
		reason="no mail reached smtp-sink within 30 s of a commit ($(bk_sql "SELECT coalesce(string_agg(state || ': ' || coalesce(last_error, '-'), '; '), 'no mail') FROM gatekeeper.mail_status"))"
	fi
	delivery_settled || true
	for run in $(seq 1 "$RUNS"); do
		[ -z "$reason" ] || break
		bk_reset_mail
		bk_settle
		c0=$(perl "$BENCH/sink.pl" count "$BK_WORK/$sink.out")
		bk_sql "INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
				SELECT * FROM bench_rows($n, '${v}_${run}_', 'default', interval '0')"
		t0=$(bk_now)
		if ! t1=$(perl "$BENCH/sink.pl" wait "$BK_WORK/$sink.out" $((c0 + n)) "$timeout"); then
			reason="run $run: $(($(perl "$BENCH/sink.pl" count "$BK_WORK/$sink.out") - c0)) of $n mails reached smtp-sink within $timeout s"
			break
		fi
		bk_record "relays.$v.gk" "$run" "$(bk_rate "$n" "$t0" "$t1")"
		delivery_settled || gk_warn "the worker had not recorded every outcome after 60 s"
	done
	[ -z "$reason" ] || bk_skip "relays.$v.gk" "$reason"
	bk_cluster_conf ""
	bk_cluster_restart
	bk_reset_mail
}

# relays_per_mail CHUNKS MAILS: CHUNKS / MAILS, two decimals.
relays_per_mail() { perl -e 'printf "%.2f", $ARGV[0] / $ARGV[1]' "$1" "$2"; }

scenario_relays() {
	local sport pport c
	# loopback
	relays_sink relay_sink -m 64
	sport=$RELAYS_PORT
	relays_source loopback "$RELAY_N" relay_sink "$sport" $((60 + RELAY_N / 100))
	relays_worker loopback "$RELAY_N" relay_sink "$sport" $((60 + RELAY_N / 100))

	# 20 ms away: the same sink behind the proxy, a proxy of its own for
	# each client, so that its chunk count is that client's
	relays_proxy relay_proxy_source "$sport"
	pport=$RELAYS_PORT
	relays_source rtt20 "$RELAY_RTT_N" relay_sink "$pport" $((60 + RELAY_RTT_N / 10))
	bk_stop_bg relay_proxy_source
	c=$(relays_chunks relay_proxy_source)
	[ -z "$c" ] || bk_note relays "rtt20: smtp-source wrote $(relays_per_mail "$c" $((RUNS * RELAY_RTT_N))) chunks per mail through the proxy (about one per round trip it waited for)"
	relays_proxy relay_proxy_gk "$sport"
	pport=$RELAYS_PORT
	relays_worker rtt20 "$RELAY_RTT_N" relay_sink "$pport" $((60 + RELAY_RTT_N / 10))
	bk_stop_bg relay_proxy_gk
	c=$(relays_chunks relay_proxy_gk)
	[ -z "$c" ] || bk_note relays "rtt20: the worker wrote $(relays_per_mail "$c" $((RUNS * RELAY_RTT_N + 1))) chunks per mail through the proxy (the probe mail included; mails of a run that timed out count too)"
	bk_stop_bg relay_sink

	# a second for each end-of-data
	relays_sink relay_sink_slow -m 64 -W .:1
	sport=$RELAYS_PORT
	bk_record relays.slow_eod.bound 1 16
	relays_source slow_eod "$RELAY_SLOW_N" relay_sink_slow "$sport" $((30 + RELAY_SLOW_N))
	relays_worker slow_eod "$RELAY_SLOW_N" relay_sink_slow "$sport" $((30 + RELAY_SLOW_N))
	bk_stop_bg relay_sink_slow
}

# ================================================================== shards
#
# Issue 29: gatekeeper sharded by recipient behind gatekeeper_router
# (PL/Proxy).  The shards are databases shard_0 .. shard_3 of the bench
# cluster (each a gatekeeper made shard n of 4), the router a database
# with plproxy and gatekeeper_router whose foreign server names them: one
# machine, so the figures say what routing costs and what the machine
# bounds, not what separate machines would carry.
#   enqueue   SHARD_ENQ enqueue() calls, one per transaction, by 4 pgbench
#             clients (random recipients): on shard_0 directly, and through
#             the router (each routed to its recipient's shard);
#   bulk      SHARD_ENQ enqueue() calls in one statement: on shard_0
#             directly, and through the router (one routed call per row,
#             each committed on its shard as it goes), and through the
#             router's enqueue_batch (arrays of 1,000 rows, split by shard:
#             one call and one transaction per shard and array);
#   claim     SHARD_N due mails spread evenly over 1, 2 and 4 shards,
#             drained by 2 claimers per shard (claim(1000) + ack), all
#             shards at once; rate = SHARD_N / wall time, and per shard.

# shards_setup: the shard databases and the router, once per scenario.
shards_setup() {
	local i opts=""
	for i in 0 1 2 3; do
		bk_db_make "shard_$i" "SELECT gatekeeper.shard($i, 4)"
		opts="$opts${opts:+, }p$i 'host=127.0.0.1 port=$BK_PGPORT dbname=shard_$i'"
	done
	BK_DB=postgres bk_sql "DROP DATABASE IF EXISTS router WITH (FORCE)" >/dev/null
	BK_DB=postgres bk_sql "CREATE DATABASE router" >/dev/null
	BK_DB=router bk_sql "CREATE EXTENSION gatekeeper_router CASCADE;
		CREATE SERVER gatekeeper FOREIGN DATA WRAPPER plproxy OPTIONS ($opts);
		CREATE USER MAPPING FOR PUBLIC SERVER gatekeeper OPTIONS (user 'postgres')" >/dev/null
}

# shards_reset: empty every shard's mail.
shards_reset() {
	local i
	for i in 0 1 2 3; do
		BK_DB=shard_$i bk_sql "TRUNCATE gatekeeper.mail, gatekeeper.mail_live, gatekeeper.mail_claim,
			gatekeeper.mail_key, gatekeeper.mail_done, gatekeeper.gate_log" >/dev/null
	done
}

# shards_count: the mail of every shard, summed.
shards_count() {
	local i n=0
	for i in 0 1 2 3; do
		n=$((n + $(BK_DB=shard_$i bk_sql "SELECT count(*) FROM gatekeeper.mail")))
	done
	echo "$n"
}

# shards_pgbench DB LOG ARGS...: pgbench against DB (bk_pgbench's checks).
shards_pgbench() {
	local db=$1 log=$2
	shift 2
	if ! pgbench -n -M prepared -h 127.0.0.1 -p "$BK_PGPORT" -U postgres "$@" "$db" >"$log" 2>&1 ||
		grep -Eq 'number of failed transactions: [1-9]|aborted' "$log"; then
		tail -n 20 "$log" >&2
		gk_warn "pgbench against $db failed (log: $log)"
		return 1
	fi
}

scenario_shards() {
	local run k i t0 t1 per pids n
	if [ ! -f "$("$GK_PG_CONFIG" --sharedir)/extension/plproxy.control" ]; then
		bk_skip shards "plproxy is not installed (postgresql-15-plproxy)"
		return 0
	fi
	shards_setup
	for run in $(seq 1 "$RUNS"); do
		for k in direct routed; do
			shards_reset
			bk_settle
			t0=$(bk_now)
			shards_pgbench "$([ $k = direct ] && echo shard_0 || echo router)" "$BK_WORK/pgbench.shards.$k.$run.log" \
				-f "$SQL/shard_enqueue.sql" -c 4 -j "$(bk_jobs 4)" -t $((SHARD_ENQ / 4))
			t1=$(bk_now)
			[ "$(shards_count)" = "$SHARD_ENQ" ] || gk_die "shards: $k enqueue lost calls"
			bk_record "shards.enqueue.$k" "$run" "$(bk_rate "$SHARD_ENQ" "$t0" "$t1")"

			shards_reset
			bk_settle
			t0=$(bk_now)
			BK_DB=$([ $k = direct ] && echo shard_0 || echo router) bk_sql \
				"SELECT count(gatekeeper.enqueue('b' || i || '@example.com', 'Subject', 'Body of about a line', 'bench'))
				   FROM generate_series(1, $SHARD_ENQ) AS i" >/dev/null
			t1=$(bk_now)
			[ "$(shards_count)" = "$SHARD_ENQ" ] || gk_die "shards: $k bulk enqueue lost calls"
			bk_record "shards.bulk.$k" "$run" "$(bk_rate "$SHARD_ENQ" "$t0" "$t1")"
		done
		# the router's enqueue_batch: rows of 1,000, one call per shard each
		shards_reset
		bk_settle
		t0=$(bk_now)
		BK_DB=router bk_sql \
			"SELECT sum(cardinality(gatekeeper.enqueue_batch(a.r, a.s, a.b, 'bench')))
			   FROM (SELECT array_agg('b' || i || '@example.com') AS r, array_agg('Subject'::text) AS s,
							array_agg('Body of about a line'::text) AS b
					   FROM generate_series(1, $SHARD_ENQ) AS i GROUP BY (i - 1) / 1000) a" >/dev/null
		t1=$(bk_now)
		[ "$(shards_count)" = "$SHARD_ENQ" ] || gk_die "shards: enqueue_batch lost rows"
		bk_record "shards.bulk.batch" "$run" "$(bk_rate "$SHARD_ENQ" "$t0" "$t1")"
		if [ "$run" = 1 ]; then
			bk_note shards "routed enqueue spread over the shards: $(for i in 0 1 2 3; do
				BK_DB=shard_$i bk_sql "SELECT count(*) FROM gatekeeper.mail"; done | paste -sd/ -) (shard_0/1/2/3)"
		fi

		for k in 1 2 4; do
			shards_reset
			per=$((SHARD_N / k))
			for i in $(seq 0 $((k - 1))); do
				BK_DB=shard_$i bk_sql "CALL bench_load($per, 'c${i}_', 'bench', interval '-1 minute')"
				BK_DB=shard_$i bk_sql "VACUUM ANALYZE gatekeeper.mail, gatekeeper.mail_live"
				BK_DB=shard_$i bk_sql "SELECT gatekeeper.pause(name) FROM gatekeeper.queue WHERE name <> 'bench' AND NOT paused" >/dev/null
			done
			bk_settle
			t0=$(bk_now)
			pids=()
			for i in $(seq 0 $((k - 1))); do
				shards_pgbench "shard_$i" "$BK_WORK/pgbench.shards.claim.k$k.$i.$run.log" \
					-f "$SQL/drain.sql" -D batch="$SHARD_BATCH" -c 2 -j 1 -t $((per / SHARD_BATCH / 2)) &
				pids+=("$!")
			done
			for i in "${pids[@]}"; do wait "$i"; done
			t1=$(bk_now)
			n=0
			for i in $(seq 0 $((k - 1))); do
				n=$((n + $(BK_DB=shard_$i bk_sql "SELECT count(*) FROM gatekeeper.mail_status WHERE state = 'sent'")))
			done
			[ "$n" = "$SHARD_N" ] || gk_die "shards: $k shard(s) sent $n of $SHARD_N"
			bk_record "shards.claim.k$k" "$run" "$(bk_rate "$SHARD_N" "$t0" "$t1")"
			bk_record "shards.claim_per.k$k" "$run" "$(perl -e 'printf "%.1f\n", $ARGV[0] / $ARGV[1]' "$(bk_rate "$SHARD_N" "$t0" "$t1")" "$k")"
		done
	done
	shards_reset
	for i in 0 1 2 3; do
		BK_DB=postgres bk_sql "DROP DATABASE shard_$i WITH (FORCE)" >/dev/null
	done
	BK_DB=postgres bk_sql "DROP DATABASE router WITH (FORCE)" >/dev/null
}
