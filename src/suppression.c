/*-------------------------------------------------------------------------
 *
 * suppression.c
 *		The suppression list: addresses that must not be mailed.
 *
 * gatekeeper.suppression_list holds one row per address and scope (a
 * queue, or NULL for every queue), keyed as the gates key recipients
 * (gatekeeper_recipient_key: ASCII letters lower-cased), with a reason:
 * hard_bounce, complaint, unsubscribe or manual.  The claim asks about a
 * whole batch in one statement, which probes the (address, queue) index
 * once per distinct recipient and returns every entry for them; which
 * entry stops which mail is decided here:
 *
 *	- an entry for the mail's queue stops it, whatever its reason;
 *	- a global hard_bounce or manual entry stops every queue;
 *	- a global unsubscribe or complaint entry stops every queue but a
 *	  transactional one (a receipt or a password reset still goes).
 *
 * Entries are added here too (gatekeeper_suppression_add), by the reports
 * and the nacks (src/report.c), one-click unsubscribes (src/unsubscribe.c)
 * and suppress(), through _suppress.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "gatekeeper.h"
#include "suppression.h"
#include "address.h"
#include "catalog.h"

/* one entry of the list, as the lookup returns it */
typedef struct Entry
{
	char	   *address;
	char	   *queue;			/* NULL: every queue */
	const char *reason;			/* one of reasons[] */
} Entry;

static const char *const reasons[] = {
	"hard_bounce", "complaint", "unsubscribe", "manual", "soft_bounce", NULL
};

static SPIPlanPtr suppression_lookup_plan = NULL;
static const char suppression_lookup_sql[] =
"SELECT s.address, s.queue, s.reason FROM gatekeeper.suppression_list s"
" WHERE s.address = ANY ($1)";

static SPIPlanPtr queue_transactional_plan = NULL;
static const char queue_transactional_sql[] =
"SELECT q.name, q.transactional FROM gatekeeper.queue q WHERE q.name = ANY ($1)";

/*
 * Add an entry, or give the one there is the new reason when that stops
 * more: hard_bounce or manual over soft_bounce, unsubscribe or complaint;
 * soft_bounce over unsubscribe or complaint.  Returns whether the entry is
 * new (an inserted row's xmax is 0).
 */
static SPIPlanPtr suppression_add_plan = NULL;
static const char suppression_add_sql[] =
"INSERT INTO gatekeeper.suppression_list AS s (address, queue, reason, detail, mail_id) "
"VALUES ($1, $2, $3, $4, $5) "
"ON CONFLICT ON CONSTRAINT suppression_list_address_queue DO UPDATE "
"   SET reason = EXCLUDED.reason, detail = EXCLUDED.detail, mail_id = EXCLUDED.mail_id "
" WHERE (s.reason IN ('unsubscribe', 'complaint', 'soft_bounce') "
"        AND EXCLUDED.reason IN ('hard_bounce', 'manual')) "
"    OR (s.reason IN ('unsubscribe', 'complaint') AND EXCLUDED.reason = 'soft_bounce') "
"RETURNING (s.xmax = 0)";

static int	cstring_cmp(const void *a, const void *b);
static int	entry_cmp(const void *a, const void *b);
static const char *static_reason(const char *reason);

/*
 * Order C strings bytewise, for qsort.
 */
static int
cstring_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *) a, *(char *const *) b);
}

/*
 * Order entries by address, for qsort and the lower bound search.
 */
static int
entry_cmp(const void *a, const void *b)
{
	return strcmp(((const Entry *) a)->address, ((const Entry *) b)->address);
}

/*
 * static_reason
 *		The reasons[] string equal to reason (the table's CHECK allows no
 *		other).
 */
static const char *
static_reason(const char *reason)
{
	const char *const *r;

	for (r = reasons; *r; r++)
		if (strcmp(*r, reason) == 0)
			return *r;
	elog(ERROR, "unknown suppression reason \"%s\"", reason);
	return NULL;				/* keep the compiler quiet */
}

/*
 * gatekeeper_suppression_check
 *		Set each probe's reason from the suppression list.
 *
 * One statement for the batch: the distinct keys go in as one array, and
 * "address = ANY ($1)" is an index scan that descends the index once per
 * element.  The rows come back sorted here, and each probe finds its
 * address's entries by binary search.
 */
void
gatekeeper_suppression_check(GatekeeperSuppressionProbe *probes, int n)
{
	Oid			argtypes[1] = {TEXTARRAYOID};
	const char **keys;
	Datum	   *elems;
	Datum		arg;
	Entry	   *entries;
	int			nkeys = 0;
	int			nentries;
	int			ret;
	int			i;

	for (i = 0; i < n; i++)
		probes[i].reason = NULL;
	if (n == 0)
		return;

	keys = palloc(sizeof(char *) * n);
	for (i = 0; i < n; i++)
		keys[i] = probes[i].key;
	qsort(keys, n, sizeof(char *), cstring_cmp);
	elems = palloc(sizeof(Datum) * n);
	for (i = 0; i < n; i++)
	{
		if (nkeys > 0 && strcmp(keys[i], keys[nkeys - 1]) == 0)
			continue;
		keys[nkeys] = keys[i];
		elems[nkeys] = CStringGetTextDatum(keys[i]);
		nkeys++;
	}
	arg = gatekeeper_array(elems, NULL, nkeys, TEXTOID);

	ret = gatekeeper_execute_by_key(gatekeeper_plan(&suppression_lookup_plan,
													suppression_lookup_sql,
													1, argtypes),
									&arg, NULL, true, 0);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "suppression lookup failed: %s", SPI_result_code_string(ret));
	nentries = (int) SPI_processed;
	if (nentries == 0)
		return;

	entries = palloc(sizeof(Entry) * nentries);
	for (i = 0; i < nentries; i++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		char	   *reason = SPI_getvalue(tuple, desc, 3);

		entries[i].address = SPI_getvalue(tuple, desc, 1);
		entries[i].queue = SPI_getvalue(tuple, desc, 2);
		entries[i].reason = static_reason(reason);
	}
	qsort(entries, nentries, sizeof(Entry), entry_cmp);

	for (i = 0; i < n; i++)
	{
		GatekeeperSuppressionProbe *probe = &probes[i];
		int			lo = 0;
		int			hi = nentries;
		int			best = 0;
		int			j;

		/* the first entry for this address */
		while (lo < hi)
		{
			int			mid = (lo + hi) / 2;

			if (strcmp(entries[mid].address, probe->key) < 0)
				lo = mid + 1;
			else
				hi = mid;
		}
		for (j = lo; j < nentries && strcmp(entries[j].address, probe->key) == 0; j++)
		{
			const Entry *e = &entries[j];
			bool		stops_all = e->reason == reasons[0] || e->reason == reasons[3] ||
				e->reason == reasons[4];
			int			rank = 0;

			/*
			 * Of several entries that stop the mail, the one reported is the
			 * one that stops most: a global hard_bounce, manual or
			 * soft_bounce, then the queue's own, then a global unsubscribe
			 * or complaint.
			 */
			if (e->queue == NULL && stops_all)
				rank = 3;
			else if (e->queue != NULL && strcmp(e->queue, probe->queue) == 0)
				rank = 2;
			else if (e->queue == NULL && !probe->transactional)
				rank = 1;
			if (rank > best)
			{
				best = rank;
				probe->reason = e->reason;
			}
		}
	}
}

/*
 * gatekeeper_suppression_add
 *		Put address_key (as gatekeeper_recipient_key makes it) on the list
 *		for queue (NULL: every queue) with reason and detail (may be NULL),
 *		naming the mail it came from (0: none); true when the entry is new.
 *		An entry that exists keeps its row, but takes the new reason, detail
 *		and mail when the reason stops more.  Call inside a transaction with
 *		SPI connected.
 */
bool
gatekeeper_suppression_add(const char *address_key, const char *reason, const char *queue,
						   const char *detail, int64 mail_id)
{
	Oid			argtypes[5] = {TEXTOID, TEXTOID, TEXTOID, TEXTOID, INT8OID};
	Datum		args[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};
	bool		isnull;
	bool		added;
	int			ret;

	args[0] = CStringGetTextDatum(address_key);
	if (queue != NULL)
		args[1] = CStringGetTextDatum(queue);
	else
		nulls[1] = 'n';
	args[2] = CStringGetTextDatum(reason);
	if (detail != NULL)
		args[3] = CStringGetTextDatum(detail);
	else
		nulls[3] = 'n';
	args[4] = Int64GetDatum(mail_id);
	if (mail_id == 0)
		nulls[4] = 'n';

	ret = SPI_execute_plan(gatekeeper_plan(&suppression_add_plan, suppression_add_sql,
										   5, argtypes),
						   args, nulls, false, 0);
	if (ret != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "adding a suppression entry failed: %s", SPI_result_code_string(ret));
	/* no row: the entry there stops at least as much, and is kept */
	if (SPI_processed == 0)
		return false;
	added = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	return !isnull && added;
}

PG_FUNCTION_INFO_V1(gatekeeper_suppress);

/*
 * gatekeeper._suppress(address_key text, reason text, queue text,
 *		detail text, mail_id bigint) RETURNS boolean
 *		gatekeeper_suppression_add for suppress(): true when the entry is
 *		new.  The address is a key already; reason is checked by the table.
 */
Datum
gatekeeper_suppress(PG_FUNCTION_ARGS)
{
	bool		added;

	gatekeeper_require_schema();
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("address_key and reason must not be null")));
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	added = gatekeeper_suppression_add(text_to_cstring(PG_GETARG_TEXT_PP(0)),
									   text_to_cstring(PG_GETARG_TEXT_PP(1)),
									   PG_ARGISNULL(2) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(2)),
									   PG_ARGISNULL(3) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(3)),
									   PG_ARGISNULL(4) ? 0 : PG_GETARG_INT64(4));
	SPI_finish();
	PG_RETURN_BOOL(added);
}

PG_FUNCTION_INFO_V1(gatekeeper_suppressed);

/*
 * gatekeeper._suppressed(recipients text[], queues text[])
 *		RETURNS TABLE (recipient text, queue text, reason text)
 *		Which of these mails (recipient i to queue i) the claim would
 *		suppress, and why: gatekeeper_suppression_check as the claim calls
 *		it, for tests and for a look before a campaign.
 */
Datum
gatekeeper_suppressed(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			argtypes[1] = {TEXTARRAYOID};
	Datum	   *recipients;
	Datum	   *queues;
	bool	   *rnulls;
	bool	   *qnulls;
	int			nr;
	int			nq;
	GatekeeperSuppressionProbe *probes;
	Datum		arg;
	int			ret;
	int			i;
	int			j;

	gatekeeper_require_schema();
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("recipients and queues must not be null")));
	deconstruct_array(PG_GETARG_ARRAYTYPE_P(0), TEXTOID, -1, false, TYPALIGN_INT,
					  &recipients, &rnulls, &nr);
	deconstruct_array(PG_GETARG_ARRAYTYPE_P(1), TEXTOID, -1, false, TYPALIGN_INT,
					  &queues, &qnulls, &nq);
	if (nr != nq || ARR_NDIM(PG_GETARG_ARRAYTYPE_P(0)) > 1 ||
		ARR_NDIM(PG_GETARG_ARRAYTYPE_P(1)) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("recipients and queues must be one-dimensional arrays of the same length")));

	probes = palloc0(sizeof(GatekeeperSuppressionProbe) * Max(nr, 1));
	for (i = 0; i < nr; i++)
	{
		char	   *recipient;

		if (rnulls[i] || qnulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("recipients and queues must not hold nulls")));
		recipient = TextDatumGetCString(recipients[i]);
		gatekeeper_check_address(recipient, "recipient");
		probes[i].key = gatekeeper_recipient_key(recipient);
		probes[i].queue = TextDatumGetCString(queues[i]);
	}

	SPI_connect();
	arg = PointerGetDatum(PG_GETARG_ARRAYTYPE_P(1));
	ret = SPI_execute_plan(gatekeeper_plan(&queue_transactional_plan,
										   queue_transactional_sql, 1, argtypes),
						   &arg, NULL, true, 0);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "reading queues failed: %s", SPI_result_code_string(ret));
	for (i = 0; i < nr; i++)
	{
		bool		found = false;

		for (j = 0; j < (int) SPI_processed && !found; j++)
		{
			bool		isnull;

			if (strcmp(SPI_getvalue(SPI_tuptable->vals[j], SPI_tuptable->tupdesc, 1),
					   probes[i].queue) != 0)
				continue;
			found = true;
			probes[i].transactional =
				DatumGetBool(SPI_getbinval(SPI_tuptable->vals[j],
										   SPI_tuptable->tupdesc, 2, &isnull));
		}
		if (!found)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("queue \"%s\" does not exist", probes[i].queue)));
	}
	gatekeeper_suppression_check(probes, nr);

	/* the result outlives SPI: copy what goes into it first */
	InitMaterializedSRF(fcinfo, 0);
	for (i = 0; i < nr; i++)
	{
		Datum		values[3];
		bool		nulls[3] = {false, false, false};

		if (probes[i].reason == NULL)
			continue;
		values[0] = recipients[i];
		values[1] = queues[i];
		values[2] = CStringGetTextDatum(probes[i].reason);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	SPI_finish();
	return (Datum) 0;
}
