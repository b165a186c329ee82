/*-------------------------------------------------------------------------
 *
 * wake.c
 *		Wake-ups: the workers woken when a transaction that wrote due mail
 *		commits, and notify queues' mail announced to external senders.
 *
 * A transaction that writes due mail calls gatekeeper_wake_at_commit();
 * at commit, and only at commit, the workers connected to that database
 * are woken through their latches (src/worker_slots.c).
 *
 * Wake-ups for external senders: a notify queue's mail due now is
 * announced with NOTIFY gatekeeper, '<queue>' at commit.  A transaction
 * that writes mail of a notify queue due later calls
 * gatekeeper_announce_later(); at commit the earliest such time goes to
 * shared memory and the first worker, which announces mail as it comes
 * due, is woken to look at it (src/worker.c).
 *
 * The pending state is this backend's, for the transaction that runs;
 * src/xact.c calls gatekeeper_wake_at_xact_end() when it ends.
 *
 * IDENTIFICATION
 *		src/wake.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "wake.h"
#include "worker_slots.h"
#include "xact.h"

#include "commands/async.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

/* this transaction wrote due mail: wake the workers at commit */
static bool wake_pending = false;

/* the earliest due time this transaction asked to be announced, or DT_NOEND */
static TimestampTz announce_pending = DT_NOEND;

PG_FUNCTION_INFO_V1(gatekeeper_wake);
PG_FUNCTION_INFO_V1(gatekeeper_announce);

/*
 * Wake the workers when the current transaction commits.  Called for every
 * row of mail written that is due now (or within a nap), so it does nothing
 * but set a flag once it has been called in a transaction.  A no-op when
 * the library was not preloaded: then there are no workers to wake.
 */
void
gatekeeper_wake_at_commit(void)
{
	if (wake_pending || !gatekeeper_slots_present())
		return;
	wake_pending = true;
}

/*
 * NOTIFY gatekeeper, '<queue>' at commit.  PostgreSQL folds the same
 * notification made twice in a transaction into one (commands/async.c), so
 * callers need not remember whom they announced.
 */
void
gatekeeper_notify_queue(const char *queue)
{
	Async_Notify(GATEKEEPER_CHANNEL, queue);
}

/*
 * Have the first background worker announce mail of a notify queue that is
 * due at "due", later than now: if this transaction commits, the earliest
 * such time goes to shared memory and the worker is woken to look.  Called
 * for every such row, so it does little.  A no-op without preloading: then
 * there is no worker.
 */
void
gatekeeper_announce_later(TimestampTz due)
{
	if (!gatekeeper_slots_present())
		return;
	if (due < announce_pending)
		announce_pending = due;
}

/*
 * Announce a notify queue's mail made due at "due" by a transition
 * (unclaim, reap, nack): at commit when it is due by now, else by the
 * worker when it comes due.
 */
void
gatekeeper_announce_due(const char *queue, TimestampTz due)
{
	if (due <= GetCurrentTimestamp())
		gatekeeper_notify_queue(queue);
	else
		gatekeeper_announce_later(due);
}

/*
 * gatekeeper._announce(queue, due): gatekeeper_announce_due, for SQL.
 */
Datum
gatekeeper_announce(PG_FUNCTION_ARGS)
{
	gatekeeper_announce_due(text_to_cstring(PG_GETARG_TEXT_PP(0)),
							PG_GETARG_TIMESTAMPTZ(1));
	PG_RETURN_VOID();
}

/*
 * gatekeeper._wake(): SQL access to gatekeeper_wake_at_commit(), for SQL
 * functions that make mail due (resume, for one).
 */
Datum
gatekeeper_wake(PG_FUNCTION_ARGS)
{
	gatekeeper_wake_at_commit();
	PG_RETURN_VOID();
}

/*
 * gatekeeper_wake_at_xact_end
 *		src/xact.c's hook.  At commit, post the announcement and wake the
 *		workers if this transaction wrote due mail; at abort or PREPARE
 *		TRANSACTION forget it (a prepared transaction's mail is found by
 *		the next round).  Runs after the commit is visible: must not fail.
 */
void
gatekeeper_wake_at_xact_end(XactEvent event)
{
	TimestampTz announce = announce_pending;

	if (!wake_pending && announce == DT_NOEND)
		return;

	switch (event)
	{
		case XACT_EVENT_COMMIT:
			announce_pending = DT_NOEND;
			if (announce != DT_NOEND)
				gatekeeper_slots_post_announcement(announce);
			if (wake_pending)
			{
				wake_pending = false;
				gatekeeper_slots_wake_database();
			}
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			wake_pending = false;
			announce_pending = DT_NOEND;
			break;
		default:
			break;
	}
}
