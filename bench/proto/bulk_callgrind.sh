# Instructions of one bulk enqueue statement (bench/notes.md, "Bulk enqueue
# against pgmq"): callgrind counts what the backend executes inside
# PortalRun for one COPY or INSERT ... SELECT of N rows (default 20,000)
# into gatekeeper.mail, in a single-user backend, after the tables are
# emptied and checkpointed.  Unlike wall-clock or CPU time, the count does
# not move with the machine's load, so two builds or two schemas can be
# compared on a busy machine; run it once per build, with the build's
# gatekeeper.so installed.
#
#   D=<data directory, server stopped> BIN=<postgresql bin> \
#       bash bench/proto/bulk_callgrind.sh copy|insert
#
# The cluster needs gatekeeper in database postgres (shared_preload_libraries
# set).  Runs as the owner of D (postgres).  Writes its rows to $WORK
# (default /tmp/bulk_callgrind) and prints the total, and the trigger's
# share, in instructions.
set -eu
WHAT=${1:?copy or insert}
N=${N:-20000}; WORK=${WORK:-/tmp/bulk_callgrind}
: "${D:?the data directory}" "${BIN:?the PostgreSQL bin directory}"
mkdir -p "$WORK"; chown postgres "$WORK"
S() { runuser -u postgres -- "$BIN/postgres" --single -D "$D" -c gatekeeper.workers=0 postgres >/dev/null 2>&1; }
echo "DROP TABLE IF EXISTS bulk_src;
CREATE TABLE bulk_src AS SELECT 'user' || g || '@customer.example' AS recipient, rpad('Weekly picks ' || (g % 1000), 25, 'x') AS subject, repeat('b', 500) AS body FROM generate_series(1, $N) g;
COPY bulk_src TO '$WORK/src.csv' (FORMAT csv);
TRUNCATE gatekeeper.mail, gatekeeper.mail_live, gatekeeper.mail_key, gatekeeper.mail_done, gatekeeper.mail_claim;
SELECT gatekeeper.recount_live();
CHECKPOINT;" | S
case $WHAT in
copy) Q="COPY gatekeeper.mail (recipient, subject, body) FROM '$WORK/src.csv' (FORMAT csv)" ;;
insert) Q="INSERT INTO gatekeeper.mail (recipient, subject, body) SELECT recipient, subject, body FROM bulk_src" ;;
*) echo "copy or insert" >&2; exit 2 ;;
esac
out=$WORK/callgrind.$WHAT.$$
echo "$Q" | runuser -u postgres -- valgrind --tool=callgrind --callgrind-out-file="$out" \
	--toggle-collect=PortalRun "$BIN/postgres" --single -D "$D" -c gatekeeper.workers=0 postgres \
	>/dev/null 2>"$out.log"
echo "$WHAT of $N rows: $(awk '/^summary:/ { print $2 }' "$out") instructions"
callgrind_annotate --inclusive=yes "$out" 2>/dev/null |
	grep -E '^ *[0-9,]+ \(.*:(gatekeeper_mail_check|live_flush|check_mail) ' | grep -v '=>' | sed 's/ \[.*//'
