/*-------------------------------------------------------------------------
 *
 * due_floor.c
 *		Where a claim's walk of mail_due may start: a floor per queue, in
 *		shared memory, below which every entry of mail_due is dead.
 *
 * A claim deletes the live rows of the mail it takes.  Their entries stay
 * in mail_due until a VACUUM removes them, and they sit at the start of
 * the queue's range, where every claim's index scan begins: new mail is
 * due later, so no insert ever lands on those leaf pages and btree's own
 * deletion of dead entries (done when an insert finds a page full) never
 * runs there.  Each claim walked every entry of every mail claimed since
 * the last vacuum, twice (the priority probe and the due scan): after six
 * waves of 300,000 mails drained between two autovacuum naps, 15,000
 * index pages a claim (docs/internals.md, "The due floor").
 *
 * So each claim first walks mail_due itself, in C, from its queue's floor
 * to the first entry whose row is not gone for good, raises the floor to
 * that entry, and starts its statement there.  Gone for good: every
 * version of the row (its HOT chain) was deleted by a committed
 * transaction or inserted by an aborted one, which a dirty snapshot tells
 * without waiting for the horizon: a row a claim deleted is passed as soon
 * as that claim commits, even while an older snapshot can still see it.
 * Such a snapshot loses nothing: a claim that saw the row would find it
 * deleted under its lock and skip it (or, in REPEATABLE READ, fail with a
 * serialization error).  The entries the walk finds dead to every
 * transaction are marked LP_DEAD on the way, as any index scan marks
 * them.  Most claims walk only the entries of the few claims committed
 * since the last one.
 *
 * The floor is only correct while no live entry sits below it.  An entry
 * the walk passed is gone and stays gone; what can appear below the
 * floor is a new entry: a writer's insert, or an update that moves a row.
 * So every writer of mail_live lowers the floor of the queues it wrote to
 * the keys it wrote, after the index entries exist (the live counts'
 * AFTER statement triggers of mail_live, ENABLE ALWAYS, and the insert
 * trigger of gatekeeper.mail for the rows it writes past the executor),
 * and every lowering counts up the floor's version.  A claim raises the
 * floor only if the version is still the one it read before its walk.
 * Then a writer whose entry the walk missed (it came after the walk had
 * passed its place) lowers after its insert, so after the walk began:
 * either before the raise, which the version then refuses, or after it,
 * below the raised floor.  An uncommitted insert, a row locked by another
 * claim, a row deleted by a claim not yet committed are not gone: the
 * walk stops there.  A writer the triggers do not see (mail_live written
 * with its triggers disabled, as pg_restore --disable-triggers does) is
 * covered by the safety net: a floor older than FULL_WALK_MS is ignored
 * and the walk starts from the queue's first entry again, and
 * recount_live() forgets every floor.
 *
 * The floor covers the queue's highest priority levels down to the first
 * live entry; the claim's probes for lower priority levels still start at
 * each level's first entry.  A queue with no slot (more than
 * DUE_FLOOR_SLOTS queues claimed from since the server started) is
 * claimed as before, from its first entry.  Shared memory starts empty
 * after every restart: no floor, the first claim walks from the start.
 *
 * IDENTIFICATION
 *		src/due_floor.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "due_floor.h"
#include "catalog.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/itup.h"
#include "access/relscan.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/bufmgr.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

/* queues with a floor, in all databases */
#define DUE_FLOOR_SLOTS		128

/* longest queue name with a floor (others are claimed from their start) */
#define DUE_FLOOR_NAME		64

/* a floor this old is not trusted: the walk starts at the queue's start */
#define FULL_WALK_MS		10000

/* a queue's floors: one in mail_due, one in mail_run_due (DueFloorKind) */
typedef struct DueFloorSlot
{
	Oid			dbid;			/* InvalidOid: free */
	char		queue[DUE_FLOOR_NAME];
	bool		valid[DUE_FLOOR_KINDS]; /* floor holds a position */
	DueKey		floor[DUE_FLOOR_KINDS];
	uint64		version[DUE_FLOOR_KINDS];	/* counted up by every lowering */
	TimestampTz walked_at[DUE_FLOOR_KINDS]; /* the last walk from the start */
} DueFloorSlot;

typedef struct DueFloorShared
{
	slock_t		mutex;
	DueFloorSlot slots[DUE_FLOOR_SLOTS];
} DueFloorShared;

static DueFloorShared *due_floor = NULL;

/*
 * Bytes of shared memory.
 */
Size
gatekeeper_due_floor_shmem_size(void)
{
	return sizeof(DueFloorShared);
}

/*
 * Create or attach to the floors; called from the shmem startup hook with
 * AddinShmemInitLock held.
 */
void
gatekeeper_due_floor_shmem_init(void)
{
	bool		found;

	due_floor = ShmemInitStruct("gatekeeper due floors", sizeof(DueFloorShared), &found);
	if (!found)
	{
		memset(due_floor, 0, sizeof(DueFloorShared));
		SpinLockInit(&due_floor->mutex);
	}
}

/*
 * Compare two positions in mail_due's order (priority DESC, send_at, id).
 */
static int
due_key_cmp(const DueKey *a, const DueKey *b)
{
	if (a->priority != b->priority)
		return a->priority > b->priority ? -1 : 1;
	if (a->send_at != b->send_at)
		return a->send_at < b->send_at ? -1 : 1;
	if (a->id != b->id)
		return a->id < b->id ? -1 : 1;
	return 0;
}

/*
 * The slot of queue in this database, or with create the first free one
 * made its own, or NULL.  Called with the mutex held.
 */
static DueFloorSlot *
find_slot(const char *queue, int len, bool create)
{
	DueFloorSlot *free_slot = NULL;
	int			i;

	if (len >= DUE_FLOOR_NAME)
		return NULL;
	for (i = 0; i < DUE_FLOOR_SLOTS; i++)
	{
		DueFloorSlot *s = &due_floor->slots[i];

		if (s->dbid == MyDatabaseId &&
			strncmp(s->queue, queue, len) == 0 && s->queue[len] == '\0')
			return s;
		if (s->dbid == InvalidOid && free_slot == NULL)
			free_slot = s;
	}
	if (!create || free_slot == NULL)
		return NULL;
	free_slot->dbid = MyDatabaseId;
	memcpy(free_slot->queue, queue, len);
	free_slot->queue[len] = '\0';
	memset(free_slot->valid, 0, sizeof(free_slot->valid));
	memset(free_slot->version, 0, sizeof(free_slot->version));
	memset(free_slot->walked_at, 0, sizeof(free_slot->walked_at));
	return free_slot;
}

/*
 * Lower the floor of the given kind of queue to key, and count up its
 * version.
 */
static void
lower_floor(DueFloorKind kind, Datum queue, const DueKey *key)
{
	text	   *name = DatumGetTextPP(queue);
	DueFloorSlot *s;

	if (due_floor == NULL)
		return;
	SpinLockAcquire(&due_floor->mutex);
	s = find_slot(VARDATA_ANY(name), VARSIZE_ANY_EXHDR(name), false);
	if (s != NULL)
	{
		if (s->valid[kind] && due_key_cmp(key, &s->floor[kind]) < 0)
			s->floor[kind] = *key;
		s->version[kind]++;
	}
	SpinLockRelease(&due_floor->mutex);
}

/*
 * gatekeeper_due_floor_note_start
 *		Start gathering the keys a writer writes to mail_live (DUE_FLOOR_LIVE)
 *		or mail_run (DUE_FLOOR_RUN), to lower the queues' floors to them.
 */
void
gatekeeper_due_floor_note_start(DueFloorNote *note, DueFloorKind kind)
{
	note->kind = kind;
	note->queue = NULL;
}

/*
 * gatekeeper_due_floor_note
 *		A writer has written a scheduled row (or a run) of queue at key, its
 *		index entry already made: the floor of its queue must not pass it.
 *		Consecutive rows of one queue are lowered to once, at their least
 *		key, when the queue changes or the note ends; the queue's name is
 *		copied into the current memory context.
 */
void
gatekeeper_due_floor_note(DueFloorNote *note, Datum queue, const DueKey *key)
{
	text	   *q = DatumGetTextPP(queue);

	if (note->queue != NULL &&
		(VARSIZE_ANY_EXHDR(q) != VARSIZE_ANY_EXHDR(note->queue) ||
		 memcmp(VARDATA_ANY(q), VARDATA_ANY(note->queue), VARSIZE_ANY_EXHDR(q)) != 0))
		gatekeeper_due_floor_note_end(note);
	if (note->queue == NULL)
	{
		note->queue = (text *) PG_DETOAST_DATUM_COPY(queue);
		note->min = *key;
	}
	else if (due_key_cmp(key, &note->min) < 0)
		note->min = *key;
}

/*
 * gatekeeper_due_floor_note_end
 *		Lower the floor to the rows noted since the last lowering: before
 *		the statement that wrote them returns.
 */
void
gatekeeper_due_floor_note_end(DueFloorNote *note)
{
	if (note->queue == NULL)
		return;
	lower_floor(note->kind, PointerGetDatum(note->queue), &note->min);
	note->queue = NULL;
}

/*
 * gatekeeper_due_floor_reset
 *		Forget every floor of this database (recount_live, after writes
 *		the triggers did not see).
 */
void
gatekeeper_due_floor_reset(void)
{
	int			i;

	if (due_floor == NULL)
		return;
	SpinLockAcquire(&due_floor->mutex);
	for (i = 0; i < DUE_FLOOR_SLOTS; i++)
	{
		DueFloorSlot *s = &due_floor->slots[i];

		if (s->dbid == MyDatabaseId)
		{
			int			k;

			for (k = 0; k < DUE_FLOOR_KINDS; k++)
			{
				s->valid[k] = false;
				s->version[k]++;
			}
		}
	}
	SpinLockRelease(&due_floor->mutex);
}

/*
 * Whether the row an entry of mail_due points at is gone for good: no
 * version of it (its HOT chain from tid) is seen by a dirty snapshot, which
 * sees every version not deleted by a committed transaction nor inserted
 * by an aborted one, in-progress work included; and no version was deleted
 * by this transaction, which may still roll back (the dirty snapshot does
 * not see those either).  *all_dead: every version is dead to every
 * transaction, so the entry may be marked LP_DEAD.  *buffer is the heap
 * page of the entry before (InvalidBuffer at first), kept pinned for the
 * next: the entries of mail claimed together lie on the same few pages.
 */
static bool
row_gone(Relation heap, ItemPointer tid, Buffer *buffer, bool *all_dead)
{
	SnapshotData dirty;
	HeapTupleData tuple;
	ItemPointerData at = *tid;
	BlockNumber block = ItemPointerGetBlockNumber(tid);
	bool		gone;
	bool		first = true;

	InitDirtySnapshot(dirty);
	if (!BufferIsValid(*buffer) || BufferGetBlockNumber(*buffer) != block)
		*buffer = ReleaseAndReadBuffer(*buffer, heap, block);
	LockBuffer(*buffer, BUFFER_LOCK_SHARE);
	gone = !heap_hot_search_buffer(&at, heap, *buffer, &dirty, &tuple, all_dead, true);
	at = *tid;
	while (gone &&
		   heap_hot_search_buffer(&at, heap, *buffer, SnapshotAny, &tuple, NULL, first))
	{
		HeapTupleHeader htup = tuple.t_data;

		first = false;
		if (!(htup->t_infomask & HEAP_XMAX_INVALID) &&
			!HEAP_XMAX_IS_LOCKED_ONLY(htup->t_infomask) &&
			TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetUpdateXid(htup)))
			gone = false;
	}
	LockBuffer(*buffer, BUFFER_LOCK_UNLOCK);
	pgstat_count_heap_fetch(heap);
	return gone;
}

/*
 * Walk mail_due under the given scan keys, past the entries whose rows are
 * gone for good.  Returns true and the entry's key in *stop at the first
 * one that is not; else false, with the last entry passed in *passed
 * (*npassed counts them).
 */
static bool
walk(Relation heap, Relation index, ScanKey keys, int nkeys,
	 DueKey *stop, DueKey *passed, int64 *npassed)
{
	IndexScanDesc scan;
	SnapshotData dirty;
	Buffer		buffer = InvalidBuffer;
	bool		stopped = false;

	/* the index scan's snapshot: non-MVCC keeps its leaf page pinned */
	InitDirtySnapshot(dirty);
	scan = index_beginscan(heap, index, &dirty, nkeys, 0);
	scan->xs_want_itup = true;
	index_rescan(scan, keys, nkeys, NULL, 0);
	while (index_getnext_tid(scan, ForwardScanDirection) != NULL)
	{
		bool		all_dead = false;
		bool		isnull;
		DueKey		k;

		CHECK_FOR_INTERRUPTS();
		k.priority = DatumGetInt32(index_getattr(scan->xs_itup, 2, scan->xs_itupdesc, &isnull));
		k.send_at = DatumGetTimestampTz(index_getattr(scan->xs_itup, 3, scan->xs_itupdesc, &isnull));
		k.id = DatumGetInt64(index_getattr(scan->xs_itup, 4, scan->xs_itupdesc, &isnull));
		if (!row_gone(heap, &scan->xs_heaptid, &buffer, &all_dead))
		{
			*stop = k;
			stopped = true;
			break;
		}
		/* as index_fetch_heap does: the next call marks this entry dead */
		if (!scan->xactStartedInRecovery)
			scan->kill_prior_tuple = all_dead;
		*passed = k;
		(*npassed)++;
	}
	if (BufferIsValid(buffer))
		ReleaseBuffer(buffer);
	index_endscan(scan);
	return stopped;
}

/*
 * Walk queue's entries of the kind's index (mail_due or mail_run_due) from
 * its floor past the dead ones, raise the floor there if no writer lowered
 * it meanwhile, and return where the claim may start (false: from the
 * queue's first entry).
 */
static bool
raise_floor(DueFloorKind kind, const char *queue, DueKey *floor)
{
	Oid			live_relid;
	Oid			due_relid;
	Relation	heap;
	Relation	index;
	DueFloorSlot *s;
	uint64		version;
	bool		have;
	DueKey		start;
	DueKey		stop;
	DueKey		passed;
	int64		npassed = 0;
	bool		stopped;
	bool		result;
	ScanKeyData keys[4];
	Datum		qname;
	TimestampTz now = GetCurrentTimestamp();
	int			len = strlen(queue);

	if (due_floor == NULL)
		return false;
	SpinLockAcquire(&due_floor->mutex);
	s = find_slot(queue, len, true);
	if (s == NULL)
	{
		SpinLockRelease(&due_floor->mutex);
		return false;
	}
	version = s->version[kind];
	have = s->valid[kind] &&
		!TimestampDifferenceExceeds(s->walked_at[kind], now, FULL_WALK_MS);
	start = s->floor[kind];
	SpinLockRelease(&due_floor->mutex);

	live_relid = gatekeeper_relid(kind == DUE_FLOOR_RUN ? GATEKEEPER_REL_MAIL_RUN :
								  GATEKEEPER_REL_MAIL_LIVE, true);
	due_relid = gatekeeper_relid(kind == DUE_FLOOR_RUN ? GATEKEEPER_REL_MAIL_RUN_DUE :
								 GATEKEEPER_REL_MAIL_DUE, true);
	if (!OidIsValid(live_relid) || !OidIsValid(due_relid))
		return false;
	/* the lock the claim statement takes next */
	heap = table_open(live_relid, RowExclusiveLock);
	index = index_open(due_relid, RowExclusiveLock);
	qname = CStringGetTextDatum(queue);

	ScanKeyEntryInitialize(&keys[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[0], F_TEXTEQ, qname);
	if (!have)
	{
		/* from the queue's first entry */
		stopped = walk(heap, index, keys, 1, &stop, &passed, &npassed);
	}
	else
	{
		/* from the floor: the rest of its send_at, its priority, below */
		ScanKeyInit(&keys[1], 2, BTEqualStrategyNumber, F_INT4EQ,
					Int32GetDatum(start.priority));
		ScanKeyInit(&keys[2], 3, BTEqualStrategyNumber, F_TIMESTAMPTZ_EQ,
					TimestampTzGetDatum(start.send_at));
		ScanKeyInit(&keys[3], 4, BTGreaterEqualStrategyNumber, F_INT8GE,
					Int64GetDatum(start.id));
		stopped = walk(heap, index, keys, 4, &stop, &passed, &npassed);
		if (!stopped)
		{
			ScanKeyInit(&keys[2], 3, BTGreaterStrategyNumber, F_TIMESTAMPTZ_GT,
						TimestampTzGetDatum(start.send_at));
			stopped = walk(heap, index, keys, 3, &stop, &passed, &npassed);
		}
		if (!stopped)
		{
			ScanKeyInit(&keys[1], 2, BTLessStrategyNumber, F_INT4LT,
						Int32GetDatum(start.priority));
			stopped = walk(heap, index, keys, 2, &stop, &passed, &npassed);
		}
	}
	index_close(index, NoLock);
	table_close(heap, NoLock);

	SpinLockAcquire(&due_floor->mutex);
	if (s->version[kind] == version && s->dbid == MyDatabaseId)
	{
		if (stopped)
			s->floor[kind] = stop, s->valid[kind] = true;
		else if (npassed > 0)
			s->floor[kind] = passed, s->valid[kind] = true;
		else if (!have)
			s->valid[kind] = false; /* no entry at all */
		if (!have)
			s->walked_at[kind] = now;
	}
	result = s->valid[kind] && s->dbid == MyDatabaseId && strcmp(s->queue, queue) == 0;
	if (result)
		*floor = s->floor[kind];
	SpinLockRelease(&due_floor->mutex);
	return result;
}

/*
 * gatekeeper_due_floor_raise
 *		Raise queue's floor in mail_due past the entries of mail claimed
 *		before, and return where the claim's walk of its live rows may
 *		start (false: from the queue's first entry).
 */
bool
gatekeeper_due_floor_raise(const char *queue, DueKey *floor)
{
	return raise_floor(DUE_FLOOR_LIVE, queue, floor);
}

/*
 * gatekeeper_due_floor_raise_run
 *		The same in mail_run_due: past the entries of runs claimed whole and
 *		of the old versions of runs a claim moved on.
 */
bool
gatekeeper_due_floor_raise_run(const char *queue, DueKey *floor)
{
	return raise_floor(DUE_FLOOR_RUN, queue, floor);
}
