/*-------------------------------------------------------------------------
 *
 * gate.c
 *		Gates: at most max_sends passes per recipient within a period.  The
 *		decisions the claim and the gate functions make over one
 *		recipient's passes at one gate, on top of the shared store
 *		(gate_store.c) and the log (gate_log.c).
 *
 * A caller locks the entries of (recipient, gate) pairs, sees their live
 * passes, decides, and writes back what changed: new passes are made,
 * passes given back are stamped with this transaction, and both are
 * logged.  Every caller locks its entries in one global order, byte order
 * of (recipient, gate), so crossed batches cannot deadlock.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "gate.h"
#include "gate_log.h"
#include "gate_store.h"

#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "address.h"
#include "catalog.h"
#include "gatekeeper.h"
#include "keep_freed.h"

/* Distinct recipients release_passes handles in one round. */
#define RELEASE_CHUNK	1024

static const char gate_ids_sql[] =
"SELECT id FROM gatekeeper.gate ORDER BY id";

static SPIPlanPtr gate_ids_plan = NULL;

/* A pass to give back: one mail's passes for one recipient. */
typedef struct Release
{
	char	   *key;
	int64		holder;
} Release;

static void row_key(GatePasses *row, uint32 space, GateKey *key);
static void row_reserve(GatePasses *row, int n);
static void row_load(GatePasses *row, GateEntry *e);
static int	expiry_cmp(const void *a, const void *b);
static int	text_then_number_cmp(const char *xs, int64 xn, const char *ys, int64 yn);
static int	release_cmp(const void *a, const void *b);
static int	release_chunk(Release *rel, int n, int32 *gates, int ngates, TimestampTz now);

/*
 * gatekeeper_gate_passes_cmp
 *		qsort/bsearch order: byte order of recipient, then gate.  This is
 *		the one order in which every transaction locks gate entries.
 */
int
gatekeeper_gate_passes_cmp(const void *a, const void *b)
{
	const GatePasses *x = (const GatePasses *) a;
	const GatePasses *y = (const GatePasses *) b;

	return text_then_number_cmp(x->recipient, x->gate, y->recipient, y->gate);
}

/*
 * The order of two (text, number) pairs: by the texts' bytes, then by
 * the numbers.
 */
static int
text_then_number_cmp(const char *xs, int64 xn, const char *ys, int64 yn)
{
	int			c = strcmp(xs, ys);

	if (c != 0)
		return c;
	return (xn > yn) - (xn < yn);
}

/*
 * The key of a row's entry in a space; the recipient's hash is computed
 * once per row.
 */
static void
row_key(GatePasses *row, uint32 space, GateKey *key)
{
	if (!row->hashed)
	{
		row->hash = gate_store_hash(row->recipient);
		row->hashed = true;
	}
	memset(key, 0, sizeof(GateKey));
	key->space = space;
	key->gate = row->gate;
	key->hash = row->hash;
}

/*
 * Make room for more passes in a row.
 */
static void
row_reserve(GatePasses *row, int n)
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
row_load(GatePasses *row, GateEntry *e)
{
	GatePass   *p = gate_entry_passes(e);
	int			i;

	row->n = 0;
	row_reserve(row, e->npass);
	for (i = 0; i < e->npass; i++)
	{
		if (TransactionIdIsValid(p[i].xmax))
			continue;			/* given back by this transaction */
		row->expires[row->n] = gate_pass_expires(&p[i]);
		row->holders[row->n] = p[i].holder;
		row->holder_null[row->n] = gate_pass_no_holder(&p[i]);
		row->slots[row->n] = i;
		row->n++;
	}
}

/*
 * gatekeeper_gate_lock
 *		Lock the gate entries of rows[0..n-1], in their order, which must be
 *		gatekeeper_gate_passes_cmp's, without duplicates; wait for
 *		transactions in progress that hold them.  On return each row holds
 *		its live passes, and the entries stay locked by this transaction
 *		until it ends.  Must run inside SPI.
 *
 * Without create, rows with no entry are marked missing.  With create
 * (the claim), missing entries are made, and each entry gets room for
 * row->room more passes, so that gatekeeper_gate_write cannot run out of
 * memory; a row for which gatekeeper.gate_memory has no room is marked
 * nomem instead, and its caller must not pass through it.
 */
void
gatekeeper_gate_lock(GatePasses *rows, int n, TimestampTz now, bool create)
{
	uint32		space;
	TransactionId xid;
	int			i;

	if (n == 0)
		return;
	space = gate_log_space(now);
	xid = gate_store_my_xid();

	for (i = 0; i < n; i++)
	{
		GatePasses *row = &rows[i];
		GateKey		key;
		GateEntry  *e;
		bool		made;
		bool		can_make;

		CHECK_FOR_INTERRUPTS();
		row_key(row, space, &key);
		row->changed = false;
		row->missing = false;
		row->nomem = false;
		row->n = 0;
		can_make = create && gate_store_reserve_entries(n - i);
		e = gate_entry_lock(&key, can_make, xid, now, &made);
		if (e == NULL)
		{
			if (create)
				row->nomem = true;
			else
				row->missing = true;
			continue;
		}
		if (create && row->room > 0 && !gate_entry_room(e, row->room))
			row->nomem = true;
		row_load(row, e);
		gate_entry_unlock(e);
	}
	gate_store_unreserve();
}

/*
 * gatekeeper_gate_try
 *		Pass one caller through a locked row if the gate allows it.
 *
 * A holder that already has a live pass re-passes without counting twice.
 * Returns whether the caller passed; a new pass is added to the row.
 */
bool
gatekeeper_gate_try(GatePasses *row, int max_sends,
					TimestampTz expiry, int64 holder, bool holder_null)
{
	int			i;

	if (!holder_null)
	{
		for (i = 0; i < row->n; i++)
			if (!row->holder_null[i] && row->holders[i] == holder)
				return true;
	}
	if (row->n >= Min(max_sends, GATE_MAX_SENDS))
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
gatekeeper_gate_reopens(const GatePasses *row, int max_sends)
{
	TimestampTz *sorted;
	TimestampTz result;

	max_sends = Min(max_sends, GATE_MAX_SENDS);
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
gatekeeper_gate_release_holder(GatePasses *row, int64 holder)
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
 * gatekeeper_gate_write
 *		Write back the rows whose passes changed: passes a row gained are
 *		made, passes it lost are given back, both stamped with this
 *		transaction, and the changes are logged.  Must run inside SPI, in
 *		the transaction that locked the rows.
 */
void
gatekeeper_gate_write(GatePasses *rows, int n, TimestampTz now)
{
	uint32		space = 0;
	TransactionId xid = InvalidTransactionId;
	List	   *groups = NIL;
	bool	   *kept = NULL;
	int			nkept = 0;
	int			i;

	for (i = 0; i < n; i++)
	{
		GatePasses *row = &rows[i];
		GateKey		key;
		GateEntry  *e;
		GatePass   *p;
		int			j;

		if (!row->changed || row->missing || row->nomem)
			continue;
		if (space == 0)
		{
			space = gate_log_space(now);
			xid = gate_store_my_xid();
		}
		row_key(row, space, &key);
		e = gate_entry_find(&key, true);
		if (e == NULL || e->locker != xid)
			elog(ERROR, "gate entry for \"%s\" is not locked", row->recipient);
		p = gate_entry_passes(e);

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
			gate_log_add(&groups, row->gate, true, gate_pass_expires(&p[j]), row->recipient,
						 p[j].holder, gate_pass_no_holder(&p[j]));
		}

		/* and the new ones made */
		for (j = 0; j < row->n; j++)
		{
			GateAddResult r;

			if (row->slots[j] >= 0)
				continue;
			r = gate_entry_add(e, row->expires[j], row->holders[j], row->holder_null[j], xid);
			if (r != GATE_ADD_OK)
			{
				gate_entry_unlock(e);
				if (r == GATE_ADD_TOO_MANY)
					gate_store_too_many();
				gate_store_memory_full();
			}
			row->slots[j] = e->npass - 1;
			gate_log_add(&groups, row->gate, false, row->expires[j], row->recipient,
						 row->holders[j], row->holder_null[j]);
		}
		gate_entry_unlock(e);
		row->changed = false;
	}
	gate_log_write(groups);
}

/*
 * gatekeeper_gate_peek
 *		Read one row without locking it, for the read-only looks: the
 *		passes made by committed transactions or this one, not given back.
 */
void
gatekeeper_gate_peek(GatePasses *row, TimestampTz now)
{
	uint32		space;
	GateKey		key;
	GateEntry  *e;
	GatePass   *p;
	int			i;

	row->n = 0;
	if (RecoveryInProgress())
	{
		/* a hot standby keeps no store: the replicated log has the passes */
		TimestampTz *expires;
		int64	   *holders;
		bool	   *holder_null;
		int			n = gate_log_passes(row->gate, row->recipient, now,
										&expires, &holders, &holder_null);

		row_reserve(row, n);
		for (i = 0; i < n; i++)
		{
			row->expires[i] = expires[i];
			row->holders[i] = holders[i];
			row->holder_null[i] = holder_null[i];
			row->slots[i] = -1;
		}
		row->n = n;
		return;
	}
	space = gate_log_space(now);
	row_key(row, space, &key);
	e = gate_entry_find(&key, false);
	if (e == NULL)
		return;
	p = gate_entry_passes(e);
	row_reserve(row, e->npass);
	for (i = 0; i < e->npass; i++)
	{
		if (!gate_pass_visible(&p[i], now))
			continue;
		row->expires[row->n] = gate_pass_expires(&p[i]);
		row->holders[row->n] = p[i].holder;
		row->holder_null[row->n] = gate_pass_no_holder(&p[i]);
		row->slots[row->n] = i;
		row->n++;
	}
	gate_entry_unlock(e);
}

/*
 * gatekeeper_gate_pass_rows
 *		Pass rows[0..n-1] (sorted by gatekeeper_gate_passes_cmp, unique)
 *		through one gate, each entry locked, decided and written under one
 *		acquisition of its partition lock: up to want[i] new passes for
 *		rows[i], as many as the gate has room for.  A holder (for a single
 *		caller) that already has a live pass passes again without a new
 *		one.  Sets granted[i] and logs the passes made.  This is gate_pass's
 *		path; the claim, which decides over many gates at once, locks first
 *		and writes after.  Raises 53200 when gatekeeper.gate_memory has no
 *		room.  Must run inside SPI.
 */
void
gatekeeper_gate_pass_rows(GatePasses *rows, int n, const GateDef *def, const int *want,
					 int64 holder, bool holder_null, int *granted, TimestampTz now)
{
	uint32		space;
	TransactionId xid;
	List	   *groups = NIL;
	int			max_sends = Min(def->max_sends, GATE_MAX_SENDS);
	int			i;

	if (n == 0)
		return;
	gatekeeper_keep_freed_memory();
	space = gate_log_space(now);
	xid = gate_store_my_xid();

	for (i = 0; i < n; i++)
	{
		GatePasses *row = &rows[i];
		GateKey		key;
		GateEntry  *e;
		GatePass   *p;
		bool		made;
		int			live = 0;
		int			added = 0;
		int			j;

		CHECK_FOR_INTERRUPTS();
		granted[i] = 0;
		row_key(row, space, &key);
		if (!gate_store_reserve_entries(n - i))
			gate_store_memory_full();
		e = gate_entry_lock(&key, true, xid, now, &made);
		p = gate_entry_passes(e);
		for (j = 0; j < e->npass; j++)
		{
			if (TransactionIdIsValid(p[j].xmax))
				continue;		/* given back by this transaction */
			if (!holder_null && gate_pass_has_holder(&p[j], holder))
				granted[i] = want[i];
			live++;
		}
		while (granted[i] < want[i] && live < max_sends)
		{
			GateAddResult r = gate_entry_add(e, def->expiry, holder, holder_null, xid);

			if (r != GATE_ADD_OK)
			{
				gate_entry_unlock(e);
				if (r == GATE_ADD_TOO_MANY)
					gate_store_too_many();
				gate_store_memory_full();
			}
			granted[i]++;
			live++;
			added++;
		}
		gate_entry_unlock(e);
		/* log the passes made, not one its holder held already */
		for (j = 0; j < added; j++)
			gate_log_add(&groups, def->id, false, def->expiry, row->recipient, holder, holder_null);
	}
	gate_store_unreserve();
	gate_log_write(groups);
}

/*
 * gatekeeper_gate_ids
 *		The ids of every gate, ascending.  Must run inside SPI.
 */
int32 *
gatekeeper_gate_ids(int *ngates)
{
	int32	   *ids;
	uint64		r;

	gatekeeper_plan(&gate_ids_plan, gate_ids_sql, 0, NULL);
	if (SPI_execute_plan(gate_ids_plan, NULL, NULL, true, 0) != SPI_OK_SELECT)
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
 * gatekeeper_gate_held
 *		Does the row's entry hold an unexpired pass, live, being made or
 *		being given back, of holder?  A look without locking, to find what
 *		to lock.  Must run inside SPI.
 */
bool
gatekeeper_gate_held(GatePasses *row, int64 holder, TimestampTz now)
{
	uint32		space = gate_log_space(now);
	GateKey		key;
	GateEntry  *e;
	GatePass   *p;
	bool		hit = false;
	int			i;

	row_key(row, space, &key);
	e = gate_entry_find(&key, false);
	if (e == NULL)
		return false;
	p = gate_entry_passes(e);
	for (i = 0; i < e->npass && !hit; i++)
		hit = gate_pass_has_holder(&p[i], holder) && gate_pass_expires(&p[i]) > now;
	gate_entry_unlock(e);
	return hit;
}

/*
 * qsort order of releases: by key, then holder.
 */
static int
release_cmp(const void *a, const void *b)
{
	const Release *x = (const Release *) a;
	const Release *y = (const Release *) b;

	return text_then_number_cmp(x->key, x->holder, y->key, y->holder);
}

/*
 * Release the passes of rel[0..n-1] (sorted, and n covering whole
 * recipients) in every gate.  Returns how many live passes went.
 */
static int
release_chunk(Release *rel, int n, int32 *gates, int ngates, TimestampTz now)
{
	GatePasses *rows = NULL;
	int			nrows = 0;
	int			maxrows = 0;
	int			released = 0;
	int			i;
	int			j;

	/* the (recipient, gate) entries where one of the holders has a pass */
	for (i = 0; i < n; i++)
	{
		for (j = 0; j < ngates; j++)
		{
			GatePasses probe;
			int			k;
			bool		hit = false;

			memset(&probe, 0, sizeof(probe));
			probe.recipient = rel[i].key;
			probe.gate = gates[j];
			if (nrows > 0 && gatekeeper_gate_passes_cmp(&rows[nrows - 1], &probe) == 0)
				continue;
			for (k = i; k < n && strcmp(rel[k].key, rel[i].key) == 0 && !hit; k++)
				hit = gatekeeper_gate_held(&probe, rel[k].holder, now);
			if (!hit)
				continue;
			if (nrows == maxrows)
			{
				maxrows = Max(16, maxrows * 2);
				rows = rows ? repalloc(rows, maxrows * sizeof(GatePasses))
					: palloc(maxrows * sizeof(GatePasses));
			}
			rows[nrows++] = probe;
		}
		while (i + 1 < n && strcmp(rel[i + 1].key, rel[i].key) == 0)
			i++;
	}
	if (nrows == 0)
		return 0;

	/* rel is sorted by key and gates ascending: rows are in lock order */
	gatekeeper_gate_lock(rows, nrows, now, false);
	j = 0;
	for (i = 0; i < nrows; i++)
	{
		int			k;

		while (strcmp(rel[j].key, rows[i].recipient) < 0)
			j++;
		for (k = j; k < n && strcmp(rel[k].key, rows[i].recipient) == 0; k++)
			released += gatekeeper_gate_release_holder(&rows[i], rel[k].holder);
	}
	gatekeeper_gate_write(rows, nrows, now);
	for (i = 0; i < nrows; i++)
		if (rows[i].expires != NULL)
		{
			pfree(rows[i].expires);
			pfree(rows[i].holders);
			pfree(rows[i].holder_null);
			pfree(rows[i].slots);
		}
	pfree(rows);
	return released;
}

/*
 * gatekeeper_release_passes
 *		Give back every pass the given mails hold, in every gate, whatever
 *		their queues' gates are now.  The entries are locked in the global
 *		order of (recipient, gate), a chunk of recipients at a time in
 *		ascending order (so still in that order), so releasing for many
 *		recipients at once (a reap, a batch of failures) cannot deadlock
 *		against claims, and its memory is bounded by the chunk.  Only
 *		entries that hold one of the mails' passes are locked.  Returns how
 *		many live passes were released.  Must run inside SPI.
 */
int
gatekeeper_release_passes(char **recipients, int64 *holders, int n)
{
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	Release    *rel;
	int32	   *gates;
	int			ngates;
	int			released = 0;
	int			start;
	int			i;

	if (n == 0)
		return 0;
	gates = gatekeeper_gate_ids(&ngates);
	if (ngates == 0)
		return 0;
	rel = palloc(n * sizeof(Release));
	for (i = 0; i < n; i++)
	{
		rel[i].key = gatekeeper_recipient_key(recipients[i]);
		rel[i].holder = holders[i];
	}
	qsort(rel, n, sizeof(Release), release_cmp);

	for (start = 0; start < n;)
	{
		int			end = start;
		int			distinct = 0;

		while (end < n && distinct < RELEASE_CHUNK)
		{
			distinct++;
			end++;
			while (end < n && strcmp(rel[end].key, rel[end - 1].key) == 0)
				end++;
		}
		CHECK_FOR_INTERRUPTS();
		released += release_chunk(rel + start, end - start, gates, ngates, now);
		start = end;
	}
	return released;
}

/*
 * gatekeeper_gate_memory_warning
 *		Say that a claim deferred gated mail because gatekeeper.gate_memory
 *		had no room, and count it in gatekeeper.gate_memory.
 */
void
gatekeeper_gate_memory_warning(int deferred)
{
	gate_store_count_refusals(deferred);
	ereport(WARNING,
			(errcode(ERRCODE_OUT_OF_MEMORY),
			 errmsg_plural("gatekeeper gate memory is full: %d gated mail deferred",
						   "gatekeeper gate memory is full: %d gated mails deferred",
						   deferred, deferred),
			 errdetail("gatekeeper.gate_memory is %d kB; mail that is not gated is not affected, and the deferred mail is retried.",
					   gatekeeper_gate_memory),
			 errhint("Raise gatekeeper.gate_memory and restart the server, or shorten the gates' periods.")));
}
