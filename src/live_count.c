/*-------------------------------------------------------------------------
 *
 * live_count.c
 *		How many of each queue's mails are scheduled and how many claimed,
 *		kept in gatekeeper.mail_live_count as mail_live changes, so that
 *		gatekeeper.queue_stats never counts mail_live.
 *
 * Every statement that writes gatekeeper.mail_live fires its statement
 * triggers (gatekeeper._count_live), which net the statement's rows by
 * queue: an old row's state is taken from the counts, a new row's added.
 * The insert trigger of gatekeeper.mail, which writes new mail's live
 * rows without the executor (src/mail.c), notes its own counts through a
 * tally.  Either way the counts are written at the end of the statement,
 * one upsert into this backend's rows of mail_live_count (the slot is the
 * backend's id): two sessions never write the same row, so claimers never
 * wait for each other there, and queue_stats sums a queue's rows.
 *
 * The counts are rows written in the transaction that changed mail_live:
 * a rollback takes them back with the change, a crash loses neither, and
 * a query sees the two agree under its snapshot.  A TRUNCATE of mail_live
 * empties them.  What they cannot see is a write to mail_live with its
 * triggers disabled.
 *
 * IDENTIFICATION
 *		src/live_count.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "live_count.h"

#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "storage/backendid.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/tuplestore.h"

#include "gatekeeper.h"

PG_FUNCTION_INFO_V1(gatekeeper_count_live);

/* Distinct queues a tally holds before it writes them out */
#define LIVE_GROUPS		16

/* One queue's change in one statement */
typedef struct LiveGroup
{
	char	   *queue;			/* not NUL-terminated */
	int			len;
	int64		scheduled;
	int64		claimed;
} LiveGroup;

struct LiveTally
{
	MemoryContext context;		/* the queue names */
	int			ngroups;
	LiveGroup	groups[LIVE_GROUPS];
};

static const char add_live_counts_sql[] =
"INSERT INTO gatekeeper.mail_live_count AS c (queue, slot, scheduled, claimed) "
"SELECT u.queue, $1, u.scheduled, u.claimed "
"  FROM unnest($2::text[], $3::bigint[], $4::bigint[]) AS u(queue, scheduled, claimed) "
"    ON CONFLICT (queue, slot) DO UPDATE "
"   SET scheduled = c.scheduled + excluded.scheduled, "
"       claimed = c.claimed + excluded.claimed";

static const char forget_live_counts_sql[] =
"DELETE FROM gatekeeper.mail_live_count";

static SPIPlanPtr add_live_counts_plan = NULL;
static SPIPlanPtr forget_live_counts_plan = NULL;

static void tally_write(LiveTally *tally);
static void count_rows(LiveTally *tally, Tuplestorestate *rows, TupleDesc desc,
					   int queue_att, int state_att, Oid scheduled, Oid claimed,
					   int sign);

/*
 * A tally of one statement's changes, to be ended by
 * gatekeeper_live_tally_end in the same memory context.
 */
LiveTally *
gatekeeper_live_tally_start(void)
{
	LiveTally  *tally = palloc(sizeof(LiveTally));

	tally->context = AllocSetContextCreate(CurrentMemoryContext,
										   "gatekeeper live counts",
										   ALLOCSET_SMALL_SIZES);
	tally->ngroups = 0;
	return tally;
}

/*
 * Add to queue's scheduled and claimed mail (either may be negative).
 */
void
gatekeeper_live_tally_add(LiveTally *tally, Datum queue, int64 scheduled,
						  int64 claimed)
{
	text	   *name = DatumGetTextPP(queue);
	const char *data = VARDATA_ANY(name);
	int			len = VARSIZE_ANY_EXHDR(name);
	LiveGroup  *g;
	int			i;

	for (i = tally->ngroups - 1; i >= 0; i--)
	{
		g = &tally->groups[i];
		if (g->len == len && memcmp(g->queue, data, len) == 0)
		{
			g->scheduled += scheduled;
			g->claimed += claimed;
			return;
		}
	}
	if (tally->ngroups == LIVE_GROUPS)
		tally_write(tally);
	g = &tally->groups[tally->ngroups++];
	g->queue = MemoryContextAlloc(tally->context, Max(len, 1));
	memcpy(g->queue, data, len);
	g->len = len;
	g->scheduled = scheduled;
	g->claimed = claimed;
}

/*
 * Write what the tally holds, and let it go.
 */
void
gatekeeper_live_tally_end(LiveTally *tally)
{
	tally_write(tally);
	MemoryContextDelete(tally->context);
	pfree(tally);
}

/*
 * Add the tally's groups to this backend's rows of mail_live_count, in one
 * statement, and empty it.  Groups that net to nothing (a rotation, a
 * lease extended) write nothing.
 */
static void
tally_write(LiveTally *tally)
{
	Datum	   *names;
	Datum	   *scheduled;
	Datum	   *claimed;
	Datum		args[4];
	Oid			types[4] = {INT4OID, TEXTARRAYOID, INT8ARRAYOID, INT8ARRAYOID};
	int			n = 0;
	int			i;

	if (tally->ngroups == 0)
		return;
	names = palloc(sizeof(Datum) * tally->ngroups);
	scheduled = palloc(sizeof(Datum) * tally->ngroups);
	claimed = palloc(sizeof(Datum) * tally->ngroups);
	for (i = 0; i < tally->ngroups; i++)
	{
		LiveGroup  *g = &tally->groups[i];

		if (g->scheduled == 0 && g->claimed == 0)
			continue;
		names[n] = PointerGetDatum(cstring_to_text_with_len(g->queue, g->len));
		scheduled[n] = Int64GetDatum(g->scheduled);
		claimed[n] = Int64GetDatum(g->claimed);
		n++;
	}
	tally->ngroups = 0;
	MemoryContextReset(tally->context);
	if (n == 0)
		return;

	args[0] = Int32GetDatum(MyBackendId);
	args[1] = gatekeeper_array(names, NULL, n, TEXTOID);
	args[2] = gatekeeper_array(scheduled, NULL, n, INT8OID);
	args[3] = gatekeeper_array(claimed, NULL, n, INT8OID);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	gatekeeper_plan(&add_live_counts_plan, add_live_counts_sql, 4, types);
	if (SPI_execute_plan(add_live_counts_plan, args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not count gatekeeper's live mail");
	SPI_finish();
}

/*
 * Add each row's state, times sign, to the tally.
 */
static void
count_rows(LiveTally *tally, Tuplestorestate *rows, TupleDesc desc,
		   int queue_att, int state_att, Oid scheduled, Oid claimed, int sign)
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
			gatekeeper_live_tally_add(tally, queue, sign, 0);
		else if (state == claimed)
			gatekeeper_live_tally_add(tally, queue, 0, sign);
		ExecClearTuple(slot);
	}
	ExecDropSingleTupleTableSlot(slot);
}

/*
 * gatekeeper_count_live
 *		gatekeeper._count_live(), the AFTER INSERT, UPDATE, DELETE and
 *		TRUNCATE statement triggers of gatekeeper.mail_live: bring the live
 *		counts up to date with the statement.
 */
Datum
gatekeeper_count_live(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	TupleDesc	desc;
	int			queue_att;
	int			state_att;
	Oid			state_type;
	Oid			scheduled;
	Oid			claimed;
	LiveTally  *tally;

	if (!CALLED_AS_TRIGGER(fcinfo) ||
		!TRIGGER_FIRED_AFTER(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_STATEMENT(trigdata->tg_event))
		elog(ERROR, "gatekeeper_count_live must be an AFTER statement trigger");

	if (TRIGGER_FIRED_BY_TRUNCATE(trigdata->tg_event))
	{
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		gatekeeper_plan(&forget_live_counts_plan, forget_live_counts_sql, 0, NULL);
		if (SPI_execute_plan(forget_live_counts_plan, NULL, NULL, false, 0) != SPI_OK_DELETE)
			elog(ERROR, "could not empty gatekeeper's live counts");
		SPI_finish();
		return PointerGetDatum(NULL);
	}
	if (trigdata->tg_oldtable == NULL && trigdata->tg_newtable == NULL)
		elog(ERROR, "gatekeeper_count_live needs the statement's transition tables");

	desc = RelationGetDescr(trigdata->tg_relation);
	queue_att = SPI_fnumber(desc, "queue");
	state_att = SPI_fnumber(desc, "state");
	if (queue_att <= 0 || state_att <= 0)
		elog(ERROR, "gatekeeper_count_live fired on a table without queue and state");
	state_type = TupleDescAttr(desc, state_att - 1)->atttypid;
	scheduled = DatumGetObjectId(DirectFunctionCall2(enum_in,
													 CStringGetDatum("scheduled"),
													 ObjectIdGetDatum(state_type)));
	claimed = DatumGetObjectId(DirectFunctionCall2(enum_in,
												   CStringGetDatum("claimed"),
												   ObjectIdGetDatum(state_type)));

	tally = gatekeeper_live_tally_start();
	if (trigdata->tg_oldtable != NULL)
		count_rows(tally, trigdata->tg_oldtable, desc, queue_att, state_att,
				   scheduled, claimed, -1);
	if (trigdata->tg_newtable != NULL)
		count_rows(tally, trigdata->tg_newtable, desc, queue_att, state_att,
				   scheduled, claimed, 1);
	gatekeeper_live_tally_end(tally);
	return PointerGetDatum(NULL);
}
