/*-------------------------------------------------------------------------
 *
 * claim_queues.c
 *		The queues a claim may take from, with their policies: weight,
 *		gates, rate limit, sending window, headers.
 *
 * A claim reads gatekeeper.queue (and gatekeeper.gate, when a queue has
 * gates) as its statement sees the database: under the caller's snapshot
 * for an application's claim, under a snapshot of its own for the
 * worker's (after the ROW SHARE lock that makes alter_queue(background =>
 * false) wait for it).  The rows are read by a scan and sorted by name in
 * the column's collation, as pg_cron reads its job table: the statement
 * that joined and aggregated them started an executor for every claim
 * (docs/internals.md, "The claim's statements").  The same scan finds the
 * names in a claim's queues filter that name no queue.  A rate-limited queue's
 * token bucket is refilled and locked (SKIP LOCKED) by a statement, and
 * spent by another once the claim knows how many of its mails go.
 *
 * IDENTIFICATION
 *		src/claim_queues.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "claim_queues.h"
#include "catalog.h"
#include "gatekeeper.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/varlena.h"

static const char bucket_sql[] =
"SELECT least(q.rate_limit::float8, q.tokens + q.rate_limit * "
"             extract(epoch FROM now() - coalesce(q.refilled_at, now() - interval '1 second'))) "
"  FROM gatekeeper.queue q WHERE q.name = $1 "
"   FOR UPDATE SKIP LOCKED";

static const char spend_tokens_sql[] =
"UPDATE gatekeeper.queue SET tokens = $2, refilled_at = now() "
" WHERE name = $1";

static SPIPlanPtr bucket_plan = NULL;
static SPIPlanPtr spend_tokens_plan = NULL;

/* A row of gatekeeper.queue or gatekeeper.gate, with its name. */
typedef struct PolicyRow
{
	HeapTuple	tuple;
	char	   *name;
} PolicyRow;

/* arg: the collation of the name column */
static int
policy_row_cmp(const void *a, const void *b, void *arg)
{
	const PolicyRow *x = a;
	const PolicyRow *y = b;

	return varstr_cmp(x->name, strlen(x->name), y->name, strlen(y->name), *(Oid *) arg);
}

/*
 * The rows of rel (gatekeeper.queue or gatekeeper.gate) that snapshot sees
 * and keep keeps, in the order ORDER BY name gives them (the column's
 * collation).  The tables are small and read once a claim: a scan and a
 * sort are cheaper than the statement that joined and aggregated them,
 * which was 3% of a batch-100 claimer's CPU (docs/internals.md,
 * "The claim's statements").
 */
static PolicyRow *
read_policy_rows(Relation rel, Snapshot snapshot,
				 bool (*keep) (HeapTuple tuple, TupleDesc desc, void *arg), void *arg,
				 int *n)
{
	TupleDesc	desc = RelationGetDescr(rel);
	AttrNumber	name_att = SPI_fnumber(desc, "name");
	TableScanDesc scan;
	HeapTuple	tuple;
	PolicyRow  *rows;
	int			size = 8;
	int			count = 0;

	if (name_att <= 0)
		elog(ERROR, "table gatekeeper.%s has no column \"name\"", RelationGetRelationName(rel));
	rows = palloc(size * sizeof(PolicyRow));
	scan = table_beginscan(rel, snapshot, 0, NULL);
	while ((tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		bool		isnull;
		Datum		name;

		if (keep != NULL && !keep(tuple, desc, arg))
			continue;
		name = heap_getattr(tuple, name_att, desc, &isnull);
		if (isnull)
			continue;
		if (count == size)
		{
			size *= 2;
			rows = repalloc(rows, size * sizeof(PolicyRow));
		}
		rows[count].tuple = heap_copytuple(tuple);
		rows[count].name = TextDatumGetCString(name);
		count++;
	}
	table_endscan(scan);
	qsort_arg(rows, count, sizeof(PolicyRow), policy_row_cmp,
			  &TupleDescAttr(desc, name_att - 1)->attcollation);
	*n = count;
	return rows;
}

/*
 * Which queues a claim takes from: not paused, named in the filter if any.
 * The scan also notes which of the filter's names it met, paused or not.
 */
typedef struct QueueFilter
{
	AttrNumber	paused;
	AttrNumber	background;
	bool		background_only;
	int			nnames;
	char	  **names;			/* NULL: every queue; a NULL element: null */
	bool	   *seen;			/* per name: a queue of that name exists */
	AttrNumber	name;
} QueueFilter;

static bool
keep_queue(HeapTuple tuple, TupleDesc desc, void *arg)
{
	QueueFilter *f = arg;
	bool		isnull;
	Datum		d;
	bool		named = false;
	int			i;

	if (f->names != NULL)
	{
		char	   *name;

		d = heap_getattr(tuple, f->name, desc, &isnull);
		if (isnull)
			return false;
		name = TextDatumGetCString(d);
		for (i = 0; i < f->nnames; i++)
			if (f->names[i] != NULL && strcmp(f->names[i], name) == 0)
				f->seen[i] = named = true;
		if (!named)
			return false;
	}
	d = heap_getattr(tuple, f->paused, desc, &isnull);
	if (isnull || DatumGetBool(d))
		return false;
	if (f->background_only)
	{
		d = heap_getattr(tuple, f->background, desc, &isnull);
		if (isnull || !DatumGetBool(d))
			return false;
	}
	return true;
}

static AttrNumber
policy_att(TupleDesc desc, const char *table, const char *column)
{
	AttrNumber	att = SPI_fnumber(desc, column);

	if (att <= 0)
		elog(ERROR, "table gatekeeper.%s has no column \"%s\"", table, column);
	return att;
}

/*
 * The gates of queue q, as its gates array names them (each existing gate
 * once, in name order), from the gate rows read for this claim.
 */
static void
queue_gates(ClaimQueue *q, ArrayType *names, PolicyRow *gates, int ngates, TupleDesc desc)
{
	Datum	   *elems;
	bool	   *nulls;
	char	  **wanted;
	int			nwanted;
	AttrNumber	id_att = policy_att(desc, "gate", "id");
	AttrNumber	max_att = policy_att(desc, "gate", "max_sends");
	AttrNumber	period_att = policy_att(desc, "gate", "period");
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	int			i;
	int			j;

	deconstruct_array(names, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &nwanted);
	wanted = palloc(Max(nwanted, 1) * sizeof(char *));
	for (j = 0; j < nwanted; j++)
		wanted[j] = nulls[j] ? NULL : TextDatumGetCString(elems[j]);
	q->gates = palloc(Max(ngates, 1) * sizeof(QueueGate));
	q->ngates = 0;
	for (i = 0; i < ngates; i++)
	{
		QueueGate  *g;
		bool		isnull;

		for (j = 0; j < nwanted; j++)
			if (wanted[j] != NULL && strcmp(wanted[j], gates[i].name) == 0)
				break;
		if (j == nwanted)
			continue;
		g = &q->gates[q->ngates++];
		g->name = gates[i].name;
		g->id = DatumGetInt32(heap_getattr(gates[i].tuple, id_att, desc, &isnull));
		g->max_sends = Min(DatumGetInt32(heap_getattr(gates[i].tuple, max_att, desc, &isnull)),
						   10000);
		g->expiry = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
															TimestampTzGetDatum(now),
															heap_getattr(gates[i].tuple, period_att,
																		 desc, &isnull)));
	}
	if (q->ngates == 0)
		q->gates = NULL;
}

/*
 * The columns of gatekeeper.queue a claim reads into its ClaimQueues, by
 * number.
 */
typedef struct QueueColumns
{
	AttrNumber	weight;
	AttrNumber	on_gate_closed;
	AttrNumber	rate_limit;
	AttrNumber	gates;
	AttrNumber	transactional;
	AttrNumber	unsubscribe_url;
	AttrNumber	send_window;
	AttrNumber	timezone;
	AttrNumber	feedback_id;
} QueueColumns;

/*
 * Open gatekeeper.queue for a claim, into *queue_rel, and return the
 * snapshot it is read with (registered).  A background worker serves the
 * queues with background set.  ROW SHARE on gatekeeper.queue, taken
 * before the queues are read with a snapshot of their own, makes
 * alter_queue(background => false), which takes EXCLUSIVE, wait for this
 * claim: once it commits no worker claim that saw the queue as its own is
 * still running, and the next one sees it is not.  An application's claim
 * reads them as its statement sees the database.
 */
static Snapshot
open_queues(bool background, Relation *queue_rel)
{
	if (background)
		LockRelationOid(gatekeeper_relid(GATEKEEPER_REL_QUEUE, false), RowShareLock);
	*queue_rel = table_open(gatekeeper_relid(GATEKEEPER_REL_QUEUE, false), AccessShareLock);
	if (background || !ActiveSnapshotSet())
	{
		CommandCounterIncrement();
		return RegisterSnapshot(GetTransactionSnapshot());
	}
	return RegisterSnapshot(GetActiveSnapshot());
}

/*
 * Set f up for a claim's scan of gatekeeper.queue (desc): the queues not
 * paused, with background set for a background claim, named in filter
 * when it is not NULL.
 */
static void
queue_filter_init(QueueFilter *f, TupleDesc desc, ArrayType *filter, bool background)
{
	memset(f, 0, sizeof(*f));
	f->paused = policy_att(desc, "queue", "paused");
	f->background = policy_att(desc, "queue", "background");
	f->name = policy_att(desc, "queue", "name");
	f->background_only = background;
	if (filter != NULL)
	{
		Datum	   *elems;
		bool	   *nulls;
		int			k;

		deconstruct_array(filter, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &f->nnames);
		f->names = palloc(Max(f->nnames, 1) * sizeof(char *));
		f->seen = palloc0(Max(f->nnames, 1) * sizeof(bool));
		for (k = 0; k < f->nnames; k++)
			f->names[k] = nulls[k] ? NULL : TextDatumGetCString(elems[k]);
	}
}

/*
 * After the scan: the filter's first null or unknown name, in its order,
 * is an error, so that a typo cannot silently claim nothing.
 */
static void
queue_filter_check(const QueueFilter *f)
{
	int			i;

	for (i = 0; i < f->nnames; i++)
	{
		if (f->names[i] == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("queues must not contain nulls")));
		if (!f->seen[i])
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("queue \"%s\" does not exist", f->names[i])));
	}
}

/*
 * The numbers of the columns of gatekeeper.queue (desc) a claim reads,
 * into c.
 */
static void
queue_columns_init(QueueColumns *c, TupleDesc desc)
{
	c->weight = policy_att(desc, "queue", "weight");
	c->on_gate_closed = policy_att(desc, "queue", "on_gate_closed");
	c->rate_limit = policy_att(desc, "queue", "rate_limit");
	c->gates = policy_att(desc, "queue", "gates");
	c->transactional = policy_att(desc, "queue", "transactional");
	c->unsubscribe_url = policy_att(desc, "queue", "unsubscribe_url");
	c->send_window = policy_att(desc, "queue", "send_window");
	c->timezone = policy_att(desc, "queue", "timezone");
	c->feedback_id = policy_att(desc, "queue", "feedback_id");
}

/*
 * Fill q in from its row of gatekeeper.queue: its weight, what it does
 * when a gate is closed, its rate (for now, the tokens), its
 * transactional flag, unsubscribe_url, sending window, time zone and
 * Feedback-ID.  Returns the names of its gates, NULL when it has none.
 */
static ArrayType *
queue_from_row(ClaimQueue *q, const PolicyRow *row, TupleDesc desc, const QueueColumns *c)
{
	HeapTuple	tup = row->tuple;
	bool		isnull;
	Datum		d;
	ArrayType  *gates;

	q->name = row->name;
	q->weight = DatumGetInt32(heap_getattr(tup, c->weight, desc, &isnull));
	q->defer = strcmp(SPI_getvalue(tup, desc, c->on_gate_closed), "defer") == 0;
	d = heap_getattr(tup, c->rate_limit, desc, &isnull);
	q->limited = !isnull;
	q->tokens = isnull ? 0 : DatumGetInt32(d);	/* the rate, for now */
	q->cap = INT_MAX;
	q->more = true;
	q->transactional = DatumGetBool(heap_getattr(tup, c->transactional, desc, &isnull));
	q->unsubscribe_url = SPI_getvalue(tup, desc, c->unsubscribe_url);
	q->send_window = SPI_getvalue(tup, desc, c->send_window);
	q->timezone = SPI_getvalue(tup, desc, c->timezone);
	q->feedback_id = SPI_getvalue(tup, desc, c->feedback_id);
	if (q->send_window != NULL)
	{
		gatekeeper_parse_window(q->send_window, &q->window);
		q->has_window = true;
	}

	d = heap_getattr(tup, c->gates, desc, &isnull);
	if (isnull)
		return NULL;
	gates = DatumGetArrayTypeP(d);
	if (ArrayGetNItems(ARR_NDIM(gates), ARR_DIMS(gates)) == 0)
		return NULL;
	return gates;
}

/*
 * Refill the token bucket of each rate-limited queue for the time since
 * the last claim, capped at one second's worth, and lock it (SKIP LOCKED:
 * while another claimer holds a queue's bucket, this claim leaves the
 * queue alone rather than wait): the tokens are the queue's cap.
 */
static void
refill_buckets(ClaimQueue *queues, int n)
{
	int			i;

	if (bucket_plan == NULL)
	{
		Oid			type = TEXTOID;

		gatekeeper_plan(&bucket_plan, bucket_sql, 1, &type);
	}
	for (i = 0; i < n; i++)
	{
		ClaimQueue *q = &queues[i];
		Datum		arg;
		bool		isnull;

		if (!q->limited)
			continue;
		arg = CStringGetTextDatum(q->name);
		if (SPI_execute_plan(bucket_plan, &arg, NULL, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not lock rate limit of queue \"%s\"", q->name);
		if (SPI_processed == 0)
			q->tokens = 0;		/* another claimer holds the bucket */
		else
			q->tokens = DatumGetFloat8(SPI_getbinval(SPI_tuptable->vals[0],
													 SPI_tuptable->tupdesc, 1, &isnull));
		SPI_freetuptable(SPI_tuptable);
		q->cap = q->tokens >= 1 ? (int) Min(q->tokens, (double) INT_MAX) : 0;
		if (q->cap == 0)
			q->more = false;
	}
}

/*
 * Load the queues this claim may take from, in name order, with their
 * gates.  Rate-limited queues have their token bucket locked
 * (refill_buckets).  An unknown name in the filter is an error, so a
 * typo cannot silently claim nothing.
 */
ClaimQueue *
claim_load_queues(ArrayType *filter, int *nqueues)
{
	ClaimQueue *queues;
	int			n;
	int			i;
	Relation	queue_rel;
	Relation	gate_rel = NULL;
	TupleDesc	desc;
	Snapshot	snapshot;
	QueueFilter f;
	QueueColumns c;
	PolicyRow  *rows;
	PolicyRow  *gates = NULL;
	int			ngates = 0;

	snapshot = open_queues(gatekeeper_background_claim, &queue_rel);
	desc = RelationGetDescr(queue_rel);
	queue_filter_init(&f, desc, filter, gatekeeper_background_claim);
	queue_columns_init(&c, desc);
	rows = read_policy_rows(queue_rel, snapshot, keep_queue, &f, &n);
	queue_filter_check(&f);

	queues = palloc0(Max(n, 1) * sizeof(ClaimQueue));
	for (i = 0; i < n; i++)
	{
		ArrayType  *names = queue_from_row(&queues[i], &rows[i], desc, &c);

		if (names == NULL)
			continue;
		/* the gates are read once, for the first queue that has any */
		if (gate_rel == NULL)
		{
			gate_rel = table_open(gatekeeper_relid(GATEKEEPER_REL_GATE, false),
								  AccessShareLock);
			gates = read_policy_rows(gate_rel, snapshot, NULL, NULL, &ngates);
		}
		queue_gates(&queues[i], names, gates, ngates, RelationGetDescr(gate_rel));
	}
	if (gate_rel != NULL)
		table_close(gate_rel, NoLock);
	UnregisterSnapshot(snapshot);
	table_close(queue_rel, NoLock);

	refill_buckets(queues, n);
	*nqueues = n;
	return queues;
}

/*
 * Spend the rate-limit tokens of the mails that will go.
 */
void
claim_spend_tokens(ClaimQueue *queues, int nqueues)
{
	int			i;

	for (i = 0; i < nqueues; i++)
	{
		ClaimQueue *q = &queues[i];
		Datum		args[2];

		if (!q->limited || q->cap == 0)
			continue;
		if (spend_tokens_plan == NULL)
		{
			Oid			types[2] = {TEXTOID, FLOAT8OID};

			gatekeeper_plan(&spend_tokens_plan, spend_tokens_sql, 2, types);
		}
		args[0] = CStringGetTextDatum(q->name);
		args[1] = Float8GetDatum(Max(q->tokens - q->sent, 0.0));
		if (SPI_execute_plan(spend_tokens_plan, args, NULL, false, 0) != SPI_OK_UPDATE)
			elog(ERROR, "could not update rate limit of queue \"%s\"", q->name);
	}
}
