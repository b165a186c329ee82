#!/bin/bash
# Copyright: gatekeeper contributors
#
# gatekeeper through a pg_auto_failover failover, end to end (SPEC
# "Failover"): Debian's pg_autoctl (postgresql-15-auto-failover) runs a
# monitor and two nodes on loopback, the primary delivers a few thousand
# mails (3 campaigns behind smart_sending, receipts) to Postfix's smtp-sink,
# and `pg_autoctl perform failover` switches to the other node in the
# middle of delivery.  Then every message the relay received is accounted
# for by Message-ID: lost, second copies, recipients with two promotional
# mails, and how long the old primary's claims took on the new one.
#
#   t/failover/pg_autoctl.sh                 as root (servers run as postgres) or postgres
#   GK_PG_BIN=/work/pgcopy/NAME/usr/lib/postgresql/15/bin t/failover/pg_autoctl.sh
#   CLAIM_STANDBYS=0 t/failover/pg_autoctl.sh    (default 1)
#   KEEP=1 ...                               keep the temporary directory
#
# GK_PG_BIN: the PostgreSQL 15 binaries with gatekeeper (and pgautofailover)
# installed (default /usr/lib/postgresql/15/bin).  Everything lives under
# one temporary directory (data, pg_autoctl's configuration and state, the
# relay's messages); every server listens on 127.0.0.1 on free ports and
# is stopped at the end, whatever happens.  Exits 0 when no mail was lost,
# nothing is left unfinished and no recipient got two promotional mails.
# Takes 75-125 s on a 2-core machine (most of it pg_autoctl's own state changes).
# Not run by CI (scripts/test.sh): it needs pg_autoctl and takes a while.

set -euo pipefail

PG_BIN=${GK_PG_BIN:-/usr/lib/postgresql/15/bin}
CLAIM_STANDBYS=${CLAIM_STANDBYS:-1}
RECIPIENTS=${RECIPIENTS:-600}
RECEIPTS=${RECEIPTS:-1800}
EXPECTED=$((RECIPIENTS + RECEIPTS))
START=$(date +%s)

die() { echo "pg_autoctl.sh: $*" >&2; exit 1; }
[ -x "$PG_BIN/pg_ctl" ] || die "no pg_ctl in $PG_BIN"
command -v pg_autoctl >/dev/null || die "pg_autoctl not found (Debian: pg-auto-failover-cli)"
[ -x /usr/sbin/smtp-sink ] || die "smtp-sink not found (Debian: postfix)"

dir=$(mktemp -d /tmp/gk-autoctl.XXXXXX)
chmod 755 "$dir"
if [ "$(id -u)" = 0 ]; then
	chown postgres: "$dir"
	as_pg() { runuser -u postgres -- env HOME="$dir" XDG_CONFIG_HOME="$dir/config" \
		XDG_DATA_HOME="$dir/share" XDG_RUNTIME_DIR="$dir/run" PGHOST="$dir/run" PATH="$PG_BIN:$PATH" "$@"; }
else
	as_pg() { env HOME="$dir" XDG_CONFIG_HOME="$dir/config" XDG_DATA_HOME="$dir/share" \
		XDG_RUNTIME_DIR="$dir/run" PGHOST="$dir/run" PATH="$PG_BIN:$PATH" "$@"; }
fi
as_pg mkdir -p "$dir/config" "$dir/share" "$dir/run" "$dir/mail" "$dir/log"

free_port() {
	/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
PM=$(free_port); P1=$(free_port); P2=$(free_port); PS=$(free_port)
MONITOR="postgres://autoctl_node@127.0.0.1:$PM/pg_auto_failover?sslmode=disable"
BOTH="postgres://127.0.0.1:$P1,127.0.0.1:$P2/postgres?target_session_attrs=read-write&connect_timeout=2"

pids=()
cleanup() {
	set +e
	for d in node1 node2 monitor; do
		[ -d "$dir/$d" ] && as_pg pg_autoctl stop --pgdata "$dir/$d" --immediate >/dev/null 2>&1
	done
	sleep 1
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
	for d in node1 node2 monitor; do
		[ -f "$dir/$d/postmaster.pid" ] && as_pg "$PG_BIN/pg_ctl" -D "$dir/$d" stop -m immediate >/dev/null 2>&1
	done
	if [ "${KEEP:-0}" = 1 ]; then
		echo "kept $dir"
	else
		rm -rf "$dir"
	fi
}
trap cleanup EXIT

# wait_until SECONDS WHAT COMMAND...: run COMMAND every 0.2 s until it succeeds
wait_until() {
	local limit=$1 what=$2 deadline
	shift 2
	deadline=$(($(date +%s) + limit))
	until "$@" >/dev/null 2>&1; do
		[ "$(date +%s)" -lt "$deadline" ] || die "timed out after $limit s waiting for $what"
		sleep 0.2
	done
}
sql() { as_pg psql -X -At -q -d "$1" -c "$2"; }
node_state() {
	sql "postgres://autoctl_node@127.0.0.1:$PM/pg_auto_failover" \
		"SELECT string_agg(nodename || ':' || reportedstate || '/' || goalstate, ' ' ORDER BY nodename) FROM pgautofailover.node"
}
states_are() { [ "$(node_state)" = "$1" ]; }
relay_count() { find "$dir/mail" -type f -size +0 | wc -l; }
relay_has() { [ "$(relay_count)" -ge "$1" ]; }
unfinished() { sql "$BOTH" "SELECT count(*) FROM gatekeeper.mail_status WHERE state IN ('scheduled', 'claimed')"; }
all_finished() { [ "$(unfinished 2>/dev/null)" = 0 ]; }

echo "== $dir: monitor :$PM, node1 :$P1, node2 :$P2, relay :$PS, claim_standbys $CLAIM_STANDBYS"

# the relay
sink_user=()
[ "$(id -u)" = 0 ] && sink_user=(-u postgres)
/usr/sbin/smtp-sink -c -d "$dir/mail/%H%M%S." -t 30 "${sink_user[@]}" \
	"127.0.0.1:$PS" 128 >"$dir/log/sink.log" 2>&1 &
pids+=($!)

# the monitor (its data directory made here, so that its socket is ours too)
as_pg "$PG_BIN/initdb" -D "$dir/monitor" -U postgres --auth trust --encoding UTF8 --no-locale \
	>"$dir/log/initdb-monitor.log" 2>&1
# postgresql.auto.conf is read last: what pg_autoctl writes into its own
# include (listen_addresses '*', shared_buffers by the machine's memory,
# shared_preload_libraries) does not override these
cat >>"$dir/monitor/postgresql.auto.conf" <<EOF
port = $PM
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir/run'
shared_buffers = '128MB'
EOF
as_pg pg_autoctl create monitor --pgdata "$dir/monitor" --pgport "$PM" --hostname 127.0.0.1 \
	--auth trust --no-ssl --pgctl "$PG_BIN/pg_ctl" >"$dir/log/monitor-create.log" 2>&1
as_pg pg_autoctl run --pgdata "$dir/monitor" >"$dir/log/monitor.log" 2>&1 &
pids+=($!)
wait_until 60 "the monitor" sql "postgres://autoctl_node@127.0.0.1:$PM/pg_auto_failover" "SELECT 1"

# node1, with gatekeeper preloaded; node2 is its pg_basebackup, settings included
as_pg "$PG_BIN/initdb" -D "$dir/node1" -U postgres --auth trust --encoding UTF8 --no-locale \
	>"$dir/log/initdb-node1.log" 2>&1
cat >>"$dir/node1/postgresql.auto.conf" <<EOF
port = $P1
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir/run'
shared_buffers = '128MB'
shared_preload_libraries = 'gatekeeper,pg_stat_statements'
gatekeeper.database = 'postgres'
gatekeeper.smtp_url = 'smtp://127.0.0.1:$PS'
gatekeeper.default_sender = 'shop@example.com'
gatekeeper.naptime = '100ms'
gatekeeper.batch_size = 64
gatekeeper.smtp_connections = 4
gatekeeper.claim_standbys = $CLAIM_STANDBYS
EOF
as_pg pg_autoctl create postgres --pgdata "$dir/node1" --pgport "$P1" --hostname 127.0.0.1 \
	--pghost "$dir/run" --name node1 --monitor "$MONITOR" --auth trust --no-ssl --pgctl "$PG_BIN/pg_ctl" \
	>"$dir/log/node1-create.log" 2>&1
as_pg pg_autoctl run --pgdata "$dir/node1" >"$dir/log/node1.log" 2>&1 &
pids+=($!)
wait_until 90 "node1 to be single" states_are "node1:single/single"
wait_until 60 "node1 to accept connections" sql "postgres://127.0.0.1:$P1/postgres" "SELECT 1"

sql "postgres://127.0.0.1:$P1/postgres" "
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.create_queue(q, gates => '{smart_sending}', rate_limit => 100)
  FROM unnest(ARRAY['promo_a', 'promo_b', 'promo_c']) q;
SELECT gatekeeper.create_queue('receipts', transactional => true, rate_limit => 200);
SELECT gatekeeper.pause(q) FROM unnest(ARRAY['promo_a', 'promo_b', 'promo_c', 'receipts']) q;
SELECT count(gatekeeper.enqueue('c' || i || '@customer.example', 'Sale ' || q, 'body', q))
  FROM unnest(ARRAY['promo_a', 'promo_b', 'promo_c']) q, generate_series(1, $RECIPIENTS) i;
SELECT count(gatekeeper.enqueue('r' || i || '@customer.example', 'Receipt ' || i, 'body', 'receipts'))
  FROM generate_series(1, $RECEIPTS) i;" >/dev/null

as_pg pg_autoctl create postgres --pgdata "$dir/node2" --pgport "$P2" --hostname 127.0.0.1 \
	--pghost "$dir/run" --name node2 --monitor "$MONITOR" --auth trust --no-ssl --pgctl "$PG_BIN/pg_ctl" \
	>"$dir/log/node2-create.log" 2>&1
# the base backup carried node1's port and socket directory
sed -i "s/^port = $P1\$/port = $P2/" "$dir/node2/postgresql.auto.conf"
as_pg pg_autoctl run --pgdata "$dir/node2" >"$dir/log/node2.log" 2>&1 &
pids+=($!)
wait_until 120 "node1 primary and node2 secondary" states_are "node1:primary/primary node2:secondary/secondary"
echo "== $(($(date +%s) - START)) s: $(node_state)"

# deliver, and fail over a third of the way through
sql "postgres://127.0.0.1:$P1/postgres" \
	"SELECT gatekeeper.resume(q) FROM unnest(ARRAY['promo_a', 'promo_b', 'promo_c', 'receipts']) q" >/dev/null
wait_until 120 "a third of the mail at the relay" relay_has $((EXPECTED / 3))
at_failover=$(relay_count)
echo "== $(($(date +%s) - START)) s: $at_failover messages at the relay; pg_autoctl perform failover"
failover_at=$(date +%s.%N)
as_pg pg_autoctl perform failover --pgdata "$dir/monitor" >"$dir/log/failover.log" 2>&1 ||
	die "perform failover failed: $(cat "$dir/log/failover.log")"
promoted_at=$(date +%s.%N)
echo "== $(($(date +%s) - START)) s: $(node_state) (failover took $(awk "BEGIN { printf \"%.1f\", $promoted_at - $failover_at }") s)"
claimed=$(sql "$BOTH" "SELECT count(*) FROM gatekeeper.mail_status WHERE state = 'claimed' AND worker NOT LIKE '%@' || gatekeeper._incarnation()" 2>/dev/null || echo '?')

wait_until 120 "every mail finished on the new primary" all_finished
done_at=$(date +%s.%N)

# accounting by Message-ID (the id before the dot names the mail)
sql "$BOTH" "SELECT s.id, s.queue, s.state, m.recipient FROM gatekeeper.mail_status s JOIN gatekeeper.mail m USING (id)" \
	>"$dir/mail_states.txt"
result=$(/usr/bin/python3 - "$dir" <<'EOF'
import collections, os, re, sys
d = sys.argv[1]
mail = {}
for line in open(os.path.join(d, 'mail_states.txt')):
    i, q, st, r = line.rstrip('\n').split('|')
    mail[i] = (q, st, r)
received = collections.Counter()
for f in os.listdir(os.path.join(d, 'mail')):
    p = os.path.join(d, 'mail', f)
    if os.path.getsize(p) == 0:
        continue
    m = re.search(rb'^Message-ID: <(\d+)\.', open(p, 'rb').read(), re.M | re.I)
    received[m.group(1).decode() if m else 'none'] += 1
sent = sum(1 for v in mail.values() if v[1] == 'sent')
lost = sum(1 for i, v in mail.items() if v[1] == 'sent' and i not in received)
unknown = sum(1 for i in received if i not in mail)
dups = sum(n - 1 for n in received.values())
promos = collections.Counter(mail[i][2] for i in received if i in mail and mail[i][0].startswith('promo_'))
double = sum(1 for n in promos.values() if n > 1)
print(sent, lost, unknown, dups, double)
EOF
)
read -r sent lost unknown dups double <<<"$result"
errors=$(grep -h 'ERROR' "$dir"/node1/log/* "$dir"/node2/log/* 2>/dev/null | grep -c 'gatekeeper\|read-only' || true)
waits=$(grep -h 'gatekeeper worker waits' "$dir"/node1/log/* "$dir"/node2/log/* 2>/dev/null | sort -u | wc -l)
echo "== $(($(date +%s) - START)) s in all; claim_standbys $CLAIM_STANDBYS"
echo "   sent $sent of $EXPECTED, lost $lost, not ours $unknown, second copies $dups," \
	"recipients with two promotional mails $double"
echo "   at the failover $at_failover messages at the relay; the new primary saw $claimed claims of the old one;" \
	"every mail finished $(awk "BEGIN { printf \"%.1f\", $done_at - $promoted_at }") s after the failover returned"
echo "   worker log lines 'waits: read-only': $waits; worker ERRORs about read-only or gatekeeper: $errors"
if [ "$sent" = "$EXPECTED" ] && [ "$lost" = 0 ] && [ "$unknown" = 0 ] && [ "$double" = 0 ]; then
	echo "PASS"
else
	die "FAILED"
fi
