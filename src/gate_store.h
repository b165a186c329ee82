/*-------------------------------------------------------------------------
 *
 * gate_store.h
 *		The gates' shared-memory store: keys, entries, their passes, the
 *		transactions that stamp them, and what they cost against
 *		gatekeeper.gate_memory.  Used by gate_log.c, gate.c and
 *		gate_funcs.c; nothing else needs it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATE_STORE_H
#define GATE_STORE_H

#include "gatekeeper.h"

#include "access/xact.h"
#include "utils/timestamp.h"

#include "utils/dsa.h"

/*
 * A gate lets at most GATE_MAX_SENDS passes per recipient through (SPEC's
 * bound on max_sends; a gate row that says more acts as if it said this).
 * An entry holds at most GATE_MAX_PASSES passes, live or being given back
 * by the transaction that holds it: npass is a uint16.
 */
#define GATE_MAX_SENDS		10000
#define GATE_MAX_PASSES		PG_UINT16_MAX

/* What one entry costs against gatekeeper.gate_memory: its dshash item. */
#define GATE_ENTRY_CHARGE	64

/*
 * An entry's key: the space (a small number a database's extension gets
 * at its first use since the postmaster started, never reused while it
 * runs), the gate's id, and 64 bits of SipHash-2-4 of the recipient key
 * under a random key.  Space 0 holds the spaces' markers.
 */
typedef struct GateKey
{
	uint32		space;
	int32		gate;
	uint64		hash;
} GateKey;

/*
 * One pass: its expiry (stamped with the period in force when it was
 * made) with GATE_PASS_NO_HOLDER or'ed in when it has no holder, the
 * holder, the transaction that made it (FrozenTransactionId once it is
 * known to have committed) and the one giving it back (or invalid).
 */
typedef struct GatePass
{
	int64		stamp;
	int64		holder;
	TransactionId xmin;
	TransactionId xmax;
} GatePass;

#define GATE_PASS_NO_HOLDER	(INT64CONST(1) << 62)

static inline TimestampTz
gate_pass_expires(const GatePass *p)
{
	return (TimestampTz) (p->stamp & ~GATE_PASS_NO_HOLDER);
}

static inline bool
gate_pass_has_holder(const GatePass *p, int64 holder)
{
	return (p->stamp & GATE_PASS_NO_HOLDER) == 0 && p->holder == holder;
}

static inline bool
gate_pass_no_holder(const GatePass *p)
{
	return (p->stamp & GATE_PASS_NO_HOLDER) != 0;
}

/*
 * An entry: 48 bytes, so that with dshash's 16-byte item header it is one
 * 64-byte DSA chunk.  Its first pass is inline; an entry that needs more
 * keeps them all in an array of its own (GATE_ENTRY_GROWN), charged
 * separately.
 */
typedef struct GateEntry
{
	GateKey		key;
	TransactionId locker;		/* last transaction to lock the entry */
	uint16		npass;
	uint16		flags;
	union
	{
		GatePass	one;		/* the inline pass */
		struct
		{
			dsa_pointer more;	/* GATE_ENTRY_GROWN: the passes */
			uint32		cap;	/* room in more */
		}			grown;
		struct
		{
			uint64		nonce;	/* the extension's gatekeeper.gate_space */
			Oid			dbid;
			uint32		space;	/* the number its entries are keyed by */
		}			marker;
	}			u;
} GateEntry;

#define GATE_ENTRY_GROWN	0x0001
#define GATE_MARKER_LOADED	0x0002	/* a marker whose rebuild committed */

/* What became of the transaction that stamped a pass or an entry. */
typedef enum GateXidState
{
	GATE_XID_MINE,
	GATE_XID_RUNNING,
	GATE_XID_COMMITTED,
	GATE_XID_ABORTED
} GateXidState;

/* gate_entry_add's answer */
typedef enum GateAddResult
{
	GATE_ADD_OK,
	GATE_ADD_NO_MEMORY,			/* gatekeeper.gate_memory is full */
	GATE_ADD_TOO_MANY			/* the entry holds GATE_MAX_PASSES */
} GateAddResult;

/* shared memory */
extern void gate_store_attach(void);
extern uint64 gate_store_hash(const char *recipient);

/* src/gatekeeper.c's shared memory hooks */
extern Size gatekeeper_gate_shmem_size(void);
extern void gatekeeper_gate_shmem_init(void);

/* gatekeeper.gate_memory: a backend's reservation, spent as entries are made */
extern void gate_store_reserve(Size bytes);
extern bool gate_store_try_reserve(Size bytes);
extern bool gate_store_reserve_entries(int entries);
extern void gate_store_unreserve(void);
extern void gate_store_memory_full(void) pg_attribute_noreturn();
extern void gate_store_count_refusals(int n);
extern void gate_store_too_many(void) pg_attribute_noreturn();

/* transactions; the hooks are src/xact.c's */
extern void gate_store_at_xact_end(XactEvent event);
extern void gate_store_at_subxact_end(SubXactEvent event);
extern GateXidState gate_xid_state(TransactionId xid);
extern TransactionId gate_store_my_xid(void);

/* entries */
extern GatePass *gate_entry_passes(GateEntry *e);
extern GateEntry *gate_entry_lock(const GateKey *key, bool create, TransactionId xid,
								  TimestampTz now, bool *created);
extern GateEntry *gate_entry_find(const GateKey *key, bool exclusive);
extern GateEntry *gate_entry_find_or_make(const GateKey *key, TimestampTz now);
extern void gate_entry_unlock(GateEntry *e);
extern GateAddResult gate_entry_add(GateEntry *e, TimestampTz expires, int64 holder,
									bool holder_null, TransactionId xmin);
extern bool gate_entry_room(GateEntry *e, int more);
extern bool gate_entry_has_holder(GateEntry *e, int64 holder);
extern void gate_entry_forget(GateEntry *e, int64 holder, TransactionId xmin);
extern bool gate_pass_visible(GatePass *p, TimestampTz now);

/* spaces */
extern uint32 gate_store_space(uint64 nonce, TransactionId *rebuild_as, bool *loaded);
extern int64 gate_store_sweep(bool drop_old_spaces, uint64 nonce);
extern bool gate_store_sweep_due(void);

/* what gatekeeper.gate_memory shows */
typedef struct GateMemoryStats
{
	uint64		used;			/* bytes charged */
	uint64		total;			/* gatekeeper.gate_memory */
	uint64		entries;
	uint64		full_refusals;	/* gated mails deferred: no room */
} GateMemoryStats;

extern void gate_store_stats(GateMemoryStats *stats);

#endif							/* GATE_STORE_H */
