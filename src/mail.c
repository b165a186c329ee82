/*-------------------------------------------------------------------------
 *
 * mail.c
 *		The trigger that validates every mail entering gatekeeper.mail.
 *
 * Mail arrives by gatekeeper.enqueue, by INSERT and by COPY; all three
 * pass through this one trigger, so the same validation holds for all of
 * them, and a bad row aborts the statement: nothing is written.  The trigger also notes that due mail was written,
 * so the delivery workers are woken when the transaction commits.
 *
 *-------------------------------------------------------------------------
 */
#include "gatekeeper.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "utils/tuplestore.h"
#include "access/detoast.h"
#include "fmgr.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/timestamp.h"

#include "address.h"
#include "window.h"

PG_FUNCTION_INFO_V1(gatekeeper_mail_check);

/* The columns the trigger reads, by attribute number. */
typedef struct MailColumns
{
	Oid			relid;
	int			natts;
	int			queue;
	int			recipient;
	int			sender;
	int			subject;
	int			body;
	int			html;
	int			headers;
	int			send_at;
	int			send_by;
	int			state;
	int			recipient_name; /* 0.2.0's, 0 before the update */
	int			timezone;		/* 0.2.0's, 0 before the update */
	Oid			state_type;
	Oid			scheduled;		/* enum value 'scheduled' */
} MailColumns;

static MailColumns columns;

/*
 * Queues known to exist in the current command.  A COPY of a million rows
 * names a handful of queues; looking each up once per command is enough,
 * because drop_queue locks gatekeeper.mail against writers before it
 * checks that nothing references the queue.
 */
#define QUEUE_CACHE_SIZE 8

typedef struct QueueCache
{
	LocalTransactionId lxid;
	CommandId	cid;
	int			n;
	int			next;
	char	   *names[QUEUE_CACHE_SIZE];
} QueueCache;

static QueueCache queue_cache;
static SPIPlanPtr queue_plan = NULL;

/*
 * Look up the attribute numbers of the columns we check.
 */
static void
load_columns(Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);

	if (columns.relid == RelationGetRelid(rel) && columns.natts == desc->natts)
		return;

	columns.queue = SPI_fnumber(desc, "queue");
	columns.recipient = SPI_fnumber(desc, "recipient");
	columns.sender = SPI_fnumber(desc, "sender");
	columns.subject = SPI_fnumber(desc, "subject");
	columns.body = SPI_fnumber(desc, "body");
	columns.html = SPI_fnumber(desc, "html");
	columns.headers = SPI_fnumber(desc, "headers");
	columns.send_at = SPI_fnumber(desc, "send_at");
	columns.send_by = SPI_fnumber(desc, "send_by");
	columns.state = SPI_fnumber(desc, "state");
	columns.recipient_name = Max(SPI_fnumber(desc, "recipient_name"), 0);
	columns.timezone = Max(SPI_fnumber(desc, "timezone"), 0);
	if (columns.queue <= 0 || columns.recipient <= 0 || columns.sender <= 0 ||
		columns.subject <= 0 || columns.body <= 0 || columns.html <= 0 ||
		columns.headers <= 0 || columns.send_at <= 0 || columns.send_by <= 0 ||
		columns.state <= 0)
		elog(ERROR, "gatekeeper_mail_check fired on a table that is not gatekeeper.mail");

	columns.state_type = TupleDescAttr(desc, columns.state - 1)->atttypid;
	columns.scheduled = DatumGetObjectId(DirectFunctionCall2(enum_in,
															 CStringGetDatum("scheduled"),
															 ObjectIdGetDatum(columns.state_type)));
	columns.relid = RelationGetRelid(rel);
	columns.natts = desc->natts;
}

/*
 * Raise an error unless the queue exists.
 */
static void
check_queue_exists(const char *queue)
{
	int			i;
	Datum		arg;
	bool		found;

	if (queue_cache.lxid != MyProc->lxid ||
		queue_cache.cid != GetCurrentCommandId(false))
	{
		for (i = 0; i < queue_cache.n; i++)
			pfree(queue_cache.names[i]);
		queue_cache.n = 0;
		queue_cache.next = 0;
		queue_cache.lxid = MyProc->lxid;
		queue_cache.cid = GetCurrentCommandId(false);
	}
	for (i = 0; i < queue_cache.n; i++)
		if (strcmp(queue_cache.names[i], queue) == 0)
			return;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (queue_plan == NULL)
	{
		Oid			argtype = TEXTOID;

		queue_plan = SPI_prepare("SELECT 1 FROM gatekeeper.queue WHERE name = $1",
								 1, &argtype);
		if (queue_plan == NULL)
			elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
		SPI_keepplan(queue_plan);
	}
	arg = CStringGetTextDatum(queue);
	if (SPI_execute_plan(queue_plan, &arg, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "queue lookup failed");
	found = SPI_processed > 0;
	SPI_finish();

	if (!found)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("queue \"%s\" does not exist", queue),
				 errhint("Create it with gatekeeper.create_queue().")));

	if (queue_cache.n < QUEUE_CACHE_SIZE)
		i = queue_cache.n++;
	else
	{
		i = queue_cache.next++ % QUEUE_CACHE_SIZE;
		pfree(queue_cache.names[i]);
	}
	queue_cache.names[i] = MemoryContextStrdup(TopMemoryContext, queue);
}

/*
 * The text of a column, or NULL.
 */
static char *
column_text(HeapTuple tuple, TupleDesc desc, int attnum)
{
	bool		isnull;
	Datum		d = heap_getattr(tuple, attnum, desc, &isnull);

	return isnull ? NULL : TextDatumGetCString(d);
}

/*
 * The raw byte size of a column, 0 when NULL, without detoasting it.
 */
static Size
column_size(HeapTuple tuple, TupleDesc desc, int attnum)
{
	bool		isnull;
	Datum		d = heap_getattr(tuple, attnum, desc, &isnull);

	return isnull ? 0 : toast_raw_datum_size(d) - VARHDRSZ;
}

/*
 * Reject a mail, with the SQLSTATEs the README documents, when any field is
 * malformed.  inserting: the mail is new, not an update of one.
 */
static void
check_mail(HeapTuple tuple, TupleDesc desc, bool inserting)
{
	char	   *recipient;
	char	   *sender;
	char	   *subject;
	char	   *queue;
	bool		isnull;
	bool		send_by_null;
	Datum		send_at;
	Datum		send_by;
	Datum		d;
	Size		size;
	bool		scheduled;
	bool		to_go;

	d = heap_getattr(tuple, columns.state, desc, &isnull);
	scheduled = !isnull && DatumGetObjectId(d) == columns.scheduled;

	/*
	 * The content of mail that is still to go (new mail, or mail being
	 * changed) must be sendable.  Finished mail inserted as such is a
	 * restore (pg_dump) of history, perhaps written by a version with
	 * other rules: it loads as it is, so that a restore never fails on it.
	 */
	to_go = scheduled || !inserting;

	recipient = column_text(tuple, desc, columns.recipient);
	if (recipient == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("recipient must not be null")));
	if (to_go)
		gatekeeper_check_address(recipient, "recipient");

	sender = column_text(tuple, desc, columns.sender);
	if (sender != NULL && to_go)
	{
		char	   *name;
		char	   *address;

		gatekeeper_parse_mailbox(sender, "sender", &name, &address);
	}
	if (columns.recipient_name > 0 && to_go)
	{
		char	   *name = column_text(tuple, desc, columns.recipient_name);

		if (name != NULL)
			gatekeeper_check_display_name(name, "recipient_name");
	}
	if (columns.timezone > 0 && to_go)
	{
		char	   *zone = column_text(tuple, desc, columns.timezone);

		if (zone != NULL)
			(void) gatekeeper_check_timezone(zone, "timezone");
	}

	subject = column_text(tuple, desc, columns.subject);
	if (subject == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("subject must not be null")));
	if (to_go)
		gatekeeper_check_header_value(subject, "subject");

	(void) heap_getattr(tuple, columns.body, desc, &isnull);
	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("body must not be null")));

	d = heap_getattr(tuple, columns.headers, desc, &isnull);
	if (!isnull && to_go)
		gatekeeper_check_headers(DatumGetJsonbP(d));

	size = column_size(tuple, desc, columns.subject) +
		column_size(tuple, desc, columns.body) +
		column_size(tuple, desc, columns.html) +
		column_size(tuple, desc, columns.headers);
	if (size > (Size) gatekeeper_max_message_size)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("mail is larger than gatekeeper.max_message_size"),
				 errdetail("Subject, body, html and headers hold %zu bytes; the limit is %d bytes.",
						   size, gatekeeper_max_message_size)));

	send_at = heap_getattr(tuple, columns.send_at, desc, &isnull);
	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("send_at must not be null")));
	send_by = heap_getattr(tuple, columns.send_by, desc, &send_by_null);

	/*
	 * Checks that only make sense for mail that is still to go: a restore
	 * of finished mail (pg_dump) may name a queue dropped since.
	 */
	if (scheduled && inserting)
	{
		if (TIMESTAMP_NOT_FINITE(DatumGetTimestampTz(send_at)) ||
			(!send_by_null && TIMESTAMP_NOT_FINITE(DatumGetTimestampTz(send_by))))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("send_at and send_by must be finite"),
					 errdetail("An infinite time can be neither waited for nor computed with.")));

		if (!send_by_null &&
			DatumGetTimestampTz(send_by) < DatumGetTimestampTz(send_at))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("send_by must not be before send_at")));
	}

	queue = column_text(tuple, desc, columns.queue);
	if (queue == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("queue must not be null")));
	if (scheduled)
		check_queue_exists(queue);

	/* wake the workers at commit when this mail is due within a nap */
	if (scheduled &&
		DatumGetTimestampTz(send_at) <=
		GetCurrentStatementStartTimestamp() + (int64) gatekeeper_naptime * 1000)
		gatekeeper_wake_at_commit();
}

/*
 * gatekeeper_mail_check
 *		The trigger function of gatekeeper.mail.
 *
 * AFTER INSERT FOR EACH STATEMENT, over the statement's new rows: one
 * call per INSERT or COPY, however many rows, so COPY keeps its
 * multi-row inserts and the function's pinned settings are applied once;
 * an error aborts the statement, so nothing is written.  BEFORE UPDATE
 * FOR EACH ROW of the content columns, for the rare update of a mail.
 */
Datum
gatekeeper_mail_check(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Relation	rel;
	TupleDesc	desc;

	if (!CALLED_AS_TRIGGER(fcinfo))
		elog(ERROR, "gatekeeper_mail_check must be called as a trigger");
	rel = trigdata->tg_relation;
	desc = RelationGetDescr(rel);
	load_columns(rel);

	if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) &&
		TRIGGER_FIRED_BEFORE(trigdata->tg_event) &&
		TRIGGER_FIRED_FOR_ROW(trigdata->tg_event))
	{
		check_mail(trigdata->tg_newtuple, desc, false);
		return PointerGetDatum(trigdata->tg_newtuple);
	}

	if (TRIGGER_FIRED_BY_INSERT(trigdata->tg_event) &&
		TRIGGER_FIRED_AFTER(trigdata->tg_event) &&
		TRIGGER_FIRED_FOR_STATEMENT(trigdata->tg_event) &&
		trigdata->tg_newtable != NULL)
	{
		TupleTableSlot *slot = MakeSingleTupleTableSlot(desc, &TTSOpsMinimalTuple);
		MemoryContext per_row = AllocSetContextCreate(CurrentMemoryContext,
													  "gatekeeper mail check",
													  ALLOCSET_DEFAULT_SIZES);
		MemoryContext old = MemoryContextSwitchTo(per_row);

		tuplestore_rescan(trigdata->tg_newtable);
		while (tuplestore_gettupleslot(trigdata->tg_newtable, true, false, slot))
		{
			bool		should_free;
			HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);

			check_mail(tuple, desc, true);
			if (should_free)
				heap_freetuple(tuple);
			/* a tuple read back from disk lives in per_row: let go of it first */
			ExecClearTuple(slot);
			MemoryContextReset(per_row);
		}
		MemoryContextSwitchTo(old);
		MemoryContextDelete(per_row);
		ExecDropSingleTupleTableSlot(slot);
		return PointerGetDatum(NULL);
	}

	elog(ERROR, "gatekeeper_mail_check fired for an event it does not handle");
	return PointerGetDatum(NULL);	/* keep compiler quiet */
}
