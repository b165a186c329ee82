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
 * Runs.  Mails of the statement with consecutive ids, one queue, priority,
 * send_at and segment and no dedupe key are written as one row of
 * mail_run for up to RUN_MAX of them (ids id .. last_id) instead of a
 * mail_live row each: a bulk enqueue's cost was mostly the two index
 * entries of every live row (docs/internals.md, "Bulk enqueue"); only
 * statements of RUN_MIN_ROWS mails or more write runs (a COPY, whose
 * size is not known in advance, from its RUN_MIN_ROWS-th mail on: nrows
 * -1).  A run of one is a live row.  Only ids
 * above every id mail_live and mail_run hold (asked once, when the first
 * run forms) go into runs, so a run never covers a mail that has a live
 * row or another run: a mail given an id by hand that a scheduled mail
 * has still meets mail_live's primary key.  Runs are written only while
 * mail_run has no insert trigger but its live counts' (the caller counts
 * every mail, run or not).
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
#include "mail_exec.h"

#include "access/genam.h"
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
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#define LIVE_BATCH 1000

/*
 * The most mails of one run: what one claimer locks at once.  A claim
 * that takes part of a run holds the rest of it until it commits (its
 * new version is its own until then), where live rows it did not take
 * stay free for other claimers; so runs are written only for statements
 * of RUN_MIN_ROWS mails or more, a bulk enqueue, and a claimer of such
 * mail leaves other claimers at most a run's worth of it held.
 */
#define RUN_MAX 128
#define RUN_MIN_ROWS 256

static const char *const live_copied[] = {
	"id", "queue", "priority", "send_at", "dedupe_key", "segment"
};

/* a statement's writer: mail_live open, a batch of its rows */
struct LiveWriter
{
	Relation	rel;
	EState	   *estate;			/* shared by live and run */
	MailExec	live;			/* mail_live's indexes */
	BulkInsertState bistate;
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

	/* runs: mail_run, or NULL when the statement writes none */
	Relation	run_rel;
	MailExec	run;			/* mail_run's indexes */
	TupleTableSlot *run_slot;
	AttrNumber	run_att[6];		/* id, last_id, queue, priority, send_at, segment */
	AttrNumber	mail_att[6];	/* the mail's id, -, queue, priority, send_at, segment */
	AttrNumber	mail_dedupe;
	int			mail_natts;
	TupleDesc	mail_desc;		/* the mail's columns */
	int64		until_runs;		/* rows to add before runs open; -1: never */
	bool		have_top;
	int64		top;			/* the highest id of mail_live and mail_run */
	/* the run being gathered: its first mail's columns, its last id */
	bool		run_open;
	int64		run_first;
	int64		run_last;
	int64		run_row;
	Datum	   *run_values;		/* by the mail's attribute number less one */
	bool	   *run_isnull;
	MemoryContext run_cxt;		/* the run's copied queue */
};

enum
{
	RUN_ID, RUN_LAST_ID, RUN_QUEUE, RUN_PRIORITY, RUN_SEND_AT, RUN_SEGMENT
};
static const char *const run_names[] = {
	"id", "last_id", "queue", "priority", "send_at", "segment"
};

static void live_error_context(void *arg);
static bool live_has_triggers(Relation rel);
static bool live_needs_check(TupleDesc desc, TupleDesc mail_desc, LiveWriter *w);
static void live_floor_note(LiveWriter *w, TupleTableSlot *slot, DueFloorNote *floor);
static void live_flush(LiveWriter *w);
static void live_add(LiveWriter *w, Datum *mail_values, bool *mail_isnull, int64 row);
static void run_open_rel(LiveWriter *w);
static void run_end(LiveWriter *w);

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
gatekeeper_live_writer_open(TupleDesc mail_desc, int64 nrows)
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
	w->estate = mail_exec_estate(GetCurrentCommandId(true));

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
	mail_exec_open_in(&w->live, rel, w->estate);
	w->bistate = GetBulkInsertState();
	w->batch_cxt = AllocSetContextCreate(CurrentMemoryContext,
										 "gatekeeper live rows",
										 ALLOCSET_DEFAULT_SIZES);
	w->mail_desc = mail_desc;
	w->until_runs = -1;
	if (nrows >= RUN_MIN_ROWS)
		run_open_rel(w);
	else if (nrows < 0)
		w->until_runs = RUN_MIN_ROWS - 1;
	return w;

use_sql:
	FreeExecutorState(w->estate);
	table_close(rel, NoLock);
	return NULL;
}

/*
 * Note a live row whose index entries went in for the due floor
 * (due_floor.c).  Rows that are not scheduled lower it too: harmless.
 */
static void
live_floor_note(LiveWriter *w, TupleTableSlot *slot, DueFloorNote *floor)
{
	DueKey		key;
	bool		n0,
				n1,
				n2,
				n3;
	Datum		queue = slot_getattr(slot, w->queue_att, &n0);

	key.priority = DatumGetInt32(slot_getattr(slot, w->priority_att, &n1));
	key.send_at = DatumGetTimestampTz(slot_getattr(slot, w->send_at_att, &n2));
	key.id = DatumGetInt64(slot_getattr(slot, w->id_att, &n3));
	if (!n0 && !n1 && !n2 && !n3)
		gatekeeper_due_floor_note(floor, queue, &key);
}

/*
 * Write the buffered live rows and their index entries.
 */
static void
live_flush(LiveWriter *w)
{
	MemoryContext old;
	ErrorContextCallback errcallback;
	DueFloorNote floor;
	int			i;

	if (w->nslots == 0)
		return;
	old = MemoryContextSwitchTo(w->batch_cxt);
	gatekeeper_due_floor_note_start(&floor, DUE_FLOOR_LIVE);
	mail_exec_insert_heap(&w->live, w->slots, w->nslots, w->bistate);
	errcallback.callback = live_error_context;
	errcallback.arg = w;
	errcallback.previous = error_context_stack;
	error_context_stack = &errcallback;
	for (i = 0; i < w->nslots; i++)
	{
		w->current = i;
		mail_exec_index(&w->live, w->slots[i], false);
		live_floor_note(w, w->slots[i], &floor);
		ExecClearTuple(w->slots[i]);
	}
	gatekeeper_due_floor_note_end(&floor);
	error_context_stack = errcallback.previous;
	MemoryContextSwitchTo(old);
	MemoryContextReset(w->batch_cxt);
	w->nslots = 0;
}

/*
 * Open mail_run for the statement's runs, unless an insert trigger of the
 * user's would fire there (the direct path writes past it) or the tables
 * lack a column a run needs.
 */
static void
run_open_rel(LiveWriter *w)
{
	static const char *const own[] = {"mail_run_count_insert"};
	static const char *const mail_names[] = {
		"id", NULL, "queue", "priority", "send_at", "segment"
	};
	TupleDesc	mail_desc = w->mail_desc;
	Oid			relid = gatekeeper_relid(GATEKEEPER_REL_MAIL_RUN, true);
	Relation	rel;
	uint32		found;
	MemoryContext old;
	int			i;

	if (!OidIsValid(relid))
		return;
	rel = table_open(relid, RowExclusiveLock);
	if (!gatekeeper_triggers_only(rel, TRIGGER_TYPE_INSERT, own, lengthof(own), &found))
	{
		table_close(rel, NoLock);
		return;
	}
	for (i = 0; i < (int) lengthof(run_names); i++)
	{
		w->run_att[i] = SPI_fnumber(RelationGetDescr(rel), run_names[i]);
		w->mail_att[i] = mail_names[i] != NULL ? SPI_fnumber(mail_desc, mail_names[i]) : 0;
		if (w->run_att[i] <= 0 || (mail_names[i] != NULL && w->mail_att[i] <= 0))
		{
			table_close(rel, NoLock);
			return;
		}
	}
	w->mail_dedupe = SPI_fnumber(mail_desc, "dedupe_key");
	if (w->mail_dedupe <= 0)
	{
		table_close(rel, NoLock);
		return;
	}
	old = MemoryContextSwitchTo(w->estate->es_query_cxt);
	w->run_rel = rel;
	mail_exec_open_in(&w->run, rel, w->estate);
	w->run_slot = table_slot_create(rel, NULL);
	w->mail_natts = mail_desc->natts;
	w->run_values = palloc0(mail_desc->natts * sizeof(Datum));
	w->run_isnull = palloc(mail_desc->natts * sizeof(bool));
	/* deleted before the executor state, in gatekeeper_live_writer_close */
	w->run_cxt = AllocSetContextCreate(CurrentMemoryContext, "gatekeeper run",
									   ALLOCSET_SMALL_SIZES);
	MemoryContextSwitchTo(old);
}

/*
 * The highest id that mail_live and mail_run hold, under the statement's
 * snapshot: the end of each one's primary key.
 */
static int64
run_top(LiveWriter *w)
{
	Relation	rels[2] = {w->rel, w->run_rel};
	int64		top = PG_INT64_MIN;
	int			r;

	for (r = 0; r < 2; r++)
	{
		Oid			pkey_oid = RelationGetPrimaryKeyIndex(rels[r]);
		Relation	pkey;
		IndexScanDesc scan;
		TupleTableSlot *slot;
		AttrNumber	att = r == 0 ? w->id_att : w->run_att[RUN_LAST_ID];

		/* without its primary key (changed by hand) no id is known free */
		if (!OidIsValid(pkey_oid))
			return PG_INT64_MAX;
		pkey = index_open(pkey_oid, AccessShareLock);
		scan = index_beginscan(rels[r], pkey, GetActiveSnapshot(), 0, 0);
		slot = table_slot_create(rels[r], NULL);

		index_rescan(scan, NULL, 0, NULL, 0);
		if (index_getnext_slot(scan, BackwardScanDirection, slot))
		{
			bool		isnull;
			Datum		d = slot_getattr(slot, att, &isnull);

			if (!isnull)
				top = Max(top, DatumGetInt64(d));
		}
		index_endscan(scan);
		ExecDropSingleTupleTableSlot(slot);
		index_close(pkey, NoLock);
	}
	return top;
}

/*
 * Write the run being gathered: a row of mail_run, or for a run of one
 * mail its live row.
 */
static void
run_end(LiveWriter *w)
{
	TupleTableSlot *slot = w->run_slot;
	Datum	   *v = w->run_values;
	DueKey		key;
	DueFloorNote floor;

	if (!w->run_open)
		return;
	w->run_open = false;
	if (w->run_last == w->run_first)
	{
		live_add(w, w->run_values, w->run_isnull, w->run_row);
		MemoryContextReset(w->run_cxt);
		return;
	}
	ExecClearTuple(slot);
	memset(slot->tts_isnull, true, slot->tts_tupleDescriptor->natts * sizeof(bool));
#define SET_RUN(k, d) (slot->tts_values[w->run_att[k] - 1] = (d), \
					   slot->tts_isnull[w->run_att[k] - 1] = false)
	SET_RUN(RUN_ID, Int64GetDatum(w->run_first));
	SET_RUN(RUN_LAST_ID, Int64GetDatum(w->run_last));
	SET_RUN(RUN_QUEUE, v[w->mail_att[RUN_QUEUE] - 1]);
	SET_RUN(RUN_PRIORITY, v[w->mail_att[RUN_PRIORITY] - 1]);
	SET_RUN(RUN_SEND_AT, v[w->mail_att[RUN_SEND_AT] - 1]);
	SET_RUN(RUN_SEGMENT, v[w->mail_att[RUN_SEGMENT] - 1]);
#undef SET_RUN
	ExecStoreVirtualTuple(slot);
	mail_exec_insert(&w->run, slot);
	/* its entry exists: the run floor (due_floor.c) must not pass it */
	key.priority = DatumGetInt32(slot->tts_values[w->run_att[RUN_PRIORITY] - 1]);
	key.send_at = DatumGetTimestampTz(slot->tts_values[w->run_att[RUN_SEND_AT] - 1]);
	key.id = w->run_first;
	gatekeeper_due_floor_note_start(&floor, DUE_FLOOR_RUN);
	gatekeeper_due_floor_note(&floor, slot->tts_values[w->run_att[RUN_QUEUE] - 1], &key);
	gatekeeper_due_floor_note_end(&floor);
	ExecClearTuple(slot);
	MemoryContextReset(w->run_cxt);
}

/*
 * Whether the mail extends the run being gathered.
 */
static bool
run_extends(LiveWriter *w, Datum *mv)
{
	Datum	   *rv = w->run_values;
	text	   *a;
	text	   *b;

	if (DatumGetInt64(mv[w->mail_att[RUN_ID] - 1]) != w->run_last + 1 ||
		w->run_last - w->run_first + 1 >= RUN_MAX)
		return false;
	if (DatumGetInt32(mv[w->mail_att[RUN_PRIORITY] - 1]) !=
		DatumGetInt32(rv[w->mail_att[RUN_PRIORITY] - 1]) ||
		DatumGetTimestampTz(mv[w->mail_att[RUN_SEND_AT] - 1]) !=
		DatumGetTimestampTz(rv[w->mail_att[RUN_SEND_AT] - 1]) ||
		DatumGetInt16(mv[w->mail_att[RUN_SEGMENT] - 1]) !=
		DatumGetInt16(rv[w->mail_att[RUN_SEGMENT] - 1]))
		return false;
	a = DatumGetTextPP(mv[w->mail_att[RUN_QUEUE] - 1]);
	b = DatumGetTextPP(rv[w->mail_att[RUN_QUEUE] - 1]);
	return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

/*
 * gatekeeper_live_writer_add
 *		Note one new mail, row "row" of the statement, given as its
 *		deformed columns (by attribute number less one, of the TupleDesc
 *		the writer was opened with): in the run being gathered, or as a
 *		live row.
 */
void
gatekeeper_live_writer_add(LiveWriter *w, Datum *mail_values, bool *mail_isnull, int64 row)
{
	int64		id;
	int			k;

	/* a statement of unknown size: runs from its RUN_MIN_ROWS-th row on */
	if (w->run_rel == NULL && w->until_runs >= 0 && w->until_runs-- == 0)
		run_open_rel(w);
	if (w->run_rel == NULL)
	{
		live_add(w, mail_values, mail_isnull, row);
		return;
	}
	for (k = 0; k < (int) lengthof(run_names); k++)
		if (w->mail_att[k] > 0 && mail_isnull[w->mail_att[k] - 1])
			break;
	if (k < (int) lengthof(run_names) || !mail_isnull[w->mail_dedupe - 1])
	{
		/* never in a run */
		run_end(w);
		live_add(w, mail_values, mail_isnull, row);
		return;
	}
	id = DatumGetInt64(mail_values[w->mail_att[RUN_ID] - 1]);
	if (w->run_open && run_extends(w, mail_values))
	{
		if (!w->have_top)
		{
			w->top = run_top(w);
			w->have_top = true;
		}
		if (w->run_first > w->top)
		{
			w->run_last = id;
			return;
		}
	}
	run_end(w);
	if (w->have_top && id <= w->top)
	{
		live_add(w, mail_values, mail_isnull, row);
		return;
	}
	/* a new run: the columns it needs, copied out of the caller's row */
	w->run_open = true;
	w->run_first = w->run_last = id;
	w->run_row = row;
	memset(w->run_isnull, true, w->mail_natts * sizeof(bool));
	for (k = 0; k < (int) lengthof(run_names); k++)
	{
		AttrNumber	a = w->mail_att[k];

		if (a <= 0)
			continue;
		w->run_isnull[a - 1] = false;
		if (k == RUN_QUEUE)
		{
			MemoryContext old = MemoryContextSwitchTo(w->run_cxt);

			w->run_values[a - 1] = datumCopy(mail_values[a - 1], false, -1);
			MemoryContextSwitchTo(old);
		}
		else
			w->run_values[a - 1] = mail_values[a - 1];
	}
}

/*
 * Buffer the live row of one new mail, row "row" of the statement.
 */
static void
live_add(LiveWriter *w, Datum *mail_values, bool *mail_isnull, int64 row)
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
		mail_exec_check(&w->live, slot);
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

	run_end(w);
	live_flush(w);
	if (w->run_rel != NULL)
	{
		ExecDropSingleTupleTableSlot(w->run_slot);
		mail_exec_close(&w->run);
		table_close(w->run_rel, NoLock);
		MemoryContextDelete(w->run_cxt);
	}
	for (i = 0; i < w->nmade; i++)
		ExecDropSingleTupleTableSlot(w->slots[i]);
	FreeBulkInsertState(w->bistate);
	mail_exec_close(&w->live);
	FreeExecutorState(w->estate);
	table_close(w->rel, NoLock);	/* held to the end of the transaction */
	MemoryContextDelete(w->batch_cxt);
	/* as SPI does after a statement: later commands see the rows */
	CommandCounterIncrement();
}

