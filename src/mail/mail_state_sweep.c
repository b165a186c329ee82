/*-------------------------------------------------------------------------
 *
 * mail_state_sweep.c
 *		The changes of a mail's state that are not a claimer's own (issue
 *		26, item 1): cancel (by id, by dedupe key, a whole queue), retry
 *		(failed, expired or unknown mail scheduled again, issue 47), reap
 *		(claims whose lease ran out, or whose server is gone), the rotation
 *		of the retention segments, and purge.
 *
 * The claim and the claimer's transitions (ack, nack, unclaim, extend) are
 * in claim.c and mail_state.c, the sync of an application's UPDATE or
 * DELETE of gatekeeper.mail into the state tables in mail_state_sync.c;
 * this file holds the rest of the family.
 * Each statement is a kept plan named for it (gatekeeper_plan), its SQL
 * text a static const char beside it, the tables' columns spelled by the
 * lists in mail_state.h.  The statements are the ones the PL/pgSQL
 * functions ran before, so the locks they take, and the races the specs
 * in specs/ pin, are the same.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog.h"
#include "gate.h"
#include "gate_log.h"
#include "gate_store.h"
#include "gatekeeper.h"
#include "mail_runs.h"
#include "mail_state.h"
#include "mail_state_upkeep.h"
#include "wake.h"
#include "worker_slots.h"
#include "xact.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"

PG_FUNCTION_INFO_V1(gatekeeper_cancel);
PG_FUNCTION_INFO_V1(gatekeeper_cancel_key);
PG_FUNCTION_INFO_V1(gatekeeper_cancel_queue);
PG_FUNCTION_INFO_V1(gatekeeper_retry);
PG_FUNCTION_INFO_V1(gatekeeper_retry_queue);
PG_FUNCTION_INFO_V1(gatekeeper_reap);
PG_FUNCTION_INFO_V1(gatekeeper_rotate);
PG_FUNCTION_INFO_V1(gatekeeper_purge);

/* the retention segments: gatekeeper.mail_0 .. mail_3 and their kin */
#define NUM_SEGMENTS 4

/*
 * The scheduled mail a cancel takes out of mail_live, into mail_done as
 * cancelled, in one statement.  A cancel that meets a claim in progress
 * waits for it and finds nothing if the claim commits (specs/claim_cancel).
 */
#define CANCEL_SQL(where) \
"WITH f AS ( " \
"    DELETE FROM gatekeeper.mail_live l " \
"     WHERE " where " AND l.state = 'scheduled' " \
"    RETURNING l.* " \
") " \
"INSERT INTO gatekeeper.mail_done (" MAIL_DONE_COLUMNS ", finished_at) " \
"SELECT f.id, f.queue, 'cancelled', f.attempt, f.uncharged, f.send_at, f.worker, " \
"       f.message_id, f.last_error, f.dedupe_key, f.segment, now() " \
"  FROM f"

static const char cancel_sql[] = CANCEL_SQL("l.id = $1");

static const char cancel_queue_sql[] = CANCEL_SQL("l.queue = $1");

/* the scheduled mail of a queue that has a dedupe key */
static const char scheduled_by_key_sql[] =
"SELECT l.id FROM gatekeeper.mail_live l "
" WHERE l.queue = $1 AND l.dedupe_key = $2 AND l.state = 'scheduled'";

/*
 * retry's statements.  The finished mail is read and its outcome row
 * locked, so two retries of one mail, or a retry and the rotation that
 * would move it, take turns; its queue's notify flag comes with it (NULL:
 * the queue is gone).
 */
static const char retry_read_sql[] =
"SELECT d.state::text, d.segment, d.queue, d.dedupe_key, "
"       (SELECT q.notify FROM gatekeeper.queue q WHERE q.name = d.queue) "
"  FROM gatekeeper.mail_done d WHERE d.id = $1 "
"   FOR UPDATE OF d";

/*
 * The holder of a retried mail's dedupe key: the key's row is written if
 * it has none, then locked, and only then is its holder tested, in a
 * later statement (the rule of mail_key's insert, src/mail.c: a holder
 * seen not holding no longer holds).
 */
static const char retry_key_insert_sql[] =
"INSERT INTO gatekeeper.mail_key (queue, dedupe_key, id) VALUES ($1, $2, $3) "
"ON CONFLICT DO NOTHING";
static const char retry_key_lock_sql[] =
"SELECT k.id FROM gatekeeper.mail_key k "
" WHERE k.queue = $1 AND k.dedupe_key = $2 FOR UPDATE";
static const char retry_key_held_sql[] =
"SELECT gatekeeper._mail_key_held($3, $1, $2)";
static const char retry_key_take_sql[] =
"UPDATE gatekeeper.mail_key SET id = $3, finished_at = NULL "
" WHERE queue = $1 AND dedupe_key = $2";

/* an expired mail goes again without the deadline it missed */
static const char retry_deadline_sql[] =
"UPDATE gatekeeper.mail SET send_by = NULL WHERE id = $1 AND segment = $2";

/*
 * The move itself, cancel's in reverse: the outcome out of mail_done, a
 * live row due now into mail_live, with the mail's Message-ID and its
 * attempt (the fencing token of its claims, so it only grows); the
 * attempts before count as uncharged, so the mail has its queue's
 * max_attempts again.
 */
static const char retry_move_sql[] =
"WITH f AS ( "
"    DELETE FROM gatekeeper.mail_done d WHERE d.id = $1 AND d.segment = $2 "
"    RETURNING d.* "
") "
"INSERT INTO gatekeeper.mail_live (" MAIL_LIVE_COLUMNS ") "
"SELECT f.id, f.queue, m.priority, now(), 'scheduled', f.attempt, f.attempt, NULL, "
"       f.message_id, f.last_error, f.dedupe_key, f.segment "
"  FROM f JOIN gatekeeper.mail m ON m.id = f.id AND m.segment = f.segment";

/* the failed mail of a queue finished since $2 */
static const char retry_queue_sql[] =
"SELECT d.id FROM gatekeeper.mail_done d "
" WHERE d.queue = $1 AND d.state = 'failed' AND d.finished_at >= $2 "
" ORDER BY d.id";

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
"    INSERT INTO gatekeeper.mail_done (" MAIL_DONE_COLUMNS ", finished_at) "
"    SELECT j.id, j.queue, j.outcome::gatekeeper.state, j.attempt, j.free, j.send_at, NULL, "
"           j.message_id, j.why, j.dedupe_key, j.segment, now() "
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

/*
 * _rotate: the segment row, locked without waiting, and whether the
 * current segment is younger than half of retention ($1).
 */
static const char rotate_segment_sql[] =
"SELECT s.current, now() - s.rotated_at < $1 / 2 "
"  FROM gatekeeper.segment s FOR UPDATE SKIP LOCKED";

/* whether segment $1 holds mail that finished within retention ($2) */
static const char rotate_recent_sql[] =
"SELECT FROM gatekeeper.mail_done d "
" WHERE d.segment = $1 AND d.finished_at >= now() - $2 LIMIT 1";

/*
 * A finished mail of segment $1 that still holds its dedupe key (its
 * queue's window is longer than retention) leaves its finish time in the
 * key's row, which goes on holding the key; under the row's lock, which
 * an insert of the key takes before it tests the holder (src/mail.c,
 * write_keys).
 */
static const char rotate_keep_keys_sql[] =
"UPDATE gatekeeper.mail_key k SET finished_at = d.finished_at "
"  FROM gatekeeper.mail_done d "
"  JOIN gatekeeper.queue q ON q.name = d.queue "
" WHERE d.segment = $1 AND d.dedupe_key IS NOT NULL AND d.state <> 'cancelled' "
"   AND q.dedupe_window > interval '0' AND d.finished_at > now() - q.dedupe_window "
"   AND k.queue = d.queue AND k.dedupe_key = d.dedupe_key AND k.id = d.id";

/*
 * The segment's tables, and mail_claim: the records of claimed mail in
 * the segment are rewritten below, and an ack reads them before it locks
 * a batch.  Per segment (%d: the next one).
 */
static const char rotate_lock_sql[] =
"LOCK TABLE gatekeeper.mail_%d, gatekeeper.mail_done_%d, gatekeeper.event_log_%d, "
"           gatekeeper.mail_claim IN ACCESS EXCLUSIVE MODE";

/*
 * The unfinished mail of the next segment (%2$d) moves to the current one
 * (%1$d): its content, its events, its live row and its claim records.
 */
static const char rotate_move_mail_sql[] =
"INSERT INTO gatekeeper.mail_%1$d (id, queue, recipient, sender, subject, body, html, headers, "
"                                  dedupe_key, priority, send_at, send_by, created_at, segment, "
"                                  recipient_name, metadata, timezone) "
"SELECT m.id, m.queue, m.recipient, m.sender, m.subject, m.body, m.html, m.headers, "
"       m.dedupe_key, m.priority, m.send_at, m.send_by, m.created_at, %1$d, "
"       m.recipient_name, m.metadata, m.timezone "
"  FROM gatekeeper.mail_%2$d m "
" WHERE m.id IN (SELECT l.id FROM gatekeeper.mail_live l WHERE l.segment = %2$d "
"                UNION ALL "
"                SELECT r.id FROM gatekeeper.mail_claim c CROSS JOIN LATERAL unnest(c.mails) r "
"                 WHERE r.segment = %2$d AND NOT r.id = ANY (c.gone))";

static const char rotate_move_events_sql[] =
"UPDATE gatekeeper.event_log e SET segment = $1 "
" WHERE e.segment = $2 "
"   AND e.mail_id IN (SELECT l.id FROM gatekeeper.mail_live l WHERE l.segment = $2 "
"                     UNION ALL "
"                     SELECT r.id FROM gatekeeper.mail_claim c CROSS JOIN LATERAL unnest(c.mails) r "
"                      WHERE r.segment = $2 AND NOT r.id = ANY (c.gone))";

static const char rotate_move_live_sql[] =
"UPDATE gatekeeper.mail_live l SET segment = $1 WHERE l.segment = $2";

/* claimed mail still open in its batch: its record names the new segment */
static const char rotate_move_claims_sql[] =
"UPDATE gatekeeper.mail_claim c "
"   SET mails = ARRAY( "
"        SELECT CASE WHEN (c.mails[i]).segment = $2 AND NOT (c.mails[i]).id = ANY (c.gone) "
"                    THEN ROW((c.mails[i]).id, (c.mails[i]).queue, (c.mails[i]).priority, "
"                             (c.mails[i]).send_at, (c.mails[i]).state, (c.mails[i]).attempt, "
"                             (c.mails[i]).uncharged, (c.mails[i]).worker, "
"                             (c.mails[i]).message_id, (c.mails[i]).last_error, "
"                             (c.mails[i]).dedupe_key, $1)::gatekeeper.mail_live "
"                    ELSE c.mails[i] END "
"          FROM generate_subscripts(c.mails, 1) AS i "
"         ORDER BY i) "
" WHERE EXISTS (SELECT FROM unnest(c.mails) r WHERE r.segment = $2 AND NOT r.id = ANY (c.gone))";

static const char rotate_count_sql[] =
"SELECT count(*) FROM gatekeeper.mail_done d WHERE d.segment = $1";

static const char rotate_truncate_sql[] =
"TRUNCATE gatekeeper.mail_%d, gatekeeper.mail_done_%d, gatekeeper.event_log_%d";

static const char rotate_advance_sql[] =
"UPDATE gatekeeper.segment SET current = $1, rotated_at = now()";

/* purge: a batch ($1) of expired gate log rows, locked without waiting */
static const char purge_gate_log_sql[] =
"DELETE FROM gatekeeper.gate_log g "
" WHERE g.ctid = ANY (ARRAY(SELECT e.ctid FROM gatekeeper.gate_log e "
"                           WHERE e.expires < now() LIMIT $1 "
"                             FOR UPDATE SKIP LOCKED)) "
"   AND g.expires < now()";

static SPIPlanPtr cancel_plan = NULL;
static SPIPlanPtr retry_read_plan = NULL;
static SPIPlanPtr retry_key_insert_plan = NULL;
static SPIPlanPtr retry_key_lock_plan = NULL;
static SPIPlanPtr retry_key_held_plan = NULL;
static SPIPlanPtr retry_key_take_plan = NULL;
static SPIPlanPtr retry_deadline_plan = NULL;
static SPIPlanPtr retry_move_plan = NULL;
static SPIPlanPtr retry_queue_plan = NULL;
static SPIPlanPtr cancel_queue_plan = NULL;
static SPIPlanPtr scheduled_by_key_plan = NULL;
static SPIPlanPtr queue_exists_plan = NULL;
static SPIPlanPtr reap_plan = NULL;
static SPIPlanPtr rotate_segment_plan = NULL;
static SPIPlanPtr rotate_recent_plan = NULL;
static SPIPlanPtr rotate_keep_keys_plan = NULL;
static SPIPlanPtr rotate_lock_plan[NUM_SEGMENTS];
static SPIPlanPtr rotate_move_mail_plan[NUM_SEGMENTS];
static SPIPlanPtr rotate_move_events_plan = NULL;
static SPIPlanPtr rotate_move_live_plan = NULL;
static SPIPlanPtr rotate_move_claims_plan = NULL;
static SPIPlanPtr rotate_count_plan = NULL;
static SPIPlanPtr rotate_truncate_plan[NUM_SEGMENTS];
static SPIPlanPtr rotate_advance_plan = NULL;
static SPIPlanPtr purge_gate_log_plan = NULL;

static bool cancel_scheduled(int64 id);
static bool retry_one(int64 id, bool bulk);
static bool retry_take_key(int64 id, Datum queue, Datum key, bool bulk);
static int64 required_id(FunctionCallInfo fcinfo);
static void require_queue(text *queue);
static void announce_due(Datum queues, Datum dues);
static bool rotate_recent(int16 segment, Datum retention, bool no_retention);
static bool rotate_lock(int16 next);
static int64 rotate(Datum retention, bool no_retention);
static Interval *retention_setting(void);

/*
 * Cancel the scheduled mail id: true when it was cancelled, false when it
 * is not scheduled (claimed, finished, or no such mail).  Runs inside SPI.
 */
static bool
cancel_scheduled(int64 id)
{
	Oid			type = INT8OID;
	Datum		arg = Int64GetDatum(id);

	/* the run holding the mail, into mail_live */
	mail_runs_to_live(&arg, 1);
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
 * The mail id that cancel(id) or retry(id) was called with, once the
 * schema is checked: 22004 when it is null.
 */
static int64
required_id(FunctionCallInfo fcinfo)
{
	gatekeeper_require_schema();
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("id must not be null")));
	return PG_GETARG_INT64(0);
}

/*
 * cancel(id bigint) RETURNS boolean
 *		Cancel a scheduled mail by id.
 */
Datum
gatekeeper_cancel(PG_FUNCTION_ARGS)
{
	int64		id = required_id(fcinfo);
	bool		cancelled;

	SPI_connect();
	cancelled = cancel_scheduled(id);
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
	mail_runs_to_live_of(arg, -1);
	gatekeeper_plan(&cancel_queue_plan, cancel_queue_sql, 1, &type);
	if (gatekeeper_execute_by_key(cancel_queue_plan, &arg, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not cancel the mail of a queue");
	n = SPI_processed;
	SPI_finish();

	PG_RETURN_INT64((int64) n);
}

/*
 * Schedule the finished mail id again, due now: true when it was, false
 * when it is no finished mail (scheduled, claimed, or no such mail).
 * Only failed, expired and unknown mail is retried: sent, cancelled and
 * suppressed mail is refused (55000), and so is mail whose queue is gone
 * (42704).  A mail whose dedupe key another mail holds now is refused
 * (23505), or skipped (false) when bulk.  Runs inside SPI.
 */
static bool
retry_one(int64 id, bool bulk)
{
	Oid			types[2] = {INT8OID, INT2OID};
	Datum		args[2];
	HeapTuple	tuple;
	TupleDesc	desc;
	bool		isnull;
	char	   *state;
	Datum		segment;
	Datum		queue;
	Datum		key;
	bool		no_key;
	bool		notify;
	bool		no_queue;

	args[0] = Int64GetDatum(id);
	if (gatekeeper_execute_kept(&retry_read_plan, retry_read_sql, 1, types, args, NULL,
								false) != SPI_OK_SELECT)
		elog(ERROR, "could not read finished mail " INT64_FORMAT, id);
	if (SPI_processed == 0)
		return false;
	tuple = SPI_copytuple(SPI_tuptable->vals[0]);
	desc = SPI_tuptable->tupdesc;
	state = TextDatumGetCString(SPI_getbinval(tuple, desc, 1, &isnull));
	segment = SPI_getbinval(tuple, desc, 2, &isnull);
	queue = SPI_getbinval(tuple, desc, 3, &isnull);
	key = SPI_getbinval(tuple, desc, 4, &no_key);
	notify = DatumGetBool(SPI_getbinval(tuple, desc, 5, &no_queue));

	if (strcmp(state, "failed") != 0 && strcmp(state, "expired") != 0 &&
		strcmp(state, "unknown") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("mail " INT64_FORMAT " is %s and is not retried", id, state),
				 errdetail("Only failed, expired and unknown mail is scheduled again.")));
	if (no_queue)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("queue \"%s\" of mail " INT64_FORMAT " does not exist",
						TextDatumGetCString(queue), id),
				 errhint("Create it with gatekeeper.create_queue().")));
	if (!no_key && !retry_take_key(id, queue, key, bulk))
		return false;

	args[1] = segment;
	if (strcmp(state, "expired") == 0 &&
		gatekeeper_execute_kept(&retry_deadline_plan, retry_deadline_sql, 2, types, args, NULL,
								false) != SPI_OK_UPDATE)
		elog(ERROR, "could not lift the deadline of mail " INT64_FORMAT, id);
	if (gatekeeper_execute_kept(&retry_move_plan, retry_move_sql, 2, types, args, NULL,
								false) != SPI_OK_INSERT ||
		SPI_processed != 1)
		elog(ERROR, "could not schedule mail " INT64_FORMAT " again", id);

	gatekeeper_wake_at_commit();
	if (notify)
		gatekeeper_announce_due(TextDatumGetCString(queue), GetCurrentTimestamp());
	return true;
}

/*
 * Make the retried mail id the holder of its queue's dedupe key: true
 * when it is; when another mail holds the key now, an error, or false
 * when bulk.  Runs inside SPI.
 */
static bool
retry_take_key(int64 id, Datum queue, Datum key, bool bulk)
{
	Oid			types[3] = {TEXTOID, TEXTOID, INT8OID};
	Datum		args[3];
	bool		isnull;
	int64		holder;

	args[0] = queue;
	args[1] = key;
	args[2] = Int64GetDatum(id);
	if (gatekeeper_execute_kept(&retry_key_insert_plan, retry_key_insert_sql, 3, types, args,
								NULL, false) != SPI_OK_INSERT ||
		gatekeeper_execute_kept(&retry_key_lock_plan, retry_key_lock_sql, 2, types, args, NULL,
								false) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not lock the dedupe key of mail " INT64_FORMAT, id);
	holder = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	if (holder != id)
	{
		args[2] = Int64GetDatum(holder);
		if (gatekeeper_execute_kept(&retry_key_held_plan, retry_key_held_sql, 3, types, args,
									NULL, false) != SPI_OK_SELECT || SPI_processed != 1)
			elog(ERROR, "could not test the holder of a dedupe key");
		if (DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)))
		{
			if (bulk)
				return false;
			ereport(ERROR,
					(errcode(ERRCODE_UNIQUE_VIOLATION),
					 errmsg("mail " INT64_FORMAT " is not retried: mail " INT64_FORMAT " holds its dedupe key",
							id, holder),
					 errdetail("Queue \"%s\", key \"%s\".", TextDatumGetCString(queue),
							   TextDatumGetCString(key))));
		}
		args[2] = Int64GetDatum(id);
	}
	if (gatekeeper_execute_kept(&retry_key_take_plan, retry_key_take_sql, 3, types, args, NULL,
								false) != SPI_OK_UPDATE)
		elog(ERROR, "could not take the dedupe key of mail " INT64_FORMAT, id);
	return true;
}

/*
 * retry(id bigint) RETURNS boolean
 *		Schedule a failed, expired or unknown mail again (retry_one).
 */
Datum
gatekeeper_retry(PG_FUNCTION_ARGS)
{
	int64		id = required_id(fcinfo);
	bool		retried;

	SPI_connect();
	retried = retry_one(id, false);
	SPI_finish();

	PG_RETURN_BOOL(retried);
}

/*
 * retry(queue text, since timestamptz) RETURNS bigint
 *		Schedule again every failed mail of a queue that finished since
 *		then; a mail whose dedupe key another mail holds now is left as it
 *		is.  Returns how many were scheduled.
 */
Datum
gatekeeper_retry_queue(PG_FUNCTION_ARGS)
{
	Oid			types[2] = {TEXTOID, TIMESTAMPTZOID};
	Datum		args[2];
	int64	   *ids;
	int			nids;
	int			i;
	int64		n = 0;

	gatekeeper_require_schema();
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("since must not be null")));

	SPI_connect();
	require_queue(PG_ARGISNULL(0) ? NULL : PG_GETARG_TEXT_PP(0));
	args[0] = PointerGetDatum(PG_GETARG_TEXT_PP(0));
	args[1] = PG_GETARG_DATUM(1);
	if (gatekeeper_execute_kept(&retry_queue_plan, retry_queue_sql, 2, types, args, NULL,
								false) != SPI_OK_SELECT)
		elog(ERROR, "could not read the failed mail of a queue");
	ids = gatekeeper_spi_ids(CurrentMemoryContext, &nids);
	SPI_freetuptable(SPI_tuptable);
	for (i = 0; i < nids; i++)
	{
		CHECK_FOR_INTERRUPTS();
		if (retry_one(ids[i], true))
			n++;
	}
	SPI_finish();

	PG_RETURN_INT64(n);
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

	deconstruct_array(DatumGetArrayTypeP(queues), TEXTOID, -1, false, TYPALIGN_INT,
					  &qv, NULL, &nq);
	deconstruct_array(DatumGetArrayTypeP(dues), TIMESTAMPTZOID, 8, FLOAT8PASSBYVAL,
					  TYPALIGN_DOUBLE, &dv, NULL, &nd);
	if (nq != nd)
		elog(ERROR, "reap returned %d queues and %d due times", nq, nd);
	for (i = 0; i < nq; i++)
		gatekeeper_announce_due(TextDatumGetCString(qv[i]), DatumGetTimestampTz(dv[i]));
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

/*
 * Whether the retention segment holds mail that finished within retention
 * (NULL: it does not).  Runs inside SPI.
 */
static bool
rotate_recent(int16 segment, Datum retention, bool no_retention)
{
	Oid			types[2] = {INT2OID, INTERVALOID};
	Datum		args[2];
	char		nulls[2] = {' ', ' '};

	args[0] = Int16GetDatum(segment);
	args[1] = retention;
	nulls[1] = no_retention ? 'n' : ' ';
	if (gatekeeper_execute_kept(&rotate_recent_plan, rotate_recent_sql, 2, types, args, nulls,
								true) != SPI_OK_SELECT)
		elog(ERROR, "could not read gatekeeper.mail_done");
	return SPI_processed > 0;
}

/* rotate_lock's work, in its subtransaction */
static bool
rotate_lock_step(void *arg)
{
	int16		next = *(int16 *) arg;
	int			nestlevel = NewGUCNestLevel();
	Oid			type = INT2OID;
	Datum		value = Int16GetDatum(next);

	(void) set_config_option("lock_timeout", "1s", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	if (gatekeeper_execute_kept(&rotate_keep_keys_plan, rotate_keep_keys_sql, 1, &type, &value,
								NULL, false) != SPI_OK_UPDATE)
		elog(ERROR, "could not keep the dedupe keys of a retention segment");
	if (rotate_lock_plan[next] == NULL)
		gatekeeper_plan(&rotate_lock_plan[next],
						psprintf(rotate_lock_sql, next, next, next), 0, NULL);
	if (SPI_execute_plan(rotate_lock_plan[next], NULL, NULL, false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "could not lock a retention segment");
	AtEOXact_GUC(true, nestlevel);
	return true;
}

/* others held the tables past lock_timeout */
static bool
lock_not_available(ErrorData *error)
{
	return error->sqlerrcode == ERRCODE_LOCK_NOT_AVAILABLE;
}

/*
 * Keep the dedupe keys the next segment's finished mail still holds, and
 * lock its tables (and mail_claim), waiting at most a second for others
 * to let go; false, with nothing done, when they did not.  As PL/pgSQL's
 * exception block does: in a subtransaction, whose rollback gives back
 * whatever it had taken.  Runs inside SPI.
 */
static bool
rotate_lock(int16 next)
{
	return gatekeeper_subxact_try(rotate_lock_step, &next, lock_not_available);
}

/*
 * Rotate the retention segments (see gatekeeper.mail): when the current
 * segment is half of retention old and the next one holds no mail that
 * finished within retention, move the next one's unfinished mail to the
 * current segment, empty it by TRUNCATE and make it current.  Gives up, to
 * try again on a later purge, when the next segment's mail is too recent
 * or its tables stay locked by others for a second.  Returns the finished
 * mails removed.  Runs inside SPI.
 */
static int64
rotate(Datum retention, bool no_retention)
{
	Oid			types[2] = {INTERVALOID, INT2OID};
	Datum		args[2];
	char		nulls[2] = {' ', ' '};
	bool		isnull;
	bool		young;
	int16		current;
	int16		next;
	int64		removed;

	args[0] = retention;
	nulls[0] = no_retention ? 'n' : ' ';
	if (gatekeeper_execute_kept(&rotate_segment_plan, rotate_segment_sql, 1, types, args,
								nulls, false) != SPI_OK_SELECT)
		elog(ERROR, "could not read gatekeeper.segment");
	if (SPI_processed == 0)
		return 0;
	current = DatumGetInt16(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
										  &isnull));
	young = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2,
									   &isnull));
	if (!isnull && young)
		return 0;
	if (current < 0 || current >= NUM_SEGMENTS)
		elog(ERROR, "gatekeeper.segment names segment %d", current);
	next = (current + 1) % NUM_SEGMENTS;
	if (rotate_recent(next, retention, no_retention))
		return 0;
	if (!rotate_lock(next))
		return 0;
	/* under the locks, nothing enters the segment: look again */
	if (rotate_recent(next, retention, no_retention))
		return 0;

	/* the segment's runs, into mail_live, before its unfinished mail moves */
	mail_runs_to_live_of((Datum) 0, next);
	if (rotate_move_mail_plan[next] == NULL)
		gatekeeper_plan(&rotate_move_mail_plan[next],
						psprintf(rotate_move_mail_sql, current, next), 0, NULL);
	if (SPI_execute_plan(rotate_move_mail_plan[next], NULL, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not move unfinished mail out of a retention segment");

	/* the events, live rows and claim records of the mail that moved */
	types[0] = INT2OID;
	types[1] = INT2OID;
	args[0] = Int16GetDatum(current);
	args[1] = Int16GetDatum(next);
	if (gatekeeper_execute_kept(&rotate_move_events_plan, rotate_move_events_sql, 2, types,
								args, NULL, false) != SPI_OK_UPDATE ||
		gatekeeper_execute_kept(&rotate_move_live_plan, rotate_move_live_sql, 2, types, args,
								NULL, false) != SPI_OK_UPDATE ||
		gatekeeper_execute_kept(&rotate_move_claims_plan, rotate_move_claims_sql, 2, types,
								args, NULL, false) != SPI_OK_UPDATE)
		elog(ERROR, "could not move unfinished mail out of a retention segment");

	if (gatekeeper_execute_kept(&rotate_count_plan, rotate_count_sql, 1, &types[1], &args[1],
								NULL, true) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not count the finished mail of a retention segment");
	removed = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
										  &isnull));

	if (rotate_truncate_plan[next] == NULL)
		gatekeeper_plan(&rotate_truncate_plan[next],
						psprintf(rotate_truncate_sql, next, next, next), 0, NULL);
	if (SPI_execute_plan(rotate_truncate_plan[next], NULL, NULL, false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "could not empty a retention segment");
	if (gatekeeper_execute_kept(&rotate_advance_plan, rotate_advance_sql, 1, &types[1],
								&args[1], NULL, false) != SPI_OK_UPDATE)
		elog(ERROR, "could not advance gatekeeper.segment");
	return removed;
}

/*
 * _rotate(retention interval) RETURNS bigint
 *		rotate() for SQL: purge runs it, and tests that need a rotation.
 */
Datum
gatekeeper_rotate(PG_FUNCTION_ARGS)
{
	int64		removed;

	gatekeeper_require_schema();
	SPI_connect();
	removed = rotate(PG_ARGISNULL(0) ? (Datum) 0 : PG_GETARG_DATUM(0), PG_ARGISNULL(0));
	SPI_finish();
	PG_RETURN_INT64(removed);
}

/*
 * gatekeeper.retention as an interval, spelled as the setting shows it
 * (and current_setting() gave it to purge): whole days as days, anything
 * else as a time.
 */
static Interval *
retention_setting(void)
{
	Interval   *retention = palloc0(sizeof(Interval));

	if (gatekeeper_retention % SECS_PER_DAY == 0)
		retention->day = gatekeeper_retention / SECS_PER_DAY;
	else
		retention->time = (int64) gatekeeper_retention * USECS_PER_SEC;
	return retention;
}

/*
 * gatekeeper_mail_purge
 *		Remove finished mail older than gatekeeper.retention, by rotating
 *		the retention segments, and a batch of expired gate log rows; sweep
 *		expired passes out of shared memory, prune stale dedupe keys and
 *		give a drained mail_claim's space back.  Returns the rows removed
 *		(stale keys are no mail, and not counted).  Runs inside SPI.
 */
int64
gatekeeper_mail_purge(int32 batch)
{
	Datum		arg = Int32GetDatum(batch);
	Oid			type = INT4OID;
	int64		removed;

	removed = rotate(IntervalPGetDatum(retention_setting()), false);
	if (gatekeeper_execute_kept(&purge_gate_log_plan, purge_gate_log_sql, 1, &type, &arg, NULL,
								false) != SPI_OK_DELETE)
		elog(ERROR, "could not delete expired gate log rows");
	removed += SPI_processed;
	/* at most once a minute across the cluster: it visits every entry */
	if (gate_store_sweep_due())
		(void) gate_store_sweep(true, gate_log_nonce());
	(void) mail_state_key_prune(batch);
	(void) mail_state_claim_shrink();
	return removed;
}

/*
 * purge(batch int DEFAULT 10000) RETURNS bigint
 *		gatekeeper_mail_purge for SQL, and the worker.
 */
Datum
gatekeeper_purge(PG_FUNCTION_ARGS)
{
	int64		removed;

	gatekeeper_require_schema();
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("batch must not be null")));
	if (PG_GETARG_INT32(0) < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch must be positive")));
	SPI_connect();
	removed = gatekeeper_mail_purge(PG_GETARG_INT32(0));
	SPI_finish();
	PG_RETURN_INT64(removed);
}
