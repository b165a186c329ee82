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
 * prepares, just before, and they are added to this backend's rows (the
 * slot is the backend's id; a prepared transaction's, one of its own),
 * whatever number of statements made them: the rows that exist updated
 * past the executor, the others by one upsert (update_direct).  Two sessions
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
#include "mail_exec.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "common/int.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "storage/backendid.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/relcache.h"
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

/* mail_live_count's columns, as the direct update finds them */
static const char *const count_columns[] = {"queue", "slot", "scheduled", "retrying"};
enum
{
	N_QUEUE, N_SLOT, N_SCHEDULED, N_RETRYING, N_NUM
};

static bool counts_retrying(void);
static ArrayType *pinned_search_path(void);
static bool count_table_plain(Relation rel, Relation *pkey, AttrNumber *att);
static int	update_direct(Oid relid, int32 slot, Datum *names, Datum *scheduled,
						  Datum *retrying, int n, bool *done);

/*
 * live_count_write
 *		Add n changes (queue names, scheduled and retrying, as Datums) to
 *		this backend's rows of mail_live_count, or with prepare to a row of
 *		the prepared transaction's own.  Nothing is written when the table
 *		is gone (the extension dropped in the same transaction).
 *
 * The rows that exist are updated past the executor (update_direct); the
 * others, in one statement, an upsert.
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
	int32		slot;
	bool	   *done;
	int			left;
	int			i;

	relid = gatekeeper_relid(GATEKEEPER_REL_MAIL_LIVE_COUNT, true);
	if (!OidIsValid(relid))
		return;

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

		slot = -1 - (int32) (xid & 0x7FFFFFFF);
	}
	else
		slot = MyBackendId;

	done = palloc0(n * sizeof(bool));
	if (update_direct(relid, slot, names, scheduled, retrying, n, done) == n)
		return;
	/* the statement runs as the table's owner */
	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	if (!HeapTupleIsValid(tuple))
		return;
	owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	ReleaseSysCache(tuple);
	for (i = 0, left = 0; i < n; i++)
	{
		if (done[i])
			continue;
		names[left] = names[i];
		scheduled[left] = scheduled[i];
		retrying[left] = retrying[i];
		left++;
	}
	args[0] = Int32GetDatum(slot);
	args[1] = gatekeeper_array(names, NULL, left, TEXTOID);
	args[2] = gatekeeper_array(scheduled, NULL, left, INT8OID);
	args[3] = gatekeeper_array(retrying, NULL, left, INT8OID);

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
 * Whether the direct update may write rel (mail_live_count) as the
 * statement would, running no code of the user's (which the statement runs
 * as the table's owner): a heap with no trigger of the user's on its
 * updates and no CHECK constraint, its columns of 0.3.0's types, its
 * primary key on (queue, slot).  Sets *pkey, open, and att (N_NUM
 * columns).
 */
static bool
count_table_plain(Relation rel, Relation *pkey, AttrNumber *att)
{
	static const Oid types[N_NUM] = {TEXTOID, INT4OID, INT8OID, INT8OID};
	TupleDesc	desc = RelationGetDescr(rel);
	Oid			pkey_relid;
	uint32		found;
	int			k;

	*pkey = NULL;
	if (rel->rd_rel->relam != HEAP_TABLE_AM_OID ||
		(desc->constr != NULL && desc->constr->num_check > 0) ||
		!gatekeeper_triggers_only(rel, TRIGGER_TYPE_UPDATE, NULL, 0, &found))
		return false;
	for (k = 0; k < N_NUM; k++)
	{
		att[k] = SPI_fnumber(desc, count_columns[k]);
		if (att[k] <= 0 || TupleDescAttr(desc, att[k] - 1)->atttypid != types[k])
			return false;
	}
	pkey_relid = RelationGetPrimaryKeyIndex(rel);
	if (!OidIsValid(pkey_relid))
		return false;
	*pkey = index_open(pkey_relid, RowExclusiveLock);
	return (*pkey)->rd_rel->relam == BTREE_AM_OID &&
		(*pkey)->rd_index->indnatts == 2 &&
		(*pkey)->rd_index->indkey.values[0] == att[N_QUEUE] &&
		(*pkey)->rd_index->indkey.values[1] == att[N_SLOT];
}

/*
 * Add the changes to the rows of slot that exist, past the executor: each
 * found by the primary key under a new snapshot, as the statement's would
 * be, and updated (no indexed column changes: HOT, in the room the table's
 * fillfactor leaves).  Sets done[i] for each change added; returns how
 * many.  The others are the statement's: a row not there yet, or updated
 * or deleted by another transaction since the snapshot (a recount, a
 * queue forgotten), which its ON CONFLICT handles, and a sum out of range,
 * which it reports.  None is added when the table is not plain
 * (count_table_plain).
 */
static int
update_direct(Oid relid, int32 slot, Datum *names, Datum *scheduled, Datum *retrying,
			  int n, bool *done)
{
	Relation	rel = try_table_open(relid, RowExclusiveLock);
	Relation	pkey;
	AttrNumber	att[N_NUM];
	Snapshot	snapshot;
	MailExec	x;
	TupleTableSlot *row;
	TupleTableSlot *updated;
	int			ndone = 0;
	int			i;

	if (rel == NULL)
		return 0;				/* gone: nothing is written */
	if (!count_table_plain(rel, &pkey, att))
	{
		if (pkey != NULL)
			index_close(pkey, NoLock);
		table_close(rel, NoLock);
		return 0;
	}
	/* as a statement starts: its own command, and a new snapshot */
	CommandCounterIncrement();
	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	mail_exec_open(&x, rel, GetCurrentCommandId(true));
	snapshot->curcid = x.cid;
	PushActiveSnapshot(snapshot);
	row = table_slot_create(rel, NULL);
	updated = table_slot_create(rel, NULL);
	for (i = 0; i < n; i++)
	{
		ScanKeyData keys[2];
		IndexScanDesc scan;
		TM_FailureData tmfd;
		int64		sum[2];

		ScanKeyEntryInitialize(&keys[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
							   pkey->rd_indcollation[0], F_TEXTEQ, names[i]);
		ScanKeyInit(&keys[1], 2, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(slot));
		scan = index_beginscan(rel, pkey, snapshot, 2, 0);
		index_rescan(scan, keys, 2, NULL, 0);
		if (index_getnext_slot(scan, ForwardScanDirection, row))
		{
			ItemPointerData tid = row->tts_tid;

			slot_getallattrs(row);
			if (!pg_add_s64_overflow(DatumGetInt64(row->tts_values[att[N_SCHEDULED] - 1]),
									 DatumGetInt64(scheduled[i]), &sum[0]) &&
				!pg_add_s64_overflow(DatumGetInt64(row->tts_values[att[N_RETRYING] - 1]),
									 DatumGetInt64(retrying[i]), &sum[1]))
			{
				mail_exec_new_version(row, updated);
				updated->tts_values[att[N_SCHEDULED] - 1] = Int64GetDatum(sum[0]);
				updated->tts_values[att[N_RETRYING] - 1] = Int64GetDatum(sum[1]);
				ExecStoreVirtualTuple(updated);
				done[i] = mail_exec_update(&x, &tid, updated, snapshot, true, &tmfd) == TM_Ok;
				ndone += done[i] ? 1 : 0;
			}
		}
		index_endscan(scan);
	}
	ExecDropSingleTupleTableSlot(row);
	ExecDropSingleTupleTableSlot(updated);
	PopActiveSnapshot();
	UnregisterSnapshot(snapshot);
	mail_exec_close(&x);
	index_close(pkey, NoLock);
	table_close(rel, NoLock);
	/* the statement, if any, sees these updates */
	CommandCounterIncrement();
	return ndone;
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
