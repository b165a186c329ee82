/*-------------------------------------------------------------------------
 *
 * live_writer.c
 *		The insert trigger's writer of mail_live (src/mail.c): the
 *		statement's live rows, written straight into the table.
 *
 * An INSERT ... SELECT from the transition table (the SQL path of src/mail.c,
 * kept for restores) reads every new mail a second time and goes through the
 * executor row by row: about a sixth of a COPY's time.  Instead, the pass
 * that validates the rows also forms their live rows and writes them in
 * batches with table_multi_insert(), as COPY itself does, then inserts
 * their index entries (the unique mail_dedupe included, so a second live
 * mail with the same queue and dedupe key fails as it would in SQL).
 *
 * Columns copied from the mail are the six the SQL path names; every
 * other column of mail_live takes its default, evaluated once per
 * statement.  The direct path is taken only when it does exactly what the
 * SQL would: no row trigger of mail_live that fires here (mail_live_restore
 * fires only at trigger depth 0, for restores), no volatile default, and
 * each copied column of the same type in both tables; otherwise the SQL
 * path runs.
 *
 * IDENTIFICATION
 *		src/live_writer.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "live_writer.h"
#include "catalog.h"
#include "due_floor.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_trigger.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "optimizer/optimizer.h"
#include "rewrite/rewriteHandler.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/timestamp.h"

#define LIVE_BATCH 1000

static const char *const live_copied[] = {
	"id", "queue", "priority", "send_at", "dedupe_key", "segment"
};

/* a statement's writer: mail_live open, a batch of its rows */
struct LiveWriter
{
	Relation	rel;
	EState	   *estate;
	ResultRelInfo *rri;
	BulkInsertState bistate;
	CommandId	cid;
	MemoryContext batch_cxt;	/* what a batch's inserts allocate */
	int			natts;
	int		   *source;			/* per mail_live attribute: the mail's
								 * attribute it copies, or 0 */
	Datum	   *fixed;			/* else its default, evaluated once */
	bool	   *fixed_null;
	bool		check;			/* the constraints need testing per row */
	int			queue_att;		/* mail_live's queue and dedupe_key, for */
	int			dedupe_att;		/* the context of a dedupe conflict */
	int			priority_att;	/* and its key in mail_due, for the */
	int			send_at_att;	/* due floor (due_floor.c) */
	int			id_att;
	TupleTableSlot *slots[LIVE_BATCH];
	int64		first_row;		/* the statement's row of slots[0] */
	int			nslots;
	int			nmade;			/* slots created so far */
	int			current;		/* the slot whose index entries are going in */
};

/*
 * The lowest key of a run of live rows of one queue whose index entries
 * went in, for the due floor (due_floor.c): one lowering per run, not per
 * row.
 */
typedef struct FloorRun
{
	text	   *queue;			/* NULL: no run yet */
	DueKey		min;
} FloorRun;

static void live_error_context(void *arg);
static bool live_has_triggers(Relation rel);
static bool live_needs_check(TupleDesc desc, TupleDesc mail_desc, LiveWriter *w);
static void live_floor_note(LiveWriter *w, TupleTableSlot *slot, FloorRun *run);
static void live_flush(LiveWriter *w);

/*
 * The context of an error while a live row's index entries go in: a
 * second live mail with the same queue and dedupe key.  The unique index's
 * own detail names the key only to roles that may read the table; this
 * line names the row, queue and key to any role that may insert.
 */
static void
live_error_context(void *arg)
{
	LiveWriter *w = (LiveWriter *) arg;
	TupleTableSlot *slot = w->slots[w->current];
	bool		qnull = true;
	bool		knull = true;
	Datum		q = (Datum) 0;
	Datum		k = (Datum) 0;

	if (w->queue_att > 0)
		q = slot_getattr(slot, w->queue_att, &qnull);
	if (w->dedupe_att > 0)
		k = slot_getattr(slot, w->dedupe_att, &knull);
	if (knull)
		errcontext("row %lld of the statement",
				   (long long) (w->first_row + w->current));
	else
		errcontext("row %lld of the statement, queue \"%s\", dedupe key \"%s\"",
				   (long long) (w->first_row + w->current),
				   qnull ? "" : TextDatumGetCString(q), TextDatumGetCString(k));
}

/*
 * Whether mail_live has an insert trigger that would fire for the statement
 * trigger's inserts (trigger depth 1): any but mail_live_restore and the
 * live counts' own.
 */
static bool
live_has_triggers(Relation rel)
{
	/* the live counts' trigger: the direct path counts for itself */
	static const char *const own[] = {"mail_live_restore", "mail_live_count_insert"};
	uint32		found;

	return !gatekeeper_triggers_only(rel, TRIGGER_TYPE_INSERT, own, lengthof(own), &found);
}

/*
 * Whether mail_live's constraints must be tested row by row: not when it
 * has no CHECK constraint and each NOT NULL column is either copied from a
 * NOT NULL column of the mail (which the insert into the mail has tested)
 * or takes a default that is not null.  Testing them was about a
 * twentieth of the writer's time for nothing.
 */
static bool
live_needs_check(TupleDesc desc, TupleDesc mail_desc, LiveWriter *w)
{
	int			i;

	if (desc->constr == NULL)
		return false;
	if (desc->constr->num_check > 0)
		return true;
	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (att->attisdropped || !att->attnotnull)
			continue;
		if (w->source[i] > 0)
		{
			if (!TupleDescAttr(mail_desc, w->source[i] - 1)->attnotnull)
				return true;
		}
		else if (w->fixed_null[i])
			return true;
	}
	return false;
}

/*
 * gatekeeper_live_writer_open
 *		Open mail_live for the direct path, or return NULL when the SQL path
 *		must write the rows instead.
 */
LiveWriter *
gatekeeper_live_writer_open(TupleDesc mail_desc)
{
	Oid			relid = gatekeeper_relid(GATEKEEPER_REL_MAIL_LIVE, false);
	Relation	rel;
	TupleDesc	desc;
	LiveWriter *w;
	int			i;
	int			j;

	rel = table_open(relid, RowExclusiveLock);
	if (live_has_triggers(rel))
	{
		table_close(rel, NoLock);
		return NULL;
	}
	desc = RelationGetDescr(rel);

	w = palloc0(sizeof(LiveWriter));
	w->rel = rel;
	w->natts = desc->natts;
	w->source = palloc0(desc->natts * sizeof(int));
	w->fixed = palloc0(desc->natts * sizeof(Datum));
	w->fixed_null = palloc0(desc->natts * sizeof(bool));
	w->estate = CreateExecutorState();
	w->estate->es_output_cid = GetCurrentCommandId(true);

	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		const char *name = NameStr(att->attname);
		Node	   *def;

		w->fixed_null[i] = true;
		if (att->attisdropped)
			continue;
		for (j = 0; j < (int) lengthof(live_copied); j++)
			if (strcmp(name, live_copied[j]) == 0)
				break;
		if (j < (int) lengthof(live_copied))
		{
			int			src = SPI_fnumber(mail_desc, name);

			if (src <= 0 || TupleDescAttr(mail_desc, src - 1)->atttypid != att->atttypid)
				goto use_sql;
			w->source[i] = src;
			continue;
		}
		def = build_column_default(rel, i + 1);
		if (def == NULL)
			continue;
		if (contain_volatile_functions(def))
			goto use_sql;
		{
			ExprState  *es = ExecPrepareExpr((Expr *) expression_planner((Expr *) def),
											 w->estate);
			ExprContext *econtext = GetPerTupleExprContext(w->estate);
			MemoryContext old = MemoryContextSwitchTo(w->estate->es_query_cxt);

			w->fixed[i] = ExecEvalExpr(es, econtext, &w->fixed_null[i]);
			if (!w->fixed_null[i])
				w->fixed[i] = datumCopy(w->fixed[i], att->attbyval, att->attlen);
			MemoryContextSwitchTo(old);
		}
	}

	w->check = live_needs_check(desc, mail_desc, w);
	w->queue_att = Max(SPI_fnumber(desc, "queue"), 0);
	w->dedupe_att = Max(SPI_fnumber(desc, "dedupe_key"), 0);
	w->priority_att = SPI_fnumber(desc, "priority");
	w->send_at_att = SPI_fnumber(desc, "send_at");
	w->id_att = SPI_fnumber(desc, "id");
	if (w->queue_att <= 0 || w->priority_att <= 0 || w->send_at_att <= 0 || w->id_att <= 0)
		goto use_sql;
	w->rri = makeNode(ResultRelInfo);
	/* no range table: ri_RangeTableIndex 0, which ExecConstraints allows */
	InitResultRelInfo(w->rri, rel, 0, NULL, 0);
	ExecOpenIndices(w->rri, false);
	w->bistate = GetBulkInsertState();
	w->cid = GetCurrentCommandId(true);
	w->batch_cxt = AllocSetContextCreate(CurrentMemoryContext,
										 "gatekeeper live rows",
										 ALLOCSET_DEFAULT_SIZES);
	return w;

use_sql:
	FreeExecutorState(w->estate);
	table_close(rel, NoLock);
	return NULL;
}

/*
 * Add a live row whose index entries went in to the run, lowering the
 * floor to the run before when the queue changes.  Rows that are not
 * scheduled lower it too: harmless.
 */
static void
live_floor_note(LiveWriter *w, TupleTableSlot *slot, FloorRun *run)
{
	DueKey		key;
	bool		n0,
				n1,
				n2,
				n3;
	Datum		queue = slot_getattr(slot, w->queue_att, &n0);
	text	   *q;

	key.priority = DatumGetInt32(slot_getattr(slot, w->priority_att, &n1));
	key.send_at = DatumGetTimestampTz(slot_getattr(slot, w->send_at_att, &n2));
	key.id = DatumGetInt64(slot_getattr(slot, w->id_att, &n3));
	if (n0 || n1 || n2 || n3)
		return;
	q = DatumGetTextPP(queue);
	if (run->queue != NULL &&
		(VARSIZE_ANY_EXHDR(q) != VARSIZE_ANY_EXHDR(run->queue) ||
		 memcmp(VARDATA_ANY(q), VARDATA_ANY(run->queue), VARSIZE_ANY_EXHDR(q)) != 0))
	{
		gatekeeper_due_floor_lower(PointerGetDatum(run->queue), &run->min);
		run->queue = NULL;
	}
	if (run->queue == NULL)
	{
		run->queue = (text *) PG_DETOAST_DATUM_COPY(queue);
		run->min = key;
	}
	else if (key.priority > run->min.priority ||
			 (key.priority == run->min.priority &&
			  (key.send_at < run->min.send_at ||
			   (key.send_at == run->min.send_at && key.id < run->min.id))))
		run->min = key;
}

/*
 * Write the buffered live rows and their index entries.
 */
static void
live_flush(LiveWriter *w)
{
	MemoryContext old;
	ErrorContextCallback errcallback;
	FloorRun	run = {NULL};
	int			i;

	if (w->nslots == 0)
		return;
	old = MemoryContextSwitchTo(w->batch_cxt);
	table_multi_insert(w->rel, w->slots, w->nslots, w->cid, 0, w->bistate);
	errcallback.callback = live_error_context;
	errcallback.arg = w;
	errcallback.previous = error_context_stack;
	error_context_stack = &errcallback;
	for (i = 0; i < w->nslots; i++)
	{
		List	   *recheck;

		w->current = i;
		ResetPerTupleExprContext(w->estate);
		recheck = ExecInsertIndexTuples(w->rri, w->slots[i], w->estate,
										false, false, NULL, NIL);
		list_free(recheck);
		live_floor_note(w, w->slots[i], &run);
		ExecClearTuple(w->slots[i]);
	}
	if (run.queue != NULL)
		gatekeeper_due_floor_lower(PointerGetDatum(run.queue), &run.min);
	error_context_stack = errcallback.previous;
	MemoryContextSwitchTo(old);
	MemoryContextReset(w->batch_cxt);
	w->nslots = 0;
}

/*
 * gatekeeper_live_writer_add
 *		Buffer the live row of one new mail, row "row" of the statement,
 *		given as its deformed columns (by attribute number less one, of
 *		the TupleDesc the writer was opened with).
 */
void
gatekeeper_live_writer_add(LiveWriter *w, Datum *mail_values, bool *mail_isnull, int64 row)
{
	TupleTableSlot *slot;
	int			i;

	if (w->nslots == w->nmade)
	{
		/* slots outlive the caller's per-row context */
		MemoryContext old = MemoryContextSwitchTo(w->estate->es_query_cxt);

		w->slots[w->nmade++] = table_slot_create(w->rel, NULL);
		MemoryContextSwitchTo(old);
	}
	slot = w->slots[w->nslots];
	if (w->nslots == 0)
		w->first_row = row;
	ExecClearTuple(slot);
	for (i = 0; i < w->natts; i++)
	{
		if (w->source[i] > 0)
		{
			slot->tts_values[i] = mail_values[w->source[i] - 1];
			slot->tts_isnull[i] = mail_isnull[w->source[i] - 1];
		}
		else
		{
			slot->tts_values[i] = w->fixed[i];
			slot->tts_isnull[i] = w->fixed_null[i];
		}
	}
	ExecStoreVirtualTuple(slot);
	/* copy the values out of the mail, which the caller frees */
	ExecMaterializeSlot(slot);
	if (w->check)
		ExecConstraints(w->rri, slot, w->estate);
	if (++w->nslots == LIVE_BATCH)
		live_flush(w);
}

/*
 * gatekeeper_live_writer_relid
 *		The mail_live the writer writes, whose counts its rows change.
 */
Oid
gatekeeper_live_writer_relid(LiveWriter *w)
{
	return RelationGetRelid(w->rel);
}

/*
 * gatekeeper_live_writer_close
 *		Write what is left, and close.
 */
void
gatekeeper_live_writer_close(LiveWriter *w)
{
	int			i;

	live_flush(w);
	for (i = 0; i < w->nmade; i++)
		ExecDropSingleTupleTableSlot(w->slots[i]);
	FreeBulkInsertState(w->bistate);
	ExecCloseIndices(w->rri);
	FreeExecutorState(w->estate);
	table_close(w->rel, NoLock);	/* held to the end of the transaction */
	MemoryContextDelete(w->batch_cxt);
	/* as SPI does after a statement: later commands see the rows */
	CommandCounterIncrement();
}

