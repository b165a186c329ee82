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
 * claim record computed in numeric and SQL expressions (bench/notes.md,
 * "The claim without its statement").
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
 * live counts directly (src/live_count.c), as the live writer counts what
 * it inserts.
 *
 * The walk is taken only when it does what the statement would: mail_live
 * a heap with no delete trigger that would fire but the live counts' own.
 * Otherwise src/claim.c runs the statement.
 *
 * IDENTIFICATION
 *		src/claim_take.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "claim_take.h"
#include "catalog.h"
#include "live_count.h"

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

/* the content's columns the claim returns or reads */
static const char *const mail_names[] = {
	"recipient", "recipient_name", "sender", "subject", "body", "html",
	"headers", "metadata", "send_by", "timezone", "created_at"
};
enum
{
	M_RECIPIENT, M_RECIPIENT_NAME, M_SENDER, M_SUBJECT, M_BODY, M_HTML,
	M_HEADERS, M_METADATA, M_SEND_BY, M_TIMEZONE, M_CREATED_AT, M_NUM
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
	MemoryContext outer;		/* the take's own allocations */
	MemoryContext per_mail;		/* one mail's, reset after it */
	int			share;
	int			taken;
	int64		scheduled_off;	/* for the live counts */
	int64		retrying_off;
	claim_take_receiver receive;
	void	   *arg;
} Take;

/* how a walk of one range of mail_due ended */
typedef enum WalkEnd
{
	WALK_FULL,					/* the share is taken */
	WALK_NOT_DUE,				/* at a mail not yet due: *level its priority */
	WALK_END					/* the range holds no more */
} WalkEnd;

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
 * a claim's walk (bench/notes.md, "The claim at batch 100").  The
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
 * The Message-ID gatekeeper gives a mail that has none:
 * <id.created_at-in-microseconds-since-1970-in-hex@domain>, the domain
 * gatekeeper.message_id_domain, else the sender's, else the default
 * sender's, else gatekeeper.invalid.
 */
static text *
generated_message_id(Take *t, int64 id, TimestampTz created_at, Datum sender, bool sender_null)
{
	StringInfoData buf;
	const char *domain = NULL;
	int			domain_len = 0;
	char	   *from = NULL;
	int64		micros;

	if (TIMESTAMP_NOT_FINITE(created_at))
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("mail %lld has an infinite created_at", (long long) id)));
	micros = created_at + (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY;

	if (t->domain != NULL && t->domain[0] != '\0')
		domain = t->domain, domain_len = strlen(domain);
	else
	{
		from = !sender_null ? TextDatumGetCString(sender) :
			(t->default_sender != NULL ? pstrdup(t->default_sender) : pstrdup(""));
		/* the part after the last '@' (all of it without one), '>' and ' ' off its end */
		domain = strrchr(from, '@');
		domain = domain != NULL ? domain + 1 : from;
		domain_len = strlen(domain);
		while (domain_len > 0 && (domain[domain_len - 1] == '>' || domain[domain_len - 1] == ' '))
			domain_len--;
		if (domain_len == 0)
			domain = "gatekeeper.invalid", domain_len = strlen(domain);
	}
	initStringInfo(&buf);
	appendStringInfo(&buf, "<" INT64_FORMAT ".%llx@", id, (unsigned long long) (uint64) micros);
	appendBinaryStringInfo(&buf, domain, domain_len);
	appendStringInfoChar(&buf, '>');
	return cstring_to_text_with_len(buf.data, buf.len);
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
		message_id = PointerGetDatum(generated_message_id(t, DatumGetInt64(lv[LA(L_ID)]),
														  DatumGetTimestampTz(mv[MA(M_CREATED_AT)]),
														  mv[MA(M_SENDER)], mn[MA(M_SENDER)]));
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
 * Walk mail_due under keys, taking the due mails whose rows no one else
 * holds until the share is taken.
 */
static WalkEnd
walk(Take *t, ScanKey keys, int nkeys, int32 *level)
{
	IndexScanDesc scan;
	TupleTableSlot *slot = table_slot_create(t->live, NULL);
	WalkEnd		end = WALK_END;

	scan = index_beginscan(t->live, t->due, t->snapshot, nkeys, 0);
	index_rescan(scan, keys, nkeys, NULL, 0);
	while (t->taken < t->share &&
		   index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		Datum	   *v;
		bool	   *nl;
		ContentPart *c;
		TM_FailureData tmfd;
		TM_Result	result;
		MemoryContext old;

		CHECK_FOR_INTERRUPTS();
		slot_getallattrs(slot);
		v = slot->tts_values;
		nl = slot->tts_isnull;
		if (nl[t->att[L_STATE] - 1] ||
			DatumGetObjectId(v[t->att[L_STATE] - 1]) != t->scheduled)
			continue;
		if (DatumGetTimestampTz(v[t->att[L_SEND_AT] - 1]) > t->now)
		{
			*level = DatumGetInt32(v[t->att[L_PRIORITY] - 1]);
			end = WALK_NOT_DUE;
			break;
		}

		old = MemoryContextSwitchTo(t->per_mail);
		c = fetch_content(t, DatumGetInt64(v[t->att[L_ID] - 1]),
						  DatumGetInt16(v[t->att[L_SEGMENT] - 1]));
		if (c == NULL)
		{
			MemoryContextSwitchTo(old);
			MemoryContextReset(t->per_mail);
			continue;
		}

		result = table_tuple_delete(t->live, &slot->tts_tid, t->cid, t->snapshot,
									InvalidSnapshot, false, &tmfd, false);
		if (result != TM_Ok)
		{
			/* as FOR UPDATE SKIP LOCKED, in ExecLockRows */
			if (IsolationUsesXactSnapshot() &&
				(result == TM_Updated || result == TM_Deleted))
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access due to concurrent %s",
								result == TM_Updated ? "update" : "delete")));
			MemoryContextSwitchTo(old);
			MemoryContextReset(t->per_mail);
			continue;
		}
		t->taken++;
		t->scheduled_off++;
		if (DatumGetInt32(v[t->att[L_ATTEMPT] - 1]) > 0)
			t->retrying_off++;
		hand_over(t, slot, c);
		MemoryContextSwitchTo(old);
		MemoryContextReset(t->per_mail);
	}
	if (t->taken >= t->share)
		end = WALK_FULL;
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	return end;
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
	ScanKeyData keys[4];
	WalkEnd		end;
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
	for (i = 0; i < L_NUM; i++)
	{
		t.att[i] = SPI_fnumber(RelationGetDescr(t.live), live_names[i]);
		if (t.att[i] <= 0)
			elog(ERROR, "gatekeeper.mail_live has no column \"%s\"", live_names[i]);
	}
	t.due = index_open(due_relid, AccessShareLock);

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

	ScanKeyEntryInitialize(&keys[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
						   t.due->rd_indcollation[0], F_TEXTEQ, t.queue);
	if (floor == NULL)
		end = walk(&t, keys, 1, &level);
	else
	{
		/* the floor's level from the floor on, then the levels below it */
		ScanKeyInit(&keys[1], 2, BTEqualStrategyNumber, F_INT4EQ,
					Int32GetDatum(floor->priority));
		ScanKeyInit(&keys[2], 3, BTEqualStrategyNumber, F_TIMESTAMPTZ_EQ,
					TimestampTzGetDatum(floor->send_at));
		ScanKeyInit(&keys[3], 4, BTGreaterEqualStrategyNumber, F_INT8GE,
					Int64GetDatum(floor->id));
		end = walk(&t, keys, 4, &level);
		if (end == WALK_END)
		{
			ScanKeyInit(&keys[2], 3, BTGreaterStrategyNumber, F_TIMESTAMPTZ_GT,
						TimestampTzGetDatum(floor->send_at));
			end = walk(&t, keys, 3, &level);
		}
		if (end != WALK_FULL)
		{
			level = floor->priority;
			end = WALK_NOT_DUE;
		}
	}
	/* each level below the last, up to its first mail not yet due */
	while (end == WALK_NOT_DUE)
	{
		ScanKeyInit(&keys[1], 2, BTLessStrategyNumber, F_INT4LT, Int32GetDatum(level));
		end = walk(&t, keys, 2, &level);
	}

	if (t.scheduled_off > 0)
		gatekeeper_live_count_add(live_relid, t.queue, -t.scheduled_off, -t.retrying_off);

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
	index_close(t.due, NoLock);
	table_close(t.live, NoLock);
	MemoryContextDelete(t.per_mail);
	/* what follows sees the deletes */
	CommandCounterIncrement();
	return t.taken;
}
