/*-------------------------------------------------------------------------
 *
 * live_count.c
 *		The live gauges' rows: how many of each queue's mails are scheduled,
 *		and how many of those were attempted before (retrying), as rows of
 *		gatekeeper.mail_live_count, so that gatekeeper.queue_stats never
 *		counts mail_live.  (Claimed mail is no row of mail_live: queue_stats
 *		takes it from the open counts of gatekeeper.mail_claim's batches.)
 *
 * What changed the gauges, and when, is mail_count.c's: it hands this
 * file a transaction's changes by queue as the transaction commits or
 * prepares, just before, and they are added in one upsert to this
 * backend's rows (the slot is the backend's id; a prepared transaction's,
 * one of its own), whatever number of statements made them.  Two sessions
 * never write the same row, so claimers never wait for each other here; a
 * queue's gauges are the sum of its rows, plus, for the transaction that
 * reads them, its changes not yet written (_live_pending).  Written per
 * statement, 100,000 enqueue() calls in one transaction would each update
 * the same row, whose versions none can prune before the commit.
 *
 * The rows are written in the transaction that changed mail_live: a
 * rollback takes them back with the change, a crash loses neither, and a
 * query sees the two agree under its snapshot.  A TRUNCATE of mail_live
 * deletes them and counts the tables afresh; so does recount_live(),
 * after writes to mail_live with its triggers disabled.  (Why these
 * gauges are rows while the totals live in shared memory:
 * docs/internals.md, "Counting".)
 *
 * IDENTIFICATION
 *		src/mail/live_count.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "live_count.h"
#include "catalog.h"

#include "access/htup_details.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/backendid.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "gatekeeper.h"

static const char add_live_counts_sql[] =
"INSERT INTO gatekeeper.mail_live_count AS c (queue, slot, scheduled, retrying) "
"SELECT u.queue, $1, u.scheduled, u.retrying "
"  FROM unnest($2::text[], $3::bigint[], $4::bigint[]) AS u(queue, scheduled, retrying) "
"    ON CONFLICT (queue, slot) DO UPDATE "
"   SET scheduled = c.scheduled + excluded.scheduled, "
"       retrying = c.retrying + excluded.retrying";

/* mail_live_count while ALTER EXTENSION UPDATE runs, before the update adds retrying */
static const char add_live_counts_020_sql[] =
"INSERT INTO gatekeeper.mail_live_count AS c (queue, slot, scheduled) "
"SELECT u.queue, $1, u.scheduled "
"  FROM unnest($2::text[], $3::bigint[], $4::bigint[]) AS u(queue, scheduled, retrying) "
"    ON CONFLICT (queue, slot) DO UPDATE "
"   SET scheduled = c.scheduled + excluded.scheduled";

static const char forget_live_counts_sql[] =
"DELETE FROM gatekeeper.mail_live_count";

static const char lock_live_sql[] =
"LOCK TABLE gatekeeper.mail_live, gatekeeper.mail_run IN SHARE ROW EXCLUSIVE MODE";

/* the scheduled mail: rows of mail_live, and the mails of mail_run's runs */
static const char recount_live_sql[] =
"INSERT INTO gatekeeper.mail_live_count (queue, slot, scheduled, retrying) "
"SELECT s.queue, 0, sum(s.scheduled), sum(s.retrying) "
"  FROM (SELECT l.queue, count(*), count(*) FILTER (WHERE l.attempt > 0) "
"          FROM gatekeeper.mail_live l "
"         WHERE l.state = 'scheduled' "
"         GROUP BY l.queue "
"        UNION ALL "
"        SELECT r.queue, sum(r.last_id - r.id + 1), 0 "
"          FROM gatekeeper.mail_run r "
"         GROUP BY r.queue) s(queue, scheduled, retrying) "
" GROUP BY s.queue "
"RETURNING scheduled";

static const char recount_live_020_sql[] =
"INSERT INTO gatekeeper.mail_live_count (queue, slot, scheduled) "
"SELECT l.queue, 0, count(*) "
"  FROM gatekeeper.mail_live l "
" WHERE l.state = 'scheduled' "
" GROUP BY l.queue "
"RETURNING scheduled";

static const char forget_queue_counts_sql[] =
"DELETE FROM gatekeeper.mail_live_count WHERE queue = $1";

static SPIPlanPtr add_live_counts_plan = NULL;
static SPIPlanPtr add_live_counts_020_plan = NULL;
static SPIPlanPtr recount_live_020_plan = NULL;
static SPIPlanPtr forget_live_counts_plan = NULL;
static SPIPlanPtr lock_live_plan = NULL;
static SPIPlanPtr forget_queue_counts_plan = NULL;
static SPIPlanPtr recount_live_plan = NULL;

static bool counts_retrying(void);
static ArrayType *pinned_search_path(void);

/*
 * live_count_write
 *		Add n changes (queue names, scheduled and retrying, as Datums) to
 *		this backend's rows of mail_live_count, or with prepare to a row of
 *		the prepared transaction's own, in one statement.  Nothing is
 *		written when the table is gone (the extension dropped in the same
 *		transaction).
 */
void
live_count_write(Datum *names, Datum *scheduled, Datum *retrying, int n, bool prepare)
{
	Datum		args[4];
	Oid			types[4] = {INT4OID, TEXTARRAYOID, INT8ARRAYOID, INT8ARRAYOID};
	Oid			relid;
	Oid			owner;
	GatekeeperRunAs run;
	HeapTuple	tuple;
	SPIPlanPtr	plan;

	relid = gatekeeper_relid(GATEKEEPER_REL_MAIL_LIVE_COUNT, true);
	if (!OidIsValid(relid))
		return;
	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	if (!HeapTupleIsValid(tuple))
		return;
	owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	ReleaseSysCache(tuple);

	/*
	 * A prepared transaction keeps its row version locked until COMMIT or
	 * ROLLBACK PREPARED, and this backend's id passes to later sessions:
	 * it writes a row of its own, numbered below zero by its transaction
	 * id, that no session writes again while it is in doubt.  Those rows
	 * stay (recount_live() folds them into one).
	 */
	if (prepare)
	{
		TransactionId xid = XidFromFullTransactionId(GetTopFullTransactionId());

		args[0] = Int32GetDatum(-1 - (int32) (xid & 0x7FFFFFFF));
	}
	else
		args[0] = Int32GetDatum(MyBackendId);
	args[1] = gatekeeper_array(names, NULL, n, TEXTOID);
	args[2] = gatekeeper_array(scheduled, NULL, n, INT8OID);
	args[3] = gatekeeper_array(retrying, NULL, n, INT8OID);

	/*
	 * As the table's owner, as the triggers that noted the changes ran
	 * (whoever committed may not write it), with search_path pinned.
	 */
	gatekeeper_run_as(&run, owner, SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION,
					  pinned_search_path());
	PushActiveSnapshot(GetTransactionSnapshot());
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (counts_retrying())
		plan = gatekeeper_plan(&add_live_counts_plan, add_live_counts_sql, 4, types);
	else
		plan = gatekeeper_plan(&add_live_counts_020_plan, add_live_counts_020_sql, 4, types);
	if (SPI_execute_plan(plan, args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not count gatekeeper's live mail");
	SPI_finish();
	PopActiveSnapshot();
	gatekeeper_run_as_end(&run);
}

/*
 * The search_path the counts are written with, as a SET clause would give
 * it: this backend's, made once.
 */
static ArrayType *
pinned_search_path(void)
{
	static ArrayType *config = NULL;

	if (config == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

		config = GUCArrayAdd(NULL, "search_path", "pg_catalog, pg_temp");
		MemoryContextSwitchTo(old);
	}
	return config;
}

/*
 * live_count_delete
 *		Delete the rows of one queue, or (queue NULL) of all.  Inside SPI.
 */
void
live_count_delete(text *queue)
{
	if (queue == NULL)
	{
		gatekeeper_plan(&forget_live_counts_plan, forget_live_counts_sql, 0, NULL);
		if (SPI_execute_plan(forget_live_counts_plan, NULL, NULL, false, 0) != SPI_OK_DELETE)
			elog(ERROR, "could not empty gatekeeper's live counts");
	}
	else
	{
		Datum		arg = PointerGetDatum(queue);
		Oid			type = TEXTOID;

		gatekeeper_plan(&forget_queue_counts_plan, forget_queue_counts_sql, 1, &type);
		if (SPI_execute_plan(forget_queue_counts_plan, &arg, NULL, false, 0) != SPI_OK_DELETE)
			elog(ERROR, "could not delete the live counts of queue \"%s\"",
				 text_to_cstring(queue));
	}
}

/*
 * live_count_lock
 *		recount_live()'s lock: wait for every transaction writing mail_live
 *		or mail_run to end, and keep new ones out.  Inside SPI.
 */
void
live_count_lock(void)
{
	gatekeeper_plan(&lock_live_plan, lock_live_sql, 0, NULL);
	if (SPI_execute_plan(lock_live_plan, NULL, NULL, false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "could not lock gatekeeper.mail_live");
}

/*
 * live_count_recount
 *		Count mail_live and mail_run afresh into the (deleted) rows, under
 *		the current snapshot: the mail that queue_stats' scheduled counts.
 *		Returns the mails counted.  Inside SPI.
 */
int64
live_count_recount(void)
{
	int64		total = 0;
	uint64		i;
	SPIPlanPtr	plan;

	if (counts_retrying())
		plan = gatekeeper_plan(&recount_live_plan, recount_live_sql, 0, NULL);
	else
		plan = gatekeeper_plan(&recount_live_020_plan, recount_live_020_sql, 0, NULL);
	if (SPI_execute_plan(plan, NULL, NULL, false, 0) != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "could not count gatekeeper's live mail");
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		Datum		d = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1,
									  &isnull);

		if (!isnull)
			total += DatumGetInt64(d);
	}
	return total;
}

/*
 * Whether mail_live_count counts the retrying mail (0.2.0's does not):
 * asked at every commit that changed the counts, so the answer is kept
 * (src/catalog.c) until the table changes.
 */
static bool
counts_retrying(void)
{
	return gatekeeper_attnum(GATEKEEPER_COL_LIVE_COUNT_RETRYING) != InvalidAttrNumber;
}
