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

#include "fmgr.h"
#include "miscadmin.h"
#include "utils/timeout.h"

PG_FUNCTION_INFO_V1(gatekeeper_router_deadline);

/* whether this process armed the lock timeout for a routed call */
static bool deadline_armed = false;

static void deadline_disarm(void);

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

	deadline_disarm();
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
	if (seconds == 0)
		PG_RETURN_VOID();

	ms = ceil(seconds * 1000.0);
	enable_timeout_after(LOCK_TIMEOUT, ms >= INT_MAX ? INT_MAX : (int) ms);
	deadline_armed = true;
	PG_RETURN_VOID();
}

/*
 * Disarm the deadline if this process armed one, keeping the timeout's
 * indicator: a deadline that fired is still reported as the lock timeout
 * it is.
 */
static void
deadline_disarm(void)
{
	if (!deadline_armed)
		return;
	disable_timeout(LOCK_TIMEOUT, true);
	deadline_armed = false;
}

/*
 * gatekeeper_router_deadline_at_xact_end: the transaction ends; no routed
 * call of it is running any more.
 */
void
gatekeeper_router_deadline_at_xact_end(XactEvent event)
{
	deadline_disarm();
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
		deadline_disarm();
}
