/*-------------------------------------------------------------------------
 *
 * mail_state_sweep.c
 *		The changes of a mail's state that are not a claimer's own (issue
 *		26, item 1): cancel (by id, by dedupe key, a whole queue), reap
 *		(claims whose lease ran out, or whose server is gone), the sync of
 *		an application's UPDATE or DELETE of gatekeeper.mail into the state
 *		tables, the rotation of the retention segments, and purge.
 *
 * The claim and the claimer's transitions (ack, nack, unclaim, extend) are
 * in claim.c and mail_state.c; this file holds the rest of the family.
 * Each statement is a kept plan named for it (gatekeeper_plan), its SQL
 * text a static const char beside it, the tables' columns spelled by the
 * lists in mail_state.h.  The statements are the ones the PL/pgSQL
 * functions ran before, so the locks they take, and the races the specs
 * in specs/ pin, are the same.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "gate.h"
#include "gatekeeper.h"
#include "mail_state.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

PG_FUNCTION_INFO_V1(gatekeeper_cancel);
PG_FUNCTION_INFO_V1(gatekeeper_cancel_key);
PG_FUNCTION_INFO_V1(gatekeeper_cancel_queue);
PG_FUNCTION_INFO_V1(gatekeeper_reap);

/*
 * The scheduled mail a cancel takes out of mail_live, into mail_done as
 * cancelled, in one statement: a claim that took the mail first (or holds
 * its row's lock) leaves it unchanged here.
 */
#define CANCEL_SQL(where) \
"WITH f AS ( " \
"    DELETE FROM gatekeeper.mail_live l " \
"     WHERE " where " AND l.state = 'scheduled' " \
"    RETURNING l.* " \
") " \
"INSERT INTO gatekeeper.mail_done (" MAIL_DONE_COLUMNS ") " \
"SELECT f.id, f.queue, 'cancelled', f.attempt, f.uncharged, f.send_at, f.worker, " \
"       f.message_id, f.last_error, f.dedupe_key, now(), f.segment " \
"  FROM f"

static const char cancel_sql[] = CANCEL_SQL("l.id = $1");

static const char cancel_queue_sql[] = CANCEL_SQL("l.queue = $1");

/* the scheduled mail of a queue that has a dedupe key */
static const char scheduled_by_key_sql[] =
"SELECT l.id FROM gatekeeper.mail_live l "
" WHERE l.queue = $1 AND l.dedupe_key = $2 AND l.state = 'scheduled'";

static const char queue_exists_sql[] =
"SELECT FROM gatekeeper.queue q WHERE q.name = $1";

/*
 * reap: the batches whose lease ran out, or whose background worker was
 * of another server incarnation ($1, NULL when none can run here), locked
 * without waiting and deleted; their open mails judged and written to
 * mail_live (scheduled again) or mail_done (unknown or failed).  Returns
 * the mails settled, the recipients and ids of those that failed (their
 * gate passes are given back), and the notify queues with mail scheduled
 * again and the earliest of it.
 */
static const char reap_sql[] =
"WITH lapsed AS ( "
"    DELETE FROM gatekeeper.mail_claim c "
"     WHERE c.batch = ANY (ARRAY( "
"            SELECT l.batch FROM gatekeeper.mail_claim l "
"             WHERE l.lease_until < now() "
"               FOR UPDATE SKIP LOCKED) "
"         || ARRAY( "
"            SELECT l.batch FROM gatekeeper.mail_claim l "
"             WHERE $1::text IS NOT NULL AND l.lease_until >= now() "
"               AND l.worker LIKE 'bgworker:%' AND l.worker NOT LIKE '%@' || $1::text "
"               FOR UPDATE SKIP LOCKED)) "
"    RETURNING c.gone, c.mails, c.lease_until >= now() AS orphaned "
"), judged AS ( "
"    SELECT r.*, r.uncharged + e.orphaned::int AS free, "
"           CASE WHEN e.orphaned THEN 'claimed by a server that is gone' "
"                ELSE 'lease expired' END AS why, "
"           CASE WHEN q.delivery = 'at_most_once' THEN 'unknown' "
"                WHEN r.attempt - r.uncharged - e.orphaned::int >= q.max_attempts THEN 'failed' "
"                ELSE 'scheduled' END AS outcome "
"      FROM lapsed e "
"     CROSS JOIN LATERAL unnest(e.mails) r "
"      LEFT JOIN gatekeeper.queue q ON q.name = r.queue "
"     WHERE NOT r.id = ANY (e.gone) "
"), back AS ( "
"    INSERT INTO gatekeeper.mail_live (" MAIL_LIVE_COLUMNS ") "
"    SELECT j.id, j.queue, j.priority, j.send_at, 'scheduled', j.attempt, j.free, "
"           NULL, j.message_id, j.why, j.dedupe_key, j.segment "
"      FROM judged j "
"     WHERE j.outcome = 'scheduled' "
"    RETURNING mail_live.id, mail_live.queue, mail_live.send_at "
"), done AS ( "
"    INSERT INTO gatekeeper.mail_done (" MAIL_DONE_COLUMNS ") "
"    SELECT j.id, j.queue, j.outcome::gatekeeper.state, j.attempt, j.free, j.send_at, NULL, "
"           j.message_id, j.why, j.dedupe_key, now(), j.segment "
"      FROM judged j "
"     WHERE j.outcome <> 'scheduled' "
"    RETURNING mail_done.id, mail_done.state, mail_done.segment "
"), announced AS ( "
"    SELECT b.queue, min(b.send_at) AS due "
"      FROM back b "
"      JOIN gatekeeper.queue q ON q.name = b.queue AND q.notify "
"     GROUP BY b.queue "
") "
"SELECT (SELECT count(*) FROM back) + count(d.id), "
"       array_agg(m.recipient) FILTER (WHERE d.state = 'failed'), "
"       array_agg(d.id) FILTER (WHERE d.state = 'failed'), "
"       (SELECT array_agg(a.queue ORDER BY a.queue) FROM announced a), "
"       (SELECT array_agg(a.due ORDER BY a.queue) FROM announced a) "
"  FROM done d "
"  LEFT JOIN gatekeeper.mail m ON m.id = d.id AND m.segment = d.segment";

static SPIPlanPtr cancel_plan = NULL;
static SPIPlanPtr cancel_queue_plan = NULL;
static SPIPlanPtr scheduled_by_key_plan = NULL;
static SPIPlanPtr queue_exists_plan = NULL;
static SPIPlanPtr reap_plan = NULL;

static bool cancel_scheduled(int64 id);
static void require_queue(text *queue);
static void announce_due(Datum queues, Datum dues);

/*
 * Cancel the scheduled mail id: true when it was cancelled, false when it
 * is not scheduled (claimed, finished, or no such mail).  Runs inside SPI.
 */
static bool
cancel_scheduled(int64 id)
{
	Oid			type = INT8OID;
	Datum		arg = Int64GetDatum(id);

	gatekeeper_plan(&cancel_plan, cancel_sql, 1, &type);
	if (gatekeeper_execute_by_key(cancel_plan, &arg, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not cancel mail " INT64_FORMAT, id);
	return SPI_processed > 0;
}

/*
 * Refuse a queue that is NULL or does not exist, as gatekeeper._queue()
 * does.  Runs inside SPI.
 */
static void
require_queue(text *queue)
{
	Oid			type = TEXTOID;
	Datum		arg;

	if (queue == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("queue must not be null")));
	arg = PointerGetDatum(queue);
	gatekeeper_plan(&queue_exists_plan, queue_exists_sql, 1, &type);
	if (gatekeeper_execute_by_key(queue_exists_plan, &arg, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not look up a queue");
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("queue \"%s\" does not exist", text_to_cstring(queue)),
				 errhint("Create it with gatekeeper.create_queue().")));
}

/*
 * cancel(id bigint) RETURNS boolean
 *		Cancel a scheduled mail by id.
 */
Datum
gatekeeper_cancel(PG_FUNCTION_ARGS)
{
	bool		cancelled;

	gatekeeper_require_schema();
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("id must not be null")));

	SPI_connect();
	cancelled = cancel_scheduled(PG_GETARG_INT64(0));
	SPI_finish();

	PG_RETURN_BOOL(cancelled);
}

/*
 * cancel(queue text, dedupe_key text) RETURNS boolean
 *		Cancel the scheduled mail of a queue that has this dedupe key (the
 *		application's own key for it); false when there is none.
 */
Datum
gatekeeper_cancel_key(PG_FUNCTION_ARGS)
{
	Oid			types[2] = {TEXTOID, TEXTOID};
	Datum		args[2];
	bool		cancelled = false;

	gatekeeper_require_schema();
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("queue and dedupe_key must not be null")));
	args[0] = PointerGetDatum(PG_GETARG_TEXT_PP(0));
	args[1] = PointerGetDatum(PG_GETARG_TEXT_PP(1));

	SPI_connect();
	require_queue(DatumGetTextPP(args[0]));
	gatekeeper_plan(&scheduled_by_key_plan, scheduled_by_key_sql, 2, types);
	if (gatekeeper_execute_by_key(scheduled_by_key_plan, args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not look up mail by dedupe key");
	if (SPI_processed > 0)
	{
		bool		isnull;
		int64		id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
													 SPI_tuptable->tupdesc, 1, &isnull));

		cancelled = cancel_scheduled(id);
	}
	SPI_finish();

	PG_RETURN_BOOL(cancelled);
}

/*
 * cancel_queue(queue text) RETURNS bigint
 *		Cancel every scheduled mail of a queue; the number cancelled.
 */
Datum
gatekeeper_cancel_queue(PG_FUNCTION_ARGS)
{
	Oid			type = TEXTOID;
	Datum		arg;
	uint64		n;

	gatekeeper_require_schema();

	SPI_connect();
	require_queue(PG_ARGISNULL(0) ? NULL : PG_GETARG_TEXT_PP(0));
	arg = PointerGetDatum(PG_GETARG_TEXT_PP(0));
	gatekeeper_plan(&cancel_queue_plan, cancel_queue_sql, 1, &type);
	if (gatekeeper_execute_by_key(cancel_queue_plan, &arg, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not cancel the mail of a queue");
	n = SPI_processed;
	SPI_finish();

	PG_RETURN_INT64((int64) n);
}

/*
 * Announce each notify queue's mail made due again (queues[i] at dues[i]):
 * at commit when it is due by now, else by the worker when it comes due.
 */
static void
announce_due(Datum queues, Datum dues)
{
	Datum	   *qv;
	Datum	   *dv;
	int			nq;
	int			nd;
	int			i;
	TimestampTz now = GetCurrentTimestamp();

	deconstruct_array(DatumGetArrayTypeP(queues), TEXTOID, -1, false, TYPALIGN_INT,
					  &qv, NULL, &nq);
	deconstruct_array(DatumGetArrayTypeP(dues), TIMESTAMPTZOID, 8, FLOAT8PASSBYVAL,
					  TYPALIGN_DOUBLE, &dv, NULL, &nd);
	if (nq != nd)
		elog(ERROR, "reap returned %d queues and %d due times", nq, nd);
	for (i = 0; i < nq; i++)
	{
		TimestampTz due = DatumGetTimestampTz(dv[i]);

		if (due <= now)
			gatekeeper_notify_queue(TextDatumGetCString(qv[i]));
		else
			gatekeeper_announce_later(due);
	}
}

/*
 * gatekeeper_mail_reap
 *		Settle the claimed mail whose lease ran out, or whose server is
 *		gone: scheduled again, unknown (at-most-once mail) or failed
 *		(attempts spent).  Returns the number of mails settled.  Runs
 *		inside SPI.
 *
 * at_most_once: the mail may have gone, so it is never sent again.
 * at_least_once: back to scheduled, unless its attempts are spent; it
 * keeps its gate passes, which its next claim re-passes.  Mail that
 * failed gives its passes back, all in one sorted release.  A lapsed
 * batch is deleted and the mails still open in it are judged; a mail
 * whose queue is gone goes back to scheduled rather than nowhere.
 *
 * A batch a background worker of another server incarnation claimed (its
 * worker is 'bgworker:<pid>@<incarnation>', or 0.2.0's 'bgworker:<pid>')
 * is taken back at once, whatever its lease: that worker is gone (this is
 * a promoted standby, or the server restarted) and could only ever have
 * recorded its outcomes on the server it ran on.  Its mails go back
 * uncharged.  External claimers' claims are never taken back early: they
 * outlive any one server, and may ack on this one after a failover.
 */
int32
gatekeeper_mail_reap(void)
{
	const char *here = gatekeeper_incarnation();
	Oid			type = TEXTOID;
	Datum		arg;
	HeapTuple	tuple;
	TupleDesc	desc;
	bool		isnull;
	int64		n;
	Datum		recipients;
	Datum		holders;
	bool		no_failed;
	Datum		queues;
	bool		no_announced;
	Datum		dues;

	arg = here != NULL ? CStringGetTextDatum(here) : (Datum) 0;
	gatekeeper_plan(&reap_plan, reap_sql, 1, &type);
	if (gatekeeper_execute_by_key(reap_plan, &arg, here != NULL ? NULL : "n",
								  false, 0) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "could not reap claimed mail");
	tuple = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	n = DatumGetInt64(SPI_getbinval(tuple, desc, 1, &isnull));
	recipients = SPI_getbinval(tuple, desc, 2, &no_failed);
	holders = SPI_getbinval(tuple, desc, 3, &isnull);
	queues = SPI_getbinval(tuple, desc, 4, &no_announced);
	dues = SPI_getbinval(tuple, desc, 5, &isnull);

	if (!no_failed)
	{
		Datum	   *rv;
		Datum	   *hv;
		bool	   *rn;
		int			nr;
		int			nh;
		char	  **names;
		int64	   *ids;
		int			i;
		int			j;

		deconstruct_array(DatumGetArrayTypeP(recipients), TEXTOID, -1, false, TYPALIGN_INT,
						  &rv, &rn, &nr);
		deconstruct_array(DatumGetArrayTypeP(holders), INT8OID, 8, FLOAT8PASSBYVAL,
						  TYPALIGN_DOUBLE, &hv, NULL, &nh);
		if (nr != nh)
			elog(ERROR, "reap returned %d recipients and %d mails", nr, nh);
		names = palloc(nr * sizeof(char *));
		ids = palloc(nr * sizeof(int64));
		for (i = 0, j = 0; i < nr; i++)
		{
			/* a mail deleted meanwhile has no recipient, and no passes left */
			if (rn[i])
				continue;
			names[j] = TextDatumGetCString(rv[i]);
			ids[j++] = DatumGetInt64(hv[i]);
		}
		if (j > 0)
			gatekeeper_release_passes(names, ids, j);
	}
	/* mail back to scheduled is due again: external senders of a notify queue hear of it */
	if (!no_announced)
		announce_due(queues, dues);

	return (int32) n;
}

/*
 * reap() RETURNS int
 *		gatekeeper_mail_reap for SQL.
 */
Datum
gatekeeper_reap(PG_FUNCTION_ARGS)
{
	int32		n;

	gatekeeper_require_schema();
	SPI_connect();
	n = gatekeeper_mail_reap();
	SPI_finish();
	PG_RETURN_INT32(n);
}
