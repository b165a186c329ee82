/*-------------------------------------------------------------------------
 *
 * live_count.c
 *		How many of each queue's mails are scheduled, and how many of
 *		those were attempted before (retrying), kept in
 *		gatekeeper.mail_live_count as mail_live changes, so that
 *		gatekeeper.queue_stats never counts mail_live.  (Claimed mail is
 *		no row of mail_live: queue_stats takes it from the open counts of
 *		gatekeeper.mail_claim's batches.)
 *
 * Every statement that writes gatekeeper.mail_live fires its statement
 * triggers (gatekeeper._count_live), which net the statement's rows by
 * queue: an old scheduled row is taken from the counts, a new one added.
 * The insert trigger of gatekeeper.mail, which writes new mail's live
 * rows without the executor (src/mail.c), notes its own.  Either way the
 * changes wait in this backend, by transaction nesting level (a
 * subtransaction that aborts drops its own, one that commits hands them to
 * its parent), and are written when the transaction commits or prepares,
 * just before: one upsert into this backend's rows of mail_live_count
 * (the slot is the backend's id; a prepared transaction's, one of its
 * own), whatever number of statements changed mail_live.  Two sessions
 * never write the same row, so claimers never wait for each other there;
 * a queue's counts are the sum of its rows, plus, for the transaction that
 * reads them, its changes not yet written (_live_pending).  (Written per statement, 100,000 enqueue() calls in
 * one transaction would each update the same row, whose versions none
 * can prune before the commit: each update walked all the earlier ones.)
 *
 * The counts are rows written in the transaction that changed mail_live:
 * a rollback takes them back with the change, a crash loses neither, and
 * a query sees the two agree under its snapshot.  A TRUNCATE of mail_live
 * deletes them at once and sets aside the changes this transaction noted
 * before it (brought back if the TRUNCATE's subtransaction aborts).  What
 * they cannot see is a write to mail_live with its triggers disabled:
 * recount_live() counts the table afresh after one.  (Why these gauges
 * are rows while queue_stats' totals live in shared memory: src/stats.c.)
 *
 * IDENTIFICATION
 *		src/live_count.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "live_count.h"
#include "mail_store.h"
#include "catalog.h"
#include "due_floor.h"
#include "xact.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/backendid.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/tuplestore.h"

#include "gatekeeper.h"

PG_FUNCTION_INFO_V1(gatekeeper_count_live);
PG_FUNCTION_INFO_V1(gatekeeper_recount_live);
PG_FUNCTION_INFO_V1(gatekeeper_live_pending);
PG_FUNCTION_INFO_V1(gatekeeper_forget_live);

/* A queue's change noted by this backend, not yet written */
typedef struct PendingLive
{
	Oid			relid;			/* of the mail_live it counts */
	char	   *queue;			/* in live_context, not NUL-terminated */
	int			len;
	int			level;			/* transaction nesting level that noted it */
	int			erased;			/* level of a later TRUNCATE, or 0 */
	int64		scheduled;
	int64		retrying;		/* of those, attempted before */
} PendingLive;

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

/* this transaction's changes, and the context of their queue names */
static PendingLive *pending = NULL;
static int	npending = 0;
static int	maxpending = 0;
static MemoryContext live_context = NULL;

static void note_change(Oid relid, const char *queue, int len, int64 scheduled,
						int64 retrying);
static void write_pending(bool prepare);
static void forget_pending(void);
static void count_rows(Oid relid, Tuplestorestate *rows, TupleDesc desc, int queue_att,
					   int state_att, int attempt_att, Oid scheduled, int sign);
static bool counts_retrying(void);
static void erase_counts(text *queue);
static Oid	live_relid_now(void);

/*
 * Add to queue's scheduled mail, and to those of it attempted before (both
 * may be negative), for the commit.
 */
void
gatekeeper_live_count_add(Oid live_relid, Datum queue, int64 scheduled, int64 retrying)
{
	text	   *name = DatumGetTextPP(queue);

	note_change(live_relid, VARDATA_ANY(name), VARSIZE_ANY_EXHDR(name), scheduled,
				retrying);
}

/*
 * Add a queue's change to this transaction's, at the current nesting
 * level.  Changes that net to nothing (a rotation, a lease extended) note
 * nothing.
 */
static void
note_change(Oid relid, const char *queue, int len, int64 scheduled, int64 retrying)
{
	int			level = GetCurrentTransactionNestLevel();
	PendingLive *p;
	char	   *copy;
	int			i;

	if (scheduled == 0 && retrying == 0)
		return;
	for (i = npending - 1; i >= 0 && pending[i].level == level; i--)
	{
		p = &pending[i];
		if (p->erased == 0 && p->relid == relid && p->len == len &&
			memcmp(p->queue, queue, len) == 0)
		{
			p->scheduled += scheduled;
			p->retrying += retrying;
			return;
		}
	}
	if (live_context == NULL)
		live_context = AllocSetContextCreate(TopMemoryContext,
											 "gatekeeper pending live counts",
											 ALLOCSET_SMALL_SIZES);
	if (npending == maxpending)
	{
		int			newmax = Max(16, maxpending * 2);

		if (pending == NULL)
			pending = MemoryContextAlloc(TopMemoryContext, sizeof(PendingLive) * newmax);
		else
			pending = repalloc(pending, sizeof(PendingLive) * newmax);
		maxpending = newmax;
	}
	copy = MemoryContextAlloc(live_context, Max(len, 1));
	memcpy(copy, queue, len);
	/* counted only once nothing above can fail */
	p = &pending[npending++];
	p->relid = relid;
	p->queue = copy;
	p->len = len;
	p->level = level;
	p->erased = 0;
	p->scheduled = scheduled;
	p->retrying = retrying;
}

/*
 * Forget this transaction's changes.
 */
static void
forget_pending(void)
{
	npending = 0;
	if (live_context != NULL)
		MemoryContextReset(live_context);
}

/*
 * Add this transaction's changes to this backend's rows of
 * mail_live_count, in one statement: at the commit or prepare, before
 * either can no longer fail.  Nothing is written when the table is gone
 * (the extension dropped in the same transaction).
 */
static void
write_pending(bool prepare)
{
	Datum	   *names;
	Datum	   *scheduled;
	Datum	   *retrying;
	Datum		args[4];
	Oid			types[4] = {INT4OID, TEXTARRAYOID, INT8ARRAYOID, INT8ARRAYOID};
	Oid			live_relid;
	Oid			relid;
	Oid			owner;
	Oid			save_userid;
	int			save_sec_context;
	int			nestlevel;
	HeapTuple	tuple;
	SPIPlanPtr	plan;
	int			n = 0;
	int			i;
	int			j;

	live_relid = live_relid_now();

	names = palloc(sizeof(Datum) * npending);
	scheduled = palloc(sizeof(Datum) * npending);
	retrying = palloc(sizeof(Datum) * npending);
	for (i = 0; i < npending; i++)
	{
		PendingLive *p = &pending[i];
		int64		s = 0;
		int64		r = 0;

		if (p->erased != 0 || p->len < 0 || p->relid != live_relid)
			continue;
		/* one element per queue: merge the later levels' into this */
		for (j = i; j < npending; j++)
		{
			PendingLive *q = &pending[j];

			if (q->erased != 0 || q->relid != live_relid || q->len != p->len ||
				memcmp(q->queue, p->queue, p->len) != 0)
				continue;
			s += q->scheduled;
			r += q->retrying;
			if (j > i)
				q->len = -1;	/* taken */
		}
		if (s == 0 && r == 0)
			continue;
		names[n] = PointerGetDatum(cstring_to_text_with_len(p->queue, p->len));
		scheduled[n] = Int64GetDatum(s);
		retrying[n] = Int64GetDatum(r);
		n++;
	}
	forget_pending();
	if (n == 0)
		return;
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
	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(owner, save_sec_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	nestlevel = NewGUCNestLevel();
	(void) set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET,
							 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
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
	AtEOXact_GUC(true, nestlevel);
	SetUserIdAndSecContext(save_userid, save_sec_context);
}

/*
 * mail_store_at_xact_end
 *		src/xact.c's hook.  Write the changes when the transaction commits
 *		or prepares, just before; forget them when it aborts.
 */
void
mail_store_at_xact_end(XactEvent event)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			if (npending > 0)
				write_pending(false);
			break;
		case XACT_EVENT_PRE_PREPARE:
			if (npending > 0)
				write_pending(true);
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			forget_pending();
			break;
		default:
			break;
	}
}

/*
 * mail_store_at_subxact_end
 *		src/xact.c's hook.  A subtransaction that aborts drops the changes
 *		it noted and brings back those a TRUNCATE of it set aside; one that
 *		commits hands both to its parent.
 */
void
mail_store_at_subxact_end(SubXactEvent event)
{
	int			level = GetCurrentTransactionNestLevel();
	int			i;

	if (npending == 0)
		return;
	if (event == SUBXACT_EVENT_ABORT_SUB)
	{
		while (npending > 0 && pending[npending - 1].level >= level)
			npending--;
		for (i = 0; i < npending; i++)
			if (pending[i].erased >= level)
				pending[i].erased = 0;
	}
	else if (event == SUBXACT_EVENT_COMMIT_SUB)
	{
		int			first;
		int			parent;
		int			n;
		int			j;

		for (i = 0; i < npending; i++)
			if (pending[i].erased >= level)
				pending[i].erased = level - 1;

		/*
		 * Levels only grow along the array: this level's changes are its
		 * tail, the parent's just before.  Each joins the parent's change
		 * of its queue, so that a loop of subtransactions (a PL/pgSQL
		 * exception block per enqueue) keeps one change a queue, not one
		 * per subtransaction for every later one to walk.
		 */
		for (first = npending; first > 0 && pending[first - 1].level >= level; first--)
			;
		for (parent = first; parent > 0 && pending[parent - 1].level == level - 1; parent--)
			;
		n = first;
		for (i = first; i < npending; i++)
		{
			PendingLive *p = &pending[i];

			for (j = parent; j < n && p->erased == 0; j++)
			{
				PendingLive *q = &pending[j];

				if (q->erased == 0 && q->relid == p->relid && q->len == p->len &&
					memcmp(q->queue, p->queue, p->len) == 0)
				{
					q->scheduled += p->scheduled;
					q->retrying += p->retrying;
					pfree(p->queue);
					break;
				}
			}
			if (p->erased == 0 && j < n)
				continue;
			p->level = level - 1;
			pending[n++] = *p;
		}
		npending = n;
	}
}

/*
 * Delete the counts, of one queue or (queue NULL) of all, and set aside
 * the changes this transaction noted for them before (they are in what
 * replaces the counts, or gone with the rows they counted); a
 * subtransaction that aborts brings them back.  Inside SPI.
 */
static void
erase_counts(text *queue)
{
	int			level = GetCurrentTransactionNestLevel();
	int			i;

	for (i = 0; i < npending; i++)
	{
		PendingLive *p = &pending[i];

		if (p->erased != 0)
			continue;
		if (queue != NULL &&
			(p->len != (int) VARSIZE_ANY_EXHDR(queue) ||
			 memcmp(p->queue, VARDATA_ANY(queue), p->len) != 0))
			continue;
		p->erased = level;
	}
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
 * Whether mail_live_count counts the retrying mail (0.2.0's does not):
 * asked at every commit that changed the counts, so the answer is kept
 * (src/catalog.c) until the table changes.
 */
static bool
counts_retrying(void)
{
	return gatekeeper_attnum(GATEKEEPER_COL_LIVE_COUNT_RETRYING) != InvalidAttrNumber;
}

/*
 * The mail_live there is now: the changes noted for another (the
 * extension dropped, or dropped and made again, since) count for nothing.
 */
static Oid
live_relid_now(void)
{
	return gatekeeper_relid(GATEKEEPER_REL_MAIL_LIVE, true);
}

/*
 * Add each scheduled row, times sign, to this transaction's changes.
 */
static void
count_rows(Oid relid, Tuplestorestate *rows, TupleDesc desc, int queue_att,
		   int state_att, int attempt_att, Oid scheduled, int sign)
{
	TupleTableSlot *slot = MakeSingleTupleTableSlot(desc, &TTSOpsMinimalTuple);

	tuplestore_rescan(rows);
	while (tuplestore_gettupleslot(rows, true, false, slot))
	{
		bool		isnull;
		Datum		queue = slot_getattr(slot, queue_att, &isnull);
		Oid			state;

		if (isnull)
			continue;
		state = DatumGetObjectId(slot_getattr(slot, state_att, &isnull));
		if (isnull)
			continue;
		if (state == scheduled)
		{
			Datum		attempt = slot_getattr(slot, attempt_att, &isnull);

			gatekeeper_live_count_add(relid, queue, sign,
									  !isnull && DatumGetInt32(attempt) > 0 ? sign : 0);
		}
		ExecClearTuple(slot);
	}
	ExecDropSingleTupleTableSlot(slot);
}

/*
 * Add each run's mails (last_id - id + 1), times sign, to this
 * transaction's changes: runs are never retrying.
 */
static void
count_runs(Oid live_relid, Tuplestorestate *rows, TupleDesc desc, int sign)
{
	TupleTableSlot *slot = MakeSingleTupleTableSlot(desc, &TTSOpsMinimalTuple);
	int			queue_att = SPI_fnumber(desc, "queue");
	int			id_att = SPI_fnumber(desc, "id");
	int			last_att = SPI_fnumber(desc, "last_id");

	if (queue_att <= 0 || id_att <= 0 || last_att <= 0)
		elog(ERROR, "gatekeeper_count_live fired on a table without queue, id and last_id");
	tuplestore_rescan(rows);
	while (tuplestore_gettupleslot(rows, true, false, slot))
	{
		bool		n1,
					n2,
					n3;
		Datum		queue = slot_getattr(slot, queue_att, &n1);
		int64		id = DatumGetInt64(slot_getattr(slot, id_att, &n2));
		int64		last = DatumGetInt64(slot_getattr(slot, last_att, &n3));

		if (!n1 && !n2 && !n3 && last >= id)
			gatekeeper_live_count_add(live_relid, queue, sign * (last - id + 1), 0);
		ExecClearTuple(slot);
	}
	ExecDropSingleTupleTableSlot(slot);
}

/*
 * Count mail_live and mail_run afresh into the (erased) counts, under the
 * current snapshot: the mail that queue_stats' scheduled counts.  Inside
 * SPI.
 */
static int64
recount_tables(void)
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
 * Lower the due floors (due_floor.c) to the statement's new scheduled
 * rows: their index entries exist by now, and the floor must not pass them.
 * state_att 0: the rows are runs of mail_run, whose own floor is lowered.
 */
static void
lower_floors(Tuplestorestate *rows, TupleDesc desc, int queue_att, int state_att,
			 Oid scheduled)
{
	TupleTableSlot *slot = MakeSingleTupleTableSlot(desc, &TTSOpsMinimalTuple);
	int			priority_att = SPI_fnumber(desc, "priority");
	int			send_at_att = SPI_fnumber(desc, "send_at");
	int			id_att = SPI_fnumber(desc, "id");

	if (priority_att <= 0 || send_at_att <= 0 || id_att <= 0)
		elog(ERROR, "gatekeeper_count_live fired on a table without priority, send_at and id");
	tuplestore_rescan(rows);
	while (tuplestore_gettupleslot(rows, true, false, slot))
	{
		bool		isnull;
		bool		n1,
					n2,
					n3;
		Datum		queue = slot_getattr(slot, queue_att, &isnull);
		DueKey		key;

		if (!isnull && (state_att <= 0 ||
						(DatumGetObjectId(slot_getattr(slot, state_att, &n1)) == scheduled && !n1)))
		{
			key.priority = DatumGetInt32(slot_getattr(slot, priority_att, &n1));
			key.send_at = DatumGetTimestampTz(slot_getattr(slot, send_at_att, &n2));
			key.id = DatumGetInt64(slot_getattr(slot, id_att, &n3));
			if (!n1 && !n2 && !n3 && state_att <= 0)
				gatekeeper_due_floor_lower_run(queue, &key);
			else if (!n1 && !n2 && !n3)
				gatekeeper_due_floor_lower(queue, &key);
		}
		ExecClearTuple(slot);
	}
	ExecDropSingleTupleTableSlot(slot);
}

/*
 * gatekeeper_count_live
 *		gatekeeper._count_live(), the AFTER INSERT, UPDATE, DELETE and
 *		TRUNCATE statement triggers of gatekeeper.mail_live: note the
 *		statement's change to the live counts.
 */
Datum
gatekeeper_count_live(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	TupleDesc	desc;
	int			queue_att;
	int			state_att;
	int			attempt_att;
	Oid			state_type;
	Oid			scheduled;

	gatekeeper_require_schema();
	if (!CALLED_AS_TRIGGER(fcinfo) ||
		!TRIGGER_FIRED_AFTER(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_STATEMENT(trigdata->tg_event))
		elog(ERROR, "gatekeeper_count_live must be an AFTER statement trigger");

	if (TRIGGER_FIRED_BY_TRUNCATE(trigdata->tg_event))
	{
		/* what the other of mail_live and mail_run holds is still scheduled */
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		erase_counts(NULL);
		recount_tables();
		SPI_finish();
		return PointerGetDatum(NULL);
	}
	if (trigdata->tg_oldtable == NULL && trigdata->tg_newtable == NULL)
		elog(ERROR, "gatekeeper_count_live needs the statement's transition tables");

	desc = RelationGetDescr(trigdata->tg_relation);
	if (SPI_fnumber(desc, "last_id") > 0)
	{
		/* mail_run: counted against mail_live, whose counts they are */
		Oid			live_relid = gatekeeper_relid(GATEKEEPER_REL_MAIL_LIVE, false);

		if (trigdata->tg_oldtable != NULL)
			count_runs(live_relid, trigdata->tg_oldtable, desc, -1);
		if (trigdata->tg_newtable != NULL)
		{
			count_runs(live_relid, trigdata->tg_newtable, desc, 1);
			lower_floors(trigdata->tg_newtable, desc, SPI_fnumber(desc, "queue"), 0,
						 InvalidOid);
		}
		return PointerGetDatum(NULL);
	}
	queue_att = SPI_fnumber(desc, "queue");
	state_att = SPI_fnumber(desc, "state");
	attempt_att = SPI_fnumber(desc, "attempt");
	if (queue_att <= 0 || state_att <= 0 || attempt_att <= 0)
		elog(ERROR, "gatekeeper_count_live fired on a table without queue, state and attempt");
	state_type = TupleDescAttr(desc, state_att - 1)->atttypid;
	scheduled = DatumGetObjectId(DirectFunctionCall2(enum_in,
													 CStringGetDatum("scheduled"),
													 ObjectIdGetDatum(state_type)));

	if (trigdata->tg_oldtable != NULL)
		count_rows(RelationGetRelid(trigdata->tg_relation), trigdata->tg_oldtable,
				   desc, queue_att, state_att, attempt_att, scheduled, -1);
	if (trigdata->tg_newtable != NULL)
	{
		count_rows(RelationGetRelid(trigdata->tg_relation), trigdata->tg_newtable,
				   desc, queue_att, state_att, attempt_att, scheduled, 1);
		lower_floors(trigdata->tg_newtable, desc, queue_att, state_att, scheduled);
	}
	return PointerGetDatum(NULL);
}

/*
 * gatekeeper_recount_live
 *		gatekeeper.recount_live(): count mail_live afresh into
 *		mail_live_count, for counts that missed writes (mail_live written
 *		with its triggers disabled, as pg_restore --disable-triggers
 *		does).  Returns the live mails counted.
 *
 * The SHARE ROW EXCLUSIVE lock waits for every transaction writing
 * mail_live to end (their counts are written as they commit, before the
 * lock is theirs no more, or as they prepare) and keeps new ones, and a
 * second recount, out until this one ends; the count then runs under a
 * snapshot taken after the lock, which READ COMMITTED gives and a
 * transaction snapshot would not.  This transaction's own earlier
 * changes are in that count, so they are set aside as a TRUNCATE sets
 * them aside.
 */
Datum
gatekeeper_recount_live(PG_FUNCTION_ARGS)
{
	int64		total;

	gatekeeper_require_schema();
	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("recount_live() must run in a READ COMMITTED transaction"),
				 errdetail("A transaction snapshot taken before the lock would miss what committed while it waited.")));

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	gatekeeper_plan(&lock_live_plan, lock_live_sql, 0, NULL);
	if (SPI_execute_plan(lock_live_plan, NULL, NULL, false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "could not lock gatekeeper.mail_live");
	erase_counts(NULL);
	total = recount_tables();
	SPI_finish();
	/* writes the triggers did not see may sit below any floor */
	gatekeeper_due_floor_reset();
	PG_RETURN_INT64(total);
}

/*
 * gatekeeper_live_pending
 *		gatekeeper._live_pending(): this transaction's changes to the live
 *		counts, not yet written, by queue: what queue_stats adds to the
 *		written counts so that, inside a transaction that changed live
 *		mail, they agree with the mail_live it sees.
 */
Datum
gatekeeper_live_pending(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			live_relid;
	int			i;

	gatekeeper_require_schema();
	InitMaterializedSRF(fcinfo, 0);
	if (npending == 0)
		return (Datum) 0;
	live_relid = live_relid_now();
	for (i = 0; i < npending; i++)
	{
		PendingLive *p = &pending[i];
		Datum		values[3];
		bool		nulls[3] = {false, false, false};

		if (p->erased != 0 || p->relid != live_relid)
			continue;
		values[0] = PointerGetDatum(cstring_to_text_with_len(p->queue, p->len));
		values[1] = Int64GetDatum(p->scheduled);
		/* 0.2.0's _live_pending, until ALTER EXTENSION UPDATE, takes two */
		values[2] = Int64GetDatum(p->retrying);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/*
 * gatekeeper_forget_live
 *		gatekeeper._forget_live(queue): drop_queue's end of the live
 *		counts.  The queue's rows are deleted, and what this transaction
 *		noted for it set aside (a cancel_queue before the drop, say), as a
 *		TRUNCATE sets its changes aside: the two sum to nothing, the queue
 *		having no live mail left.  A subtransaction that aborts brings both
 *		back.
 */
Datum
gatekeeper_forget_live(PG_FUNCTION_ARGS)
{
	gatekeeper_require_schema();

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	erase_counts(PG_GETARG_TEXT_PP(0));
	SPI_finish();
	PG_RETURN_VOID();
}
