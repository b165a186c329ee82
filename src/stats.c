/*-------------------------------------------------------------------------
 *
 * stats.c
 *		The queues' totals: mails enqueued and finished, per queue, kept in
 *		shared memory so that gatekeeper.queue_stats never counts rows.
 *
 * Every mail enters through the statement trigger of gatekeeper.mail
 * (src/mail.c counts each row in its validation pass over the statement),
 * and every way a mail finishes (ack, nack, claim, reap, expiry, cancel,
 * whatever function does it) inserts its outcome into gatekeeper.mail_done,
 * whose statement trigger (gatekeeper._count_done) counts the statement's
 * outcomes by queue and state.  Both only note the counts in this
 * backend, by transaction nesting level: a subtransaction that aborts
 * drops its own, one that commits hands them to its parent, and only a
 * top-level commit adds them to shared memory, so the totals count
 * committed work only.  Purging and rotation remove rows, never counts.
 * Events (issue 27) are counted the same way: every insert into
 * gatekeeper.event_log fires gatekeeper._count_events, which counts the
 * statement's deferrals, bounces and complaints by queue; the reports
 * ingest_report and record_event took (recorded or ignored) are kept
 * under the key of the empty name, which no queue has.
 *
 * The totals live in a fixed-size shared hash keyed by database, the
 * extension's OID (a new CREATE EXTENSION starts afresh) and a 64-bit hash
 * of the queue's name, the one hashtextextended(name, 0) gives, by which
 * the view joins the totals to gatekeeper.queue in one pass; a deleted queue row (drop_queue) removes its entry
 * when the deleting transaction commits, so a new queue with an old name
 * starts at zero.  Like PostgreSQL's statistics, the postmaster writes the
 * hash to pg_stat/gatekeeper.stat at a clean shutdown and reads it back
 * (and removes the file) at start: after a crash the totals start at
 * zero.  gatekeeper.reset_stats() zeroes the current database's.
 *
 * The hash never holds more than STATS_MAX_QUEUES entries: dynahash would
 * take further ones from the server's spare shared memory, which the lock
 * table and others need, so a queue beyond the bound gets no totals (a LOG
 * line says so, once until entries are freed again).  Entries are freed
 * when the transaction that drops their queue, their extension (DROP
 * EXTENSION) or their database (DROP DATABASE) commits, through the object
 * access hook, so nothing of a database that is gone is kept or written at
 * shutdown; and when the hash is full, a backend that has counts to add
 * frees the entries of databases that no longer exist and of its own
 * database's former extensions (left by a server that did not free them).
 *
 * Why gatekeeper.queue_stats has two counting systems, this one and
 * src/live_count.c.  Its columns are of two kinds, and each needs what the
 * other cannot give.  The totals here (enqueued, sent, failed, suppressed,
 * expired, cancelled, unknown, deferred, bounced, complained; through
 * _queue_totals) are counters of events: they only go up, Prometheus reads
 * them with rate(), which takes a restart at zero as a counter reset, and
 * they are added to by every ack, so they must cost the drain nothing a
 * row would (a row per queue updated at every commit is a lock all of a
 * queue's claimers wait on, and a row version per commit).  They are
 * added at top-level commit, so they count committed work only, but they
 * are not transactional for the reader: a query sees commits made after
 * its snapshot and not its own transaction's work, a crash (or a server
 * without the library preloaded) starts them at zero, and a dump does not
 * carry them.  The live counts (scheduled, retrying; through _live_stats,
 * from mail_live_count and this transaction's _live_pending) are gauges
 * of state: a gauge that drifts stays wrong for good, so they are rows
 * written in the transaction that changed mail_live: a rollback takes them
 * back, a crash keeps them, and a query sees them agree with mail_live
 * under its snapshot, its own changes included; they miss only writes to
 * mail_live with its triggers disabled (recount_live()).  The remaining
 * columns count nothing ahead of time: due and oldest_due_age are read
 * from the mail_due index (they depend on the clock), claimed and
 * lease_expired from the open counts of mail_claim's batches, paused from
 * gatekeeper.queue, all under the query's snapshot.  So within one row
 * the gauges agree with each other, but scheduled + claimed + the
 * outcomes equals enqueued only on a quiet server since its last start or
 * reset_stats().
 *
 * IDENTIFICATION
 *		src/stats.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "stats.h"
#include "xact.h"

#include <unistd.h>

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_database.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "common/hashfn.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "catalog.h"
#include "gatekeeper.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

PG_FUNCTION_INFO_V1(gatekeeper_count_done);
PG_FUNCTION_INFO_V1(gatekeeper_count_events);
PG_FUNCTION_INFO_V1(gatekeeper_forget_queue);
PG_FUNCTION_INFO_V1(gatekeeper_queue_totals);
PG_FUNCTION_INFO_V1(gatekeeper_queue_rates);
PG_FUNCTION_INFO_V1(gatekeeper_reset_stats);

/* What is counted, in the order of queue_stats' columns */
typedef enum StatKind
{
	STAT_ENQUEUED,
	STAT_SENT,
	STAT_FAILED,
	STAT_SUPPRESSED,
	STAT_EXPIRED,
	STAT_CANCELLED,
	STAT_UNKNOWN,
	STAT_DEFERRED,				/* events (issue 27), by queue */
	STAT_BOUNCED,
	STAT_COMPLAINED,
	STAT_REPORTS,				/* reports recorded and ignored, under the */
	STAT_IGNORED,				/* key of the empty name (no queue's) */
	STAT_KINDS
} StatKind;

/* The events counted, by StatKind from STAT_DEFERRED on */
static const char *const counted_events[] = {"deferred", "bounced", "complained"};

/* The terminal states, by StatKind from STAT_SENT on */
static const char *const finished_states[] = {
	"sent", "failed", "suppressed", "expired", "cancelled", "unknown"
};

/* Queues whose totals shared memory holds, server-wide */
#define STATS_MAX_QUEUES	5000

/* Least time between two sweeps of a full hash by one backend */
#define STATS_SWEEP_INTERVAL_MS	10000

/* Distinct queues one statement's rows are grouped by before noting them */
#define STATS_GROUPS		16

#define STATS_FILE			"pg_stat/gatekeeper.stat"
#define STATS_FILE_TMP		STATS_FILE ".tmp"
#define STATS_FILE_MAGIC	0x474B5332	/* "GKS2" */
#define STATS_TRANCHE		"gatekeeper stats"

typedef struct StatsKey
{
	Oid			database;
	Oid			extension;		/* pg_extension's OID of gatekeeper */
	uint64		queue;			/* hash of the queue's name */
} StatsKey;

/*
 * The rate (issue 47): the mails each queue finished by delivery work
 * (sent, failed, suppressed, expired, unknown: not cancelled), in
 * RATE_SLOTS slots of RATE_SLOT_SECONDS each, the slot of second t being
 * (t / RATE_SLOT_SECONDS) % RATE_SLOTS, stamped with t / RATE_SLOT_SECONDS
 * so that a slot left from an earlier minute counts nothing.
 */
#define RATE_SLOTS			12
#define RATE_SLOT_SECONDS	5

/* What the totals file holds of an entry (its layout, for the file) */
typedef struct StatsSaved
{
	StatsKey	key;
	int64		counts[STAT_KINDS];
} StatsSaved;

typedef struct StatsEntry
{
	StatsKey	key;
	int64		counts[STAT_KINDS];
	int64		recent[RATE_SLOTS]; /* mails finished in each slot */
	int64		recent_tick[RATE_SLOTS];	/* the slot's time, in slots */
} StatsEntry;

typedef struct StatsShared
{
	LWLock	   *lock;			/* protects the hash and its entries */
	bool		full_logged;	/* "totals not kept" was logged (since the
								 * last entries were freed) */
} StatsShared;

/* What a pending record's commit removes from the hash */
typedef enum StatsForget
{
	FORGET_NOTHING = 0,			/* it adds counts */
	FORGET_QUEUE,				/* the key's entry: its queue was deleted */
	FORGET_EXTENSION,			/* every entry of the key's database and
								 * extension: DROP EXTENSION */
	FORGET_DATABASE				/* every entry of the key's database: DROP
								 * DATABASE */
} StatsForget;

/* A count noted by this backend, not yet committed */
typedef struct PendingStats
{
	StatsKey	key;
	int			level;			/* transaction nesting level that noted it */
	StatsForget forget;			/* what goes at commit, or FORGET_NOTHING */
	int64		counts[STAT_KINDS];
} PendingStats;

/* One queue's rows in one statement */
typedef struct StatsGroup
{
	text	   *queue;
	int64		counts[STAT_KINDS];
} StatsGroup;

/*
 * A statement's rows counted by queue: the groups seen last, noted (and
 * the slots reused) whenever all are taken; the queue names are copied
 * into the tally's own context.
 */
struct StatsTally
{
	MemoryContext context;
	int			ngroups;
	StatsGroup	groups[STATS_GROUPS];
};

/* NULL unless the library was preloaded */
static StatsShared *stats_shared = NULL;
static HTAB *stats_hash = NULL;

static PendingStats *pending = NULL;
static int	npending = 0;
static int	maxpending = 0;

static object_access_hook_type prev_object_access_hook = NULL;
static TimestampTz last_sweep = 0;

/* current_extension()'s cache */
static LocalTransactionId extension_lxid = InvalidLocalTransactionId;
static Oid	extension_oid = InvalidOid;

static StatsKey stats_key(const char *name, int len);
static Oid	current_extension(void);
static void note_counts(const StatsKey *key, const int64 *counts);
static void note_forget(const StatsKey *key, StatsForget what);
static void stats_object_access(ObjectAccessType access, Oid classId, Oid objectId,
								int subId, void *arg);
static bool stats_full(void);
static void stats_sweep(void);
static int	forget_matching(const StatsKey *key, StatsForget what);
static PendingStats *pending_append(const StatsKey *key);
static void count_rows(Tuplestorestate *rows, TupleDesc desc, int queue_att,
					   int state_att, Oid *state_values);
static void note_groups(StatsTally *tally);
static void stats_flush(void);
static int64 rate_tick(TimestampTz now);
static void stats_load(void);
static void stats_save(int code, Datum arg);

/*
 * Bytes of shared memory for the totals.
 */
Size
gatekeeper_stats_shmem_size(void)
{
	return add_size(MAXALIGN(sizeof(StatsShared)),
					hash_estimate_size(STATS_MAX_QUEUES, sizeof(StatsEntry)));
}

/*
 * shmem_request_hook's part: the space and the lock.
 */
void
gatekeeper_stats_shmem_request(void)
{
	RequestAddinShmemSpace(gatekeeper_stats_shmem_size());
	RequestNamedLWLockTranche(STATS_TRANCHE, 1);
}

/*
 * _PG_init's part when preloaded: free a dropped database's or extension's
 * totals when its drop commits.
 */
void
gatekeeper_stats_init(void)
{
	prev_object_access_hook = object_access_hook;
	object_access_hook = stats_object_access;
}

/*
 * object_access_hook: note the drop of a database, or of gatekeeper from
 * the current database, so that their entries go when the drop commits
 * (nothing goes if it aborts).
 */
static void
stats_object_access(ObjectAccessType access, Oid classId, Oid objectId,
					int subId, void *arg)
{
	if (prev_object_access_hook)
		prev_object_access_hook(access, classId, objectId, subId, arg);
	/* an extension dropped, or made, in this transaction: look again */
	if (classId == ExtensionRelationId)
		extension_oid = InvalidOid;
	if (access != OAT_DROP || stats_hash == NULL)
		return;
	if (classId == DatabaseRelationId && subId == 0)
	{
		StatsKey	key;

		memset(&key, 0, sizeof(key));
		key.database = objectId;
		note_forget(&key, FORGET_DATABASE);
	}
	else if (classId == ExtensionRelationId)
	{
		char	   *name = get_extension_name(objectId);

		if (name != NULL && strcmp(name, "gatekeeper") == 0)
		{
			StatsKey	key;

			memset(&key, 0, sizeof(key));
			key.database = MyDatabaseId;
			key.extension = objectId;
			note_forget(&key, FORGET_EXTENSION);
		}
	}
}

/*
 * shmem_startup_hook's part, with AddinShmemInitLock held: create or attach
 * to the totals.  The postmaster loads the file of the last clean shutdown
 * into a new hash and writes it again when it exits.
 */
void
gatekeeper_stats_shmem_init(void)
{
	bool		found;
	HASHCTL		info;

	stats_shared = ShmemInitStruct("gatekeeper stats", sizeof(StatsShared), &found);
	if (!found)
	{
		stats_shared->lock = &(GetNamedLWLockTranche(STATS_TRANCHE))->lock;
		stats_shared->full_logged = false;
	}
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(StatsKey);
	info.entrysize = sizeof(StatsEntry);
	stats_hash = ShmemInitHash("gatekeeper stats hash",
							   STATS_MAX_QUEUES, STATS_MAX_QUEUES,
							   &info, HASH_ELEM | HASH_BLOBS);
	if (!IsUnderPostmaster)
	{
		on_shmem_exit(stats_save, (Datum) 0);
		if (!found)
			stats_load();
	}
}

/*
 * The key of a queue's totals in the current database.
 */
static StatsKey
stats_key(const char *name, int len)
{
	StatsKey	key;

	memset(&key, 0, sizeof(key));
	key.database = MyDatabaseId;
	key.extension = current_extension();
	/* what hashtextextended(name, 0) returns for a deterministic collation */
	key.queue = hash_bytes_extended((const unsigned char *) name, len, 0);
	return key;
}

/*
 * gatekeeper's pg_extension OID, looked up once per transaction (a report
 * counted per call, every SPI write a new command, made a catalog lookup
 * per call when this was per command).  Within the transaction only this
 * backend can drop the extension (our objects are locked by what counts),
 * and stats_object_access() then forgets the OID at once.
 */
static Oid
current_extension(void)
{
	if (extension_lxid != MyProc->lxid || !OidIsValid(extension_oid))
	{
		extension_oid = get_extension_oid("gatekeeper", true);
		extension_lxid = MyProc->lxid;
	}
	return extension_oid;
}

/*
 * A new record at the end of the pending list, for the current level.
 */
static PendingStats *
pending_append(const StatsKey *key)
{
	PendingStats *p;

	if (npending == maxpending)
	{
		int			newmax = Max(16, maxpending * 2);

		if (pending == NULL)
			pending = MemoryContextAlloc(TopMemoryContext, newmax * sizeof(PendingStats));
		else
			pending = repalloc(pending, newmax * sizeof(PendingStats));
		maxpending = newmax;
	}
	p = &pending[npending++];
	memset(p, 0, sizeof(*p));
	p->key = *key;
	p->level = GetCurrentTransactionNestLevel();
	return p;
}

/*
 * Note counts for a queue, to be added when the transaction commits.
 * They join the queue's latest record of this level unless the queue was
 * deleted since.
 */
static void
note_counts(const StatsKey *key, const int64 *counts)
{
	int			level = GetCurrentTransactionNestLevel();
	PendingStats *p = NULL;
	int			i;

	if (stats_hash == NULL)
		return;
	for (i = npending - 1; i >= 0 && pending[i].level == level; i--)
	{
		if (memcmp(&pending[i].key, key, sizeof(StatsKey)) != 0)
			continue;
		if (pending[i].forget == FORGET_NOTHING)
			p = &pending[i];
		break;
	}
	if (p == NULL)
		p = pending_append(key);
	for (i = 0; i < STAT_KINDS; i++)
		p->counts[i] += counts[i];
}

/*
 * Note that a queue (FORGET_QUEUE), an extension or a database was
 * dropped: at commit the key's entry, or all of the extension's or the
 * database's, go.
 */
static void
note_forget(const StatsKey *key, StatsForget what)
{
	if (stats_hash == NULL)
		return;
	pending_append(key)->forget = what;
}

/*
 * Start a tally of a statement's rows by queue, in the current memory
 * context; NULL when the library was not preloaded (nothing is counted).
 */
StatsTally *
gatekeeper_stats_tally_start(void)
{
	StatsTally *tally;

	if (stats_hash == NULL)
		return NULL;
	tally = palloc(sizeof(StatsTally));
	tally->context = AllocSetContextCreate(CurrentMemoryContext, "gatekeeper stats",
										   ALLOCSET_SMALL_SIZES);
	tally->ngroups = 0;
	return tally;
}

/*
 * Count one row of this queue (a text datum) as kind.
 */
static void
tally_add(StatsTally *tally, Datum queue, int kind)
{
	text	   *q = (text *) DatumGetPointer(queue);
	StatsGroup *g = NULL;
	int			i;

	for (i = 0; i < tally->ngroups; i++)
	{
		if (VARSIZE_ANY_EXHDR(q) == VARSIZE_ANY_EXHDR(tally->groups[i].queue) &&
			memcmp(VARDATA_ANY(q), VARDATA_ANY(tally->groups[i].queue),
				   VARSIZE_ANY_EXHDR(q)) == 0)
		{
			g = &tally->groups[i];
			break;
		}
	}
	if (g == NULL)
	{
		if (tally->ngroups == STATS_GROUPS)
			note_groups(tally);
		g = &tally->groups[tally->ngroups++];
		memset(g, 0, sizeof(*g));
		g->queue = (text *) MemoryContextAlloc(tally->context, VARSIZE_ANY_EXHDR(q) + VARHDRSZ);
		SET_VARSIZE(g->queue, VARSIZE_ANY_EXHDR(q) + VARHDRSZ);
		memcpy(VARDATA(g->queue), VARDATA_ANY(q), VARSIZE_ANY_EXHDR(q));
	}
	g->counts[kind]++;
}

/*
 * gatekeeper_stats_count_enqueued
 *		Count one new mail of this queue (a text datum) in the tally of an
 *		INSERT or COPY into gatekeeper.mail (src/mail.c, in its validation
 *		pass over the statement's rows).
 */
void
gatekeeper_stats_count_enqueued(StatsTally *tally, Datum queue)
{
	if (tally != NULL)
		tally_add(tally, queue, STAT_ENQUEUED);
}

/*
 * gatekeeper_stats_count_done
 *		Count one finished mail of queue (a text datum) in state (a value of
 *		the enum state_type), as the count trigger of mail_done counts the
 *		rows of a statement: for the writer of mail_done that writes past
 *		the executor (src/done_writer.c).
 */
void
gatekeeper_stats_count_done(StatsTally *tally, Datum queue, Oid state_type, Oid state)
{
	static Oid	values_type = InvalidOid;
	static Oid	values[STAT_UNKNOWN - STAT_SENT + 1];
	int			kind;

	if (tally == NULL)
		return;
	if (values_type != state_type)
	{
		for (kind = 0; kind <= STAT_UNKNOWN - STAT_SENT; kind++)
			values[kind] = DatumGetObjectId(DirectFunctionCall2(enum_in,
																CStringGetDatum(finished_states[kind]),
																ObjectIdGetDatum(state_type)));
		values_type = state_type;
	}
	for (kind = STAT_SENT; kind <= STAT_UNKNOWN; kind++)
		if (values[kind - STAT_SENT] == state)
		{
			tally_add(tally, queue, kind);
			break;
		}
}

/*
 * Note the tally's counts and free it.
 */
void
gatekeeper_stats_tally_end(StatsTally *tally)
{
	if (tally == NULL)
		return;
	if (tally->ngroups > 0 && stats_full())
		stats_sweep();
	note_groups(tally);
	MemoryContextDelete(tally->context);
	pfree(tally);
}

/*
 * Count a statement's outcomes by queue and state (one of state_values,
 * in finished_states' order).
 */
static void
count_rows(Tuplestorestate *rows, TupleDesc desc, int queue_att, int state_att,
		   Oid *state_values)
{
	TupleTableSlot *slot = MakeSingleTupleTableSlot(desc, &TTSOpsMinimalTuple);
	StatsTally *tally = gatekeeper_stats_tally_start();

	tuplestore_rescan(rows);
	while (tuplestore_gettupleslot(rows, true, false, slot))
	{
		bool		isnull;
		Datum		queue = slot_getattr(slot, queue_att, &isnull);
		Datum		state;
		int			kind;

		if (isnull)
			continue;
		state = slot_getattr(slot, state_att, &isnull);
		if (isnull)
			continue;
		for (kind = STAT_SENT; kind <= STAT_UNKNOWN; kind++)
			if (state_values[kind - STAT_SENT] == DatumGetObjectId(state))
				break;
		if (kind <= STAT_UNKNOWN)
			tally_add(tally, queue, kind);
		ExecClearTuple(slot);
	}
	gatekeeper_stats_tally_end(tally);
	ExecDropSingleTupleTableSlot(slot);
}

/*
 * Note each group's counts, and let go of the groups.
 */
static void
note_groups(StatsTally *tally)
{
	int			i;

	for (i = 0; i < tally->ngroups; i++)
	{
		StatsKey	key = stats_key(VARDATA_ANY(tally->groups[i].queue),
									VARSIZE_ANY_EXHDR(tally->groups[i].queue));

		note_counts(&key, tally->groups[i].counts);
	}
	tally->ngroups = 0;
	MemoryContextReset(tally->context);
}

/*
 * gatekeeper_count_done
 *		gatekeeper._count_done(), the AFTER INSERT FOR EACH STATEMENT
 *		trigger of gatekeeper.mail_done: count the statement's outcomes by
 *		queue and state.
 */
Datum
gatekeeper_count_done(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	TupleDesc	desc;
	int			queue_att;
	int			state_att;
	Oid			state_values[STAT_UNKNOWN - STAT_SENT + 1];
	Oid			state_type;
	int			i;

	gatekeeper_require_schema();
	if (!CALLED_AS_TRIGGER(fcinfo) ||
		!TRIGGER_FIRED_BY_INSERT(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_STATEMENT(trigdata->tg_event) ||
		trigdata->tg_newtable == NULL)
		elog(ERROR, "gatekeeper_count_done must be an insert statement trigger with a new table");
	/* a restore is not new work (see gatekeeper_writer) */
	if (stats_hash == NULL || gatekeeper_writer() == GATEKEEPER_WRITER_DUMP)
		return PointerGetDatum(NULL);

	desc = RelationGetDescr(trigdata->tg_relation);
	queue_att = SPI_fnumber(desc, "queue");
	state_att = SPI_fnumber(desc, "state");
	if (queue_att <= 0 || state_att <= 0)
		elog(ERROR, "gatekeeper_count_done fired on a table without queue and state");
	state_type = TupleDescAttr(desc, state_att - 1)->atttypid;
	for (i = 0; i <= STAT_UNKNOWN - STAT_SENT; i++)
		state_values[i] = DatumGetObjectId(DirectFunctionCall2(enum_in,
															   CStringGetDatum(finished_states[i]),
															   ObjectIdGetDatum(state_type)));
	count_rows(trigdata->tg_newtable, desc, queue_att, state_att, state_values);
	return PointerGetDatum(NULL);
}

/*
 * gatekeeper_count_events
 *		gatekeeper._count_events(), the AFTER INSERT FOR EACH STATEMENT
 *		trigger of gatekeeper.event_log: count the statement's deferrals,
 *		bounces and complaints by queue, but not repeats (a report's
 *		complaint or bounce of a mail that had one: src/report.c).
 */
Datum
gatekeeper_count_events(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	TupleDesc	desc;
	TupleTableSlot *slot;
	StatsTally *tally;
	int			queue_att;
	int			event_att;
	int			repeated_att;

	gatekeeper_require_schema();
	if (!CALLED_AS_TRIGGER(fcinfo) ||
		!TRIGGER_FIRED_BY_INSERT(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_STATEMENT(trigdata->tg_event) ||
		trigdata->tg_newtable == NULL)
		elog(ERROR, "gatekeeper_count_events must be an insert statement trigger with a new table");
	if (stats_hash == NULL || gatekeeper_writer() == GATEKEEPER_WRITER_DUMP)
		return PointerGetDatum(NULL);

	desc = RelationGetDescr(trigdata->tg_relation);
	queue_att = SPI_fnumber(desc, "queue");
	event_att = SPI_fnumber(desc, "event");
	repeated_att = SPI_fnumber(desc, "repeated");
	if (queue_att <= 0 || event_att <= 0)
		elog(ERROR, "gatekeeper_count_events fired on a table without queue and event");
	slot = MakeSingleTupleTableSlot(desc, &TTSOpsMinimalTuple);
	tally = gatekeeper_stats_tally_start();
	tuplestore_rescan(trigdata->tg_newtable);
	while (tuplestore_gettupleslot(trigdata->tg_newtable, true, false, slot))
	{
		bool		isnull;
		Datum		queue = slot_getattr(slot, queue_att, &isnull);
		Datum		event;
		text	   *t;
		int			kind;

		if (isnull)
			continue;
		event = slot_getattr(slot, event_att, &isnull);
		if (isnull)
			continue;
		if (repeated_att > 0)
		{
			Datum		repeated = slot_getattr(slot, repeated_att, &isnull);

			if (!isnull && DatumGetBool(repeated))
				continue;
		}
		t = DatumGetTextPP(event);
		for (kind = STAT_DEFERRED; kind <= STAT_COMPLAINED; kind++)
		{
			const char *name = counted_events[kind - STAT_DEFERRED];

			if (VARSIZE_ANY_EXHDR(t) == strlen(name) &&
				memcmp(VARDATA_ANY(t), name, strlen(name)) == 0)
			{
				tally_add(tally, queue, kind);
				break;
			}
		}
		ExecClearTuple(slot);
	}
	gatekeeper_stats_tally_end(tally);
	ExecDropSingleTupleTableSlot(slot);
	return PointerGetDatum(NULL);
}

/*
 * gatekeeper_stats_count_report
 *		Count one report ingest_report or record_event took: recorded (it
 *		wrote at least one event) or ignored.  Kept under the key of the
 *		empty name, which no queue has; counted at commit like the rest.
 */
void
gatekeeper_stats_count_report(bool recorded)
{
	StatsKey	key;
	int64		counts[STAT_KINDS];

	if (stats_hash == NULL)
		return;
	memset(counts, 0, sizeof(counts));
	counts[recorded ? STAT_REPORTS : STAT_IGNORED] = 1;
	key = stats_key("", 0);
	note_counts(&key, counts);
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
	if (stats_hash == NULL)
		return PointerGetDatum(NULL);

	desc = RelationGetDescr(trigdata->tg_relation);
	name_att = SPI_fnumber(desc, "name");
	if (name_att <= 0)
		elog(ERROR, "gatekeeper_forget_queue fired on a table without name");
	name = heap_getattr(trigdata->tg_trigtuple, name_att, desc, &isnull);
	if (!isnull)
	{
		text	   *t = DatumGetTextPP(name);
		StatsKey	key = stats_key(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t));

		note_forget(&key, FORGET_QUEUE);
	}
	return PointerGetDatum(NULL);
}

/*
 * gatekeeper_queue_totals
 *		gatekeeper._queue_totals(): the committed totals of the current
 *		database's queues since the server started (or the last reset), one
 *		row per queue that has any, keyed by hashtextextended(name, 0);
 *		no rows when the library was not preloaded.
 */
Datum
gatekeeper_queue_totals(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	HASH_SEQ_STATUS scan;
	StatsEntry *entry;
	StatsEntry *found;
	Oid			extension;
	int			n = 0;
	int			max = 64;
	int			i;

	gatekeeper_require_schema();
	InitMaterializedSRF(fcinfo, 0);
	if (stats_hash == NULL)
		return (Datum) 0;

	/* copy under the lock, build the rows after */
	extension = current_extension();
	found = palloc(max * sizeof(StatsEntry));
	LWLockAcquire(stats_shared->lock, LW_SHARED);
	hash_seq_init(&scan, stats_hash);
	while ((entry = hash_seq_search(&scan)) != NULL)
	{
		if (entry->key.database != MyDatabaseId || entry->key.extension != extension)
			continue;
		if (n == max)
		{
			max *= 2;
			found = repalloc(found, max * sizeof(StatsEntry));
		}
		found[n++] = *entry;
	}
	LWLockRelease(stats_shared->lock);

	for (i = 0; i < n; i++)
	{
		Datum		values[STAT_KINDS + 1];
		bool		nulls[STAT_KINDS + 1];
		int			k;

		memset(nulls, 0, sizeof(nulls));
		values[0] = Int64GetDatum((int64) found[i].key.queue);
		for (k = 0; k < STAT_KINDS; k++)
			values[k + 1] = Int64GetDatum(found[i].counts[k]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/*
 * gatekeeper_reset_stats
 *		gatekeeper.reset_stats(): zero the totals of every queue of the
 *		current database, at once (not at commit, like pg_stat_reset).
 */
Datum
gatekeeper_reset_stats(PG_FUNCTION_ARGS)
{
	HASH_SEQ_STATUS scan;
	StatsEntry *entry;

	gatekeeper_require_schema();
	if (stats_hash == NULL)
		PG_RETURN_VOID();

	LWLockAcquire(stats_shared->lock, LW_EXCLUSIVE);
	hash_seq_init(&scan, stats_hash);
	while ((entry = hash_seq_search(&scan)) != NULL)
	{
		if (entry->key.database == MyDatabaseId)
			hash_search(stats_hash, &entry->key, HASH_REMOVE, NULL);
	}
	LWLockRelease(stats_shared->lock);
	PG_RETURN_VOID();
}

/*
 * gatekeeper_stats_at_xact_end
 *		src/xact.c's hook.  At top-level commit, add what this transaction
 *		noted; at abort or PREPARE TRANSACTION, drop it (a prepared
 *		transaction's work is not counted).
 */
void
gatekeeper_stats_at_xact_end(XactEvent event)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
			stats_flush();
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			npending = 0;
			break;
		default:
			break;
	}
}

/*
 * gatekeeper_stats_at_subxact_end
 *		src/xact.c's hook.  A subtransaction that aborts drops what it
 *		noted; one that commits hands it to its parent, merged into the
 *		parent's records where no deletion of the queue lies between.
 *		Records are in order of nesting level, so a subtransaction's are
 *		the last ones.
 */
void
gatekeeper_stats_at_subxact_end(SubXactEvent event)
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
		return;
	}
	if (event != SUBXACT_EVENT_COMMIT_SUB)
		return;

	for (first = npending; first > 0 && pending[first - 1].level >= level; first--)
		pending[first - 1].level = level - 1;
	out = first;
	for (i = first; i < npending; i++)
	{
		PendingStats *p = &pending[i];
		bool		merged = false;
		int			j;

		if (p->forget == FORGET_NOTHING)
		{
			for (j = out - 1; j >= 0 && pending[j].level == level - 1; j--)
			{
				int			k;

				if (memcmp(&pending[j].key, &p->key, sizeof(StatsKey)) != 0)
					continue;
				if (pending[j].forget == FORGET_NOTHING)
				{
					for (k = 0; k < STAT_KINDS; k++)
						pending[j].counts[k] += p->counts[k];
					merged = true;
				}
				break;
			}
		}
		if (!merged)
			pending[out++] = *p;
	}
	npending = out;
}

/*
 * The slot number of a time: whole RATE_SLOT_SECONDS since 2000-01-01.
 */
static int64
rate_tick(TimestampTz now)
{
	return now / (RATE_SLOT_SECONDS * USECS_PER_SEC);
}

/*
 * gatekeeper_queue_rates
 *		gatekeeper._queue_rates(): per queue of the current database that
 *		finished mail by delivery work in the last minute, the mails per
 *		second over that minute (its slots of the last 55 to 60 seconds,
 *		the current one partly passed), or over the time since the server
 *		started when that is shorter; keyed as _queue_totals.
 */
Datum
gatekeeper_queue_rates(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	HASH_SEQ_STATUS scan;
	StatsEntry *entry;
	Oid			extension;
	TimestampTz now = GetCurrentTimestamp();
	int64		tick = rate_tick(now);
	double		span;
	double		running;
	uint64	   *queues;
	int64	   *finished;
	int			n = 0;
	int			max = 64;
	int			i;

	gatekeeper_require_schema();
	InitMaterializedSRF(fcinfo, 0);
	if (stats_hash == NULL)
		return (Datum) 0;

	/* the slots' span: from the start of the oldest slot counted to now */
	span = (double) (now - (tick - (RATE_SLOTS - 1)) * RATE_SLOT_SECONDS * USECS_PER_SEC) /
		USECS_PER_SEC;
	running = (double) (now - PgStartTime) / USECS_PER_SEC;
	if (running < span)
		span = Max(running, 1.0);

	extension = current_extension();
	queues = palloc(max * sizeof(uint64));
	finished = palloc(max * sizeof(int64));
	LWLockAcquire(stats_shared->lock, LW_SHARED);
	hash_seq_init(&scan, stats_hash);
	while ((entry = hash_seq_search(&scan)) != NULL)
	{
		int64		sum = 0;
		int			k;

		if (entry->key.database != MyDatabaseId || entry->key.extension != extension)
			continue;
		for (k = 0; k < RATE_SLOTS; k++)
			if (entry->recent_tick[k] > tick - RATE_SLOTS && entry->recent_tick[k] <= tick)
				sum += entry->recent[k];
		if (sum == 0)
			continue;
		if (n == max)
		{
			max *= 2;
			queues = repalloc(queues, max * sizeof(uint64));
			finished = repalloc(finished, max * sizeof(int64));
		}
		queues[n] = entry->key.queue;
		finished[n++] = sum;
	}
	LWLockRelease(stats_shared->lock);

	for (i = 0; i < n; i++)
	{
		Datum		values[2];
		bool		nulls[2] = {false, false};

		values[0] = Int64GetDatum((int64) queues[i]);
		values[1] = Float8GetDatum((double) finished[i] / span);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/*
 * Add the committed transaction's counts to shared memory, in the order
 * they were noted.  Runs after the commit: must not fail.
 */
static void
stats_flush(void)
{
	int			i;
	bool		full = false;
	int64		tick;

	if (npending == 0 || stats_hash == NULL)
	{
		npending = 0;
		return;
	}
	tick = rate_tick(GetCurrentTimestamp());
	LWLockAcquire(stats_shared->lock, LW_EXCLUSIVE);
	for (i = 0; i < npending; i++)
	{
		PendingStats *p = &pending[i];
		StatsEntry *entry;
		int			k;
		int64		finished;
		int			slot = (int) (tick % RATE_SLOTS);

		if (p->forget != FORGET_NOTHING)
		{
			if (forget_matching(&p->key, p->forget) > 0)
				stats_shared->full_logged = false;
			continue;
		}
		entry = hash_search(stats_hash, &p->key, HASH_FIND, NULL);
		if (entry == NULL)
		{
			/* never past the bound: further entries would take spare memory */
			if (hash_get_num_entries(stats_hash) < STATS_MAX_QUEUES)
				entry = hash_search(stats_hash, &p->key, HASH_ENTER_NULL, NULL);
			if (entry == NULL)
			{
				full |= !stats_shared->full_logged;
				stats_shared->full_logged = true;
				continue;
			}
			memset(entry->counts, 0, sizeof(entry->counts));
			memset(entry->recent, 0, sizeof(entry->recent));
			memset(entry->recent_tick, 0, sizeof(entry->recent_tick));
		}
		for (k = 0; k < STAT_KINDS; k++)
			entry->counts[k] += p->counts[k];
		finished = p->counts[STAT_SENT] + p->counts[STAT_FAILED] +
			p->counts[STAT_SUPPRESSED] + p->counts[STAT_EXPIRED] +
			p->counts[STAT_UNKNOWN];
		if (finished > 0)
		{
			if (entry->recent_tick[slot] != tick)
			{
				entry->recent_tick[slot] = tick;
				entry->recent[slot] = 0;
			}
			entry->recent[slot] += finished;
		}
	}
	LWLockRelease(stats_shared->lock);
	npending = 0;
	if (full)
		ereport(LOG,
				(errmsg("gatekeeper keeps the totals of %d queues at most: further queues have none",
						STATS_MAX_QUEUES),
				 errhint("Dropped queues, extensions and databases make room, and so does reset_stats().")));
}

/*
 * Remove the entries a commit forgets: the key's (FORGET_QUEUE), or every
 * entry of its database and extension, or of its database.  Returns how
 * many went.  With the lock held exclusively.
 */
static int
forget_matching(const StatsKey *key, StatsForget what)
{
	HASH_SEQ_STATUS scan;
	StatsEntry *entry;
	int			n = 0;

	if (what == FORGET_QUEUE)
		return hash_search(stats_hash, key, HASH_REMOVE, NULL) != NULL ? 1 : 0;
	hash_seq_init(&scan, stats_hash);
	while ((entry = hash_seq_search(&scan)) != NULL)
	{
		if (entry->key.database != key->database)
			continue;
		if (what == FORGET_EXTENSION && entry->key.extension != key->extension)
			continue;
		/* removing the element just returned is allowed during a scan */
		hash_search(stats_hash, &entry->key, HASH_REMOVE, NULL);
		n++;
	}
	return n;
}

/*
 * Whether the hash is at its bound (read without the lock: a hint).
 */
static bool
stats_full(void)
{
	return stats_hash != NULL && hash_get_num_entries(stats_hash) >= STATS_MAX_QUEUES;
}

/*
 * A full hash: free the entries of databases that no longer exist, and of
 * the current database's extensions but the current one (a server whose
 * drops did not free them, or a totals file it wrote, may have left them).
 * Inside a transaction, at most once per STATS_SWEEP_INTERVAL_MS in each
 * backend.  The databases are looked up without the lock: a database with
 * entries existed when they were counted, and one dropped meanwhile frees
 * its own at commit.
 */
static void
stats_sweep(void)
{
	HASH_SEQ_STATUS scan;
	StatsEntry *entry;
	Oid		   *databases;
	bool	   *gone;
	int			ndatabases = 0;
	int			maxdatabases = 16;
	Oid			extension;
	int			freed = 0;
	int			i;
	TimestampTz now = GetCurrentTimestamp();

	if (!IsTransactionState() ||
		!TimestampDifferenceExceeds(last_sweep, now, STATS_SWEEP_INTERVAL_MS))
		return;
	last_sweep = now;
	extension = current_extension();

	/* the databases that have entries */
	databases = palloc(maxdatabases * sizeof(Oid));
	LWLockAcquire(stats_shared->lock, LW_SHARED);
	hash_seq_init(&scan, stats_hash);
	while ((entry = hash_seq_search(&scan)) != NULL)
	{
		for (i = 0; i < ndatabases; i++)
			if (databases[i] == entry->key.database)
				break;
		if (i < ndatabases)
			continue;
		if (ndatabases == maxdatabases)
		{
			maxdatabases *= 2;
			databases = repalloc(databases, maxdatabases * sizeof(Oid));
		}
		databases[ndatabases++] = entry->key.database;
	}
	LWLockRelease(stats_shared->lock);

	gone = palloc0(Max(ndatabases, 1) * sizeof(bool));
	for (i = 0; i < ndatabases; i++)
		gone[i] = databases[i] != MyDatabaseId &&
			!SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(databases[i]));

	LWLockAcquire(stats_shared->lock, LW_EXCLUSIVE);
	hash_seq_init(&scan, stats_hash);
	while ((entry = hash_seq_search(&scan)) != NULL)
	{
		bool		dead = false;

		if (entry->key.database == MyDatabaseId)
			dead = entry->key.extension != extension;
		else
		{
			for (i = 0; i < ndatabases; i++)
				if (databases[i] == entry->key.database)
					break;
			dead = i < ndatabases && gone[i];
		}
		if (dead)
		{
			hash_search(stats_hash, &entry->key, HASH_REMOVE, NULL);
			freed++;
		}
	}
	if (freed > 0)
		stats_shared->full_logged = false;
	LWLockRelease(stats_shared->lock);
	pfree(databases);
	pfree(gone);
	if (freed > 0)
		ereport(LOG,
				(errmsg_plural("gatekeeper freed the totals of %d queue of dropped databases or extensions",
							   "gatekeeper freed the totals of %d queues of dropped databases or extensions",
							   freed, freed)));
}

/*
 * In the postmaster at start: read the totals of the last clean shutdown,
 * then remove the file, so that after a crash the totals start at zero.
 */
static void
stats_load(void)
{
	FILE	   *file;
	uint32		header[2];
	StatsSaved	e;
	uint32		n;

	file = AllocateFile(STATS_FILE, PG_BINARY_R);
	if (file == NULL)
	{
		if (errno != ENOENT)
			ereport(LOG,
					(errcode_for_file_access(),
					 errmsg("could not read file \"%s\": %m", STATS_FILE)));
		return;
	}
	if (fread(header, sizeof(header), 1, file) != 1 || header[0] != STATS_FILE_MAGIC)
		ereport(LOG,
				(errmsg("ignoring gatekeeper totals file \"%s\": not one this version wrote",
						STATS_FILE)));
	else
	{
		for (n = 0; n < header[1] && n < STATS_MAX_QUEUES &&
			 fread(&e, sizeof(e), 1, file) == 1; n++)
		{
			StatsEntry *entry = hash_search(stats_hash, &e.key, HASH_ENTER_NULL, NULL);

			if (entry == NULL)
				break;
			memcpy(entry->counts, e.counts, sizeof(e.counts));
			memset(entry->recent, 0, sizeof(entry->recent));
			memset(entry->recent_tick, 0, sizeof(entry->recent_tick));
		}
	}
	FreeFile(file);
	unlink(STATS_FILE);
}

/*
 * on_shmem_exit in the postmaster: at a clean exit write the totals, to a
 * temporary file renamed into place.
 */
static void
stats_save(int code, Datum arg)
{
	FILE	   *file;
	HASH_SEQ_STATUS scan;
	StatsEntry *entry;
	uint32		header[2];

	if (code != 0 || stats_hash == NULL)
		return;
	file = AllocateFile(STATS_FILE_TMP, PG_BINARY_W);
	if (file == NULL)
		goto error;
	header[0] = STATS_FILE_MAGIC;
	header[1] = (uint32) hash_get_num_entries(stats_hash);
	if (fwrite(header, sizeof(header), 1, file) != 1)
		goto error;
	hash_seq_init(&scan, stats_hash);
	while ((entry = hash_seq_search(&scan)) != NULL)
	{
		StatsSaved	saved;

		saved.key = entry->key;
		memcpy(saved.counts, entry->counts, sizeof(saved.counts));
		if (fwrite(&saved, sizeof(saved), 1, file) != 1)
		{
			hash_seq_term(&scan);
			goto error;
		}
	}
	if (FreeFile(file))
	{
		file = NULL;
		goto error;
	}
	(void) durable_rename(STATS_FILE_TMP, STATS_FILE, LOG);
	return;

error:
	ereport(LOG,
			(errcode_for_file_access(),
			 errmsg("could not write file \"%s\": %m", STATS_FILE_TMP)));
	if (file)
		FreeFile(file);
	unlink(STATS_FILE_TMP);
}
