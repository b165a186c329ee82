/*-------------------------------------------------------------------------
 *
 * gate_store.c
 *		The gates' shared-memory store: a dshash table on a DSA area made in
 *		place in gatekeeper's fixed shared memory (as the cumulative
 *		statistics do), one entry per (space, gate, recipient).
 *
 * Keys.  The recipient is keyed by 64 bits of SipHash-2-4 under a random
 * key drawn when the postmaster makes the table, so nobody can choose
 * colliding recipients in advance.  Among n recipients of one gate the
 * chance that any two share a hash is below n^2 / 2^65: for the 4 million
 * entries the default gatekeeper.gate_memory holds, under 5 * 10^-7; a
 * collision would only make two recipients share one window.  The space
 * is a small number the database's extension gets at its first use since
 * the postmaster started (see gate_store_space), never reused while it
 * runs, so a re-created extension never meets its predecessor's entries.
 *
 * Entries.  An entry is 48 bytes (with dshash's item header, one 64-byte
 * chunk of the area) and holds one pass inline; an entry that needs more
 * (a frequency cap) moves them all to an array of its own.  Counters are
 * sized for their bounds: at most GATE_MAX_PASSES passes an entry, and a
 * gate decides on at most GATE_MAX_SENDS.
 *
 * Passes are transactional, as rows would be.  A caller locks an entry by
 * stamping it with its transaction id; anyone finding the entry stamped by
 * a transaction still in progress releases the partition lock and waits
 * for that transaction with XactLockTableWait, as for a row lock, so the
 * wait shows in pg_locks and the deadlock detector sees it.  A pass whose
 * xmin aborted never existed; one whose xmax committed is gone.  Stamps
 * are the current (sub)transaction's id, so ROLLBACK TO SAVEPOINT undoes
 * a pass, or a release, like any row change.
 *
 * Memory.  Each entry is charged GATE_ENTRY_CHARGE against
 * gatekeeper.gate_memory, each array of passes its size.  A backend
 * reserves before it makes entries, and what it reserved and did not use
 * goes back when its call ends, or when its (sub)transaction aborts, so a
 * cancelled call leaks nothing.  What entries an aborted transaction made
 * are swept out once their passes are seen dead.
 *
 * Mapping.  The whole area lies in the main shared memory, sized at start
 * from gatekeeper.gate_memory: it never grows into DSM segments, and it is
 * in huge pages wherever the server's shared memory is.  A gate pass
 * touches a bucket and an entry at random among the store's pages, and a
 * process pays for its first touch of each page (a fault; under a
 * hypervisor's shadow paging, about 9 us more), so with millions of
 * entries most of a new backend's first thousands of passes go on that.
 * In huge pages there are a few hundred such pages, not tens of
 * thousands; and once a backend has looked up a few hundred entries it
 * fills its page tables for every page of the area that exists, and again
 * each time the store has grown by a step since (gate_store_map).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <sys/mman.h>
#include <unistd.h>

#include "gate_store.h"
#include "xact.h"

#include "access/transam.h"
#include "access/xact.h"
#include "common/hashfn.h"
#include "lib/dshash.h"
#include "miscadmin.h"
#include "gatekeeper.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "storage/lwlock.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "utils/dsa.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

/* Linux 5.14's, for the C library's headers that are older */
#if defined(__linux__) && !defined(MADV_POPULATE_READ)
#define MADV_POPULATE_READ 22
#endif

/* The area's own room beyond what gatekeeper.gate_memory charges. */
#define GATE_DSA_SLACK		(9 * 1024 * 1024)

/*
 * A backend maps the area once it has looked up GATE_MAP_AFTER entries,
 * and again whenever the store has GATE_MAP_STEP more entries since.
 */
#define GATE_MAP_AFTER		256
#define GATE_MAP_STEP		(128 * 1024)

/* A full gate memory sweeps what expired at most this often. */
#define GATE_OVERDRAW_SWEEP_MS	1000

/* purge() sweeps the shared table at most this often */
#define GATE_SWEEP_INTERVAL_MS	(60 * 1000)

/* The passes an array of its own starts with. */
#define GATE_FIRST_CAP		4

/* The fixed part in the main shared memory, then the DSA area. */
typedef struct GateShared
{
	int			dsa_tranche;
	int			hash_tranche;
	dshash_table_handle handle;
	uint64		seed[2];		/* SipHash key, per postmaster */
	Size		limit;			/* gatekeeper.gate_memory in bytes */
	pg_atomic_uint64 charged;	/* bytes charged against limit */
	pg_atomic_uint64 entries;	/* pass entries (not markers) */
	pg_atomic_uint64 refusals;	/* gated mails deferred for want of room */
	pg_atomic_uint64 swept;		/* when purge() last swept (TimestampTz) */
	pg_atomic_uint64 overdraw_swept;	/* when a full memory last swept */
	pg_atomic_uint64 aborts;	/* aborts of transactions that made entries */
	pg_atomic_uint64 aborts_swept;	/* aborts when a full memory last swept */
	pg_atomic_uint32 next_space;	/* the next space number to give */
} GateShared;

static GateShared *gate_shared = NULL;
static dsa_area *gate_dsa = NULL;
static dshash_table *gate_hash = NULL;
static dshash_parameters gate_params;

/* the area's start; the entries at which this backend maps it next */
static char *gate_area = NULL;
static uint64 map_at_entries = 0;
static uint64 lookups = 0;
static bool map_failed = false;

/* bytes this backend charged and has not spent on entries yet */
static Size reserved = 0;

/* this transaction changed gates, made entries */
static bool gates_changed = false;
static bool made_entries = false;

static uint64 siphash24(uint64 k0, uint64 k1, const unsigned char *m, size_t len);
static dshash_hash gate_key_hash(const void *v, size_t size, void *arg);
static void set_params(void);
static Size area_size(void);
static void gate_store_map(void);
static bool charge(Size bytes, bool sweep);
static void uncharge(Size bytes);
static bool xid_running(TransactionId xid);
static int	entry_cap(GateEntry *e);
static void entry_init(GateEntry *e);
static void entry_prune(GateEntry *e, TimestampTz now);
static bool entry_grow(GateEntry *e, int need);
static void entry_free(GateEntry *e);
static TransactionId foreign_xid(GateEntry *e);
static void entry_locktag(LOCKTAG *tag, const GateKey *key);

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
 * gate_store_hash
 *		The keyed hash of a recipient key (lower-cased already).
 */
uint64
gate_store_hash(const char *recipient)
{
	return siphash24(gate_shared->seed[0], gate_shared->seed[1],
					 (const unsigned char *) recipient, strlen(recipient));
}

/*
 * dshash's hash of a key: its bits are already random.
 */
static dshash_hash
gate_key_hash(const void *v, size_t size, void *arg)
{
	const GateKey *key = (const GateKey *) v;

	return hash_combine((uint32) key->hash ^ (uint32) (key->hash >> 32),
						hash_combine((uint32) key->gate, key->space));
}

/* ---------------------------------------------------------------- shared memory */

/*
 * The table's parameters, the same in every backend.
 */
static void
set_params(void)
{
	gate_params.key_size = sizeof(GateKey);
	gate_params.entry_size = sizeof(GateEntry);
	gate_params.compare_function = dshash_memcmp;
	gate_params.hash_function = gate_key_hash;
	gate_params.tranche_id = gate_shared->hash_tranche;
}

/*
 * The DSA area's size: what is charged, plus room for dshash's bucket
 * arrays (8 bytes a bucket, at least 4 buckets for 3 entries, twice that
 * while they are resized: up to half as much again as the entries) and
 * the area's own pages and rounding.
 */
static Size
area_size(void)
{
	Size		limit = (Size) gatekeeper_gate_memory * 1024;

	return add_size(add_size(limit, limit / 2 + limit / 8), GATE_DSA_SLACK);
}

/*
 * gatekeeper_gate_shmem_size
 *		Bytes of the main shared memory the gates need.
 */
Size
gatekeeper_gate_shmem_size(void)
{
	return add_size(MAXALIGN(sizeof(GateShared)), area_size());
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

	StaticAssertStmt(sizeof(GateEntry) == 48, "a gate entry is 48 bytes");
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
		pg_atomic_init_u64(&gate_shared->entries, 0);
		pg_atomic_init_u64(&gate_shared->refusals, 0);
		pg_atomic_init_u64(&gate_shared->swept, 0);
		pg_atomic_init_u64(&gate_shared->overdraw_swept, 0);
		pg_atomic_init_u64(&gate_shared->aborts, 0);
		pg_atomic_init_u64(&gate_shared->aborts_swept, 0);
		pg_atomic_init_u32(&gate_shared->next_space, 1);

		/* one segment, the whole area, and never another */
		dsa = dsa_create_in_place(place, area_size(), gate_shared->dsa_tranche, NULL);
		dsa_set_size_limit(dsa, area_size());
		dsa_pin(dsa);
		set_params();
		hash = dshash_create(dsa, &gate_params, NULL);
		gate_shared->handle = dshash_get_hash_table_handle(hash);
		dshash_detach(hash);
		dsa_detach(dsa);
	}
}

/*
 * gate_store_attach
 *		Attach this backend to the shared table, once.
 */
void
gate_store_attach(void)
{
	MemoryContext old;
	char	   *place;

	if (gate_hash != NULL)
	{
		gate_store_map();
		return;
	}
	if (gate_shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("gatekeeper gates need the library in shared_preload_libraries"),
				 errhint("Add gatekeeper to shared_preload_libraries and restart the server.")));

	LWLockRegisterTranche(gate_shared->dsa_tranche, "gatekeeper gates area");
	LWLockRegisterTranche(gate_shared->hash_tranche, "gatekeeper gates");
	set_params();

	old = MemoryContextSwitchTo(TopMemoryContext);
	place = (char *) gate_shared + MAXALIGN(sizeof(GateShared));
	gate_dsa = dsa_attach_in_place(place, NULL);
	on_shmem_exit(dsa_on_shmem_exit_release_in_place, PointerGetDatum(place));
	dsa_pin_mapping(gate_dsa);
	gate_hash = dshash_attach(gate_dsa, &gate_params, gate_shared->handle, NULL);
	MemoryContextSwitchTo(old);
	gate_area = place;
	gate_store_map();
}

/*
 * gate_store_map
 *		Fill this backend's page tables for every page of the area that
 *		exists (mincore says which: a page of shared memory exists once any
 *		backend has touched it), at its first call after GATE_MAP_AFTER
 *		lookups (a connection that makes a few passes is better off
 *		faulting them in) and again whenever the store has GATE_MAP_STEP
 *		more entries, so that its gate passes do not fault page by page.
 *		Pages nobody has touched are left alone, so the area still costs
 *		memory only as the store fills.  Only a speed: a kernel without MADV_POPULATE_READ
 *		(before Linux 5.14), or one that refuses, leaves the pages to fault
 *		in as they are touched.
 */
static void
gate_store_map(void)
{
#if defined(__linux__)
	uint64		entries;
	Size		page;
	char	   *from;
	Size		npages;
	unsigned char *in;
	Size		i;

	if (map_failed || lookups < GATE_MAP_AFTER)
		return;
	entries = pg_atomic_read_u64(&gate_shared->entries);
	if (entries < map_at_entries)
		return;
	map_at_entries = entries + GATE_MAP_STEP;
	page = (Size) sysconf(_SC_PAGESIZE);
	from = (char *) TYPEALIGN(page, (uintptr_t) gate_area);
	npages = (area_size() - (from - gate_area)) / page;
	in = palloc(npages);
	if (mincore(from, npages * page, in) != 0)
	{
		elog(DEBUG1, "could not see which pages of the gates' shared memory exist: %m");
		map_failed = true;
	}
	for (i = 0; i < npages && !map_failed;)
	{
		Size		run;

		if (!(in[i] & 1))
		{
			i++;
			continue;
		}
		for (run = 1; i + run < npages && (in[i + run] & 1); run++)
			;
		if (madvise(from + i * page, run * page, MADV_POPULATE_READ) != 0)
		{
			elog(DEBUG1, "could not map the gates' shared memory ahead: %m");
			map_failed = true;
		}
		i += run;
	}
	pfree(in);
#endif
}

/* ---------------------------------------------------------------- memory */

/*
 * Charge bytes against gatekeeper.gate_memory; false, charging nothing,
 * when they do not fit.  With sweep (never while a partition lock is
 * held), a full memory first sweeps out what expired or aborted: at once
 * if a transaction that made entries aborted since the last such sweep,
 * else at most once a second across the cluster, since a sweep visits
 * every entry.
 */
static bool
charge(Size bytes, bool sweep)
{
	uint64		last;
	uint64		aborts;
	TimestampTz now;

	if (pg_atomic_add_fetch_u64(&gate_shared->charged, bytes) <= gate_shared->limit)
		return true;
	uncharge(bytes);
	if (!sweep)
		return false;
	now = GetCurrentTimestamp();
	last = pg_atomic_read_u64(&gate_shared->overdraw_swept);
	aborts = pg_atomic_read_u64(&gate_shared->aborts);
	if (aborts == pg_atomic_read_u64(&gate_shared->aborts_swept) &&
		!TimestampDifferenceExceeds((TimestampTz) last, now, GATE_OVERDRAW_SWEEP_MS))
		return false;
	if (!pg_atomic_compare_exchange_u64(&gate_shared->overdraw_swept, &last, (uint64) now))
		return false;
	pg_atomic_write_u64(&gate_shared->aborts_swept, aborts);
	(void) gate_store_sweep(false, 0);
	if (pg_atomic_add_fetch_u64(&gate_shared->charged, bytes) <= gate_shared->limit)
		return true;
	uncharge(bytes);
	return false;
}

/*
 * Give back bytes charged against gatekeeper.gate_memory.
 */
static void
uncharge(Size bytes)
{
	pg_atomic_sub_fetch_u64(&gate_shared->charged, bytes);
}

/*
 * gate_store_reserve
 *		Reserve bytes for entries this backend is about to make, or raise
 *		53200, reserving nothing.  Must not be called with a partition lock
 *		held.
 */
void
gate_store_reserve(Size bytes)
{
	if (!gate_store_try_reserve(bytes))
		gate_store_memory_full();
}

/*
 * gate_store_try_reserve
 *		The same, answering false instead of raising.
 */
bool
gate_store_try_reserve(Size bytes)
{
	gate_store_my_xid();		/* the transaction's end gives it back */
	if (!charge(bytes, true))
		return false;
	reserved += bytes;
	return true;
}

/*
 * gate_store_reserve_entries
 *		Make sure this backend has the charge of at least one entry
 *		reserved, reserving up to entries at once when it has not (fewer
 *		atomic operations on the shared counter).  False when not even one
 *		fits.
 */
bool
gate_store_reserve_entries(int entries)
{
	if (reserved >= GATE_ENTRY_CHARGE)
		return true;
	entries = Min(Max(entries, 1), 64);
	if (entries > 1 && gate_store_try_reserve((Size) entries * GATE_ENTRY_CHARGE))
		return true;
	return gate_store_try_reserve(GATE_ENTRY_CHARGE);
}

/*
 * gate_store_unreserve
 *		Give back what this backend reserved and did not spend.
 */
void
gate_store_unreserve(void)
{
	if (reserved > 0 && gate_shared != NULL)
		uncharge(reserved);
	reserved = 0;
}

/*
 * gate_store_memory_full
 *		Raise 53200: the shared state has no room for what a call needs.
 */
void
gate_store_memory_full(void)
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
 * gate_store_too_many
 *		Raise 54000: one entry cannot hold more passes.
 */
void
gate_store_too_many(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
			 errmsg("too many gate passes for one recipient"),
			 errdetail("A recipient holds at most %d passes in one gate, counting those this transaction gave back.",
					   GATE_MAX_PASSES)));
}

/*
 * gate_store_count_refusals
 *		Count gated mails deferred because gate memory was full.
 */
void
gate_store_count_refusals(int n)
{
	pg_atomic_add_fetch_u64(&gate_shared->refusals, n);
}

/*
 * gate_store_stats
 *		What gatekeeper.gate_memory shows.
 */
void
gate_store_stats(GateMemoryStats *stats)
{
	gate_store_attach();
	stats->used = pg_atomic_read_u64(&gate_shared->charged);
	stats->total = gate_shared->limit;
	stats->entries = pg_atomic_read_u64(&gate_shared->entries);
	stats->full_refusals = pg_atomic_read_u64(&gate_shared->refusals);
}

/* ---------------------------------------------------------------- transactions */

/*
 * gate_xid_state
 *		What became of the transaction that stamped a pass or an entry.  A
 *		transaction older than the commit log's horizon counts as committed:
 *		a pass so old that its fate can no longer be read keeps its gate
 *		closed rather than open (purge() settles every stamp long before).
 */
GateXidState
gate_xid_state(TransactionId xid)
{
	bool		committed;

	if (xid == FrozenTransactionId)
		return GATE_XID_COMMITTED;
	if (TransactionIdIsCurrentTransactionId(xid))
		return GATE_XID_MINE;
	if (TransactionIdIsInProgress(xid))
		return GATE_XID_RUNNING;
	LWLockAcquire(XactTruncationLock, LW_SHARED);
	if (TransactionIdPrecedes(xid, ShmemVariableCache->oldestClogXid))
		committed = true;
	else
		committed = TransactionIdDidCommit(xid);
	LWLockRelease(XactTruncationLock);
	return committed ? GATE_XID_COMMITTED : GATE_XID_ABORTED;
}

/*
 * Is xid a transaction in progress other than this one (or one of its
 * subtransactions)?
 */
static bool
xid_running(TransactionId xid)
{
	return TransactionIdIsNormal(xid) &&
		!TransactionIdIsCurrentTransactionId(xid) &&
		TransactionIdIsInProgress(xid);
}

/*
 * gate_store_at_xact_end
 *		src/xact.c's hook.  Refuse PREPARE TRANSACTION in a transaction that
 *		changed gates, and at the end of every transaction forget the flag
 *		and give back what was reserved and not spent.
 */
void
gate_store_at_xact_end(XactEvent event)
{
	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:
			if (gates_changed)
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot prepare a transaction that passed or released gatekeeper gates")));
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			if (made_entries && gate_shared != NULL)
				pg_atomic_add_fetch_u64(&gate_shared->aborts, 1);
			/* FALLTHROUGH */
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
			gates_changed = false;
			made_entries = false;
			gate_store_unreserve();
			break;
		default:
			break;
	}
}

/*
 * gate_store_at_subxact_end
 *		src/xact.c's hook.  A subtransaction that aborts gives back what it
 *		reserved and did not spend (a cancelled call under a savepoint).
 */
void
gate_store_at_subxact_end(SubXactEvent event)
{
	if (event != SUBXACT_EVENT_ABORT_SUB)
		return;
	if (made_entries && gate_shared != NULL)
		pg_atomic_add_fetch_u64(&gate_shared->aborts, 1);
	gate_store_unreserve();
}

/*
 * gate_store_my_xid
 *		This transaction is about to change gates: its id to stamp with.
 */
TransactionId
gate_store_my_xid(void)
{
	gates_changed = true;
	return GetCurrentTransactionId();
}

/* ---------------------------------------------------------------- entries */

/*
 * How many passes an entry has room for.
 */
static int
entry_cap(GateEntry *e)
{
	return (e->flags & GATE_ENTRY_GROWN) ? (int) e->u.grown.cap : 1;
}

/*
 * gate_entry_passes
 *		An entry's passes: the inline one, or its own array.
 */
GatePass *
gate_entry_passes(GateEntry *e)
{
	if (e->flags & GATE_ENTRY_GROWN)
		return (GatePass *) dsa_get_address(gate_dsa, e->u.grown.more);
	return &e->u.one;
}

/*
 * A new entry: no passes, not locked; charged to this backend's
 * reservation.
 */
static void
entry_init(GateEntry *e)
{
	e->locker = InvalidTransactionId;
	e->npass = 0;
	e->flags = 0;
	memset(&e->u, 0, sizeof(e->u));
	if (e->key.space != 0)
	{
		if (reserved < GATE_ENTRY_CHARGE)
			elog(ERROR, "gate entry made without a reservation");
		reserved -= GATE_ENTRY_CHARGE;
		made_entries = true;
		pg_atomic_add_fetch_u64(&gate_shared->entries, 1);
	}
}

/*
 * Drop what is dead from a locked entry: expired passes, passes whose
 * maker aborted or whose release committed; freeze commits seen.  The
 * caller holds the partition lock exclusively, and no other transaction
 * in progress has the entry locked.
 */
static void
entry_prune(GateEntry *e, TimestampTz now)
{
	GatePass   *p = gate_entry_passes(e);
	int			kept = 0;
	int			i;

	for (i = 0; i < e->npass; i++)
	{
		GatePass   *q = &p[i];

		if (gate_pass_expires(q) <= now)
			continue;
		if (q->xmin != FrozenTransactionId)
		{
			GateXidState s = gate_xid_state(q->xmin);

			if (s == GATE_XID_ABORTED)
				continue;
			if (s == GATE_XID_COMMITTED)
				q->xmin = FrozenTransactionId;
		}
		if (TransactionIdIsValid(q->xmax))
		{
			GateXidState s = gate_xid_state(q->xmax);

			if (s == GATE_XID_COMMITTED)
				continue;
			if (s == GATE_XID_ABORTED)
				q->xmax = InvalidTransactionId;
		}
		if (kept != i)
			p[kept] = *q;
		kept++;
	}
	e->npass = kept;
}

/*
 * Give a locked entry room for need passes in an array of its own.
 * Returns false, changing nothing, when gatekeeper.gate_memory has no
 * room or need is beyond GATE_MAX_PASSES.  Called with the partition lock
 * held, so it never sweeps.
 */
static bool
entry_grow(GateEntry *e, int need)
{
	int			cap = entry_cap(e);
	int			newcap = Max(cap, GATE_FIRST_CAP);
	Size		bytes;
	dsa_pointer more;
	GatePass   *q;

	if (need > GATE_MAX_PASSES)
		return false;
	while (newcap < need)
		newcap *= 2;
	newcap = Min(newcap, GATE_MAX_PASSES);
	bytes = (Size) newcap * sizeof(GatePass);
	if (!charge(bytes, false))
		return false;
	more = dsa_allocate_extended(gate_dsa, bytes, DSA_ALLOC_NO_OOM);
	if (!DsaPointerIsValid(more))
	{
		uncharge(bytes);
		return false;
	}
	q = dsa_get_address(gate_dsa, more);
	memcpy(q, gate_entry_passes(e), e->npass * sizeof(GatePass));
	if (e->flags & GATE_ENTRY_GROWN)
	{
		dsa_free(gate_dsa, e->u.grown.more);
		uncharge((Size) cap * sizeof(GatePass));
	}
	memset(&e->u, 0, sizeof(e->u));
	e->u.grown.more = more;
	e->u.grown.cap = newcap;
	e->flags |= GATE_ENTRY_GROWN;
	return true;
}

/*
 * gate_entry_room
 *		Make room in a locked entry for more passes now, so that adding
 *		them later cannot fail.  False when there is no room to be had.
 */
bool
gate_entry_room(GateEntry *e, int more)
{
	int			need = e->npass + more;

	if (need <= entry_cap(e))
		return true;
	return entry_grow(e, need);
}

/*
 * gate_entry_add
 *		Append a pass to a locked entry, growing its array if need be.  On
 *		anything but GATE_ADD_OK nothing changed; the caller unlocks the
 *		entry and raises the error.
 */
GateAddResult
gate_entry_add(GateEntry *e, TimestampTz expires, int64 holder, bool holder_null,
			   TransactionId xmin)
{
	GatePass   *p;

	if (e->npass >= GATE_MAX_PASSES)
		return GATE_ADD_TOO_MANY;
	if (expires < 0 || expires >= GATE_PASS_NO_HOLDER)
		elog(ERROR, "gate pass expiry out of range");
	if (e->npass >= entry_cap(e) && !entry_grow(e, e->npass + 1))
		return GATE_ADD_NO_MEMORY;
	p = &gate_entry_passes(e)[e->npass++];
	p->stamp = (int64) expires | (holder_null ? GATE_PASS_NO_HOLDER : 0);
	p->holder = holder_null ? 0 : holder;
	p->xmin = xmin;
	p->xmax = InvalidTransactionId;
	return GATE_ADD_OK;
}

/*
 * gate_entry_has_holder
 *		Does the entry hold a pass of this holder?
 */
bool
gate_entry_has_holder(GateEntry *e, int64 holder)
{
	GatePass   *p = gate_entry_passes(e);
	int			i;

	for (i = 0; i < e->npass; i++)
		if (gate_pass_has_holder(&p[i], holder))
			return true;
	return false;
}

/*
 * gate_entry_forget
 *		Drop the passes of a holder that xmin made (a replayed release).
 */
void
gate_entry_forget(GateEntry *e, int64 holder, TransactionId xmin)
{
	GatePass   *p = gate_entry_passes(e);
	int			kept = 0;
	int			i;

	for (i = 0; i < e->npass; i++)
	{
		if (gate_pass_has_holder(&p[i], holder) && p[i].xmin == xmin)
			continue;
		p[kept++] = p[i];
	}
	e->npass = kept;
}

/*
 * Free an entry's own allocations and its charge before it is deleted.
 */
static void
entry_free(GateEntry *e)
{
	if (e->key.space == 0)
		return;					/* a marker: never charged */
	if (e->flags & GATE_ENTRY_GROWN)
	{
		dsa_free(gate_dsa, e->u.grown.more);
		uncharge((Size) e->u.grown.cap * sizeof(GatePass));
	}
	uncharge(GATE_ENTRY_CHARGE);
	pg_atomic_sub_fetch_u64(&gate_shared->entries, 1);
}

/*
 * Another transaction in progress that has stamped this entry, or an
 * invalid id if there is none.
 */
static TransactionId
foreign_xid(GateEntry *e)
{
	GatePass   *p;
	int			i;

	if (xid_running(e->locker))
		return e->locker;
	if (e->key.space == 0)
		return InvalidTransactionId;
	p = gate_entry_passes(e);
	for (i = 0; i < e->npass; i++)
	{
		if (xid_running(p[i].xmin))
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
	uint64		h = key->hash ^ ((uint64) (uint32) key->gate << 32) ^ (uint64) key->space;

	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (h >> 32), (uint32) h,
						 GATE_LOCKTAG_CLASS);
}

/*
 * gate_entry_lock
 *		Find and lock the entry of a key, waiting for any other transaction
 *		in progress that has it locked.  With create, a missing entry is
 *		made, spending GATE_ENTRY_CHARGE of this backend's reservation;
 *		without, NULL when there is none.  Returns with the partition lock
 *		held; the entry is pruned and stamped with this transaction.
 *
 * A caller that finds the entry taken first queues on the entry's
 * heavyweight lock, then waits for the holder's transaction, and keeps
 * its place in the queue until it has stamped the entry, so waiters are
 * served in the order they came.
 */
GateEntry *
gate_entry_lock(const GateKey *key, bool create, TransactionId xid, TimestampTz now,
				bool *created)
{
	LOCKTAG		tag;
	bool		queued = false;
	GateEntry  *e;

	*created = false;
	lookups++;
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
			if (reserved < GATE_ENTRY_CHARGE)
			{
				dshash_delete_entry(gate_hash, e);
				elog(ERROR, "gate entry made without a reservation");
			}
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
		break;
	}
	if (queued)
		LockRelease(&tag, ExclusiveLock, false);
	return e;
}

/*
 * gate_entry_find
 *		The entry of a key with its partition lock held, or NULL; no
 *		waiting, no stamping.
 */
GateEntry *
gate_entry_find(const GateKey *key, bool exclusive)
{
	lookups++;
	return dshash_find(gate_hash, key, exclusive);
}

/*
 * gate_entry_find_or_make
 *		The entry of a key, made if missing, pruned if not, with its
 *		partition lock held and not stamped; for the replay, which runs
 *		under its space's marker.  Raises 53200 when there is no room.
 */
GateEntry *
gate_entry_find_or_make(const GateKey *key, TimestampTz now)
{
	GateEntry  *e;
	bool		found;

	if (reserved < GATE_ENTRY_CHARGE)
		gate_store_reserve(GATE_ENTRY_CHARGE * 64);
	e = dshash_find_or_insert(gate_hash, key, &found);
	if (found)
		entry_prune(e, now);
	else
		entry_init(e);
	return e;
}

/*
 * gate_entry_unlock
 *		Release an entry's partition lock.
 */
void
gate_entry_unlock(GateEntry *e)
{
	dshash_release_lock(gate_hash, e);
}

/*
 * gate_pass_visible
 *		Is this pass live as this backend sees it without locking: made by
 *		a committed transaction or by this one, not given back by either?
 */
bool
gate_pass_visible(GatePass *p, TimestampTz now)
{
	if (gate_pass_expires(p) <= now)
		return false;
	if (p->xmin != FrozenTransactionId)
	{
		GateXidState s = gate_xid_state(p->xmin);

		if (s != GATE_XID_MINE && s != GATE_XID_COMMITTED)
			return false;

		/*
		 * A hint, set under a shared lock as heap hint bits are: it only
		 * ever goes from a committed xid to FrozenTransactionId, and every
		 * reader agrees on what either means.
		 */
		if (s == GATE_XID_COMMITTED)
			p->xmin = FrozenTransactionId;
	}
	if (TransactionIdIsValid(p->xmax))
	{
		GateXidState s = gate_xid_state(p->xmax);

		if (s == GATE_XID_MINE || s == GATE_XID_COMMITTED)
			return false;
	}
	return true;
}

/* ---------------------------------------------------------------- spaces */

/*
 * gate_store_space
 *		The space number of this database's extension whose
 *		gatekeeper.gate_space holds nonce.  Its marker entry (space 0, gate
 *		0, keyed by a hash of the database and the nonce) gives it a fresh
 *		number at its first use since the postmaster started, and is locked
 *		by the transaction that replays the log into it.  Sets *rebuild_as
 *		to this transaction's id when the caller must replay the log now,
 *		else to invalid; waits while another transaction replays it.  Sets
 *		*loaded once a replay committed, so the caller may remember it.
 */
uint32
gate_store_space(uint64 nonce, TransactionId *rebuild_as, bool *loaded)
{
	GateKey		key;
	uint64		ident[2];

	gate_store_attach();
	ident[0] = nonce;
	ident[1] = MyDatabaseId;
	memset(&key, 0, sizeof(key));
	key.hash = siphash24(gate_shared->seed[0], gate_shared->seed[1],
						 (const unsigned char *) ident, sizeof(ident));
	*rebuild_as = InvalidTransactionId;
	*loaded = false;
	for (;;)
	{
		GateEntry  *e;
		bool		found;
		uint32		space;

		e = dshash_find_or_insert(gate_hash, &key, &found);
		if (!found)
		{
			entry_init(e);
			e->u.marker.nonce = nonce;
			e->u.marker.dbid = MyDatabaseId;
			e->u.marker.space = pg_atomic_fetch_add_u32(&gate_shared->next_space, 1);
			if (e->u.marker.space == 0)
			{
				dshash_delete_entry(gate_hash, e);
				elog(ERROR, "gatekeeper gate space numbers are exhausted");
			}
		}
		else if (e->u.marker.nonce != nonce || e->u.marker.dbid != MyDatabaseId)
		{
			dshash_release_lock(gate_hash, e);
			elog(ERROR, "gatekeeper gate space markers collide");
		}
		space = e->u.marker.space;
		if (e->flags & GATE_MARKER_LOADED)
		{
			dshash_release_lock(gate_hash, e);
			*loaded = true;
			return space;
		}
		if (TransactionIdIsValid(e->locker))
		{
			GateXidState s = gate_xid_state(e->locker);

			if (s == GATE_XID_MINE)
			{
				/* this transaction replays it */
				dshash_release_lock(gate_hash, e);
				return space;
			}
			if (s == GATE_XID_RUNNING)
			{
				TransactionId wait = e->locker;

				dshash_release_lock(gate_hash, e);
				XactLockTableWait(wait, NULL, NULL, XLTW_None);
				continue;
			}
			if (s == GATE_XID_COMMITTED)
			{
				e->flags |= GATE_MARKER_LOADED;
				dshash_release_lock(gate_hash, e);
				*loaded = true;
				return space;
			}
			/* the replay aborted: do it again */
		}
		*rebuild_as = gate_store_my_xid();
		e->locker = *rebuild_as;
		dshash_release_lock(gate_hash, e);
		return space;
	}
}

/*
 * Is space one of the n in spaces?
 */
static bool
space_in(uint32 space, const uint32 *spaces, int n)
{
	int			i;

	for (i = 0; i < n; i++)
		if (spaces[i] == space)
			return true;
	return false;
}

/*
 * gate_store_sweep
 *		Drop expired and dead passes and empty entries from the shared
 *		table, and settle every stamp of a finished transaction; with
 *		drop_old_spaces, also drop the entries of this database's earlier
 *		extensions (markers with another nonce).  Entries locked by a
 *		transaction in progress are left alone.  Returns how many entries
 *		were dropped.
 */
int64
gate_store_sweep(bool drop_old_spaces, uint64 nonce)
{
	dshash_seq_status status;
	GateEntry  *e;
	TimestampTz now = GetCurrentTimestamp();
	int64		dropped = 0;
	uint32	   *dead = NULL;
	int			ndead = 0;
	int			maxdead = 0;

	gate_store_attach();
	if (drop_old_spaces)
	{
		dshash_seq_init(&status, gate_hash, false);
		while ((e = dshash_seq_next(&status)) != NULL)
		{
			if (e->key.space != 0 || e->u.marker.dbid != MyDatabaseId ||
				e->u.marker.nonce == nonce || xid_running(e->locker))
				continue;
			if (ndead == maxdead)
			{
				maxdead = Max(16, maxdead * 2);
				dead = dead ? repalloc(dead, maxdead * sizeof(uint32))
					: palloc(maxdead * sizeof(uint32));
			}
			dead[ndead++] = e->u.marker.space;
		}
		dshash_seq_term(&status);
	}

	dshash_seq_init(&status, gate_hash, true);
	while ((e = dshash_seq_next(&status)) != NULL)
	{
		bool		marker = (e->key.space == 0);

		if (ndead > 0 &&
			space_in(marker ? e->u.marker.space : e->key.space, dead, ndead))
		{
			/* an extension since dropped from this database */
			if (!marker && TransactionIdIsValid(foreign_xid(e)))
				continue;
			entry_free(e);
			dshash_delete_current(&status);
			dropped++;
			continue;
		}
		if (marker)
			continue;
		if (TransactionIdIsValid(e->locker) && gate_xid_state(e->locker) == GATE_XID_MINE)
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
 * gate_store_sweep_due
 *		Whether purge() should sweep now: at most once a minute across the
 *		cluster, since a sweep visits every entry.  Claims the turn.
 */
bool
gate_store_sweep_due(void)
{
	TimestampTz now = GetCurrentTimestamp();
	uint64		last;

	gate_store_attach();
	last = pg_atomic_read_u64(&gate_shared->swept);
	return TimestampDifferenceExceeds((TimestampTz) last, now, GATE_SWEEP_INTERVAL_MS) &&
		pg_atomic_compare_exchange_u64(&gate_shared->swept, &last, (uint64) now);
}
