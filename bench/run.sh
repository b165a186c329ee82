#!/usr/bin/env bash
# bench/run.sh: gatekeeper's benchmark.  One command, as root:
#
#   bash bench/run.sh                  full run (about 30 minutes on 2 cores)
#   bash bench/run.sh --smoke          seconds: tiny sizes, 1 run, same code paths
#   bash bench/run.sh --runs 3 --only drain,gates
#
# It starts its own throwaway PostgreSQL 15 cluster (as the postgres user,
# in a fresh temporary directory, on a free loopback port), and its own
# redis-server and smtp-sink on loopback; runs each scenario --runs times
# (default 5); and prints a table of medians, min-max, each figure's
# reference measured in this same run, the ratio, the target and whether it
# is met.  A full run of every scenario also writes the table, with the
# machine's description, to BENCHMARKS.md; a smoke or partial run writes
# bench/out/BENCHMARKS.md instead (bench/out/ also keeps the raw results).
# Timings never fail the run: the exit status says only whether every
# scenario could run.  Everything it started is stopped on exit.
#
# Options:
#   --smoke          tiny sizes, 1 run (CI keeps the harness working with it)
#   --runs N         runs per measurement (default 5; --smoke: 1)
#   --only LIST      comma-separated scenarios: enqueue,drain,backlog,
#                    sustained,held_snapshot,storage,stats,gates,delivery,
#                    relays,shards (default: all)
#   --install        build gatekeeper from this tree and install it first
#                    (also done when no gatekeeper is installed)
#   --output FILE    where to write the Markdown report
#   --keep           keep the temporary directory (path printed)
#
# Environment: BK_SHARED_BUFFERS (default 2GB); BK_HUGE_PAGES=off keeps
# the server out of huge pages (by default the run adds the pages its server
# needs to the machine's pool and gives them back at the end: see
# bench/README.md).  Optional peers that Debian
# does not package are switched on by environment variables; none of their
# code is part of this repository:
#   BK_PGMQ_SQL=/path/to/pgmq.sql   a local pgmq SQL install file: adds a
#                                   pgmq send/read/delete line to drain,
#                                   and a pgmq send_batch line to enqueue.
#
# See bench/README.md for what each scenario measures.

set -euo pipefail

BENCH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"
# shellcheck source=bench/lib.sh
. "$BENCH/lib.sh"

ALL_SCENARIOS=(enqueue drain backlog sustained held_snapshot storage stats gates reports delivery relays shards)
# opt-in: run only when --only names them
OPTIN_SCENARIOS=(suppression)
SMOKE=0
RUNS=
ONLY=
INSTALL=0
OUTPUT=
KEEP=0
while [ $# -gt 0 ]; do
	case $1 in
	--smoke) SMOKE=1 ;;
	--runs) RUNS=${2:?--runs needs a number}; shift ;;
	--runs=*) RUNS=${1#--runs=} ;;
	--only) ONLY=${2:?--only needs a list}; shift ;;
	--only=*) ONLY=${1#--only=} ;;
	--install) INSTALL=1 ;;
	--output) OUTPUT=${2:?--output needs a file}; shift ;;
	--output=*) OUTPUT=${1#--output=} ;;
	--keep) KEEP=1 ;;
	-h|--help) sed -n '2,/^$/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) gk_die "unknown option $1 (see --help)" ;;
	esac
	shift
done
if [ -z "$RUNS" ]; then
	if [ "$SMOKE" = 1 ]; then RUNS=1; else RUNS=5; fi
fi
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || gk_die "--runs must be a positive number"
SCENARIOS=()
if [ -n "$ONLY" ]; then
	IFS=, read -r -a SCENARIOS <<<"$ONLY"
	for s in "${SCENARIOS[@]}"; do
		case " ${ALL_SCENARIOS[*]} ${OPTIN_SCENARIOS[*]} " in
		*" $s "*) ;;
		*) gk_die "unknown scenario $s (known: ${ALL_SCENARIOS[*]} ${OPTIN_SCENARIOS[*]})" ;;
		esac
	done
else
	SCENARIOS=("${ALL_SCENARIOS[@]}")
fi
if [ -z "$OUTPUT" ]; then
	if [ "$SMOKE" = 0 ] && [ ${#SCENARIOS[@]} -eq ${#ALL_SCENARIOS[@]} ]; then
		OUTPUT=$ROOT/BENCHMARKS.md
	else
		OUTPUT=$BENCH/out/BENCHMARKS.md
	fi
fi
export BK_SHARED_BUFFERS=${BK_SHARED_BUFFERS:-2GB}

# ------------------------------------------------------------------ sizes
# The issue fixes the backlog (50,000 and 5,000,000) and sustained (10 waves
# of 400,000) sizes; the others are chosen to keep a full run near 30 min.
if [ "$SMOKE" = 1 ]; then
	ENQ_ROWS=2000 ENQ_CALLS=1000
	DRAIN_CONFIGS="100:2 1000:8"	# batch:claimers
	DRAIN_N_100=1600 DRAIN_N_1000=8000
	BACKLOG_SMALL=500 BACKLOG_BIG=5000 BACKLOG_TXNS=3
	SUSTAINED_WAVES=10 SUSTAINED_N=4000
	HELD_WAVES=4 HELD_N=4000 HELD_CLAIMERS=2
	STORAGE_WAVES=3 STORAGE_N=4000
	STATS_SMALL=500 STATS_BIG=5000 STATS_CALLS=20
	GATE_BATCH_TXNS=2 GATE_SINGLE_TXNS=50 REDIS_P_N=20000 REDIS_N=2000
	DELIVERY_N=200 DELIVERY_LAT=3
	REPORTS_N=500 EVENTS_N=1000
	RELAY_N=200 RELAY_RTT_N=48 RELAY_SLOW_N=16
	SUPP_N=8000 SUPP_LIST=20000 SUPP_BATCH=1000 SUPP_CLAIMERS=4
	SHARD_ENQ=400 SHARD_N=8000 SHARD_BATCH=1000
else
	ENQ_ROWS=200000 ENQ_CALLS=100000
	DRAIN_CONFIGS=${BK_DRAIN_CONFIGS:-"100:1 100:2 100:4 100:8 1000:1 1000:2 1000:4 1000:8"}
	DRAIN_N_100=40000 DRAIN_N_1000=80000	# divisible by 8 claimers x batch
	BACKLOG_SMALL=50000 BACKLOG_BIG=5000000 BACKLOG_TXNS=30
	SUSTAINED_WAVES=10 SUSTAINED_N=400000
	# held_snapshot (issue 46): 4 waves of 100,000 under a held snapshot
	HELD_WAVES=4 HELD_N=100000 HELD_CLAIMERS=2
	STORAGE_WAVES=6 STORAGE_N=300000
	STATS_SMALL=50000 STATS_BIG=5000000 STATS_CALLS=50
	GATE_BATCH_TXNS=50 GATE_SINGLE_TXNS=2500 REDIS_P_N=2000000 REDIS_N=200000
	DELIVERY_N=20000 DELIVERY_LAT=50
	# reports (issue 27): a bounce storm and a webhook's burst
	REPORTS_N=20000 EVENTS_N=50000
	# relays: loopback as delivery; 2,000 mails 20 ms away (issue 10);
	# 10 rounds of 16 end-of-data seconds (about 10 s at the bound)
	RELAY_N=20000 RELAY_RTT_N=2000 RELAY_SLOW_N=160
	# suppression (opt-in): 80,000 mails against a list of 1,000,000
	SUPP_N=80000 SUPP_LIST=1000000 SUPP_BATCH=1000 SUPP_CLAIMERS=4
	# shards (issue 29): 20,000 enqueues each way; 160,000 mails drained by
	# 2 claimers per shard over 1, 2 and 4 shards
	SHARD_ENQ=20000 SHARD_N=160000 SHARD_BATCH=1000
fi
BODY_BYTES=1000			# every mail's body, and smtp-source's payload

# ------------------------------------------------------------------ cleanup
BK_WORK=
STATUS=0
finish() {
	local rc=$?
	trap - EXIT INT TERM
	cd /
	local pid
	if [ -n "$BK_WORK" ] && [ -f "$BK_WORK/bg.pids" ]; then
		while read -r pid; do
			kill "$pid" 2>/dev/null || true
		done <"$BK_WORK/bg.pids"
	fi
	if [ -n "$BK_WORK" ] && [ -d "$BK_WORK" ]; then
		gk_stop_servers_under "$BK_WORK"
		bk_huge_pages_release
		if [ "$KEEP" = 1 ] || [ "$rc" -ne 0 ]; then
			gk_log "kept $BK_WORK"
		else
			rm -rf "$BK_WORK"
		fi
	fi
	exit "$rc"
}
trap finish EXIT
trap 'gk_warn "interrupted"; exit 130' INT
trap 'gk_warn "terminated"; exit 143' TERM

gk_require_root

# ------------------------------------------------------------------ setup
gk_ensure_packages postgresql-15 postgresql-server-dev-15 libssl-dev make gcc \
	libc6-dev perl postfix redis-server postgresql-15-pgq3 python3 postgresql-15-plproxy \
	prometheus-postgres-exporter

BK_WORK=$(gk_make_workdir gatekeeper-bench)
: >"$BK_WORK/results.tsv"
mkdir -p "$BENCH/out"

EXTDIR=$("$GK_PG_CONFIG" --sharedir)/extension
if [ "$INSTALL" = 1 ] || [ ! -f "$EXTDIR/gatekeeper.control" ] ||
	[ ! -f "$("$GK_PG_CONFIG" --pkglibdir)/gatekeeper.so" ]; then
	gk_stage_source "$ROOT" "$BK_WORK/src"
	if declare -F gk_build >/dev/null && declare -F gk_install >/dev/null; then
		gk_build "$BK_WORK/src" "$BK_WORK/build.log" || gk_die "build failed"
		gk_install "$BK_WORK/src" || gk_die "install failed"
	else
		gk_build_install "$BK_WORK/src" "$BK_WORK/build.log" || gk_die "build failed"
	fi
fi

# shellcheck source=bench/scenarios.sh
. "$BENCH/scenarios.sh"

bk_cluster_init
bk_cluster_start
bk_db_make bench
bk_machine_info

MODE=full
[ "$SMOKE" = 0 ] || MODE=smoke
gk_log "mode $MODE, $RUNS run(s) per measurement, scenarios: ${SCENARIOS[*]}"
for s in "${SCENARIOS[@]}"; do
	gk_log "scenario $s"
	t0=$(bk_now)
	BK_SCENARIO=$s
	set +e
	(set -e; "scenario_$s")
	rc=$?
	set -e
	if [ "$rc" -ne 0 ]; then
		gk_warn "scenario $s failed"
		bk_note "$s" "the scenario stopped with an error; see the harness output"
		STATUS=1
	fi
	bk_note "$s" "$(printf 'took %.0f s' "$(bk_elapsed "$t0" "$(bk_now)")")"
	# a scenario that failed may have left its own settings in force
	if [ -s "$BK_DATA/bench_scenario.conf" ]; then
		bk_cluster_conf ""
		bk_cluster_restart
	fi
done
bk_cluster_stop

cp "$BK_WORK/results.tsv" "$BENCH/out/results.tsv"
cp "$BK_WORK/results.tsv" "$BENCH/out/results.$MODE.$(date -u +%Y%m%dT%H%M%S).tsv"
perl "$BENCH/report.pl" --mode "$MODE" --runs "$RUNS" --output "$OUTPUT" "$BK_WORK/results.tsv"
gk_log "report written to $OUTPUT"
exit "$STATUS"
