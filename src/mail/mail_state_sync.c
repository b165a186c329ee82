/*-------------------------------------------------------------------------
 *
 * mail_state_sync.c
 *		The sync of an application's UPDATE or DELETE of gatekeeper.mail
 *		into the state tables: the _mail_sync trigger.
 *
 * An owner may change a mail's queue, priority, send_at or dedupe key, or
 * delete mail, whatever state it is in.  After a DELETE (per statement,
 * with the old rows as a transition table) the mails' live rows, open
 * claims and outcomes go; after an UPDATE (per row) the change reaches
 * the mail's live row, the record of the batch of gatekeeper.mail_claim it
 * is claimed in, or its outcome, and its dedupe key moves in
 * gatekeeper.mail_key.  The other changes of a mail's state are in
 * mail_state.c (the claimer's) and mail_state_sweep.c (cancel, reap,
 * rotation, purge).  Each statement is a kept plan named for it
 * (gatekeeper_plan), its SQL text a static const char beside it; the
 * statements are the ones the PL/pgSQL trigger ran before, so the locks
 * they take, and the races the specs in specs/ pin, are the same.
 *
 * IDENTIFICATION
 *		src/mail_state_sync.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"

#include "catalog.h"
#include "gatekeeper.h"
#include "mail_runs.h"
#include "mail_state.h"

PG_FUNCTION_INFO_V1(gatekeeper_mail_sync);

/*
 * _mail_sync, after a DELETE of gatekeeper.mail: the deleted mails' live
 * rows, the open claims of them ($1 the ids, between $2 and $3: taken out
 * of their batches as an ack takes them), and their outcomes ($4 the
 * segments).
 */
static const char sync_delete_live_sql[] =
"DELETE FROM gatekeeper.mail_live l WHERE l.id = ANY ($1)";

static const char sync_any_claim_sql[] =
"SELECT FROM gatekeeper.mail_claim";

/*
 * The open claims of the batches whose id range meets the deleted ids'
 * ($1 .. $2); which of them name a deleted mail is asked in C, by a
 * binary search of the sorted ids (an = ANY of the ids per record would
 * cost their product).
 */
static const char sync_deleted_claims_sql[] =
"SELECT x.id, x.attempt "
"  FROM gatekeeper.mail_claim c CROSS JOIN LATERAL unnest(c.mails) x "
" WHERE int8range(c.lo, c.hi, '[]') && int8range($1, $2, '[]') "
"   AND NOT x.id = ANY (c.gone)";

static const char sync_delete_done_sql[] =
"DELETE FROM gatekeeper.mail_done d "
" USING unnest($1::bigint[], $2::smallint[]) AS o(id, segment) "
" WHERE d.id = o.id AND d.segment = o.segment";

/*
 * _mail_sync, after an UPDATE of a mail's queue ($2), priority ($3),
 * dedupe key ($4) or send_at ($5, NULL when it did not change).
 */
static const char sync_live_sql[] =
"UPDATE gatekeeper.mail_live l "
"   SET queue = $2, priority = $3, dedupe_key = $4, send_at = coalesce($5, l.send_at) "
" WHERE l.id = $1";

/* the batch the claimed mail $1 is open in, locked */
static const char sync_claim_batch_sql[] =
"SELECT c.batch, c.queue, c.worker, c.lease_until, c.open, c.gone, c.mails, c.owner "
"  FROM gatekeeper.mail_claim c "
" WHERE c.batch = (SELECT k.batch FROM gatekeeper.mail_claim k, unnest(k.mails) x "
"                   WHERE int8range(k.lo, k.hi, '[]') @> $1 AND x.id = $1 "
"                     AND NOT $1 = ANY (k.gone) "
"                   LIMIT 1) "
"   FOR UPDATE";

static const char sync_key_scheduled_sql[] =
"SELECT FROM gatekeeper.mail_live l WHERE l.queue = $1 AND l.dedupe_key = $2";

/*
 * A key's row is locked first, then tested (as src/mail.c does): a stale
 * row is taken over, a held one fails the insert.
 */
static const char sync_key_lock_sql[] =
"SELECT FROM gatekeeper.mail_key k WHERE k.queue = $1 AND k.dedupe_key = $2 FOR UPDATE";

static const char sync_key_drop_stale_sql[] =
"DELETE FROM gatekeeper.mail_key k "
" WHERE k.queue = $1 AND k.dedupe_key = $2 AND k.id <> $3 "
"   AND NOT gatekeeper._mail_key_held(k.id, k.queue, k.dedupe_key)";

static const char sync_key_drop_unheld_sql[] =
"DELETE FROM gatekeeper.mail_key k "
" WHERE k.queue = $1 AND k.dedupe_key = $2 "
"   AND NOT gatekeeper._mail_key_held(k.id, k.queue, k.dedupe_key)";

static const char sync_key_held_sql[] =
"SELECT FROM gatekeeper.mail_key k WHERE k.queue = $1 AND k.dedupe_key = $2 AND k.id <> $3";

static const char sync_key_insert_sql[] =
"INSERT INTO gatekeeper.mail_key (queue, dedupe_key, id) VALUES ($1, $2, $3)";

static const char sync_key_take_sql[] =
"INSERT INTO gatekeeper.mail_key (queue, dedupe_key, id) VALUES ($1, $2, $3) "
"ON CONFLICT (queue, dedupe_key) DO NOTHING";

static const char sync_key_release_sql[] =
"DELETE FROM gatekeeper.mail_key k WHERE k.queue = $1 AND k.dedupe_key = $2 AND k.id = $3";

/* the claimed mail's record ($4, at $3) rewritten in its batch, which may move */
static const char sync_claim_rewrite_sql[] =
"UPDATE gatekeeper.mail_claim c SET queue = $2, mails[$3] = $4 WHERE c.batch = $1";

static const char sync_claim_drop_sql[] =
"DELETE FROM gatekeeper.mail_claim c WHERE c.batch = $1";

static const char sync_claim_leave_sql[] =
"UPDATE gatekeeper.mail_claim c SET open = c.open - 1, gone = c.gone || $2 WHERE c.batch = $1";

static const char sync_claim_alone_sql[] =
"INSERT INTO gatekeeper.mail_claim (queue, worker, lease_until, lo, hi, open, mails, owner) "
"VALUES ($1, $2, $3, $4, $4, 1, ARRAY[$5], $6)";

static const char sync_done_sql[] =
"UPDATE gatekeeper.mail_done d SET queue = $2, dedupe_key = $3 "
" WHERE d.id = $1 AND d.segment = $4 "
"   AND (d.queue, d.dedupe_key) IS DISTINCT FROM ($2, $3)";

static SPIPlanPtr sync_delete_live_plan = NULL;
static SPIPlanPtr sync_any_claim_plan = NULL;
static SPIPlanPtr sync_deleted_claims_plan = NULL;
static SPIPlanPtr sync_delete_done_plan = NULL;
static SPIPlanPtr sync_live_plan = NULL;
static SPIPlanPtr sync_claim_batch_plan = NULL;
static SPIPlanPtr sync_key_scheduled_plan = NULL;
static SPIPlanPtr sync_key_lock_plan = NULL;
static SPIPlanPtr sync_key_drop_stale_plan = NULL;
static SPIPlanPtr sync_key_drop_unheld_plan = NULL;
static SPIPlanPtr sync_key_held_plan = NULL;
static SPIPlanPtr sync_key_insert_plan = NULL;
static SPIPlanPtr sync_key_take_plan = NULL;
static SPIPlanPtr sync_key_release_plan = NULL;
static SPIPlanPtr sync_claim_rewrite_plan = NULL;
static SPIPlanPtr sync_claim_drop_plan = NULL;
static SPIPlanPtr sync_claim_leave_plan = NULL;
static SPIPlanPtr sync_claim_alone_plan = NULL;
static SPIPlanPtr sync_done_plan = NULL;

/* the mail_live row type the plans taking a record were prepared for */
static Oid	record_plans_type = InvalidOid;

/* A mail's columns that _mail_sync carries into its state rows. */
typedef struct SyncedMail
{
	int64		id;
	int16		segment;
	Datum		queue;			/* text */
	int32		priority;
	Datum		dedupe_key;		/* text, or 0 for NULL */
	TimestampTz send_at;
} SyncedMail;

/* The batch of gatekeeper.mail_claim a claimed mail is open in, locked. */
typedef struct ClaimBatch
{
	int64		batch;
	Datum		queue;			/* text */
	Datum		worker;			/* text, unless no_worker */
	bool		no_worker;
	Datum		lease_until;	/* timestamptz */
	int32		open;
	ArrayType  *mails;			/* its records */
	Datum		owner;			/* oid, unless no_owner */
	bool		no_owner;
} ClaimBatch;

/* A claimed mail's record in its batch, deformed. */
typedef struct ClaimRecord
{
	Oid			type;			/* the records' type, gatekeeper.mail_live */
	TupleDesc	desc;
	int			pos;			/* its place in the batch's array, from 0 */
	Datum	   *values;
	bool	   *nulls;
	int			id_att;
	int			queue_att;
	int			priority_att;
	int			send_at_att;
	int			key_att;
} ClaimRecord;

static bool text_equal(Datum a, Datum b);
static void synced_mail(TupleDesc desc, HeapTuple tuple, SyncedMail *m);
static int	deleted_mail(TriggerData *trigdata, Datum **ids, Datum **segments,
						 int64 *lo, int64 *hi);
static void sync_delete_claims(Datum *ids, int n, int64 lo, int64 hi);
static void sync_delete(TriggerData *trigdata);
static void refuse_held_key(SPIPlanPtr *plan, const char *sql, int nargs, Oid *types,
							Datum *args, SyncedMail *new, bool by_scheduled);
static void sync_key_take(SyncedMail *new, bool scheduled);
static void sync_key_release(int64 id, Datum queue, Datum key);
static bool claim_batch_lock(int64 id, ClaimBatch *b);
static bool claim_record_find(ClaimBatch *b, int64 id, ClaimRecord *r);
static void sync_claimed_keys(SyncedMail *new, Datum old_queue, Datum old_key);
static void sync_claimed_write(SyncedMail *new, ClaimBatch *b, Oid record_type, int pos,
							   Datum record);
static bool sync_claimed(SyncedMail *new, bool send_at_changed);
static void sync_update(TriggerData *trigdata);

/* Two texts, either 0 for NULL, are the same (NOT IS DISTINCT FROM) */
static bool
text_equal(Datum a, Datum b)
{
	if (a == (Datum) 0 || b == (Datum) 0)
		return a == b;
	return DatumGetBool(DirectFunctionCall2Coll(texteq, DEFAULT_COLLATION_OID, a, b));
}

/* The columns of a row of gatekeeper.mail that _mail_sync carries. */
static void
synced_mail(TupleDesc desc, HeapTuple tuple, SyncedMail *m)
{
	bool		isnull;

	m->id = DatumGetInt64(heap_getattr(tuple, SPI_fnumber(desc, "id"), desc, &isnull));
	m->segment = DatumGetInt16(heap_getattr(tuple, SPI_fnumber(desc, "segment"), desc, &isnull));
	m->queue = heap_getattr(tuple, SPI_fnumber(desc, "queue"), desc, &isnull);
	m->priority = DatumGetInt32(heap_getattr(tuple, SPI_fnumber(desc, "priority"), desc, &isnull));
	m->dedupe_key = heap_getattr(tuple, SPI_fnumber(desc, "dedupe_key"), desc, &isnull);
	if (isnull)
		m->dedupe_key = (Datum) 0;
	else
		m->dedupe_key = PointerGetDatum(PG_DETOAST_DATUM_PACKED(m->dedupe_key));
	m->queue = PointerGetDatum(PG_DETOAST_DATUM_PACKED(m->queue));
	m->send_at = DatumGetTimestampTz(heap_getattr(tuple, SPI_fnumber(desc, "send_at"),
												  desc, &isnull));
}

/*
 * The ids and segments of the rows a DELETE took (its transition table),
 * into *ids and *segments, the lowest and highest id into *lo and *hi.
 * Returns how many.
 */
static int
deleted_mail(TriggerData *trigdata, Datum **ids, Datum **segments, int64 *lo, int64 *hi)
{
	Tuplestorestate *rows = trigdata->tg_oldtable;
	TupleDesc	desc = RelationGetDescr(trigdata->tg_relation);
	int			id_att = SPI_fnumber(desc, "id");
	int			segment_att = SPI_fnumber(desc, "segment");
	TupleTableSlot *slot;
	int			n = 0;
	int			size = 64;

	if (rows == NULL)
		elog(ERROR, "gatekeeper._mail_sync needs the DELETE's transition table");
	if (id_att <= 0 || segment_att <= 0)
		elog(ERROR, "gatekeeper._mail_sync fired on a table without id and segment");
	*lo = PG_INT64_MAX;
	*hi = PG_INT64_MIN;
	*ids = palloc(size * sizeof(Datum));
	*segments = palloc(size * sizeof(Datum));
	slot = MakeSingleTupleTableSlot(desc, &TTSOpsMinimalTuple);
	tuplestore_rescan(rows);
	while (tuplestore_gettupleslot(rows, true, false, slot))
	{
		bool		isnull;
		int64		id = DatumGetInt64(slot_getattr(slot, id_att, &isnull));

		if (n == size)
		{
			size *= 2;
			*ids = repalloc_huge(*ids, size * sizeof(Datum));
			*segments = repalloc_huge(*segments, size * sizeof(Datum));
		}
		(*ids)[n] = Int64GetDatum(id);
		(*segments)[n] = slot_getattr(slot, segment_att, &isnull);
		n++;
		*lo = Min(*lo, id);
		*hi = Max(*hi, id);
	}
	ExecDropSingleTupleTableSlot(slot);
	return n;
}

/*
 * The open claims of the n deleted mails ids (between lo and hi), taken
 * out of their batches as an ack takes them (take_claimed locks the
 * batches and skips what left them since this read).
 */
static void
sync_delete_claims(Datum *ids, int n, int64 lo, int64 hi)
{
	int64	   *sorted = palloc(n * sizeof(int64));
	Oid			range_types[2] = {INT8OID, INT8OID};
	Datum		range[2];
	int64	   *claim_ids;
	int32	   *claim_attempts;
	int			nclaims = 0;
	uint64		r;
	int			i;

	for (i = 0; i < n; i++)
		sorted[i] = DatumGetInt64(ids[i]);
	qsort(sorted, n, sizeof(int64), mail_state_id_cmp);
	range[0] = Int64GetDatum(lo);
	range[1] = Int64GetDatum(hi);
	if (gatekeeper_execute_kept(&sync_deleted_claims_plan, sync_deleted_claims_sql, 2,
								range_types, range, NULL, true) != SPI_OK_SELECT)
		elog(ERROR, "could not read the claims of deleted mail");
	claim_ids = palloc(Max(SPI_processed, 1) * sizeof(int64));
	claim_attempts = palloc(Max(SPI_processed, 1) * sizeof(int32));
	for (r = 0; r < SPI_processed; r++)
	{
		bool		isnull;
		int64		id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[r],
													 SPI_tuptable->tupdesc, 1, &isnull));

		if (bsearch(&id, sorted, n, sizeof(int64), mail_state_id_cmp) == NULL)
			continue;
		claim_ids[nclaims] = id;
		claim_attempts[nclaims++] = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[r],
																SPI_tuptable->tupdesc, 2,
																&isnull));
	}
	if (nclaims > 0)
	{
		LiveRecord	lr;
		int			ntaken;

		(void) mail_state_take_claimed(claim_ids, claim_attempts, nclaims,
									   &ntaken, &lr, CurrentMemoryContext);
	}
}

/*
 * After a DELETE of gatekeeper.mail: the mails' live rows go; each open
 * claim of a deleted mail is taken out of its batch as an ack takes it
 * (sync_delete_claims), before the outcomes, so that an ack this waited
 * for has its outcome deleted too; then the outcomes go.
 */
static void
sync_delete(TriggerData *trigdata)
{
	Datum	   *ids;
	Datum	   *segments;
	int64		lo;
	int64		hi;
	int			n;
	Oid			types[2];
	Datum		args[2];

	n = deleted_mail(trigdata, &ids, &segments, &lo, &hi);
	if (n == 0)
		return;

	types[0] = INT8ARRAYOID;
	args[0] = gatekeeper_array(ids, NULL, n, INT8OID);
	mail_runs_to_live(ids, n);
	if (gatekeeper_execute_kept(&sync_delete_live_plan, sync_delete_live_sql, 1, types, args,
								NULL, false) != SPI_OK_DELETE)
		elog(ERROR, "could not delete the live rows of deleted mail");

	if (gatekeeper_execute_kept(&sync_any_claim_plan, sync_any_claim_sql, 0, NULL, NULL, NULL,
								true) != SPI_OK_SELECT)
		elog(ERROR, "could not read gatekeeper.mail_claim");
	if (SPI_processed > 0)
		sync_delete_claims(ids, n, lo, hi);

	types[1] = INT2ARRAYOID;
	args[1] = gatekeeper_array(segments, NULL, n, INT2OID);
	if (gatekeeper_execute_kept(&sync_delete_done_plan, sync_delete_done_sql, 2, types, args,
								NULL, false) != SPI_OK_DELETE)
		elog(ERROR, "could not delete the outcomes of deleted mail");
}

/*
 * Run the lookup sql (kept in *plan) for another holder of new's dedupe
 * key, and fail with 23505 if it finds one: a scheduled mail
 * (by_scheduled, constraint mail_dedupe), else a claimed or recently
 * finished one (mail_key_pkey).
 */
static void
refuse_held_key(SPIPlanPtr *plan, const char *sql, int nargs, Oid *types, Datum *args,
				SyncedMail *new, bool by_scheduled)
{
	const char *constraint = by_scheduled ? "mail_dedupe" : "mail_key_pkey";

	if (gatekeeper_execute_kept(plan, sql, nargs, types, args, NULL, true) != SPI_OK_SELECT)
		elog(ERROR, "could not look up a dedupe key");
	if (SPI_processed == 0)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_UNIQUE_VIOLATION),
			 errmsg("duplicate key value violates unique constraint \"%s\"", constraint),
			 by_scheduled ?
			 errdetail("A scheduled mail of queue %s holds dedupe key %s.",
					   TextDatumGetCString(new->queue),
					   TextDatumGetCString(new->dedupe_key)) :
			 errdetail("A claimed mail of queue %s, or one finished within its dedupe_window, holds dedupe key %s.",
					   TextDatumGetCString(new->queue),
					   TextDatumGetCString(new->dedupe_key)),
			 err_generic_string(PG_DIAG_CONSTRAINT_NAME, constraint)));
}

/*
 * The dedupe key new->dedupe_key for mail new, which holds it no more
 * than it did: its row of mail_key, locked first and tested then (as
 * src/mail.c does).  A claimed mail (!scheduled) takes a stale row over
 * and fails on a held one as the key's insert would; a scheduled mail
 * fails when a mail other than itself holds it, and keeps a row it holds.
 */
static void
sync_key_take(SyncedMail *new, bool scheduled)
{
	Oid			types[3] = {TEXTOID, TEXTOID, INT8OID};
	Datum		args[3];

	args[0] = new->queue;
	args[1] = new->dedupe_key;
	args[2] = Int64GetDatum(new->id);
	if (gatekeeper_execute_kept(&sync_key_lock_plan, sync_key_lock_sql, 2, types, args, NULL,
								false) != SPI_OK_SELECT)
		elog(ERROR, "could not lock a dedupe key");
	if (scheduled)
	{
		if (gatekeeper_execute_kept(&sync_key_drop_stale_plan, sync_key_drop_stale_sql, 3,
									types, args, NULL, false) != SPI_OK_DELETE)
			elog(ERROR, "could not take over a dedupe key");
		refuse_held_key(&sync_key_held_plan, sync_key_held_sql, 3, types, args, new, false);
		if (gatekeeper_execute_kept(&sync_key_take_plan, sync_key_take_sql, 3, types, args,
									NULL, false) != SPI_OK_INSERT)
			elog(ERROR, "could not write a dedupe key");
	}
	else
	{
		/* mail_key_pkey refuses the insert if a mail that holds it has the row */
		if (gatekeeper_execute_kept(&sync_key_drop_unheld_plan, sync_key_drop_unheld_sql, 2,
									types, args, NULL, false) != SPI_OK_DELETE)
			elog(ERROR, "could not take over a dedupe key");
		if (gatekeeper_execute_kept(&sync_key_insert_plan, sync_key_insert_sql, 3, types, args,
									NULL, false) != SPI_OK_INSERT)
			elog(ERROR, "could not write a dedupe key");
	}
}

/* Mail id gives up the dedupe key key of queue: its row of mail_key goes. */
static void
sync_key_release(int64 id, Datum queue, Datum key)
{
	Oid			types[3] = {TEXTOID, TEXTOID, INT8OID};
	Datum		args[3];

	args[0] = queue;
	args[1] = key;
	args[2] = Int64GetDatum(id);
	if (gatekeeper_execute_kept(&sync_key_release_plan, sync_key_release_sql, 3, types, args,
								NULL, false) != SPI_OK_DELETE)
		elog(ERROR, "could not give a dedupe key up");
}

/*
 * Lock the batch the claimed mail id is open in, and read it into *b:
 * false when the mail is open in none (it left while this waited for
 * the lock, or the lock read a version whose gone list names it).
 */
static bool
claim_batch_lock(int64 id, ClaimBatch *b)
{
	Oid			type = INT8OID;
	Datum		arg = Int64GetDatum(id);
	HeapTuple	row;
	TupleDesc	rowdesc;
	bool		isnull;
	Datum	   *gone_ids;
	int			ngone;
	int			i;

	if (gatekeeper_execute_kept(&sync_claim_batch_plan, sync_claim_batch_sql, 1, &type, &arg,
								NULL, false) != SPI_OK_SELECT ||
		SPI_processed > 1)
		elog(ERROR, "could not lock the batch of a claimed mail");
	if (SPI_processed == 0)
		return false;
	row = SPI_tuptable->vals[0];
	rowdesc = SPI_tuptable->tupdesc;
	b->batch = DatumGetInt64(SPI_getbinval(row, rowdesc, 1, &isnull));
	b->queue = SPI_getbinval(row, rowdesc, 2, &isnull);
	b->worker = SPI_getbinval(row, rowdesc, 3, &b->no_worker);
	b->lease_until = SPI_getbinval(row, rowdesc, 4, &isnull);
	b->open = DatumGetInt32(SPI_getbinval(row, rowdesc, 5, &isnull));
	b->mails = DatumGetArrayTypeP(SPI_getbinval(row, rowdesc, 7, &isnull));
	b->owner = SPI_getbinval(row, rowdesc, 8, &b->no_owner);

	/* the lock read the batch's latest version: is the mail still open in it? */
	deconstruct_array(DatumGetArrayTypeP(SPI_getbinval(row, rowdesc, 6, &isnull)),
					  INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE,
					  &gone_ids, NULL, &ngone);
	for (i = 0; i < ngone; i++)
		if (DatumGetInt64(gone_ids[i]) == id)
			return false;
	return true;
}

/*
 * The record of the claimed mail id in the batch b, deformed into r:
 * false when the batch holds none.
 */
static bool
claim_record_find(ClaimBatch *b, int64 id, ClaimRecord *r)
{
	Datum	   *records;
	int			nrecords;
	HeapTupleData rec;
	bool		isnull;
	int			i;

	r->type = ARR_ELEMTYPE(b->mails);
	r->desc = lookup_rowtype_tupdesc_copy(r->type, -1);
	r->id_att = SPI_fnumber(r->desc, "id");
	r->queue_att = SPI_fnumber(r->desc, "queue");
	r->priority_att = SPI_fnumber(r->desc, "priority");
	r->send_at_att = SPI_fnumber(r->desc, "send_at");
	r->key_att = SPI_fnumber(r->desc, "dedupe_key");
	if (r->id_att <= 0 || r->queue_att <= 0 || r->priority_att <= 0 ||
		r->send_at_att <= 0 || r->key_att <= 0)
		elog(ERROR, "type gatekeeper.mail_live lacks a column of a claim");
	deconstruct_array(b->mails, r->type, -1, false, TYPALIGN_DOUBLE,
					  &records, NULL, &nrecords);
	r->values = palloc(r->desc->natts * sizeof(Datum));
	r->nulls = palloc(r->desc->natts * sizeof(bool));
	r->pos = -1;
	for (i = 0; i < nrecords && r->pos < 0; i++)
	{
		rec.t_data = DatumGetHeapTupleHeader(records[i]);
		rec.t_len = HeapTupleHeaderGetDatumLength(rec.t_data);
		ItemPointerSetInvalid(&rec.t_self);
		rec.t_tableOid = InvalidOid;
		if (DatumGetInt64(heap_getattr(&rec, r->id_att, r->desc, &isnull)) == id)
		{
			r->pos = i;
			heap_deform_tuple(&rec, r->desc, r->values, r->nulls);
		}
	}
	return r->pos >= 0;
}

/*
 * The dedupe keys of the claimed mail new, whose record held old_key in
 * old_queue (0 for none): a new key is refused when a scheduled mail
 * holds it (mail_dedupe) and taken into mail_key (which refuses it when
 * an unfinished mail holds it); the old one is given up.
 */
static void
sync_claimed_keys(SyncedMail *new, Datum old_queue, Datum old_key)
{
	bool		same = text_equal(new->queue, old_queue) && text_equal(new->dedupe_key, old_key);

	if (new->dedupe_key != (Datum) 0 && !same)
	{
		Oid			types[2] = {TEXTOID, TEXTOID};
		Datum		args[2];

		args[0] = new->queue;
		args[1] = new->dedupe_key;
		refuse_held_key(&sync_key_scheduled_plan, sync_key_scheduled_sql, 2, types, args,
						new, true);
		sync_key_take(new, false);
	}
	if (old_key != (Datum) 0 && !same)
		sync_key_release(new->id, old_queue, old_key);
}

/*
 * Write the claimed mail new's record (of type record_type, at pos in
 * the batch b): rewritten in its batch when the queue stays or the batch
 * moves with its one open mail; else the mail leaves the batch (which
 * goes when nothing stays open in it) for a batch of its own in the new
 * queue, with the same lease, worker and owner.
 */
static void
sync_claimed_write(SyncedMail *new, ClaimBatch *b, Oid record_type, int pos, Datum record)
{
	Oid			types[6];
	Datum		args[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};

	/* the plans taking a record: afresh after the extension was made again */
	if (record_plans_type != record_type)
	{
		SPIPlanPtr *plans[] = {&sync_claim_rewrite_plan, &sync_claim_alone_plan};
		int			i;

		for (i = 0; i < (int) lengthof(plans); i++)
		{
			if (*plans[i] != NULL)
				SPI_freeplan(*plans[i]);
			*plans[i] = NULL;
		}
		record_plans_type = record_type;
	}

	if (text_equal(new->queue, b->queue) || b->open == 1)
	{
		/* the batch moves with its one open mail */
		types[0] = INT8OID;
		types[1] = TEXTOID;
		types[2] = INT4OID;
		types[3] = record_type;
		args[0] = Int64GetDatum(b->batch);
		args[1] = new->queue;
		args[2] = Int32GetDatum(ARR_LBOUND(b->mails)[0] + pos);
		args[3] = record;
		if (gatekeeper_execute_kept(&sync_claim_rewrite_plan, sync_claim_rewrite_sql, 4, types,
									args, NULL, false) != SPI_OK_UPDATE)
			elog(ERROR, "could not rewrite a claimed mail's record");
		return;
	}

	types[0] = INT8OID;
	args[0] = Int64GetDatum(b->batch);
	if (b->open <= 1)
	{
		if (gatekeeper_execute_kept(&sync_claim_drop_plan, sync_claim_drop_sql, 1, types, args,
									NULL, false) != SPI_OK_DELETE)
			elog(ERROR, "could not delete a batch of claimed mail");
	}
	else
	{
		types[1] = INT8OID;
		args[1] = Int64GetDatum(new->id);
		if (gatekeeper_execute_kept(&sync_claim_leave_plan, sync_claim_leave_sql, 2, types,
									args, NULL, false) != SPI_OK_UPDATE)
			elog(ERROR, "could not take a claimed mail out of its batch");
	}
	types[0] = TEXTOID;
	types[1] = TEXTOID;
	types[2] = TIMESTAMPTZOID;
	types[3] = INT8OID;
	types[4] = record_type;
	types[5] = OIDOID;
	args[0] = new->queue;
	args[1] = b->worker;
	nulls[1] = b->no_worker ? 'n' : ' ';
	args[2] = b->lease_until;
	args[3] = Int64GetDatum(new->id);
	args[4] = record;
	args[5] = b->owner;
	nulls[5] = b->no_owner ? 'n' : ' ';
	if (gatekeeper_execute_kept(&sync_claim_alone_plan, sync_claim_alone_sql, 6, types, args,
								nulls, false) != SPI_OK_INSERT)
		elog(ERROR, "could not write a batch of claimed mail");
}

/*
 * The claimed mail new (its send_at moved if send_at_changed): its record
 * rewritten in the batch it is open in, under the batch's lock; one moved
 * to another queue leaves its batch for a batch of its own in the new
 * queue, with the same lease, worker and owner (unless it is the batch's one
 * open mail: the batch moves), so that the batches' queues stay the ones
 * queue_stats and drop_queue count.  A new dedupe key is written into
 * mail_key (23505 if an unfinished mail holds it).  Returns false when
 * the mail is open in no batch (it left while this waited for the lock).
 */
static bool
sync_claimed(SyncedMail *new, bool send_at_changed)
{
	ClaimBatch	b;
	ClaimRecord r;
	Datum		old_queue;
	Datum		old_key;
	Datum		record;

	if (!claim_batch_lock(new->id, &b))
		return false;
	if (!claim_record_find(&b, new->id, &r))
		return false;
	old_queue = r.values[r.queue_att - 1];
	old_key = r.nulls[r.key_att - 1] ? (Datum) 0 : r.values[r.key_att - 1];
	sync_claimed_keys(new, old_queue, old_key);

	/* the record as the mail is now */
	r.values[r.queue_att - 1] = new->queue;
	r.values[r.priority_att - 1] = Int32GetDatum(new->priority);
	r.values[r.key_att - 1] = new->dedupe_key;
	r.nulls[r.key_att - 1] = (new->dedupe_key == (Datum) 0);
	if (send_at_changed)
		r.values[r.send_at_att - 1] = TimestampTzGetDatum(new->send_at);
	record = HeapTupleGetDatum(heap_form_tuple(r.desc, r.values, r.nulls));

	sync_claimed_write(new, &b, r.type, r.pos, record);
	return true;
}

/*
 * After an UPDATE of a mail's queue, priority, send_at or dedupe key (by
 * its owner): the change reaches its live row, the record of the batch it
 * is claimed in, or its outcome.  A scheduled mail's new dedupe key is
 * refused by mail_dedupe when another scheduled mail holds it, and by
 * mail_key when a claimed mail, or one finished within its queue's
 * dedupe_window, holds it; the mail takes the key's row, so that it holds
 * the key once claimed and finished too.
 */
static void
sync_update(TriggerData *trigdata)
{
	TupleDesc	desc = RelationGetDescr(trigdata->tg_relation);
	SyncedMail	old;
	SyncedMail	new;
	bool		send_at_changed;
	Oid			types[5] = {INT8OID, TEXTOID, INT4OID, TEXTOID, TIMESTAMPTZOID};
	Datum		args[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};

	synced_mail(desc, trigdata->tg_trigtuple, &old);
	synced_mail(desc, trigdata->tg_newtuple, &new);
	send_at_changed = (old.send_at != new.send_at);

	args[0] = Int64GetDatum(new.id);
	args[1] = new.queue;
	args[2] = Int32GetDatum(new.priority);
	args[3] = new.dedupe_key;
	nulls[3] = new.dedupe_key == (Datum) 0 ? 'n' : ' ';
	args[4] = TimestampTzGetDatum(new.send_at);
	nulls[4] = send_at_changed ? ' ' : 'n';
	{
		Datum		id = Int64GetDatum(new.id);

		mail_runs_to_live(&id, 1);
	}
	if (gatekeeper_execute_kept(&sync_live_plan, sync_live_sql, 5, types, args, nulls,
								false) != SPI_OK_UPDATE)
		elog(ERROR, "could not update a mail's live row");
	if (SPI_processed == 0)
	{
		/* claimed, or it left its batch while this waited: its live row */
		if (!sync_claimed(&new, send_at_changed) &&
			gatekeeper_execute_kept(&sync_live_plan, sync_live_sql, 5, types, args, nulls,
									false) != SPI_OK_UPDATE)
			elog(ERROR, "could not update a mail's live row");
	}
	else if (new.dedupe_key != (Datum) 0 &&
			 !(text_equal(new.queue, old.queue) && text_equal(new.dedupe_key, old.dedupe_key)))
	{
		sync_key_take(&new, true);
		if (old.dedupe_key != (Datum) 0)
			sync_key_release(new.id, old.queue, old.dedupe_key);
	}

	types[0] = INT8OID;
	types[1] = TEXTOID;
	types[2] = TEXTOID;
	types[3] = INT2OID;
	args[0] = Int64GetDatum(new.id);
	args[1] = new.queue;
	args[2] = new.dedupe_key;
	nulls[1] = ' ';
	nulls[2] = new.dedupe_key == (Datum) 0 ? 'n' : ' ';
	nulls[3] = ' ';
	args[3] = Int16GetDatum(new.segment);
	if (gatekeeper_execute_kept(&sync_done_plan, sync_done_sql, 4, types, args, nulls,
								false) != SPI_OK_UPDATE)
		elog(ERROR, "could not update a mail's outcome");
}

/*
 * _mail_sync() RETURNS trigger
 *		An application's UPDATE (per row) or DELETE (per statement, with
 *		the old rows as old_mail) of gatekeeper.mail, carried into
 *		mail_live, mail_claim, mail_key and mail_done.
 */
Datum
gatekeeper_mail_sync(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_AFTER(trigdata->tg_event))
		elog(ERROR, "gatekeeper._mail_sync must be an AFTER trigger");
	gatekeeper_require_schema();

	SPI_connect();
	if (TRIGGER_FIRED_BY_DELETE(trigdata->tg_event) &&
		TRIGGER_FIRED_FOR_STATEMENT(trigdata->tg_event))
		sync_delete(trigdata);
	else if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) &&
			 TRIGGER_FIRED_FOR_ROW(trigdata->tg_event))
		sync_update(trigdata);
	else
		elog(ERROR, "gatekeeper._mail_sync fires after a DELETE statement or an UPDATE of a row");
	SPI_finish();

	return PointerGetDatum(NULL);
}
