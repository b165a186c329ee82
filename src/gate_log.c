/*-------------------------------------------------------------------------
 *
 * gate_log.c
 *		The gates' durable log and its replay.
 *
 * In the same transaction every call that changes passes appends one row
 * per gate to gatekeeper.gate_log (the gate, the recipients, the holders,
 * the expiry), and one row per gate for the passes it gave back.  Shared
 * memory starts empty after a restart, and each database's extension has
 * a space of its own in it, so the first use of a space rebuilds its
 * state from the committed, unexpired log rows, under the space's marker
 * entry, which makes other first users wait.  The rebuilt passes are
 * stamped with the rebuilding transaction: should it abort, they vanish
 * and the next user rebuilds.  A committed pass can therefore never be
 * lost to a crash.  purge() deletes expired log rows and sweeps expired
 * passes out of memory.
 *
 * A space is named by a random number the extension keeps in
 * gatekeeper.gate_space, drawn by CREATE EXTENSION (or the update to
 * 0.2.0), so a dropped and re-created extension never finds its
 * predecessor's passes, even if its tables get the same OIDs.
 *
 * On a hot standby the shared store is not kept (replay does not call
 * gatekeeper, and a rebuild would need a transaction id): the read-only
 * looks read one recipient's passes from the replicated log instead
 * (gate_log_passes), as the store would hold them.
 *
 * PREPARE TRANSACTION is refused for a transaction that changed gates: a
 * prepared pass would survive a restart only in its uncommitted log row,
 * which the rebuild cannot see.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "gate_log.h"
#include "gate_store.h"

#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "catalog.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"

static const char gate_space_sql[] =
"SELECT id FROM gatekeeper.gate_space";

static const char replay_sql[] =
"SELECT gate, released, expires, recipients, holders "
"  FROM gatekeeper.gate_log "
" WHERE expires > now() ORDER BY id";

static const char log_insert_sql[] =
"INSERT INTO gatekeeper.gate_log (gate, released, expires, recipients, holders) "
"VALUES ($1, $2, $3, $4, $5)";

/* one recipient's log rows at one gate, in the order they were written */
static const char passes_sql[] =
"SELECT l.released, l.expires, u.holder "
"  FROM gatekeeper.gate_log l "
" CROSS JOIN LATERAL unnest(l.recipients, l.holders) AS u(recipient, holder) "
" WHERE l.gate = $1 AND l.expires > $2 AND u.recipient = $3 "
" ORDER BY l.id";

static SPIPlanPtr gate_space_plan = NULL;
static SPIPlanPtr passes_plan = NULL;
static SPIPlanPtr replay_plan = NULL;
static SPIPlanPtr log_insert_plan = NULL;

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

/*
 * the nonce of this database's extension, cached by its table's OID and
 * the number of invalidations of that OID (src/catalog.c)
 */
static Oid	nonce_relid = InvalidOid;
static uint32 nonce_generation = 0;
static uint64 nonce_value = 0;

/* the space this backend has seen rebuilt, by nonce */
static uint64 loaded_nonce = 0;
static uint32 loaded_space = 0;

static void replay(uint32 space, TransactionId xid, TimestampTz now);

/*
 * gate_log_nonce
 *		The random number that names this database's extension among every
 *		extension that ever used the gates.  Must run inside SPI.
 */
uint64
gate_log_nonce(void)
{
	Oid			relid = gatekeeper_relid(GATEKEEPER_REL_GATE_SPACE, true);
	uint32		generation = gatekeeper_relid_generation(GATEKEEPER_REL_GATE_SPACE);
	bool		isnull;

	if (!OidIsValid(relid))
		elog(ERROR, "gatekeeper.gate_space does not exist");
	/* kept until the table changes or goes */
	if (relid == nonce_relid && generation == nonce_generation)
		return nonce_value;
	gatekeeper_plan(&gate_space_plan, gate_space_sql, 0, NULL);
	if (SPI_execute_plan(gate_space_plan, NULL, NULL, true, 2) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "gatekeeper.gate_space must hold one row");
	nonce_value = (uint64) DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
													   SPI_tuptable->tupdesc, 1, &isnull));
	SPI_freetuptable(SPI_tuptable);
	nonce_relid = relid;
	nonce_generation = generation;
	return nonce_value;
}

/*
 * gate_log_space
 *		The space of this database's extension in the shared store, its
 *		state rebuilt from the log if this is its first use since the
 *		server started.  Must run inside SPI.
 */
uint32
gate_log_space(TimestampTz now)
{
	uint64		nonce;
	uint32		space;
	TransactionId rebuild_as;
	bool		loaded;

	gate_store_attach();
	nonce = gate_log_nonce();
	if (loaded_space != 0 && nonce == loaded_nonce)
		return loaded_space;
	space = gate_store_space(nonce, &rebuild_as, &loaded);
	if (TransactionIdIsValid(rebuild_as))
		replay(space, rebuild_as, now);
	if (loaded)
	{
		loaded_nonce = nonce;
		loaded_space = space;
	}
	return space;
}

/*
 * Replay the log into the shared table, as passes made by this
 * transaction.  Must run inside SPI.
 */
static void
replay(uint32 space, TransactionId xid, TimestampTz now)
{
	Portal		portal;

	gatekeeper_plan(&replay_plan, replay_sql, 0, NULL);

	/* every row committed so far, whatever this transaction's snapshot */
	PushActiveSnapshot(GetLatestSnapshot());
	portal = SPI_cursor_open(NULL, replay_plan, NULL, NULL, true);
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
				int64		holder = no_holders || hn[i] ? 0 : DatumGetInt64(hv[i]);
				bool		holder_null = no_holders || hn[i];
				char	   *recipient = TextDatumGetCString(rv[i]);

				CHECK_FOR_INTERRUPTS();
				memset(&key, 0, sizeof(key));
				key.space = space;
				key.gate = gate;
				key.hash = gate_store_hash(recipient);
				pfree(recipient);
				if (released)
				{
					if (holder_null)
						continue;
					e = gate_entry_find(&key, true);
					if (e == NULL)
						continue;
					gate_entry_forget(e, holder, xid);
					gate_entry_unlock(e);
					continue;
				}
				e = gate_entry_find_or_make(&key, now);
				e->locker = xid;

				/*
				 * A holder holds one pass of a gate: a log written before
				 * re-passes stopped being logged (0.1.0) may name it again.
				 */
				if (!holder_null && gate_entry_has_holder(e, holder))
				{
					gate_entry_unlock(e);
					continue;
				}

				/*
				 * A gate decides on at most GATE_MAX_SENDS passes: more (in
				 * a log an older version wrote) would change nothing.
				 */
				if (e->npass < GATE_MAX_SENDS &&
					gate_entry_add(e, expires, holder, holder_null, xid) != GATE_ADD_OK)
				{
					gate_entry_unlock(e);
					gate_store_memory_full();
				}
				gate_entry_unlock(e);
			}
		}
		SPI_freetuptable(SPI_tuptable);
	}
	SPI_cursor_close(portal);
	PopActiveSnapshot();
	gate_store_unreserve();
}

/*
 * gate_log_add
 *		Add one recipient to the log group of (gate, kind, expiry), making
 *		the group if need be.
 */
void
gate_log_add(List **groups, int32 gate, bool released, TimestampTz expires,
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
 * gate_log_write
 *		Write the log rows of a call.  Must run inside SPI.
 */
void
gate_log_write(List *groups)
{
	Oid			types[5] = {INT4OID, BOOLOID, TIMESTAMPTZOID, TEXTARRAYOID, INT8ARRAYOID};
	ListCell   *lc;

	if (groups == NIL)
		return;
	gatekeeper_plan(&log_insert_plan, log_insert_sql, 5, types);
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
		if (SPI_execute_plan(log_insert_plan, args, nulls, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "could not write the gate log");
	}
}

/*
 * gate_log_passes
 *		One recipient's (its key's) live passes at one gate, from the log
 *		rows this transaction's snapshot sees, as a replay would leave them:
 *		for the read-only looks on a hot standby, where the shared store is
 *		not kept.  Fills palloc'd arrays and returns how many passes.  A
 *		scan of the gate's unexpired log: a standby's look is slower than a
 *		primary's.  Must run inside SPI.
 */
int
gate_log_passes(int32 gate, const char *recipient, TimestampTz now,
				TimestampTz **expires, int64 **holders, bool **holder_null)
{
	Oid			types[3] = {INT4OID, TIMESTAMPTZOID, TEXTOID};
	Datum		args[3];
	int			n = 0;
	uint64		r;

	args[0] = Int32GetDatum(gate);
	args[1] = TimestampTzGetDatum(now);
	args[2] = CStringGetTextDatum(recipient);
	gatekeeper_plan(&passes_plan, passes_sql, 3, types);
	if (SPI_execute_plan(passes_plan, args, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read the gate log");

	*expires = palloc(Max(SPI_processed, 1) * sizeof(TimestampTz));
	*holders = palloc(Max(SPI_processed, 1) * sizeof(int64));
	*holder_null = palloc(Max(SPI_processed, 1) * sizeof(bool));
	for (r = 0; r < SPI_processed; r++)
	{
		HeapTuple	tup = SPI_tuptable->vals[r];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		bool		released = DatumGetBool(SPI_getbinval(tup, desc, 1, &isnull));
		TimestampTz expiry = DatumGetTimestampTz(SPI_getbinval(tup, desc, 2, &isnull));
		Datum		hd = SPI_getbinval(tup, desc, 3, &isnull);
		int64		holder = isnull ? 0 : DatumGetInt64(hd);
		bool		no_holder = isnull;
		int			i;

		/* as replay(): a release names its holder; a holder passes once */
		if (released)
		{
			if (no_holder)
				continue;
			for (i = 0; i < n; i++)
				if (!(*holder_null)[i] && (*holders)[i] == holder)
					break;
			if (i < n)
			{
				n--;
				(*expires)[i] = (*expires)[n];
				(*holders)[i] = (*holders)[n];
				(*holder_null)[i] = (*holder_null)[n];
			}
			continue;
		}
		if (!no_holder)
		{
			for (i = 0; i < n; i++)
				if (!(*holder_null)[i] && (*holders)[i] == holder)
					break;
			if (i < n)
				continue;
		}
		if (n >= GATE_MAX_SENDS)
			continue;
		(*expires)[n] = expiry;
		(*holders)[n] = holder;
		(*holder_null)[n] = no_holder;
		n++;
	}
	SPI_freetuptable(SPI_tuptable);
	return n;
}
