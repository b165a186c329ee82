#!/usr/bin/env bash
# scripts/demo.sh: gatekeeper's main job, end to end, on one machine.
#
#   bash scripts/demo.sh            (as root, on Debian 12)
#
# Installs what it needs, builds and installs gatekeeper, then starts a
# throwaway PostgreSQL 15 cluster with the gatekeeper worker preloaded and a
# real SMTP relay: a private Postfix smtpd (t/pfmaster.py runs it without
# Postfix's master, as the postfix user) that refuses one customer's mailbox
# with "550 5.1.1 User unknown" and hands every message it accepts to
# Postfix's smtp-sink, which keeps each as a file; all on loopback.  A shop
# with 50,000 customers then schedules:
#
#   promo_black_friday   to all 50,000 customers      (COPY, as from an export)
#   promo_new_arrivals   to 30,000 of them            (INSERT ... SELECT)
#   promo_winback        to 20,000 of them, 5 s later (INSERT ... SELECT)
#   receipts             for orders, in the orders' own transactions
#                        (INSERT ... SELECT and gatekeeper.enqueue), no gates
#
# Each campaign is one template (gatekeeper.create_template) and one narrow
# row per customer: the customer's first name and three recommended
# products, as JSON; the worker renders each mail as it sends it, and the
# checks read every promotional message the relay received for the name
# and the products of its own recipient.
# The three campaigns share the smart_sending gate: however they overlap and
# however they race, each customer gets one promotional mail.  Their queues
# have an unsubscribe_url, so every promotional mail carries RFC 8058
# one-click unsubscribe headers.  The worker delivers everything over SMTP
# while the script shows progress.  Later that day: the customer whose
# mailbox does not exist has been suppressed by the relay's 550 5.1.1 (a hard
# bounce); another customer unsubscribes with the token from the
# List-Unsubscribe header of the mail the relay received; a new customer
# signs up; and the shop sends a reminder to the three.  The report at the
# end counts from both sides: gatekeeper (queue_stats, the suppression
# list, mail states) and the relay (Postfix's log, the files smtp-sink
# wrote).  Everything started is stopped and removed on exit, Ctrl-C
# included.
#
# Settings (environment): GK_DEMO_RECIPIENTS (default 50000, a multiple of
# 50 keeps the numbers round), GK_DEMO_TIMEOUT (seconds for delivery,
# default 600), GK_DEMO_KEEP=1 (keep the cluster's files and the received
# mail in the temporary directory).

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

N=${GK_DEMO_RECIPIENTS:-50000}
TIMEOUT=${GK_DEMO_TIMEOUT:-600}
DB=gatekeeper_demo
SENDER=shop@example.com

[[ "$N" =~ ^[0-9]+$ ]] && [ "$N" -ge 50 ] || gk_die "GK_DEMO_RECIPIENTS must be a number >= 50"
[[ "$TIMEOUT" =~ ^[0-9]+$ ]] || gk_die "GK_DEMO_TIMEOUT must be a number of seconds"

WORK=
PGDATA=
PG_STARTED=0
SINK_PID=
PF_PID=
INTERRUPTED=0
# the customer whose mailbox does not exist, and the one who unsubscribes
BOUNCED=customer42@example.com
UNSUB=customer3@example.com

cleanup() {
	local rc=$?
	trap - EXIT
	trap '' INT TERM
	cd /
	if [ "$rc" -ne 0 ] && [ "$INTERRUPTED" -eq 0 ] && [ -n "$WORK" ]; then
		[ -f "$WORK/postgres.log" ] && { printf '\n----- postgres.log (last 30 lines) -----\n'; tail -n 30 "$WORK/postgres.log"; } >&2
		[ -s "$WORK/smtp-sink.log" ] && { printf '\n----- smtp-sink.log (last 10 lines) -----\n'; tail -n 10 "$WORK/smtp-sink.log"; } >&2
		[ -s "$WORK/postfix.log" ] && { printf '\n----- postfix.log (last 10 lines) -----\n'; tail -n 10 "$WORK/postfix.log"; } >&2
	fi
	if [ "$PG_STARTED" -eq 1 ]; then
		gk_log "stopping the demo cluster"
		gk_run_as_postgres pg_ctl -D "$PGDATA" -m fast -w -t 30 stop >/dev/null 2>&1 ||
			gk_run_as_postgres pg_ctl -D "$PGDATA" -m immediate -w -t 30 stop >/dev/null 2>&1 || true
	fi
	if [ -n "$PF_PID" ] && kill -0 "$PF_PID" 2>/dev/null; then
		gk_log "stopping Postfix (pid $PF_PID)"
		kill "$PF_PID" 2>/dev/null || true
		wait "$PF_PID" 2>/dev/null || true
	fi
	if [ -n "$SINK_PID" ] && kill -0 "$SINK_PID" 2>/dev/null; then
		gk_log "stopping smtp-sink (pid $SINK_PID)"
		kill "$SINK_PID" 2>/dev/null || true
		wait "$SINK_PID" 2>/dev/null || true
	fi
	if [ -n "$WORK" ] && [ -d "$WORK" ]; then
		gk_stop_servers_under "$WORK"
		if [ "${GK_DEMO_KEEP:-0}" = 1 ]; then
			gk_log "kept $WORK (cluster data, logs, received mail in smtp/)"
		else
			rm -rf "$WORK"
		fi
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'INTERRUPTED=1; gk_warn "interrupted"; exit 130' INT
trap 'INTERRUPTED=1; gk_warn "terminated"; exit 143' TERM

gk_require_root

# psql into the demo database, as the superuser, quietly.
q() {
	psql -X -q -v ON_ERROR_STOP=1 -h "$WORK/run" -p "$PG_PORT" -U postgres -d "$DB" "$@"
}
# A single value, unaligned.
q1() {
	q -At -c "$1"
}

# ------------------------------------------------------------ 1. packages
gk_log "1/7 packages"
gk_ensure_packages "${GK_BASE_PACKAGES[@]}"

# ------------------------------------------------------------ 2. build
gk_log "2/7 build and install gatekeeper"
WORK=$(gk_make_workdir gatekeeper-demo)
cd "$WORK"
gk_stage_source "$ROOT" "$WORK/src"
gk_build "$WORK/src" "$WORK/build.log" || gk_die "the build failed"
if grep -q 'warning:' "$WORK/build.log"; then
	gk_warn "the build printed compiler warnings (scripts/test.sh would fail on them)"
fi
gk_install "$WORK/src" || gk_die "make install failed"
rm -rf "$WORK/src"

# ------------------------------------------------------------ 3. SMTP server
gk_log "3/7 SMTP relay: a private Postfix smtpd on loopback, smtp-sink behind it keeping one file per message"
SINK_PORT=$(gk_free_port)
MAILDIR=$WORK/smtp
mkdir -p "$MAILDIR"
chown postfix: "$MAILDIR"
# -u: drop root for the postfix user once the socket is open; -d: dump each
# transaction to its own file (a strftime template plus a random suffix);
# -m: up to 256 sessions at once; 256: the listen backlog.
smtp-sink -u postfix -h smtp-sink.demo -m 256 -d "$MAILDIR/%Y%m%d%H%M%S." \
	"127.0.0.1:$SINK_PORT" 256 >"$WORK/smtp-sink.log" 2>&1 &
SINK_PID=$!
for _ in $(seq 1 50); do
	gk_port_free "$SINK_PORT" || break
	kill -0 "$SINK_PID" 2>/dev/null || gk_die "smtp-sink did not start: $(cat "$WORK/smtp-sink.log")"
	sleep 0.1
done
gk_port_free "$SINK_PORT" && gk_die "smtp-sink is not listening on 127.0.0.1:$SINK_PORT"

# Postfix's smtpd in front of it: its own configuration, queue and log
# under $WORK (the machine's Postfix, if any, is not touched), run as the
# postfix user by t/pfmaster.py, which stands in for master(8).  An access
# map refuses $BOUNCED at RCPT TO as a mailbox that does not exist; every
# message accepted is handed to smtp-sink (smtpd_proxy_filter).
SMTP_PORT=$(gk_free_port "$SINK_PORT")
PF=$WORK/postfix
mkdir -p "$PF/conf" "$PF/queue" "$PF/data"
cp "$ROOT/t/pfmaster.py" "$PF/pfmaster.py"
printf '%s 550 5.1.1 User unknown\n' "$BOUNCED" >"$PF/conf/recipient_access"
: >"$PF/conf/master.cf"
cat >"$PF/conf/main.cf" <<EOF
compatibility_level = 3.6
config_directory = $PF/conf
queue_directory = $PF/queue
data_directory = $PF/data
mail_owner = postfix
setgid_group = postdrop
myhostname = relay.demo.example
mydomain = demo.example
inet_interfaces = 127.0.0.1
mynetworks = 127.0.0.0/8
mydestination =
relay_domains =
local_recipient_maps =
smtpd_reject_unlisted_recipient = no
smtpd_reject_unlisted_sender = no
smtpd_relay_restrictions = permit_mynetworks, reject
smtpd_recipient_restrictions = check_recipient_access texthash:$PF/conf/recipient_access, permit
smtpd_peername_lookup = no
smtpd_client_connection_count_limit = 0
smtpd_client_connection_rate_limit = 0
smtpd_proxy_filter = 127.0.0.1:$SINK_PORT
smtpd_proxy_timeout = 30s
maillog_file_prefixes = $PF
maillog_file = $PF/maillog
EOF
: >"$WORK/postfix.log"
chown -R postfix: "$PF" "$WORK/postfix.log"
setpriv --reuid=postfix --regid=postfix --init-groups \
	/usr/bin/python3 "$PF/pfmaster.py" --config "$PF/conf" --queue "$PF/queue" --port "$SMTP_PORT" \
	--log "$WORK/postfix.log" --daemon-dir /usr/lib/postfix/sbin --max-children 64 \
	--lifetime $((TIMEOUT + 900)) </dev/null >>"$WORK/postfix.log" 2>&1 &
PF_PID=$!
for _ in $(seq 1 100); do
	gk_port_free "$SMTP_PORT" || break
	kill -0 "$PF_PID" 2>/dev/null || gk_die "Postfix did not start: $(cat "$WORK/postfix.log")"
	sleep 0.1
done
gk_port_free "$SMTP_PORT" && gk_die "Postfix is not listening on 127.0.0.1:$SMTP_PORT"
# Prove the chain receives before relying on it, then forget the probe.
smtp-source -m 1 -f probe@example.com -t probe@example.com "127.0.0.1:$SMTP_PORT" ||
	gk_die "Postfix refused a probe message"
for _ in $(seq 1 50); do
	[ -n "$(find "$MAILDIR" -type f -size +0 -print -quit)" ] && break
	sleep 0.1
done
grep -rqs '^X-Rcpt-Args: <probe@example.com>' "$MAILDIR" || gk_die "smtp-sink did not store the probe message"
find "$MAILDIR" -type f -delete
gk_log "Postfix (pid $PF_PID) listens on 127.0.0.1:$SMTP_PORT; smtp-sink (pid $SINK_PID) behind it stored a probe message"

# ------------------------------------------------------------ 4. cluster
gk_log "4/7 PostgreSQL 15 cluster, as the postgres user, with the gatekeeper worker"
PG_PORT=$(gk_free_port "$SMTP_PORT")
PGDATA=$WORK/pgdata
install -d -o postgres -g postgres -m 755 "$WORK/run"
gk_run_as_postgres initdb -D "$PGDATA" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >"$WORK/initdb.log" 2>&1 ||
	gk_die "initdb failed: $(tail -n 20 "$WORK/initdb.log")"
# The worker's database exists before the worker first looks for it.
echo "CREATE DATABASE $DB;" | gk_run_as_postgres postgres --single -D "$PGDATA" postgres >>"$WORK/initdb.log" 2>&1 ||
	gk_die "could not create database $DB: $(tail -n 20 "$WORK/initdb.log")"
cat >>"$PGDATA/postgresql.conf" <<EOF

# ---- gatekeeper demo ----
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$WORK/run'
log_line_prefix = '%m [%p] %b '
shared_preload_libraries = 'gatekeeper'
gatekeeper.database = '$DB'
gatekeeper.smtp_url = 'smtp://127.0.0.1:$SMTP_PORT'
gatekeeper.default_sender = '$SENDER'
gatekeeper.smtp_connections = 16
gatekeeper.naptime = '1s'
EOF
gk_run_as_postgres pg_ctl -D "$PGDATA" -l "$WORK/postgres.log" -w -t 60 start >/dev/null ||
	gk_die "the cluster did not start: $(tail -n 20 "$WORK/postgres.log")"
PG_STARTED=1
gk_log "cluster on 127.0.0.1:$PG_PORT (data in $PGDATA), database $DB"

# ------------------------------------------------------------ 5. the shop
gk_log "5/7 a shop with $N customers schedules three overlapping campaigns and its receipts"
T0=$(date +%s.%N)
q -v n="$N" <<'SQL'
CREATE EXTENSION gatekeeper;

-- The application's own data.
CREATE SCHEMA shop;
CREATE TABLE shop.customer (
	id			int PRIMARY KEY,
	email		text NOT NULL UNIQUE,
	first_name	text NOT NULL
);
INSERT INTO shop.customer
SELECT g, format('customer%s@example.com', g),
	   (ARRAY['Ada', 'Grace', 'Linus', 'Margaret', 'Ken', 'Barbara', 'Zoë'])[1 + g % 7]
  FROM generate_series(1, :n) g;
-- What the shop recommends to each customer: three of its products.
CREATE TABLE shop.product (
	id			int PRIMARY KEY,
	name		text NOT NULL,
	price		numeric(10, 2) NOT NULL
);
INSERT INTO shop.product VALUES
	(1, 'Wool scarf', 29), (2, 'Salt & pepper mills', 24.5), (3, 'Rain jacket', 89),
	(4, 'Teapot "Earl"', 35), (5, 'Hiking boots', 120), (6, 'Desk lamp', 45.9),
	(7, 'Cast iron pan', 52), (8, 'Board game <Carcassonne>', 33), (9, 'Yoga mat', 25),
	(10, 'Espresso cups (set of 4)', 19.99), (11, 'Winter gloves', 22), (12, 'Café crème beans', 14.5);
CREATE TABLE shop.recommendation AS
SELECT customer, product, rank
  FROM (SELECT c.id AS customer, p.id AS product,
			   row_number() OVER (PARTITION BY c.id
								  ORDER BY hashtext(c.id || ':' || p.id), p.id) AS rank
		  FROM shop.customer c CROSS JOIN shop.product p) r
 WHERE rank <= 3;
-- a campaign's data: the first name and the recommended products, in order
CREATE VIEW shop.campaign_data AS
SELECT c.id, c.email, jsonb_build_object('first_name', c.first_name, 'products', r.products) AS data
  FROM shop.customer c
  JOIN (SELECT r.customer,
			   jsonb_agg(jsonb_build_object('name', p.name, 'price', p.price) ORDER BY r.rank) AS products
		  FROM shop.recommendation r JOIN shop.product p ON p.id = r.product
		 GROUP BY r.customer) r ON r.customer = c.id;

CREATE TABLE shop.orders (
	id			bigint GENERATED ALWAYS AS IDENTITY (START 100001) PRIMARY KEY,
	customer	int NOT NULL REFERENCES shop.customer,
	total		numeric(10, 2) NOT NULL,
	placed_at	timestamptz NOT NULL DEFAULT now()
);

-- Three promotional campaigns behind Smart Sending (one promotional mail
-- per customer per 16 hours), and the transactional receipts, ungated and
-- weighted so a receipt never waits behind a campaign.
-- Each promotional mail carries RFC 8058 one-click unsubscribe headers,
-- with a token signed for its recipient and queue.
SELECT gatekeeper.create_queue(q, gates => '{smart_sending}',
							   unsubscribe_url => 'https://shop.example.com/unsubscribe/{token}')
  FROM unnest(ARRAY['promo_black_friday', 'promo_new_arrivals', 'promo_winback']) AS q \g /dev/null
SELECT gatekeeper.create_queue('receipts', weight => 10) \g /dev/null

-- One template per campaign: the customer's first name and a list of the
-- products recommended to them ({{#products}}...{{/products}}), in the
-- subject, the text and the html (where the values are HTML-escaped).
SELECT gatekeeper.create_template('black_friday',
	subject => 'Black Friday — 40 % off everything',
	body => E'Hi {{first_name}},\n\nEverything is 40 % off until Monday. Picked for you:\n{{#products}}\n- {{name}}: {{price}} EUR\n{{/products}}\n\nThe Shop',
	html => '<h1>Black Friday</h1><p>Hi {{first_name}}, everything is <b>40 % off</b> until Monday.</p><ul>{{#products}}<li>{{name}}: {{price}} EUR</li>{{/products}}</ul>',
	headers => '{"X-Campaign": "promo_black_friday", "X-Template": "black_friday"}') \g /dev/null
SELECT gatekeeper.create_template('new_arrivals',
	subject => 'New arrivals: the winter collection',
	body => E'Hi {{first_name}},\n\nThe winter collection is in. Picked for you:\n{{#products}}\n- {{name}}: {{price}} EUR\n{{/products}}\n\nThe Shop',
	headers => '{"X-Campaign": "promo_new_arrivals", "X-Template": "new_arrivals"}') \g /dev/null
SELECT gatekeeper.create_template('winback',
	subject => '{{first_name}}, we miss you',
	body => E'Hi {{first_name}},\n\nHere is 15 % off your next order. Picked for you:\n{{#products}}\n- {{name}}: {{price}} EUR\n{{/products}}\n\nThe Shop',
	headers => '{"X-Campaign": "promo_winback", "X-Template": "winback"}') \g /dev/null
SQL

# Campaign A arrives as an export (recipient and data, one CSV line per
# customer): COPY, streamed, naming the template.
q -c "COPY (SELECT email, 'promo_black_friday', 'black_friday', data FROM shop.campaign_data ORDER BY id)
	  TO STDOUT WITH (FORMAT csv)" |
	q -c "COPY gatekeeper.mail (recipient, queue, template, data) FROM STDIN WITH (FORMAT csv)"

q -v n="$N" <<'SQL'
-- Campaign B, to three customers in five, due now.
INSERT INTO gatekeeper.mail (recipient, queue, template, data)
SELECT email, 'promo_new_arrivals', 'new_arrivals', data
  FROM shop.campaign_data
 WHERE id % 5 IN (0, 1, 2);

-- Orders placed now, each with its receipt in the same transaction: a
-- receipt exists only if its order commits.
BEGIN;
WITH o AS (
	INSERT INTO shop.orders (customer, total)
	SELECT id, 10 + (id * 7919 % 19000) / 100.0
	  FROM shop.customer
	 WHERE id % 25 = 0
	RETURNING id, customer, total
)
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, headers, dedupe_key)
SELECT c.email, format('Your order #%s', o.id),
	   format(E'Hi %s,\n\nThank you for your order of $%s.\n\nThe Shop', c.first_name, o.total),
	   'receipts', jsonb_build_object('X-Campaign', 'receipts', 'X-Order', o.id::text),
	   'order-' || o.id
  FROM o JOIN shop.customer c ON c.id = o.customer;
COMMIT;

-- A few checkouts the way a web request does them: one order, one
-- gatekeeper.enqueue, one transaction.
BEGIN;
WITH o AS (
	INSERT INTO shop.orders (customer, total)
	SELECT g * 11, 42.00 FROM generate_series(1, 5) g
	RETURNING id, customer, total
)
SELECT gatekeeper.enqueue(c.email, format('Your order #%s', o.id),
						  format(E'Hi %s,\n\nThank you for your order of $%s.\n\nThe Shop', c.first_name, o.total),
						  queue => 'receipts',
						  headers => jsonb_build_object('X-Campaign', 'receipts', 'X-Order', o.id::text),
						  dedupe_key => 'order-' || o.id)
  FROM o JOIN shop.customer c ON c.id = o.customer \g /dev/null
COMMIT;
SQL

# A checkout retried by the browser enqueues its receipt twice: the dedupe
# key makes it one mail.  A checkout whose payment fails rolls back: its
# receipt never existed.
RETRY=$(q -At <<'SQL'
BEGIN;
INSERT INTO shop.orders (customer, total) VALUES (7, 19.99) RETURNING id \gset
SELECT gatekeeper.enqueue('customer7@example.com', 'Your order #' || :id, 'Thank you for your order.',
						  queue => 'receipts', headers => '{"X-Campaign": "receipts"}',
						  dedupe_key => 'order-' || :id) AS first \gset
SELECT gatekeeper.enqueue('customer7@example.com', 'Your order #' || :id, 'Thank you for your order.',
						  queue => 'receipts', headers => '{"X-Campaign": "receipts"}',
						  dedupe_key => 'order-' || :id) AS second \gset
COMMIT;
SELECT CASE WHEN :first = :second THEN 'one mail' ELSE 'TWO mails' END;
SQL
)
ROLLED_BACK=$(q -At <<'SQL'
BEGIN;
INSERT INTO shop.orders (customer, total) VALUES (8, 500.00) RETURNING id \gset
SELECT gatekeeper.enqueue('customer8@example.com', 'Your order #' || :id, 'Thank you for your order.',
						  queue => 'receipts', headers => '{"X-Campaign": "receipts"}',
						  dedupe_key => 'order-' || :id) AS mail_id \gset
ROLLBACK;
SELECT count(*) FROM gatekeeper.mail WHERE id = :mail_id;
SQL
)

q -v n="$N" <<'SQL'
-- Scheduled a few seconds ahead: campaign C to two customers in five
-- (overlapping B), and shipping notices.
INSERT INTO gatekeeper.mail (recipient, queue, template, data, send_at)
SELECT email, 'promo_winback', 'winback', data, now() + interval '5 seconds'
  FROM shop.campaign_data
 WHERE id % 5 IN (2, 3);

INSERT INTO gatekeeper.mail (recipient, subject, body, queue, headers, send_at)
SELECT c.email, format('Order #%s has shipped', o.id),
	   format(E'Hi %s,\n\nYour order #%s is on its way.\n\nThe Shop', c.first_name, o.id),
	   'receipts', jsonb_build_object('X-Campaign', 'receipts', 'X-Order', o.id::text),
	   now() + interval '5 seconds'
  FROM shop.orders o JOIN shop.customer c ON c.id = o.customer
 WHERE o.id % 2 = 0;
SQL
T1=$(date +%s.%N)

TOTAL=$(q1 "SELECT count(*) FROM gatekeeper.mail")
PROMO_MAILS=$(q1 "SELECT count(*) FROM gatekeeper.mail WHERE queue LIKE 'promo\_%'")
PROMO_PEOPLE=$(q1 "SELECT count(DISTINCT lower(recipient)) FROM gatekeeper.mail WHERE queue LIKE 'promo\_%'")
RECEIPTS=$(q1 "SELECT count(*) FROM gatekeeper.mail WHERE queue = 'receipts'")
printf '\n'
q -P footer=off -c "SELECT queue, count(*) AS mails, count(DISTINCT recipient) AS recipients,
	count(*) FILTER (WHERE send_at > now()) AS due_later
	FROM gatekeeper.mail GROUP BY queue ORDER BY queue"
printf '  %s mails enqueued in %.1f s: %s promotional to %s customers, %s receipts\n' \
	"$TOTAL" "$(awk -v a="$T0" -v b="$T1" 'BEGIN { print b - a }')" "$PROMO_MAILS" "$PROMO_PEOPLE" "$RECEIPTS"
printf '  retried checkout with a dedupe key: %s; rolled-back checkout: %s receipt(s)\n' "$RETRY" "$ROLLED_BACK"
printf '  gatekeeper workers running: %s\n\n' \
	"$(q1 "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'gatekeeper worker'")"

# ------------------------------------------------------------ 6. delivery
gk_log "6/7 delivery (progress every 2 s, at most ${TIMEOUT} s)"
count_received() {
	find "$MAILDIR" -type f | wc -l
}
START=$(date +%s)
DONE=0
while :; do
	read -r SCHEDULED DUE CLAIMED SENT SUPPRESSED FAILED OTHER < <(q -At -F ' ' -c "
		SELECT sum(scheduled), sum(due), sum(claimed), sum(sent), sum(suppressed), sum(failed),
			   sum(expired + cancelled + unknown)
		  FROM gatekeeper.queue_stats")
	RECEIVED=$(count_received)
	ELAPSED=$(($(date +%s) - START))
	printf '  %4ds  scheduled %7s (due %7s)  claimed %6s  sent %7s  suppressed %7s  failed %s | relay received %7s\n' \
		"$ELAPSED" "$SCHEDULED" "$DUE" "$CLAIMED" "$SENT" "$SUPPRESSED" "$FAILED" "$RECEIVED"
	if [ "$((SCHEDULED + CLAIMED))" -eq 0 ]; then
		DONE=1
		break
	fi
	if [ "$ELAPSED" -ge "$TIMEOUT" ]; then
		gk_warn "delivery did not finish within ${TIMEOUT} s (GK_DEMO_TIMEOUT); reporting what happened so far"
		break
	fi
	sleep 2
done
# The relay has the last messages once their sessions end; give it a moment.
for _ in $(seq 1 50); do
	[ "$(count_received)" -ge "$(q1 "SELECT count(*) FROM gatekeeper.mail_status WHERE state = 'sent'")" ] && break
	sleep 0.2
done

# ------------------------------------------------------------ 7. later that day
gk_log "7/7 later that day: a hard bounce, an unsubscribe, a new customer, a reminder"
# $UNSUB clicks "unsubscribe" in the promotional mail they received: the
# shop's endpoint gets the token of the List-Unsubscribe URL (here read from
# the message the relay received) and passes it to gatekeeper.unsubscribe(),
# which suppresses $UNSUB for the queue that mail came from.
read -r UNSUB_URL UNSUB_QUEUE < <(grep -rli "^X-Rcpt-Args: <$UNSUB>" "$MAILDIR" | xargs -r awk '
	function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t\r]+$/, "", s); return s }
	function header_done() {
		if (name == "list-unsubscribe") url = value
		else if (name == "x-campaign") campaign = value
		name = ""
	}
	FNR == 1 { in_header = 1; url = campaign = name = "" }
	!in_header { next }
	/^[ \t]/ { value = value trim($0); next }
	/^\r?$/ { header_done(); in_header = 0; if (url != "") { print url, campaign; exit } next }
	{ header_done(); i = index($0, ":"); name = tolower(substr($0, 1, i - 1)); value = trim(substr($0, i + 1)) }
') || true
TOKEN=$(printf '%s' "${UNSUB_URL:-}" | sed -n 's|^<https://shop\.example\.com/unsubscribe/\([A-Za-z0-9_-]*\)>$|\1|p')
[ -n "$TOKEN" ] || gk_die "the relay received no mail to $UNSUB with a List-Unsubscribe token"
UNSUBSCRIBED=$(q1 "SELECT gatekeeper.unsubscribe('$TOKEN')")
printf '  %s unsubscribed from %s: List-Unsubscribe: %s -> gatekeeper.unsubscribe(token) = %s\n' \
	"$UNSUB" "$UNSUB_QUEUE" "$UNSUB_URL" "$UNSUBSCRIBED"

# A customer signs up, and the shop sends a reminder in that same campaign
# to the new customer, to the one who unsubscribed and to the one whose
# mailbox does not exist (a hard bounce this morning).
NEWCOMER=customer$((N + 1))@example.com
q -v n="$N" -v queue="$UNSUB_QUEUE" -v bounced="$BOUNCED" -v unsub="$UNSUB" -v newcomer="$NEWCOMER" <<'SQL'
INSERT INTO shop.customer VALUES (:n + 1, :'newcomer', 'Nina');
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, headers)
SELECT email, 'Black Friday: the last hours',
	   format(E'Hi %s,\n\n40 %% off everything ends tonight.\n\nThe Shop', first_name),
	   :'queue', jsonb_build_object('X-Campaign', :'queue')
  FROM shop.customer
 WHERE email IN (:'bounced', :'unsub', :'newcomer');
SQL
for _ in $(seq 1 150); do
	[ "$(q1 "SELECT count(*) FROM gatekeeper.mail_status
			  WHERE subject = 'Black Friday: the last hours' AND state IN ('scheduled', 'claimed')")" = 0 ] && break
	sleep 0.2
done
for _ in $(seq 1 50); do
	grep -rqsi "^X-Rcpt-Args: <$NEWCOMER>" "$MAILDIR" && break
	sleep 0.2
done

# ------------------------------------------------------------ report
printf '\n==================== gatekeeper: queue_stats ====================\n'
q -P footer=off -c "SELECT queue, scheduled, claimed, sent, suppressed, failed, expired, cancelled, unknown
	FROM gatekeeper.queue_stats ORDER BY queue"

# One line per received message: envelope recipient, Message-ID, campaign.
# Headers end at the first empty line; folded lines are unfolded.
find "$MAILDIR" -type f -size +0 -print0 | xargs -0 -r awk '
	function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t\r]+$/, "", s); return s }
	function header_done() {
		if (name == "x-rcpt-args") { split(value, w, " "); rcpt = tolower(w[1]); gsub(/[<>]/, "", rcpt) }
		else if (name == "message-id") mid = value
		else if (name == "x-campaign") campaign = value
		else if (name == "subject") subject = value
		name = ""
	}
	function emit() {
		if (in_header) header_done()
		print (rcpt == "" ? "?" : rcpt) "\t" (mid == "" ? "-" : mid) "\t" (campaign == "" ? "?" : campaign) "\t" subject
	}
	FNR == 1 { if (seen) emit(); seen = 1; in_header = 1; rcpt = mid = campaign = subject = name = "" }
	!in_header { next }
	/^[ \t]/ { value = value " " trim($0); next }
	/^\r?$/ { header_done(); in_header = 0; next }
	{ header_done(); i = index($0, ":"); name = tolower(substr($0, 1, i - 1)); value = trim(substr($0, i + 1)) }
	END { if (seen) emit() }
' >"$WORK/received.tsv"

RECEIVED=$(wc -l <"$WORK/received.tsv")
read -r RCPTS PROMO_RCVD PROMO_RCPTS PROMO_MAX PROMO_MULTI RECEIPTS_RCVD < <(awk -F '\t' '
	{ r[$1] = 1 }
	$3 ~ /^promo_/ { promo++; p[$1]++ }
	$3 == "receipts" { receipts++ }
	END {
		for (k in r) nr++
		for (k in p) { np++; if (p[k] > max) max = p[k]; if (p[k] > 1) multi++ }
		print nr + 0, promo + 0, np + 0, max + 0, multi + 0, receipts + 0
	}' "$WORK/received.tsv")
read -r DUP_IDS NO_IDS < <(awk -F '\t' '
	$2 == "-" { none++; next }
	{ c[$2]++ }
	END { for (k in c) if (c[k] > 1) dup += c[k] - 1; print dup + 0, none + 0 }' "$WORK/received.tsv")
# Delivery rate from the files' modification times (each is written as its
# message arrives).  Gaps over a second (the wait for mail scheduled later)
# count as idle, not as delivery time.
RATE=$(find "$MAILDIR" -type f -size +0 -printf '%T@\n' | sort -n | awk '
	NR == 1 { first = $1 }
	NR > 1 { gap = $1 - prev; active += (gap > 1 ? 1 : gap) }
	{ prev = $1; per[int($1)]++ }
	END {
		if (NR < 2 || active <= 0) { print "n/a"; exit }
		for (s in per) if (per[s] > peak) peak = per[s]
		printf "%.0f messages/s while delivering (%d messages, %.1f s busy, %.1f s first to last; busiest second: %d)", NR / active, NR, active, prev - first, peak
	}')

printf '\n==================== the relay received (Postfix; the files smtp-sink wrote behind it) ====================\n'
printf '  messages                         %s\n' "$RECEIVED"
printf '  distinct recipients              %s\n' "$RCPTS"
printf '  promotional messages             %s, to %s customers\n' "$PROMO_RCVD" "$PROMO_RCPTS"
printf '  most promotional mails to one    %s   (customers with more than one: %s)\n' "$PROMO_MAX" "$PROMO_MULTI"
printf '  receipts and shipping notices    %s\n' "$RECEIPTS_RCVD"
printf '  duplicate Message-IDs            %s   (messages without one: %s)\n' "$DUP_IDS" "$NO_IDS"
printf '  delivery rate                    %s\n' "$RATE"

# ------------------------------------------------------------ suppression report
printf '\n==================== a hard bounce and an unsubscribe: gatekeeper ====================\n'
q -P footer=off -c "SELECT address, coalesce(queue, '(every queue)') AS queue, reason, detail, mail_id
	FROM gatekeeper.suppression ORDER BY created_at"
q -P footer=off -v bounced="$BOUNCED" -v unsub="$UNSUB" -v newcomer="$NEWCOMER" <<'SQL'
SELECT recipient, queue, coalesce(subject, 'template ' || template) AS subject, state, last_error
  FROM gatekeeper.mail_status
 WHERE lower(recipient) IN (:'bounced', :'unsub', :'newcomer')
 ORDER BY recipient, id;
SQL
REFUSAL_LINES=$(grep -F "NOQUEUE: reject: RCPT from" "$WORK/postfix.log" | grep -F "<$BOUNCED>" || true)
REFUSALS=$(printf '%s' "$REFUSAL_LINES" | grep -c . || true)
relay_got() {
	awk -F '\t' -v r="$1" -v s="${2:-}" '$1 == r && (s == "" || $4 == s) { n++ } END { print n + 0 }' "$WORK/received.tsv"
}
relay_subjects() {
	awk -F '\t' -v r="$1" '$1 == r { printf "%s%s", (n++ ? "; " : ""), $4 } END { if (!n) printf "nothing" }' "$WORK/received.tsv"
}
REMINDER='Black Friday: the last hours'
printf '\n==================== a hard bounce and an unsubscribe: the relay ====================\n'
printf "  Postfix refused %s %s time(s):\n" "$BOUNCED" "$REFUSALS"
printf '%s\n' "$REFUSAL_LINES" | sed -e 's/^/    /'
for r in "$BOUNCED" "$UNSUB" "$NEWCOMER"; do
	printf '  received for %-26s %s\n' "$r:" "$(relay_subjects "$r")"
done

read -r B_STATES B_SUPPRESSION U_SUPPRESSION R_BOUNCED R_UNSUB R_NEWCOMER < <(
	q -At -F ' ' -v bounced="$BOUNCED" -v unsub="$UNSUB" -v newcomer="$NEWCOMER" -v queue="$UNSUB_QUEUE" <<'SQL'
SELECT (SELECT string_agg(DISTINCT state::text, ',' ORDER BY state::text) FROM gatekeeper.mail_status
		 WHERE lower(recipient) = :'bounced'),
	   (SELECT coalesce(queue, '*') || ':' || reason || ':' || (detail LIKE '550 5.1.1 %')
		  FROM gatekeeper.suppression WHERE address = :'bounced'),
	   (SELECT coalesce(queue, '*') || ':' || reason FROM gatekeeper.suppression WHERE address = :'unsub'),
	   (SELECT state || ':' || coalesce(replace(last_error, ' ', '_'), '-') FROM gatekeeper.mail_status
		 WHERE recipient = :'bounced' AND subject = 'Black Friday: the last hours'),
	   (SELECT state || ':' || coalesce(replace(last_error, ' ', '_'), '-') FROM gatekeeper.mail_status
		 WHERE recipient = :'unsub' AND subject = 'Black Friday: the last hours'),
	   (SELECT state FROM gatekeeper.mail_status
		 WHERE recipient = :'newcomer' AND subject = 'Black Friday: the last hours');
SQL
)

# ------------------------------------------------------------ personalised
# Every message the relay received from a template (its X-Template
# header, which the templates add), its text part decoded
# (quoted-printable, UTF-8): the recipient, the template, the name after
# "Hi" and the products listed; then compared, in the database, with what
# the shop holds for that recipient.
/usr/bin/python3 - "$MAILDIR" >"$WORK/personal.tsv" <<'PY'
import email, os, re, sys
d = sys.argv[1]
for f in sorted(os.listdir(d)):
	with open(os.path.join(d, f), 'rb') as fh:
		m = email.message_from_binary_file(fh)
	template = str(m.get('X-Template', '')).strip()
	if not template:
		continue
	rcpt = str(m.get('X-Rcpt-Args', '')).split(' ')[0].strip('<>').lower()
	text = ''
	for part in m.walk():
		if part.get_content_type() == 'text/plain':
			text = part.get_payload(decode=True).decode(part.get_content_charset() or 'utf-8')
			break
	text = text.replace('\r\n', '\n')
	hi = re.search(r'^Hi (.*),$', text, re.M)
	products = re.findall(r'^- (.*): [0-9.]+ EUR$', text, re.M)
	print('\t'.join([rcpt, template, hi.group(1) if hi else '', '|'.join(products)]))
PY
q -c "CREATE TABLE shop.received (recipient text, template text, first_name text, products text)"
q -c "COPY shop.received FROM STDIN" <"$WORK/personal.tsv"
read -r PERSONAL_N PERSONAL_BAD < <(q -At -F ' ' -c "
	SELECT count(*), count(*) FILTER (WHERE e.email IS NULL OR r.first_name IS DISTINCT FROM e.first_name
											OR r.products IS DISTINCT FROM e.products)
	  FROM shop.received r
	  LEFT JOIN (SELECT c.email, c.first_name, string_agg(p.name, '|' ORDER BY x.rank) AS products
				   FROM shop.customer c
				   JOIN shop.recommendation x ON x.customer = c.id
				   JOIN shop.product p ON p.id = x.product
				  GROUP BY c.email, c.first_name) e ON e.email = r.recipient")
PERSONAL_NAMES=$(q1 "SELECT count(DISTINCT first_name) FROM shop.received")
PERSONAL_LISTS=$(q1 "SELECT count(DISTINCT products) FROM shop.received")
# the mails gatekeeper sent from a template, by gatekeeper.events
TEMPLATED_SENT=$(q1 "SELECT count(*) FROM gatekeeper.events WHERE event = 'sent' AND template IS NOT NULL")
printf '\n==================== personalised: what the relay received ====================\n'
for r in customer6@example.com customer7@example.com; do
	printf '  %s:\n' "$r"
	awk -F '\t' -v r="$r" '$1 == r { printf "    %s: Hi %s; picked for you: %s\n", $2, $3, $4 }' "$WORK/personal.tsv"
done
printf '  %s messages rendered from a template read (gatekeeper sent %s): %s first names, %s different product lists, %s not their own customer'"'"'s\n' \
	"$PERSONAL_N" "$TEMPLATED_SENT" "$PERSONAL_NAMES" "$PERSONAL_LISTS" "$PERSONAL_BAD"
printf '\n==================== by template: gatekeeper.events ====================\n'
q -P footer=off -c "SELECT coalesce(template, '(none)') AS template,
	count(*) FILTER (WHERE event = 'sent') AS sent, count(*) FILTER (WHERE event = 'bounced') AS bounced
	FROM gatekeeper.events GROUP BY template ORDER BY template"

# ------------------------------------------------------------ checks
read -r SENT_DB LIVE_DB BAD_DB FAILED_DB < <(q -At -F ' ' -c "
	SELECT count(*) FILTER (WHERE state = 'sent'),
		   count(*) FILTER (WHERE state IN ('scheduled', 'claimed')),
		   count(*) FILTER (WHERE state IN ('expired', 'unknown', 'cancelled')),
		   count(*) FILTER (WHERE state = 'failed')
	  FROM gatekeeper.mail_status")
# every customer a promotional mail was meant for, but the one whose
# mailbox does not exist
PROMO_PEOPLE=$(q1 "SELECT count(DISTINCT lower(recipient)) FROM gatekeeper.mail
	WHERE queue LIKE 'promo\_%' AND lower(recipient) <> '$BOUNCED'")
PASS=0
FAIL=0
# check CONDITION-COMMAND... -- DESCRIPTION
check() {
	local desc=${*: -1}
	if "${@:1:$#-2}"; then
		printf '  PASS  %s\n' "$desc"
		PASS=$((PASS + 1))
	else
		printf '  FAIL  %s\n' "$desc"
		FAIL=$((FAIL + 1))
	fi
}
all() { local c; for c in "$@"; do eval "$c" || return 1; done; }

printf '\n==================== checks ====================\n'
check all '[ "$DONE" -eq 1 ]' '[ "$LIVE_DB" -eq 0 ]' -- \
	"every mail reached a final state ($LIVE_DB still scheduled or claimed)"
check all '[ "$BAD_DB" -eq 0 ]' '[ "$FAILED_DB" -eq 1 ]' -- \
	"one mail failed, the hard bounce ($FAILED_DB); none expired, cancelled or unknown ($BAD_DB)"
check [ "$RECEIVED" -eq "$SENT_DB" ] -- \
	"the relay received exactly what gatekeeper marked sent ($RECEIVED received, $SENT_DB sent)"
check [ "$PROMO_MAX" -eq 1 ] -- \
	"smart sending: no customer got more than one promotional mail (most: $PROMO_MAX)"
check [ "$PROMO_RCPTS" -eq "$PROMO_PEOPLE" ] -- \
	"every customer in a campaign but the bounced one got one ($PROMO_RCPTS of $PROMO_PEOPLE)"
check all '[ "$REFUSALS" -eq 1 ]' '[ "$(relay_got "$BOUNCED")" -eq 0 ]' -- \
	"hard bounce: Postfix refused $BOUNCED once with 550 5.1.1 and received nothing for it ($REFUSALS refusal(s))"
check all '[ "$B_STATES" = "failed,suppressed" ]' '[ "$B_SUPPRESSION" = "*:hard_bounce:true" ]' \
	'[ "$R_BOUNCED" = "suppressed:suppressed:_hard_bounce" ]' -- \
	"hard bounce: gatekeeper failed that mail, suppressed the address in every queue, and suppressed its later mail ($B_STATES; $B_SUPPRESSION; reminder $R_BOUNCED)"
check all '[ "$UNSUBSCRIBED" = t ]' '[ "$U_SUPPRESSION" = "$UNSUB_QUEUE:unsubscribe" ]' \
	'[ "$R_UNSUB" = "suppressed:suppressed:_unsubscribe" ]' -- \
	"unsubscribe: the token from the delivered List-Unsubscribe suppressed $UNSUB for $UNSUB_QUEUE, and the reminder to them ($U_SUPPRESSION; reminder $R_UNSUB)"
check all '[ "$(relay_got "$UNSUB" "$REMINDER")" -eq 0 ]' '[ "$(relay_got "$NEWCOMER" "$REMINDER")" -eq 1 ]' \
	'[ "$R_NEWCOMER" = sent ]' -- \
	"the relay received the reminder for the new customer ($R_NEWCOMER), not for $UNSUB"
check [ "$RECEIPTS_RCVD" -eq "$RECEIPTS" ] -- \
	"every committed receipt arrived ($RECEIPTS_RCVD of $RECEIPTS)"
check all '[ "$DUP_IDS" -eq 0 ]' '[ "$NO_IDS" -eq 0 ]' -- \
	"every message has its own Message-ID ($DUP_IDS duplicates, $NO_IDS missing)"
check all '[ "$PERSONAL_N" -eq "$TEMPLATED_SENT" ]' '[ "$PERSONAL_N" -gt 0 ]' '[ "$PERSONAL_BAD" -eq 0 ]' -- \
	"templates: every message sent from a template shows its own customer's first name and recommended products ($PERSONAL_N received of $TEMPLATED_SENT sent, $PERSONAL_BAD wrong)"
check [ "$RETRY" = "one mail" ] -- "a retried checkout with a dedupe key made one mail ($RETRY)"
check [ "$ROLLED_BACK" = 0 ] -- "a rolled-back checkout left no mail ($ROLLED_BACK)"

printf '\n'
if [ "$FAIL" -eq 0 ]; then
	printf 'DEMO OK: %s checks passed\n' "$PASS"
	exit 0
fi
if [ "${GK_DEMO_KEEP:-0}" = 1 ]; then
	printf 'DEMO FAILED: %s of %s checks failed (server log: %s)\n' "$FAIL" "$((PASS + FAIL))" "$WORK/postgres.log"
else
	printf 'DEMO FAILED: %s of %s checks failed (GK_DEMO_KEEP=1 keeps the logs and the received mail)\n' \
		"$FAIL" "$((PASS + FAIL))"
fi
exit 1
