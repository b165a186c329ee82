/*-------------------------------------------------------------------------
 *
 * count_triggers.c
 *		The statement triggers that count what SQL statements write to the
 *		mail tables: each reads its statement's transition tables and
 *		tallies them through mail_count.c, as the writers of src/mail/ do
 *		for the rows they write themselves.
 *
 * _count_done (mail_done) counts outcomes by queue and state,
 * _count_events (event_log) deferrals, bounces and complaints by queue,
 * _count_live (mail_live and mail_run) the change to the live gauges, and
 * lowers the due floors (due_floor.c) to the statement's new rows.  What
 * is counted, and when it is published, is mail_count.c's.
 *
 * IDENTIFICATION
 *		src/mail/count_triggers.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "mail_count.h"
#include "live_count.h"
#include "catalog.h"
#include "due_floor.h"

#include "commands/trigger.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/rel.h"
#include "utils/tuplestore.h"

#include "gatekeeper.h"

PG_FUNCTION_INFO_V1(gatekeeper_count_done);
PG_FUNCTION_INFO_V1(gatekeeper_count_events);
PG_FUNCTION_INFO_V1(gatekeeper_count_live);

/*
 * The due floor (due_floor.c) lowered to a statement's new rows, in the
 * same walk that counts them: the columns their keys are read from.
 */
typedef struct NewRowsFloor
{
	DueFloorNote note;
	int			priority_att;
	int			send_at_att;
	int			id_att;
} NewRowsFloor;

/*
 * What _count_live reads of its table's rows: mail_live's one mail a row,
 * counted while scheduled, or mail_run's runs of mails, from id to
 * last_id, all scheduled and none retrying.
 */
typedef struct LiveShape
{
	TupleDesc	desc;
	bool		runs;			/* mail_run */
	int			queue_att;
	int			state_att;		/* mail_live */
	int			attempt_att;
	Oid			scheduled;
	int			id_att;			/* mail_run */
	int			last_att;
} LiveShape;

/* The events counted, by CountKind from COUNT_DEFERRED on */
static const char *const counted_events[] = {"deferred", "bounced", "complained"};

static TriggerData *counted_insert(FunctionCallInfo fcinfo, const char *name);
static void floor_start(NewRowsFloor *floor, TupleDesc desc, DueFloorKind kind);
static void floor_row(NewRowsFloor *floor, TupleTableSlot *slot, Datum queue);
static void live_shape(LiveShape *shape, TupleDesc desc);
static void count_live(MailCount *count, Tuplestorestate *rows, const LiveShape *shape,
					   int sign, NewRowsFloor *floor);

/*
 * The trigger data of an insert statement trigger (name) that counts its
 * new rows, or NULL when nothing is counted: the totals are not kept (the
 * library was not preloaded), or a restore writes, which is not new work
 * (see gatekeeper_writer).
 */
static TriggerData *
counted_insert(FunctionCallInfo fcinfo, const char *name)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	gatekeeper_require_schema();
	if (!CALLED_AS_TRIGGER(fcinfo) ||
		!TRIGGER_FIRED_BY_INSERT(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_STATEMENT(trigdata->tg_event) ||
		trigdata->tg_newtable == NULL)
		elog(ERROR, "%s must be an insert statement trigger with a new table", name);
	if (!count_totals_kept() || gatekeeper_writer() == GATEKEEPER_WRITER_DUMP)
		return NULL;
	return trigdata;
}

/*
 * gatekeeper_count_done
 *		gatekeeper._count_done(), the AFTER INSERT FOR EACH STATEMENT
 *		trigger of gatekeeper.mail_done: count the statement's outcomes by
 *		queue and state.
 */
Datum
gatekeeper_count_done(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = counted_insert(fcinfo, "gatekeeper_count_done");
	TupleDesc	desc;
	TupleTableSlot *slot;
	MailCount  *count;
	int			queue_att;
	int			state_att;
	Oid			state_type;

	if (trigdata == NULL)
		return PointerGetDatum(NULL);

	desc = RelationGetDescr(trigdata->tg_relation);
	queue_att = SPI_fnumber(desc, "queue");
	state_att = SPI_fnumber(desc, "state");
	if (queue_att <= 0 || state_att <= 0)
		elog(ERROR, "gatekeeper_count_done fired on a table without queue and state");
	state_type = TupleDescAttr(desc, state_att - 1)->atttypid;
	slot = MakeSingleTupleTableSlot(desc, &TTSOpsMinimalTuple);
	count = mail_count_start(InvalidOid);
	tuplestore_rescan(trigdata->tg_newtable);
	while (tuplestore_gettupleslot(trigdata->tg_newtable, true, false, slot))
	{
		bool		n1,
					n2;
		Datum		queue = slot_getattr(slot, queue_att, &n1);
		Datum		state = slot_getattr(slot, state_att, &n2);

		if (!n1 && !n2)
			mail_count_move(count, queue,
							mail_count_outcome(state_type, DatumGetObjectId(state)), 0, 0);
		ExecClearTuple(slot);
	}
	mail_count_end(count);
	ExecDropSingleTupleTableSlot(slot);
	return PointerGetDatum(NULL);
}

/*
 * gatekeeper_count_events
 *		gatekeeper._count_events(), the AFTER INSERT FOR EACH STATEMENT
 *		trigger of gatekeeper.event_log: count the statement's deferrals,
 *		bounces and complaints by queue, but not repeats (a report's
 *		complaint or bounce of a mail that had one: src/report.c).
 */
Datum
gatekeeper_count_events(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = counted_insert(fcinfo, "gatekeeper_count_events");
	TupleDesc	desc;
	TupleTableSlot *slot;
	MailCount  *count;
	int			queue_att;
	int			event_att;
	int			repeated_att;

	if (trigdata == NULL)
		return PointerGetDatum(NULL);

	desc = RelationGetDescr(trigdata->tg_relation);
	queue_att = SPI_fnumber(desc, "queue");
	event_att = SPI_fnumber(desc, "event");
	repeated_att = SPI_fnumber(desc, "repeated");
	if (queue_att <= 0 || event_att <= 0)
		elog(ERROR, "gatekeeper_count_events fired on a table without queue and event");
	slot = MakeSingleTupleTableSlot(desc, &TTSOpsMinimalTuple);
	count = mail_count_start(InvalidOid);
	tuplestore_rescan(trigdata->tg_newtable);
	while (tuplestore_gettupleslot(trigdata->tg_newtable, true, false, slot))
	{
		bool		isnull;
		Datum		queue = slot_getattr(slot, queue_att, &isnull);
		Datum		event;
		text	   *t;
		int			kind;

		if (isnull)
			continue;
		event = slot_getattr(slot, event_att, &isnull);
		if (isnull)
			continue;
		if (repeated_att > 0)
		{
			Datum		repeated = slot_getattr(slot, repeated_att, &isnull);

			if (!isnull && DatumGetBool(repeated))
				continue;
		}
		t = DatumGetTextPP(event);
		for (kind = COUNT_DEFERRED; kind <= COUNT_COMPLAINED; kind++)
		{
			const char *name = counted_events[kind - COUNT_DEFERRED];

			if (VARSIZE_ANY_EXHDR(t) == strlen(name) &&
				memcmp(VARDATA_ANY(t), name, strlen(name)) == 0)
			{
				mail_count_move(count, queue, kind, 0, 0);
				break;
			}
		}
		ExecClearTuple(slot);
	}
	mail_count_end(count);
	ExecDropSingleTupleTableSlot(slot);
	return PointerGetDatum(NULL);
}

/*
 * Start lowering the due floors of kind to a statement's new rows, whose
 * index entries exist by now.
 */
static void
floor_start(NewRowsFloor *floor, TupleDesc desc, DueFloorKind kind)
{
	floor->priority_att = SPI_fnumber(desc, "priority");
	floor->send_at_att = SPI_fnumber(desc, "send_at");
	floor->id_att = SPI_fnumber(desc, "id");
	if (floor->priority_att <= 0 || floor->send_at_att <= 0 || floor->id_att <= 0)
		elog(ERROR, "gatekeeper_count_live fired on a table without priority, send_at and id");
	gatekeeper_due_floor_note_start(&floor->note, kind);
}

/*
 * Note the row in slot, of queue, for its queue's floor, when its key is
 * whole.
 */
static void
floor_row(NewRowsFloor *floor, TupleTableSlot *slot, Datum queue)
{
	bool		n1,
				n2,
				n3;
	DueKey		key;

	key.priority = DatumGetInt32(slot_getattr(slot, floor->priority_att, &n1));
	key.send_at = DatumGetTimestampTz(slot_getattr(slot, floor->send_at_att, &n2));
	key.id = DatumGetInt64(slot_getattr(slot, floor->id_att, &n3));
	if (!n1 && !n2 && !n3)
		gatekeeper_due_floor_note(&floor->note, queue, &key);
}

/*
 * The columns of desc, mail_live's or mail_run's, that _count_live reads.
 */
static void
live_shape(LiveShape *shape, TupleDesc desc)
{
	shape->desc = desc;
	shape->queue_att = SPI_fnumber(desc, "queue");
	shape->last_att = SPI_fnumber(desc, "last_id");
	shape->runs = shape->last_att > 0;
	if (shape->runs)
	{
		shape->id_att = SPI_fnumber(desc, "id");
		if (shape->queue_att <= 0 || shape->id_att <= 0)
			elog(ERROR, "gatekeeper_count_live fired on a table without queue, id and last_id");
		return;
	}
	shape->state_att = SPI_fnumber(desc, "state");
	shape->attempt_att = SPI_fnumber(desc, "attempt");
	if (shape->queue_att <= 0 || shape->state_att <= 0 || shape->attempt_att <= 0)
		elog(ERROR, "gatekeeper_count_live fired on a table without queue, state and attempt");
	shape->scheduled =
		DatumGetObjectId(DirectFunctionCall2(enum_in, CStringGetDatum("scheduled"),
											 ObjectIdGetDatum(TupleDescAttr(desc, shape->state_att - 1)->atttypid)));
}

/*
 * Count the scheduled mails of each row, times sign, in its queue's
 * gauges: a mail_live row while scheduled (retrying after an attempt), a
 * run its mails (last_id - id + 1).  With floor (new rows), note each
 * such row for its queue's floor too.
 */
static void
count_live(MailCount *count, Tuplestorestate *rows, const LiveShape *shape, int sign,
		   NewRowsFloor *floor)
{
	TupleTableSlot *slot = MakeSingleTupleTableSlot(shape->desc, &TTSOpsMinimalTuple);

	tuplestore_rescan(rows);
	while (tuplestore_gettupleslot(rows, true, false, slot))
	{
		bool		n1,
					n2,
					n3;
		Datum		queue = slot_getattr(slot, shape->queue_att, &n1);
		int64		mails = 0;
		int			retrying = 0;

		if (n1)
			continue;
		if (shape->runs)
		{
			int64		id = DatumGetInt64(slot_getattr(slot, shape->id_att, &n2));
			int64		last = DatumGetInt64(slot_getattr(slot, shape->last_att, &n3));

			if (!n2 && !n3 && last >= id)
				mails = last - id + 1;
		}
		else
		{
			Oid			state = DatumGetObjectId(slot_getattr(slot, shape->state_att, &n2));
			Datum		attempt;

			if (n2 || state != shape->scheduled)
				continue;
			mails = 1;
			attempt = slot_getattr(slot, shape->attempt_att, &n3);
			retrying = !n3 && DatumGetInt32(attempt) > 0;
		}
		if (mails > 0)
			mail_count_move(count, queue, COUNT_NONE, sign * mails, sign * retrying);
		if (floor != NULL)
			floor_row(floor, slot, queue);
	}
	ExecDropSingleTupleTableSlot(slot);
}

/*
 * gatekeeper_count_live
 *		gatekeeper._count_live(), the AFTER INSERT, UPDATE, DELETE and
 *		TRUNCATE statement triggers of gatekeeper.mail_live and
 *		gatekeeper.mail_run: count the statement's change to the live
 *		gauges, and lower the due floors to its new rows in the same walk.
 */
Datum
gatekeeper_count_live(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	LiveShape	shape;
	MailCount  *count;
	NewRowsFloor floor;

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
		mail_count_set_aside(NULL);
		live_count_recount();
		SPI_finish();
		return PointerGetDatum(NULL);
	}
	if (trigdata->tg_oldtable == NULL && trigdata->tg_newtable == NULL)
		elog(ERROR, "gatekeeper_count_live needs the statement's transition tables");

	live_shape(&shape, RelationGetDescr(trigdata->tg_relation));
	/* runs are counted against mail_live, whose gauges they are */
	count = mail_count_start(shape.runs ? gatekeeper_relid(GATEKEEPER_REL_MAIL_LIVE, false) :
							 RelationGetRelid(trigdata->tg_relation));
	if (trigdata->tg_oldtable != NULL)
		count_live(count, trigdata->tg_oldtable, &shape, -1, NULL);
	if (trigdata->tg_newtable != NULL)
	{
		floor_start(&floor, shape.desc, shape.runs ? DUE_FLOOR_RUN : DUE_FLOOR_LIVE);
		count_live(count, trigdata->tg_newtable, &shape, 1, &floor);
		gatekeeper_due_floor_note_end(&floor.note);
	}
	mail_count_end(count);
	return PointerGetDatum(NULL);
}
