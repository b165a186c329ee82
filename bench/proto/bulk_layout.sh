# What the live row's layout costs a bulk enqueue, against pgmq's
# send_batch (bench/notes.md, "Bulk enqueue: what a layout change could
# give").  A throwaway cluster with four databases, each with gatekeeper
# as installed, three of them changed by hand the way a layout change
# would change them:
#
#   a   as installed
#   b   mail_live without its primary key
#   c   mail_due without its leading text column (queue)
#   d   both
#
# and, in a, pgmq loaded from BK_PGMQ_SQL.  Each round, in turn: COPY and
# INSERT ... SELECT of N rows of the harness's shape into each database's
# gatekeeper.mail (from empty tables, after a CHECKPOINT), COPY with
# gatekeeper.mail's insert trigger disabled in a (content only: no
# validation, no live row), COPY into a plain table, and pgmq's
# send_batch of the same rows.  Prints rows/s per round.  b, c and d are
# not working schemas (the claim needs the indexes dropped): they only
# measure what the enqueue would gain.
#
#   BIN=<postgresql bin> BK_PGMQ_SQL=<pgmq.sql> [N=200000] [R=5] \
#       bash bench/proto/bulk_layout.sh
#
# Runs as root; the cluster runs as postgres in a temporary directory
# that is removed at the end.
set -eu
: "${BIN:?the PostgreSQL bin directory}" "${BK_PGMQ_SQL:?pgmq.sql}"
N=${N:-200000}; R=${R:-5}
W=$(mktemp -d /tmp/bulk_layout.XXXX); chown postgres "$W"; chmod 755 "$W"
P=$((31000 + RANDOM % 1000))
runuser -u postgres -- "$BIN/initdb" -D "$W/data" -U postgres --auth=trust >/dev/null
cat >>"$W/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$W'
port = $P
shared_preload_libraries = 'gatekeeper'
gatekeeper.workers = 0
shared_buffers = 1GB
max_wal_size = 8GB
autovacuum = off
CONF
runuser -u postgres -- "$BIN/pg_ctl" -D "$W/data" -l "$W/log" -w start >/dev/null
trap 'runuser -u postgres -- "$BIN/pg_ctl" -D "$W/data" -m immediate stop >/dev/null 2>&1; rm -rf "$W"' EXIT
PS() { runuser -u postgres -- "$BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h "$W" -p "$P" "$@"; }

DUE_NO_QUEUE="DROP INDEX gatekeeper.mail_due;
	CREATE INDEX mail_due ON gatekeeper.mail_live (priority DESC, send_at, id)
		WITH (deduplicate_items = off) WHERE state = 'scheduled'"
for db in a b c d; do
	PS -d postgres -c "CREATE DATABASE $db"
	PS -d $db -c "CREATE EXTENSION gatekeeper"
	PS -d $db -c "SELECT gatekeeper.create_queue('bench')" >/dev/null
	case $db in
	b) PS -d $db -c "ALTER TABLE gatekeeper.mail_live DROP CONSTRAINT mail_live_pkey" ;;
	c) PS -d $db -c "$DUE_NO_QUEUE" ;;
	d) PS -d $db -c "ALTER TABLE gatekeeper.mail_live DROP CONSTRAINT mail_live_pkey" -c "$DUE_NO_QUEUE" ;;
	esac
	PS -d $db -c "CREATE TABLE bench_bulk AS
		SELECT 'bench'::text AS queue, 'e' || i || '@example.com' AS recipient,
			   rpad('Subject ' || i, 25, '.') AS subject, repeat(md5(i::text), 16) AS body
		  FROM generate_series(1, $N) AS i" -c "VACUUM ANALYZE bench_bulk"
done
PS -d a -c "COPY bench_bulk TO '$W/bulk.csv' (FORMAT csv)"
PS -d a -c "CREATE TABLE plain (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	queue text, recipient text, subject text, body text)"
sed -e '/^\\echo .*\\quit/d' -e 's/@extschema@/pgmq/g' "$BK_PGMQ_SQL" | PS -d a -f - >/dev/null 2>&1
PS -d a -c "SELECT pgmq.create('bench_e')" >/dev/null

reset() {
	PS -d "$1" -c "TRUNCATE gatekeeper.mail, gatekeeper.mail_live, gatekeeper.mail_key,
		gatekeeper.mail_done, gatekeeper.mail_claim" -c "SELECT gatekeeper.recount_live()" >/dev/null
	PS -d postgres -c "CHECKPOINT"
}
rate() {
	local s e
	s=$(date +%s.%N); PS -d "$1" -c "$2" >/dev/null; e=$(date +%s.%N)
	echo "$N / ($e - $s)" | bc
}
COPY_GK="COPY gatekeeper.mail (queue, recipient, subject, body) FROM '$W/bulk.csv' (FORMAT csv)"
INSERT_GK="INSERT INTO gatekeeper.mail (queue, recipient, subject, body)
	SELECT queue, recipient, subject, body FROM bench_bulk"
for r in $(seq 1 "$R"); do
	line="round $r:"
	for db in a b c d; do
		reset $db; line+=" copy_$db=$(rate $db "$COPY_GK")"
		reset $db; line+=" insert_$db=$(rate $db "$INSERT_GK")"
	done
	reset a
	PS -d a -c "ALTER TABLE gatekeeper.mail DISABLE TRIGGER mail_check_insert"
	line+=" copy_content_only=$(rate a "$COPY_GK")"
	PS -d a -c "ALTER TABLE gatekeeper.mail ENABLE TRIGGER mail_check_insert"
	reset a; PS -d a -c "TRUNCATE plain"
	line+=" copy_plain=$(rate a "COPY plain (queue, recipient, subject, body) FROM '$W/bulk.csv' (FORMAT csv)")"
	PS -d a -c "TRUNCATE pgmq.q_bench_e"; PS -d postgres -c "CHECKPOINT"
	line+=" pgmq=$(rate a "SELECT count(*) FROM pgmq.send_batch('bench_e', ARRAY(
		SELECT jsonb_build_object('recipient', recipient, 'subject', subject, 'body', body)
		  FROM bench_bulk))")"
	echo "$line"
done
