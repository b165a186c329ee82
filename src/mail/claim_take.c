/*-------------------------------------------------------------------------
 *
 * claim_take.c
 *		Take one queue's share of due mail: walk mail_due, delete each live
 *		row no one else holds, join its content, without the executor.
 *
 * This is the claim statement of src/claim.c,
 *
 *		DELETE FROM mail_live USING mail
 *		 WHERE ctid = ANY (ARRAY(SELECT ... FOR UPDATE SKIP LOCKED))
 *		RETURNING ...
 *
 * done by hand.  The statement cost a claim more than the mail it took:
 * starting its executor (11% of a batch-100 claimer's CPU in perf), its
 * ARRAY init plan, a row lock and then a delete for every mail (two WAL
 * records, two visits to the page), the deleted rows gathered into the
 * live counts' transition table and read back, and the Message-ID and the
 * claim record computed in numeric and SQL expressions (docs/internals.md,
 * "The claim's statements").
 *
 * Here each queue's share is one walk of mail_due under the statement's
 * MVCC snapshot, one priority level after the other from the due floor
 * (src/due_floor.c), each level in (send_at, id) order up to the first
 * mail not yet due.  A visible row is taken by deleting it without waiting
 * (heap_delete with wait = false): a row another transaction holds (a
 * claimer that deleted it, a writer that locked it) is skipped, as SKIP
 * LOCKED skips it, and a row changed since the snapshot is skipped too
 * (under REPEATABLE READ or SERIALIZABLE that is a serialization failure,
 * as FOR UPDATE makes it).  The content row is looked up first, by
 * primary key in its segment's partition: a live row without content is
 * left alone, as the join left it.  The deleted rows are counted off the
 * live gauges through the one tally every move uses (mail_count.c).
 *
 * Runs (mail_run, src/live_writer.c) are walked alongside, one priority
 * level at a time: each level's live rows (mail_due) and runs
 * (mail_run_due) are merged in (send_at, id) order, a run standing at its
 * first mail.  A run is locked without waiting when its turn first comes
 * (one another claimer holds is skipped, as a live row is), its mails are
 * taken from the front, each with its content as a live row's, in
 * between the live rows they sort among, and it is then moved on (id
 * past the last mail taken) or, taken whole, deleted.  A mail of a run is
 * handed over as the mail_live row it stands for: never attempted, no
 * Message-ID.
 *
 * The walk is taken only when it does what the statement would: mail_live
 * a heap with no delete trigger that would fire but the live counts' own,
 * mail_run one with no update or delete trigger but theirs.  Otherwise
 * src/claim.c runs the statement, after moving the runs it may need into
 * mail_live.
 *
 * IDENTIFICATION
 *		src/claim_take.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "claim_take.h"
#include "catalog.h"
#include "mail_count.h"
#include "mail_exec.h"
#include "message_id.h"

#include "executor/executor.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/relscan.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_am.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

/* mail_live's columns, by name (an updated schema may have dropped some) */
static const char *const live_names[] = {
	"id", "queue", "priority", "send_at", "state", "attempt", "uncharged",
	"worker", "message_id", "last_error", "dedupe_key", "segment"
};
enum
{
	L_ID, L_QUEUE, L_PRIORITY, L_SEND_AT, L_STATE, L_ATTEMPT, L_UNCHARGED,
	L_WORKER, L_MESSAGE_ID, L_LAST_ERROR, L_DEDUPE_KEY, L_SEGMENT, L_NUM
};

/* mail_run's columns */
static const char *const run_names[] = {
	"id", "last_id", "queue", "priority", "send_at", "segment"
};
enum
{
	R_ID, R_LAST_ID, R_QUEUE, R_PRIORITY, R_SEND_AT, R_SEGMENT, R_NUM
};

/* the content's columns the claim returns or reads */
static const char *const mail_names[] = {
	"recipient", "recipient_name", "sender", "subject", "body", "html",
	"headers", "metadata", "send_by", "timezone", "created_at", "template",
	"template_version", "data"
};
enum
{
	M_RECIPIENT, M_RECIPIENT_NAME, M_SENDER, M_SUBJECT, M_BODY, M_HTML,
	M_HEADERS, M_METADATA, M_SEND_BY, M_TIMEZONE, M_CREATED_AT, M_TEMPLATE,
	M_TEMPLATE_VERSION, M_DATA, M_NUM
};

/* One segment's partition of gatekeeper.mail, opened by the walk. */
typedef struct ContentPart
{
	Relation	rel;			/* NULL: not opened yet */
	Relation	pkey;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	AttrNumber	att[M_NUM];
	int64		at;				/* the id of the entry the scan stands on;
								 * PG_INT64_MAX: on none */
} ContentPart;

/*
 * How far a lookup of content steps along the primary key from the last
 * entry it read before it descends from the root instead.  A claim takes
 * mail in (send_at, id) order within a priority, so the next mail's id is
 * mostly a few entries on, past other queues' mail and finished mail.
 */
#define CONTENT_STEPS 64

/* One queue's take. */
typedef struct Take
{
	Relation	live;
	Relation	due;
	AttrNumber	att[L_NUM];
	Snapshot	snapshot;
	CommandId	cid;
	TimestampTz now;
	Oid			scheduled;
	Oid			claimed;
	Oid			expired;
	Datum		queue;
	text	   *worker;
	const char *domain;			/* of generated Message-IDs, or NULL */
	const char *default_sender;
	ContentPart parts[GATEKEEPER_SEGMENTS];
	/* runs */
	Relation	run;
	Relation	run_due;
	AttrNumber	ratt[R_NUM];
	MailExec	run_x;			/* opened at the first run moved on */
	bool		have_run_floor; /* run_floor: where mail_run_due's walk starts */
	DueKey		run_floor;
	TupleTableSlot *run_new;	/* a run's next version */
	TupleTableSlot *synth;		/* the live row a run's mail stands for */
	MemoryContext outer;		/* the take's own allocations */
	MemoryContext per_mail;		/* one mail's, reset after it */
	int			share;
	int			taken;
	int64		scheduled_off;	/* for the live counts */
	int64		retrying_off;
	claim_take_receiver receive;
	void	   *arg;
} Take;

/*
 * Whether mail_live is a heap whose delete fires no trigger but the live
 * counts' own, and that one: what the walk does by hand is then all the
 * statement would do.
 */
static bool
live_deletes_plainly(Relation rel)
{
	static const char *const own[] = {"mail_live_count_delete"};
	uint32		found;

	return rel->rd_rel->relam == HEAP_TABLE_AM_OID &&
		gatekeeper_triggers_only(rel, TRIGGER_TYPE_DELETE, own, lengthof(own), &found) &&
		found == 1;
}

/*
 * Whether mail_run is a heap whose updates and deletes fire no trigger but
 * the live counts' own.
 */
static bool
runs_change_plainly(Relation rel)
{
	static const char *const upd[] = {"mail_run_count_update"};
	static const char *const del[] = {"mail_run_count_delete"};
	uint32		found;

	return rel->rd_rel->relam == HEAP_TABLE_AM_OID &&
		gatekeeper_triggers_only(rel, TRIGGER_TYPE_UPDATE, upd, lengthof(upd), &found) &&
		gatekeeper_triggers_only(rel, TRIGGER_TYPE_DELETE, del, lengthof(del), &found);
}

static Oid
state_oid(Relation live, AttrNumber att, const char *label)
{
	Oid			type = TupleDescAttr(RelationGetDescr(live), att - 1)->atttypid;

	return DatumGetObjectId(DirectFunctionCall2(enum_in, CStringGetDatum(label),
												ObjectIdGetDatum(type)));
}

/*
 * The partition of segment, opened with its primary key's scan.
 */
static ContentPart *
content_part(Take *t, int segment)
{
	ContentPart *p;
	Oid			relid;
	Oid			pkey;
	TupleDesc	desc;
	MemoryContext old;
	int			i;

	if (segment < 0 || segment >= GATEKEEPER_SEGMENTS)
		return NULL;
	p = &t->parts[segment];
	if (p->rel != NULL)
		return p;
	old = MemoryContextSwitchTo(t->outer);
	relid = gatekeeper_relid(GATEKEEPER_REL_MAIL_PART(segment), false);
	p->rel = table_open(relid, AccessShareLock);
	pkey = RelationGetPrimaryKeyIndex(p->rel);
	if (!OidIsValid(pkey))
		elog(ERROR, "gatekeeper.mail_%d has no primary key", segment);
	p->pkey = index_open(pkey, AccessShareLock);
	desc = RelationGetDescr(p->rel);
	for (i = 0; i < M_NUM; i++)
	{
		p->att[i] = SPI_fnumber(desc, mail_names[i]);
		if (p->att[i] <= 0)
			elog(ERROR, "gatekeeper.mail_%d has no column \"%s\"", segment, mail_names[i]);
	}
	if (p->pkey->rd_index->indnkeyatts != 2 ||
		p->pkey->rd_index->indkey.values[0] != SPI_fnumber(desc, "id") ||
		p->pkey->rd_index->indkey.values[1] != SPI_fnumber(desc, "segment"))
		elog(ERROR, "gatekeeper.mail_%d's primary key is not (id, segment)", segment);
	p->scan = index_beginscan(p->rel, p->pkey, t->snapshot, 1, 0);
	/* the entries' ids, to step from one to the next without the heap */
	p->scan->xs_want_itup = true;
	p->at = PG_INT64_MAX;
	p->slot = table_slot_create(p->rel, NULL);
	MemoryContextSwitchTo(old);
	return p;
}

static void
content_rescan(ContentPart *p, int64 id)
{
	ScanKeyData key;

	ScanKeyInit(&key, 1, BTGreaterEqualStrategyNumber, F_INT8GE, Int64GetDatum(id));
	index_rescan(p->scan, &key, 1, NULL, 0);
}

/*
 * The content row of mail id in segment, in p's slot, or NULL.
 *
 * One descent of the partition's primary key per claimed mail was most of
 * a claim's walk (docs/internals.md, "The claim's statements").  The
 * scan is instead kept on the last entry it read, and a lookup of a
 * greater id steps forward from there, reading each entry's id from the
 * index tuple and fetching the heap only at the id sought; a smaller id,
 * or one not reached within CONTENT_STEPS entries, starts a new scan at
 * it.  Entries come in (id, segment) order, so an entry past id means the
 * mail has no content row this snapshot sees; so does one whose heap
 * tuple, or every one of whose versions, the snapshot does not see.
 */
static ContentPart *
fetch_content(Take *t, int64 id, int16 segment)
{
	ContentPart *p = content_part(t, segment);
	ContentPart *found = NULL;
	MemoryContext old;
	int			steps = 0;

	if (p == NULL)
		return NULL;

	/*
	 * In the take's context, which lives as long as the scan: btree keeps
	 * what it allocates in the one current at the time (its workspace for
	 * index tuples, the items it will mark dead), and the walk resets its
	 * per-mail context after every mail.
	 */
	old = MemoryContextSwitchTo(t->outer);
	if (id <= p->at)
		content_rescan(p, id);
	for (;;)
	{
		ItemPointer tid = index_getnext_tid(p->scan, ForwardScanDirection);
		int64		entry;
		bool		isnull;

		if (tid == NULL)
		{
			p->at = PG_INT64_MAX;
			break;
		}
		entry = DatumGetInt64(index_getattr(p->scan->xs_itup, 1,
											p->scan->xs_itupdesc, &isnull));
		p->at = entry;
		if (entry < id)
		{
			/* too far behind: from the root (every entry after is >= id) */
			if (++steps > CONTENT_STEPS)
				content_rescan(p, id);
			continue;
		}
		if (entry > id)
			break;
		if (DatumGetInt16(index_getattr(p->scan->xs_itup, 2,
										p->scan->xs_itupdesc, &isnull)) == segment &&
			index_fetch_heap(p->scan, p->slot))
		{
			slot_getallattrs(p->slot);
			found = p;
			break;
		}
		/* a version this snapshot does not see: the id's next entry, if any */
	}
	MemoryContextSwitchTo(old);
	return found;
}

/*
 * Hand one taken mail to the receiver: the claim statement's columns,
 * computed as its RETURNING list computes them.
 */
static void
hand_over(Take *t, TupleTableSlot *live, ContentPart *c)
{
	Datum		v[CLAIM_TAKE_COLUMNS];
	bool		n[CLAIM_TAKE_COLUMNS];
	Datum	   *lv = live->tts_values;
	bool	   *ln = live->tts_isnull;
	Datum	   *mv = c->slot->tts_values;
	bool	   *mn = c->slot->tts_isnull;
	TupleDesc	desc = RelationGetDescr(t->live);
	Datum	   *rv;
	bool	   *rn;
	bool		expired;
	int32		attempt;
	Datum		message_id;
	bool		message_id_null = false;
	TimestampTz send_at;
	TimestampTz created_at;
	int			i;

#define LA(k) (t->att[k] - 1)
#define MA(k) (c->att[k] - 1)
	memset(n, 0, sizeof(n));
	expired = !mn[MA(M_SEND_BY)] &&
		DatumGetTimestampTz(mv[MA(M_SEND_BY)]) < t->now;
	attempt = DatumGetInt32(lv[LA(L_ATTEMPT)]) + (expired ? 0 : 1);
	if (!ln[LA(L_MESSAGE_ID)])
		message_id = lv[LA(L_MESSAGE_ID)];
	else
		message_id = PointerGetDatum(gatekeeper_message_id(DatumGetInt64(lv[LA(L_ID)]),
														   mv[MA(M_SENDER)], mn[MA(M_SENDER)],
														   t->domain, t->default_sender));
	send_at = DatumGetTimestampTz(lv[LA(L_SEND_AT)]);
	created_at = DatumGetTimestampTz(mv[MA(M_CREATED_AT)]);

	v[CT_ID] = lv[LA(L_ID)];
	v[CT_ATTEMPT] = Int32GetDatum(attempt);
	v[CT_QUEUE] = lv[LA(L_QUEUE)];
#define FROM_MAIL(col, m) (v[col] = mv[MA(m)], n[col] = mn[MA(m)])
	FROM_MAIL(CT_RECIPIENT, M_RECIPIENT);
	FROM_MAIL(CT_RECIPIENT_NAME, M_RECIPIENT_NAME);
	FROM_MAIL(CT_SENDER, M_SENDER);
	FROM_MAIL(CT_SUBJECT, M_SUBJECT);
	FROM_MAIL(CT_BODY, M_BODY);
	FROM_MAIL(CT_HTML, M_HTML);
	FROM_MAIL(CT_HEADERS, M_HEADERS);
	v[CT_MESSAGE_ID] = message_id;
	FROM_MAIL(CT_METADATA, M_METADATA);
	v[CT_EXPIRED] = BoolGetDatum(expired);
	v[CT_PRIORITY] = lv[LA(L_PRIORITY)];
	v[CT_SEND_AT] = lv[LA(L_SEND_AT)];
	FROM_MAIL(CT_SEND_BY, M_SEND_BY);
	FROM_MAIL(CT_TIMEZONE, M_TIMEZONE);
	v[CT_DUE] = TimestampTzGetDatum(Max(send_at, created_at));
	FROM_MAIL(CT_TEMPLATE, M_TEMPLATE);
	FROM_MAIL(CT_TEMPLATE_VERSION, M_TEMPLATE_VERSION);
	FROM_MAIL(CT_DATA, M_DATA);
	FROM_MAIL(CT_CREATED_AT, M_CREATED_AT);
#undef FROM_MAIL

	/* the claim state, as a mail_live record: the row as it was, claimed */
	rv = palloc(desc->natts * sizeof(Datum));
	rn = palloc(desc->natts * sizeof(bool));
	for (i = 0; i < desc->natts; i++)
	{
		rv[i] = lv[i];
		rn[i] = ln[i] || TupleDescAttr(desc, i)->attisdropped;
	}
	rv[LA(L_STATE)] = ObjectIdGetDatum(expired ? t->expired : t->claimed);
	rv[LA(L_ATTEMPT)] = Int32GetDatum(attempt);
	if (!expired)
	{
		rv[LA(L_WORKER)] = PointerGetDatum(t->worker);
		rn[LA(L_WORKER)] = t->worker == NULL;
	}
	rv[LA(L_MESSAGE_ID)] = message_id;
	rn[LA(L_MESSAGE_ID)] = message_id_null;
	if (expired)
	{
		rv[LA(L_LAST_ERROR)] = CStringGetTextDatum("not sent before send_by");
		rn[LA(L_LAST_ERROR)] = false;
	}
	v[CT_RECORD] = heap_copy_tuple_as_datum(heap_form_tuple(desc, rv, rn), desc);
#undef LA
#undef MA

	t->receive(t->arg, v, n);
}

/*
 * Keys of a scan of one of the due indexes (mail_due, mail_run_due: queue,
 * priority, ...) for the queue, and, with a strategy, its priority against
 * level; the number of keys.
 */
static int
queue_keys(Take *t, Relation idx, ScanKey keys, StrategyNumber strategy, int32 level)
{
	ScanKeyEntryInitialize(&keys[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
						   idx->rd_indcollation[0], F_TEXTEQ, t->queue);
	if (strategy == InvalidStrategy)
		return 1;
	ScanKeyInit(&keys[1], 2, strategy,
				strategy == BTEqualStrategyNumber ? F_INT4EQ : F_INT4LT,
				Int32GetDatum(level));
	return 2;
}

/*
 * A scan of one level of a due index (mail_due over mail_live, mail_run_due
 * over mail_run) for the queue, from a floor on in two ranges as
 * LiveStream describes (due_scan_begin, due_scan_past_floor).
 */
typedef struct DueScan
{
	Relation	heap;
	Relation	index;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	ScanKeyData keys[4];
	int			nkeys;
	bool		at_floor;		/* in the first of the floor's two ranges */
} DueScan;

/*
 * The live rows of one level, in (send_at, id) order.  In the due floor's
 * level the scan starts at the floor, (send_at, id) >= the floor's, as two
 * ranges of mail_due: send_at = the floor's and id >= its id, then send_at
 * beyond it (a key of send_at >= the floor's alone would start before the
 * floor's id, among the dead entries the floor is there to skip).
 */
typedef struct LiveStream
{
	DueScan		s;
	bool		valid;			/* slot holds the next row */
	bool		done;
	TimestampTz send_at;
	int64		id;
} LiveStream;

/*
 * The runs of one level, in (send_at, id) order; in the run floor's level
 * from the floor on, in two ranges as LiveStream.
 */
typedef struct RunStream
{
	DueScan		s;
	bool		valid;			/* the fields below are the next run */
	bool		done;
	bool		held;			/* locked by this take: its mails are ours */
	ItemPointerData tid;
	TimestampTz send_at;
	int64		next;			/* its first mail not yet taken */
	int64		last;
	int16		segment;
} RunStream;

/*
 * Begin s, the scan of the queue's level in index (over heap): from floor
 * on, in the first of the floor's two ranges, when floor is not NULL.
 */
static void
due_scan_begin(Take *t, DueScan *s, Relation heap, Relation index, int32 level,
			   const DueKey *floor)
{
	s->heap = heap;
	s->index = index;
	s->nkeys = queue_keys(t, index, s->keys, BTEqualStrategyNumber, level);
	if (floor != NULL)
	{
		ScanKeyInit(&s->keys[2], 3, BTEqualStrategyNumber, F_TIMESTAMPTZ_EQ,
					TimestampTzGetDatum(floor->send_at));
		ScanKeyInit(&s->keys[3], 4, BTGreaterEqualStrategyNumber, F_INT8GE,
					Int64GetDatum(floor->id));
		s->nkeys = 4;
		s->at_floor = true;
	}
	s->slot = table_slot_create(heap, NULL);
	s->scan = index_beginscan(heap, index, t->snapshot, s->nkeys, 0);
	index_rescan(s->scan, s->keys, s->nkeys, NULL, 0);
}

/*
 * The first of the floor's two ranges done: move s on to the level
 * beyond the floor's send_at.  False when s was past it already (the
 * level is done).
 */
static bool
due_scan_past_floor(Take *t, DueScan *s, const DueKey *floor)
{
	if (!s->at_floor)
		return false;
	s->at_floor = false;
	ScanKeyInit(&s->keys[2], 3, BTGreaterStrategyNumber, F_TIMESTAMPTZ_GT,
				TimestampTzGetDatum(floor->send_at));
	s->nkeys = 3;
	/* a scan's number of keys is fixed when it begins */
	index_endscan(s->scan);
	s->scan = index_beginscan(s->heap, s->index, t->snapshot, s->nkeys, 0);
	index_rescan(s->scan, s->keys, s->nkeys, NULL, 0);
	return true;
}

static void
live_advance(Take *t, LiveStream *a, const DueKey *floor)
{
	for (;;)
	{
		while (index_getnext_slot(a->s.scan, ForwardScanDirection, a->s.slot))
		{
			Datum	   *v;
			bool	   *nl;

			slot_getallattrs(a->s.slot);
			v = a->s.slot->tts_values;
			nl = a->s.slot->tts_isnull;
			if (nl[t->att[L_STATE] - 1] ||
				DatumGetObjectId(v[t->att[L_STATE] - 1]) != t->scheduled)
				continue;
			a->send_at = DatumGetTimestampTz(v[t->att[L_SEND_AT] - 1]);
			a->id = DatumGetInt64(v[t->att[L_ID] - 1]);
			a->valid = true;
			return;
		}
		if (!due_scan_past_floor(t, &a->s, floor))
			break;
	}
	a->valid = false;
	a->done = true;
}

/*
 * Write what the take did to the run it holds: moved on past the mails
 * taken, or deleted when it has none left.
 */
static void
run_finish(Take *t, RunStream *b)
{
	TM_FailureData tmfd;
	TM_Result	result;

	if (!b->held)
		return;
	b->held = false;
	if (b->next > b->last)
		result = mail_exec_delete(t->run, &b->tid, t->cid, t->snapshot, true, &tmfd);
	else
	{
		TupleTableSlot *n;

		if (t->run_x.rri == NULL)
		{
			/* the first run this take moves on: its executor state, once */
			MemoryContext old = MemoryContextSwitchTo(t->outer);

			mail_exec_open(&t->run_x, t->run, t->cid);
			t->run_new = table_slot_create(t->run, NULL);
			MemoryContextSwitchTo(old);
		}
		n = t->run_new;
		mail_exec_new_version(b->s.slot, n);
		n->tts_values[t->ratt[R_ID] - 1] = Int64GetDatum(b->next);
		ExecStoreVirtualTuple(n);
		result = mail_exec_update(&t->run_x, &b->tid, n, t->snapshot, true, &tmfd);
		ExecClearTuple(n);
	}
	if (result != TM_Ok)
		elog(ERROR, "could not move on a run of gatekeeper.mail_run the claim holds");
}

/*
 * Finish the run b holds, and stand on the next run of the level.
 */
static void
run_advance(Take *t, RunStream *b)
{
	run_finish(t, b);
	for (;;)
	{
		while (index_getnext_slot(b->s.scan, ForwardScanDirection, b->s.slot))
		{
			Datum	   *v;

			slot_getallattrs(b->s.slot);
			v = b->s.slot->tts_values;
			b->tid = b->s.slot->tts_tid;
			b->send_at = DatumGetTimestampTz(v[t->ratt[R_SEND_AT] - 1]);
			b->next = DatumGetInt64(v[t->ratt[R_ID] - 1]);
			b->last = DatumGetInt64(v[t->ratt[R_LAST_ID] - 1]);
			b->segment = DatumGetInt16(v[t->ratt[R_SEGMENT] - 1]);
			b->valid = true;
			return;
		}
		if (!due_scan_past_floor(t, &b->s, &t->run_floor))
			break;
	}
	b->valid = false;
	b->done = true;
}

/*
 * Lock the run b stands on without waiting; false when another
 * transaction holds it or changed it since the snapshot (under REPEATABLE
 * READ or SERIALIZABLE a change is a serialization failure, as FOR UPDATE
 * makes it).
 */
static bool
run_lock(Take *t, RunStream *b)
{
	TM_FailureData tmfd;
	TM_Result	result;

	result = table_tuple_lock(t->run, &b->tid, t->snapshot, b->s.slot, t->cid,
							  LockTupleExclusive, LockWaitSkip, 0, &tmfd);
	if (result == TM_Ok)
	{
		b->held = true;
		return true;
	}
	if (IsolationUsesXactSnapshot() && (result == TM_Updated || result == TM_Deleted))
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent %s",
						result == TM_Updated ? "update" : "delete")));
	return false;
}

/*
 * Take the live row a stands on, if its content is there and no one else
 * holds it.
 */
static void
take_live(Take *t, LiveStream *a)
{
	Datum	   *v = a->s.slot->tts_values;
	ContentPart *c;
	TM_FailureData tmfd;
	TM_Result	result;
	MemoryContext old;

	old = MemoryContextSwitchTo(t->per_mail);
	c = fetch_content(t, a->id, DatumGetInt16(v[t->att[L_SEGMENT] - 1]));
	if (c != NULL)
	{
		result = mail_exec_delete(t->live, &a->s.slot->tts_tid, t->cid, t->snapshot, false,
								  &tmfd);
		if (result == TM_Ok)
		{
			t->taken++;
			t->scheduled_off++;
			if (DatumGetInt32(v[t->att[L_ATTEMPT] - 1]) > 0)
				t->retrying_off++;
			hand_over(t, a->s.slot, c);
		}
		else if (IsolationUsesXactSnapshot() &&
				 (result == TM_Updated || result == TM_Deleted))
			/* as FOR UPDATE SKIP LOCKED, in ExecLockRows */
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize access due to concurrent %s",
							result == TM_Updated ? "update" : "delete")));
	}
	MemoryContextSwitchTo(old);
	MemoryContextReset(t->per_mail);
}

/*
 * Take the first mail of the run b holds: handed over as the live row it
 * stands for.  A mail without content (its row deleted with gatekeeper's
 * triggers disabled) leaves the run untaken.
 */
static void
take_run_mail(Take *t, RunStream *b)
{
	TupleTableSlot *l = t->synth;
	Datum	   *rv = b->s.slot->tts_values;
	ContentPart *c;
	MemoryContext old;
	int64		id = b->next++;

	old = MemoryContextSwitchTo(t->per_mail);
	c = fetch_content(t, id, b->segment);
	if (c != NULL)
	{
		ExecClearTuple(l);
		memset(l->tts_isnull, true, l->tts_tupleDescriptor->natts * sizeof(bool));
#define SET_LIVE(k, d) (l->tts_values[t->att[k] - 1] = (d), l->tts_isnull[t->att[k] - 1] = false)
		SET_LIVE(L_ID, Int64GetDatum(id));
		SET_LIVE(L_QUEUE, rv[t->ratt[R_QUEUE] - 1]);
		SET_LIVE(L_PRIORITY, rv[t->ratt[R_PRIORITY] - 1]);
		SET_LIVE(L_SEND_AT, rv[t->ratt[R_SEND_AT] - 1]);
		SET_LIVE(L_STATE, ObjectIdGetDatum(t->scheduled));
		SET_LIVE(L_ATTEMPT, Int32GetDatum(0));
		SET_LIVE(L_UNCHARGED, Int32GetDatum(0));
		SET_LIVE(L_SEGMENT, Int16GetDatum(b->segment));
#undef SET_LIVE
		ExecStoreVirtualTuple(l);
		t->taken++;
		t->scheduled_off++;
		hand_over(t, l, c);
	}
	else
		t->scheduled_off++;
	MemoryContextSwitchTo(old);
	MemoryContextReset(t->per_mail);
}

/*
 * Take the due mail of one priority level, live rows and runs merged,
 * until the share is taken (true) or the level has no more due mail.
 * floor: where the level's live rows start, when the due floor is in it.
 */
static bool
walk_level(Take *t, int32 level, const DueKey *floor)
{
	LiveStream	a;
	RunStream	b;

	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	due_scan_begin(t, &a.s, t->live, t->due, level, floor);
	live_advance(t, &a, floor);

	if (t->run != NULL)
	{
		/* past the runs claimed before (due_floor.c) */
		due_scan_begin(t, &b.s, t->run, t->run_due, level,
					   t->have_run_floor && level == t->run_floor.priority ?
					   &t->run_floor : NULL);
		run_advance(t, &b);
	}
	else
		b.done = true;

	while (t->taken < t->share && (a.valid || b.valid))
	{
		bool		live_first;

		CHECK_FOR_INTERRUPTS();
		live_first = a.valid &&
			(!b.valid || a.send_at < b.send_at ||
			 (a.send_at == b.send_at && a.id < b.next));
		if ((live_first ? a.send_at : b.send_at) > t->now)
			break;				/* the rest of the level is not due */
		if (live_first)
		{
			take_live(t, &a);
			live_advance(t, &a, floor);
			continue;
		}
		if (!b.held && !run_lock(t, &b))
		{
			run_advance(t, &b);
			continue;
		}
		take_run_mail(t, &b);
		if (b.next > b.last)
			run_advance(t, &b);
	}
	run_finish(t, &b);

	index_endscan(a.s.scan);
	ExecDropSingleTupleTableSlot(a.s.slot);
	if (b.s.scan != NULL)
	{
		index_endscan(b.s.scan);
		ExecDropSingleTupleTableSlot(b.s.slot);
	}
	return t->taken >= t->share;
}

/*
 * The highest priority level below "below" (PG_INT32_MAX + 1: any) with a
 * scheduled live row or a run of the queue, or false when there is none.
 * A live row's level counts only from the floor on, when there is one.
 */
static bool
next_level(Take *t, int64 below, const DueKey *floor, int32 *level)
{
	ScanKeyData keys[2];
	bool		found = false;
	int			nkeys;
	int			r;

	for (r = 0; r < 2; r++)
	{
		Relation	rel = r == 0 ? t->live : t->run;
		Relation	idx = r == 0 ? t->due : t->run_due;
		IndexScanDesc scan;
		TupleTableSlot *slot;
		AttrNumber	patt = r == 0 ? t->att[L_PRIORITY] : t->ratt[R_PRIORITY];

		if (rel == NULL)
			continue;
		if (r == 0 && floor != NULL && below > floor->priority)
		{
			/* no live row above the floor's level is scheduled */
			if (!found || floor->priority > *level)
				*level = floor->priority;
			found = true;
			continue;
		}
		if (r == 1 && t->have_run_floor && below > t->run_floor.priority)
		{
			/* nor a run above the run floor's level */
			if (!found || t->run_floor.priority > *level)
				*level = t->run_floor.priority;
			found = true;
			continue;
		}
		nkeys = queue_keys(t, idx, keys,
						   below <= PG_INT32_MAX ? BTLessStrategyNumber : InvalidStrategy,
						   below <= PG_INT32_MAX ? (int32) below : 0);
		slot = table_slot_create(rel, NULL);
		scan = index_beginscan(rel, idx, t->snapshot, nkeys, 0);
		index_rescan(scan, keys, nkeys, NULL, 0);
		while (index_getnext_slot(scan, ForwardScanDirection, slot))
		{
			bool		isnull;
			int32		p;

			if (r == 0)
			{
				Datum		st = slot_getattr(slot, t->att[L_STATE], &isnull);

				if (isnull || DatumGetObjectId(st) != t->scheduled)
					continue;
			}
			p = DatumGetInt32(slot_getattr(slot, patt, &isnull));
			if (!found || p > *level)
				*level = p;
			found = true;
			break;
		}
		index_endscan(scan);
		ExecDropSingleTupleTableSlot(slot);
	}
	return found;
}

/*
 * gatekeeper_claim_take
 *		Take up to share due mails of queue, from floor (NULL: from the
 *		queue's first entry), handing each to receive; returns how many, or
 *		-1 when the walk would not do what the claim statement does (the
 *		caller runs the statement).
 */
int
gatekeeper_claim_take(const char *queue, int share, const DueKey *floor, text *worker,
					  const char *domain, const char *default_sender,
					  claim_take_receiver receive, void *arg)
{
	Take		t;
	Oid			live_relid = gatekeeper_relid(GATEKEEPER_REL_MAIL_LIVE, false);
	Oid			due_relid = gatekeeper_relid(GATEKEEPER_REL_MAIL_DUE, false);
	Oid			run_relid = gatekeeper_relid(GATEKEEPER_REL_MAIL_RUN, true);
	int64		below = (int64) PG_INT32_MAX + 1;
	int32		level = 0;
	int			i;

	/* as the executor refuses the statement */
	PreventCommandIfReadOnly("DELETE");

	memset(&t, 0, sizeof(t));
	t.live = table_open(live_relid, RowExclusiveLock);
	if (!live_deletes_plainly(t.live))
	{
		table_close(t.live, NoLock);
		return -1;
	}
	if (OidIsValid(run_relid))
	{
		t.run = table_open(run_relid, RowExclusiveLock);
		if (!runs_change_plainly(t.run))
		{
			table_close(t.run, NoLock);
			table_close(t.live, NoLock);
			return -1;
		}
		for (i = 0; i < R_NUM; i++)
		{
			t.ratt[i] = SPI_fnumber(RelationGetDescr(t.run), run_names[i]);
			if (t.ratt[i] <= 0)
				elog(ERROR, "gatekeeper.mail_run has no column \"%s\"", run_names[i]);
		}
		t.run_due = index_open(gatekeeper_relid(GATEKEEPER_REL_MAIL_RUN_DUE, false),
							   AccessShareLock);
		/* start past the entries of runs claimed before (due_floor.c) */
		t.have_run_floor = gatekeeper_due_floor_raise_run(queue, &t.run_floor);
	}
	for (i = 0; i < L_NUM; i++)
	{
		t.att[i] = SPI_fnumber(RelationGetDescr(t.live), live_names[i]);
		if (t.att[i] <= 0)
			elog(ERROR, "gatekeeper.mail_live has no column \"%s\"", live_names[i]);
	}
	t.due = index_open(due_relid, AccessShareLock);
	t.synth = MakeSingleTupleTableSlot(RelationGetDescr(t.live), &TTSOpsVirtual);

	/* as a statement starts: its own snapshot (READ COMMITTED), its own command */
	CommandCounterIncrement();
	t.snapshot = RegisterSnapshot(GetTransactionSnapshot());
	t.cid = GetCurrentCommandId(true);
	/* a copy: under REPEATABLE READ the transaction's, brought to this command */
	t.snapshot->curcid = t.cid;
	t.now = GetCurrentTransactionStartTimestamp();
	t.scheduled = state_oid(t.live, t.att[L_STATE], "scheduled");
	t.claimed = state_oid(t.live, t.att[L_STATE], "claimed");
	t.expired = state_oid(t.live, t.att[L_STATE], "expired");
	t.queue = CStringGetTextDatum(queue);
	t.worker = worker;
	t.domain = domain;
	t.default_sender = default_sender;
	t.share = share;
	t.receive = receive;
	t.arg = arg;
	t.outer = CurrentMemoryContext;
	t.per_mail = AllocSetContextCreate(CurrentMemoryContext, "gatekeeper claim take",
									   ALLOCSET_DEFAULT_SIZES);

	/* level by level, from the highest, each up to its first mail not yet due */
	while (t.taken < t.share && next_level(&t, below, floor, &level))
	{
		walk_level(&t, level, floor != NULL && level == floor->priority ? floor : NULL);
		below = level;
	}

	if (t.scheduled_off > 0)
	{
		MailCount  *count = mail_count_start(live_relid);

		mail_count_move(count, t.queue, COUNT_NONE, -t.scheduled_off, -t.retrying_off);
		mail_count_end(count);
	}

	for (i = 0; i < GATEKEEPER_SEGMENTS; i++)
	{
		ContentPart *p = &t.parts[i];

		if (p->rel == NULL)
			continue;
		index_endscan(p->scan);
		ExecDropSingleTupleTableSlot(p->slot);
		index_close(p->pkey, NoLock);
		table_close(p->rel, NoLock);
	}
	UnregisterSnapshot(t.snapshot);
	ExecDropSingleTupleTableSlot(t.synth);
	if (t.run != NULL)
	{
		if (t.run_x.rri != NULL)
		{
			ExecDropSingleTupleTableSlot(t.run_new);
			mail_exec_close(&t.run_x);
		}
		index_close(t.run_due, NoLock);
		table_close(t.run, NoLock);
	}
	index_close(t.due, NoLock);
	table_close(t.live, NoLock);
	MemoryContextDelete(t.per_mail);
	/* what follows sees the deletes */
	CommandCounterIncrement();
	return t.taken;
}
