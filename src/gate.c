/*-------------------------------------------------------------------------
 *
 * gate.c
 *		Gates: at most max_sends passes per recipient within a period.
 *
 * The live passes are kept in shared memory: a dshash table on a DSA area
 * created in place in gatekeeper's fixed shared memory (as the cumulative
 * statistics do), one entry per (database, extension, gate, recipient).
 * The recipient is keyed by 128 bits of SipHash-2-4 under a random key
 * drawn when the postmaster creates the table, so collisions cannot be
 * chosen in advance: among n keys the chance of any collision is below
 * n^2 / 2^129 (for a billion keys, under 10^-20).  Each entry holds its
 * passes: the expiry (stamped with the period in force when the pass was
 * made), the holder, the transaction that made it (xmin) and the one that
 * gave it back (xmax), and the transaction that last locked the entry.
 *
 * Passes are transactional, as rows would be.  A caller locks an entry by
 * stamping it with its transaction id; anyone finding the entry stamped by
 * a transaction still in progress releases the partition lock and waits
 * for that transaction with XactLockTableWait, as for a row lock, so the
 * wait shows in pg_locks and the deadlock detector sees it.  A pass whose
 * xmin aborted never existed; one whose xmax committed is gone.  Stamps
 * are the current (sub)transaction's id, so ROLLBACK TO SAVEPOINT undoes
 * a pass, or a release, like any row change.  Every caller locks its
 * entries in one global order, byte order of (recipient, gate), so crossed
 * batches cannot deadlock.
 *
 * Durability: in the same transaction every call that changes passes
 * appends one row per gate to gatekeeper.gate_log (the gate, the
 * recipients, the holders, the expiry), and one row per gate for the
 * passes it gave back.  Shared memory starts empty after a restart, and a
 * database's extension has its own entries (the log table's OID is part
 * of the key), so the first use in a database rebuilds the state from the
 * committed, unexpired log rows, under a marker entry that makes other
 * first users wait.  The rebuilt passes are stamped with the rebuilding
 * transaction: should it abort, they vanish and the next user rebuilds.
 * A committed pass can therefore never be lost to a crash.  purge()
 * deletes expired log rows and sweeps expired passes out of memory.
 *
 * PREPARE TRANSACTION is refused for a transaction that changed gates: a
 * prepared pass would survive a restart only in its uncommitted log row,
 * which the rebuild cannot see.
 *
 * The shared state is bounded by gatekeeper.gate_memory; a call that would
 * need more fails with 53200 before it changes anything.
 *
 *-------------------------------------------------------------------------
 */
#include "gatekeeper.h"

#include "access/transam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "lib/dshash.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "storage/lwlock.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/dsa.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

PG_FUNCTION_INFO_V1(gatekeeper_gate_pass);
PG_FUNCTION_INFO_V1(gatekeeper_gate_pass_batch);
PG_FUNCTION_INFO_V1(gatekeeper_gate_open);
PG_FUNCTION_INFO_V1(gatekeeper_gate_next_open);
PG_FUNCTION_INFO_V1(gatekeeper_gate_release);
PG_FUNCTION_INFO_V1(gatekeeper_release_mail);
PG_FUNCTION_INFO_V1(gatekeeper_release_mails);
PG_FUNCTION_INFO_V1(gatekeeper_explain);
PG_FUNCTION_INFO_V1(gatekeeper_gate_sweep);
PG_FUNCTION_INFO_V1(gatekeeper_gate_restamp);

/* Size of the DSA area made in place in the fixed shared memory. */
#define GATE_DSA_INIT_SIZE	(1024 * 1024)

/* What an entry costs against gatekeeper.gate_memory, with dshash's own. */
#define GATE_ENTRY_CHARGE	(MAXALIGN(sizeof(GateEntry)) + 32)

/* purge() sweeps the shared table at most this often */
#define GATE_SWEEP_INTERVAL_MS	(60 * 1000)

/* Passes an entry holds without a separate allocation. */
#define GATE_INLINE_PASSES	1

/*
 * An entry's key.  gate 0 with a zero hash is the marker entry of a
 * database's extension: it exists once that state has been rebuilt.
 */
typedef struct GateKey
{
	Oid			dbid;
	Oid			space;			/* OID of that database's gatekeeper.gate_log */
	int32		gate;			/* gatekeeper.gate.id */
	uint32		pad;			/* zero */
	uint64		hash[2];		/* keyed hash of the recipient key */
} GateKey;

typedef struct GatePass
{
	TimestampTz expires;
	int64		holder;
	TransactionId xmin;			/* made by */
	TransactionId xmax;			/* given back by, or invalid */
	bool		holder_null;
	bool		committed;		/* xmin is known to have committed */
} GatePass;

typedef struct GateEntry
{
	GateKey		key;
	TransactionId locker;		/* last transaction to lock the entry */
	uint16		npass;
	uint16		cap;			/* GATE_INLINE_PASSES, or the size of more */
	dsa_pointer more;			/* passes beyond the inline ones */
	GatePass	passes[GATE_INLINE_PASSES];
} GateEntry;

/* The fixed part in the main shared memory, then the DSA area. */
typedef struct GateShared
{
	int			dsa_tranche;
	int			hash_tranche;
	dshash_table_handle handle;
	uint64		seed[4];		/* SipHash keys, per postmaster */
	Size		limit;			/* gatekeeper.gate_memory in bytes */
	pg_atomic_uint64 charged;	/* bytes charged against limit */
	pg_atomic_uint64 swept;		/* when purge() last swept (TimestampTz) */
} GateShared;

static GateShared *gate_shared = NULL;
static void gate_memory_full(void) pg_attribute_noreturn();
static dsa_area *gate_dsa = NULL;
static dshash_table *gate_hash = NULL;
static dshash_parameters gate_params;

/* the space this backend has seen rebuilt, and this transaction's flags */
static Oid	loaded_space = InvalidOid;
static bool gates_changed = false;
static bool xact_callback_registered = false;

static SPIPlanPtr log_plan = NULL;

/* A gate's definition. */
typedef struct GateDef
{
	int32		id;
	int32		max_sends;
	TimestampTz expiry;			/* now() + period: when a pass made now expires */
} GateDef;

/* Where a change is logged: one log row per gate and kind. */
typedef struct LogGroup
{
	int32		gate;
	bool		released;
	TimestampTz expires;		/* of the passes; the latest for releases */
	int			n;
	int			cap;
	Datum	   *recipients;
	Datum	   *holders;
	bool	   *holder_nulls;
	bool		any_holder;
} LogGroup;

/* ---------------------------------------------------------------- keys */

#define ROTL64(x, b) (uint64) (((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND \
	do { \
		v0 += v1; v1 = ROTL64(v1, 13); v1 ^= v0; v0 = ROTL64(v0, 32); \
		v2 += v3; v3 = ROTL64(v3, 16); v3 ^= v2; \
		v0 += v3; v3 = ROTL64(v3, 21); v3 ^= v0; \
		v2 += v1; v1 = ROTL64(v1, 17); v1 ^= v2; v2 = ROTL64(v2, 32); \
	} while (0)

/*
 * SipHash-2-4 of len bytes under the key (k0, k1): a keyed pseudo-random
 * function, so that without the key nobody can find colliding inputs.
 */
static uint64
siphash24(uint64 k0, uint64 k1, const unsigned char *m, size_t len)
{
	uint64		v0 = k0 ^ UINT64CONST(0x736f6d6570736575);
	uint64		v1 = k1 ^ UINT64CONST(0x646f72616e646f6d);
	uint64		v2 = k0 ^ UINT64CONST(0x6c7967656e657261);
	uint64		v3 = k1 ^ UINT64CONST(0x7465646279746573);
	uint64		b = ((uint64) len) << 56;
	size_t		i;
	size_t		j;

	for (i = 0; i + 8 <= len; i += 8)
	{
		uint64		mi = 0;

		for (j = 0; j < 8; j++)
			mi |= ((uint64) m[i + j]) << (8 * j);
		v3 ^= mi;
		SIPROUND;
		SIPROUND;
		v0 ^= mi;
	}
	for (j = 0; j < len - i; j++)
		b |= ((uint64) m[i + j]) << (8 * j);
	v3 ^= b;
	SIPROUND;
	SIPROUND;
	v0 ^= b;
	v2 ^= 0xff;
	SIPROUND;
	SIPROUND;
	SIPROUND;
	SIPROUND;
	return v0 ^ v1 ^ v2 ^ v3;
}

/*
 * The key of one recipient's entry for one gate in a space.
 */
static void
make_key(GateKey *key, Oid space, int32 gate, const char *recipient)
{
	size_t		len = strlen(recipient);

	memset(key, 0, sizeof(GateKey));
	key->dbid = MyDatabaseId;
	key->space = space;
	key->gate = gate;
	key->hash[0] = siphash24(gate_shared->seed[0], gate_shared->seed[1],
							 (const unsigned char *) recipient, len);
	key->hash[1] = siphash24(gate_shared->seed[2], gate_shared->seed[3],
							 (const unsigned char *) recipient, len);
}

/*
 * The key of a row's entry in a space; the recipient's hash is computed
 * once per row.
 */
static void
row_key(GateRow *row, Oid space, GateKey *key)
{
	if (!row->hashed)
	{
		make_key(key, space, row->gate, row->recipient);
		row->hash[0] = key->hash[0];
		row->hash[1] = key->hash[1];
		row->hashed = true;
		return;
	}
	memset(key, 0, sizeof(GateKey));
	key->dbid = MyDatabaseId;
	key->space = space;
	key->gate = row->gate;
	key->hash[0] = row->hash[0];
	key->hash[1] = row->hash[1];
}

/*
 * dshash's hash of a key: its bits are already random.
 */
static dshash_hash
gate_key_hash(const void *v, size_t size, void *arg)
{
	const GateKey *key = (const GateKey *) v;

	(void) size;
	(void) arg;
	return hash_combine(hash_combine((uint32) key->hash[0], (uint32) key->gate),
						hash_combine((uint32) key->space, (uint32) key->dbid));
}

/* ---------------------------------------------------------------- shared memory */

/*
 * gatekeeper_gate_shmem_size
 *		Bytes of the main shared memory the gates need.
 */
Size
gatekeeper_gate_shmem_size(void)
{
	return add_size(MAXALIGN(sizeof(GateShared)), GATE_DSA_INIT_SIZE);
}

/*
 * gatekeeper_gate_shmem_init
 *		Create the gates' shared state, or find it.  Called from the
 *		shmem_startup_hook with AddinShmemInitLock held; in the postmaster
 *		it creates the DSA area in place and the dshash table in it, empty,
 *		at every start and after every crash.
 */
void
gatekeeper_gate_shmem_init(void)
{
	bool		found;

	gate_shared = ShmemInitStruct("gatekeeper gates", gatekeeper_gate_shmem_size(), &found);
	if (!found)
	{
		char	   *place = (char *) gate_shared + MAXALIGN(sizeof(GateShared));
		dsa_area   *dsa;
		dshash_table *hash;
		Size		limit = (Size) gatekeeper_gate_memory * 1024;

		gate_shared->dsa_tranche = LWLockNewTrancheId();
		gate_shared->hash_tranche = LWLockNewTrancheId();
		if (!pg_strong_random(gate_shared->seed, sizeof(gate_shared->seed)))
			elog(ERROR, "could not generate a random key for the gates");
		gate_shared->limit = limit;
		pg_atomic_init_u64(&gate_shared->charged, 0);
		pg_atomic_init_u64(&gate_shared->swept, 0);

		dsa = dsa_create_in_place(place, GATE_DSA_INIT_SIZE, gate_shared->dsa_tranche, NULL);
		dsa_pin(dsa);
		gate_params.key_size = sizeof(GateKey);
		gate_params.entry_size = sizeof(GateEntry);
		gate_params.compare_function = dshash_memcmp;
		gate_params.hash_function = gate_key_hash;
		gate_params.tranche_id = gate_shared->hash_tranche;
		hash = dshash_create(dsa, &gate_params, NULL);
		gate_shared->handle = dshash_get_hash_table_handle(hash);

		/*
		 * The hard limit of the area: what is charged, plus room for
		 * dshash's bucket arrays and the area's own rounding.
		 */
		dsa_set_size_limit(dsa, add_size(GATE_DSA_INIT_SIZE,
										 add_size(limit + limit / 4, 8 * 1024 * 1024)));
		dshash_detach(hash);
		dsa_detach(dsa);
	}
}

/*
 * Attach this backend to the shared table, once.
 */
static void
gate_attach(void)
{
	MemoryContext old;
	char	   *place;

	if (gate_hash != NULL)
		return;
	if (gate_shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("gatekeeper gates need the library in shared_preload_libraries"),
				 errhint("Add gatekeeper to shared_preload_libraries and restart the server.")));

	LWLockRegisterTranche(gate_shared->dsa_tranche, "gatekeeper gates area");
	LWLockRegisterTranche(gate_shared->hash_tranche, "gatekeeper gates");
	gate_params.key_size = sizeof(GateKey);
	gate_params.entry_size = sizeof(GateEntry);
	gate_params.compare_function = dshash_memcmp;
	gate_params.hash_function = gate_key_hash;
	gate_params.tranche_id = gate_shared->hash_tranche;

	old = MemoryContextSwitchTo(TopMemoryContext);
	place = (char *) gate_shared + MAXALIGN(sizeof(GateShared));
	gate_dsa = dsa_attach_in_place(place, NULL);
	on_shmem_exit(dsa_on_shmem_exit_release_in_place, PointerGetDatum(place));
	dsa_pin_mapping(gate_dsa);
	gate_hash = dshash_attach(gate_dsa, &gate_params, gate_shared->handle, NULL);
	MemoryContextSwitchTo(old);
}

/*
 * Charge bytes against gatekeeper.gate_memory, or raise 53200 without
 * charging anything.  With sweep (never while a partition lock is held),
 * an overdrawn limit first sweeps out what expired.
 */
static void
gate_charge(Size bytes, bool sweep)
{
	uint64		total = pg_atomic_add_fetch_u64(&gate_shared->charged, bytes);

	if (total <= gate_shared->limit)
		return;
	pg_atomic_sub_fetch_u64(&gate_shared->charged, bytes);
	if (sweep)
	{
		(void) gatekeeper_gate_sweep_memory(InvalidOid);
		total = pg_atomic_add_fetch_u64(&gate_shared->charged, bytes);
		if (total <= gate_shared->limit)
			return;
		pg_atomic_sub_fetch_u64(&gate_shared->charged, bytes);
	}
	gate_memory_full();
}

/*
 * Raise 53200: the shared state has no room for what a call needs.
 */
static void
gate_memory_full(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_OUT_OF_MEMORY),
			 errmsg("gatekeeper gate memory is full"),
			 errdetail("gatekeeper.gate_memory is %d kB and holds about %llu passes.",
					   gatekeeper_gate_memory,
					   (unsigned long long) (gate_shared->limit / GATE_ENTRY_CHARGE)),
			 errhint("Raise gatekeeper.gate_memory and restart the server, or shorten the gates' periods.")));
}

/*
 * Give back bytes charged against gatekeeper.gate_memory.
 */
static void
gate_uncharge(Size bytes)
{
	pg_atomic_sub_fetch_u64(&gate_shared->charged, bytes);
}

/* ---------------------------------------------------------------- transactions */

typedef enum XidState
{
	XID_MINE,
	XID_RUNNING,
	XID_COMMITTED,
	XID_ABORTED
} XidState;

/*
 * What became of the transaction that stamped a pass or an entry.  A
 * transaction older than the commit log's horizon counts as committed: a
 * pass so old that its fate can no longer be read keeps its gate closed
 * rather than open (purge() settles every stamp long before that).
 */
static XidState
xid_state(TransactionId xid)
{
	bool		committed;

	if (TransactionIdIsCurrentTransactionId(xid))
		return XID_MINE;
	if (TransactionIdIsInProgress(xid))
		return XID_RUNNING;
	LWLockAcquire(XactTruncationLock, LW_SHARED);
	if (TransactionIdPrecedes(xid, ShmemVariableCache->oldestClogXid))
		committed = true;
	else
		committed = TransactionIdDidCommit(xid);
	LWLockRelease(XactTruncationLock);
	return committed ? XID_COMMITTED : XID_ABORTED;
}

/*
 * Is xid a transaction in progress other than this one (or one of its
 * subtransactions)?
 */
static bool
xid_running(TransactionId xid)
{
	return TransactionIdIsValid(xid) &&
		!TransactionIdIsCurrentTransactionId(xid) &&
		TransactionIdIsInProgress(xid);
}

/*
 * Refuse PREPARE TRANSACTION in a transaction that changed gates, and
 * forget the flag at the end of every transaction.
 */
static void
gate_xact_callback(XactEvent event, void *arg)
{
	(void) arg;

	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:
			if (gates_changed)
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot prepare a transaction that passed or released gatekeeper gates")));
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			gates_changed = false;
			break;
		default:
			break;
	}
}

/*
 * This transaction is about to change gates: give it an id to stamp with.
 */
static TransactionId
my_xid(void)
{
	if (!xact_callback_registered)
	{
		RegisterXactCallback(gate_xact_callback, NULL);
		xact_callback_registered = true;
	}
	gates_changed = true;
	return GetCurrentTransactionId();
}

/* ---------------------------------------------------------------- entries */

/*
 * An entry's array of passes: inline, or its own allocation once it grew.
 */
static GatePass *
entry_passes(GateEntry *e)
{
	if (e->cap <= GATE_INLINE_PASSES)
		return e->passes;
	return (GatePass *) dsa_get_address(gate_dsa, e->more);
}

/*
 * A new entry: no passes, not locked.
 */
static void
entry_init(GateEntry *e)
{
	e->locker = InvalidTransactionId;
	e->npass = 0;
	e->cap = GATE_INLINE_PASSES;
	e->more = InvalidDsaPointer;
}

/*
 * Drop what is dead from a locked entry: expired passes, passes whose
 * maker aborted or whose release committed; remember commits seen.  The
 * caller holds the partition lock exclusively, and no other transaction
 * in progress has the entry locked.
 */
static void
entry_prune(GateEntry *e, TimestampTz now)
{
	GatePass   *p = entry_passes(e);
	int			kept = 0;
	int			i;

	for (i = 0; i < e->npass; i++)
	{
		GatePass   *q = &p[i];

		if (q->expires <= now)
			continue;
		if (!q->committed)
		{
			XidState	s = xid_state(q->xmin);

			if (s == XID_ABORTED)
				continue;
			if (s == XID_COMMITTED)
				q->committed = true;
		}
		if (TransactionIdIsValid(q->xmax))
		{
			XidState	s = xid_state(q->xmax);

			if (s == XID_COMMITTED)
				continue;
			if (s == XID_ABORTED)
				q->xmax = InvalidTransactionId;
		}
		if (kept != i)
			p[kept] = *q;
		kept++;
	}
	e->npass = kept;
}

/*
 * Append a pass to a locked entry, growing its array if need be.  Returns
 * false, changing nothing, when gatekeeper.gate_memory has no room; the
 * caller releases the lock and raises gate_memory_full().
 */
static bool
entry_add(GateEntry *e, TimestampTz expires, int64 holder, bool holder_null,
		  TransactionId xmin, bool committed)
{
	GatePass   *p;

	if (e->npass >= e->cap)
	{
		int			cap = Max(e->cap * 2, 4);
		Size		bytes = cap * sizeof(GatePass);
		dsa_pointer more;
		GatePass   *q;

		if (pg_atomic_add_fetch_u64(&gate_shared->charged, bytes) > gate_shared->limit)
		{
			gate_uncharge(bytes);
			return false;
		}
		more = dsa_allocate_extended(gate_dsa, bytes, DSA_ALLOC_NO_OOM);
		if (!DsaPointerIsValid(more))
		{
			gate_uncharge(bytes);
			return false;
		}
		q = dsa_get_address(gate_dsa, more);
		memcpy(q, entry_passes(e), e->npass * sizeof(GatePass));
		if (e->cap > GATE_INLINE_PASSES)
		{
			dsa_free(gate_dsa, e->more);
			gate_uncharge(e->cap * sizeof(GatePass));
		}
		e->more = more;
		e->cap = cap;
	}
	p = &entry_passes(e)[e->npass++];
	p->expires = expires;
	p->holder = holder_null ? 0 : holder;
	p->holder_null = holder_null;
	p->xmin = xmin;
	p->xmax = InvalidTransactionId;
	p->committed = committed;
	return true;
}

/*
 * Free an entry's own allocations before it is deleted.
 */
static void
entry_free(GateEntry *e)
{
	if (e->cap > GATE_INLINE_PASSES)
	{
		dsa_free(gate_dsa, e->more);
		gate_uncharge(e->cap * sizeof(GatePass));
	}
	gate_uncharge(GATE_ENTRY_CHARGE);
}

/*
 * Another transaction in progress that has stamped this entry, or an
 * invalid id if there is none.
 */
static TransactionId
foreign_xid(GateEntry *e)
{
	GatePass   *p = entry_passes(e);
	int			i;

	if (xid_running(e->locker))
		return e->locker;
	for (i = 0; i < e->npass; i++)
	{
		if (!p[i].committed && xid_running(p[i].xmin))
			return p[i].xmin;
		if (xid_running(p[i].xmax))
			return p[i].xmax;
	}
	return InvalidTransactionId;
}

/*
 * The heavyweight lock that queues the waiters for one entry, as
 * heap_lock_tuple's tuple lock queues the waiters for a row: without it,
 * every waiter wakes when the holder ends and the first to run wins, so a
 * later arrival could overtake an earlier one indefinitely.  An advisory
 * lock tag in a class of its own (field 4; SQL's advisory locks use 1 and
 * 2), so it shows in pg_locks; 64 bits of the key choose it, and sharing
 * one between two entries would only make their waiters queue together.
 */
#define GATE_LOCKTAG_CLASS	0x474b

static void
entry_locktag(LOCKTAG *tag, const GateKey *key)
{
	uint64		h = key->hash[0] ^ key->hash[1] ^
		((uint64) (uint32) key->gate << 32) ^ (uint64) key->space;

	SET_LOCKTAG_ADVISORY(*tag, key->dbid, (uint32) (h >> 32), (uint32) h,
						 GATE_LOCKTAG_CLASS);
}

/*
 * Find and lock the entry of a key, waiting for any other transaction in
 * progress that has it locked.  With create, a missing entry is made
 * (its charge must have been reserved); without, NULL when there is none.
 * Returns with the partition lock held; the entry is pruned and stamped
 * with this transaction.
 *
 * A caller that finds the entry taken first queues on the entry's
 * heavyweight lock, then waits for the holder's transaction, and keeps
 * its place in the queue until it has stamped the entry, so waiters are
 * served in the order they came.
 */
static GateEntry *
entry_lock(const GateKey *key, bool create, TransactionId xid, TimestampTz now,
		   bool *created)
{
	LOCKTAG		tag;
	bool		queued = false;
	GateEntry  *e;

	for (;;)
	{
		TransactionId wait;
		bool		found = true;

		if (create)
			e = dshash_find_or_insert(gate_hash, key, &found);
		else
			e = dshash_find(gate_hash, key, true);
		if (e == NULL)
			break;
		if (!found)
		{
			entry_init(e);
			e->locker = xid;
			*created = true;
			break;
		}
		wait = foreign_xid(e);
		if (TransactionIdIsValid(wait))
		{
			dshash_release_lock(gate_hash, e);
			if (!queued)
			{
				entry_locktag(&tag, key);
				(void) LockAcquire(&tag, ExclusiveLock, false, false);
				queued = true;
			}
			else
				XactLockTableWait(wait, NULL, NULL, XLTW_None);
			continue;
		}
		entry_prune(e, now);
		e->locker = xid;
		*created = false;
		break;
	}
	if (queued)
		LockRelease(&tag, ExclusiveLock, false);
	return e;
}

/*
 * Is this pass live as this backend sees it without locking: made by a
 * committed transaction or by this one, not given back by either?
 */
static bool
pass_visible(GatePass *p, TimestampTz now)
{
	if (p->expires <= now)
		return false;
	if (!p->committed)
	{
		XidState	s = xid_state(p->xmin);

		if (s != XID_MINE && s != XID_COMMITTED)
			return false;

		/*
		 * A hint, set under a shared lock as heap hint bits are: it only
		 * ever goes from false to true, and every reader agrees on it.
		 */
		if (s == XID_COMMITTED)
			p->committed = true;
	}
	if (TransactionIdIsValid(p->xmax))
	{
		XidState	s = xid_state(p->xmax);

		if (s == XID_MINE || s == XID_COMMITTED)
			return false;
	}
	return true;
}

/* ---------------------------------------------------------------- spaces */

/*
 * The space of this database's extension: the OID of its log table.
 */
static Oid
current_space(void)
{
	Oid			nsp = get_namespace_oid("gatekeeper", false);
	Oid			relid = get_relname_relid("gate_log", nsp);

	if (!OidIsValid(relid))
		elog(ERROR, "gatekeeper.gate_log does not exist");
	return relid;
}

/*
 * Replay the log into the shared table, as passes made by this
 * transaction.  Must run inside SPI.
 */
static void
rebuild(Oid space, TransactionId xid, TimestampTz now)
{
	static SPIPlanPtr plan = NULL;
	Portal		portal;

	if (plan == NULL)
		plan = gatekeeper_keep_plan("SELECT gate, released, expires, recipients, holders "
									"  FROM gatekeeper.gate_log "
									" WHERE expires > now() ORDER BY id",
									0, NULL);

	/* every row committed so far, whatever this transaction's snapshot */
	PushActiveSnapshot(GetLatestSnapshot());
	portal = SPI_cursor_open(NULL, plan, NULL, NULL, true);
	for (;;)
	{
		uint64		r;

		SPI_cursor_fetch(portal, true, 1000);
		if (SPI_processed == 0)
			break;
		for (r = 0; r < SPI_processed; r++)
		{
			HeapTuple	tup = SPI_tuptable->vals[r];
			TupleDesc	desc = SPI_tuptable->tupdesc;
			bool		isnull;
			int32		gate = DatumGetInt32(SPI_getbinval(tup, desc, 1, &isnull));
			bool		released = DatumGetBool(SPI_getbinval(tup, desc, 2, &isnull));
			TimestampTz expires = DatumGetTimestampTz(SPI_getbinval(tup, desc, 3, &isnull));
			Datum		hd = SPI_getbinval(tup, desc, 5, &isnull);
			bool		no_holders = isnull;
			Datum	   *rv;
			Datum	   *hv = NULL;
			bool	   *hn = NULL;
			int			nr;
			int			nh;
			int			i;

			deconstruct_array(DatumGetArrayTypeP(SPI_getbinval(tup, desc, 4, &isnull)),
							  TEXTOID, -1, false, TYPALIGN_INT, &rv, NULL, &nr);
			if (!no_holders)
				deconstruct_array(DatumGetArrayTypeP(hd), INT8OID, 8, true, TYPALIGN_DOUBLE,
								  &hv, &hn, &nh);
			for (i = 0; i < nr; i++)
			{
				GateKey		key;
				GateEntry  *e;
				bool		found;
				int64		holder = no_holders || hn[i] ? 0 : DatumGetInt64(hv[i]);
				bool		holder_null = no_holders || hn[i];

				CHECK_FOR_INTERRUPTS();
				make_key(&key, space, gate, TextDatumGetCString(rv[i]));
				if (released)
				{
					GatePass   *p;
					int			j;
					int			kept = 0;

					e = dshash_find(gate_hash, &key, true);
					if (e == NULL || holder_null)
					{
						if (e != NULL)
							dshash_release_lock(gate_hash, e);
						continue;
					}
					p = entry_passes(e);
					for (j = 0; j < e->npass; j++)
					{
						if (!p[j].holder_null && p[j].holder == holder &&
							p[j].xmin == xid)
							continue;
						p[kept++] = p[j];
					}
					e->npass = kept;
					dshash_release_lock(gate_hash, e);
					continue;
				}
				gate_charge(GATE_ENTRY_CHARGE, true);
				e = dshash_find_or_insert(gate_hash, &key, &found);
				if (found)
				{
					gate_uncharge(GATE_ENTRY_CHARGE);
					entry_prune(e, now);
				}
				else
					entry_init(e);
				e->locker = xid;

				/*
				 * A holder holds one pass of a gate: a log written before
				 * re-passes stopped being logged may name it again.
				 */
				if (!holder_null)
				{
					GatePass   *p = entry_passes(e);
					int			j;

					for (j = 0; j < e->npass; j++)
						if (!p[j].holder_null && p[j].holder == holder)
							break;
					if (j < e->npass)
					{
						dshash_release_lock(gate_hash, e);
						continue;
					}
				}
				if (!entry_add(e, expires, holder, holder_null, xid, false))
				{
					dshash_release_lock(gate_hash, e);
					gate_memory_full();
				}
				dshash_release_lock(gate_hash, e);
			}
		}
		SPI_freetuptable(SPI_tuptable);
	}
	SPI_cursor_close(portal);
	PopActiveSnapshot();
}

/*
 * The space of this database's extension, its state rebuilt from the log
 * if this is its first use since the server started.  The marker entry,
 * locked by the rebuilding transaction, makes other first users wait for
 * it; if it aborts, the next user rebuilds.  Must run inside SPI.
 */
static Oid
ensure_space(TimestampTz now)
{
	Oid			space;
	GateKey		key;
	GateEntry  *e;

	gate_attach();
	space = current_space();
	if (space == loaded_space)
		return space;

	memset(&key, 0, sizeof(key));
	key.dbid = MyDatabaseId;
	key.space = space;
	for (;;)
	{
		bool		found;
		TransactionId xid;

		e = dshash_find(gate_hash, &key, false);
		if (e != NULL && e->npass == 1)
		{
			/* rebuilt, and the rebuild committed */
			dshash_release_lock(gate_hash, e);
			loaded_space = space;
			return space;
		}
		if (e != NULL)
			dshash_release_lock(gate_hash, e);

		e = dshash_find_or_insert(gate_hash, &key, &found);
		if (!found)
			entry_init(e);
		else if (e->npass == 1)
		{
			dshash_release_lock(gate_hash, e);
			continue;
		}
		else if (TransactionIdIsValid(e->locker))
		{
			XidState	s = xid_state(e->locker);

			if (s == XID_MINE)
			{
				/* this transaction rebuilt it */
				dshash_release_lock(gate_hash, e);
				return space;
			}
			if (s == XID_RUNNING)
			{
				TransactionId wait = e->locker;

				dshash_release_lock(gate_hash, e);
				XactLockTableWait(wait, NULL, NULL, XLTW_None);
				continue;
			}
			if (s == XID_COMMITTED)
			{
				e->npass = 1;
				dshash_release_lock(gate_hash, e);
				loaded_space = space;
				return space;
			}
			/* the rebuild aborted: do it again */
		}
		xid = my_xid();
		e->locker = xid;
		dshash_release_lock(gate_hash, e);
		rebuild(space, xid, now);
		return space;
	}
}

/* ---------------------------------------------------------------- rows */

/*
 * gatekeeper_recipient_key
 *		The key a recipient's passes are kept under: the address with ASCII
 *		letters lower-cased, so Alice@Example.com and alice@example.com
 *		share one window.
 */
char *
gatekeeper_recipient_key(const char *recipient)
{
	char	   *key = pstrdup(recipient);
	char	   *p;

	for (p = key; *p; p++)
		*p = pg_ascii_tolower((unsigned char) *p);
	return key;
}

/*
 * gatekeeper_gate_row_cmp
 *		qsort/bsearch order of gate rows: byte order of recipient, then gate.
 *		This is the one order in which every transaction locks gate entries.
 */
int
gatekeeper_gate_row_cmp(const void *a, const void *b)
{
	const GateRow *x = (const GateRow *) a;
	const GateRow *y = (const GateRow *) b;
	int			c = strcmp(x->recipient, y->recipient);

	if (c != 0)
		return c;
	return (x->gate > y->gate) - (x->gate < y->gate);
}

/*
 * Make room for more passes in a row.
 */
static void
row_reserve(GateRow *row, int n)
{
	if (n <= row->cap)
		return;
	n = Max(n, row->cap * 2);
	row->cap = Max(n, 4);
	if (row->expires == NULL)
	{
		row->expires = palloc(row->cap * sizeof(TimestampTz));
		row->holders = palloc(row->cap * sizeof(int64));
		row->holder_null = palloc(row->cap * sizeof(bool));
		row->slots = palloc(row->cap * sizeof(int));
	}
	else
	{
		row->expires = repalloc(row->expires, row->cap * sizeof(TimestampTz));
		row->holders = repalloc(row->holders, row->cap * sizeof(int64));
		row->holder_null = repalloc(row->holder_null, row->cap * sizeof(bool));
		row->slots = repalloc(row->slots, row->cap * sizeof(int));
	}
}

/*
 * Copy a locked entry's live passes into its row: all it holds but the
 * passes this transaction gave back.  slots remember where each is.
 */
static void
row_load(GateRow *row, GateEntry *e)
{
	GatePass   *p = entry_passes(e);
	int			i;

	row->n = 0;
	row_reserve(row, e->npass);
	for (i = 0; i < e->npass; i++)
	{
		if (TransactionIdIsValid(p[i].xmax))
			continue;			/* given back by this transaction */
		row->expires[row->n] = p[i].expires;
		row->holders[row->n] = p[i].holder;
		row->holder_null[row->n] = p[i].holder_null;
		row->slots[row->n] = i;
		row->n++;
	}
}

/*
 * gatekeeper_gate_lock
 *		Lock the gate entries of rows[0..n-1], in their order, which must be
 *		gatekeeper_gate_row_cmp's, without duplicates; wait for transactions
 *		in progress that hold them.  With create, missing entries are made
 *		(empty); without, rows with no entry are marked missing.  On return
 *		each row holds its live passes.  The entries stay locked by this
 *		transaction until it ends.  Must run inside SPI.
 */
void
gatekeeper_gate_lock(GateRow *rows, int n, TimestampTz now, bool create)
{
	Oid			space;
	TransactionId xid;
	int			created = 0;
	int			i;

	if (n == 0)
		return;
	space = ensure_space(now);
	xid = my_xid();
	if (create)
		gate_charge((Size) n * GATE_ENTRY_CHARGE, true);

	for (i = 0; i < n; i++)
	{
		GateRow    *row = &rows[i];
		GateKey		key;
		GateEntry  *e;
		bool		made = false;

		CHECK_FOR_INTERRUPTS();
		row_key(row, space, &key);
		row->changed = false;
		row->missing = false;
		e = entry_lock(&key, create, xid, now, &made);
		if (e == NULL)
		{
			row->missing = true;
			row->n = 0;
			continue;
		}
		if (made)
			created++;
		row_load(row, e);
		dshash_release_lock(gate_hash, e);
	}
	if (create && created < n)
		gate_uncharge((Size) (n - created) * GATE_ENTRY_CHARGE);
}

/*
 * gatekeeper_gate_try
 *		Pass one caller through a locked gate row if the gate allows it.
 *
 * A holder that already has a live pass re-passes without counting twice.
 * Returns whether the caller passed; a new pass is added to the row.
 */
bool
gatekeeper_gate_try(GateRow *row, int max_sends,
					TimestampTz expiry, int64 holder, bool holder_null)
{
	int			i;

	if (!holder_null)
	{
		for (i = 0; i < row->n; i++)
			if (!row->holder_null[i] && row->holders[i] == holder)
				return true;
	}
	if (row->n >= max_sends)
		return false;
	row_reserve(row, row->n + 1);
	row->expires[row->n] = expiry;
	row->holders[row->n] = holder;
	row->holder_null[row->n] = holder_null;
	row->slots[row->n] = -1;
	row->n++;
	row->changed = true;
	return true;
}

/*
 * Compare timestamps for qsort.
 */
static int
expiry_cmp(const void *a, const void *b)
{
	TimestampTz x = *(const TimestampTz *) a;
	TimestampTz y = *(const TimestampTz *) b;

	return (x > y) - (x < y);
}

/*
 * gatekeeper_gate_reopens
 *		When the gate next lets a pass through for this row, or 0 if it is
 *		open now.  With n live passes and room for max_sends, it opens when
 *		the (n - max_sends + 1)-th earliest pass expires.
 */
TimestampTz
gatekeeper_gate_reopens(const GateRow *row, int max_sends)
{
	TimestampTz *sorted;
	TimestampTz result;

	if (row->n < max_sends)
		return 0;
	sorted = palloc(row->n * sizeof(TimestampTz));
	memcpy(sorted, row->expires, row->n * sizeof(TimestampTz));
	qsort(sorted, row->n, sizeof(TimestampTz), expiry_cmp);
	result = sorted[row->n - max_sends];
	pfree(sorted);
	return result;
}

/*
 * gatekeeper_gate_release_holder
 *		Drop the live passes a holder has in a locked row.  Returns how many.
 */
int
gatekeeper_gate_release_holder(GateRow *row, int64 holder)
{
	int			i;
	int			kept = 0;

	for (i = 0; i < row->n; i++)
	{
		if (!row->holder_null[i] && row->holders[i] == holder)
			continue;
		row->expires[kept] = row->expires[i];
		row->holders[kept] = row->holders[i];
		row->holder_null[kept] = row->holder_null[i];
		row->slots[kept] = row->slots[i];
		kept++;
	}
	i = row->n - kept;
	row->n = kept;
	if (i > 0)
		row->changed = true;
	return i;
}

/*
 * Add one recipient to the log group of (gate, kind, expiry), making the
 * group if need be.
 */
static void
log_add(List **groups, int32 gate, bool released, TimestampTz expires,
		const char *recipient, int64 holder, bool holder_null)
{
	LogGroup   *g = NULL;
	ListCell   *lc;

	foreach(lc, *groups)
	{
		LogGroup   *x = (LogGroup *) lfirst(lc);

		if (x->gate == gate && x->released == released &&
			(released || x->expires == expires))
		{
			g = x;
			break;
		}
	}
	if (g == NULL)
	{
		g = palloc0(sizeof(LogGroup));
		g->gate = gate;
		g->released = released;
		g->expires = expires;
		g->cap = 16;
		g->recipients = palloc(g->cap * sizeof(Datum));
		g->holders = palloc(g->cap * sizeof(Datum));
		g->holder_nulls = palloc(g->cap * sizeof(bool));
		*groups = lappend(*groups, g);
	}
	if (g->n >= g->cap)
	{
		g->cap *= 2;
		g->recipients = repalloc(g->recipients, g->cap * sizeof(Datum));
		g->holders = repalloc(g->holders, g->cap * sizeof(Datum));
		g->holder_nulls = repalloc(g->holder_nulls, g->cap * sizeof(bool));
	}
	if (released)
		g->expires = Max(g->expires, expires);
	g->recipients[g->n] = CStringGetTextDatum(recipient);
	g->holders[g->n] = Int64GetDatum(holder);
	g->holder_nulls[g->n] = holder_null;
	if (!holder_null)
		g->any_holder = true;
	g->n++;
}

/*
 * Write the log rows of a call.  Must run inside SPI.
 */
static void
log_write(List *groups)
{
	ListCell   *lc;

	if (log_plan == NULL)
	{
		Oid			types[5] = {INT4OID, BOOLOID, TIMESTAMPTZOID, TEXTARRAYOID, INT8ARRAYOID};

		log_plan = gatekeeper_keep_plan("INSERT INTO gatekeeper.gate_log (gate, released, expires, recipients, holders) "
										"VALUES ($1, $2, $3, $4, $5)",
										5, types);
	}
	foreach(lc, groups)
	{
		LogGroup   *g = (LogGroup *) lfirst(lc);
		Datum		args[5];
		char		nulls[5] = {' ', ' ', ' ', ' ', ' '};

		args[0] = Int32GetDatum(g->gate);
		args[1] = BoolGetDatum(g->released);
		args[2] = TimestampTzGetDatum(g->expires);
		args[3] = gatekeeper_array(g->recipients, NULL, g->n, TEXTOID);
		if (g->any_holder)
			args[4] = gatekeeper_array(g->holders, g->holder_nulls, g->n, INT8OID);
		else
		{
			args[4] = (Datum) 0;
			nulls[4] = 'n';
		}
		if (SPI_execute_plan(log_plan, args, nulls, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "could not write the gate log");
	}
}

/*
 * gatekeeper_gate_write
 *		Write back the rows whose passes changed: passes a row gained are
 *		made, passes it lost are given back, both stamped with this
 *		transaction, and the changes are logged.  Must run inside SPI, in
 *		the transaction that locked the rows.
 */
void
gatekeeper_gate_write(GateRow *rows, int n, TimestampTz now)
{
	Oid			space = InvalidOid;
	TransactionId xid = InvalidTransactionId;
	List	   *groups = NIL;
	bool	   *kept = NULL;
	int			nkept = 0;
	int			i;

	for (i = 0; i < n; i++)
	{
		GateRow    *row = &rows[i];
		GateKey		key;
		GateEntry  *e;
		GatePass   *p;
		int			j;

		if (!row->changed || row->missing)
			continue;
		if (!OidIsValid(space))
		{
			space = ensure_space(now);
			xid = my_xid();
		}
		row_key(row, space, &key);
		e = dshash_find(gate_hash, &key, true);
		if (e == NULL || e->locker != xid)
			elog(ERROR, "gate entry for \"%s\" is not locked", row->recipient);
		p = entry_passes(e);

		/* the passes the row no longer holds are given back */
		if (nkept < e->npass)
		{
			nkept = Max(e->npass, 16);
			kept = kept ? repalloc(kept, nkept * sizeof(bool)) : palloc(nkept * sizeof(bool));
		}
		memset(kept, 0, e->npass * sizeof(bool));
		for (j = 0; j < row->n; j++)
			if (row->slots[j] >= 0)
				kept[row->slots[j]] = true;
		for (j = 0; j < e->npass; j++)
		{
			if (kept[j] || TransactionIdIsValid(p[j].xmax))
				continue;
			p[j].xmax = xid;
			log_add(&groups, row->gate, true, p[j].expires, row->recipient,
					p[j].holder, p[j].holder_null);
		}

		/* and the new ones made */
		for (j = 0; j < row->n; j++)
		{
			if (row->slots[j] >= 0)
				continue;
			if (!entry_add(e, row->expires[j], row->holders[j], row->holder_null[j], xid, false))
			{
				dshash_release_lock(gate_hash, e);
				gate_memory_full();
			}
			row->slots[j] = e->npass - 1;
			log_add(&groups, row->gate, false, row->expires[j], row->recipient,
					row->holders[j], row->holder_null[j]);
		}
		dshash_release_lock(gate_hash, e);
		row->changed = false;
	}
	if (groups != NIL)
		log_write(groups);
}

/*
 * Read one gate row without locking it, for the read-only peeks: the
 * passes made by committed transactions or this one, not given back.
 */
static void
row_peek(GateRow *row, TimestampTz now)
{
	Oid			space = ensure_space(now);
	GateKey		key;
	GateEntry  *e;
	GatePass   *p;
	int			i;

	row->n = 0;
	row_key(row, space, &key);
	e = dshash_find(gate_hash, &key, false);
	if (e == NULL)
		return;
	p = entry_passes(e);
	row_reserve(row, e->npass);
	for (i = 0; i < e->npass; i++)
	{
		if (!pass_visible(&p[i], now))
			continue;
		row->expires[row->n] = p[i].expires;
		row->holders[row->n] = p[i].holder;
		row->holder_null[row->n] = p[i].holder_null;
		row->slots[row->n] = i;
		row->n++;
	}
	dshash_release_lock(gate_hash, e);
}

/*
 * gatekeeper_gate_sweep_memory
 *		Drop expired passes and empty entries from the shared table, and
 *		settle every stamp of a finished transaction; with a valid space,
 *		also drop the entries of this database's earlier extensions (other
 *		spaces).  Entries locked by a transaction in progress are left
 *		alone.  Returns how many entries were dropped.
 */
int64
gatekeeper_gate_sweep_memory(Oid space)
{
	dshash_seq_status status;
	GateEntry  *e;
	TimestampTz now = GetCurrentTimestamp();
	int64		dropped = 0;

	gate_attach();
	dshash_seq_init(&status, gate_hash, true);
	while ((e = dshash_seq_next(&status)) != NULL)
	{
		bool		marker = (e->key.gate == 0);

		if (OidIsValid(space) && e->key.dbid == MyDatabaseId && e->key.space != space)
		{
			/* an extension since dropped from this database */
			if (xid_running(e->locker) || (!marker && TransactionIdIsValid(foreign_xid(e))))
				continue;
			if (!marker)
				entry_free(e);
			dshash_delete_current(&status);
			dropped++;
			continue;
		}
		if (marker)
			continue;
		if (TransactionIdIsValid(e->locker) && xid_state(e->locker) == XID_MINE)
			continue;
		if (TransactionIdIsValid(foreign_xid(e)))
			continue;
		e->locker = InvalidTransactionId;
		entry_prune(e, now);
		if (e->npass == 0)
		{
			entry_free(e);
			dshash_delete_current(&status);
			dropped++;
		}
	}
	dshash_seq_term(&status);
	return dropped;
}

/*
 * Look up a gate by name; error 42704 if there is none.
 */
static GateDef
lookup_gate(text *name)
{
	static SPIPlanPtr plan = NULL;
	Datum		arg = PointerGetDatum(name);
	GateDef		def;
	bool		isnull;

	if (plan == NULL)
	{
		Oid			type = TEXTOID;

		plan = gatekeeper_keep_plan("SELECT id, max_sends, now() + period FROM gatekeeper.gate WHERE name = $1",
						 1, &type);
	}
	if (SPI_execute_plan(plan, &arg, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "gate lookup failed");
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("gate \"%s\" does not exist", text_to_cstring(name)),
				 errhint("Create it with gatekeeper.create_gate().")));
	def.id = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	def.max_sends = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	def.expiry = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3, &isnull));
	SPI_freetuptable(SPI_tuptable);
	return def;
}

/*
 * Raise 22004 for a NULL argument.
 */
static void
require_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name)));
}

/*
 * The key of a recipient argument; error 22023 if it is empty.
 */
static char *
recipient_arg(text *recipient)
{
	char	   *s = text_to_cstring(recipient);
	char	   *p;

	if (*s == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("recipient must not be empty")));
	/* as gatekeeper_recipient_key, in place */
	for (p = s; *p; p++)
		*p = pg_ascii_tolower((unsigned char) *p);
	return s;
}

/*
 * The gate and recipient named by a call's first two arguments: the gate's
 * definition in *def, and in *row the entry to lock or look at.  Inside SPI.
 */
static void
gate_recipient_args(FunctionCallInfo fcinfo, GateDef *def, GateRow *row)
{
	*def = lookup_gate(PG_GETARG_TEXT_PP(0));
	memset(row, 0, sizeof(*row));
	row->recipient = recipient_arg(PG_GETARG_TEXT_PP(1));
	row->gate = def->id;
}

/*
 * Pass rows[0..n-1] (sorted by gatekeeper_gate_row_cmp, unique) through
 * one gate, each entry locked, decided and written under one acquisition
 * of its partition lock: up to want[i] new passes for rows[i], as many as
 * the gate has room for.  A holder (for a single caller) that already has
 * a live pass passes again without a new one.  Sets granted[i] and logs
 * the passes made.  This is gate_pass's path; the claim, which decides
 * over many gates at once, locks first and writes after.  Must run inside
 * SPI.
 */
static void
pass_rows(GateRow *rows, int n, const GateDef *def, const int *want,
		  int64 holder, bool holder_null, int *granted, TimestampTz now)
{
	Oid			space;
	TransactionId xid;
	List	   *groups = NIL;
	int			created = 0;
	int			i;

	if (n == 0)
		return;
	space = ensure_space(now);
	xid = my_xid();
	gate_charge((Size) n * GATE_ENTRY_CHARGE, true);

	for (i = 0; i < n; i++)
	{
		GateRow    *row = &rows[i];
		GateKey		key;
		GateEntry  *e;
		GatePass   *p;
		bool		made = false;
		int			live = 0;
		int			added = 0;
		int			j;

		CHECK_FOR_INTERRUPTS();
		granted[i] = 0;
		row_key(row, space, &key);
		e = entry_lock(&key, true, xid, now, &made);
		if (made)
			created++;
		p = entry_passes(e);
		for (j = 0; j < e->npass; j++)
		{
			if (TransactionIdIsValid(p[j].xmax))
				continue;		/* given back by this transaction */
			if (!holder_null && !p[j].holder_null && p[j].holder == holder)
				granted[i] = want[i];
			live++;
		}
		while (granted[i] < want[i] && live < def->max_sends)
		{
			if (!entry_add(e, def->expiry, holder, holder_null, xid, false))
			{
				dshash_release_lock(gate_hash, e);
				gate_uncharge((Size) (n - created) * GATE_ENTRY_CHARGE);
				gate_memory_full();
			}
			granted[i]++;
			live++;
			added++;
		}
		dshash_release_lock(gate_hash, e);
		/* log the passes made, not one its holder held already */
		for (j = 0; j < added; j++)
			log_add(&groups, def->id, false, def->expiry, row->recipient, holder, holder_null);
	}
	if (created < n)
		gate_uncharge((Size) (n - created) * GATE_ENTRY_CHARGE);
	if (groups != NIL)
		log_write(groups);
}

/*
 * gate_pass(gate text, recipient text, holder bigint DEFAULT NULL) RETURNS boolean
 */
Datum
gatekeeper_gate_pass(PG_FUNCTION_ARGS)
{
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	GateDef		def;
	GateRow		row;
	int			want = 1;
	int			granted;

	require_arg(fcinfo, 0, "gate");
	require_arg(fcinfo, 1, "recipient");

	SPI_connect();
	gate_recipient_args(fcinfo, &def, &row);

	pass_rows(&row, 1, &def, &want, PG_ARGISNULL(2) ? 0 : PG_GETARG_INT64(2),
			  PG_ARGISNULL(2), &granted, now);
	SPI_finish();

	PG_RETURN_BOOL(granted > 0);
}

/*
 * qsort_arg order of indexes into an array of gate rows.
 */
static int
row_index_cmp(const void *a, const void *b, void *arg)
{
	const GateRow *rows = (const GateRow *) arg;

	return gatekeeper_gate_row_cmp(&rows[*(const int *) a], &rows[*(const int *) b]);
}

/*
 * gate_pass(gate text, recipients text[]) RETURNS SETOF text
 *		Pass each recipient in turn; return those that passed, in order.
 *		A recipient named twice is gated twice, like any two callers.
 */
Datum
gatekeeper_gate_pass_batch(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	ArrayType  *arr;
	Datum	   *elems;
	bool	   *nulls;
	int			nelems;
	GateRow    *rows;
	GateRow    *unique;
	int		   *order;
	int		   *rowof;
	int		   *want;
	int		   *granted;
	int			nrows = 0;
	GateDef		def;
	int			i;

	require_arg(fcinfo, 0, "gate");
	require_arg(fcinfo, 1, "recipients");
	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);

	arr = PG_GETARG_ARRAYTYPE_P(1);
	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("recipients must be a one-dimensional array")));
	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &nelems);

	SPI_connect();
	def = lookup_gate(PG_GETARG_TEXT_PP(0));

	rows = palloc0(Max(nelems, 1) * sizeof(GateRow));
	unique = palloc(Max(nelems, 1) * sizeof(GateRow));
	order = palloc(Max(nelems, 1) * sizeof(int));
	rowof = palloc(Max(nelems, 1) * sizeof(int));
	want = palloc(Max(nelems, 1) * sizeof(int));
	granted = palloc(Max(nelems, 1) * sizeof(int));
	for (i = 0; i < nelems; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("recipients must not contain nulls")));
		rows[i].recipient = recipient_arg(DatumGetTextPP(elems[i]));
		rows[i].gate = def.id;
	}

	/* sort (indexes, not rows), then count duplicates: each key is locked once */
	for (i = 0; i < nelems; i++)
		order[i] = i;
	qsort_arg(order, nelems, sizeof(int), row_index_cmp, rows);
	for (i = 0; i < nelems; i++)
	{
		GateRow    *row = &rows[order[i]];

		if (nrows > 0 && gatekeeper_gate_row_cmp(&unique[nrows - 1], row) == 0)
			want[nrows - 1]++;
		else
		{
			unique[nrows] = *row;
			want[nrows++] = 1;
		}
		rowof[order[i]] = nrows - 1;
	}

	pass_rows(unique, nrows, &def, want, 0, true, granted, now);

	/* the first granted[k] callers for each key passed */
	for (i = 0; i < nelems; i++)
	{
		int			k = rowof[i];

		if (granted[k] > 0)
		{
			Datum		value = elems[i];
			bool		isnull = false;

			granted[k]--;
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, &value, &isnull);
		}
	}
	SPI_finish();

	return (Datum) 0;
}

/*
 * Read-only look at one gate for one recipient: its live passes, and when
 * it reopens (0 if open now).
 */
static void
peek(FunctionCallInfo fcinfo, int *live, TimestampTz *reopens)
{
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	GateDef		def;
	GateRow		row;

	require_arg(fcinfo, 0, "gate");
	require_arg(fcinfo, 1, "recipient");
	SPI_connect();
	gate_recipient_args(fcinfo, &def, &row);
	row_peek(&row, now);
	*live = row.n;
	*reopens = gatekeeper_gate_reopens(&row, def.max_sends);
	SPI_finish();
}

/*
 * gate_open(gate text, recipient text) RETURNS boolean
 */
Datum
gatekeeper_gate_open(PG_FUNCTION_ARGS)
{
	int			live;
	TimestampTz reopens;

	peek(fcinfo, &live, &reopens);
	PG_RETURN_BOOL(reopens == 0);
}

/*
 * gate_next_open(gate text, recipient text) RETURNS timestamptz, NULL when open
 */
Datum
gatekeeper_gate_next_open(PG_FUNCTION_ARGS)
{
	int			live;
	TimestampTz reopens;

	peek(fcinfo, &live, &reopens);
	if (reopens == 0)
		PG_RETURN_NULL();
	PG_RETURN_TIMESTAMPTZ(reopens);
}

/*
 * gate_release(gate text, recipient text, holder bigint) RETURNS boolean
 *		Give back the pass a holder has; true if it had a live one.
 */
Datum
gatekeeper_gate_release(PG_FUNCTION_ARGS)
{
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	GateDef		def;
	GateRow		row;
	int			released;

	require_arg(fcinfo, 0, "gate");
	require_arg(fcinfo, 1, "recipient");
	require_arg(fcinfo, 2, "holder");

	SPI_connect();
	gate_recipient_args(fcinfo, &def, &row);
	gatekeeper_gate_lock(&row, 1, now, false);
	released = gatekeeper_gate_release_holder(&row, PG_GETARG_INT64(2));
	gatekeeper_gate_write(&row, 1, now);
	SPI_finish();

	PG_RETURN_BOOL(released > 0);
}

/*
 * A pass to give back: one mail's passes for one recipient.
 */
typedef struct Release
{
	char	   *key;
	int64		holder;
} Release;

/*
 * qsort order of releases: by key, then holder.
 */
static int
release_cmp(const void *a, const void *b)
{
	const Release *x = (const Release *) a;
	const Release *y = (const Release *) b;
	int			c = strcmp(x->key, y->key);

	if (c != 0)
		return c;
	return (x->holder > y->holder) - (x->holder < y->holder);
}

/*
 * The ids of every gate, ascending.  Must run inside SPI.
 */
static int32 *
all_gates(int *ngates)
{
	static SPIPlanPtr plan = NULL;
	int32	   *ids;
	uint64		r;

	if (plan == NULL)
		plan = gatekeeper_keep_plan("SELECT id FROM gatekeeper.gate ORDER BY id", 0, NULL);
	if (SPI_execute_plan(plan, NULL, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read gates");
	ids = palloc(Max(SPI_processed, 1) * sizeof(int32));
	for (r = 0; r < SPI_processed; r++)
	{
		bool		isnull;

		ids[r] = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1, &isnull));
	}
	*ngates = (int) SPI_processed;
	SPI_freetuptable(SPI_tuptable);
	return ids;
}

/*
 * Does the entry of row hold a pass, live or being made or given back, of
 * one of the holders rel[0..n-1] that share row's recipient?  A look
 * without locking, to find what to lock.
 */
static bool
holds_any(GateRow *row, Release *rel, int n, TimestampTz now)
{
	Oid			space = ensure_space(now);
	GateKey		key;
	GateEntry  *e;
	GatePass   *p;
	bool		hit = false;
	int			i;
	int			k;

	row_key(row, space, &key);
	e = dshash_find(gate_hash, &key, false);
	if (e == NULL)
		return false;
	p = entry_passes(e);
	for (i = 0; i < e->npass && !hit; i++)
	{
		if (p[i].holder_null || p[i].expires <= now)
			continue;
		for (k = 0; k < n && strcmp(rel[k].key, row->recipient) == 0; k++)
			if (rel[k].holder == p[i].holder)
			{
				hit = true;
				break;
			}
	}
	dshash_release_lock(gate_hash, e);
	return hit;
}

/*
 * gatekeeper_release_passes
 *		Give back every pass the given mails hold, in every gate.  All the
 *		gate entries involved are locked in the global order of
 *		(recipient, gate), so releasing for many recipients at once (a
 *		reap, a batch of failures) cannot deadlock against claims.  Only
 *		entries that hold one of the mails' passes are locked.  Returns how
 *		many live passes were released.  Must run inside SPI.
 */
int
gatekeeper_release_passes(char **recipients, int64 *holders, int n)
{
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	Release    *rel;
	GateRow    *rows;
	int32	   *gates;
	int			ngates;
	int			nrows = 0;
	int			released = 0;
	int			i;
	int			j;

	if (n == 0)
		return 0;
	rel = palloc(n * sizeof(Release));
	for (i = 0; i < n; i++)
	{
		rel[i].key = gatekeeper_recipient_key(recipients[i]);
		rel[i].holder = holders[i];
	}
	qsort(rel, n, sizeof(Release), release_cmp);
	gates = all_gates(&ngates);
	if (ngates == 0)
		return 0;

	/* the (recipient, gate) entries where one of the holders has a pass */
	rows = palloc0(n * ngates * sizeof(GateRow));
	for (i = 0; i < n; i++)
	{
		if (i > 0 && strcmp(rel[i].key, rel[i - 1].key) == 0)
			continue;
		for (j = 0; j < ngates; j++)
		{
			GateRow    *row = &rows[nrows];

			row->recipient = rel[i].key;
			row->gate = gates[j];
			if (holds_any(row, rel + i, n - i, now))
				nrows++;
		}
	}
	if (nrows == 0)
		return 0;
	qsort(rows, nrows, sizeof(GateRow), gatekeeper_gate_row_cmp);

	gatekeeper_gate_lock(rows, nrows, now, false);
	for (i = 0; i < nrows; i++)
	{
		Release    *hit;
		int			lo = 0;
		int			hi = n;

		/* every holder asked for under this recipient: the first by bisection */
		while (lo < hi)
		{
			int			mid = lo + (hi - lo) / 2;

			if (strcmp(rel[mid].key, rows[i].recipient) < 0)
				lo = mid + 1;
			else
				hi = mid;
		}
		for (hit = rel + lo; hit < rel + n && strcmp(hit->key, rows[i].recipient) == 0; hit++)
			released += gatekeeper_gate_release_holder(&rows[i], hit->holder);
	}
	gatekeeper_gate_write(rows, nrows, now);
	return released;
}

/*
 * _release_mail(recipient text, holder bigint) RETURNS int
 *		Give back every pass a mail holds, in every gate: after a permanent
 *		failure the mail never went, so it must not keep the window shut.
 */
Datum
gatekeeper_release_mail(PG_FUNCTION_ARGS)
{
	char	   *recipient;
	int64		holder;
	int			released;

	require_arg(fcinfo, 0, "recipient");
	require_arg(fcinfo, 1, "holder");
	recipient = text_to_cstring(PG_GETARG_TEXT_PP(0));
	holder = PG_GETARG_INT64(1);

	SPI_connect();
	released = gatekeeper_release_passes(&recipient, &holder, 1);
	SPI_finish();

	PG_RETURN_INT32(released);
}

/*
 * _release_mails(recipients text[], holders bigint[]) RETURNS int
 *		The same for many mails at once, in the one global lock order.
 */
Datum
gatekeeper_release_mails(PG_FUNCTION_ARGS)
{
	Datum	   *rv;
	Datum	   *hv;
	bool	   *rn;
	bool	   *hn;
	int			nr;
	int			nh;
	char	  **recipients;
	int64	   *holders;
	int			released;
	int			i;

	require_arg(fcinfo, 0, "recipients");
	require_arg(fcinfo, 1, "holders");
	deconstruct_array(PG_GETARG_ARRAYTYPE_P(0), TEXTOID, -1, false, TYPALIGN_INT, &rv, &rn, &nr);
	deconstruct_array(PG_GETARG_ARRAYTYPE_P(1), INT8OID, 8, true, TYPALIGN_DOUBLE, &hv, &hn, &nh);
	if (nr != nh)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("recipients and holders must have the same length")));
	recipients = palloc(Max(nr, 1) * sizeof(char *));
	holders = palloc(Max(nr, 1) * sizeof(int64));
	for (i = 0; i < nr; i++)
	{
		if (rn[i] || hn[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("recipients and holders must not contain nulls")));
		recipients[i] = TextDatumGetCString(rv[i]);
		holders[i] = DatumGetInt64(hv[i]);
	}

	SPI_connect();
	released = gatekeeper_release_passes(recipients, holders, nr);
	SPI_finish();

	PG_RETURN_INT32(released);
}

/*
 * explain(recipient text) RETURNS TABLE (gate text, open boolean,
 *		next_open timestamptz, sends_in_period int, max_sends int)
 *		Every gate's view of one recipient, by gate name.
 */
Datum
gatekeeper_explain(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan = NULL;
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	char	   *key;
	uint64		r;
	uint64		ngates;
	SPITupleTable *gates;

	require_arg(fcinfo, 0, "recipient");
	InitMaterializedSRF(fcinfo, 0);
	key = recipient_arg(PG_GETARG_TEXT_PP(0));

	SPI_connect();
	if (plan == NULL)
		plan = gatekeeper_keep_plan("SELECT g.name, g.max_sends, g.id FROM gatekeeper.gate g ORDER BY g.name",
									0, NULL);
	if (SPI_execute_plan(plan, NULL, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read gates");
	gates = SPI_tuptable;
	ngates = SPI_processed;
	for (r = 0; r < ngates; r++)
	{
		HeapTuple	tup = gates->vals[r];
		TupleDesc	desc = gates->tupdesc;
		GateRow		row;
		int			max_sends;
		TimestampTz reopens;
		bool		isnull;
		Datum		values[5];
		bool		nulls[5] = {false, false, false, false, false};

		memset(&row, 0, sizeof(row));
		row.recipient = key;
		max_sends = DatumGetInt32(SPI_getbinval(tup, desc, 2, &isnull));
		row.gate = DatumGetInt32(SPI_getbinval(tup, desc, 3, &isnull));
		row_peek(&row, now);
		reopens = gatekeeper_gate_reopens(&row, max_sends);

		values[0] = SPI_getbinval(tup, desc, 1, &isnull);
		values[1] = BoolGetDatum(row.n < max_sends);
		values[2] = TimestampTzGetDatum(reopens);
		nulls[2] = (reopens == 0);
		values[3] = Int32GetDatum(row.n);
		values[4] = Int32GetDatum(max_sends);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	SPI_finish();

	return (Datum) 0;
}

/*
 * _gate_sweep() RETURNS bigint
 *		Drop expired passes from the shared state, settle finished
 *		transactions' stamps, and forget this database's dropped
 *		extensions; at most once a minute across the cluster, since it
 *		visits every entry.  purge() calls it.  Returns the entries dropped.
 */
Datum
gatekeeper_gate_sweep(PG_FUNCTION_ARGS)
{
	TimestampTz now = GetCurrentTimestamp();
	uint64		last;

	(void) fcinfo;

	gate_attach();
	last = pg_atomic_read_u64(&gate_shared->swept);
	if (!TimestampDifferenceExceeds((TimestampTz) last, now, GATE_SWEEP_INTERVAL_MS) ||
		!pg_atomic_compare_exchange_u64(&gate_shared->swept, &last, (uint64) now))
		PG_RETURN_INT64(0);
	PG_RETURN_INT64(gatekeeper_gate_sweep_memory(current_space()));
}

/*
 * _gate_restamp(gate text, recipient text, expires timestamptz[]) RETURNS void
 *		Give one recipient's live passes new expiries, in the order they
 *		were made: each is given back and made again with its new expiry,
 *		in this transaction.  For tests that need a window at its edge.
 */
Datum
gatekeeper_gate_restamp(PG_FUNCTION_ARGS)
{
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	GateDef		def;
	GateRow		row;
	Datum	   *ev;
	bool	   *en;
	int			ne;
	int			i;

	require_arg(fcinfo, 0, "gate");
	require_arg(fcinfo, 1, "recipient");
	require_arg(fcinfo, 2, "expires");
	deconstruct_array(PG_GETARG_ARRAYTYPE_P(2), TIMESTAMPTZOID, 8, true, TYPALIGN_DOUBLE,
					  &ev, &en, &ne);

	SPI_connect();
	gate_recipient_args(fcinfo, &def, &row);
	gatekeeper_gate_lock(&row, 1, now, false);
	if (row.n != ne)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("expires must have one element per live pass"),
				 errdetail("There are %d live passes.", row.n)));
	for (i = 0; i < ne; i++)
	{
		if (en[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("expires must not contain nulls")));
		row.expires[i] = DatumGetTimestampTz(ev[i]);
		row.slots[i] = -1;
		row.changed = true;
	}
	gatekeeper_gate_write(&row, 1, now);
	SPI_finish();

	PG_RETURN_VOID();
}
