# The floor under a COPY into gatekeeper.mail (bench/notes.md, "COPY's
# floor on PostgreSQL 15"): ROUNDS rounds (default 7) of one server-side
# COPY of N rows (default 200,000, the enqueue scenario's) into each of
# bench_plain, the tables of copy_floor.sql and gatekeeper.mail, in turn,
# each after a TRUNCATE and a CHECKPOINT; wall milliseconds per COPY, and
# the medians with their ratio to bench_plain.  Not part of bench/run.sh.
#
# Needs a scratch database with gatekeeper and bench/sql/setup.sql
# installed, reached through PGHOST/PGPORT/PGDATABASE/PGUSER, psql on PATH,
# and a server that can write CSV (the file goes to $CSV, default
# /tmp/copy_floor.csv, written and read by the server).  It truncates
# gatekeeper's mail.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
N=${N:-200000}; ROUNDS=${ROUNDS:-7}; CSV=${CSV:-/tmp/copy_floor.csv}
TABLES="bench_plain plain_h content content_t content_w content_g gatekeeper.mail"
P() { psql -X -q -At -v ON_ERROR_STOP=1 "$@"; }
P -c "SELECT to_regclass('content_g') IS NULL" | grep -q t && P -f "$HERE/copy_floor.sql" >/dev/null
P -c "COPY (SELECT * FROM bench_rows($N, 'e', 'bench', interval '0')) TO '$CSV' (FORMAT csv)"
out=$(mktemp)
for r in $(seq 1 "$ROUNDS"); do
	line="round $r:"
	for t in $TABLES; do
		# gatekeeper.mail's TRUNCATE takes its state tables along (mail_truncate)
		P -c "TRUNCATE ${TABLES// /, } RESTART IDENTITY" -c CHECKPOINT
		t0=$(date +%s%N)
		P -c "COPY $t (queue, recipient, subject, body, send_at) FROM '$CSV' (FORMAT csv)"
		line="$line $t=$(( ($(date +%s%N) - t0) / 1000000 ))"
	done
	echo "$line" | tee -a "$out"
done
perl -ne 'while (/(\S+)=(\d+)/g) { push @{$m{$1}}, $2; push @o, $1 if @{$m{$1}} == 1 }
	END { sub med { my @s = sort { $a <=> $b } @_; $s[$#s / 2] }
		  my $p = med(@{$m{bench_plain}});
		  printf "%-16s median %6d ms  %.2fx plain\n", $_, med(@{$m{$_}}), $p / med(@{$m{$_}}) for @o }' "$out"
rm -f "$out"
