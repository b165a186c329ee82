#!/usr/bin/env bash
# bench/templates.sh: a campaign stored once (issue 48), templated against
# rendered, as root:
#
#   GK_PG_BIN=/usr/lib/postgresql/15/bin bash bench/templates.sh [MAILS] [RUNS]
#
# With gatekeeper installed in GK_PG_BIN's PostgreSQL: a throwaway cluster
# (as postgres, in a fresh temporary directory, Unix socket only; fsync,
# synchronous_commit and full_page_writes on, as bench/lib.sh's) with one
# worker and 16 connections to Postfix's smtp-sink on a free loopback port.
# The campaign: MAILS (default 20,000) customers and one template whose
# html is 20 KB (an email-like table layout with inline styles and text
# that differs paragraph to paragraph) with 10 substitutions outside one
# loop over 5 recommended products (5 substitutions each), a text body
# with the same loop, and a subject with the first name.  Each of RUNS
# (default 3) rounds, alternating which goes first, measures both:
#
#   templated  INSERT INTO gatekeeper.mail (recipient, queue, template, data)
#              SELECT email, ..., jsonb_build_object(...) FROM customers
#   rendered   INSERT INTO gatekeeper.mail (recipient, queue, subject, body, html)
#              SELECT email, ..., subject, body, html FROM rendered
#              (the same mails, rendered beforehand by gatekeeper.render into
#              a table, not timed: the application's rendering is free here)
#
# and for each: (a) the enqueue rate (one statement, committed), (b) what
# the campaign stored: the growth of gatekeeper.mail's partitions (heap,
# TOAST, indexes) and the WAL the statement wrote (pg_current_wal_lsn
# before and after), (d) the delivery rate to smtp-sink (the queue was
# paused while loading; from resume until queue_stats shows nothing
# scheduled or claimed) and the worker's CPU per mail (utime + stime of
# the gatekeeper processes, /proc/<pid>/stat) and their private memory
# (RssAnon, /proc/<pid>/status, the most seen while delivering).  Then
# (c) render() calls/s
# from one backend: SELECT count(*) over MAILS rows of gatekeeper.render
# of that template, as is and with jit off, and the same scan without
# render().  Prints each run and the medians with the ratios.
# Bounded: a delivery waits at most 600 s; everything started is stopped
# on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
. "$ROOT/scripts/lib.sh"

N=${1:-20000}
RUNS=${2:-3}
WORK=$(mktemp -d /tmp/gk-templates.XXXXXX)
SINK_PID=
cleanup() {
	[ -n "$SINK_PID" ] && kill "$SINK_PID" 2>/dev/null || true
	runuser -u postgres -- "$GK_PG_BIN/pg_ctl" -D "$WORK/data" -m immediate stop >/dev/null 2>&1 || true
	rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

SPORT=$(gk_free_port)
mkdir -p "$WORK/sink"
chown -R postgres "$WORK"
chmod 755 "$WORK"
runuser -u postgres -- "$GK_PG_BIN/initdb" -D "$WORK/data" --no-locale -E UTF8 >/dev/null
cat >>"$WORK/data/postgresql.conf" <<EOF
listen_addresses = ''
unix_socket_directories = '$WORK'
shared_buffers = '1GB'
max_wal_size = '8GB'
min_wal_size = '1GB'
checkpoint_timeout = '30min'
synchronous_commit = on
fsync = on
full_page_writes = on
shared_preload_libraries = 'gatekeeper'
gatekeeper.database = 'postgres'
gatekeeper.smtp_url = 'smtp://127.0.0.1:$SPORT'
gatekeeper.smtp_connections = 16
gatekeeper.default_sender = 'bench@example.com'
EOF
(cd "$WORK/sink" && exec runuser -u postgres -- timeout 3600 /usr/sbin/smtp-sink -c -m 64 "127.0.0.1:$SPORT" 256 >/dev/null 2>&1) &
SINK_PID=$!
runuser -u postgres -- "$GK_PG_BIN/pg_ctl" -D "$WORK/data" -l "$WORK/log" -w start >/dev/null

psqlq() { runuser -u postgres -- "$GK_PG_BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h "$WORK" -d postgres "$@"; }
sql() { psqlq -c "$1"; }

sql "CREATE EXTENSION gatekeeper"

# The template: 20 KB of html, generated (deterministic) by python.
/usr/bin/python3 - "$N" >"$WORK/setup.sql" <<'PY'
import random, sys
n = int(sys.argv[1])
rnd = random.Random(48)
words = ('autumn winter collection wool cotton linen leather boots jacket scarf gloves '
		 'delivery free returns member points store online offer limited edition warm '
		 'light water resistant handmade classic modern colour size fit comfort style '
		 'recycled organic premium everyday weekend travel city mountain coast garden').split()
def para(k):
	return ' '.join(rnd.choice(words) for _ in range(k)).capitalize() + '.'
td = 'style="font-family:Helvetica,Arial,sans-serif;font-size:15px;line-height:22px;color:#333333;padding:8px 24px;"'
parts = ['<!DOCTYPE html><html><head><meta charset="utf-8"><title>{{first_name}}, picked for you</title>'
		 '<style>body{margin:0;padding:0;background:#f4f4f4}table{border-collapse:collapse}'
		 'a{color:#1a73e8;text-decoration:none}.btn{background:#1a73e8;color:#fff;padding:12px 24px;border-radius:4px}</style>'
		 '</head><body><table width="100%" cellpadding="0" cellspacing="0" bgcolor="#f4f4f4"><tr><td align="center">'
		 '<table width="600" cellpadding="0" cellspacing="0" bgcolor="#ffffff">',
		 f'<tr><td {td}><h1 style="font-size:26px;margin:0">Hello {{{{first_name}}}} {{{{last_name}}}}</h1></td></tr>',
		 f'<tr><td {td}>As a {{{{tier}}}} member since {{{{since}}}} you have {{{{points}}}} points to spend in our {{{{city}}}} store.</td></tr>']
subs_text = []
i = 0
while len(''.join(parts)) < 15500:
	parts.append(f'<tr><td {td}><p style="margin:0 0 12px 0">{para(40)}</p></td></tr>')
	i += 1
	if i == 6:
		parts.append(f'<tr><td {td}><table width="100%" cellpadding="0" cellspacing="0">'
					 '{{#products}}<tr><td style="padding:12px 0;border-bottom:1px solid #eeeeee;">'
					 '<a href="https://shop.example.com/p/{{sku}}?utm_campaign=autumn"><img src="https://cdn.shop.example.com/img/{{sku}}.jpg" width="120" height="120" alt="{{name}}" style="display:block;border:0"></a>'
					 '</td><td style="padding:12px 16px;font-family:Helvetica,Arial,sans-serif;font-size:15px;color:#333333;">'
					 '<a href="https://shop.example.com/p/{{sku}}" style="font-weight:bold">{{name}}</a><br>{{price}} EUR</td></tr>{{/products}}'
					 '</table></td></tr>')
parts.append(f'<tr><td {td}>Your code <b>{{{{coupon}}}}</b> gives 15 % off until Sunday, {{{{first_name}}}}.</td></tr>')
parts.append(f'<tr><td {td}><a class="btn" href="https://shop.example.com/account/{{{{customer_id}}}}">Open my account</a></td></tr>')
parts.append(f'<tr><td {td} style="font-size:12px;color:#999999">You receive this mail as a customer of the Shop, {{{{first_name}}}}. '
			 + para(30) + '</td></tr></table></td></tr></table></body></html>')
html = ''.join(parts)
# the loop adds 5 items of ~620 octets once rendered: pad the template to 20 KB rendered
while len(html) < 20480 - 5 * 560:
	html = html.replace('</table></td></tr></table></body>', f'<tr><td {td}>{para(12)}</td></tr></table></td></tr></table></body>', 1)
body = ('Hello {{first_name}},\n\nAs a {{tier}} member you have {{points}} points. Picked for you:\n'
		'{{#products}}\n- {{name}}: {{price}} EUR https://shop.example.com/p/{{sku}}\n{{/products}}\n'
		'\nYour code {{coupon}} gives 15 % off until Sunday.\n\nThe Shop\n')
def dq(s):
	return '$t$' + s + '$t$'
print('SELECT gatekeeper.create_template(%s, subject => %s, body => %s, html => %s);' % (
	"'autumn'", dq('{{first_name}}, picked for you: autumn'), dq(body), dq(html)))
print(f"""
CREATE TABLE product (sku text PRIMARY KEY, name text, price numeric);
INSERT INTO product SELECT 'SKU' || g, initcap((ARRAY['wool','linen','leather','cotton','cashmere'])[1 + g % 5]) || ' ' ||
	(ARRAY['scarf','jacket','boots','gloves','sweater','hat','bag'])[1 + g % 7] || ' no. ' || g, 10 + (g * 37 % 190)
  FROM generate_series(1, 200) g;
CREATE TABLE customer (id int PRIMARY KEY, email text, first_name text, last_name text, city text,
	tier text, since int, points int, coupon text, products jsonb);
INSERT INTO customer
SELECT g, 'customer' || g || '@example.com',
	   (ARRAY['Ada','Grace','Linus','Margaret','Ken','Barbara','Zoë'])[1 + g % 7],
	   (ARRAY['Lovelace','Hopper','Torvalds','Hamilton','Thompson','Liskov','Ødegaard'])[1 + g % 7 + 0],
	   (ARRAY['Paris','Lyon','Berlin','Oslo','Madrid'])[1 + g % 5],
	   (ARRAY['silver','gold','platinum'])[1 + g % 3], 2000 + g % 25, g * 7 % 5000,
	   upper(substr(md5(g::text), 1, 8)),
	   (SELECT jsonb_agg(jsonb_build_object('sku', p.sku, 'name', p.name, 'price', p.price) ORDER BY k)
		  FROM generate_series(0, 4) k JOIN product p ON p.sku = 'SKU' || (1 + (g * 13 + k * 41) % 200))
  FROM generate_series(1, {n}) g;
CREATE VIEW campaign AS
SELECT id, email, jsonb_build_object('customer_id', id, 'first_name', first_name, 'last_name', last_name,
	   'city', city, 'tier', tier, 'since', since, 'points', points, 'coupon', coupon,
	   'products', products) AS data
  FROM customer;
-- the same campaign rendered beforehand (the application's work, not timed)
CREATE TABLE rendered AS
SELECT c.id, c.email, r.subject, r.body, r.html
  FROM campaign c, gatekeeper.render('autumn', c.data) r;
ALTER TABLE rendered ADD PRIMARY KEY (id);
VACUUM ANALYZE customer;
VACUUM ANALYZE rendered;
""")
PY
psqlq -f "$WORK/setup.sql" >/dev/null
read -r HTML_T HTML_R STORED_R < <(psqlq -F ' ' -c "SELECT octet_length(html),
	(SELECT avg(octet_length(html))::int FROM rendered),
	(SELECT avg(pg_column_size(html))::int FROM rendered) FROM gatekeeper.template WHERE name = 'autumn'")
printf 'template html %s octets; rendered html %s octets on average (%s stored, compressed); %s mails per campaign\n' \
	"$HTML_T" "$HTML_R" "$STORED_R" "$N"

PIDS=$(sql "SELECT string_agg(pid::text, ' ') FROM pg_stat_activity WHERE backend_type LIKE 'gatekeeper%'")
[ -n "$PIDS" ] || gk_die "no gatekeeper worker started"
cpu_us() {
	local p t=0 v
	for p in $PIDS; do
		v=$(awk -v hz="$(getconf CLK_TCK)" '{ printf "%d\n", ($14 + $15) * 1000000 / hz }' "/proc/$p/stat")
		t=$((t + v))
	done
	echo "$t"
}
# the gatekeeper.mail partitions, with their TOAST and indexes
SIZE_SQL="SELECT coalesce(sum(pg_relation_size(c.oid)), 0) || ' ' ||
	coalesce(sum(pg_total_relation_size(c.reltoastrelid)) FILTER (WHERE c.reltoastrelid <> 0), 0) || ' ' ||
	coalesce(sum(pg_indexes_size(c.oid)), 0)
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = 'gatekeeper.mail'::regclass"

# timed SQL: run SQL (autocommit) in one session with \timing; its
# duration in seconds as psql measured it (the statement, its commit and
# the round trip; not the connection's start)
timed() {
	psqlq -c '\timing on' -c "$1" | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | awk '{ printf "%.6f\n", $1 / 1000 }'
}

# rss_anon_kb: the gatekeeper processes' private memory (RssAnon), kB
rss_anon_kb() {
	local p t=0 v
	for p in $PIDS; do
		v=$(awk '/^RssAnon:/ { print $2 }' "/proc/$p/status")
		t=$((t + ${v:-0}))
	done
	echo "$t"
}

# one_run KIND RUN: enqueue the campaign KIND (templated, rendered) into
# a paused queue of its own, then deliver it; prints one tab-separated line
one_run() {
	local kind=$1 run=$2 q="${1}_$2" ins h0 t0 i0 h1 t1 i1 l0 l1 s0 s1 c0 c1 d0 d1 left rss mem=0
	sql "SELECT gatekeeper.create_queue('$q'); SELECT gatekeeper.pause('$q')" >/dev/null
	if [ "$kind" = templated ]; then
		ins="INSERT INTO gatekeeper.mail (recipient, queue, template, data)
			 SELECT email, '$q', 'autumn', data FROM campaign"
	else
		ins="INSERT INTO gatekeeper.mail (recipient, queue, subject, body, html)
			 SELECT email, '$q', subject, body, html FROM rendered"
	fi
	sql "CHECKPOINT"
	read -r h0 t0 i0 < <(sql "$SIZE_SQL")
	l0=$(sql "SELECT pg_current_wal_lsn()")
	s0=0
	s1=$(timed "$ins")
	l1=$(sql "SELECT pg_current_wal_lsn()")
	read -r h1 t1 i1 < <(sql "$SIZE_SQL")
	c0=$(cpu_us)
	d0=$(date +%s.%N)
	sql "SELECT gatekeeper.resume('$q')" >/dev/null
	left=1
	for _ in $(seq 1 6000); do
		left=$(sql "SELECT scheduled + claimed FROM gatekeeper.queue_stats WHERE queue = '$q'")
		[ "$left" = 0 ] && break
		rss=$(rss_anon_kb)
		[ "$rss" -gt "$mem" ] && mem=$rss
		sleep 0.1
	done
	d1=$(date +%s.%N)
	c1=$(cpu_us)
	[ "$left" = 0 ] || gk_die "$q: $left mails not delivered after 600 s"
	[ "$(sql "SELECT sent FROM gatekeeper.queue_stats WHERE queue = '$q'")" = "$N" ] ||
		gk_die "$q: not every mail was sent: $(sql "SELECT * FROM gatekeeper.queue_stats WHERE queue = '$q'")"
	wal=$(sql "SELECT pg_wal_lsn_diff('$l1', '$l0')::bigint")
	perl -e '
		my ($kind, $run, $n, $s0, $s1, $h, $t, $i, $wal, $d0, $d1, $c, $mem) = @ARGV;
		printf "%s\t%d\t%.0f\t%d\t%d\t%d\t%d\t%d\t%.0f\t%.1f\t%d\n", $kind, $run, $n / ($s1 - $s0),
			$h, $t, $i, $wal, $h + $t + $i + $wal, $n / ($d1 - $d0), $c / $n, $mem;' \
		"$kind" "$run" "$N" "$s0" "$s1" "$((h1 - h0))" "$((t1 - t0))" "$((i1 - i0))" "$wal" "$d0" "$d1" "$((c1 - c0))" "$mem"
}

: >"$WORK/runs.tsv"
printf 'kind\trun\tenqueue/s\theap\ttoast\tindexes\twal\tstored\tdelivered/s\tworker_us/mail\tworker_rss_anon_kB\n'
for run in $(seq 1 "$RUNS"); do
	if [ $((run % 2)) = 1 ]; then order="templated rendered"; else order="rendered templated"; fi
	for kind in $order; do
		one_run "$kind" "$run" | tee -a "$WORK/runs.tsv"
	done
done

# (c) render() from one backend: as a user calls it (the server's
# defaults: JIT may compile the query) and with jit off
: >"$WORK/render.tsv"
RENDER="SELECT count(*) FROM campaign c, gatekeeper.render('autumn', c.data) r WHERE r.html IS NOT NULL"
for run in $(seq 1 "$RUNS"); do
	for what in render render_nojit; do
		case $what in
			render) s1=$(timed "$RENDER") ;;
			render_nojit) s1=$(timed "SET jit = off; $RENDER") ;;
		esac
		perl -e 'printf "%s\t%.0f\n", $ARGV[0], $ARGV[1] / $ARGV[2]' "$what" "$N" "$s1" | tee -a "$WORK/render.tsv"
	done
done
# the same rows without render(): what the scan and jsonb_build_object cost
s0=0
s1=$(timed "SELECT count(*) FROM campaign c WHERE c.data IS NOT NULL")
perl -e 'printf "(the same scan without render(): %.0f rows/s)\n", $ARGV[0] / ($ARGV[2] - $ARGV[1])' "$N" "$s0" "$s1"

perl -e '
	my %v;
	open my $f, "<", $ARGV[0] or die;
	while (<$f>) { chomp; my @c = split /\t/; push @{ $v{$c[0]}[$_] }, $c[$_] for 2 .. 10; }
	my %render;
	open my $g, "<", $ARGV[1] or die;
	while (<$g>) { chomp; my @c = split /\t/; push @{ $render{$c[0]} }, $c[1]; }
	sub med { my @s = sort { $a <=> $b } @_; return $s[$#s / 2]; }
	my @names = (undef, undef, "enqueue/s", "heap", "toast", "indexes", "wal", "stored", "delivered/s", "worker_us/mail",
				 "worker_kB_max");
	printf "\nmedians of %d runs, %d mails each\n", scalar @{ $v{templated}[2] }, $ARGV[2];
	for my $i (2 .. 10) {
		my ($t, $r) = (med(@{ $v{templated}[$i] }), med(@{ $v{rendered}[$i] }));
		printf "%-16s templated %12s  rendered %12s  ratio %s\n", $names[$i], $t, $r,
			$r > 0 ? sprintf("%.3f", $t / $r) : "n/a";
	}
	printf "%-16s %s (jit off: %s)\n", "render()/s",
		med(@{ $render{render} }), med(@{ $render{render_nojit} });
	my $tw = med(@{ $v{templated}[9] }) - med(@{ $v{rendered}[9] });
	printf "worker CPU for rendering: %.1f us a mail (templated minus rendered)\n", $tw;
' "$WORK/runs.tsv" "$WORK/render.tsv" "$N"
