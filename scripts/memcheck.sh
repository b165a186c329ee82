#!/usr/bin/env bash
# scripts/memcheck.sh: run TAP tests with the server under valgrind's
# memcheck, to catch a use of freed memory, an overflow or a read of
# uninitialized memory in gatekeeper's C while a real relay talks to the
# worker.
#
#   GK_PG_BIN=/path/to/postgresql/15/bin bash scripts/memcheck.sh [t/0xx.pl ...]
#
# (as root; default tests: the delivery ones, t/02*.pl t/04*.pl t/05*.pl).
# Not part of scripts/test.sh: under valgrind the server runs some 20 to 50
# times slower.  GK_PG_BIN is required and the build is installed into its
# tree, so that the system's PostgreSQL is never touched.
#
# How: a directory of its own holds a `postgres` that runs the real one
# under valgrind (the postmaster, and so every backend and the gatekeeper
# worker it forks; `postgres -V`, `--boot` and `--single` run plain), a
# copy of `pg_ctl` (which starts the `postgres` of its own directory), and
# links to the other programs; the tests run with it first in PATH.
# PostgreSQL's palloc pools are invisible to valgrind, but the SMTP client
# gives each relay connection a memory context of its own that is really
# freed when the connection is, so a use of a freed connection is seen.
# valgrind writes one report per process to the reports directory
# ($GK_MEMCHECK_DIR, default a fresh one, printed); the script fails on
# any error but PostgreSQL's own known writes of padding bytes (it is built
# without USE_VALGRIND), which it counts.
# Assertions on timing (mail sent within so many seconds) cannot hold in a
# server that slow; failed assertions are listed, and the exit status says
# only whether valgrind found an error of ours.
# Needs valgrind (Debian 12: apt-get install valgrind).

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
[ -n "${GK_PG_BIN:-}" ] || { echo "set GK_PG_BIN to a private PostgreSQL 15 bin directory" >&2; exit 2; }
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"
gk_require_root
command -v valgrind >/dev/null || gk_die "valgrind not found (apt-get install valgrind)"

TESTS=("$@")
if [ ${#TESTS[@]} -eq 0 ]; then
	for f in "$ROOT"/t/02*.pl "$ROOT"/t/04*.pl "$ROOT"/t/05*.pl; do
		TESTS+=("t/$(basename "$f")")
	done
fi

WORK=$(gk_make_workdir gatekeeper-memcheck)
REPORTS=${GK_MEMCHECK_DIR:-$WORK/valgrind}
mkdir -p "$REPORTS"
chmod 1777 "$REPORTS"
gk_stage_source "$ROOT" "$WORK/src"
SRC=$WORK/src

gk_log "building gatekeeper.so with -g"
(cd "$SRC" && gk_run_as_postgres make -s -j2 PG_CONFIG="$GK_PG_CONFIG" COPT="-g -fno-omit-frame-pointer") \
	>"$WORK/build.log" 2>&1 || { cat "$WORK/build.log" >&2; gk_die "build failed"; }
(cd "$SRC" && make -s PG_CONFIG="$GK_PG_CONFIG" install >/dev/null)

# the bin directory the tests see
VGBIN=$WORK/bin
mkdir -p "$VGBIN"
for f in "$GK_PG_BIN"/*; do
	ln -s "$f" "$VGBIN/$(basename "$f")"
done
rm "$VGBIN/postgres" "$VGBIN/pg_ctl"
cp "$GK_PG_BIN/pg_ctl" "$VGBIN/pg_ctl"
cat >"$VGBIN/postgres" <<EOF
#!/bin/sh
case "\$1" in
-V|--version|--boot|--single|-C|--describe-config|--check)
	exec "$GK_PG_BIN/postgres" "\$@" ;;
esac
exec valgrind --quiet --error-limit=no --num-callers=30 --read-var-info=no \\
	--leak-check=no --track-origins=no --log-file="$REPORTS/vg.%p" \\
	"$GK_PG_BIN/postgres" "\$@"
EOF
chmod 755 "$VGBIN/postgres"
chown -R postgres: "$VGBIN"

PGXS_DIR=$(dirname "$("$GK_PG_CONFIG" --pgxs)")
gk_log "running ${TESTS[*]} with the server under valgrind; reports in $REPORTS"
start=$(date +%s)
rc=0
(
	cd "$SRC"
	rm -rf tmp_check
	mkdir -p tmp_check
	chown postgres: tmp_check
	gk_run_as_postgres env TESTDIR="$SRC" PATH="$VGBIN:$SRC:$PATH" PGPORT=65432 \
		PG_REGRESS="$PGXS_DIR/../../src/test/regress/pg_regress" \
		prove -I "$PGXS_DIR/../../src/test/perl/" -I ./ "${TESTS[@]}"
) >"$WORK/tap.log" 2>&1 || rc=$?
tail -n 30 "$WORK/tap.log"
gk_log "TAP run under valgrind took $(($(date +%s) - start)) s (prove exit $rc)"

# An error report is a block of "==pid== " lines, ended by an empty one.
# PostgreSQL built without USE_VALGRIND writes padding bytes it never set
# (WAL records, the relcache init file): "Syscall param write(buf) points
# to uninitialised byte(s)" with PostgreSQL's own code on top of the
# stack.  Every other error, and those with our code on top, count.
OURS="($(cd "$SRC/src" && ls ./*.c | sed -e 's|^\./||' -e 's/\./\\./' | paste -sd'|'))"
ours=0
theirs=0
for r in "$REPORTS"/vg.*; do
	[ -s "$r" ] || continue
	read -r o t < <(awk -v ours="\\(($OURS):[0-9]+\\)|gatekeeper\\.so" '
		function done_block() {
			if (inblock) { if (kind ~ /^Syscall param/ && !top) t++; else o++ }
			inblock = 0
		}
		/^==[0-9]+== [A-Z]/ { done_block(); inblock = 1; kind = substr($0, index($0, " ") + 1); top = 0; pg = 0; next }
		/^==[0-9]+== +(at|by) / {
			if (!pg && $0 ~ ours) top = 1
			if ($0 ~ /\/postgres\)$/) pg = 1
			next
		}
		/^==[0-9]+== *$/ { done_block(); next }
		END { done_block(); print o + 0, t + 0 }' "$r")
	ours=$((ours + o))
	theirs=$((theirs + t))
	if [ "$o" -gt 0 ]; then
		printf '\n----- %s -----\n' "$r" >&2
		head -n 80 "$r" >&2
	fi
done
gk_log "valgrind: $ours error(s) that count, $theirs of PostgreSQL's known padding writes ($(ls "$REPORTS" | wc -l) process reports)"
if [ "$ours" -gt 0 ]; then
	gk_warn "memory errors in gatekeeper; the work directory $WORK is kept"
	exit 1
fi
if [ "$rc" -ne 0 ]; then
	# a crash would also be an error above; what fails here without one is
	# a test's timing, which a server 20 times slower cannot keep
	gk_warn "some TAP assertions failed under valgrind (timing ones cannot hold there); see $WORK/tap.log; kept $WORK"
	grep -E '^t/.*(Dubious|Failed|not ok)|^t/[0-9a-z_]+\.pl +\(Wstat' "$WORK/tap.log" >&2 || true
	exit 0
fi
rm -rf "$WORK"
exit 0
