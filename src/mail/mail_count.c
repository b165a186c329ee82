/*-------------------------------------------------------------------------
 *
 * mail_count.c
 *		Counting: every move of the mail (enqueue, claim, the runs moved to
 *		live rows, an outcome, an event, a report) notes its change to the
 *		queues' counts here, and the end of the transaction publishes it.
 *
 * gatekeeper.queue_stats reads two stores (docs/internals.md, "Counting"):
 * the totals, counters in shared memory added after the commit
 * (count_totals.c), and the live gauges scheduled and retrying, rows of
 * mail_live_count written just before the commit (live_count.c).  One
 * path fills both.  A statement's rows are tallied by queue
 * (mail_count_start, then mail_count_move for each row, then
 * mail_count_end), by the writers of src/mail/ as they write and by the
 * statement triggers (_count_done on mail_done, _count_events on
 * event_log, _count_live on mail_live and mail_run; count_triggers.c)
 * from their transition tables.  mail_count_end notes the tally in this backend by transaction
 * nesting level, one record per queue holding both kinds of change: a
 * subtransaction that aborts drops its records, one that commits hands
 * them to its parent.  At the top level the commit (or PREPARE
 * TRANSACTION) first writes the gauges, which may still fail; once
 * committed the totals are added, which must not; an abort drops both.
 * A prepared transaction's totals are not counted: nothing of this
 * backend's memory survives to its COMMIT PREPARED.
 *
 * A TRUNCATE of mail_live (and drop_queue, for its queue) deletes the
 * gauges' rows and sets aside the gauge changes noted before it, which
 * are in the recount or gone with the rows they counted (a subtransaction
 * that aborts brings them back); the totals they carry still count.  A
 * deleted queue, a dropped extension or database notes a record that
 * removes its totals at commit, in order with the counts noted around it.
 *
 * IDENTIFICATION
 *		src/mail/mail_count.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "mail_count.h"
#include "live_count.h"
#include "mail_store.h"
#include "catalog.h"
#include "due_floor.h"

#include "access/xact.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_database.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/tuplestore.h"

#include "gatekeeper.h"

PG_FUNCTION_INFO_V1(gatekeeper_forget_queue);
PG_FUNCTION_INFO_V1(gatekeeper_forget_live);
PG_FUNCTION_INFO_V1(gatekeeper_live_pending);
PG_FUNCTION_INFO_V1(gatekeeper_recount_live);

/* Distinct queues a tally groups its rows by before noting them */
#define COUNT_GROUPS		16

/* The terminal states, by CountKind from COUNT_SENT on */
static const char *const finished_states[] = {
	"sent", "failed", "suppressed", "expired", "cancelled", "unknown"
};

/* One queue's change noted by this backend, not yet published */
typedef struct PendingCount
{
	CountTotalsChange totals;	/* its key, its counts, or a forget */
	Oid			relid;			/* the mail_live its gauges count, or
								 * InvalidOid: no gauge noted yet */
	char	   *queue;			/* in count_context, not NUL-terminated */
	int			len;			/* -1: a forget of no one queue */
	int			level;			/* transaction nesting level that noted it */
	int			erased;			/* level of a later TRUNCATE, or 0: its
								 * gauges are set aside */
	int64		scheduled;
	int64		retrying;		/* of those, attempted before */
} PendingCount;

/* One queue's rows in one statement */
typedef struct CountGroup
{
	text	   *queue;
	int64		counts[COUNT_KINDS];
	int64		scheduled;
	int64		retrying;
} CountGroup;

/*
 * A statement's rows counted by queue: the groups seen last, noted (and
 * the slots reused) whenever all are taken; the queue names are copied
 * into the tally's own context.
 */
struct MailCount
{
	Oid			live_relid;
	MemoryContext context;
	int			ngroups;
	CountGroup	groups[COUNT_GROUPS];
};

/* this transaction's changes, and the context of their queue names */
static PendingCount *pending = NULL;
static int	npending = 0;
static int	maxpending = 0;
static MemoryContext count_context = NULL;

static object_access_hook_type prev_object_access_hook = NULL;

static MemoryContext names_context(void);
static PendingCount *pending_append(void);
static bool same_queue(const PendingCount *p, const PendingCount *q);
static bool mergeable(const PendingCount *into, const PendingCount *p);
static void merge(PendingCount *into, const PendingCount *p);
static void note_change(Oid relid, const char *queue, int len, const int64 *counts,
						int64 scheduled, int64 retrying);
static void note_forget(const CountKey *key, CountForget what, const char *queue, int len);
static void note_groups(MailCount *count);
static void write_gauges(bool prepare);
static const CountTotalsChange *next_totals(void *arg);
static void forget_pending(void);
static Oid	live_relid_now(void);
static void count_object_access(ObjectAccessType access, Oid classId, Oid objectId,
								int subId, void *arg);

/*
 * mail_count_start
 *		Start a statement's tally, in the current memory context.  Its
 *		gauges count the mail_live of live_relid (InvalidOid: a statement
 *		that moves no live mail).
 */
MailCount *
mail_count_start(Oid live_relid)
{
	MailCount  *count = palloc(sizeof(MailCount));

	count->live_relid = live_relid;
	count->context = AllocSetContextCreate(CurrentMemoryContext, "gatekeeper count",
										   ALLOCSET_SMALL_SIZES);
	count->ngroups = 0;
	return count;
}

/*
 * mail_count_move
 *		Count one move of a mail of queue (a text datum): one to the total
 *		of kind (a CountKind, or COUNT_NONE), and scheduled and retrying
 *		(either may be negative, or zero) to its live gauges.
 */
void
mail_count_move(MailCount *count, Datum queue, int kind, int64 scheduled, int64 retrying)
{
	text	   *q = (text *) DatumGetPointer(queue);
	int			qlen = VARSIZE_ANY_EXHDR(q);
	CountGroup *g = NULL;
	int			i;

	if (kind != COUNT_NONE && !count_totals_kept())
		kind = COUNT_NONE;
	if (kind == COUNT_NONE && scheduled == 0 && retrying == 0)
		return;
	for (i = 0; i < count->ngroups; i++)
	{
		if (qlen == (int) VARSIZE_ANY_EXHDR(count->groups[i].queue) &&
			memcmp(VARDATA_ANY(q), VARDATA_ANY(count->groups[i].queue), qlen) == 0)
		{
			g = &count->groups[i];
			break;
		}
	}
	if (g == NULL)
	{
		if (count->ngroups == COUNT_GROUPS)
			note_groups(count);
		g = &count->groups[count->ngroups++];
		memset(g, 0, sizeof(*g));
		g->queue = (text *) MemoryContextAlloc(count->context, qlen + VARHDRSZ);
		SET_VARSIZE(g->queue, qlen + VARHDRSZ);
		memcpy(VARDATA(g->queue), VARDATA_ANY(q), qlen);
	}
	if (kind != COUNT_NONE)
		g->counts[kind]++;
	g->scheduled += scheduled;
	g->retrying += retrying;
}

/*
 * mail_count_outcome
 *		The total a mail finished in state (a value of the enum state_type)
 *		counts in, or COUNT_NONE when state is not a terminal state.
 */
int
mail_count_outcome(Oid state_type, Oid state)
{
	static Oid	values_type = InvalidOid;
	static Oid	values[COUNT_UNKNOWN - COUNT_SENT + 1];
	int			kind;

	if (values_type != state_type)
	{
		for (kind = 0; kind <= COUNT_UNKNOWN - COUNT_SENT; kind++)
			values[kind] = DatumGetObjectId(DirectFunctionCall2(enum_in,
																CStringGetDatum(finished_states[kind]),
																ObjectIdGetDatum(state_type)));
		values_type = state_type;
	}
	for (kind = COUNT_SENT; kind <= COUNT_UNKNOWN; kind++)
		if (values[kind - COUNT_SENT] == state)
			return kind;
	return COUNT_NONE;
}

/*
 * mail_count_end
 *		Note the tally's counts for the transaction's end, and free it.
 */
void
mail_count_end(MailCount *count)
{
	if (count->ngroups > 0 && count_totals_kept())
		count_totals_make_room(count_totals_extension());
	note_groups(count);
	MemoryContextDelete(count->context);
	pfree(count);
}

/*
 * mail_store_count_report
 *		Count one report ingest_report or record_event took: recorded (it
 *		wrote at least one event) or ignored.  Kept under the key of the
 *		empty name, which no queue has.
 */
void
mail_store_count_report(bool recorded)
{
	int64		counts[COUNT_KINDS];

	if (!count_totals_kept())
		return;
	memset(counts, 0, sizeof(counts));
	counts[recorded ? COUNT_REPORTS : COUNT_IGNORED] = 1;
	note_change(InvalidOid, "", 0, counts, 0, 0);
}

/*
 * The context of the pending records' queue names, reset when the
 * transaction ends.
 */
static MemoryContext
names_context(void)
{
	if (count_context == NULL)
		count_context = AllocSetContextCreate(TopMemoryContext,
											  "gatekeeper pending counts",
											  ALLOCSET_SMALL_SIZES);
	return count_context;
}

/*
 * A new record at the end of the pending list, for the current level.
 */
static PendingCount *
pending_append(void)
{
	PendingCount *p;

	if (npending == maxpending)
	{
		int			newmax = Max(16, maxpending * 2);

		if (pending == NULL)
			pending = MemoryContextAlloc(TopMemoryContext, newmax * sizeof(PendingCount));
		else
			pending = repalloc(pending, newmax * sizeof(PendingCount));
		maxpending = newmax;
	}
	p = &pending[npending++];
	memset(p, 0, sizeof(*p));
	p->level = GetCurrentTransactionNestLevel();
	return p;
}

/*
 * Whether two records are of the same queue.
 */
static bool
same_queue(const PendingCount *p, const PendingCount *q)
{
	return memcmp(&p->totals.key, &q->totals.key, sizeof(CountKey)) == 0 &&
		p->len == q->len && p->len >= 0 && memcmp(p->queue, q->queue, p->len) == 0;
}

/*
 * Whether p's change may join into's, of the same queue: neither is a
 * forget, nor set aside, and their gauges count the same mail_live.
 */
static bool
mergeable(const PendingCount *into, const PendingCount *p)
{
	return into->totals.forget == FORGET_NOTHING && p->totals.forget == FORGET_NOTHING &&
		into->erased == 0 && p->erased == 0 &&
		(into->relid == p->relid || !OidIsValid(into->relid) || !OidIsValid(p->relid));
}

/*
 * Add p's change to into's.
 */
static void
merge(PendingCount *into, const PendingCount *p)
{
	int			k;

	for (k = 0; k < COUNT_KINDS; k++)
		into->totals.counts[k] += p->totals.counts[k];
	into->scheduled += p->scheduled;
	into->retrying += p->retrying;
	if (!OidIsValid(into->relid))
		into->relid = p->relid;
}

/*
 * Note a queue's change at the current nesting level: counts (NULL: none)
 * to its totals, scheduled and retrying to its gauges of the mail_live
 * relid.  It joins the queue's latest record of this level unless a
 * forget or a TRUNCATE lies between.
 */
static void
note_change(Oid relid, const char *queue, int len, const int64 *counts,
			int64 scheduled, int64 retrying)
{
	PendingCount change;
	PendingCount *p;
	int			level = GetCurrentTransactionNestLevel();
	bool		any = scheduled != 0 || retrying != 0;
	int			i;

	memset(&change, 0, sizeof(change));
	if (counts != NULL && count_totals_kept())
	{
		for (i = 0; i < COUNT_KINDS; i++)
		{
			change.totals.counts[i] = counts[i];
			any |= counts[i] != 0;
		}
	}
	if (!any)
		return;
	change.totals.key = count_totals_key(count_totals_kept() ? count_totals_extension() : InvalidOid,
										 queue, len);
	change.relid = scheduled != 0 || retrying != 0 ? relid : InvalidOid;
	change.queue = (char *) queue;
	change.len = len;
	change.level = level;
	change.scheduled = scheduled;
	change.retrying = retrying;

	for (i = npending - 1; i >= 0 && pending[i].level == level; i--)
	{
		if (!same_queue(&pending[i], &change))
			continue;
		if (mergeable(&pending[i], &change))
		{
			merge(&pending[i], &change);
			return;
		}
		break;
	}
	/* the name copied first: counted only once nothing above can fail */
	change.queue = MemoryContextAlloc(names_context(), Max(len, 1));
	memcpy(change.queue, queue, len);
	p = pending_append();
	*p = change;
}

/*
 * Note that a queue (FORGET_QUEUE, its name given), an extension or a
 * database was dropped: at commit the key's totals, or all of the
 * extension's or the database's, go.
 */
static void
note_forget(const CountKey *key, CountForget what, const char *queue, int len)
{
	PendingCount *p;
	char	   *copy = NULL;

	if (!count_totals_kept())
		return;
	if (queue != NULL)
	{
		copy = MemoryContextAlloc(names_context(), Max(len, 1));
		memcpy(copy, queue, len);
	}
	p = pending_append();
	p->totals.key = *key;
	p->totals.forget = what;
	p->queue = copy;
	p->len = queue != NULL ? len : -1;
}

/*
 * Note each group's counts, and let go of the groups.
 */
static void
note_groups(MailCount *count)
{
	int			i;

	for (i = 0; i < count->ngroups; i++)
	{
		CountGroup *g = &count->groups[i];

		note_change(count->live_relid, VARDATA_ANY(g->queue), VARSIZE_ANY_EXHDR(g->queue),
					g->counts, g->scheduled, g->retrying);
	}
	count->ngroups = 0;
	MemoryContextReset(count->context);
}

/*
 * Write this transaction's gauges, summed by queue, to this backend's rows
 * of mail_live_count (live_count.c): at the commit or prepare, before
 * either can no longer fail.  Gauges of a mail_live that is gone (the
 * extension dropped, or dropped and made again, since) count for nothing.
 */
static void
write_gauges(bool prepare)
{
	Datum	   *names;
	Datum	   *scheduled;
	Datum	   *retrying;
	Oid			live_relid = live_relid_now();
	int			n = 0;
	int			i;
	int			j;

	names = palloc(sizeof(Datum) * npending);
	scheduled = palloc(sizeof(Datum) * npending);
	retrying = palloc(sizeof(Datum) * npending);
	for (i = 0; i < npending; i++)
	{
		PendingCount *p = &pending[i];
		int64		s = 0;
		int64		r = 0;

		if (p->erased != 0 || p->relid != live_relid || (p->scheduled == 0 && p->retrying == 0))
			continue;
		/* one element per queue: the later records' join this one */
		for (j = i; j < npending; j++)
		{
			PendingCount *q = &pending[j];

			if (q->erased != 0 || q->relid != live_relid || q->len != p->len ||
				memcmp(q->queue, p->queue, p->len) != 0)
				continue;
			s += q->scheduled;
			r += q->retrying;
			if (j > i)
				q->scheduled = q->retrying = 0;
		}
		p->scheduled = p->retrying = 0;
		if (s == 0 && r == 0)
			continue;
		names[n] = PointerGetDatum(cstring_to_text_with_len(p->queue, p->len));
		scheduled[n] = Int64GetDatum(s);
		retrying[n] = Int64GetDatum(r);
		n++;
	}
	if (n > 0)
		live_count_write(names, scheduled, retrying, n, prepare);
}

/*
 * count_totals_commit's source: the records that add or forget totals, in
 * the order they were noted.
 */
static const CountTotalsChange *
next_totals(void *arg)
{
	int		   *i = (int *) arg;

	while (*i < npending)
	{
		PendingCount *p = &pending[(*i)++];
		int			k;

		if (p->totals.forget != FORGET_NOTHING)
			return &p->totals;
		for (k = 0; k < COUNT_KINDS; k++)
			if (p->totals.counts[k] != 0)
				return &p->totals;
	}
	return NULL;
}

/*
 * Forget this transaction's changes.
 */
static void
forget_pending(void)
{
	npending = 0;
	if (count_context != NULL)
		MemoryContextReset(count_context);
}

/*
 * mail_store_at_xact_end
 *		src/xact.c's hook.  Write the gauges when the transaction commits or
 *		prepares, just before; add the totals once it committed; forget
 *		everything when it aborts, and a prepared transaction's totals.
 */
void
mail_store_at_xact_end(XactEvent event)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			if (npending > 0)
				write_gauges(false);
			break;
		case XACT_EVENT_PRE_PREPARE:
			if (npending > 0)
				write_gauges(true);
			break;
		case XACT_EVENT_COMMIT:
			if (npending > 0)
			{
				int			i = 0;

				count_totals_commit(next_totals, &i);
			}
			forget_pending();
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			forget_pending();
			break;
		default:
			break;
	}
}

/*
 * mail_store_at_subxact_end
 *		src/xact.c's hook.  A subtransaction that aborts drops the changes
 *		it noted and brings back those a TRUNCATE of it set aside; one that
 *		commits hands both to its parent, each record joined to the
 *		parent's latest of its queue where nothing lies between, so that a
 *		loop of subtransactions (a PL/pgSQL exception block per enqueue)
 *		keeps one record a queue, not one per subtransaction.
 */
void
mail_store_at_subxact_end(SubXactEvent event)
{
	int			level = GetCurrentTransactionNestLevel();
	int			first;
	int			out;
	int			i;

	if (npending == 0)
		return;
	if (event == SUBXACT_EVENT_ABORT_SUB)
	{
		while (npending > 0 && pending[npending - 1].level >= level)
			npending--;
		for (i = 0; i < npending; i++)
			if (pending[i].erased >= level)
				pending[i].erased = 0;
		return;
	}
	if (event != SUBXACT_EVENT_COMMIT_SUB)
		return;

	for (i = 0; i < npending; i++)
		if (pending[i].erased >= level)
			pending[i].erased = level - 1;
	/* levels only grow along the array: this level's records are its tail */
	for (first = npending; first > 0 && pending[first - 1].level >= level; first--)
		pending[first - 1].level = level - 1;
	out = first;
	for (i = first; i < npending; i++)
	{
		PendingCount *p = &pending[i];
		bool		merged = false;
		int			j;

		for (j = out - 1; j >= 0 && pending[j].level == level - 1; j--)
		{
			if (!same_queue(&pending[j], p))
				continue;
			if (mergeable(&pending[j], p))
			{
				merge(&pending[j], p);
				merged = true;
			}
			break;
		}
		if (!merged)
			pending[out++] = *p;
	}
	npending = out;
}

/*
 * mail_store_count_init
 *		_PG_init's part when preloaded: free a dropped database's or
 *		extension's totals when its drop commits.
 */
void
mail_store_count_init(void)
{
	prev_object_access_hook = object_access_hook;
	object_access_hook = count_object_access;
}

/*
 * object_access_hook: note the drop of a database, or of gatekeeper from
 * the current database, so that their totals go when the drop commits
 * (nothing goes if it aborts).
 */
static void
count_object_access(ObjectAccessType access, Oid classId, Oid objectId,
					int subId, void *arg)
{
	if (prev_object_access_hook)
		prev_object_access_hook(access, classId, objectId, subId, arg);
	/* an extension dropped, or made, in this transaction: look again */
	if (classId == ExtensionRelationId)
		count_totals_forget_extension();
	if (access != OAT_DROP || !count_totals_kept())
		return;
	if (classId == DatabaseRelationId && subId == 0)
	{
		CountKey	key;

		memset(&key, 0, sizeof(key));
		key.database = objectId;
		note_forget(&key, FORGET_DATABASE, NULL, 0);
	}
	else if (classId == ExtensionRelationId)
	{
		char	   *name = get_extension_name(objectId);

		if (name != NULL && strcmp(name, "gatekeeper") == 0)
		{
			CountKey	key;

			memset(&key, 0, sizeof(key));
			key.database = MyDatabaseId;
			key.extension = objectId;
			note_forget(&key, FORGET_EXTENSION, NULL, 0);
		}
	}
}

/*
 * mail_count_set_aside
 *		Set aside the gauges this transaction noted, of one queue or (queue
 *		NULL) of all, and delete their rows: the gauges are in what
 *		replaces the rows, or gone with the mail they counted.  A
 *		subtransaction that aborts brings them back.  Inside SPI.
 */
void
mail_count_set_aside(text *queue)
{
	int			level = GetCurrentTransactionNestLevel();
	int			i;

	for (i = 0; i < npending; i++)
	{
		PendingCount *p = &pending[i];

		if (p->erased != 0 || p->len < 0)
			continue;
		if (queue != NULL &&
			(p->len != (int) VARSIZE_ANY_EXHDR(queue) ||
			 memcmp(p->queue, VARDATA_ANY(queue), p->len) != 0))
			continue;
		p->erased = level;
	}
	live_count_delete(queue);
}

/*
 * The mail_live there is now.
 */
static Oid
live_relid_now(void)
{
	return gatekeeper_relid(GATEKEEPER_REL_MAIL_LIVE, true);
}

/*
 * gatekeeper_forget_queue
 *		gatekeeper._forget_queue(), the AFTER DELETE FOR EACH ROW trigger of
 *		gatekeeper.queue: the deleted queue's totals go when the transaction
 *		commits, so a new queue of that name starts at zero.
 */
Datum
gatekeeper_forget_queue(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	TupleDesc	desc;
	int			name_att;
	bool		isnull;
	Datum		name;

	gatekeeper_require_schema();
	if (!CALLED_AS_TRIGGER(fcinfo) ||
		!TRIGGER_FIRED_BY_DELETE(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event))
		elog(ERROR, "gatekeeper_forget_queue must be a delete row trigger");
	if (!count_totals_kept())
		return PointerGetDatum(NULL);

	desc = RelationGetDescr(trigdata->tg_relation);
	name_att = SPI_fnumber(desc, "name");
	if (name_att <= 0)
		elog(ERROR, "gatekeeper_forget_queue fired on a table without name");
	name = heap_getattr(trigdata->tg_trigtuple, name_att, desc, &isnull);
	if (!isnull)
	{
		text	   *t = DatumGetTextPP(name);
		CountKey	key = count_totals_key(count_totals_extension(), VARDATA_ANY(t),
										   VARSIZE_ANY_EXHDR(t));

		note_forget(&key, FORGET_QUEUE, VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t));
	}
	return PointerGetDatum(NULL);
}

/*
 * gatekeeper_forget_live
 *		gatekeeper._forget_live(queue): drop_queue's end of the live gauges.
 *		The queue's rows are deleted, and what this transaction noted for
 *		it set aside (a cancel_queue before the drop, say), as a TRUNCATE
 *		sets its changes aside: the two sum to nothing, the queue having no
 *		live mail left.  A subtransaction that aborts brings both back.
 */
Datum
gatekeeper_forget_live(PG_FUNCTION_ARGS)
{
	gatekeeper_require_schema();

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	mail_count_set_aside(PG_GETARG_TEXT_PP(0));
	SPI_finish();
	PG_RETURN_VOID();
}

/*
 * gatekeeper_live_pending
 *		gatekeeper._live_pending(): this transaction's changes to the live
 *		gauges, not yet written, by queue: what queue_stats adds to the
 *		written ones so that, inside a transaction that changed live mail,
 *		they agree with the mail_live it sees.
 */
Datum
gatekeeper_live_pending(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			live_relid;
	int			i;

	gatekeeper_require_schema();
	InitMaterializedSRF(fcinfo, 0);
	if (npending == 0)
		return (Datum) 0;
	live_relid = live_relid_now();
	for (i = 0; i < npending; i++)
	{
		PendingCount *p = &pending[i];
		Datum		values[3];
		bool		nulls[3] = {false, false, false};

		if (p->erased != 0 || p->relid != live_relid ||
			(p->scheduled == 0 && p->retrying == 0))
			continue;
		values[0] = PointerGetDatum(cstring_to_text_with_len(p->queue, p->len));
		values[1] = Int64GetDatum(p->scheduled);
		/* 0.2.0's _live_pending, until ALTER EXTENSION UPDATE, takes two */
		values[2] = Int64GetDatum(p->retrying);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/*
 * gatekeeper_recount_live
 *		gatekeeper.recount_live(): count mail_live afresh into
 *		mail_live_count, for gauges that missed writes (mail_live written
 *		with its triggers disabled, as pg_restore --disable-triggers
 *		does).  Returns the live mails counted.
 *
 * The SHARE ROW EXCLUSIVE lock waits for every transaction writing
 * mail_live to end (their gauges are written as they commit, before the
 * lock is theirs no more, or as they prepare) and keeps new ones, and a
 * second recount, out until this one ends; the count then runs under a
 * snapshot taken after the lock, which READ COMMITTED gives and a
 * transaction snapshot would not.  This transaction's own earlier
 * changes are in that count, so they are set aside as a TRUNCATE sets
 * them aside.
 */
Datum
gatekeeper_recount_live(PG_FUNCTION_ARGS)
{
	int64		total;

	gatekeeper_require_schema();
	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("recount_live() must run in a READ COMMITTED transaction"),
				 errdetail("A transaction snapshot taken before the lock would miss what committed while it waited.")));

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	live_count_lock();
	mail_count_set_aside(NULL);
	total = live_count_recount();
	SPI_finish();
	/* writes the triggers did not see may sit below any floor */
	gatekeeper_due_floor_reset();
	PG_RETURN_INT64(total);
}
