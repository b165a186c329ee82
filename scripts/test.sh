#!/usr/bin/env bash
# scripts/test.sh: run every gatekeeper test, from a fresh Debian 12 machine.
#
#   bash scripts/test.sh            (as root; CI runs it with CI=true, no stdin)
#
# 1. installs the packages it needs, only those missing;
# 2. copies the source tree into a fresh temporary directory owned by the
#    postgres user (initdb refuses root), builds it there as postgres and
#    fails on any compiler warning, then `make install`s it as root;
# 3. runs the three suites of `make installcheck`, each in its own private
#    instance: pg_regress (sql/*.sql), isolation (specs/*.spec), TAP (t/*.pl);
#    then, as root, the TAP files marked "# gatekeeper-test: as root" (a
#    private Postfix master(8) and pipe(8); they skip in the TAP suite);
# 4. prints why anything failed (diffs, server logs) and exits non-zero;
#    exit 0 means every stage passed.
#
# The temporary directory is removed on success and kept (path printed) on
# failure.  No server it started outlives it.
#
# Settings (environment): GK_STAGE_TIMEOUT, seconds per test suite (default
# 1500); GK_KEEP=1 keeps the temporary directory even on success.

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

STAGE_TIMEOUT=${GK_STAGE_TIMEOUT:-1500}
BUILD=
RESULT=1
declare -a SUMMARY=()
FAILED=0
EMPTY=0
STAGE="setup"

finish() {
	local rc=$?
	trap - EXIT INT TERM
	cd /
	if [ -n "$BUILD" ] && [ -d "$BUILD" ]; then
		gk_stop_servers_under "$BUILD"
		if [ "$RESULT" -eq 0 ] && [ "${GK_KEEP:-0}" != 1 ]; then
			rm -rf "$BUILD"
		else
			gk_log "kept the build and test output in $BUILD"
		fi
	fi
	if [ ${#SUMMARY[@]} -gt 0 ]; then
		printf '\n==================== gatekeeper test summary ====================\n'
		printf '  %s\n' "${SUMMARY[@]}"
		printf '=================================================================\n'
	fi
	if [ "$RESULT" -eq 0 ]; then
		if [ "$EMPTY" -gt 0 ]; then
			printf 'ALL TESTS PASSED (but %s suite(s) had no tests to run: see above)\n' "$EMPTY"
		else
			printf 'ALL TESTS PASSED\n'
		fi
		exit 0
	fi
	printf 'TESTS FAILED (in stage: %s)\n' "$STAGE"
	[ "$rc" -ne 0 ] || rc=1
	exit "$rc"
}
trap finish EXIT
trap 'gk_warn "interrupted"; exit 130' INT
trap 'gk_warn "terminated"; exit 143' TERM

gk_require_root

# ---------------------------------------------------------------- packages
STAGE="1/5 packages"
gk_log "stage 1/5: packages"
gk_ensure_packages "${GK_BASE_PACKAGES[@]}"
gk_ensure_packages "${GK_TEST_PACKAGES[@]}"
# the benchmark smoke run at the end needs Redis and PgQ as its references
gk_ensure_packages "${GK_BENCH_PACKAGES[@]}"
SUMMARY+=("packages      ok")

# ---------------------------------------------------------------- build
STAGE="2/5 build"
gk_log "stage 2/5: build (warnings are errors) and install"
BUILD=$(gk_make_workdir gatekeeper-test)
gk_stage_source "$ROOT" "$BUILD/src"
SRC=$BUILD/src
cd "$BUILD"
if ! gk_build "$SRC" "$BUILD/build.log"; then
	SUMMARY+=("build         FAILED (see the compiler output above)")
	exit 1
fi
if grep -n 'warning:' "$BUILD/build.log" >&2; then
	SUMMARY+=("build         FAILED: compiler warnings (above); not installed")
	exit 1
fi
# the files of src/ call one another in no circle (scripts/call_circles.pl),
# and each 0.3.0 script defines each object once (scripts/defined_once.pl)
if ! perl "$SRC/scripts/call_circles.pl" "$SRC" >&2; then
	SUMMARY+=("build         FAILED: files of src/ call one another in a circle (above)")
	exit 1
fi
for script in gatekeeper--0.3.0.sql gatekeeper--0.2.0--0.3.0.sql; do
	if ! perl "$SRC/scripts/defined_once.pl" "$SRC/sql/$script" >&2; then
		SUMMARY+=("build         FAILED: sql/$script defines an object twice or alters it after (above)")
		exit 1
	fi
done
if ! gk_install "$SRC"; then
	SUMMARY+=("build         ok, but make install FAILED")
	exit 1
fi
SUMMARY+=("build         ok, no compiler warnings, no call circles, scripts defined once, installed into $("$GK_PG_CONFIG" --pkglibdir)")
# Exim for t/095, unpacked (not installed) under the build directory
gk_unpack_exim "$BUILD/exim"
# OpenSMTPD for t/097, unpacked the same way
gk_unpack_opensmtpd "$BUILD/opensmtpd"
# Sendmail for t/098, unpacked the same way
gk_unpack_sendmail "$BUILD/sendmail"
# Courier for t/099, unpacked the same way
gk_unpack_courier "$BUILD/courier"

# make_var NAME: the value the Makefile gives NAME (REGRESS, ISOLATION, ...),
# so this script runs exactly what `make installcheck` would.
make_var() {
	(cd "$SRC" && printf 'print-%%:\n\t@echo $(%s)\n' "$1" |
		gk_run_as_postgres make -s --no-print-directory -f Makefile -f - PG_CONFIG="$GK_PG_CONFIG" "print-$1")
}

# show_tail FILE [LINES]: print the end of FILE with a header, for CI logs.
show_tail() {
	local f=$1 n=${2:-80}
	[ -f "$f" ] || return 0
	printf '\n----- %s (last %s lines) -----\n' "${f#"$BUILD"/}" "$n" >&2
	tail -n "$n" "$f" >&2
}

# run_suite NAME LOG MAKE-ARGS...: one suite of `make installcheck`, the
# other suites switched off on the command line.  Bounded by STAGE_TIMEOUT.
run_suite() {
	local name=$1 log=$2 rc=0
	shift 2
	# In the background and waited for, so that a signal to this script is
	# handled at once (the EXIT trap then stops whatever the suite started).
	{
		(cd "$SRC" && timeout --kill-after=30 "$STAGE_TIMEOUT" \
			runuser -u postgres -- env PATH="$PATH" LANG="$LANG" LC_ALL="$LC_ALL" \
			make --no-print-directory PG_CONFIG="$GK_PG_CONFIG" installcheck "$@") 2>&1 | tee "$log"
	} &
	wait $! || rc=$?
	if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
		gk_warn "$name: timed out after ${STAGE_TIMEOUT}s"
		echo "TIMEOUT after ${STAGE_TIMEOUT}s" >>"$log"
	fi
	# a suite that was killed may leave its instance behind
	gk_stop_servers_under "$SRC"
	return "$rc"
}

# pg_regress prints " All 5 tests passed. " or " 2 of 5 tests failed. ",
# or says why it could not run ("pg_regress: postmaster failed").
regress_result() {
	local r
	r=$(grep -E '^ *(All [0-9]+ tests passed|[0-9]+ of [0-9]+ tests (failed|passed))' "$1" | tail -n 1 |
		sed -e 's/^ *//' -e 's/ *$//') || true
	[ -n "$r" ] || r=$(grep -E '^pg_(isolation_)?regress: |^diff command failed|^TIMEOUT' "$1" | tail -n 1) || true
	printf '%s\n' "${r:-no result line; see the output above}"
}

# prove ends with "Files=2, Tests=14, ..." and "Result: PASS" (or FAIL);
# a run that was killed has neither.
tap_result() {
	local r
	r=$(grep -E '^Files=' "$1" | tail -n 1 | cut -d, -f1,2) || true
	if grep -q '^TIMEOUT' "$1"; then
		r="timed out after ${STAGE_TIMEOUT}s ${r}"
	fi
	r="$r $(grep -E '^Result: ' "$1" | tail -n 1)" || true
	printf '%s\n' "$r"
}

# show_suite_logs OUTPUTDIR: what pg_regress leaves for a failed run: the
# diffs, and the temporary instance's server and initdb logs.
show_suite_logs() {
	local out=$1
	if [ -s "$out/regression.diffs" ]; then
		printf '\n----- %s (first 400 lines) -----\n' "${out#"$BUILD"/}/regression.diffs" >&2
		head -n 400 "$out/regression.diffs" >&2
	fi
	show_tail "$out/log/postmaster.log" 100
	# no diffs: the instance itself may not have come up
	[ -s "$out/regression.diffs" ] || show_tail "$out/log/initdb.log" 30
}

# ---------------------------------------------------------------- pg_regress
STAGE="3/5 regression tests"
gk_log "stage 3/5: regression tests (pg_regress, sql/*.sql)"
REGRESS=$(make_var REGRESS)
if [ -z "$REGRESS" ]; then
	gk_warn "no regression tests (sql/*.sql other than the install script): nothing to run"
	SUMMARY+=("regress       ran 0 tests (none in sql/)")
	EMPTY=$((EMPTY + 1))
elif run_suite regress "$BUILD/regress.log" ISOLATION= TAP_TESTS=; then
	SUMMARY+=("regress       ok: $(regress_result "$BUILD/regress.log") [$(echo "$REGRESS" | wc -w) files]")
else
	FAILED=1
	SUMMARY+=("regress       FAILED: $(regress_result "$BUILD/regress.log")")
	show_suite_logs "$SRC"
fi

# ---------------------------------------------------------------- isolation
STAGE="4/5 isolation tests"
gk_log "stage 4/5: isolation tests (specs/*.spec)"
ISOLATION=$(make_var ISOLATION)
if [ -z "$ISOLATION" ]; then
	gk_warn "no isolation specs (specs/*.spec): nothing to run"
	SUMMARY+=("isolation     ran 0 specs (none in specs/)")
	EMPTY=$((EMPTY + 1))
elif run_suite isolation "$BUILD/isolation.log" REGRESS= TAP_TESTS=; then
	SUMMARY+=("isolation     ok: $(regress_result "$BUILD/isolation.log") [$(echo "$ISOLATION" | wc -w) specs]")
else
	FAILED=1
	SUMMARY+=("isolation     FAILED: $(regress_result "$BUILD/isolation.log")")
	show_suite_logs "$SRC/output_iso"
fi

# ---------------------------------------------------------------- TAP
STAGE="5/5 TAP tests"
gk_log "stage 5/5: TAP tests (t/*.pl, prove)"
TAP_TESTS=$(make_var TAP_TESTS)
shopt -s nullglob
TAP_FILES=("$SRC"/t/*.pl)
shopt -u nullglob
if [ -z "$TAP_TESTS" ]; then
	gk_warn "the Makefile does not set TAP_TESTS: TAP tests not run"
	SUMMARY+=("tap           not run (TAP_TESTS unset in the Makefile)")
	EMPTY=$((EMPTY + 1))
elif [ ${#TAP_FILES[@]} -eq 0 ]; then
	gk_warn "no TAP tests (t/*.pl): nothing to run"
	SUMMARY+=("tap           ran 0 files (none in t/)")
	EMPTY=$((EMPTY + 1))
else
	# Most files spend their time waiting on a server, a relay or a poll,
	# so they run GK_TAP_JOBS (default 2) at a time; the files that time
	# something the user would see (a wake-up, a back-off, a relay's pace)
	# are marked "# gatekeeper-test: alone" and run afterwards, one at a
	# time, with the machine to themselves.
	TAP_PAR=()
	TAP_ALONE=()
	for f in "${TAP_FILES[@]}"; do
		if grep -q '^# gatekeeper-test: alone$' "$f"; then
			TAP_ALONE+=("t/$(basename "$f")")
		else
			TAP_PAR+=("t/$(basename "$f")")
		fi
	done
	tap_ok=1
	tap_said=()
	for part in par alone; do
		if [ "$part" = par ]; then
			files=("${TAP_PAR[@]}") jobs=${GK_TAP_JOBS:-2}
		else
			files=("${TAP_ALONE[@]}") jobs=1
		fi
		[ ${#files[@]} -gt 0 ] || continue
		log="$BUILD/tap_$part.log"
		gk_log "TAP tests, $([ "$jobs" = 1 ] && echo "one at a time" || echo "$jobs at a time"): ${#files[@]} files"
		if run_suite "tap ($part)" "$log" REGRESS= ISOLATION= PROVE_FLAGS="--timer -j$jobs" PROVE_TESTS="${files[*]}"; then
			tap_said+=("$(tap_result "$log")")
		else
			tap_ok=0
			tap_said+=("FAILED: $(tap_result "$log")")
			# prove's summary (above) names the failing files; their logs
			# say why (the next part's run empties tmp_check, so now).
			for f in "${files[@]}"; do
				t=$(basename "$f" .pl)
				if grep -qE "(^|\] )t/$t\.pl \.+ ok( |$)" "$log"; then continue; fi
				for l in "$SRC/tmp_check/log/regress_log_$t" "$SRC/tmp_check/log/${t}"_*.log; do
					if [ -f "$l" ]; then show_tail "$l" 80; fi
				done
			done
		fi
	done
	if [ "$tap_ok" = 1 ]; then
		SUMMARY+=("tap           ok: ${tap_said[0]}${tap_said[1]:+; alone: ${tap_said[1]}}")
	else
		FAILED=1
		SUMMARY+=("tap           FAILED: ${tap_said[*]}")
	fi
fi

# ---------------------------------------------------------------- TAP as root
# TAP files marked "# gatekeeper-test: as root" skip themselves in the
# suite above (it runs as postgres) and run here, as root, with the same
# environment `make installcheck` gives prove, their output under
# $BUILD/root_tap.  They drop to the postgres user for everything but what
# needs root (t/PrivatePostfix.pm: a private Postfix master(8) and pipe(8)).
STAGE="5/5 TAP tests as root"
shopt -s nullglob
ROOT_TAP=()
for f in "$SRC"/t/*.pl; do
	if grep -q '^# gatekeeper-test: as root$' "$f"; then ROOT_TAP+=("t/$(basename "$f")"); fi
done
shopt -u nullglob
if [ ${#ROOT_TAP[@]} -gt 0 ]; then
	gk_log "TAP tests as root: ${ROOT_TAP[*]}"
	ROOT_TESTDIR=$BUILD/root_tap
	mkdir -p "$ROOT_TESTDIR"
	chown postgres: "$ROOT_TESTDIR"
	PGXS_TOP=$(dirname "$("$GK_PG_CONFIG" --pgxs)")/../..
	rc=0
	{
		(cd "$SRC" && timeout --kill-after=30 "$STAGE_TIMEOUT" \
			env TESTDIR="$ROOT_TESTDIR" PATH="$("$GK_PG_CONFIG" --bindir):$PATH" PGPORT=65432 \
			PG_REGRESS="$PGXS_TOP/src/test/regress/pg_regress" \
			/usr/bin/prove -I "$PGXS_TOP/src/test/perl/" -I ./ "${ROOT_TAP[@]}") 2>&1 | tee "$BUILD/root_tap.log"
	} &
	wait $! || rc=$?
	gk_stop_servers_under "$ROOT_TESTDIR"
	if [ "$rc" -eq 0 ]; then
		SUMMARY+=("tap as root   ok: $(tap_result "$BUILD/root_tap.log")")
	else
		FAILED=1
		SUMMARY+=("tap as root   FAILED: $(tap_result "$BUILD/root_tap.log")")
		for f in "${ROOT_TAP[@]}"; do
			t=$(basename "$f" .pl)
			for l in "$ROOT_TESTDIR/tmp_check/log/regress_log_$t" "$ROOT_TESTDIR/tmp_check/log/${t}"_*.log; do
				if [ -f "$l" ]; then show_tail "$l" 80; fi
			done
		done
	fi
fi

# ---------------------------------------------------------------- benchmark
# The benchmark harness in smoke mode: tiny sizes, one run each, every
# scenario's code path.  It proves the harness works; it measures nothing
# and asserts no timing.
if [ -f "$ROOT/bench/run.sh" ]; then
	STAGE="bench smoke"
	gk_log "benchmark smoke run (bench/run.sh --smoke)"
	if bash "$ROOT/bench/run.sh" --smoke; then
		SUMMARY+=("bench smoke   ok")
	else
		FAILED=1
		SUMMARY+=("bench smoke   FAILED")
	fi
fi

if [ "$FAILED" -eq 0 ]; then
	RESULT=0
fi
STAGE=$(printf '%s\n' "${SUMMARY[@]}" | awk '/FAILED/ { printf "%s%s", sep, $1; sep = ", " }')
exit "$FAILED"
