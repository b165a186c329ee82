/*-------------------------------------------------------------------------
 *
 * mail_state.c
 *		The transitions of a claimed mail: taken out of its batch, and
 *		acked (sent), nacked (retried or failed), handed back uncharged
 *		(unclaim), or its lease extended.
 *
 * A claim (src/claim.c) moves the mails it hands out from mail_live into
 * batch rows of gatekeeper.mail_claim, as mail_live records; everything
 * that becomes of a claimed mail afterwards starts here, by taking its
 * record out of its batch, fenced by (id, attempt) (take_claimed), and
 * writing the record where the mail now belongs:
 *
 *     mail_live (scheduled) <--------------------------------+
 *         |                                                  |
 *         | claim                      nack, a retry: due    |
 *         v                            after a backoff;      |
 *     mail_claim (claimed) ----------- unclaim, uncharged ---+
 *         |      \
 *         |       +-- extend: a later lease for its batch row
 *         |           (never a shorter one)
 *         | ack; nack, permanent or out of attempts
 *         v
 *     mail_done (sent, failed)
 *
 * The SQL functions ack, ack_batch, nack, nack_batch, unclaim, extend and
 * _take_claimed are thin entry points into the functions here
 * (src/mail_state_funcs.c); the
 * background worker (src/worker.c) calls the functions themselves, with
 * a round's outcomes in one call each.  Each statement is kept as one
 * plan named for it; the tables' column lists are mail_state.h's.  A
 * nack's decisions (retry or fail, its events, a bounce, the gate passes
 * given back) are src/mail/mail_nack.c's, over the functions here.  Reaping,
 * cancelling, rotation and the owner's changes to a claimed mail are not
 * here (src/mail_state_sweep.c).
 *
 * A claim belongs to its claimer (issue 44): its batch row's owner is the
 * role that claimed it, or CLAIM_OWNER_BACKGROUND for a background
 * worker's claim.  ack, nack, unclaim and extend of a current claim
 * whose owner is not the caller are refused with 42501, the whole call
 * with them (the error undoes whatever it wrote); a superuser may act on
 * another role's claim, but no SQL caller on a background worker's, which
 * only that worker's own calls change.  The check is one comparison with
 * a column of the batch row these functions read anyway.  A claim that
 * is not current (acked, reaped, claimed again) stays a stale fencing
 * token: false, not an error, whoever asks.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/pg_am.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/itemptr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgrprotos.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rangetypes.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"

#include "catalog.h"
#include "gatekeeper.h"
#include "keep_freed.h"
#include "mail_exec.h"
#include "mail_state.h"
#include "done_writer.h"
#include "wake.h"

/* Records, written where a transition puts them. */
static const char live_insert_sql[] =
"INSERT INTO gatekeeper.mail_live (" MAIL_LIVE_COLUMNS ") "
"SELECT " MAIL_LIVE_COLUMNS " FROM unnest($1)";

static const char done_insert_sql[] =
"INSERT INTO gatekeeper.mail_done (" MAIL_DONE_COLUMNS ", finished_at) "
"SELECT " MAIL_DONE_COLUMNS ", now() FROM unnest($1)";

/*
 * take_claimed's statements, where it does not work past the executor
 * (mail_state_take_claimed).  The batches that may hold the ids are read
 * unlocked, then only those that do are locked, in batch order: batches
 * of other claims whose id ranges overlap are left alone, so acks of
 * different claims never wait for each other.
 */
static const char claim_candidates_sql[] =
"SELECT c.batch, c.ctid, c.xmin, c.mails, c.owner FROM gatekeeper.mail_claim c "
" WHERE int8range(c.lo, c.hi, '[]') && int8range($1, $2, '[]')";

static const char claim_lock_sql[] =
"SELECT c.batch, c.open, c.gone, c.ctid, c.xmin FROM gatekeeper.mail_claim c "
" WHERE c.batch = ANY ($1) "
" ORDER BY c.batch "
"   FOR UPDATE";

static const char claim_drop_sql[] =
"DELETE FROM gatekeeper.mail_claim WHERE batch = ANY ($1)";

/* mails is left as it is: its TOASTed value is not written again */
static const char claim_shrink_sql[] =
"UPDATE gatekeeper.mail_claim SET open = open - $2, gone = gone || $3 "
" WHERE batch = $1";

/* the policies of the queues a nack or an unclaim touches */
static const char queue_policy_sql[] =
"SELECT q.name, q.max_attempts, q.notify, q.retry_for FROM gatekeeper.queue q "
" WHERE q.name = ANY ($1)";

/* extend of one claim: the batch row it is still open in, locked */
static const char extend_find_sql[] =
"SELECT c.batch, c.lease_until, c.owner FROM gatekeeper.mail_claim c "
" WHERE int8range(c.lo, c.hi, '[]') @> $1 AND NOT $1 = ANY (c.gone) "
"   AND EXISTS (SELECT FROM unnest(c.mails) r WHERE r.id = $1 AND r.attempt = $2) "
"   FOR UPDATE OF c";

/*
 * extend of many claims: the batch rows they are still open in, locked in
 * batch order, with the ids of the claims each holds (for the recheck of
 * a row changed meanwhile, the lock evaluates both on its new version).
 */
static const char extend_lock_sql[] =
"SELECT c.batch, c.owner, ARRAY(SELECT r.id FROM unnest(c.mails) r "
"                       JOIN unnest($1::bigint[], $2::int[]) w(id, attempt) "
"                         ON w.id = r.id AND w.attempt = r.attempt "
"                      WHERE NOT r.id = ANY (c.gone)) "
"  FROM gatekeeper.mail_claim c "
" WHERE int8range(c.lo, c.hi, '[]') && int8range($3, $4, '[]') "
"   AND EXISTS (SELECT FROM unnest(c.mails) r "
"                 JOIN unnest($1::bigint[], $2::int[]) w(id, attempt) "
"                   ON w.id = r.id AND w.attempt = r.attempt "
"                WHERE NOT r.id = ANY (c.gone)) "
" ORDER BY c.batch "
"   FOR UPDATE OF c";

/* a lease is the batch row's; a row never gets a shorter one this way */
static const char extend_batches_sql[] =
"UPDATE gatekeeper.mail_claim SET lease_until = greatest(lease_until, $2) "
" WHERE batch = ANY ($1)";

/* extend of one claim: the lease of its batch row, when that is later */
static const char extend_batch_sql[] =
"UPDATE gatekeeper.mail_claim SET lease_until = $2 WHERE batch = $1";

static SPIPlanPtr live_insert_plan = NULL;
static SPIPlanPtr done_insert_plan = NULL;
static SPIPlanPtr claim_candidates_plan = NULL;
static SPIPlanPtr claim_lock_plan = NULL;
static SPIPlanPtr claim_drop_plan = NULL;
static SPIPlanPtr claim_shrink_plan = NULL;
static SPIPlanPtr queue_policy_plan = NULL;
static SPIPlanPtr extend_find_plan = NULL;
static SPIPlanPtr extend_lock_plan = NULL;
static SPIPlanPtr extend_batch_plan = NULL;
static SPIPlanPtr extend_batches_plan = NULL;

/* the mail_live[] type the plans taking records were prepared for */
static Oid	record_plans_type = InvalidOid;

/* A claim (id, attempt) asked to be taken out of its batch. */
typedef struct TakeRequest
{
	int64		id;
	int32		attempt;
	bool		retry;			/* read in a batch that changed before the lock */
	bool		done;			/* taken */
} TakeRequest;

/* A record of a batch that may be taken. */
typedef struct BatchEntry
{
	int64		id;
	int32		attempt;
	int			batch;			/* index into the batches read */
	int			req;			/* index of the request naming it */
	Datum		record;
} BatchEntry;

/* A batch holding some of the claims asked for. */
typedef struct TakeBatch
{
	int64		batch;
	ItemPointerData ctid;		/* the row version read unlocked */
	TransactionId xmin;			/* its xmin (read by the statement) */
	bool		locked;			/* locked, and still that version */
	Oid			owner;			/* who claimed it: see mail_state.h */
	bool		owner_null;		/* claimed before owners were kept */
	int32		open;
	int64	   *gone;			/* sorted */
	int			ngone;
	Datum	   *taken;			/* ids taken now */
	int			ntaken;
} TakeBatch;

/*
 * The caller of a transition, as a claim's owner is checked against it:
 * mail_state_claimant(), and whether that role is a superuser (looked up
 * once, when a claim of another owner is met).
 */
typedef struct Claimant
{
	Oid			role;
	int			superuser;		/* -1: not looked up yet */
} Claimant;

/* mail_claim's columns a take reads, by name */
static const char *const claim_columns[] = {
	"batch", "lo", "hi", "open", "gone", "mails", "owner"
};
enum
{
	K_BATCH, K_LO, K_HI, K_OPEN, K_GONE, K_MAILS, K_OWNER, K_NUM
};

/*
 * mail_claim as one round of a take reads, locks and writes it past the
 * executor (take_round): the table and its index by id range, open; where
 * its columns are; the round's snapshot and command, taken as a statement
 * takes them; whether its writes may be made directly (no trigger of the
 * user's fires on them), and the executor state of the batches that
 * shrink, opened at the first.
 */
typedef struct ClaimTable
{
	Relation	rel;
	Relation	ids;			/* mail_claim_ids */
	AttrNumber	att[K_NUM];
	Snapshot	snapshot;
	CommandId	cid;
	TupleTableSlot *slot;
	bool		direct_writes;
	MailExec	x;
	TupleTableSlot *shrunk;
} ClaimTable;

static bool claim_table_open(ClaimTable *ct);
static void claim_table_close(ClaimTable *ct);
static void add_entries(ArrayType *mails, int batch, TakeRequest *reqs, int nreqs,
						LiveRecord *lr, BatchEntry **entries, int *nentries, int *maxentries);
static TakeBatch *read_candidates(TakeRequest *reqs, int nreqs, LiveRecord *lr,
								  int *nbatches, BatchEntry **entries, int *nentries);
static TakeBatch *read_candidates_direct(ClaimTable *ct, TakeRequest *reqs, int nreqs,
										 LiveRecord *lr, int *nbatches,
										 BatchEntry **entries, int *nentries);
static int	match_requests(BatchEntry *entries, int nentries, TakeRequest *reqs, int nreqs,
						   TakeBatch *batches);
static TakeBatch *sort_batches(TakeBatch *batches, int nbatches, BatchEntry *entries,
							   int nentries);
static void batch_locked(TakeBatch *b, Datum open, Datum gone);
static TakeBatch *lock_batches(TakeBatch *batches, int nbatches, BatchEntry *entries,
							   int nentries, Datum *drop, int *nlocked);
static void lock_batches_direct(ClaimTable *ct, TakeBatch *sorted, int nbatches,
								int *nlocked);
static void claimant_init(Claimant *me);
static bool owner_permits(Claimant *me, Oid owner, bool owner_null);
static void check_owner(Claimant *me, Oid owner, bool owner_null, int64 id, int32 attempt);
static void take_entries(BatchEntry *entries, int nentries, TakeRequest *reqs,
						 TakeBatch *batches, Datum *taken, int *ntaken, MemoryContext keep,
						 Claimant *me);
static void write_batches(TakeBatch *batches, int nbatches, Datum *drop);
static void write_batches_direct(ClaimTable *ct, TakeBatch *batches, int nbatches);
static void take_round(TakeRequest *reqs, int nreqs, Datum *taken, int *ntaken,
					   LiveRecord *lr, MemoryContext keep, Claimant *me);
static Datum *take_claimed(const int64 *ids, const int32 *attempts, int n, int *ntaken,
						   LiveRecord *lr, MemoryContext keep, Claimant *me);
static void execute_with_records(SPIPlanPtr *plan, const char *sql, LiveRecord *lr,
								 Datum *records, int n, int expect, const char *what);

/* requests in claim order */
static int
take_request_cmp(const void *a, const void *b)
{
	const TakeRequest *x = a;
	const TakeRequest *y = b;

	return mail_state_claim_cmp(x->id, x->attempt, y->id, y->attempt);
}

/* records of the same claim in batch order */
static int
batch_entry_cmp(const void *a, const void *b)
{
	const BatchEntry *x = a;
	const BatchEntry *y = b;
	int			c = mail_state_claim_cmp(x->id, x->attempt, y->id, y->attempt);

	if (c != 0)
		return c;
	return (x->batch > y->batch) - (x->batch < y->batch);
}

/*
 * mail_state_id_cmp
 *		Mail ids (int64s) in ascending order, for qsort and bsearch here and
 *		in src/mail_state_sweep.c.
 */
int
mail_state_id_cmp(const void *a, const void *b)
{
	int64		x = *(const int64 *) a;
	int64		y = *(const int64 *) b;

	return (x > y) - (x < y);
}

/* batches by their id */
static int
take_batch_cmp(const void *a, const void *b)
{
	return mail_state_id_cmp(&((const TakeBatch *) a)->batch, &((const TakeBatch *) b)->batch);
}

/* queue policies by name, in byte order */
static int
policy_cmp(const void *a, const void *b)
{
	return strcmp(((const QueuePolicy *) a)->name, ((const QueuePolicy *) b)->name);
}

/*
 * mail_state_record_init
 *		Look up gatekeeper.mail_live's row type (that of the records the
 *		claim statement returns, or a batch holds) and the attributes and
 *		states the transitions use.
 */
void
mail_state_record_init(LiveRecord *lr, Oid type)
{
	int			i;

	memset(lr, 0, sizeof(*lr));
	lr->type = type;
	lr->arraytype = get_array_type(type);
	lr->desc = lookup_rowtype_tupdesc_copy(type, -1);
	for (i = 0; i < lr->desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(lr->desc, i);
		const char *name = NameStr(att->attname);

		if (att->attisdropped)
			continue;
		if (strcmp(name, "id") == 0)
			lr->id = att->attnum;
		else if (strcmp(name, "queue") == 0)
			lr->queue = att->attnum;
		else if (strcmp(name, "send_at") == 0)
			lr->send_at = att->attnum;
		else if (strcmp(name, "state") == 0)
		{
			lr->state = att->attnum;
			lr->state_type = att->atttypid;
		}
		else if (strcmp(name, "attempt") == 0)
			lr->attempt = att->attnum;
		else if (strcmp(name, "uncharged") == 0)
			lr->uncharged = att->attnum;
		else if (strcmp(name, "worker") == 0)
			lr->worker = att->attnum;
		else if (strcmp(name, "last_error") == 0)
			lr->last_error = att->attnum;
		else if (strcmp(name, "segment") == 0)
			lr->segment = att->attnum;
	}
	if (lr->id == 0 || lr->queue == 0 || lr->send_at == 0 || lr->state == 0 ||
		lr->attempt == 0 || lr->uncharged == 0 || lr->worker == 0 ||
		lr->last_error == 0 || lr->segment == 0 || !OidIsValid(lr->arraytype))
		elog(ERROR, "type gatekeeper.mail_live lacks a column of a claim");
	lr->scheduled = DirectFunctionCall2(enum_in, CStringGetDatum("scheduled"),
										ObjectIdGetDatum(lr->state_type));
	lr->sent = DirectFunctionCall2(enum_in, CStringGetDatum("sent"),
								   ObjectIdGetDatum(lr->state_type));
	lr->failed = DirectFunctionCall2(enum_in, CStringGetDatum("failed"),
									 ObjectIdGetDatum(lr->state_type));

	/*
	 * The plans that take an array of records were prepared for the type
	 * of their time: after the extension was dropped and made again in
	 * this backend, prepare them afresh.
	 */
	if (record_plans_type != lr->arraytype)
	{
		SPIPlanPtr *plans[] = {&live_insert_plan, &done_insert_plan};

		for (i = 0; i < (int) lengthof(plans); i++)
		{
			if (*plans[i] != NULL)
				SPI_freeplan(*plans[i]);
			*plans[i] = NULL;
		}
		record_plans_type = lr->arraytype;
	}
}

/*
 * mail_state_record_moved
 *		A record with the values a transition gives it: state; last_error
 *		(error, NULL allowed) when set_error; send_at when not 0; and one
 *		more uncharged claim when uncharged.
 */
Datum
mail_state_record_moved(LiveRecord *lr, Datum record, Datum state, bool set_error,
						const char *error, TimestampTz send_at, bool uncharged)
{
	int			natts = lr->desc->natts;
	Datum	   *values = palloc(natts * sizeof(Datum));
	bool	   *nulls = palloc(natts * sizeof(bool));

	mail_state_record_deform(lr, record, values, nulls);
	values[lr->state - 1] = state;
	if (set_error)
	{
		values[lr->last_error - 1] = error ? CStringGetTextDatum(error) : (Datum) 0;
		nulls[lr->last_error - 1] = error == NULL;
	}
	if (send_at != 0)
		values[lr->send_at - 1] = TimestampTzGetDatum(send_at);
	if (uncharged)
		values[lr->uncharged - 1] = Int32GetDatum(DatumGetInt32(values[lr->uncharged - 1]) + 1);
	return HeapTupleGetDatum(heap_form_tuple(lr->desc, values, nulls));
}

/* Run a statement whose only argument is an array of mail_live records. */
static void
execute_with_records(SPIPlanPtr *plan, const char *sql, LiveRecord *lr,
					 Datum *records, int n, int expect, const char *what)
{
	Datum		arg;

	gatekeeper_plan(plan, sql, 1, &lr->arraytype);
	arg = gatekeeper_array(records, NULL, n, lr->type);
	if (gatekeeper_execute_by_key(*plan, &arg, NULL, false, 0) != expect ||
		SPI_processed != (uint64) n)
		elog(ERROR, "could not record %s", what);
}

/*
 * mail_state_insert_live
 *		Write n records into mail_live, as they are.
 */
void
mail_state_insert_live(LiveRecord *lr, Datum *records, int n)
{
	if (n > 0)
		execute_with_records(&live_insert_plan, live_insert_sql, lr, records, n,
							 SPI_OK_INSERT, "mail due again");
}

/*
 * mail_state_insert_done
 *		Write n records into mail_done, in the state each holds, finished
 *		now.
 */
void
mail_state_insert_done(LiveRecord *lr, Datum *records, int n)
{
	/* past the executor (src/done_writer.c), or else by the statement */
	if (n > 0 && !gatekeeper_done_write(lr, records, n))
		execute_with_records(&done_insert_plan, done_insert_sql, lr, records, n,
							 SPI_OK_INSERT, "finished mail");
}

/*
 * Open mail_claim for a round of a take, as a statement would start: a
 * new command, and under READ COMMITTED a new snapshot.  False, with
 * nothing open, when the table is not as 0.3.0 makes it (its index by id
 * range gone or of another kind, a column gone or of another type, a
 * table access method other than heap): the statements then do the round.
 */
static bool
claim_table_open(ClaimTable *ct)
{
	static const Oid types[K_NUM] = {INT8OID, INT8OID, INT8OID, INT4OID, INT8ARRAYOID,
	InvalidOid, OIDOID};
	Oid			ids_relid = gatekeeper_relid(GATEKEEPER_REL_MAIL_CLAIM_IDS, true);
	TupleDesc	desc;
	bool		plain;
	uint32		found;
	int			k;

	memset(ct, 0, sizeof(*ct));
	if (!OidIsValid(ids_relid))
		return false;
	ct->rel = table_open(gatekeeper_relid(GATEKEEPER_REL_MAIL_CLAIM, false), RowExclusiveLock);
	ct->ids = index_open(ids_relid, RowExclusiveLock);
	desc = RelationGetDescr(ct->rel);
	plain = ct->rel->rd_rel->relam == HEAP_TABLE_AM_OID &&
		ct->ids->rd_rel->relam == GIST_AM_OID &&
		ct->ids->rd_index->indrelid == RelationGetRelid(ct->rel) &&
		ct->ids->rd_index->indisvalid && ct->ids->rd_index->indnatts == 1;
	for (k = 0; plain && k < K_NUM; k++)
	{
		ct->att[k] = SPI_fnumber(desc, claim_columns[k]);
		plain = ct->att[k] > 0 &&
			(types[k] == InvalidOid ||
			 TupleDescAttr(desc, ct->att[k] - 1)->atttypid == types[k]);
	}
	if (!plain)
	{
		index_close(ct->ids, NoLock);
		table_close(ct->rel, NoLock);
		return false;
	}
	ct->direct_writes =
		gatekeeper_triggers_only(ct->rel, TRIGGER_TYPE_DELETE, NULL, 0, &found) &&
		gatekeeper_triggers_only(ct->rel, TRIGGER_TYPE_UPDATE, NULL, 0, &found);
	CommandCounterIncrement();
	ct->snapshot = RegisterSnapshot(GetTransactionSnapshot());
	ct->cid = GetCurrentCommandId(true);
	/* a copy: under REPEATABLE READ the transaction's, brought to this command */
	ct->snapshot->curcid = ct->cid;
	ct->slot = table_slot_create(ct->rel, NULL);
	return true;
}

/* Close what claim_table_open opened; later commands see the writes. */
static void
claim_table_close(ClaimTable *ct)
{
	if (ct->shrunk != NULL)
	{
		ExecDropSingleTupleTableSlot(ct->shrunk);
		mail_exec_close(&ct->x);
	}
	ExecDropSingleTupleTableSlot(ct->slot);
	UnregisterSnapshot(ct->snapshot);
	index_close(ct->ids, NoLock);
	table_close(ct->rel, NoLock);
	CommandCounterIncrement();
}

/*
 * Append the records of a batch (mails, the batch's array of records; the
 * batch-th read) whose ids lie in the range of reqs[0 .. nreqs - 1] to
 * *entries, growing it (*maxentries).
 */
static void
add_entries(ArrayType *mails, int batch, TakeRequest *reqs, int nreqs, LiveRecord *lr,
			BatchEntry **entries, int *nentries, int *maxentries)
{
	Datum	   *records;
	int			nrecords;
	int16		typlen;
	bool		typbyval;
	char		typalign;
	int			i;

	if (!OidIsValid(lr->type))
		mail_state_record_init(lr, ARR_ELEMTYPE(mails));
	get_typlenbyvalalign(ARR_ELEMTYPE(mails), &typlen, &typbyval, &typalign);
	deconstruct_array(mails, ARR_ELEMTYPE(mails), typlen, typbyval, typalign,
					  &records, NULL, &nrecords);
	for (i = 0; i < nrecords; i++)
	{
		int64		id = DatumGetInt64(mail_state_record_get(lr, records[i], lr->id));
		BatchEntry *e;

		if (id < reqs[0].id || id > reqs[nreqs - 1].id)
			continue;
		if (*nentries == *maxentries)
		{
			*maxentries = Max(*maxentries * 2, 1024);
			*entries = *entries ? repalloc_huge(*entries, *maxentries * sizeof(BatchEntry))
				: palloc(*maxentries * sizeof(BatchEntry));
		}
		e = &(*entries)[(*nentries)++];
		e->id = id;
		e->attempt = DatumGetInt32(mail_state_record_get(lr, records[i], lr->attempt));
		e->batch = batch;
		e->record = records[i];
	}
}

/*
 * The batches whose id range meets that of reqs[0 .. nreqs - 1], read
 * unlocked, and their records in that range as entries (*entries,
 * *nentries), in claim order.  Returns the batches (*nbatches of them),
 * or NULL when none holds a record in the range.  By the statement.
 */
static TakeBatch *
read_candidates(TakeRequest *reqs, int nreqs, LiveRecord *lr, int *nbatches,
				BatchEntry **entries, int *nentries)
{
	int			maxentries = 0;
	TakeBatch  *batches;
	Datum		args[2];
	uint64		row;

	*nbatches = 0;
	*entries = NULL;
	*nentries = 0;
	if (claim_candidates_plan == NULL)
	{
		Oid			types[2] = {INT8OID, INT8OID};

		gatekeeper_plan(&claim_candidates_plan, claim_candidates_sql, 2, types);
	}
	args[0] = Int64GetDatum(reqs[0].id);
	args[1] = Int64GetDatum(reqs[nreqs - 1].id);
	if (gatekeeper_execute_by_key(claim_candidates_plan, args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read claimed mail");
	if (SPI_processed == 0)
		return NULL;
	batches = palloc0(SPI_processed * sizeof(TakeBatch));
	for (row = 0; row < SPI_processed; row++)
	{
		HeapTuple	tup = SPI_tuptable->vals[row];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;

		batches[row].batch = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
		batches[row].ctid = *(ItemPointer) DatumGetPointer(SPI_getbinval(tup, desc, 2, &isnull));
		batches[row].xmin = DatumGetTransactionId(SPI_getbinval(tup, desc, 3, &isnull));
		batches[row].owner = DatumGetObjectId(SPI_getbinval(tup, desc, 5,
															&batches[row].owner_null));
		add_entries(DatumGetArrayTypeP(SPI_getbinval(tup, desc, 4, &isnull)), (int) row,
					reqs, nreqs, lr, entries, nentries, &maxentries);
	}
	*nbatches = (int) SPI_processed;
	if (*nentries == 0)
		return NULL;
	qsort(*entries, *nentries, sizeof(BatchEntry), batch_entry_cmp);
	return batches;
}

/*
 * read_candidates past the executor: the batches found by mail_claim_ids,
 * as the statement finds them, under the round's snapshot.
 */
static TakeBatch *
read_candidates_direct(ClaimTable *ct, TakeRequest *reqs, int nreqs, LiveRecord *lr,
					   int *nbatches, BatchEntry **entries, int *nentries)
{
	TypeCacheEntry *range_type = lookup_type_cache(INT8RANGEOID, TYPECACHE_RANGE_INFO);
	RangeBound	lower = {Int64GetDatum(reqs[0].id), false, true, true};
	RangeBound	upper = {Int64GetDatum(reqs[nreqs - 1].id), false, true, false};
	TupleTableSlot *slot = ct->slot;
	IndexScanDesc scan;
	ScanKeyData key;
	TakeBatch  *batches = NULL;
	int			maxbatches = 0;
	int			maxentries = 0;

	*nbatches = 0;
	*entries = NULL;
	*nentries = 0;
	/* int8range(c.lo, c.hi, '[]') && int8range(first id, last id, '[]') */
	ScanKeyInit(&key, 1, RANGESTRAT_OVERLAPS, F_RANGE_OVERLAPS,
				RangeTypePGetDatum(make_range(range_type, &lower, &upper, false)));
	scan = index_beginscan(ct->rel, ct->ids, ct->snapshot, 1, 0);
	index_rescan(scan, &key, 1, NULL, 0);
	while (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		TakeBatch  *b;
		bool		isnull;

		/* the index's condition, as its recheck would test it */
		if (DatumGetInt64(slot_getattr(slot, ct->att[K_LO], &isnull)) > reqs[nreqs - 1].id ||
			DatumGetInt64(slot_getattr(slot, ct->att[K_HI], &isnull)) < reqs[0].id)
			continue;
		if (*nbatches == maxbatches)
		{
			maxbatches = Max(maxbatches * 2, 8);
			batches = batches ? repalloc(batches, maxbatches * sizeof(TakeBatch))
				: palloc(maxbatches * sizeof(TakeBatch));
		}
		b = &batches[*nbatches];
		memset(b, 0, sizeof(TakeBatch));
		b->batch = DatumGetInt64(slot_getattr(slot, ct->att[K_BATCH], &isnull));
		b->ctid = slot->tts_tid;
		b->owner = DatumGetObjectId(slot_getattr(slot, ct->att[K_OWNER], &b->owner_null));
		/* a copy: the slot moves on */
		add_entries(DatumGetArrayTypePCopy(slot_getattr(slot, ct->att[K_MAILS], &isnull)),
					*nbatches, reqs, nreqs, lr, entries, nentries, &maxentries);
		(*nbatches)++;
	}
	index_endscan(scan);
	if (*nentries == 0)
		return NULL;
	qsort(*entries, *nentries, sizeof(BatchEntry), batch_entry_cmp);
	return batches;
}

/*
 * Merge the entries (in claim order) with the requests: keep those some
 * request names, counting them as candidates of their batches, and drop
 * the rest.  Returns how many are kept.
 */
static int
match_requests(BatchEntry *entries, int nentries, TakeRequest *reqs, int nreqs,
			   TakeBatch *batches)
{
	int			i;
	int			j;

	for (i = 0, j = 0; i < nentries; i++)
	{
		TakeRequest want;
		TakeRequest *hit;

		want.id = entries[i].id;
		want.attempt = entries[i].attempt;
		hit = bsearch(&want, reqs, nreqs, sizeof(TakeRequest), take_request_cmp);
		if (hit == NULL)
			continue;
		entries[i].req = (int) (hit - reqs);
		batches[entries[i].batch].ntaken++;	/* a candidate, for now */
		entries[j++] = entries[i];
	}
	return j;
}

/*
 * The batches sorted by number, in a copy; the entries are pointed at
 * their batches' new places.
 */
static TakeBatch *
sort_batches(TakeBatch *batches, int nbatches, BatchEntry *entries, int nentries)
{
	int		   *place = palloc(nbatches * sizeof(int));
	TakeBatch  *sorted = palloc(nbatches * sizeof(TakeBatch));
	int			i;

	memcpy(sorted, batches, nbatches * sizeof(TakeBatch));
	qsort(sorted, nbatches, sizeof(TakeBatch), take_batch_cmp);
	for (i = 0; i < nbatches; i++)
	{
		TakeBatch  *b = bsearch(&batches[i], sorted, nbatches, sizeof(TakeBatch),
								take_batch_cmp);

		place[i] = (int) (b - sorted);
	}
	for (i = 0; i < nentries; i++)
		entries[i].batch = place[entries[i].batch];
	return sorted;
}

/*
 * Mark a batch locked as the version that was read, with its open count
 * and its gone list (sorted) read under the lock, and room for what is
 * taken of it.
 */
static void
batch_locked(TakeBatch *b, Datum open, Datum gone)
{
	Datum	   *ids;
	int			i;

	b->locked = true;
	b->open = DatumGetInt32(open);
	deconstruct_array(DatumGetArrayTypeP(gone), INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE,
					  &ids, NULL, &b->ngone);
	b->gone = palloc(Max(b->ngone, 1) * sizeof(int64));
	for (i = 0; i < b->ngone; i++)
		b->gone[i] = DatumGetInt64(ids[i]);
	qsort(b->gone, b->ngone, sizeof(int64), mail_state_id_cmp);
	b->taken = palloc(b->ntaken * sizeof(Datum));
	b->ntaken = 0;
}

/*
 * Lock the batches holding candidates, in batch order, by the statement
 * (drop, of room for every batch, is used for their numbers).  Returns the
 * batches sorted by number (sort_batches); those locked as the version
 * that was read are marked locked (batch_locked).  *nlocked is how many.
 */
static TakeBatch *
lock_batches(TakeBatch *batches, int nbatches, BatchEntry *entries, int nentries,
			 Datum *drop, int *nlocked)
{
	int			ndrop = 0;
	Datum		arg;
	TakeBatch  *sorted;
	uint64		row;
	int			i;

	*nlocked = 0;
	for (i = 0; i < nbatches; i++)
		if (batches[i].ntaken > 0)
			drop[ndrop++] = Int64GetDatum(batches[i].batch);
	if (claim_lock_plan == NULL)
	{
		Oid			type = INT8ARRAYOID;

		gatekeeper_plan(&claim_lock_plan, claim_lock_sql, 1, &type);
	}
	arg = gatekeeper_array(drop, NULL, ndrop, INT8OID);
	if (gatekeeper_execute_by_key(claim_lock_plan, &arg, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not lock claimed mail");
	sorted = sort_batches(batches, nbatches, entries, nentries);

	/*
	 * A batch locked as another version than the one read changed in
	 * between (committed: we waited for it): its records may not be those
	 * read, and a claim read in it may have moved to another batch, one
	 * this round's read may not have seen.  It is left for the next round.
	 */
	for (row = 0; row < SPI_processed; row++)
	{
		HeapTuple	tup = SPI_tuptable->vals[row];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		TakeBatch	key;
		TakeBatch  *b;

		key.batch = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
		b = bsearch(&key, sorted, nbatches, sizeof(TakeBatch), take_batch_cmp);
		if (b == NULL)
			elog(ERROR, "locked a batch of claimed mail not asked for");
		if (!ItemPointerEquals(&b->ctid,
							   (ItemPointer) DatumGetPointer(SPI_getbinval(tup, desc, 4, &isnull))) ||
			!TransactionIdEquals(b->xmin,
								 DatumGetTransactionId(SPI_getbinval(tup, desc, 5, &isnull))))
			continue;
		batch_locked(b, SPI_getbinval(tup, desc, 2, &isnull),
					 SPI_getbinval(tup, desc, 3, &isnull));
		(*nlocked)++;
	}
	return sorted;
}

/*
 * lock_batches past the executor, of the batches sorted by number: each
 * one holding candidates is locked as the version that was read, or not
 * at all when that version was updated or deleted meanwhile (we waited for
 * the transaction that did it to commit), which the next round looks at
 * again; under REPEATABLE READ that is a serialization failure, as FOR
 * UPDATE makes it.
 */
static void
lock_batches_direct(ClaimTable *ct, TakeBatch *sorted, int nbatches, int *nlocked)
{
	int			i;

	*nlocked = 0;
	for (i = 0; i < nbatches; i++)
	{
		TakeBatch  *b = &sorted[i];
		TM_FailureData tmfd;
		TM_Result	result;
		bool		isnull;

		if (b->ntaken == 0)
			continue;
		result = table_tuple_lock(ct->rel, &b->ctid, ct->snapshot, ct->slot, ct->cid,
								  LockTupleExclusive, LockWaitBlock, 0, &tmfd);
		if (IsolationUsesXactSnapshot() && (result == TM_Updated || result == TM_Deleted))
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize access due to concurrent %s",
							result == TM_Updated ? "update" : "delete")));
		/* changed since it was read (by this transaction too): the next round */
		if (result == TM_Updated || result == TM_Deleted || result == TM_SelfModified)
			continue;
		if (result != TM_Ok)
			elog(ERROR, "could not lock a batch of claimed mail: %d", (int) result);
		batch_locked(b, slot_getattr(ct->slot, ct->att[K_OPEN], &isnull),
					 slot_getattr(ct->slot, ct->att[K_GONE], &isnull));
		(*nlocked)++;
	}
}

/*
 * mail_state_claimant
 *		Who is acting on claims: CLAIM_OWNER_BACKGROUND in a background
 *		worker, else the role of the session (current_user outside any
 *		SECURITY DEFINER function, such as gatekeeper's own: the role SET
 *		ROLE chose), which a claim records as its owner.
 */
Oid
mail_state_claimant(void)
{
	return gatekeeper_background_claim ? CLAIM_OWNER_BACKGROUND : GetOuterUserId();
}

/* The caller, before any claim is checked against it. */
static void
claimant_init(Claimant *me)
{
	me->role = mail_state_claimant();
	me->superuser = -1;
}

/*
 * May the caller change a claim of this owner?  The owner and a superuser
 * may change a role's claim, no SQL caller a background worker's; anyone
 * a claim made before owners were kept (owner_null).
 */
static bool
owner_permits(Claimant *me, Oid owner, bool owner_null)
{
	if (owner_null || owner == me->role)
		return true;
	if (owner == CLAIM_OWNER_BACKGROUND || me->role == CLAIM_OWNER_BACKGROUND)
		return false;
	if (me->superuser < 0)
		me->superuser = superuser_arg(me->role) ? 1 : 0;
	return me->superuser == 1;
}

/*
 * Refuse (42501) the caller's transition of the current claim (id,
 * attempt) of a batch of another owner (owner_permits).
 */
static void
check_owner(Claimant *me, Oid owner, bool owner_null, int64 id, int32 attempt)
{
	if (owner_permits(me, owner, owner_null))
		return;
	if (owner == CLAIM_OWNER_BACKGROUND)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for the claim of mail %lld, attempt %d",
						(long long) id, attempt),
				 errdetail("It is a background worker's claim, which only that worker reports on.")));
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("permission denied for the claim of mail %lld, attempt %d",
					(long long) id, attempt),
			 errdetail("It belongs to the role that claimed it: only that role, or a superuser, may ack, nack, extend or unclaim it.")));
}

/*
 * Take each claim from the first batch, as read and locked, it is still
 * open in (entries are in claim, then batch order; a mail is open in one
 * batch at most), appending its record to taken (made in keep).  A claim
 * read in a batch that changed or went is marked to be looked for again,
 * unless it was taken here.  With me, a claim of another owner fails the
 * call (check_owner).
 */
static void
take_entries(BatchEntry *entries, int nentries, TakeRequest *reqs, TakeBatch *batches,
			 Datum *taken, int *ntaken, MemoryContext keep, Claimant *me)
{
	int			i;

	for (i = 0; i < nentries; i++)
	{
		BatchEntry *e = &entries[i];
		TakeBatch  *b = &batches[e->batch];
		TakeRequest *r = &reqs[e->req];
		MemoryContext old;

		if (r->done)
			continue;			/* taken from an earlier batch */
		if (!b->locked)
		{
			r->retry = true;
			continue;
		}
		if (bsearch(&e->id, b->gone, b->ngone, sizeof(int64), mail_state_id_cmp) != NULL)
			continue;
		if (me != NULL)
			check_owner(me, b->owner, b->owner_null, e->id, e->attempt);
		b->taken[b->ntaken++] = Int64GetDatum(e->id);
		old = MemoryContextSwitchTo(keep);
		taken[(*ntaken)++] = datumCopy(e->record, false, -1);
		MemoryContextSwitchTo(old);
		r->done = true;
	}
}

/*
 * Write what was taken of the locked batches: those left with no open
 * mail are deleted (drop, of room for every batch, holds their numbers),
 * the others shrink.
 */
static void
write_batches(TakeBatch *batches, int nbatches, Datum *drop)
{
	int			ndrop = 0;
	Datum		args[3];
	int			i;

	for (i = 0; i < nbatches; i++)
	{
		TakeBatch  *b = &batches[i];

		if (!b->locked || b->ntaken == 0)
			continue;
		if (b->open - b->ntaken <= 0)
		{
			drop[ndrop++] = Int64GetDatum(b->batch);
			continue;
		}
		if (claim_shrink_plan == NULL)
		{
			Oid			types[3] = {INT8OID, INT4OID, INT8ARRAYOID};

			gatekeeper_plan(&claim_shrink_plan, claim_shrink_sql, 3, types);
		}
		args[0] = Int64GetDatum(b->batch);
		args[1] = Int32GetDatum(b->ntaken);
		args[2] = gatekeeper_array(b->taken, NULL, b->ntaken, INT8OID);
		if (gatekeeper_execute_by_key(claim_shrink_plan, args, NULL, false, 0) != SPI_OK_UPDATE ||
			SPI_processed != 1)
			elog(ERROR, "could not take claimed mail out of its batch");
	}
	if (ndrop > 0)
	{
		if (claim_drop_plan == NULL)
		{
			Oid			type = INT8ARRAYOID;

			gatekeeper_plan(&claim_drop_plan, claim_drop_sql, 1, &type);
		}
		args[0] = gatekeeper_array(drop, NULL, ndrop, INT8OID);
		if (gatekeeper_execute_by_key(claim_drop_plan, args, NULL, false, 0) != SPI_OK_DELETE ||
			SPI_processed != (uint64) ndrop)
			elog(ERROR, "could not delete a batch of claimed mail");
	}
}

/*
 * write_batches past the executor: the batches are locked by this
 * transaction, so each delete or update finds the version it locked.
 */
static void
write_batches_direct(ClaimTable *ct, TakeBatch *batches, int nbatches)
{
	int			i;

	for (i = 0; i < nbatches; i++)
	{
		TakeBatch  *b = &batches[i];
		TM_FailureData tmfd;
		TM_Result	result;
		TupleTableSlot *n;
		Datum	   *gone;
		int			k;

		if (!b->locked || b->ntaken == 0)
			continue;
		if (b->open - b->ntaken <= 0)
		{
			result = mail_exec_delete(ct->rel, &b->ctid, ct->cid, ct->snapshot, true, &tmfd);
			if (result != TM_Ok)
				elog(ERROR, "could not delete a batch of claimed mail");
			continue;
		}

		/* the same row with fewer open: mails, TOASTed, is not written again */
		if (ct->shrunk == NULL)
		{
			mail_exec_open(&ct->x, ct->rel, ct->cid);
			ct->shrunk = table_slot_create(ct->rel, NULL);
		}
		if (!table_tuple_fetch_row_version(ct->rel, &b->ctid, SnapshotAny, ct->slot))
			elog(ERROR, "could not read a locked batch of claimed mail");
		n = ct->shrunk;
		mail_exec_new_version(ct->slot, n);
		gone = palloc((b->ngone + b->ntaken) * sizeof(Datum));
		for (k = 0; k < b->ngone; k++)
			gone[k] = Int64GetDatum(b->gone[k]);
		memcpy(gone + b->ngone, b->taken, b->ntaken * sizeof(Datum));
		n->tts_values[ct->att[K_OPEN] - 1] = Int32GetDatum(b->open - b->ntaken);
		n->tts_values[ct->att[K_GONE] - 1] =
			gatekeeper_array(gone, NULL, b->ngone + b->ntaken, INT8OID);
		ExecStoreVirtualTuple(n);
		result = mail_exec_update(&ct->x, &b->ctid, n, ct->snapshot, true, &tmfd);
		if (result != TM_Ok)
			elog(ERROR, "could not take claimed mail out of its batch");
	}
}

/*
 * take_round
 *		One round of take_claimed over the claims reqs[0 .. nreqs - 1]
 *		(sorted, distinct): take those still open in batches that are as
 *		they were read, appending their records to taken (made in keep);
 *		mark them done, and mark retry those seen in a batch that changed
 *		or went between the read and the lock.  With me, only the caller's
 *		own claims (take_entries).
 */
static void
take_round(TakeRequest *reqs, int nreqs, Datum *taken, int *ntaken,
		   LiveRecord *lr, MemoryContext keep, Claimant *me)
{
	ClaimTable	ct;
	bool		direct = claim_table_open(&ct);
	BatchEntry *entries;
	int			nentries;
	TakeBatch  *batches;
	int			nbatches;
	int			nlocked;
	int			ntaken_before = *ntaken;
	Datum	   *drop;

	if (direct)
		batches = read_candidates_direct(&ct, reqs, nreqs, lr, &nbatches, &entries, &nentries);
	else
		batches = read_candidates(reqs, nreqs, lr, &nbatches, &entries, &nentries);
	if (batches != NULL)
		nentries = match_requests(entries, nentries, reqs, nreqs, batches);
	if (batches != NULL && nentries > 0)
	{
		drop = palloc(nbatches * sizeof(Datum));
		if (direct)
		{
			batches = sort_batches(batches, nbatches, entries, nentries);
			lock_batches_direct(&ct, batches, nbatches, &nlocked);
		}
		else
			batches = lock_batches(batches, nbatches, entries, nentries, drop, &nlocked);
		take_entries(entries, nentries, reqs, batches, taken, ntaken, keep, me);
		if (nlocked > 0 && *ntaken > ntaken_before)
		{
			if (direct && ct.direct_writes)
				write_batches_direct(&ct, batches, nbatches);
			else
				write_batches(batches, nbatches, drop);
		}
	}
	if (direct)
		claim_table_close(&ct);
}

/*
 * mail_state_take_claimed
 *		Take the claims (ids[i], attempts[i]) still open out of their
 *		batches in gatekeeper.mail_claim; return their records, made in
 *		keep, and set *lr to their type.
 *
 * The batches whose id range meets that of the ids are read unlocked and
 * matched against the claims asked for by sorting both (an ack of 1,000
 * claims against 1,000 records is 1,000 steps of a merge, where a join
 * of two unnests would be a nested loop of a million).  Then only the
 * batches holding some of them are locked, in batch order, and their
 * gone lists, read under the lock, say which records are still open.
 * The unlocked read of a batch's records holds if the lock finds the row
 * version that was read: the records change only with the row.  A batch
 * that changed in between (an owner's update of a claimed mail, a claim
 * moved to a batch of its own by extend or a change of queue, a
 * rotation, another ack) is left alone, and the claims read in it are
 * looked for again in another round, which sees the change (under READ
 * COMMITTED; at higher levels the lock itself fails with a serialization
 * error).  A round is repeated only after a concurrent commit changed a
 * batch of ours.
 *
 * A batch that no open mail stays in is deleted; otherwise the taken ids
 * join gone and open falls, and the array of records is not written
 * again.  A claim asked for twice is taken once.
 *
 * Each round reads, locks and writes mail_claim past the executor, as the
 * claim writes it (ClaimTable): three statements, an executor started
 * and stopped for each, were the largest fixed cost of an ack
 * (docs/internals.md, "Direct writes").  The statements are kept for two cases: a trigger of the user's on
 * mail_claim's updates or deletes, which only they fire, has them write
 * the batches (the read and the lock fire nothing); and a mail_claim not
 * as 0.3.0 makes it (its index by id range gone) has them do the round.
 *
 * Whoever claimed them: this is the owner's change of claimed mail
 * (src/mail_state_sync.c).  The claimer's transitions take their claims
 * with take_claimed, which refuses another owner's.
 */
Datum *
mail_state_take_claimed(const int64 *ids, const int32 *attempts, int n, int *ntaken,
						LiveRecord *lr, MemoryContext keep)
{
	return take_claimed(ids, attempts, n, ntaken, lr, keep, NULL);
}

/*
 * mail_state_take_own
 *		mail_state_take_claimed, of the caller's claims only: a current
 *		claim of another owner fails the call with 42501 (check_owner).
 */
Datum *
mail_state_take_own(const int64 *ids, const int32 *attempts, int n, int *ntaken,
					LiveRecord *lr, MemoryContext keep)
{
	Claimant	me;

	claimant_init(&me);
	return take_claimed(ids, attempts, n, ntaken, lr, keep, &me);
}

/*
 * take_claimed
 *		mail_state_take_claimed, and with me, only claims of the caller's:
 *		a current claim of another owner fails the call with 42501
 *		(check_owner), whose error undoes whatever an earlier round took.
 */
static Datum *
take_claimed(const int64 *ids, const int32 *attempts, int n, int *ntaken,
			 LiveRecord *lr, MemoryContext keep, Claimant *me)
{
	TakeRequest *reqs;
	int			nreqs = n;
	Datum	   *taken;
	int			i;
	int			j;

	*ntaken = 0;
	lr->type = InvalidOid;
	if (nreqs == 0)
		return NULL;
	reqs = palloc(nreqs * sizeof(TakeRequest));
	for (i = 0; i < nreqs; i++)
	{
		reqs[i].id = ids[i];
		reqs[i].attempt = attempts[i];
		reqs[i].retry = false;
		reqs[i].done = false;
	}
	qsort(reqs, nreqs, sizeof(TakeRequest), take_request_cmp);
	for (i = 1, j = 1; i < nreqs; i++)
		if (take_request_cmp(&reqs[i], &reqs[j - 1]) != 0)
			reqs[j++] = reqs[i];
	nreqs = j;

	taken = MemoryContextAlloc(keep, nreqs * sizeof(Datum));
	while (nreqs > 0)
	{
		CHECK_FOR_INTERRUPTS();
		take_round(reqs, nreqs, taken, ntaken, lr, keep, me);
		/* the claims read in a batch that changed, not taken: again */
		for (i = 0, j = 0; i < nreqs; i++)
		{
			if (!reqs[i].retry || reqs[i].done)
				continue;
			reqs[j] = reqs[i];
			reqs[j].retry = false;
			j++;
		}
		nreqs = j;
	}
	return taken;
}

/*
 * mail_state_ack
 *		Report the claims (ids[i], attempts[i]) sent: those still open go
 *		to mail_done as sent (that row is their 'sent' event too:
 *		gatekeeper.events reads them from there).  Returns how many were
 *		still open.
 */
int
mail_state_ack(const int64 *ids, const int32 *attempts, int n)
{
	Claimant	me;
	LiveRecord	lr;
	Datum	   *taken;
	int			ntaken;
	int			i;

	gatekeeper_keep_freed_memory();
	claimant_init(&me);
	taken = take_claimed(ids, attempts, n, &ntaken, &lr, CurrentMemoryContext, &me);
	for (i = 0; i < ntaken; i++)
		taken[i] = mail_state_record_moved(&lr, taken[i], lr.sent, false, NULL, 0, false);
	mail_state_insert_done(&lr, taken, ntaken);
	return ntaken;
}

/*
 * mail_state_load_policies
 *		The policies of the queues of n records, sorted by name for
 *		mail_state_find_policy.
 */
QueuePolicy *
mail_state_load_policies(LiveRecord *lr, Datum *records, int n, int *npolicies)
{
	Datum	   *names = palloc(Max(n, 1) * sizeof(Datum));
	QueuePolicy *policies;
	Oid			type = TEXTARRAYOID;
	Datum		arg;
	uint64		row;
	int			i;

	for (i = 0; i < n; i++)
		names[i] = mail_state_record_get(lr, records[i], lr->queue);
	gatekeeper_plan(&queue_policy_plan, queue_policy_sql, 1, &type);
	arg = gatekeeper_array(names, NULL, n, TEXTOID);
	if (SPI_execute_plan(queue_policy_plan, &arg, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read the policies of queues");
	policies = palloc0(Max(SPI_processed, 1) * sizeof(QueuePolicy));
	for (row = 0; row < SPI_processed; row++)
	{
		HeapTuple	tup = SPI_tuptable->vals[row];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		Datum		d;

		policies[row].name = SPI_getvalue(tup, desc, 1);
		d = SPI_getbinval(tup, desc, 2, &isnull);
		policies[row].max_attempts = isnull ? 1 : DatumGetInt32(d);
		d = SPI_getbinval(tup, desc, 3, &isnull);
		policies[row].notify = !isnull && DatumGetBool(d);
		d = SPI_getbinval(tup, desc, 4, &isnull);
		policies[row].retry_for = isnull ? 0 : DatumGetIntervalP(d)->time;
		policies[row].due = DT_NOEND;
	}
	*npolicies = (int) SPI_processed;
	SPI_freetuptable(SPI_tuptable);
	qsort(policies, *npolicies, sizeof(QueuePolicy), policy_cmp);
	return policies;
}

/*
 * mail_state_find_policy
 *		A queue's policy, or NULL when the queue is gone.
 */
QueuePolicy *
mail_state_find_policy(QueuePolicy *policies, int n, const char *name)
{
	QueuePolicy key;

	memset(&key, 0, sizeof(key));
	key.name = (char *) name;
	return bsearch(&key, policies, n, sizeof(QueuePolicy), policy_cmp);
}

/*
 * mail_state_unclaim
 *		Hand the claims (ids[i], attempts[i]) still open back unsent and
 *		uncharged (no relay could be reached): scheduled again, due at due
 *		or their own send_at, whichever is later, with error (NULL
 *		allowed).  External senders listening for a notify queue hear of
 *		it.  Returns how many were handed back.
 */
int
mail_state_unclaim(const int64 *ids, const int32 *attempts, int n, const char *error,
				   TimestampTz due)
{
	Claimant	me;
	LiveRecord	lr;
	Datum	   *taken;
	int			ntaken;
	QueuePolicy *policies;
	int			npolicies;
	int			i;

	claimant_init(&me);
	taken = take_claimed(ids, attempts, n, &ntaken, &lr, CurrentMemoryContext, &me);
	if (ntaken == 0)
		return 0;
	policies = mail_state_load_policies(&lr, taken, ntaken, &npolicies);
	for (i = 0; i < ntaken; i++)
	{
		TimestampTz send_at = DatumGetTimestampTz(mail_state_record_get(&lr, taken[i],
																		lr.send_at));
		QueuePolicy *q = mail_state_find_policy(policies, npolicies,
									 TextDatumGetCString(mail_state_record_get(&lr, taken[i],
																			   lr.queue)));

		send_at = Max(send_at, due);
		taken[i] = mail_state_record_moved(&lr, taken[i], lr.scheduled, true, error, send_at, true);
		if (q != NULL)
			q->due = Min(q->due, send_at);
	}
	mail_state_insert_live(&lr, taken, ntaken);
	for (i = 0; i < npolicies; i++)
		if (policies[i].notify && policies[i].due != DT_NOEND)
			gatekeeper_announce_due(policies[i].name, policies[i].due);
	return ntaken;
}

/*
 * mail_state_extend_one
 *		Extend the lease of the claim (id, attempt) to lease_end, for its
 *		whole batch row (the row's mails were claimed together by one
 *		worker, which extends them together), when that ends later than
 *		the row's lease: a lease is never shortened, so no caller can make
 *		a claim lapse early for reap() (issue 44).  Returns whether the
 *		claim is current; another owner's is refused (check_owner).
 */
bool
mail_state_extend_one(int64 id, int32 attempt, TimestampTz lease_end)
{
	Oid			find_types[2] = {INT8OID, INT4OID};
	Oid			types[2] = {INT8OID, TIMESTAMPTZOID};
	Datum		args[2];
	HeapTuple	tup;
	TupleDesc	desc;
	bool		isnull;
	bool		owner_null;
	int64		batch;
	TimestampTz lease_until;
	Oid			owner;
	Claimant	me;

	gatekeeper_plan(&extend_find_plan, extend_find_sql, 2, find_types);
	args[0] = Int64GetDatum(id);
	args[1] = Int32GetDatum(attempt);
	if (SPI_execute_plan(extend_find_plan, args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not find a claim to extend");
	if (SPI_processed == 0)
		return false;
	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	batch = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
	lease_until = DatumGetTimestampTz(SPI_getbinval(tup, desc, 2, &isnull));
	owner = DatumGetObjectId(SPI_getbinval(tup, desc, 3, &owner_null));
	claimant_init(&me);
	check_owner(&me, owner, owner_null, id, attempt);

	if (lease_end > lease_until)
	{
		gatekeeper_plan(&extend_batch_plan, extend_batch_sql, 2, types);
		args[0] = Int64GetDatum(batch);
		args[1] = TimestampTzGetDatum(lease_end);
		if (SPI_execute_plan(extend_batch_plan, args, NULL, false, 0) != SPI_OK_UPDATE)
			elog(ERROR, "could not extend a lease");
	}
	return true;
}

/*
 * mail_state_extend
 *		Extend the leases of the claims (ids[i], attempts[i]) to lease_end
 *		at least: each batch row holding some of them once, never to a
 *		shorter lease (the background worker's extend: a lease is its
 *		batch's).  Sets held[i] to whether claim i was still open; returns
 *		how many were.  Another owner's claim is refused, as by
 *		mail_state_extend_one.
 */
int
mail_state_extend(const int64 *ids, const int32 *attempts, int n, TimestampTz lease_end,
				  bool *held)
{
	Oid			lock_types[4] = {INT8ARRAYOID, INT4ARRAYOID, INT8OID, INT8OID};
	Oid			types[2] = {INT8ARRAYOID, TIMESTAMPTZOID};
	Datum	   *id_values;
	Datum	   *attempt_values;
	Datum	   *batches;
	int64	   *open_ids;
	int			nopen = 0;
	int			nbatches;
	int64		lo;
	int64		hi;
	Datum		args[4];
	uint64		row;
	int			nheld = 0;
	Claimant	me;
	int			i;

	if (n == 0)
		return 0;
	claimant_init(&me);
	id_values = palloc(n * sizeof(Datum));
	attempt_values = palloc(n * sizeof(Datum));
	lo = hi = ids[0];
	for (i = 0; i < n; i++)
	{
		id_values[i] = Int64GetDatum(ids[i]);
		attempt_values[i] = Int32GetDatum(attempts[i]);
		lo = Min(lo, ids[i]);
		hi = Max(hi, ids[i]);
	}
	gatekeeper_plan(&extend_lock_plan, extend_lock_sql, 4, lock_types);
	args[0] = gatekeeper_array(id_values, NULL, n, INT8OID);
	args[1] = gatekeeper_array(attempt_values, NULL, n, INT4OID);
	args[2] = Int64GetDatum(lo);
	args[3] = Int64GetDatum(hi);
	if (SPI_execute_plan(extend_lock_plan, args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not lock the batches of claims to extend");
	nbatches = (int) SPI_processed;
	batches = palloc(Max(nbatches, 1) * sizeof(Datum));
	open_ids = palloc(n * sizeof(int64));
	for (row = 0; row < SPI_processed; row++)
	{
		HeapTuple	tup = SPI_tuptable->vals[row];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		Datum	   *in;
		int			nin;
		int			k;
		bool		owner_null;
		Oid			owner;

		batches[row] = SPI_getbinval(tup, desc, 1, &isnull);
		owner = DatumGetObjectId(SPI_getbinval(tup, desc, 2, &owner_null));
		deconstruct_array(DatumGetArrayTypeP(SPI_getbinval(tup, desc, 3, &isnull)),
						  INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, &in, NULL, &nin);
		if (nin > 0 && !owner_permits(&me, owner, owner_null))
		{
			/* the claim named first of those in the batch, for the error */
			for (k = 0; k < n && ids[k] != DatumGetInt64(in[0]); k++)
				;
			check_owner(&me, owner, owner_null, ids[k], attempts[k]);
		}
		for (k = 0; k < nin && nopen < n; k++)
			open_ids[nopen++] = DatumGetInt64(in[k]);
	}
	SPI_freetuptable(SPI_tuptable);
	qsort(open_ids, nopen, sizeof(int64), mail_state_id_cmp);

	if (nbatches > 0)
	{
		gatekeeper_plan(&extend_batches_plan, extend_batches_sql, 2, types);
		args[0] = gatekeeper_array(batches, NULL, nbatches, INT8OID);
		args[1] = TimestampTzGetDatum(lease_end);
		if (SPI_execute_plan(extend_batches_plan, args, NULL, false, 0) != SPI_OK_UPDATE)
			elog(ERROR, "could not extend leases");
	}
	for (i = 0; i < n; i++)
	{
		held[i] = bsearch(&ids[i], open_ids, nopen, sizeof(int64), mail_state_id_cmp) != NULL;
		if (held[i])
			nheld++;
	}
	return nheld;
}
