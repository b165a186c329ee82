/*-------------------------------------------------------------------------
 *
 * xact.c
 *		The one transaction callback of gatekeeper: at the end of every
 *		transaction and subtransaction it calls each module's hook, in one
 *		order.
 *
 * Three modules keep state for the transaction that runs and act when it
 * ends: the gates' store (src/gate_store.c: refuses PREPARE TRANSACTION
 * after gates changed, gives back memory reserved and not spent), the
 * counts (src/mail/mail_count.c: writes the live gauges to
 * mail_live_count just before the commit, adds the totals to shared
 * memory after it) and the wake-ups (src/wake.c: wakes the workers and
 * posts the announcement after the commit).  Each keeps its own pending state; this file only decides when
 * each is called, and in which order:
 *
 * 1. the gates' store first, so that a PREPARE it refuses is refused
 *    before anything is written for it;
 * 2. the counts next: at PRE_COMMIT they write the gauges' rows, which
 *    may still fail and abort the transaction, and nothing after the
 *    commit may; after the commit they add the totals, before the
 *    wake-ups: a worker or a session woken by this commit sees the totals
 *    it made;
 * 3. the wake-ups last, once everything this transaction publishes is in
 *    shared memory.
 *
 * One more module has nothing to publish: the deadline of a call the
 * router routes to a shard (src/router_deadline.c) is disarmed when the
 * transaction, or the subtransaction that ran the call, ends.
 *
 * The callbacks are registered once per process, when the library is
 * loaded; each hook returns at once when it has nothing pending.
 *
 * It also runs a step in a subtransaction of its own for the modules
 * that must survive an expected error (gatekeeper_subxact_try), and for
 * the worker, whose claim, recording of outcomes, extension of leases and
 * housekeeping may fail while mail it claimed is on the wire
 * (gatekeeper_subxact_catch); and commits the worker's transactions so
 * that a commit that fails is survived the same way
 * (gatekeeper_commit_catch).
 *
 * IDENTIFICATION
 *		src/xact.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "xact.h"
#include "gate_store.h"
#include "mail/mail_store.h"
#include "router_deadline.h"
#include "wake.h"

#include "utils/elog.h"
#include "utils/memutils.h"
#include "utils/resowner.h"

static bool xact_callbacks_registered = false;

static void gatekeeper_xact_callback(XactEvent event, void *arg);
static void gatekeeper_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
										SubTransactionId parentSubid, void *arg);

/*
 * gatekeeper_xact_init
 *		Register gatekeeper's transaction and subtransaction callbacks, once
 *		per process.
 */
void
gatekeeper_xact_init(void)
{
	if (xact_callbacks_registered)
		return;
	RegisterXactCallback(gatekeeper_xact_callback, NULL);
	RegisterSubXactCallback(gatekeeper_subxact_callback, NULL);
	xact_callbacks_registered = true;
}

/*
 * Every module's hook for the end of a transaction, in the order the file
 * banner explains.
 */
static void
gatekeeper_xact_callback(XactEvent event, void *arg)
{
	gate_store_at_xact_end(event);
	mail_store_at_xact_end(event);
	gatekeeper_wake_at_xact_end(event);
	gatekeeper_router_deadline_at_xact_end(event);
}

/*
 * Every module's hook for the end of a subtransaction: each drops what
 * the subtransaction noted when it aborts, or hands it to the parent when
 * it commits.  The modules are independent here; the order is the
 * transaction's.
 */
static void
gatekeeper_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
							SubTransactionId parentSubid, void *arg)
{
	gate_store_at_subxact_end(event);
	mail_store_at_subxact_end(event);
	gatekeeper_router_deadline_at_subxact_end(event);
}

/*
 * gatekeeper_subxact_try: run step in a subtransaction of its own, as
 * PL/pgSQL's exception block does.  When step returns true its work is
 * kept and the result is true.  When it returns false, or raises an error
 * that expected says is an outcome (a lock not available, a key taken
 * meanwhile), the subtransaction is rolled back, giving back whatever it
 * had taken, and the result is false.  Any other error is raised again
 * after the rollback.  The caller's memory context and resource owner are
 * the current ones again on return.
 */
bool
gatekeeper_subxact_try(GatekeeperSubxactStep step, void *arg,
					   GatekeeperSubxactExpected expected)
{
	ErrorData  *error;

	if (gatekeeper_subxact_catch(step, arg, &error))
		return true;
	if (error != NULL)
	{
		if (!expected(error))
			ReThrowError(error);
		FreeErrorData(error);
	}
	return false;
}

/*
 * gatekeeper_subxact_catch: gatekeeper_subxact_try for a caller that must
 * finish work of its own before it handles any error of step's: step's
 * error, whatever it is, rolls its subtransaction back and is returned in
 * *error, copied into the caller's memory context (NULL when step raised
 * none).  The result is whether step's work was kept.
 */
bool
gatekeeper_subxact_catch(GatekeeperSubxactStep step, void *arg, ErrorData **error)
{
	MemoryContext context = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	volatile bool kept = false;
	ErrorData  *volatile caught = NULL;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(context);
	PG_TRY();
	{
		kept = step(arg);
		if (kept)
			ReleaseCurrentSubTransaction();
		else
			RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(context);
		CurrentResourceOwner = owner;
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(context);
		caught = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(context);
		CurrentResourceOwner = owner;
		kept = false;
	}
	PG_END_TRY();
	*error = caught;
	return kept;
}

/*
 * gatekeeper_commit_catch: commit the current transaction, as
 * CommitTransactionCommand does; when the commit fails before it is
 * recorded (a deferred trigger of the user's, the live counts' rows
 * written just before it, a NOTIFY queue that is full), abort the
 * transaction instead, as the top-level error recovery of a backend
 * would, and return false with the error in *error, copied into
 * TopMemoryContext (the caller frees it).  Nothing of the transaction is
 * then kept.  An error once the commit is recorded cannot come here:
 * PostgreSQL refuses to abort a committed transaction with a PANIC.
 * Either way the current memory context is TopMemoryContext on return.
 */
bool
gatekeeper_commit_catch(ErrorData **error)
{
	volatile bool committed = false;
	ErrorData  *volatile caught = NULL;

	PG_TRY();
	{
		CommitTransactionCommand();
		committed = true;
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(TopMemoryContext);
		caught = CopyErrorData();
		FlushErrorState();
		AbortCurrentTransaction();
	}
	PG_END_TRY();
	MemoryContextSwitchTo(TopMemoryContext);
	*error = caught;
	return committed;
}
