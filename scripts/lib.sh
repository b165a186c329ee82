# shellcheck shell=bash
# scripts/lib.sh: shared by scripts/test.sh and scripts/demo.sh.
#
# Sourced, not run.  Everything here assumes a Debian 12 machine and root:
# packages come from apt, PostgreSQL is Debian's postgresql-15, and the
# servers (initdb, pg_regress's temporary instances, TAP nodes) run as the
# `postgres` system user, because initdb refuses to run as root.

# Debian's PostgreSQL 15 layout (GK_PG_BIN may point at another copy of
# it, for development), first in PATH so pg_config, initdb, pg_ctl
# and psql are version 15 whatever else is installed.
GK_PG_BIN=${GK_PG_BIN:-/usr/lib/postgresql/15/bin}
GK_PG_CONFIG=$GK_PG_BIN/pg_config
export PATH="$GK_PG_BIN:$PATH"

# One predictable locale for builds, initdb and the tests: C.UTF-8 ships
# with Debian's libc, so clusters are UTF8 and non-ASCII mail stays intact.
export LANG=C.UTF-8 LC_ALL=C.UTF-8
unset LANGUAGE

# What building and testing gatekeeper needs.  postfix is there for its
# smtp-sink and smtp-source test tools and for the private smtpd the TAP
# tests and the demo run under their own directory (t/pfmaster.py), never for the
# system's daemon.  libssl-dev: the SMTP client's TLS.  python3-aiosmtpd:
# relays that require AUTH (t/auth_relay.py) and the scriptable
# STARTTLS/AUTH relay (t/relay.py), with /usr/bin/python3; openssl makes
# the test CA.
GK_BASE_PACKAGES=(
	postgresql-15 postgresql-server-dev-15 libssl-dev
	libipc-run-perl postfix make gcc libc6-dev perl python3-aiosmtpd openssl
)
# The TAP tests need these on top (t/060_exporter.pl scrapes the exporter;
# t/070_driver_psycopg2.pl runs t/driver_app.py with /usr/bin/python3;
# t/061_alert_rules.pl runs promtool, of Debian's prometheus package, whose
# server is never started as a service: the tests run their own on loopback;
# t/055_dkim.pl verifies signatures with dkimpy, Ed25519 through nacl, and
# with Perl's Mail::DKIM; the gatekeeper_router tests need PL/Proxy).
GK_TEST_PACKAGES=(prometheus-postgres-exporter prometheus python3-psycopg2 python3-dkim python3-nacl libmail-dkim-perl
	postgresql-15-plproxy)
# t/failover/pg_autoctl.sh (run by hand, not by scripts/test.sh) needs
# pg_auto_failover: pg_autoctl and the monitor's extension.
GK_FAILOVER_PACKAGES=(postgresql-15-auto-failover)
# The benchmark (bench/run.sh) needs these on top; installed only on that path.
GK_BENCH_PACKAGES=(redis-server postgresql-15-pgq3)

# Message helpers.  Everything goes to stderr so stdout stays clean for data.
gk_log()  { printf '==> %s\n' "$*" >&2; }
gk_warn() { printf 'WARNING: %s\n' "$*" >&2; }
gk_die()  { printf 'ERROR: %s\n' "$*" >&2; exit 1; }

gk_require_root() {
	[ "$(id -u)" -eq 0 ] || gk_die "run this as root (for example: sudo bash $0); it installs packages and runs servers as the postgres user"
}

# gk_run_as_postgres CMD...: run CMD as the postgres user, keeping our PATH
# and locale.  The caller's working directory must be readable by postgres.
gk_run_as_postgres() {
	runuser -u postgres -- env PATH="$PATH" LANG="$LANG" LC_ALL="$LC_ALL" "$@"
}

# gk_pkg_installed PKG: true when dpkg says PKG is installed.
gk_pkg_installed() {
	[ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]
}

GK_APT_UPDATED=0
GK_INSTALLED_NOW=()

# gk_ensure_packages PKG...: install whichever of PKG are missing, with one
# `apt-get update` per run at most.  Does nothing when all are present.
gk_ensure_packages() {
	local missing=() p
	for p in "$@"; do
		gk_pkg_installed "$p" || missing+=("$p")
	done
	if [ ${#missing[@]} -eq 0 ]; then
		gk_log "packages present: $*"
		return 0
	fi
	command -v apt-get >/dev/null || gk_die "missing packages (${missing[*]}) and no apt-get: this script supports Debian 12"
	gk_log "installing: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	case " ${missing[*]} " in
	*" postfix "*)
		# Without this, Debian's postfix asks (or defaults to "Internet
		# Site") and configures a live MTA on port 25.  We only want its
		# test tools.
		echo "postfix postfix/main_mailer_type select No configuration" | debconf-set-selections
		;;
	esac
	if [ "$GK_APT_UPDATED" -eq 0 ]; then
		apt-get update -q
		GK_APT_UPDATED=1
	fi
	# No daemon a package brings (postfix, redis-server, the Prometheus
	# exporter) may start as a system service: the tests and the demo start
	# their own, on loopback.  policy-rc.d is how Debian's maintainer
	# scripts are told so; one the machine already has is left alone.
	local policy=/usr/sbin/policy-rc.d made_policy=0
	if [ ! -e "$policy" ]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod 755 "$policy"
		made_policy=1
	fi
	if ! apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null; then
		[ "$made_policy" -eq 0 ] || rm -f "$policy"
		gk_die "apt-get install ${missing[*]} failed"
	fi
	[ "$made_policy" -eq 0 ] || rm -f "$policy"
	GK_INSTALLED_NOW+=("${missing[@]}")
	for p in "${missing[@]}"; do
		gk_pkg_installed "$p" || gk_die "package $p did not install"
	done
	gk_stop_postfix_daemon
}

# gk_stop_postfix_daemon: if the postfix package we just installed started
# its master daemon (it should not: "No configuration", and policy-rc.d
# usually forbids it), stop it.  A Postfix that was installed before we ran
# is the machine's mail system and is left alone.
gk_stop_postfix_daemon() {
	case " ${GK_INSTALLED_NOW[*]} " in
	*" postfix "*) ;;
	*) return 0 ;;
	esac
	local pidfile=/var/spool/postfix/pid/master.pid pid
	[ -r "$pidfile" ] || return 0
	pid=$(tr -dc '0-9' <"$pidfile")
	[ -n "$pid" ] && [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm")" = master ] || return 0
	gk_log "the postfix install started its daemon (pid $pid); stopping it: only smtp-sink and smtp-source are used"
	postfix stop >/dev/null 2>&1 || service postfix stop >/dev/null 2>&1 || kill "$pid" 2>/dev/null || true
}

# gk_unpack_exim DIR: Debian's Exim 4 (exim4-daemon-light, with the
# libraries it links that the machine lacks, libidn12 for one, and
# libnss-wrapper, which names the running user Debian-exim for it) unpacked
# under DIR/root with `apt-get download` and `dpkg -x`, never installed
# (Exim and Postfix conflict as packages), owned by postgres; exports
# GK_EXIM_ROOT=DIR/root for t/095_reports_exim_pipe.pl.  A download that
# fails leaves it unset (the test then skips) and says so.
gk_unpack_exim() {
	local dir=$1 deb p dep
	local -a todo=(exim4-daemon-light libnss-wrapper) want=()
	local -A seen=()
	# the missing libraries the two depend on, and theirs
	while [ ${#todo[@]} -gt 0 ]; do
		p=${todo[0]}
		todo=("${todo[@]:1}")
		[ -z "${seen[$p]:-}" ] || continue
		seen[$p]=1
		want+=("$p")
		for dep in $(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
			--no-replaces --no-enhances "$p" 2>/dev/null | sed -n 's/^ *\(Pre\)\{0,1\}Depends: \(lib[^ <>]*\)$/\2/p'); do
			gk_pkg_installed "$dep" || todo+=("$dep")
		done
	done
	mkdir -p "$dir/debs" "$dir/root"
	if ! (cd "$dir/debs" && apt-get download -q "${want[@]}") >"$dir/download.log" 2>&1; then
		gk_warn "apt-get download ${want[*]} failed (t/095 will skip): $(tail -n 3 "$dir/download.log")"
		return 0
	fi
	for deb in "$dir"/debs/*.deb; do
		dpkg -x "$deb" "$dir/root" || gk_die "dpkg -x $deb failed"
	done
	chown -R postgres: "$dir"
	export GK_EXIM_ROOT="$dir/root"
	gk_log "Exim unpacked in $GK_EXIM_ROOT (${want[*]})"
}

# gk_unpack_debs DIR PACKAGE...: the packages, and the libraries they
# depend on that the machine lacks, downloaded (`apt-get download`) and
# unpacked (`dpkg -x`) under DIR/root, never installed; DIR owned by
# postgres.  Returns non-zero, saying why, when the download fails.
gk_unpack_debs() {
	local dir=$1 deb p dep
	shift
	local -a todo=("$@") want=()
	local -A seen=()
	while [ ${#todo[@]} -gt 0 ]; do
		p=${todo[0]}
		todo=("${todo[@]:1}")
		[ -z "${seen[$p]:-}" ] || continue
		seen[$p]=1
		want+=("$p")
		for dep in $(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
			--no-replaces --no-enhances "$p" 2>/dev/null | sed -n 's/^ *\(Pre\)\{0,1\}Depends: \(lib[^ <>]*\)$/\2/p'); do
			gk_pkg_installed "$dep" || todo+=("$dep")
		done
	done
	mkdir -p "$dir/debs" "$dir/root"
	if ! (cd "$dir/debs" && apt-get download -q "${want[@]}") >"$dir/download.log" 2>&1; then
		gk_warn "apt-get download ${want[*]} failed: $(tail -n 3 "$dir/download.log")"
		return 1
	fi
	for deb in "$dir"/debs/*.deb; do
		dpkg -x "$deb" "$dir/root" || gk_die "dpkg -x $deb failed"
	done
	chown -R postgres: "$dir"
	gk_log "unpacked in $dir/root: ${want[*]}"
}

# gk_unpack_opensmtpd DIR: Debian's OpenSMTPD (opensmtpd), with
# libnss-wrapper and libuid-wrapper (its users and their uids, for
# t/097_reports_opensmtpd_pipe.pl, which runs it in a user namespace),
# unpacked under DIR/root; exports GK_OPENSMTPD_ROOT.  A download that
# fails leaves it unset (the test then skips).
gk_unpack_opensmtpd() {
	if gk_unpack_debs "$1" opensmtpd libnss-wrapper libuid-wrapper; then
		export GK_OPENSMTPD_ROOT="$1/root"
	else
		gk_warn "OpenSMTPD not unpacked: t/097 will skip"
	fi
}

# gk_unpack_sendmail DIR: Debian's Sendmail (sendmail-bin, with
# sendmail-base and sendmail-cf, whose m4 files build a .cf from an .mc,
# and m4 itself) unpacked under DIR/root, for
# t/098_reports_sendmail_pipe.pl, which runs it in a user and mount
# namespace; exports GK_SENDMAIL_ROOT.  A download that fails leaves it
# unset (the test then skips).
gk_unpack_sendmail() {
	if gk_unpack_debs "$1" sendmail-bin sendmail-base sendmail-cf m4; then
		export GK_SENDMAIL_ROOT="$1/root"
	else
		gk_warn "Sendmail not unpacked: t/098 will skip"
	fi
}

# gk_unpack_courier DIR: Debian's Courier (courier-mta, courier-base,
# courier-authdaemon and courier-authlib-userdb, whose authdaemond reads
# its accounts from a userdb) with libuid-wrapper (its setgroups() in a
# user namespace), unpacked under DIR/root, for
# t/099_reports_courier_pipe.pl, which runs it in a user, mount and PID
# namespace; exports GK_COURIER_ROOT.  A download that fails leaves it
# unset (the test then skips).
gk_unpack_courier() {
	if gk_unpack_debs "$1" courier-mta courier-base courier-authdaemon courier-authlib \
		courier-authlib-userdb libuid-wrapper; then
		export GK_COURIER_ROOT="$1/root"
	else
		gk_warn "Courier not unpacked: t/099 will skip"
	fi
}

# gk_make_workdir PREFIX: a fresh temporary directory owned by postgres and
# readable by everyone (smtp-sink runs as postfix and writes below it).
gk_make_workdir() {
	local d
	d=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
	chmod 755 "$d"
	chown postgres: "$d"
	printf '%s\n' "$d"
}

# gk_stage_source SRC DEST: copy the source tree at SRC into DEST, without
# build products or test output, owned by postgres.  From a git checkout it
# copies what git would (tracked and untracked files, minus .gitignore'd
# ones); otherwise everything but .git and the usual build products.
gk_stage_source() {
	local src=$1 dest=$2
	mkdir -p "$dest"
	if command -v git >/dev/null &&
		git -C "$src" -c safe.directory="$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
		(
			cd "$src" || exit 1
			git -c safe.directory="$src" ls-files -z --cached --others --exclude-standard |
				while IFS= read -r -d '' f; do
					# a tracked file deleted in the work tree is not copied
					if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi
				done |
				tar --null -T - -cf -
		) | tar -C "$dest" -xf -
	else
		tar -C "$src" -cf - \
			--exclude=./.git --exclude='*.o' --exclude='*.so' --exclude='*.bc' \
			--exclude=./tmp_check --exclude=./tmp_check_iso --exclude=./results \
			--exclude=./output_iso --exclude=./log --exclude='./regression.*' \
			--exclude=./bench/out . |
			tar -C "$dest" -xf -
	fi
	chown -R postgres: "$dest"
	[ -f "$dest/Makefile" ] || gk_die "no Makefile in the staged copy of $src"
}

# gk_build DIR LOG: build in DIR as postgres, compiler output in LOG (and
# on stderr).  Returns make's status.
gk_build() {
	local dir=$1 log=$2 jobs
	jobs=$(nproc 2>/dev/null || echo 2)
	gk_log "building in $dir (as postgres)"
	if ! (cd "$dir" && gk_run_as_postgres make -s -j"$jobs" PG_CONFIG="$GK_PG_CONFIG") >"$log" 2>&1; then
		cat "$log" >&2
		gk_warn "build failed"
		return 1
	fi
	if [ -s "$log" ]; then cat "$log" >&2; fi
}

# gk_install DIR: `make install` the build in DIR, as root.
gk_install() {
	local dir=$1 out
	gk_log "installing into $("$GK_PG_CONFIG" --pkglibdir) and $("$GK_PG_CONFIG" --sharedir)/extension (as root)"
	if ! out=$(cd "$dir" && make -s PG_CONFIG="$GK_PG_CONFIG" install 2>&1); then
		printf '%s\n' "$out" >&2
		gk_warn "make install failed"
		return 1
	fi
}

# gk_port_free PORT: true when nothing accepts TCP connections on
# 127.0.0.1:PORT.
gk_port_free() {
	! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# gk_free_port [EXCEPT]: print a free loopback port (not EXCEPT).  The
# port is taken below the kernel's ephemeral range when there is room: a
# port in that range can become the local end of some loopback connection
# between this look and the server's bind (seen: the bench's exporter
# failed with "address already in use").
gk_free_port() {
	local p _ lo=32768 base=20000 span=40000
	read -r lo _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || lo=32768
	if [ "$lo" -gt 12000 ]; then
		base=10000
		span=$((lo - 10000))
	fi
	for _ in $(seq 1 500); do
		p=$((base + (RANDOM * 32768 + RANDOM) % span))
		[ "$p" != "${1:-}" ] || continue
		if gk_port_free "$p"; then
			printf '%s\n' "$p"
			return 0
		fi
	done
	gk_die "no free loopback port found"
}

# gk_stop_servers_under DIR: stop every PostgreSQL server whose data
# directory is below DIR (immediate mode: these are throwaway), then end any
# other process still working below DIR (its cwd or command line names
# DIR).  Only our own children can be there: DIR is a fresh mktemp
# directory.  Prints what it had to stop.
gk_stop_servers_under() {
	local dir=$1 pidfile data pid p cwd cmd pids=() round
	[ -n "$dir" ] && [ -d "$dir" ] || return 0
	while IFS= read -r -d '' pidfile; do
		data=$(dirname "$pidfile")
		pid=$(head -n 1 "$pidfile" 2>/dev/null | tr -dc '0-9')
		if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
			gk_log "stopping leftover PostgreSQL server in $data (pid $pid)"
			(cd / && gk_run_as_postgres pg_ctl -D "$data" -m immediate -w -t 30 stop) >/dev/null 2>&1 || kill -KILL "$pid" 2>/dev/null || true
		fi
	done < <(find "$dir" -name postmaster.pid -print0 2>/dev/null)
	for round in TERM TERM TERM KILL; do
		pids=()
		for p in /proc/[0-9]*; do
			pid=${p#/proc/}
			if [ "$pid" = $$ ] || [ "$pid" = "$BASHPID" ]; then continue; fi
			cwd=$(readlink "$p/cwd" 2>/dev/null) || continue
			cmd=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
			case "$cwd/ $cmd" in
			"$dir"/*|*" $dir/"*|*"=$dir/"*) pids+=("$pid") ;;
			esac
		done
		[ ${#pids[@]} -gt 0 ] || return 0
		gk_log "ending leftover processes under $dir (SIG$round): ${pids[*]}"
		kill -"$round" "${pids[@]}" 2>/dev/null || true
		sleep 1
	done
}
