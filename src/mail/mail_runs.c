/*-------------------------------------------------------------------------
 *
 * mail_runs.c
 *		Runs moved into mail_live, a row per mail.
 *
 * A run (gatekeeper.mail_run, written by src/mail/live_writer.c) stands
 * for the mails id .. last_id of one bulk enqueue, each as a mail_live row
 * with its columns' defaults would be.  Whatever changes one mail of a run
 * (a cancel, an owner's UPDATE or DELETE of the mail, rotation) first
 * moves the run into mail_live.  That is, for the runs holding some mails,
 * or all the runs of a queue or of a retention segment,
 *
 *		WITH r AS (DELETE FROM mail_run r WHERE ... RETURNING r.*)
 *		INSERT INTO mail_live (id, queue, priority, send_at, segment)
 *		SELECT g.id, r.queue, r.priority, r.send_at, r.segment
 *		  FROM r, generate_series(r.id, r.last_id) AS g(id)
 *
 * Here the runs are found and deleted in C and their live rows written by
 * the live writer, with their index entries and the due floor lowered; the
 * run's count and its rows' counts cancel out, so nothing is counted.  A
 * run a claim holds is waited for and looked for again after it commits
 * (the claim moved it on, or took it all), as the statement's recheck
 * would; under REPEATABLE READ that is a serialization failure, as for the
 * statement.
 *
 * The statements above still run when a trigger of the user's sits on
 * mail_run's deletes or mail_live's inserts (the direct path would write
 * past it): they fire it, and the live counts' triggers count.
 *
 * IDENTIFICATION
 *		src/mail/mail_runs.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "mail_runs.h"
#include "catalog.h"
#include "live_writer.h"
#include "mail_exec.h"

#include "access/genam.h"
#include "access/relscan.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_am.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

/* the statements of a run moved by SQL: see the head of this file */
#define RUNS_TO_LIVE_SQL(where) \
"WITH r AS ( " \
"    DELETE FROM gatekeeper.mail_run r WHERE " where \
"    RETURNING r.id, r.last_id, r.queue, r.priority, r.send_at, r.segment) " \
"INSERT INTO gatekeeper.mail_live (id, queue, priority, send_at, segment) " \
"SELECT g.id, r.queue, r.priority, r.send_at, r.segment " \
"  FROM r, generate_series(r.id, r.last_id) AS g(id)"

/* the runs holding any of the mails $1, their first ids */
static const char run_heads_sql[] =
"SELECT array_agg(DISTINCT r.id) "
"  FROM unnest($1) AS i(id), "
"       LATERAL (SELECT x.id, x.last_id FROM gatekeeper.mail_run x "
"                 WHERE x.id <= i.id ORDER BY x.id DESC LIMIT 1) r "
" WHERE r.last_id >= i.id";
static const char runs_by_head_sql[] = RUNS_TO_LIVE_SQL("r.id = ANY ($1)");
static const char runs_of_sql[] =
RUNS_TO_LIVE_SQL("($1::text IS NULL OR r.queue = $1) AND ($2::smallint IS NULL OR r.segment = $2)");

static SPIPlanPtr run_heads_plan = NULL;
static SPIPlanPtr runs_by_head_plan = NULL;
static SPIPlanPtr runs_of_plan = NULL;

/* mail_run's columns, in this order */
static const char *const run_names[] = {
	"id", "last_id", "queue", "priority", "send_at", "segment"
};
enum
{
	R_ID, R_LAST_ID, R_QUEUE, R_PRIORITY, R_SEND_AT, R_SEGMENT, R_NUM
};

/* the columns of a live row a run gives its mails (dedupe_key: none) */
static const char *const live_names[] = {
	"id", "queue", "priority", "send_at", "segment", "dedupe_key"
};
#define L_NUM lengthof(live_names)

/* the direct path's state: mail_run, and a writer of mail_live rows */
typedef struct RunMove
{
	Relation	run;
	AttrNumber	att[R_NUM];
	LiveWriter *live;
	TupleDesc	live_desc;		/* the columns live_names, as mail_live's */
	TupleTableSlot *slot;
	Snapshot	snapshot;
	CommandId	cid;
	int64		row;
} RunMove;

static bool run_move_open(RunMove *m);
static void run_move_close(RunMove *m);
static void run_move_snapshot(RunMove *m);
static bool run_move_delete(RunMove *m, ItemPointer tid);
static void runs_by_sql(const Datum *ids, int n);

/*
 * Open mail_run and a live writer: false, with nothing open, when a
 * trigger of the user's or a changed table leaves the move to SQL.
 */
static bool
run_move_open(RunMove *m)
{
	static const char *const del[] = {"mail_run_count_delete"};
	Oid			relid = gatekeeper_relid(GATEKEEPER_REL_MAIL_RUN, false);
	Relation	live;
	uint32		found;
	int			i;

	memset(m, 0, sizeof(*m));
	m->run = table_open(relid, RowExclusiveLock);
	if (m->run->rd_rel->relam != HEAP_TABLE_AM_OID ||
		!gatekeeper_triggers_only(m->run, TRIGGER_TYPE_DELETE, del, lengthof(del), &found))
	{
		table_close(m->run, NoLock);
		return false;
	}
	for (i = 0; i < R_NUM; i++)
	{
		m->att[i] = SPI_fnumber(RelationGetDescr(m->run), run_names[i]);
		if (m->att[i] <= 0)
			elog(ERROR, "gatekeeper.mail_run has no column \"%s\"", run_names[i]);
	}
	/* a mail as the live writer reads it: the live row's own columns */
	live = table_open(gatekeeper_relid(GATEKEEPER_REL_MAIL_LIVE, false), RowExclusiveLock);
	m->live_desc = CreateTemplateTupleDesc(L_NUM);
	for (i = 0; i < (int) L_NUM; i++)
	{
		int			a = SPI_fnumber(RelationGetDescr(live), live_names[i]);

		if (a <= 0)
			elog(ERROR, "gatekeeper.mail_live has no column \"%s\"", live_names[i]);
		TupleDescCopyEntry(m->live_desc, i + 1, RelationGetDescr(live), a);
	}
	table_close(live, NoLock);
	m->live = gatekeeper_live_writer_open(m->live_desc, 0);
	if (m->live == NULL)
	{
		table_close(m->run, NoLock);
		return false;
	}
	m->slot = table_slot_create(m->run, NULL);
	return true;
}

/*
 * Write the live rows gathered, and close.
 */
static void
run_move_close(RunMove *m)
{
	if (m->snapshot != NULL)
		UnregisterSnapshot(m->snapshot);
	ExecDropSingleTupleTableSlot(m->slot);
	gatekeeper_live_writer_close(m->live);
	table_close(m->run, NoLock);
}

/*
 * As a statement starts: a command of its own, and its snapshot (the
 * transaction's under REPEATABLE READ).
 */
static void
run_move_snapshot(RunMove *m)
{
	if (m->snapshot != NULL)
		UnregisterSnapshot(m->snapshot);
	CommandCounterIncrement();
	m->snapshot = RegisterSnapshot(GetTransactionSnapshot());
	m->cid = GetCurrentCommandId(true);
	m->snapshot->curcid = m->cid;
}

/*
 * Delete the run in m->slot, at tid, and give its mails their live rows:
 * false when a concurrent claim moved it on or deleted it first (it is
 * then looked for again).
 */
static bool
run_move_delete(RunMove *m, ItemPointer tid)
{
	TupleTableSlot *s = m->slot;
	TM_FailureData tmfd;
	TM_Result	result;
	Datum		values[L_NUM];
	bool		isnull[L_NUM];
	int64		id;
	int64		last_id;

	slot_getallattrs(s);
	result = mail_exec_delete(m->run, tid, m->cid, m->snapshot, true, &tmfd);
	if (result == TM_Updated || result == TM_Deleted)
	{
		if (IsolationUsesXactSnapshot())
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize access due to concurrent %s",
							result == TM_Updated ? "update" : "delete")));
		return false;
	}
	if (result != TM_Ok)
		elog(ERROR, "could not delete a run of gatekeeper.mail_run: result %d", (int) result);

	id = DatumGetInt64(s->tts_values[m->att[R_ID] - 1]);
	last_id = DatumGetInt64(s->tts_values[m->att[R_LAST_ID] - 1]);
	values[1] = s->tts_values[m->att[R_QUEUE] - 1];
	values[2] = s->tts_values[m->att[R_PRIORITY] - 1];
	values[3] = s->tts_values[m->att[R_SEND_AT] - 1];
	values[4] = s->tts_values[m->att[R_SEGMENT] - 1];
	values[5] = (Datum) 0;
	memset(isnull, false, sizeof(isnull));
	isnull[5] = true;
	for (; id <= last_id; id++)
	{
		values[0] = Int64GetDatum(id);
		gatekeeper_live_writer_add(m->live, values, isnull, m->row++);
	}
	return true;
}

/*
 * mail_runs_to_live
 *		Move the runs holding any of the n mails ids (bigint datums) into
 *		mail_live, before a change to one of those mails.  Runs inside SPI.
 */
void
mail_runs_to_live(const Datum *ids, int n)
{
	RunMove		m;
	Relation	pkey;
	IndexScanDesc scan;
	bool		again = true;

	if (n == 0)
		return;
	if (!run_move_open(&m))
	{
		runs_by_sql(ids, n);
		return;
	}
	pkey = index_open(RelationGetPrimaryKeyIndex(m.run), AccessShareLock);
	while (again)
	{
		int			i;

		again = false;
		run_move_snapshot(&m);
		for (i = 0; i < n; i++)
		{
			ScanKeyData key;

			/* the run of the greatest first id at most the mail's */
			ScanKeyInit(&key, 1, BTLessEqualStrategyNumber, F_INT8LE, ids[i]);
			scan = index_beginscan(m.run, pkey, m.snapshot, 1, 0);
			index_rescan(scan, &key, 1, NULL, 0);
			if (index_getnext_slot(scan, BackwardScanDirection, m.slot))
			{
				bool		isnull;
				int64		last_id = DatumGetInt64(slot_getattr(m.slot, m.att[R_LAST_ID],
																 &isnull));
				ItemPointerData tid = m.slot->tts_tid;

				if (last_id >= DatumGetInt64(ids[i]) && !run_move_delete(&m, &tid))
					again = true;
			}
			index_endscan(scan);
		}
	}
	index_close(pkey, NoLock);
	run_move_close(&m);
}

/*
 * mail_runs_to_live_of
 *		Move every run of queue, or of retention segment, into mail_live
 *		(queue (Datum) 0: any queue; segment -1: any segment).  Runs inside
 *		SPI.
 */
void
mail_runs_to_live_of(Datum queue, int segment)
{
	RunMove		m;
	bool		again = true;

	if (!run_move_open(&m))
	{
		Oid			types[2] = {TEXTOID, INT2OID};
		Datum		args[2] = {queue, Int16GetDatum((int16) segment)};
		char		nulls[2] = {queue == (Datum) 0 ? 'n' : ' ', segment < 0 ? 'n' : ' '};

		gatekeeper_plan(&runs_of_plan, runs_of_sql, 2, types);
		if (gatekeeper_execute_by_key(runs_of_plan, args, nulls, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "could not move runs into mail_live");
		return;
	}
	while (again)
	{
		TableScanDesc scan;

		again = false;
		run_move_snapshot(&m);
		scan = table_beginscan(m.run, m.snapshot, 0, NULL);
		while (table_scan_getnextslot(scan, ForwardScanDirection, m.slot))
		{
			bool		isnull;
			ItemPointerData tid = m.slot->tts_tid;

			if (queue != (Datum) 0 &&
				!DatumGetBool(DirectFunctionCall2Coll(texteq, DEFAULT_COLLATION_OID, queue,
													  slot_getattr(m.slot, m.att[R_QUEUE],
																   &isnull))))
				continue;
			if (segment >= 0 &&
				DatumGetInt16(slot_getattr(m.slot, m.att[R_SEGMENT], &isnull)) != segment)
				continue;
			if (!run_move_delete(&m, &tid))
				again = true;
		}
		table_endscan(scan);
	}
	run_move_close(&m);
}

/*
 * The runs holding any of ids moved by SQL: each statement fires the
 * triggers of the user's, and the live counts' triggers count.
 */
static void
runs_by_sql(const Datum *ids, int n)
{
	Oid			type = INT8ARRAYOID;
	Datum		arg = gatekeeper_array((Datum *) ids, NULL, n, INT8OID);

	for (;;)
	{
		bool		isnull;
		Datum		heads;

		gatekeeper_plan(&run_heads_plan, run_heads_sql, 1, &type);
		if (gatekeeper_execute_by_key(run_heads_plan, &arg, NULL, false, 1) != SPI_OK_SELECT ||
			SPI_processed != 1)
			elog(ERROR, "could not look for the runs of mails");
		heads = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		if (isnull)
			break;
		heads = PointerGetDatum(DatumGetArrayTypePCopy(heads));
		gatekeeper_plan(&runs_by_head_plan, runs_by_head_sql, 1, &type);
		if (gatekeeper_execute_by_key(runs_by_head_plan, &heads, NULL, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "could not move runs into mail_live");
	}
}
