# Storage prototypes for the drain (bench/notes.md, "Claimed mail out of
# mail_live: a prototype"): the layout's claim and ack as plain SQL (cur)
# against A (claimed mail moved into one row per batch) and B (the due
# order in its own table, the live row updated HOT), with the raw UPDATE
# in the same round.  Not part of bench/run.sh.
#
# Needs a scratch database with gatekeeper and bench/sql/setup.sql
# installed, reached through PGHOST/PGPORT/PGDATABASE/PGUSER, and psql and
# pgbench on PATH.  K clients (default 2), ROUNDS rounds (default 3), N
# mails per drain (default 160,000).  It truncates gatekeeper's mail.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
N=${N:-160000}; K=${K:-2}; ROUNDS=${ROUNDS:-3}
P() { psql -X -q -v ON_ERROR_STOP=1 "$@"; }
load() {
	P -c "TRUNCATE gatekeeper.mail, gatekeeper.mail_live, gatekeeper.mail_done, bench_raw, proto_claim, proto_done, t_live, t_sched, t_batch RESTART IDENTITY" \
	  -c "CALL bench_load($N, 'd', 'bench', interval '-1 minute')" \
	  -c "INSERT INTO bench_raw SELECT * FROM gatekeeper.mail_status" \
	  -c "INSERT INTO t_live SELECT * FROM gatekeeper.mail_live" \
	  -c "INSERT INTO t_sched SELECT queue, priority, send_at, id FROM gatekeeper.mail_live" \
	  -c "VACUUM ANALYZE gatekeeper.mail, gatekeeper.mail_live, gatekeeper.mail_done, bench_raw, t_live, t_sched" \
	  -c CHECKPOINT >/dev/null
}
rate() {
	local t0 t1
	t0=$(date +%s.%N)
	pgbench -M prepared -n "$@" -c "$K" -j "$K" -t $((N / 1000 / K)) >/dev/null
	t1=$(date +%s.%N)
	echo "$N / ($t1 - $t0)" | bc
}
P -f "$HERE/proto_setup.sql" -f "$HERE/protob_setup.sql" >/dev/null 2>&1
P -c "SELECT gatekeeper.pause(name) FROM gatekeeper.queue WHERE name <> 'bench' AND NOT paused" >/dev/null
for r in $(seq 1 "$ROUNDS"); do
	load; raw=$(rate -f "$HERE/../sql/raw_update.sql" -D batch=1000 -D clients="$K" -D i=0)
	load; cur=$(rate -f "$HERE/claim_ack_cur.sql")
	load; a=$(rate -f "$HERE/claim_ack_a.sql")
	load; b=$(rate -f "$HERE/claim_ack_b.sql")
	echo "round $r: raw $raw cur $cur A $a B $b rows/s;" \
	     "cur/raw $(echo "scale=3; $cur / $raw" | bc) A/raw $(echo "scale=3; $a / $raw" | bc) B/raw $(echo "scale=3; $b / $raw" | bc)"
done
