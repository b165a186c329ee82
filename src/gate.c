/*-------------------------------------------------------------------------
 *
 * gate.c
 *		Gates: at most max_sends passes per recipient within a period.
 *
 * A gate's state for one recipient is one row of gatekeeper.gate_pass: the
 * expiry of each live pass (stamped with the period in force when it was
 * made) and the mail holding it.  The row is the lock: whoever holds it
 * decides, so of any number of concurrent callers exactly as many as the
 * gate allows get through, and callers for other recipients never wait on
 * each other.
 *
 * Every caller takes its rows in one global order, byte order of
 * (recipient, gate), with a single INSERT ... ON CONFLICT DO UPDATE ...
 * WHERE false: a new row is created already holding the pass its first
 * caller wants, an existing row is locked without being written.  The
 * caller then decides in memory and writes back only the rows whose
 * passes changed, so a batch of new recipients costs one insert each.
 *
 *-------------------------------------------------------------------------
 */
#include "gatekeeper.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

PG_FUNCTION_INFO_V1(gatekeeper_gate_pass);
PG_FUNCTION_INFO_V1(gatekeeper_gate_pass_batch);
PG_FUNCTION_INFO_V1(gatekeeper_gate_open);
PG_FUNCTION_INFO_V1(gatekeeper_gate_next_open);
PG_FUNCTION_INFO_V1(gatekeeper_gate_release);
PG_FUNCTION_INFO_V1(gatekeeper_release_mail);
PG_FUNCTION_INFO_V1(gatekeeper_release_mails);
PG_FUNCTION_INFO_V1(gatekeeper_explain);

static SPIPlanPtr lock_plan = NULL;
static SPIPlanPtr read_plan = NULL;
static SPIPlanPtr write_plan = NULL;

/* A gate's definition. */
typedef struct GateDef
{
	int32		id;
	int32		max_sends;
	TimestampTz expiry;			/* now() + period: when a pass made now expires */
} GateDef;

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
 *		This is the one order in which every transaction locks gate rows.
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
 * Make room for one more pass in a row.
 */
static void
row_reserve(GateRow *row, int n)
{
	if (n <= row->cap)
		return;
	row->cap = Max(n, 4);
	if (row->expires == NULL)
	{
		row->expires = palloc(row->cap * sizeof(TimestampTz));
		row->holders = palloc(row->cap * sizeof(int64));
		row->holder_null = palloc(row->cap * sizeof(bool));
	}
	else
	{
		row->expires = repalloc(row->expires, row->cap * sizeof(TimestampTz));
		row->holders = repalloc(row->holders, row->cap * sizeof(int64));
		row->holder_null = repalloc(row->holder_null, row->cap * sizeof(bool));
	}
}

/*
 * Load a row's passes from its arrays, dropping those that expired.
 * Dropping alone does not mark the row changed: an expired pass left in
 * the table is harmless, and purge() removes rows whose passes all
 * expired.
 */
static void
row_load(GateRow *row, Datum expires, Datum holders, TimestampTz now)
{
	ArrayType  *ea = DatumGetArrayTypeP(expires);
	ArrayType  *ha = DatumGetArrayTypeP(holders);
	Datum	   *ev;
	Datum	   *hv;
	bool	   *en;
	bool	   *hn;
	int			ne;
	int			nh;
	int			i;

	deconstruct_array(ea, TIMESTAMPTZOID, sizeof(TimestampTz), true, TYPALIGN_DOUBLE,
					  &ev, &en, &ne);
	deconstruct_array(ha, INT8OID, sizeof(int64), true, TYPALIGN_DOUBLE,
					  &hv, &hn, &nh);
	if (ne != nh)
		elog(ERROR, "gate_pass row for \"%s\" has %d expiries but %d holders",
			 row->recipient, ne, nh);
	row->n = 0;
	row_reserve(row, ne);
	for (i = 0; i < ne; i++)
	{
		if (en[i] || DatumGetTimestampTz(ev[i]) <= now)
			continue;
		row->expires[row->n] = DatumGetTimestampTz(ev[i]);
		row->holders[row->n] = hn[i] ? 0 : DatumGetInt64(hv[i]);
		row->holder_null[row->n] = hn[i];
		row->n++;
	}
}

/*
 * gatekeeper_gate_lock
 *		Lock the gate rows of rows[0..n-1], creating those that do not exist
 *		with their first_* pass.  rows must be sorted by
 *		gatekeeper_gate_row_cmp and unique.  On return each row holds its
 *		live passes as they were before this call; rows created here are
 *		marked inserted and start empty.
 *
 * Must run inside SPI.
 */
void
gatekeeper_gate_lock(GateRow *rows, int n, TimestampTz now)
{
	Datum	   *keys;
	Datum	   *gates;
	Datum	   *expiries;
	Datum	   *holders;
	bool	   *holder_nulls;
	Datum		args[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};
	int			i;
	int			missing;
	uint64		r;

	if (n == 0)
		return;

	if (lock_plan == NULL)
	{
		Oid			types[4] = {TEXTARRAYOID, INT4ARRAYOID, TIMESTAMPTZARRAYOID, INT8ARRAYOID};

		lock_plan = gatekeeper_keep_plan(
							  "INSERT INTO gatekeeper.gate_pass AS g (recipient, gate, expires, holders, until) "
							  "SELECT u.recipient, u.gate, ARRAY[u.expiry], ARRAY[u.holder], u.expiry "
							  "  FROM unnest($1, $2, $3, $4) AS u(recipient, gate, expiry, holder) "
							  "ON CONFLICT (recipient, gate) DO UPDATE SET until = g.until WHERE false "
							  "RETURNING g.recipient, g.gate",
							  4, types);
	}

	keys = palloc(n * sizeof(Datum));
	gates = palloc(n * sizeof(Datum));
	expiries = palloc(n * sizeof(Datum));
	holders = palloc(n * sizeof(Datum));
	holder_nulls = palloc(n * sizeof(bool));
	for (i = 0; i < n; i++)
	{
		keys[i] = CStringGetTextDatum(rows[i].recipient);
		gates[i] = Int32GetDatum(rows[i].gate);
		expiries[i] = TimestampTzGetDatum(rows[i].first_expiry);
		holders[i] = Int64GetDatum(rows[i].first_holder);
		holder_nulls[i] = rows[i].first_holder_null;
		rows[i].n = 0;
		rows[i].inserted = false;
		rows[i].changed = false;
	}
	args[0] = gatekeeper_array(keys, NULL, n, TEXTOID);
	args[1] = gatekeeper_array(gates, NULL, n, INT4OID);
	args[2] = gatekeeper_array(expiries, NULL, n, TIMESTAMPTZOID);
	args[3] = gatekeeper_array(holders, holder_nulls, n, INT8OID);

	if (SPI_execute_plan(lock_plan, args, nulls, false, 0) != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "could not lock gate rows");

	for (r = 0; r < SPI_processed; r++)
	{
		GateRow		probe = {0};
		GateRow    *row;
		bool		isnull;

		probe.recipient = TextDatumGetCString(SPI_getbinval(SPI_tuptable->vals[r],
															SPI_tuptable->tupdesc, 1, &isnull));
		probe.gate = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[r],
												 SPI_tuptable->tupdesc, 2, &isnull));
		row = bsearch(&probe, rows, n, sizeof(GateRow), gatekeeper_gate_row_cmp);
		if (row == NULL)
			elog(ERROR, "gate row for \"%s\" inserted but not asked for", probe.recipient);
		row->inserted = true;
	}
	missing = n - (int) SPI_processed;
	SPI_freetuptable(SPI_tuptable);
	if (missing == 0)
		return;

	/* read the rows that existed; we hold them locked now */
	if (read_plan == NULL)
	{
		Oid			types[2] = {TEXTARRAYOID, INT4ARRAYOID};

		read_plan = gatekeeper_keep_plan(
							  "SELECT g.recipient, g.gate, g.expires, g.holders "
							  "  FROM gatekeeper.gate_pass g "
							  " WHERE g.recipient = ANY ($1 COLLATE \"C\") AND g.gate = ANY ($2)",
							  2, types);
	}
	{
		int			k = 0;

		for (i = 0; i < n; i++)
		{
			if (rows[i].inserted)
				continue;
			keys[k] = CStringGetTextDatum(rows[i].recipient);
			gates[k] = Int32GetDatum(rows[i].gate);
			k++;
		}
		args[0] = gatekeeper_array(keys, NULL, k, TEXTOID);
		args[1] = gatekeeper_array(gates, NULL, k, INT4OID);
	}
	/*
	 * Not read-only: the rows must be read with a snapshot taken now, after
	 * we got their locks, or a pass committed since the caller's snapshot
	 * would be missed.
	 */
	if (gatekeeper_execute_by_key(read_plan, args, nulls, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read gate rows");
	for (r = 0; r < SPI_processed; r++)
	{
		HeapTuple	tup = SPI_tuptable->vals[r];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		GateRow		probe = {0};
		GateRow    *row;
		bool		isnull;

		probe.recipient = TextDatumGetCString(SPI_getbinval(tup, desc, 1, &isnull));
		probe.gate = DatumGetInt32(SPI_getbinval(tup, desc, 2, &isnull));
		row = bsearch(&probe, rows, n, sizeof(GateRow), gatekeeper_gate_row_cmp);
		if (row == NULL || row->inserted)
			continue;			/* a row of the cross product we did not ask for */
		row_load(row,
				 SPI_getbinval(tup, desc, 3, &isnull),
				 SPI_getbinval(tup, desc, 4, &isnull),
				 now);
	}
	SPI_freetuptable(SPI_tuptable);
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
 * Does the table already hold exactly this row's passes?  True for a row
 * that the locking INSERT created with the one pass it ends up with.
 */
static bool
row_is_written(const GateRow *row)
{
	if (!row->inserted)
		return !row->changed;
	return row->n == 1 &&
		row->expires[0] == row->first_expiry &&
		row->holder_null[0] == row->first_holder_null &&
		(row->first_holder_null || row->holders[0] == row->first_holder);
}

/*
 * gatekeeper_gate_write
 *		Write back the rows whose passes differ from the table.  Must run
 *		inside SPI, in the transaction that locked the rows.
 */
void
gatekeeper_gate_write(GateRow *rows, int n, TimestampTz now)
{
	Datum	   *keys;
	Datum	   *gates;
	Datum	   *los;
	Datum	   *his;
	Datum	   *untils;
	Datum	   *expiries;
	Datum	   *holders;
	bool	   *holder_nulls;
	int			total = 0;
	int			k = 0;
	int			m = 0;
	int			i;
	int			j;
	Datum		args[7];

	for (i = 0; i < n; i++)
		if (!row_is_written(&rows[i]))
			total += rows[i].n, k++;
	if (k == 0)
		return;

	if (write_plan == NULL)
	{
		Oid			types[7] = {TEXTARRAYOID, INT4ARRAYOID, TIMESTAMPTZARRAYOID, INT8ARRAYOID,
		INT4ARRAYOID, INT4ARRAYOID, TIMESTAMPTZARRAYOID};

		write_plan = gatekeeper_keep_plan(
							   "UPDATE gatekeeper.gate_pass g "
							   "   SET expires = $3[u.lo:u.hi], holders = $4[u.lo:u.hi], until = u.until "
							   "  FROM unnest($1, $2, $5, $6, $7) AS u(recipient, gate, lo, hi, until) "
							   " WHERE g.recipient = u.recipient COLLATE \"C\" AND g.gate = u.gate",
							   7, types);
	}

	keys = palloc(k * sizeof(Datum));
	gates = palloc(k * sizeof(Datum));
	los = palloc(k * sizeof(Datum));
	his = palloc(k * sizeof(Datum));
	untils = palloc(k * sizeof(Datum));
	expiries = palloc(Max(total, 1) * sizeof(Datum));
	holders = palloc(Max(total, 1) * sizeof(Datum));
	holder_nulls = palloc(Max(total, 1) * sizeof(bool));
	k = 0;
	for (i = 0; i < n; i++)
	{
		GateRow    *row = &rows[i];
		TimestampTz until = now;

		if (row_is_written(row))
			continue;
		keys[k] = CStringGetTextDatum(row->recipient);
		gates[k] = Int32GetDatum(row->gate);
		los[k] = Int32GetDatum(m + 1);
		for (j = 0; j < row->n; j++)
		{
			expiries[m] = TimestampTzGetDatum(row->expires[j]);
			holders[m] = Int64GetDatum(row->holders[j]);
			holder_nulls[m] = row->holder_null[j];
			until = Max(until, row->expires[j]);
			m++;
		}
		his[k] = Int32GetDatum(m);
		untils[k] = TimestampTzGetDatum(until);
		k++;
	}

	args[0] = gatekeeper_array(keys, NULL, k, TEXTOID);
	args[1] = gatekeeper_array(gates, NULL, k, INT4OID);
	args[2] = gatekeeper_array(expiries, NULL, m, TIMESTAMPTZOID);
	args[3] = gatekeeper_array(holders, holder_nulls, m, INT8OID);
	args[4] = gatekeeper_array(los, NULL, k, INT4OID);
	args[5] = gatekeeper_array(his, NULL, k, INT4OID);
	args[6] = gatekeeper_array(untils, NULL, k, TIMESTAMPTZOID);

	if (gatekeeper_execute_by_key(write_plan, args, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "could not write gate rows");
	if (SPI_processed != (uint64) k)
		elog(ERROR, "wrote %llu gate rows, expected %d",
			 (unsigned long long) SPI_processed, k);
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

	if (*s == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("recipient must not be empty")));
	return gatekeeper_recipient_key(s);
}

/*
 * Read one gate row without locking it, for the read-only peeks.
 */
static void
read_row(GateRow *row, TimestampTz now)
{
	static SPIPlanPtr plan = NULL;
	Datum		args[2];
	bool		isnull;

	if (plan == NULL)
	{
		Oid			types[2] = {TEXTOID, INT4OID};

		plan = gatekeeper_keep_plan("SELECT expires, holders FROM gatekeeper.gate_pass "
						 " WHERE recipient = $1 COLLATE \"C\" AND gate = $2",
						 2, types);
	}
	args[0] = CStringGetTextDatum(row->recipient);
	args[1] = Int32GetDatum(row->gate);
	if (gatekeeper_execute_by_key(plan, args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read gate row");
	row->n = 0;
	if (SPI_processed > 0)
		row_load(row,
				 SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull),
				 SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull),
				 now);
	SPI_freetuptable(SPI_tuptable);
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
	bool		passed;

	require_arg(fcinfo, 0, "gate");
	require_arg(fcinfo, 1, "recipient");

	SPI_connect();
	def = lookup_gate(PG_GETARG_TEXT_PP(0));
	memset(&row, 0, sizeof(row));
	row.recipient = recipient_arg(PG_GETARG_TEXT_PP(1));
	row.gate = def.id;
	row.first_expiry = def.expiry;
	row.first_holder_null = PG_ARGISNULL(2);
	row.first_holder = PG_ARGISNULL(2) ? 0 : PG_GETARG_INT64(2);

	gatekeeper_gate_lock(&row, 1, now);
	passed = gatekeeper_gate_try(&row, def.max_sends, def.expiry,
								 row.first_holder, row.first_holder_null);
	gatekeeper_gate_write(&row, 1, now);
	SPI_finish();

	PG_RETURN_BOOL(passed);
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
	char	  **keys;
	GateRow    *rows;
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

	keys = palloc(Max(nelems, 1) * sizeof(char *));
	rows = palloc0(Max(nelems, 1) * sizeof(GateRow));
	for (i = 0; i < nelems; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("recipients must not contain nulls")));
		keys[i] = recipient_arg(DatumGetTextPP(elems[i]));
		rows[i].recipient = keys[i];
		rows[i].gate = def.id;
		rows[i].first_expiry = def.expiry;
		rows[i].first_holder_null = true;
	}

	/* sort, then drop duplicates: each key is locked once */
	qsort(rows, nelems, sizeof(GateRow), gatekeeper_gate_row_cmp);
	for (i = 0; i < nelems; i++)
		if (nrows == 0 || gatekeeper_gate_row_cmp(&rows[nrows - 1], &rows[i]) != 0)
			rows[nrows++] = rows[i];

	gatekeeper_gate_lock(rows, nrows, now);

	for (i = 0; i < nelems; i++)
	{
		GateRow		probe = {0};
		GateRow    *row;

		probe.recipient = keys[i];
		probe.gate = def.id;
		row = bsearch(&probe, rows, nrows, sizeof(GateRow), gatekeeper_gate_row_cmp);
		if (gatekeeper_gate_try(row, def.max_sends, def.expiry, 0, true))
		{
			Datum		value = elems[i];
			bool		isnull = false;

			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, &value, &isnull);
		}
	}
	gatekeeper_gate_write(rows, nrows, now);
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
	def = lookup_gate(PG_GETARG_TEXT_PP(0));
	memset(&row, 0, sizeof(row));
	row.recipient = recipient_arg(PG_GETARG_TEXT_PP(1));
	row.gate = def.id;
	read_row(&row, now);
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
		kept++;
	}
	i = row->n - kept;
	row->n = kept;
	if (i > 0)
		row->changed = true;
	return i;
}

/*
 * gate_release(gate text, recipient text, holder bigint) RETURNS boolean
 *		Give back the pass a holder has; true if it had a live one.
 */
Datum
gatekeeper_gate_release(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan = NULL;
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	GateDef		def;
	GateRow		row;
	Datum		args[2];
	bool		isnull;
	int			released = 0;

	require_arg(fcinfo, 0, "gate");
	require_arg(fcinfo, 1, "recipient");
	require_arg(fcinfo, 2, "holder");

	SPI_connect();
	def = lookup_gate(PG_GETARG_TEXT_PP(0));
	memset(&row, 0, sizeof(row));
	row.recipient = recipient_arg(PG_GETARG_TEXT_PP(1));
	row.gate = def.id;

	if (plan == NULL)
	{
		Oid			types[2] = {TEXTOID, INT4OID};

		plan = gatekeeper_keep_plan("SELECT expires, holders FROM gatekeeper.gate_pass "
						 " WHERE recipient = $1 COLLATE \"C\" AND gate = $2 FOR UPDATE",
						 2, types);
	}
	args[0] = CStringGetTextDatum(row.recipient);
	args[1] = Int32GetDatum(row.gate);
	if (gatekeeper_execute_by_key(plan, args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read gate row");
	if (SPI_processed > 0)
	{
		row_load(&row,
				 SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull),
				 SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull),
				 now);
		SPI_freetuptable(SPI_tuptable);
		released = gatekeeper_gate_release_holder(&row, PG_GETARG_INT64(2));
		gatekeeper_gate_write(&row, 1, now);
	}
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
 * gatekeeper_release_passes
 *		Give back every pass the given mails hold, in every gate.  All the
 *		gate rows involved are locked by one statement in the global order
 *		of (recipient, gate), so releasing for many recipients at once (a
 *		reap, a batch of failures) cannot deadlock against claims.  Returns
 *		how many live passes were released.  Must run inside SPI.
 */
int
gatekeeper_release_passes(char **recipients, int64 *holders, int n)
{
	static SPIPlanPtr plan = NULL;
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	Release    *rel;
	Datum	   *keys;
	Datum	   *hold;
	Datum		args[2];
	GateRow    *rows;
	int			nrows;
	int			released = 0;
	int			i;
	uint64		r;

	if (n == 0)
		return 0;
	rel = palloc(n * sizeof(Release));
	keys = palloc(n * sizeof(Datum));
	hold = palloc(n * sizeof(Datum));
	for (i = 0; i < n; i++)
	{
		rel[i].key = gatekeeper_recipient_key(recipients[i]);
		rel[i].holder = holders[i];
	}
	qsort(rel, n, sizeof(Release), release_cmp);
	for (i = 0; i < n; i++)
	{
		keys[i] = CStringGetTextDatum(rel[i].key);
		hold[i] = Int64GetDatum(rel[i].holder);
	}

	if (plan == NULL)
	{
		Oid			types[2] = {TEXTARRAYOID, INT8ARRAYOID};

		plan = gatekeeper_keep_plan("SELECT recipient, gate, expires, holders "
									"  FROM gatekeeper.gate_pass "
									" WHERE recipient = ANY ($1 COLLATE \"C\") AND holders && $2 "
									" ORDER BY recipient COLLATE \"C\", gate FOR UPDATE",
									2, types);
	}
	args[0] = gatekeeper_array(keys, NULL, n, TEXTOID);
	args[1] = gatekeeper_array(hold, NULL, n, INT8OID);
	if (gatekeeper_execute_by_key(plan, args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read gate rows");

	nrows = (int) SPI_processed;
	rows = palloc0(Max(nrows, 1) * sizeof(GateRow));
	for (r = 0; r < SPI_processed; r++)
	{
		HeapTuple	tup = SPI_tuptable->vals[r];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		GateRow    *row = &rows[r];
		Release		probe;
		Release    *hit;
		int			lo;
		int			hi;
		bool		isnull;

		row->recipient = TextDatumGetCString(SPI_getbinval(tup, desc, 1, &isnull));
		row->gate = DatumGetInt32(SPI_getbinval(tup, desc, 2, &isnull));
		row_load(row, SPI_getbinval(tup, desc, 3, &isnull),
				 SPI_getbinval(tup, desc, 4, &isnull), now);

		/* every holder asked for under this recipient: the first by bisection */
		probe.key = row->recipient;
		probe.holder = PG_INT64_MIN;
		lo = 0;
		hi = n;
		while (lo < hi)
		{
			int			mid = lo + (hi - lo) / 2;

			if (release_cmp(&rel[mid], &probe) < 0)
				lo = mid + 1;
			else
				hi = mid;
		}
		for (hit = rel + lo; hit < rel + n && strcmp(hit->key, row->recipient) == 0; hit++)
			released += gatekeeper_gate_release_holder(row, hit->holder);
	}
	if (nrows > 0)
	{
		SPI_freetuptable(SPI_tuptable);
		gatekeeper_gate_write(rows, nrows, now);
	}
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
	Datum		arg;
	char	   *key;
	uint64		r;

	require_arg(fcinfo, 0, "recipient");
	InitMaterializedSRF(fcinfo, 0);
	key = recipient_arg(PG_GETARG_TEXT_PP(0));

	SPI_connect();
	if (plan == NULL)
	{
		Oid			type = TEXTOID;

		plan = gatekeeper_keep_plan("SELECT g.name, g.max_sends, p.expires, p.holders "
						 "  FROM gatekeeper.gate g "
						 "  LEFT JOIN gatekeeper.gate_pass p "
						 "    ON p.gate = g.id AND p.recipient = $1 COLLATE \"C\" "
						 " ORDER BY g.name",
						 1, &type);
	}
	arg = CStringGetTextDatum(key);
	if (gatekeeper_execute_by_key(plan, &arg, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read gates");
	for (r = 0; r < SPI_processed; r++)
	{
		HeapTuple	tup = SPI_tuptable->vals[r];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		GateRow		row;
		int			max_sends;
		TimestampTz reopens;
		bool		isnull;
		bool		pass_null;
		Datum		values[5];
		bool		nulls[5] = {false, false, false, false, false};

		memset(&row, 0, sizeof(row));
		row.recipient = key;
		max_sends = DatumGetInt32(SPI_getbinval(tup, desc, 2, &isnull));
		(void) SPI_getbinval(tup, desc, 3, &pass_null);
		if (!pass_null)
			row_load(&row, SPI_getbinval(tup, desc, 3, &isnull),
					 SPI_getbinval(tup, desc, 4, &isnull), now);
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
