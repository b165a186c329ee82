/*-------------------------------------------------------------------------
 *
 * gate_funcs.c
 *		The gates' SQL-callable functions: gate_pass, gate_pass_batch,
 *		gate_open, gate_next_open, gate_release, explain, the internal
 *		release, sweep and restamp functions, and the gate_memory view's.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "gate.h"
#include "gate_log.h"
#include "gate_store.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "address.h"
#include "catalog.h"
#include "gatekeeper.h"
#include "utils/array.h"
#include "utils/builtins.h"

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
PG_FUNCTION_INFO_V1(gatekeeper_gate_memory_stats);

/* a gate row's max_sends beyond SPEC's bound acts as the bound */
static const char gate_by_name_sql[] =
"SELECT id, least(max_sends, 10000), now() + period FROM gatekeeper.gate WHERE name = $1";

static const char gates_by_name_sql[] =
"SELECT g.name, least(g.max_sends, 10000), g.id FROM gatekeeper.gate g ORDER BY g.name";

static SPIPlanPtr gate_by_name_plan = NULL;
static SPIPlanPtr gates_by_name_plan = NULL;

static GateDef lookup_gate(text *name);
static void require_arg(FunctionCallInfo fcinfo, int argno, const char *name);
static char *recipient_arg(text *recipient);
static void gate_recipient_args(FunctionCallInfo fcinfo, GateDef *def, GatePasses *row);
static int	row_index_cmp(const void *a, const void *b, void *arg);
static void peek(FunctionCallInfo fcinfo, int *live, TimestampTz *reopens);

/*
 * Look up a gate by name; error 42704 if there is none.  Inside SPI.
 */
static GateDef
lookup_gate(text *name)
{
	Oid			type = TEXTOID;
	Datum		arg = PointerGetDatum(name);
	GateDef		def;
	bool		isnull;

	gatekeeper_plan(&gate_by_name_plan, gate_by_name_sql, 1, &type);
	if (SPI_execute_plan(gate_by_name_plan, &arg, NULL, true, 1) != SPI_OK_SELECT)
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
 * The key of a recipient argument; error 22023 unless it is an address a
 * mail could be sent to (gatekeeper_check_address, as enqueue checks it).
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
	gatekeeper_check_address(s, "recipient");
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
gate_recipient_args(FunctionCallInfo fcinfo, GateDef *def, GatePasses *row)
{
	*def = lookup_gate(PG_GETARG_TEXT_PP(0));
	memset(row, 0, sizeof(*row));
	row->recipient = recipient_arg(PG_GETARG_TEXT_PP(1));
	row->gate = def->id;
}

/*
 * gate_pass(gate text, recipient text, holder bigint DEFAULT NULL) RETURNS boolean
 */
Datum
gatekeeper_gate_pass(PG_FUNCTION_ARGS)
{
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	GateDef		def;
	GatePasses	row;
	int			want = 1;
	int			granted;

	gatekeeper_require_schema();
	require_arg(fcinfo, 0, "gate");
	require_arg(fcinfo, 1, "recipient");

	SPI_connect();
	gate_recipient_args(fcinfo, &def, &row);
	gatekeeper_gate_pass_rows(&row, 1, &def, &want, PG_ARGISNULL(2) ? 0 : PG_GETARG_INT64(2),
						 PG_ARGISNULL(2), &granted, now);
	SPI_finish();

	PG_RETURN_BOOL(granted > 0);
}

/*
 * qsort_arg order of indexes into an array of rows.
 */
static int
row_index_cmp(const void *a, const void *b, void *arg)
{
	const GatePasses *rows = (const GatePasses *) arg;

	return gatekeeper_gate_passes_cmp(&rows[*(const int *) a], &rows[*(const int *) b]);
}

/*
 * gate_pass_batch(gate text, recipients text[]) RETURNS SETOF text
 *		Pass each recipient in turn; return those that passed, in order.
 *		A recipient named twice is gated twice, like any two callers.
 *		Every recipient is checked before any is passed.
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
	GatePasses *rows;
	GatePasses *unique;
	int		   *order;
	int		   *rowof;
	int		   *want;
	int		   *granted;
	int			nrows = 0;
	GateDef		def;
	int			i;

	gatekeeper_require_schema();
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

	rows = palloc0(Max(nelems, 1) * sizeof(GatePasses));
	unique = palloc(Max(nelems, 1) * sizeof(GatePasses));
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
		GatePasses *row = &rows[order[i]];

		if (nrows > 0 && gatekeeper_gate_passes_cmp(&unique[nrows - 1], row) == 0)
			want[nrows - 1]++;
		else
		{
			unique[nrows] = *row;
			want[nrows++] = 1;
		}
		rowof[order[i]] = nrows - 1;
	}

	gatekeeper_gate_pass_rows(unique, nrows, &def, want, 0, true, granted, now);

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
	GatePasses	row;

	require_arg(fcinfo, 0, "gate");
	require_arg(fcinfo, 1, "recipient");
	SPI_connect();
	gate_recipient_args(fcinfo, &def, &row);
	gatekeeper_gate_peek(&row, now);
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

	gatekeeper_require_schema();
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

	gatekeeper_require_schema();
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
	GatePasses	row;
	int			released;

	gatekeeper_require_schema();
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
 * _release_mail(recipient text, holder bigint) RETURNS int
 *		0.1.0's, gone (a failed mail's passes are released in C, by
 *		gatekeeper_release_passes); the symbol stays for the older scripts
 *		(gatekeeper_gone).
 */
Datum
gatekeeper_release_mail(PG_FUNCTION_ARGS)
{
	gatekeeper_gone("0.1.0", "_release_mail");
}

/*
 * _release_mails(recipients text[], holders bigint[]) RETURNS int
 *		0.1.0's, gone like _release_mail.
 */
Datum
gatekeeper_release_mails(PG_FUNCTION_ARGS)
{
	gatekeeper_gone("0.1.0", "_release_mails");
}

/*
 * explain(recipient text) RETURNS TABLE (gate text, open boolean,
 *		next_open timestamptz, sends_in_period int, max_sends int)
 *		Every gate's view of one recipient, by gate name.
 */
Datum
gatekeeper_explain(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	char	   *key;
	uint64		r;
	uint64		ngates;
	SPITupleTable *gates;

	gatekeeper_require_schema();
	require_arg(fcinfo, 0, "recipient");
	InitMaterializedSRF(fcinfo, 0);
	key = recipient_arg(PG_GETARG_TEXT_PP(0));

	SPI_connect();
	gatekeeper_plan(&gates_by_name_plan, gates_by_name_sql, 0, NULL);
	if (SPI_execute_plan(gates_by_name_plan, NULL, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read gates");
	gates = SPI_tuptable;
	ngates = SPI_processed;
	for (r = 0; r < ngates; r++)
	{
		HeapTuple	tup = gates->vals[r];
		TupleDesc	desc = gates->tupdesc;
		GatePasses	row;
		int			max_sends;
		TimestampTz reopens;
		bool		isnull;
		Datum		values[5];
		bool		nulls[5] = {false, false, false, false, false};

		memset(&row, 0, sizeof(row));
		row.recipient = key;
		max_sends = DatumGetInt32(SPI_getbinval(tup, desc, 2, &isnull));
		row.gate = DatumGetInt32(SPI_getbinval(tup, desc, 3, &isnull));
		gatekeeper_gate_peek(&row, now);
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
	uint64		nonce;
	int64		dropped;

	gatekeeper_require_schema();
	if (!gate_store_sweep_due())
		PG_RETURN_INT64(0);
	SPI_connect();
	nonce = gate_log_nonce();
	SPI_finish();
	dropped = gate_store_sweep(true, nonce);
	PG_RETURN_INT64(dropped);
}

/*
 * _gate_restamp(gate text, recipient text, expires timestamptz[]) RETURNS void
 *		Give one recipient's live passes new expiries, in the order they
 *		were made: each is given back and made again with its new expiry,
 *		in this transaction.  For tests that need a window at its edge: not
 *		in the install script, the tests declare it (sql/gate_restamp.inc).
 */
Datum
gatekeeper_gate_restamp(PG_FUNCTION_ARGS)
{
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	GateDef		def;
	GatePasses	row;
	Datum	   *ev;
	bool	   *en;
	int			ne;
	int			i;

	gatekeeper_require_schema();
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

/*
 * _gate_memory() RETURNS TABLE (bytes_used bigint, bytes_total bigint,
 *		entries bigint, full_refusals bigint)
 *		What the gatekeeper.gate_memory view shows: bytes charged against
 *		gatekeeper.gate_memory and its size, the entries, and how many gated
 *		mails claims deferred because it was full.
 */
Datum
gatekeeper_gate_memory_stats(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	GateMemoryStats stats;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};

	gatekeeper_require_schema();
	InitMaterializedSRF(fcinfo, 0);
	gate_store_stats(&stats);
	values[0] = Int64GetDatum((int64) stats.used);
	values[1] = Int64GetDatum((int64) stats.total);
	values[2] = Int64GetDatum((int64) stats.entries);
	values[3] = Int64GetDatum((int64) stats.full_refusals);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	return (Datum) 0;
}
