/*-------------------------------------------------------------------------
 *
 * claim.c
 *		gatekeeper.claim: hand due mail to one worker, fairly, through the
 *		gates.
 *
 * A claim takes up to `batch` due mails from the unpaused queues (or those
 * named; a background worker's, from those with background set), shared
 * by weight, each queue's share within its rate limit; src/claim_queues.c
 * reads the queues and their policies.
 * Each queue's share is taken by src/claim_take.c's walk of mail_due,
 * which does by hand, without the executor, what this statement does
 * (and this statement runs when mail_live has a delete trigger of the
 * user's own, which the walk would not fire):
 *
 *		DELETE FROM mail_live USING mail
 *		 WHERE ctid = ANY (ARRAY(SELECT ctid ... FOR UPDATE SKIP LOCKED))
 *		RETURNING ..., ROW(...)::mail_live
 *
 * which takes the mail's narrow live row out of mail_live and joins its
 * content (mail) by primary key, never rewriting it; the sub-select locks
 * the rows it takes, so no two claimers ever get the same mail and none
 * waits for another.  (= ANY (ARRAY(...)) is the plan-proof spelling of
 * IN (SELECT ...): the sub-select runs once as an init plan, whatever the
 * planner thinks of the LIMIT, even in a generic plan.  It hands over the
 * locked row versions themselves, which the delete fetches by TID: a probe
 * of mail_live's primary key per mail cost a tenth of the drain.  A row
 * some other transaction changed between this statement's snapshot and
 * the lock is locked but not visible to the delete, so it stays scheduled
 * for the next claim.)  The last column is the mail's claim state as a
 * mail_live record.  The mails that go are kept in gatekeeper.mail_claim,
 * in rows of up to CLAIM_BATCH_MAILS of one queue holding those records
 * (no live row version per mail at the claim, no probe at the ack;
 * docs/internals.md, "Claimed mail in batches"), written by
 * src/claim_writer.c; those that do not go
 * return to mail_live or go to mail_done, all in this transaction.
 * Inside a queue the sub-select walks the due index one priority level
 * at a time, so its cost grows with the batch, never with mail that is not
 * yet due or already finished.  It starts at the queue's due floor
 * (due_floor.c: $7 .. $9, NULL when there is none), past the dead entries
 * that the mail claimed since the last vacuum left in the index, which
 * every claim walked before: its cost does not grow with them either.
 *
 * Then, in the same transaction, the gates: every claimed mail of a gated
 * queue must pass all of its queue's gates.  The gate entries of the whole
 * batch are locked in one global order (see gate.c), the mails are passed
 * in claim order, and the losers are suppressed, deferred to the gates'
 * next opening, or expired if that is past their send_by.  Mail that will
 * not go goes to mail_done in the same transaction; deferred mail goes
 * back into mail_live.
 *
 * What becomes of a claimed mail afterwards (ack, nack, unclaim, extend)
 * is src/mail_state.c's, which also writes this claim's records into
 * mail_live and mail_done.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "claim.h"
#include "claim_queues.h"
#include "claim_take.h"
#include "claim_writer.h"
#include "due_floor.h"
#include "gate.h"
#include "keep_freed.h"
#include "mail_state.h"
#include "suppression.h"
#include "template_funcs.h"
#include "unsubscribe.h"
#include "window.h"
#include "xact.h"

#include "access/detoast.h"
#include "access/htup_details.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "address.h"
#include "catalog.h"
#include "claim.h"
#include "gatekeeper.h"
#include "validate.h"
#include "storage/itemptr.h"
#include "storage/proc.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/datum.h"
#include "utils/fmgrprotos.h"
#include "utils/guc.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/typcache.h"

PG_FUNCTION_INFO_V1(gatekeeper_claim);

#define MAX_BATCH 10000

/* SPEC: a worker name is at most 200 characters */
#define MAX_WORKER_NAME 200

/* how the background workers' names begin (src/worker.c); others may not */
#define BACKGROUND_WORKER_PREFIX "bgworker:"

/*
 * A claim's mails of one queue are kept in batch rows of at most this many,
 * in id order: what an ack of one mail reads and rewrites of its batch
 * (the records, the ids gone) stays this small whatever the claim's size.
 */
#define CLAIM_BATCH_MAILS 128

/* Gated mail a full gate memory had no room for is retried this much later. */
#define GATE_MEMORY_RETRY_MS	(10 * 1000)

/*
 * Columns of the per-queue claim statement's RETURNING list, counted from 1:
 * claim_take.h's list, which the walk fills in the same order.
 */
enum
{
	COL_ID = CT_ID + 1,
	COL_ATTEMPT = CT_ATTEMPT + 1,
	COL_QUEUE = CT_QUEUE + 1,
	COL_RECIPIENT = CT_RECIPIENT + 1,
	COL_RECIPIENT_NAME = CT_RECIPIENT_NAME + 1,
	COL_SENDER = CT_SENDER + 1,
	COL_SUBJECT = CT_SUBJECT + 1,
	COL_BODY = CT_BODY + 1,
	COL_HTML = CT_HTML + 1,
	COL_HEADERS = CT_HEADERS + 1,
	COL_MESSAGE_ID = CT_MESSAGE_ID + 1,
	COL_METADATA = CT_METADATA + 1,
	COL_EXPIRED = CT_EXPIRED + 1,
	COL_PRIORITY = CT_PRIORITY + 1,
	COL_SEND_AT = CT_SEND_AT + 1,
	COL_SEND_BY = CT_SEND_BY + 1,
	COL_TIMEZONE = CT_TIMEZONE + 1,
	COL_DUE = CT_DUE + 1,
	COL_TEMPLATE = CT_TEMPLATE + 1,
	COL_TEMPLATE_VERSION = CT_TEMPLATE_VERSION + 1,
	COL_DATA = CT_DATA + 1,
	COL_CREATED_AT = CT_CREATED_AT + 1,
	COL_RECORD = CT_RECORD + 1
};
#define NUM_OUTPUT_COLUMNS COL_METADATA

StaticAssertDecl((int) NUM_OUTPUT_COLUMNS == (int) GATEKEEPER_CLAIM_COLUMNS &&
				 (int) COL_ID == (int) GATEKEEPER_CLAIM_ID + 1 &&
				 (int) COL_HEADERS == (int) GATEKEEPER_CLAIM_HEADERS + 1 &&
				 (int) COL_MESSAGE_ID == (int) GATEKEEPER_CLAIM_MESSAGE_ID + 1,
				 "claim.h's columns are the claim statement's");

/* One mail the claim statement returned. */
typedef struct Claimed
{
	Datum		values[NUM_OUTPUT_COLUMNS];	/* what claim returns */
	bool		nulls[NUM_OUTPUT_COLUMNS];
	int64		id;
	int32		attempt;
	char	   *key;			/* recipient key, for gated mail */
	ClaimQueue *queue;
	int32		priority;
	TimestampTz send_at;
	TimestampTz send_by;		/* 0 if none */
	TimestampTz due;			/* since when it waits */
	bool		expired;
	bool		lost;			/* a gate was closed, or had no room */
	bool		nomem;			/* gate memory had no room: deferred a while */
	bool		over_budget;	/* past the claim's max_bytes: back as it was */
	TimestampTz reopens;		/* when its closed gates open again */
	const char *closed_gate;
	char	   *timezone;		/* the mail's own, or NULL */
	const char *suppressed;		/* the suppression list's reason, or NULL */
	bool		outside_window; /* deferred to reopens, its window's opening */
	const char *window_zone;	/* the zone it was judged in */
	char	   *template;		/* its template, or NULL: not templated */
	bool		template_version_null;
	int32		template_version;
	Jsonb	   *data;			/* NULL: none */
	TimestampTz created_at;
	char	   *render_error;	/* why it could not be rendered: failed */
	Datum		record;			/* its gatekeeper.mail_live record */
} Claimed;

/*
 * The claim of one queue's share.  The mail's narrow live row leaves
 * gatekeeper.mail_live; the content is joined by primary key and never
 * rewritten.  The last column is the claim state the row would have been
 * updated to, as a mail_live record (the lease is the batch's).  Mail past its send_by comes back marked expired (its record
 * as mail_done takes it) and is written there by settle_claimed.
 */
#define CLAIM_EXPIRED "m.send_by < now()"
/* the mail's Message-ID, or the one src/message_id.c gives it */
#define CLAIM_MESSAGE_ID \
"coalesce(l.message_id, gatekeeper._message_id(l.id, m.sender, $5, $6))"

/* below every id: the due scan's start in a level the floor is not in */
#define DUE_MIN_ID "(-9223372036854775807 - 1)::bigint"

static const char claim_sql[] =
"DELETE FROM gatekeeper.mail_live l "
" USING gatekeeper.mail m "
" WHERE l.ctid = ANY (ARRAY( "
"       WITH RECURSIVE levels(p) AS ( "
"           SELECT coalesce($7, (SELECT d.priority FROM gatekeeper.mail_live d "
"             WHERE d.queue = $1 AND d.state = 'scheduled' "
"             ORDER BY d.priority DESC LIMIT 1)) "
"           UNION ALL "
"           SELECT (SELECT d.priority FROM gatekeeper.mail_live d "
"                    WHERE d.queue = $1 AND d.state = 'scheduled' AND d.priority < l.p "
"                    ORDER BY d.priority DESC LIMIT 1) "
"             FROM levels l WHERE l.p IS NOT NULL) "
"       SELECT c.ctid FROM levels l, LATERAL ( "
"           SELECT d.ctid FROM gatekeeper.mail_live d "
"            WHERE d.queue = $1 AND d.state = 'scheduled' "
"              AND d.priority = l.p AND d.send_at <= now() "
"              AND (d.send_at, d.id) >= (CASE WHEN l.p = $7 THEN $8 ELSE '-infinity' END, "
"                                        CASE WHEN l.p = $7 THEN $9 ELSE " DUE_MIN_ID " END) "
"            ORDER BY d.send_at, d.id "
"            LIMIT $2 "
"              FOR UPDATE SKIP LOCKED) c "
"        WHERE l.p IS NOT NULL "
"        LIMIT $2)) "
"   AND m.id = l.id AND m.segment = l.segment "
"RETURNING l.id, l.attempt + CASE WHEN " CLAIM_EXPIRED " THEN 0 ELSE 1 END, "
"          l.queue, m.recipient, m.recipient_name, m.sender, m.subject, "
"          m.body, m.html, m.headers, " CLAIM_MESSAGE_ID ", m.metadata, "
"          " CLAIM_EXPIRED " IS TRUE, l.priority, l.send_at, m.send_by, m.timezone, "
"          greatest(l.send_at, m.created_at), m.template, m.template_version, m.data, "
"          m.created_at, "
"          ROW(l.id, l.queue, l.priority, l.send_at, "
"              CASE WHEN " CLAIM_EXPIRED " THEN 'expired' ELSE 'claimed' END::gatekeeper.state, "
"              l.attempt + CASE WHEN " CLAIM_EXPIRED " THEN 0 ELSE 1 END, "
"              l.uncharged, "
"              CASE WHEN " CLAIM_EXPIRED " THEN l.worker ELSE $4 END, "
"              " CLAIM_MESSAGE_ID ", "
"              CASE WHEN " CLAIM_EXPIRED " THEN 'not sent before send_by' ELSE l.last_error END, "
"              l.dedupe_key, l.segment)::gatekeeper.mail_live";

/*
 * Before the statement: the queue's first due runs (mail_run), as many as
 * the share could take mails from, moved into mail_live, whose rows the
 * statement takes (src/claim_take.c takes from runs itself).  A run
 * another claimer holds is skipped, as the statement skips its rows.
 */
static const char runs_to_live_sql[] =
"WITH r AS ( "
"  DELETE FROM gatekeeper.mail_run r "
"   WHERE r.ctid = ANY (ARRAY( "
"         SELECT d.ctid FROM gatekeeper.mail_run d "
"          WHERE d.queue = $1 AND d.send_at <= now() "
"          ORDER BY d.queue, d.priority DESC, d.send_at, d.id "
"          LIMIT $2 "
"            FOR UPDATE SKIP LOCKED)) "
"  RETURNING r.id, r.last_id, r.queue, r.priority, r.send_at, r.segment) "
"INSERT INTO gatekeeper.mail_live (id, queue, priority, send_at, segment) "
"SELECT g.id, r.queue, r.priority, r.send_at, r.segment "
"  FROM r, generate_series(r.id, r.last_id) AS g(id)";

/*
 * The mails of one queue's share that go, in id order: one batch row per
 * CLAIM_BATCH_MAILS of them.  $4 and $5 are each row's lowest and highest
 * id, $6 where each row's mails start in $7 (and, last, one past the end);
 * $8 the claim's owner (mail_state_claimant).
 */
static const char claim_batch_sql[] =
"INSERT INTO gatekeeper.mail_claim (" MAIL_CLAIM_COLUMNS ") "
"SELECT $1, $2, now() + $3, $4[i], $5[i], $6[i + 1] - $6[i], $7[$6[i]:$6[i + 1] - 1], $8 "
"  FROM generate_series(1, cardinality($4)) i";

static SPIPlanPtr claim_plan = NULL;
static SPIPlanPtr runs_to_live_plan = NULL;
static SPIPlanPtr claim_batch_plan = NULL;

static uint32 claim_rotation = 0;

/* the mail_live[] type claim_batch_plan was prepared for */
static Oid	claim_batch_type = InvalidOid;

/* A claimed mail that goes, as settle_claimed sorts them into batch rows. */
typedef struct GoingMail
{
	int64		id;
	Datum		record;
} GoingMail;

static int
going_mail_cmp(const void *a, const void *b)
{
	int64		x = ((const GoingMail *) a)->id;
	int64		y = ((const GoingMail *) b)->id;

	return (x > y) - (x < y);
}

/*
 * The claimed mails' rows, copied out as they come: from the executor's
 * slots when the claim statement runs (SPI would form each into a tuple
 * first: a copy of every mail's content, 4% of a drain in perf), or from
 * src/claim_take.c's walk.
 */
typedef struct ClaimReceiver
{
	DestReceiver pub;
	ClaimQueue *queue;
	Claimed    *claimed;
	int		   *nclaimed;
	MemoryContext keep;
} ClaimReceiver;

/* the columns' types, for copying: byval, length */
static const struct
{
	bool		byval;
	int16		len;
}			claim_column_types[COL_RECORD] = {
	[COL_ID - 1] = {true, 8},
	[COL_ATTEMPT - 1] = {true, 4},
	[COL_EXPIRED - 1] = {true, 1},
	[COL_PRIORITY - 1] = {true, 4},
	[COL_SEND_AT - 1] = {true, 8},
	[COL_SEND_BY - 1] = {true, 8},
	[COL_DUE - 1] = {true, 8},
	[COL_TEMPLATE_VERSION - 1] = {true, 4},
	[COL_CREATED_AT - 1] = {true, 8},
	/* the others are text, jsonb or the record: varlena */
	[COL_QUEUE - 1] = {false, -1},
	[COL_RECIPIENT - 1] = {false, -1},
	[COL_RECIPIENT_NAME - 1] = {false, -1},
	[COL_SENDER - 1] = {false, -1},
	[COL_SUBJECT - 1] = {false, -1},
	[COL_BODY - 1] = {false, -1},
	[COL_HTML - 1] = {false, -1},
	[COL_HEADERS - 1] = {false, -1},
	[COL_MESSAGE_ID - 1] = {false, -1},
	[COL_METADATA - 1] = {false, -1},
	[COL_TIMEZONE - 1] = {false, -1},
	[COL_TEMPLATE - 1] = {false, -1},
	[COL_DATA - 1] = {false, -1},
	[COL_RECORD - 1] = {false, -1},
};


static void
keep_claimed(ClaimReceiver *r, Datum *v, bool *n)
{
	Claimed    *c = &r->claimed[(*r->nclaimed)++];
	MemoryContext old;
	int			k;

	old = MemoryContextSwitchTo(r->keep);
	memset(c, 0, sizeof(*c));
	for (k = 0; k < NUM_OUTPUT_COLUMNS; k++)
	{
		c->nulls[k] = n[k];
		c->values[k] = n[k] ? (Datum) 0 :
			datumCopy(v[k], claim_column_types[k].byval, claim_column_types[k].len);
	}
	c->queue = r->queue;
	c->id = DatumGetInt64(v[COL_ID - 1]);
	c->attempt = DatumGetInt32(v[COL_ATTEMPT - 1]);
	c->expired = !n[COL_EXPIRED - 1] && DatumGetBool(v[COL_EXPIRED - 1]);
	c->priority = DatumGetInt32(v[COL_PRIORITY - 1]);
	c->send_at = DatumGetTimestampTz(v[COL_SEND_AT - 1]);
	c->send_by = n[COL_SEND_BY - 1] ? 0 : DatumGetTimestampTz(v[COL_SEND_BY - 1]);
	c->timezone = n[COL_TIMEZONE - 1] ? NULL : TextDatumGetCString(v[COL_TIMEZONE - 1]);
	c->due = DatumGetTimestampTz(v[COL_DUE - 1]);
	if (!n[COL_TEMPLATE - 1])
	{
		c->template = TextDatumGetCString(v[COL_TEMPLATE - 1]);
		c->template_version_null = n[COL_TEMPLATE_VERSION - 1];
		c->template_version = n[COL_TEMPLATE_VERSION - 1] ? 0 :
			DatumGetInt32(v[COL_TEMPLATE_VERSION - 1]);
		c->data = n[COL_DATA - 1] ? NULL :
			DatumGetJsonbPCopy(v[COL_DATA - 1]);
		c->created_at = DatumGetTimestampTz(v[COL_CREATED_AT - 1]);
	}
	c->record = datumCopy(v[COL_RECORD - 1], false, -1);
	if (r->queue->ngates > 0)
		c->key = gatekeeper_recipient_key(TextDatumGetCString(c->values[COL_RECIPIENT - 1]));
	MemoryContextSwitchTo(old);
}

static bool
claim_receive(TupleTableSlot *slot, DestReceiver *self)
{
	slot_getallattrs(slot);
	keep_claimed((ClaimReceiver *) self, slot->tts_values, slot->tts_isnull);
	return true;
}

static void
claim_take_receive(void *arg, Datum *values, bool *nulls)
{
	keep_claimed((ClaimReceiver *) arg, values, nulls);
}

static void
claim_receiver_startup(DestReceiver *self, int operation, TupleDesc typeinfo)
{
	int			k;

	if (typeinfo->natts != COL_RECORD)
		elog(ERROR, "claim statement returns %d columns, expected %d",
			 typeinfo->natts, COL_RECORD);
	for (k = 0; k < COL_RECORD; k++)
		if (TupleDescAttr(typeinfo, k)->attbyval != claim_column_types[k].byval ||
			TupleDescAttr(typeinfo, k)->attlen != claim_column_types[k].len)
			elog(ERROR, "claim statement's column %d is not of the expected type", k + 1);
}

static void
claim_receiver_noop(DestReceiver *self)
{
}

/*
 * Take one queue's share, by src/claim_take.c's walk or else by the claim
 * statement; append what it claimed.
 */
static int
claim_from_queue(ClaimQueue *q, int share, Interval *lease, text *worker,
				 Claimed *claimed, int *nclaimed, MemoryContext keep)
{
	Datum		args[9];
	char		nulls[9] = "      nnn";
	SPIPlanPtr	plan;
	Oid			types[9] = {TEXTOID, INT4OID, INTERVALOID, TEXTOID, TEXTOID, TEXTOID,
	INT4OID, TIMESTAMPTZOID, INT8OID};
	ClaimReceiver receiver;
	int			before = *nclaimed;
	DueKey		floor;
	bool		have_floor;

	/* start past the dead entries of mail claimed before (due_floor.c) */
	have_floor = gatekeeper_due_floor_raise(q->name, &floor);

	memset(&receiver, 0, sizeof(receiver));
	receiver.queue = q;
	receiver.claimed = claimed;
	receiver.nclaimed = nclaimed;
	receiver.keep = keep;

	/* the walk that does the statement's work by hand, if it may */
	if (gatekeeper_claim_take(q->name, share, have_floor ? &floor : NULL, worker,
							  gatekeeper_message_id_domain, gatekeeper_default_sender,
							  claim_take_receive, &receiver) >= 0)
		return *nclaimed - before;

	{
		Datum		rargs[2] = {CStringGetTextDatum(q->name), Int32GetDatum(share)};
		Oid			rtypes[2] = {TEXTOID, INT4OID};

		plan = gatekeeper_plan(&runs_to_live_plan, runs_to_live_sql, 2, rtypes);
		if (gatekeeper_execute_by_key(plan, rargs, NULL, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "could not move the runs of queue \"%s\" into mail_live", q->name);
		/* their rows may lie below the floor */
		have_floor = gatekeeper_due_floor_raise(q->name, &floor);
	}
	plan = gatekeeper_plan(&claim_plan, claim_sql, 9, types);
	if (have_floor)
	{
		args[6] = Int32GetDatum(floor.priority);
		args[7] = TimestampTzGetDatum(floor.send_at);
		args[8] = Int64GetDatum(floor.id);
		nulls[6] = nulls[7] = nulls[8] = ' ';
	}

	args[0] = CStringGetTextDatum(q->name);
	args[1] = Int32GetDatum(share);
	args[2] = IntervalPGetDatum(lease);
	args[3] = PointerGetDatum(worker);
	args[4] = CStringGetTextDatum(gatekeeper_message_id_domain ? gatekeeper_message_id_domain : "");
	args[5] = CStringGetTextDatum(gatekeeper_default_sender ? gatekeeper_default_sender : "");

	receiver.pub.receiveSlot = claim_receive;
	receiver.pub.rStartup = claim_receiver_startup;
	receiver.pub.rShutdown = claim_receiver_noop;
	receiver.pub.rDestroy = claim_receiver_noop;
	receiver.pub.mydest = DestNone;

	if (gatekeeper_execute_by_key_into(plan, args, nulls, false, 0, &receiver.pub) !=
		SPI_OK_DELETE_RETURNING)
		elog(ERROR, "claim from queue \"%s\" failed", q->name);

	return *nclaimed - before;
}

/*
 * Take up to batch mails across the queues, by weight.  Each round gives
 * every queue that may still have due mail its weighted share of what is
 * left (remainders go to the queues next in a rotating order, so small
 * shares are not always rounded away); a queue that returns less than its
 * share is empty for this claim.  Rounds end when the batch is full or no
 * queue can give more.
 */
static int
claim_fairly(ClaimQueue *queues, int nqueues, int batch, Interval *lease,
			 text *worker, Claimed *claimed, MemoryContext keep)
{
	int			nclaimed = 0;
	int		   *shares = palloc(Max(nqueues, 1) * sizeof(int));
	uint32		start = claim_rotation++;

	/*
	 * The claim statements, run by key, are planned without index-only
	 * scans (the planner policy, src/catalog.c).  Their priority probes
	 * would be ones (every column they read is in mail_due), and an
	 * index-only scan keeps its leaf page pinned until
	 * the statement ends, here while the update writes the whole batch; a
	 * plain index scan lets the pin go once it has read the page.  VACUUM
	 * must have every leaf page of mail_due with no other pin, and the
	 * probes of the claimers all sit on the first one: with a few claimers
	 * at work there was always a claim statement holding it, and autovacuum
	 * waited on the pin for minutes while the dead entries it was to remove
	 * slowed every claim (one wave of the sustained benchmark drained at
	 * 1,179 mails/s, the others at 25,000-45,000).
	 */
	while (nclaimed < batch)
	{
		int			left = batch - nclaimed;
		int64		weights = 0;
		int			given = 0;
		int			progress = 0;
		int			emptied = 0;
		int			i;

		for (i = 0; i < nqueues; i++)
			if (queues[i].more && queues[i].got < queues[i].cap)
				weights += queues[i].weight;
		if (weights == 0)
			break;

		for (i = 0; i < nqueues; i++)
		{
			ClaimQueue *q = &queues[i];

			shares[i] = 0;
			if (q->more && q->got < q->cap)
			{
				shares[i] = (int) ((int64) left * q->weight / weights);
				given += shares[i];
			}
		}
		for (i = 0; i < nqueues && given < left; i++)
		{
			int			k = (int) ((start + i) % nqueues);

			if (queues[k].more && queues[k].got < queues[k].cap)
				shares[k]++, given++;
		}

		for (i = 0; i < nqueues; i++)
		{
			ClaimQueue *q = &queues[i];
			int			share = Min(shares[i], q->cap - q->got);
			int			got;

			if (share <= 0)
				continue;
			got = claim_from_queue(q, share, lease, worker, claimed, &nclaimed, keep);
			q->got += got;
			progress += got;
			if (got < share)
			{
				q->more = false;
				emptied++;
			}
		}

		/*
		 * A round that claimed nothing but found queues empty goes on: what
		 * they were given goes to the queues that may still have due mail.
		 */
		if (progress == 0 && emptied == 0)
			break;
	}
	return nclaimed;
}

/*
 * Claim order inside a batch, for gating: priority, then due time, then id.
 */
static int
claimed_cmp(const void *a, const void *b)
{
	const Claimed *x = *(Claimed *const *) a;
	const Claimed *y = *(Claimed *const *) b;

	if (x->priority != y->priority)
		return x->priority > y->priority ? -1 : 1;
	if (x->send_at != y->send_at)
		return x->send_at < y->send_at ? -1 : 1;
	return (x->id > y->id) - (x->id < y->id);
}

/*
 * Would this mail pass this locked row of a gate?
 */
static bool
would_pass(const GatePasses *row, const QueueGate *gate, int64 holder)
{
	int			i;

	for (i = 0; i < row->n; i++)
		if (!row->holder_null[i] && row->holders[i] == holder)
			return true;
	return row->n < gate->max_sends;
}

/*
 * The locked row of (key, gate) in rows[0..nrows-1], or NULL.
 */
static GatePasses *
find_row(GatePasses *rows, int nrows, char *key, int32 gate)
{
	GatePasses	probe;

	memset(&probe, 0, sizeof(probe));
	probe.recipient = key;
	probe.gate = gate;
	return bsearch(&probe, rows, nrows, sizeof(GatePasses), gatekeeper_gate_passes_cmp);
}

/*
 * Pass the claimed mail of gated queues through their gates.  A mail must
 * pass every gate of its queue; one that fails any gate takes no pass from
 * the others.  Marks the losers, and the mails gate memory had no room
 * for.
 */
static void
apply_gates(Claimed *claimed, int nclaimed, TimestampTz now)
{
	Claimed   **order;
	GatePasses *rows;
	GatePasses **mine;
	int32	   *all = NULL;
	int			nall = 0;
	int			maxgates = 0;
	int			maxrows = 0;
	int			nrows = 0;
	int			norder = 0;
	int			nlocking;
	int			i;
	int			j;

	/*
	 * The mails to pass, in claim order, followed by those that expired on a
	 * later attempt: they may hold passes from an earlier one and will never
	 * go, so they give back what they hold, in whatever gates (their queue's
	 * gates may have changed since).  Both take their rows in the one sorted
	 * lock below, never in a second round of locking.
	 */
	order = palloc(Max(nclaimed, 1) * sizeof(Claimed *));
	for (i = 0; i < nclaimed; i++)
		if (!claimed[i].expired && !claimed[i].lost && claimed[i].queue->ngates > 0)
			order[norder++] = &claimed[i];
	qsort(order, norder, sizeof(Claimed *), claimed_cmp);
	nlocking = norder;
	for (i = 0; i < nclaimed; i++)
		if (claimed[i].expired && claimed[i].attempt > 0)
		{
			order[nlocking++] = &claimed[i];
			if (claimed[i].key == NULL)
				claimed[i].key = gatekeeper_recipient_key(TextDatumGetCString(claimed[i].values[COL_RECIPIENT - 1]));
		}
	if (nlocking == 0)
		return;
	if (nlocking > norder)
		all = gatekeeper_gate_ids(&nall);
	for (i = 0; i < norder; i++)
	{
		maxrows += order[i]->queue->ngates;
		maxgates = Max(maxgates, order[i]->queue->ngates);
	}
	maxrows += (nlocking - norder) * nall;
	if (maxrows == 0)
		return;

	/* one row per (recipient, gate), with room for each mail that may pass it */
	rows = palloc0(maxrows * sizeof(GatePasses));
	for (i = 0; i < norder; i++)
	{
		Claimed    *c = order[i];

		for (j = 0; j < c->queue->ngates; j++)
		{
			GatePasses *row = &rows[nrows++];

			row->recipient = c->key;
			row->gate = c->queue->gates[j].id;
			row->room = 1;
		}
	}
	for (i = norder; i < nlocking; i++)
	{
		for (j = 0; j < nall; j++)
		{
			GatePasses *row = &rows[nrows];

			row->recipient = order[i]->key;
			row->gate = all[j];
			if (gatekeeper_gate_held(row, order[i]->id, now))
				nrows++;
			else
				memset(row, 0, sizeof(*row));
		}
	}
	if (nrows == 0)
		return;
	{
		/* sort by key, once each */
		int			k = 0;

		qsort(rows, nrows, sizeof(GatePasses), gatekeeper_gate_passes_cmp);
		for (i = 0; i < nrows; i++)
		{
			if (k > 0 && gatekeeper_gate_passes_cmp(&rows[k - 1], &rows[i]) == 0)
				rows[k - 1].room += rows[i].room;
			else
				rows[k++] = rows[i];
		}
		nrows = k;
	}

	gatekeeper_gate_lock(rows, nrows, now, true);

	for (i = norder; i < nlocking; i++)
	{
		Claimed    *c = order[i];

		for (j = 0; j < nall; j++)
		{
			GatePasses *row = find_row(rows, nrows, c->key, all[j]);

			if (row != NULL && !row->nomem)
				gatekeeper_gate_release_holder(row, c->id);
		}
	}
	mine = palloc(Max(maxgates, 1) * sizeof(GatePasses *));
	for (i = 0; i < norder; i++)
	{
		Claimed    *c = order[i];
		bool		pass = true;

		for (j = 0; j < c->queue->ngates; j++)
		{
			mine[j] = find_row(rows, nrows, c->key, c->queue->gates[j].id);
			if (mine[j]->nomem)
				c->nomem = true;
		}
		if (c->nomem)
		{
			c->lost = true;
			continue;
		}
		for (j = 0; j < c->queue->ngates; j++)
		{
			if (!would_pass(mine[j], &c->queue->gates[j], c->id))
			{
				if (pass)
					c->closed_gate = c->queue->gates[j].name;
				pass = false;
				c->reopens = Max(c->reopens,
								 gatekeeper_gate_reopens(mine[j], c->queue->gates[j].max_sends));
			}
		}
		if (!pass)
		{
			c->lost = true;
			continue;
		}
		for (j = 0; j < c->queue->ngates; j++)
			(void) gatekeeper_gate_try(mine[j], c->queue->gates[j].max_sends,
									   c->queue->gates[j].expiry, c->id, false);
	}

	gatekeeper_gate_write(rows, nrows, now);
}

/*
 * apply_gates in a subtransaction of its own: should gate memory be too
 * full for anything the gates need (replaying the log after a restart,
 * say), what the gates did is rolled back and every gated mail of this
 * claim is deferred a while, so that a full gate memory never fails the
 * claim, and never holds back mail that is not gated.
 */
/* apply_gates' arguments, for gatekeeper_subxact_try */
typedef struct GatesStep
{
	Claimed    *claimed;
	int			nclaimed;
	TimestampTz now;
} GatesStep;

static bool
apply_gates_step(void *arg)
{
	GatesStep  *g = (GatesStep *) arg;

	apply_gates(g->claimed, g->nclaimed, g->now);
	return true;
}

/* gate memory too full for what the gates need */
static bool
out_of_gate_memory(ErrorData *error)
{
	return error->sqlerrcode == ERRCODE_OUT_OF_MEMORY;
}

static void
apply_gates_or_defer(Claimed *claimed, int nclaimed, TimestampTz now)
{
	GatesStep	g = {claimed, nclaimed, now};
	bool		any = false;
	int			i;

	for (i = 0; i < nclaimed && !any; i++)
		any = claimed[i].expired ? claimed[i].attempt > 0 :
			(!claimed[i].lost && claimed[i].queue->ngates > 0);
	if (!any || gatekeeper_subxact_try(apply_gates_step, &g, out_of_gate_memory))
		return;

	for (i = 0; i < nclaimed; i++)
	{
		Claimed    *c = &claimed[i];

		if (c->expired || c->lost || c->queue->ngates == 0)
			continue;
		c->lost = true;
		c->nomem = true;
		c->closed_gate = NULL;
		c->reopens = 0;
	}
}

/*
 * Hold back due mail outside its queue's sending window: it is deferred to
 * the window's next opening, judged in the mail's time zone, else the
 * queue's.  A zone the time zone data no longer knows (it was valid at
 * enqueue) falls back to the queue's, then to UTC, rather than fail every
 * claim of the queue.
 */
static void
apply_windows(Claimed *claimed, int nclaimed, TimestampTz now)
{
	int			i;

	for (i = 0; i < nclaimed; i++)
	{
		Claimed    *c = &claimed[i];
		const char *name = c->timezone;
		pg_tz	   *zone = NULL;
		TimestampTz opens;

		if (c->expired || c->lost || !c->queue->has_window)
			continue;
		if (name != NULL)
			zone = pg_tzset(name);
		if (zone == NULL)
		{
			name = c->queue->timezone;
			zone = pg_tzset(name);
		}
		if (zone == NULL)
		{
			name = "UTC";
			zone = pg_tzset(name);
		}
		opens = gatekeeper_window_next_open(&c->queue->window, zone, now);
		if (opens <= now)
			continue;
		c->lost = true;
		c->outside_window = true;
		c->reopens = opens;
		c->window_zone = name;
	}
}

/*
 * Check the mail that may go against the suppression list, in one
 * statement for the batch (src/suppression.c), and mark what it stops.
 * Suppressed mail takes no gate pass: this runs before the gates.
 */
static void
apply_suppression(Claimed *claimed, int nclaimed)
{
	GatekeeperSuppressionProbe *probes;
	Claimed   **of;
	int			n = 0;
	int			i;

	probes = palloc(Max(nclaimed, 1) * sizeof(GatekeeperSuppressionProbe));
	of = palloc(Max(nclaimed, 1) * sizeof(Claimed *));
	for (i = 0; i < nclaimed; i++)
	{
		Claimed    *c = &claimed[i];

		if (c->expired || c->lost)
			continue;
		if (c->key == NULL)
			c->key = gatekeeper_recipient_key(TextDatumGetCString(c->values[COL_RECIPIENT - 1]));
		probes[n].key = c->key;
		probes[n].queue = c->queue->name;
		probes[n].transactional = c->queue->transactional;
		of[n] = c;
		n++;
	}
	gatekeeper_suppression_check(probes, n);
	for (i = 0; i < n; i++)
	{
		if (probes[i].reason == NULL)
			continue;
		of[i]->lost = true;
		of[i]->suppressed = probes[i].reason;
	}
}

/*
 * The headers a queue adds to its mail.  RFC 8058 one-click unsubscribe:
 * the mail of a queue with an unsubscribe_url goes out with
 * List-Unsubscribe (the URL, its {token} signed for this recipient and
 * queue) and List-Unsubscribe-Post, unless it brings its own
 * List-Unsubscribe.  A queue with a feedback_id adds Feedback-ID (Gmail's
 * feedback loop), unless the mail brings its own.  They are added to the
 * headers the claim returns, so an external sender gets them as the
 * background worker does.  Runs with SPI connected (the token's secret is
 * read once per transaction); the new headers are made in keep.
 */
static void
add_queue_headers(Claimed *claimed, int nclaimed, MemoryContext keep)
{
	int			i;

	for (i = 0; i < nclaimed; i++)
	{
		Claimed    *c = &claimed[i];
		Jsonb	   *headers = NULL;
		StringInfoData json;
		Datum		added;
		MemoryContext old;

		if (c->expired || c->lost ||
			(c->queue->unsubscribe_url == NULL && c->queue->feedback_id == NULL))
			continue;
		if (!c->nulls[COL_HEADERS - 1])
			headers = DatumGetJsonbP(c->values[COL_HEADERS - 1]);

		initStringInfo(&json);
		appendStringInfoChar(&json, '{');
		if (c->queue->unsubscribe_url != NULL &&
			(headers == NULL || !gatekeeper_headers_have(headers, "List-Unsubscribe")))
		{
			char	   *url = gatekeeper_unsubscribe_url(c->queue->unsubscribe_url,
														 TextDatumGetCString(c->values[COL_RECIPIENT - 1]),
														 c->queue->name);

			appendStringInfoString(&json, "\"List-Unsubscribe\": ");
			escape_json(&json, psprintf("<%s>", url));
			if (headers == NULL || !gatekeeper_headers_have(headers, "List-Unsubscribe-Post"))
				appendStringInfoString(&json, ", \"List-Unsubscribe-Post\": \"List-Unsubscribe=One-Click\"");
		}
		if (c->queue->feedback_id != NULL &&
			(headers == NULL || !gatekeeper_headers_have(headers, "Feedback-ID")))
		{
			if (json.len > 1)
				appendStringInfoString(&json, ", ");
			appendStringInfoString(&json, "\"Feedback-ID\": ");
			escape_json(&json, c->queue->feedback_id);
		}
		if (json.len == 1)
			continue;
		appendStringInfoChar(&json, '}');

		old = MemoryContextSwitchTo(keep);
		added = DirectFunctionCall1(jsonb_in, CStringGetDatum(json.data));
		if (headers != NULL)
			added = DirectFunctionCall2(jsonb_concat, JsonbPGetDatum(headers), added);
		MemoryContextSwitchTo(old);
		c->values[COL_HEADERS - 1] = added;
		c->nulls[COL_HEADERS - 1] = false;
	}
}

/*
 * The bytes a claimed mail brings: its subject, body, html and headers as
 * stored, each placeholder in a header value at the length of the mail's
 * Message-ID, which fill_message_id puts there.  Only the headers are
 * detoasted to count, the rest is measured where it lies.
 */
static int64
claimed_bytes(Claimed *c)
{
	static const int columns[] = {COL_SUBJECT, COL_BODY, COL_HTML, COL_HEADERS};
	int64		bytes = 0;
	int			k;

	for (k = 0; k < (int) lengthof(columns); k++)
		if (!c->nulls[columns[k] - 1])
			bytes += toast_raw_datum_size(c->values[columns[k] - 1]) - VARHDRSZ;
	if (!c->nulls[COL_HEADERS - 1] && !c->nulls[COL_MESSAGE_ID - 1])
	{
		Datum		stored = c->values[COL_HEADERS - 1];
		Jsonb	   *headers = DatumGetJsonbP(stored);
		int64		grows = (int64) VARSIZE_ANY_EXHDR(DatumGetPointer(c->values[COL_MESSAGE_ID - 1])) -
			(int64) strlen(GATEKEEPER_MESSAGE_ID_PLACEHOLDER);

		bytes += Max(grows, 0) * gatekeeper_headers_placeholders(headers);
		if ((Pointer) headers != DatumGetPointer(stored))
			pfree(headers);
	}
	return bytes;
}

/*
 * Render each templated mail's content from its template version and
 * data, in place of the content it has none of, before its bytes are
 * counted: the mail's own headers over the template's, a name in any
 * case.  A mail that cannot be rendered (src/template_funcs.c says why)
 * fails alone, as loser_outcome says, uncharged; the rest of the claim
 * goes on.
 */
static void
render_templated(Claimed *claimed, int nclaimed, MemoryContext keep)
{
	int			i;

	for (i = 0; i < nclaimed; i++)
	{
		Claimed    *c = &claimed[i];
		GatekeeperRenderedMail out;
		Datum		headers;

		if (c->template == NULL || c->expired)
			continue;
		c->render_error = gatekeeper_template_render_claimed(c->template,
															 c->template_version_null,
															 c->template_version,
															 c->created_at, c->data,
															 &out, keep);
		if (c->render_error != NULL)
		{
			c->lost = true;
			continue;
		}
		c->values[COL_SUBJECT - 1] = PointerGetDatum(out.subject);
		c->nulls[COL_SUBJECT - 1] = false;
		c->values[COL_BODY - 1] = PointerGetDatum(out.body);
		c->nulls[COL_BODY - 1] = false;
		c->values[COL_HTML - 1] = PointerGetDatum(out.html);
		c->nulls[COL_HTML - 1] = out.html == NULL;
		if (out.headers != NULL)
		{
			headers = JsonbPGetDatum(out.headers);
			if (!c->nulls[COL_HEADERS - 1])
			{
				MemoryContext old = MemoryContextSwitchTo(keep);

				Jsonb	   *own = DatumGetJsonbP(c->values[COL_HEADERS - 1]);

				headers = JsonbPGetDatum(gatekeeper_template_headers_merge(out.headers, own));
				MemoryContextSwitchTo(old);
			}
			c->values[COL_HEADERS - 1] = headers;
			c->nulls[COL_HEADERS - 1] = false;
		}
	}
}

/*
 * A claim with a byte budget (the background worker's: what
 * gatekeeper.max_in_flight leaves it) keeps its mails, in claim order,
 * while their bytes fit, the first always; from the first that does not
 * fit on, the mails go back as they were, uncharged, and are the first
 * the next claim finds.  So what one claim hands over is bounded by bytes
 * whatever the sizes of the mail claimed before.  Mail past send_by holds
 * nothing and is settled as ever.
 */
static void
hold_back_over_budget(Claimed *claimed, int nclaimed, int64 max_bytes)
{
	int64		bytes = 0;
	int			kept = 0;
	bool		full = false;
	int			i;

	for (i = 0; i < nclaimed; i++)
	{
		Claimed    *c = &claimed[i];

		if (c->expired || c->render_error != NULL)
			continue;
		if (!full)
		{
			int64		more = claimed_bytes(c);

			if (kept == 0 || bytes + more <= max_bytes)
			{
				bytes += more;
				kept++;
				continue;
			}
			full = true;
		}
		c->lost = true;
		c->over_budget = true;
	}
}

/*
 * The value s with every placeholder replaced by the Message-ID mid, or
 * NULL when it holds none.
 */
static char *
placeholders_filled(const char *s, int len, const char *mid)
{
	const int	plen = strlen(GATEKEEPER_MESSAGE_ID_PLACEHOLDER);
	const char *end = s + len;
	const char *from = s;
	const char *at;
	StringInfoData out;

	at = gatekeeper_placeholder_find(from, end - from);
	if (at == NULL)
		return NULL;
	initStringInfo(&out);
	do
	{
		appendBinaryStringInfo(&out, from, at - from);
		appendStringInfoString(&out, mid);
		from = at + plen;
	} while ((at = gatekeeper_placeholder_find(from, end - from)) != NULL);
	appendBinaryStringInfo(&out, from, end - from);
	return out.data;
}

/*
 * A header value of the mail's that holds {message_id} gets the mail's
 * Message-ID there; header names never do (enqueue refuses a brace in
 * one).  An ESP whose webhooks return a message's metadata but not its
 * Message-ID (Postmark: X-PM-Metadata-* headers come back as Metadata)
 * then names the mail for record_event().  Each placeholder was counted
 * at GATEKEEPER_MESSAGE_ID_MAX octets by enqueue's size check, which no
 * Message-ID the claim makes exceeds (one written into mail_live by hand
 * might: it is filled in all the same, rather than fail every claim; the
 * worker's byte budget counts its true length).
 */
static void
fill_message_id(Claimed *claimed, int nclaimed, MemoryContext keep)
{
	int			i;

	for (i = 0; i < nclaimed; i++)
	{
		Claimed    *c = &claimed[i];
		Jsonb	   *headers;
		char	   *mid;
		JsonbParseState *state = NULL;
		JsonbIterator *it;
		JsonbIteratorToken tok;
		JsonbValue	v;
		JsonbValue *filled = NULL;
		MemoryContext old;

		if (c->expired || c->lost || c->nulls[COL_HEADERS - 1] || c->nulls[COL_MESSAGE_ID - 1])
			continue;
		headers = DatumGetJsonbP(c->values[COL_HEADERS - 1]);
		if (gatekeeper_headers_placeholders(headers) == 0)
			continue;
		mid = TextDatumGetCString(c->values[COL_MESSAGE_ID - 1]);

		it = JsonbIteratorInit(&headers->root);
		while ((tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
		{
			if (tok == WJB_VALUE && v.type == jbvString)
			{
				char	   *value = placeholders_filled(v.val.string.val,
														v.val.string.len, mid);

				if (value != NULL)
				{
					v.val.string.val = value;
					v.val.string.len = strlen(value);
				}
			}
			filled = pushJsonbValue(&state, tok, tok < WJB_BEGIN_ARRAY ? &v : NULL);
		}

		old = MemoryContextSwitchTo(keep);
		c->values[COL_HEADERS - 1] = JsonbPGetDatum(JsonbValueToJsonb(filled));
		MemoryContextSwitchTo(old);
	}
}

/*
 * What becomes of a claimed mail that may not go, and the error recorded:
 * in the claim's order of checks, outside its sending window (deferred to
 * the opening, or expired if that is past send_by), on the suppression
 * list, then closed at a gate (suppressed, deferred to the reopening, or
 * expired).  Sets c->reopens where the mail is deferred for gate memory.
 */
static const char *
loser_outcome(Claimed *c, TimestampTz now, char **error)
{
	const char *state;

	if (c->render_error != NULL)
	{
		/* never built: failed at once, its attempt not counted */
		state = "failed";
		*error = c->render_error;
	}
	else if (c->over_budget)
	{
		/* as it was: its last error stays */
		state = "scheduled";
		*error = NULL;
	}
	else if (c->suppressed)
	{
		state = "suppressed";
		*error = psprintf("suppressed: %s", c->suppressed);
	}
	else if (c->outside_window && c->send_by != 0 && c->reopens > c->send_by)
	{
		state = "expired";
		*error = psprintf("sending window %s (%s) opens only after send_by",
						  c->queue->send_window, c->window_zone);
	}
	else if (c->outside_window)
	{
		state = "scheduled";
		*error = psprintf("deferred: outside sending window %s (%s)",
						  c->queue->send_window, c->window_zone);
	}
	else if (c->nomem)
	{
		state = "scheduled";
		*error = pstrdup("deferred: gate memory is full");
		c->reopens = TimestampTzPlusMilliseconds(now, GATE_MEMORY_RETRY_MS);
	}
	else if (!c->queue->defer)
	{
		state = "suppressed";
		*error = psprintf("suppressed: gate \"%s\" was closed", c->closed_gate);
	}
	else if (c->send_by != 0 && c->reopens > c->send_by)
	{
		state = "expired";
		*error = psprintf("gate \"%s\" stays closed past send_by", c->closed_gate);
	}
	else
	{
		state = "scheduled";
		*error = psprintf("deferred: gate \"%s\" was closed", c->closed_gate);
	}

	return state;
}

/*
 * A claimed mail's record as a claim that did not happen leaves it: in
 * state (scheduled, suppressed or expired), with the error (NULL: its
 * last error stays), the attempt as before the claim, no worker and no
 * lease; send_at moved for mail that waits.
 */
static Datum
live_record_unclaimed(LiveRecord *lr, Datum record, const char *state,
					  TimestampTz send_at, const char *error)
{
	int			natts = lr->desc->natts;
	Datum	   *values = palloc(natts * sizeof(Datum));
	bool	   *nulls = palloc(natts * sizeof(bool));

	mail_state_record_deform(lr, record, values, nulls);
	values[lr->state - 1] = DirectFunctionCall2(enum_in, CStringGetDatum(state),
												ObjectIdGetDatum(lr->state_type));
	values[lr->attempt - 1] = Int32GetDatum(DatumGetInt32(values[lr->attempt - 1]) - 1);
	values[lr->send_at - 1] = TimestampTzGetDatum(send_at);
	if (error != NULL)
	{
		values[lr->last_error - 1] = CStringGetTextDatum(error);
		nulls[lr->last_error - 1] = false;
	}
	nulls[lr->worker - 1] = true;
	return HeapTupleGetDatum(heap_form_tuple(lr->desc, values, nulls));
}

/*
 * The batch rows of a claim of queue q by the statement, when
 * src/claim_writer.c may not write them: nrows rows, as there.
 */
static void
insert_batches(ClaimQueue *q, text *worker, Oid owner, Interval *lease, int nrows,
			   const int64 *lo, const int64 *hi, const int *start, Datum *records,
			   LiveRecord *lr)
{
	Datum	   *los = palloc(nrows * sizeof(Datum));
	Datum	   *his = palloc(nrows * sizeof(Datum));
	Datum	   *starts = palloc((nrows + 1) * sizeof(Datum));
	Datum		args[8];
	int			i;

	/* the statement's array positions count from 1 */
	for (i = 0; i < nrows; i++)
	{
		los[i] = Int64GetDatum(lo[i]);
		his[i] = Int64GetDatum(hi[i]);
		starts[i] = Int32GetDatum(start[i] + 1);
	}
	starts[nrows] = Int32GetDatum(start[nrows] + 1);

	if (claim_batch_plan != NULL && claim_batch_type != lr->arraytype)
	{
		/* the extension was made again in this backend */
		SPI_freeplan(claim_batch_plan);
		claim_batch_plan = NULL;
	}
	if (claim_batch_plan == NULL)
	{
		Oid			types[8] = {TEXTOID, TEXTOID, INTERVALOID, INT8ARRAYOID,
		INT8ARRAYOID, INT4ARRAYOID, lr->arraytype, OIDOID};

		gatekeeper_plan(&claim_batch_plan, claim_batch_sql, 8, types);
		claim_batch_type = lr->arraytype;
	}
	args[0] = CStringGetTextDatum(q->name);
	args[1] = PointerGetDatum(worker);
	args[2] = IntervalPGetDatum(lease);
	args[3] = gatekeeper_array(los, NULL, nrows, INT8OID);
	args[4] = gatekeeper_array(his, NULL, nrows, INT8OID);
	args[5] = gatekeeper_array(starts, NULL, nrows + 1, INT4OID);
	args[6] = gatekeeper_array(records, NULL, start[nrows], lr->type);
	args[7] = ObjectIdGetDatum(owner);
	if (SPI_execute_plan(claim_batch_plan, args, NULL, false, 0) != SPI_OK_INSERT ||
		SPI_processed != (uint64) nrows)
		elog(ERROR, "could not record the claim of queue \"%s\"", q->name);
}

/*
 * Record what became of every mail the claim statements took out of
 * mail_live; each ends in exactly one place.  The mails that go become
 * batch rows in mail_claim, per queue and CLAIM_BATCH_MAILS at most, with
 * the lease and the claimer as their owner (mail_state_claimant: only it
 * reports on them).  Those held back by
 * their sending window, the suppression list or a gate (see loser_outcome)
 * and those past send_by will not go now: the deferred go back into
 * mail_live as scheduled with their new due time, the rest to mail_done.
 * A claim that was refused never became visible, so its attempt is
 * restored.
 */
static void
settle_claimed(Claimed *claimed, int nclaimed, TimestampTz now,
			   ClaimQueue *queues, int nqueues, Interval *lease, text *worker)
{
	LiveRecord	lr;
	GoingMail  *going;
	Datum	   *records;
	Datum	   *deferred;
	Datum	   *done;
	int			ndeferred = 0;
	int			ndone = 0;
	int			nomem = 0;
	TimestampTz lease_until;
	Oid			owner = mail_state_claimant();
	int			i;
	int			k;

	if (nclaimed == 0)
		return;
	mail_state_record_init(&lr, HeapTupleHeaderGetTypeId(DatumGetHeapTupleHeader(claimed[0].record)));

	going = palloc(nclaimed * sizeof(GoingMail));
	records = palloc(nclaimed * sizeof(Datum));
	deferred = palloc(nclaimed * sizeof(Datum));
	done = palloc(nclaimed * sizeof(Datum));
	for (i = 0; i < nclaimed; i++)
	{
		Claimed    *c = &claimed[i];
		const char *state;
		char	   *error;

		if (c->nomem)
			nomem++;
		if (c->expired)
		{
			/* the claim statement marked it expired: as its record says */
			done[ndone++] = c->record;
			continue;
		}
		if (!c->lost)
			continue;
		state = loser_outcome(c, now, &error);
		if (strcmp(state, "scheduled") == 0)
			deferred[ndeferred++] =
				live_record_unclaimed(&lr, c->record, state,
									  Max(c->reopens, c->send_at), error);
		else
			done[ndone++] = live_record_unclaimed(&lr, c->record, state,
												  c->send_at, error);
	}
	if (nomem > 0)
		gatekeeper_gate_memory_warning(nomem);

	/*
	 * The mails of each queue that go, in id order, in batch rows of at
	 * most CLAIM_BATCH_MAILS, leased from the transaction's start as
	 * now() + lease.
	 */
	lease_until = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
														  TimestampTzGetDatum(now),
														  IntervalPGetDatum(lease)));
	for (k = 0; k < nqueues; k++)
	{
		ClaimQueue *q = &queues[k];
		int			ngoing = 0;
		int			nrows;
		int64	   *lo;
		int64	   *hi;
		int		   *start;

		for (i = 0; i < nclaimed; i++)
		{
			Claimed    *c = &claimed[i];

			if (c->queue != q || c->expired || c->lost)
				continue;
			going[ngoing].id = c->id;
			going[ngoing].record = c->record;
			ngoing++;
		}
		if (ngoing == 0)
			continue;
		qsort(going, ngoing, sizeof(GoingMail), going_mail_cmp);
		nrows = (ngoing + CLAIM_BATCH_MAILS - 1) / CLAIM_BATCH_MAILS;
		lo = palloc(nrows * sizeof(int64));
		hi = palloc(nrows * sizeof(int64));
		start = palloc((nrows + 1) * sizeof(int));
		for (i = 0; i < nrows; i++)
		{
			int			first = i * CLAIM_BATCH_MAILS;
			int			last = Min(first + CLAIM_BATCH_MAILS, ngoing) - 1;

			lo[i] = going[first].id;
			hi[i] = going[last].id;
			start[i] = first;
		}
		start[nrows] = ngoing;
		for (i = 0; i < ngoing; i++)
			records[i] = going[i].record;

		if (!gatekeeper_claim_write(CStringGetTextDatum(q->name), worker, owner, lease_until,
									nrows, lo, hi, start, records, lr.type, lr.arraytype))
			insert_batches(q, worker, owner, lease, nrows, lo, hi, start, records, &lr);
	}

	/* deferred mail is live again; mail that will not go, done */
	mail_state_insert_live(&lr, deferred, ndeferred);
	mail_state_insert_done(&lr, done, ndone);
}

/* claim()'s receiver: a row of its result */
static void
put_claimed(void *arg, Datum *values, bool *nulls, TimestampTz due)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) arg;

	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

/*
 * claim(worker text, batch int DEFAULT 100, lease interval DEFAULT '5 minutes',
 *		 queues text[] DEFAULT NULL)
 *	RETURNS TABLE (id bigint, attempt int, queue text, recipient text,
 *				   recipient_name text, sender text, subject text, body text,
 *				   html text, headers jsonb, message_id text, metadata jsonb)
 */
Datum
gatekeeper_claim(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	text	   *worker;
	int			batch;
	Interval   *lease;
	ArrayType  *filter = NULL;

	gatekeeper_require_schema();
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("worker, batch and lease must not be null")));
	worker = PG_GETARG_TEXT_PP(0);
	batch = PG_GETARG_INT32(1);
	lease = PG_GETARG_INTERVAL_P(2);
	if (!PG_ARGISNULL(3))
	{
		filter = PG_GETARG_ARRAYTYPE_P(3);
		if (ARR_NDIM(filter) > 1)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("queues must be a one-dimensional array")));
	}
	if (batch < 1 || batch > MAX_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch must be between 1 and %d", MAX_BATCH),
				 errdetail("batch was %d.", batch)));
	lease = gatekeeper_check_duration(lease, "lease");
	if (VARSIZE_ANY_EXHDR(worker) > MAX_WORKER_NAME &&
		pg_mbstrlen_with_len(VARDATA_ANY(worker), VARSIZE_ANY_EXHDR(worker)) > MAX_WORKER_NAME)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("worker must be at most %d characters", MAX_WORKER_NAME),
				 errdetail("worker has %d characters.",
						   pg_mbstrlen_with_len(VARDATA_ANY(worker), VARSIZE_ANY_EXHDR(worker)))));
	/* reap() takes back other incarnations' background claims at once */
	if (!gatekeeper_background_claim &&
		VARSIZE_ANY_EXHDR(worker) >= (int) strlen(BACKGROUND_WORKER_PREFIX) &&
		strncmp(VARDATA_ANY(worker), BACKGROUND_WORKER_PREFIX,
				strlen(BACKGROUND_WORKER_PREFIX)) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("worker names beginning with \"%s\" are reserved for gatekeeper's background workers",
						BACKGROUND_WORKER_PREFIX),
				 errdetail("A background worker's claims are taken back as soon as its server is gone; an external worker's keep their lease.")));

	InitMaterializedSRF(fcinfo, 0);
	(void) gatekeeper_claim_mails(worker, batch, lease, filter, 0, put_claimed, rsinfo);

	return (Datum) 0;
}

/*
 * gatekeeper_claim_mails
 *		Claim up to batch due mails for worker, with lease, from the queues
 *		of filter (NULL: every unpaused queue; a background worker's, those
 *		it serves), and hand each that goes to receive, in claim order,
 *		with its columns as claim returns them and when it became due.
 *		Returns how many it handed.  The arguments are claim()'s, checked,
 *		and max_bytes: the most content the mails handed may hold together
 *		(hold_back_over_budget), 0 for no bound.  SPI may be connected or
 *		not; receive runs after this function's own SPI connection is
 *		finished, in the caller's memory context.
 */
int
gatekeeper_claim_mails(text *worker, int batch, Interval *lease, ArrayType *filter,
					   int64 max_bytes, gatekeeper_claim_receiver receive, void *arg)
{
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	MemoryContext keep = CurrentMemoryContext;
	ClaimQueue *queues;
	int			nqueues;
	Claimed    *claimed;
	int			nclaimed;
	int			ngoing = 0;
	int			i;

	gatekeeper_keep_freed_memory();
	SPI_connect();
	queues = claim_load_queues(filter, &nqueues);
	claimed = MemoryContextAlloc(keep, batch * sizeof(Claimed));
	nclaimed = claim_fairly(queues, nqueues, batch, lease, worker, claimed, keep);
	render_templated(claimed, nclaimed, keep);
	if (max_bytes > 0)
		hold_back_over_budget(claimed, nclaimed, max_bytes);

	/*
	 * In this transaction, in this order: the sending windows (mail outside
	 * its window waits for the opening, and is judged by the list and the
	 * gates then), the suppression list, the gates.  A claimed mail that
	 * may not go is settled now and never returned, and takes no gate pass.
	 */
	apply_windows(claimed, nclaimed, now);
	apply_suppression(claimed, nclaimed);
	apply_gates_or_defer(claimed, nclaimed, now);
	settle_claimed(claimed, nclaimed, now, queues, nqueues, lease, worker);
	add_queue_headers(claimed, nclaimed, keep);
	fill_message_id(claimed, nclaimed, keep);

	for (i = 0; i < nclaimed; i++)
		if (!claimed[i].expired && !claimed[i].lost)
			claimed[i].queue->sent++;
	claim_spend_tokens(queues, nqueues);

	SPI_finish();

	for (i = 0; i < nclaimed; i++)
	{
		Claimed    *c = &claimed[i];

		if (c->expired || c->lost)
			continue;
		receive(arg, c->values, c->nulls, c->due);
		ngoing++;
	}

	return ngoing;
}
