/*-------------------------------------------------------------------------
 *
 * router_deadline.c
 *		The deadline of a call that the router (the extension
 *		gatekeeper_router, on PL/Proxy) sends to a shard:
 *		gatekeeper_router.timeout.
 *
 * PL/Proxy (2.10, Debian's postgresql-15-plproxy; 2.12 is the same here)
 * cannot bound a call to a shard that stopped answering, a frozen host
 * whose kernel still accepts connections and acknowledges what is sent
 * while its server never answers:
 *
 * - its query_timeout is looked at only when one of the call's connections
 *   had something to read or write; a frozen shard never has, so the call
 *   waits for ever;
 * - it has no connect timeout (its cluster option is gone, and libpq's
 *   connect_timeout does not apply to the non-blocking connect it runs);
 * - a query cancel (statement_timeout, pg_cancel_backend) makes it send
 *   the shard a cancel request and wait until the shard closes that
 *   connection (PQcancel), which a frozen shard never does.
 *
 * Its wait does check for interrupts every second, and an error that is
 * not a cancel ends it at once: PL/Proxy then forgets the call, and drops
 * that connection before its next call to the shard ("dropping stale
 * conn").  So the router's functions arm PostgreSQL's lock timeout, whose
 * error is 55P03 and not a cancel, for the length of each routed call,
 * and disarm it when the call returns; the router turns the 55P03 into
 * 08006 naming the shard (gatekeeper._failed in
 * sql/gatekeeper_router--0.3.0.sql).  A routed call waits for no lock of
 * the router's own, which leaves the lock timeout free while it runs.
 *
 * One wait is out of PL/Proxy's loop: sending a call larger than what the
 * connection's buffers take (a mail of a few hundred kilobytes to a frozen
 * shard), libpq waits until it can write, and checks for no interrupt.  A
 * second timer, a second after the deadline, finds the connection whose
 * data the shard has not taken (the stream sockets of this process with
 * bytes in their send queue, the client's excepted) and shuts it down, so
 * that the write fails and PL/Proxy raises its error.  The lock timeout
 * that fired meanwhile is then never reported: its pending cancel is
 * forgotten when the call's subtransaction aborts.
 *
 * A deadline is disarmed when the (sub)transaction that armed it aborts,
 * so that a call ended by another error, a cancel included, never leaves
 * it to fire in a later statement.
 *
 * IDENTIFICATION
 *		src/router_deadline.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "router_deadline.h"

#include <limits.h>
#include <math.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/sockios.h>
#endif

#include "fmgr.h"
#include "miscadmin.h"
/*
 * For MyProcPort->sock only.  libpq-be.h would need GSSAPI's headers,
 * which a build need not have; without them its Port keeps its layout
 * (a void pointer stands for the GSSAPI state).
 */
#undef ENABLE_GSS
#include "libpq/libpq-be.h"
#include "utils/timeout.h"
#include "utils/timestamp.h"

PG_FUNCTION_INFO_V1(gatekeeper_router_deadline);
PG_FUNCTION_INFO_V1(gatekeeper_router_deadline_passed);

/* how long after the deadline a call stuck in a write is cut off */
#define ESCAPE_DELAY_MS 1000

/* whether this process armed the lock timeout for a routed call */
static bool deadline_armed = false;

/* when the deadline armed last falls due, and when it was disarmed */
static TimestampTz deadline_at = 0;
static TimestampTz disarmed_at = 0;

/* the timer that cuts a stuck write off, registered on first use */
static TimeoutId escape_timeout = MAX_TIMEOUTS;

/* the descriptors the escape looks at (the process's limit, at most 65536) */
static int	escape_fd_limit = 0;

/* the client's socket, never shut down by the escape */
static volatile int escape_client_fd = -1;

static void deadline_disarm(bool aborting);
static void deadline_escape(void);

/*
 * gatekeeper._deadline(seconds): arm the deadline of the routed call about
 * to run, seconds from now (0: none); NULL disarms it, and raises its
 * error there if it fired meanwhile, so that the caller's exception block
 * sees it rather than a statement after it.
 */
Datum
gatekeeper_router_deadline(PG_FUNCTION_ARGS)
{
	double		seconds;
	double		ms;
	int			delay;

	deadline_disarm(false);
	if (PG_ARGISNULL(0))
	{
		CHECK_FOR_INTERRUPTS();
		PG_RETURN_VOID();
	}

	seconds = PG_GETARG_FLOAT8(0);
	if (isnan(seconds) || seconds < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a routed call's deadline must be 0 or more seconds")));
	deadline_at = 0;
	if (seconds == 0)
		PG_RETURN_VOID();

	if (escape_timeout == MAX_TIMEOUTS)
	{
		struct rlimit limit;

		escape_timeout = RegisterTimeout(USER_TIMEOUT, deadline_escape);
		escape_fd_limit = 1024;
		if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
			escape_fd_limit = (int) Min(limit.rlim_cur, 65536);
	}
	escape_client_fd = MyProcPort != NULL ? (int) MyProcPort->sock : -1;

	ms = ceil(seconds * 1000.0);
	delay = ms >= INT_MAX - ESCAPE_DELAY_MS ? INT_MAX - ESCAPE_DELAY_MS : (int) ms;
	deadline_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), delay);
	enable_timeout_after(LOCK_TIMEOUT, delay);
	enable_timeout_after(escape_timeout, delay + ESCAPE_DELAY_MS);
	deadline_armed = true;
	PG_RETURN_VOID();
}

/*
 * gatekeeper._deadline_passed(): whether the deadline armed last had
 * fallen due when it was disarmed: the call that failed ran out of time,
 * whatever its error says.
 */
Datum
gatekeeper_router_deadline_passed(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(deadline_at != 0 && !deadline_armed && disarmed_at >= deadline_at);
}

/*
 * Disarm the deadline if this process armed one.  The lock timeout's
 * indicator is kept, so that a deadline that fired and is not yet
 * reported is reported as the lock timeout it is, but for a call that
 * aborts: its error is reported already, and a cancel still pending from
 * the deadline (the escape ended the call first) is forgotten.
 */
static void
deadline_disarm(bool aborting)
{
	if (!deadline_armed)
		return;
	disable_timeout(LOCK_TIMEOUT, true);
	disable_timeout(escape_timeout, false);
	deadline_armed = false;
	disarmed_at = GetCurrentTimestamp();
	if (aborting && get_timeout_indicator(LOCK_TIMEOUT, true))
		QueryCancelPending = false;
}

/*
 * The escape, in the timer's signal handler: shut down every stream
 * socket of this process with bytes the peer has not taken, but the
 * client's.  Only system calls that are safe in a signal handler.
 */
static void
deadline_escape(void)
{
#ifdef SIOCOUTQ
	int			fd;

	for (fd = 0; fd < escape_fd_limit; fd++)
	{
		struct stat st;
		int			type;
		int			queued;
		socklen_t	len = sizeof(type);

		if (fd == escape_client_fd || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode))
			continue;
		if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM)
			continue;
		if (ioctl(fd, SIOCOUTQ, &queued) == 0 && queued > 0)
			shutdown(fd, SHUT_RDWR);
	}
#endif
}

/*
 * gatekeeper_router_deadline_at_xact_end: the transaction ends; no routed
 * call of it is running any more.
 */
void
gatekeeper_router_deadline_at_xact_end(XactEvent event)
{
	deadline_disarm(event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT);
}

/*
 * gatekeeper_router_deadline_at_subxact_end: a subtransaction that aborts
 * ends the routed call that ran in it (the router's exception blocks run
 * each call in one).
 */
void
gatekeeper_router_deadline_at_subxact_end(SubXactEvent event)
{
	if (event == SUBXACT_EVENT_ABORT_SUB)
		deadline_disarm(true);
}
