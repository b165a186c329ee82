/*-------------------------------------------------------------------------
 *
 * enqueue.c
 *		gatekeeper.enqueue(): one mail, validated like a bulk insert, and
 *		its dedupe key kept.
 *
 * The mail goes into gatekeeper.mail by one INSERT, whose trigger
 * (src/mail.c) validates it and writes its live row and its key.  With a
 * dedupe key the mail that holds the key wins: scheduled or claimed, or
 * finished (not cancelled) within the queue's dedupe_window
 * (_mail_key_held), and enqueue returns its id, writing nothing.
 * Otherwise the insert goes ahead in a subtransaction; if a concurrent
 * enqueue of the same key got there first, or the holder was seen before
 * the transaction that changed it committed, the insert fails on the key
 * (23505 on mail_key_pkey or mail_dedupe), is rolled back, and the next
 * round finds the holder.  Every statement takes a new snapshot, so a
 * round sees what the one before waited for.
 *
 * An error reaches the application as enqueue's own: its SQLSTATE,
 * message, detail, hint and fields, without the context the insert's
 * statement and trigger add (the statement's text, the row); only the
 * caller's context is added anew.
 *
 * IDENTIFICATION
 *		src/enqueue.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "gatekeeper.h"
#include "catalog.h"
#include "delivery_check.h"
#include "xact.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/elog.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/resowner.h"

PG_FUNCTION_INFO_V1(gatekeeper_enqueue);

/* enqueue's arguments, in order: the insert's parameters are the same */
#define ENQUEUE_NARGS 16
#define ARG_RECIPIENT	0
#define ARG_SUBJECT		1
#define ARG_BODY		2
#define ARG_QUEUE		3
#define ARG_SEND_AT		4
#define ARG_DEDUPE_KEY	8
#define ARG_PRIORITY	9
#define ARG_TEMPLATE	14

/* rounds of look-up and insert before a keyed enqueue gives up (40001) */
#define ENQUEUE_ROUNDS 10

static Oid	insert_mail_argtypes[ENQUEUE_NARGS] = {
	TEXTOID, TEXTOID, TEXTOID, TEXTOID, TIMESTAMPTZOID, TEXTOID, TEXTOID, JSONBOID,
	TEXTOID, INT4OID, TIMESTAMPTZOID, TEXTOID, JSONBOID, TEXTOID, TEXTOID, JSONBOID
};

/*
 * The mail itself, with its template's latest version (NULL when there is
 * no such template, which the trigger refuses); the trigger of
 * gatekeeper.mail does the rest.
 */
static SPIPlanPtr insert_mail_plan = NULL;
static const char insert_mail_sql[] =
"INSERT INTO gatekeeper.mail (recipient, subject, body, queue, send_at, html, sender, "
"                             headers, dedupe_key, priority, send_by, recipient_name, "
"                             metadata, timezone, template, template_version, data) "
"VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, "
"        (SELECT max(t.version) FROM gatekeeper.template t WHERE t.name = $15), $16) "
"RETURNING id";

/* whether the queue exists, before a key is looked up in it */
static SPIPlanPtr queue_exists_plan = NULL;
static const char queue_exists_sql[] =
"SELECT FROM gatekeeper.queue q WHERE q.name = $1";

/*
 * The holder of a key: a scheduled mail, in mail_live first (an update of
 * a mail's key, by _mail_sync, moves its live row's key, not its mail_key
 * row); then the mail of the key's row in mail_key, if it still holds it.
 */
static SPIPlanPtr live_holder_plan = NULL;
static const char live_holder_sql[] =
"SELECT l.id FROM gatekeeper.mail_live l WHERE l.queue = $1 AND l.dedupe_key = $2";

static SPIPlanPtr key_holder_plan = NULL;
static const char key_holder_sql[] =
"SELECT k.id FROM gatekeeper.mail_key k "
" WHERE k.queue = $1 AND k.dedupe_key = $2 "
"   AND gatekeeper._mail_key_held(k.id, k.queue, k.dedupe_key)";

static Oid	key_argtypes[2] = {TEXTOID, TEXTOID};

static int64 insert_mail(Datum *values, const char *nulls);
static bool find_holder(SPIPlanPtr *plan, const char *sql, Datum *key, int64 *id);
static bool insert_keyed_mail(Datum *values, const char *nulls, int64 *id);
static int64 enqueue_keyed(Datum *values, const char *nulls);
static void raise_plainly(ErrorData *edata) pg_attribute_noreturn();

/*
 * Insert the mail; its id.
 */
static int64
insert_mail(Datum *values, const char *nulls)
{
	bool		isnull;
	int			ret;

	ret = SPI_execute_plan(gatekeeper_plan(&insert_mail_plan, insert_mail_sql,
										   ENQUEUE_NARGS, insert_mail_argtypes),
						   values, nulls, false, 0);
	if (ret != SPI_OK_INSERT_RETURNING || SPI_processed != 1)
		elog(ERROR, "enqueueing a mail failed: %s", SPI_result_code_string(ret));
	return DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

/*
 * Look the key (queue, dedupe_key) up with one of the holder statements;
 * true, and the holder's id in *id, when it found one.
 */
static bool
find_holder(SPIPlanPtr *plan, const char *sql, Datum *key, int64 *id)
{
	bool		isnull;

	if (gatekeeper_execute_by_key(gatekeeper_plan(plan, sql, 2, key_argtypes),
								  key, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "looking up a dedupe key failed");
	if (SPI_processed == 0)
		return false;
	*id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	return true;
}

/* a keyed insert, for gatekeeper_subxact_try */
typedef struct KeyedInsert
{
	Datum	   *values;
	const char *nulls;
	int64		id;
} KeyedInsert;

static bool
keyed_insert_step(void *arg)
{
	KeyedInsert *insert = (KeyedInsert *) arg;

	insert->id = insert_mail(insert->values, insert->nulls);
	return true;
}

/* the insert failed on the key: 23505 on mail_key_pkey or mail_dedupe */
static bool
key_taken(ErrorData *error)
{
	return error->sqlerrcode == ERRCODE_UNIQUE_VIOLATION &&
		error->constraint_name != NULL &&
		(strcmp(error->constraint_name, "mail_key_pkey") == 0 ||
		 strcmp(error->constraint_name, "mail_dedupe") == 0);
}

/*
 * Insert a keyed mail in a subtransaction: true, and its id in *id, when
 * it went in; false when the insert failed on the key, which another mail
 * took meanwhile: the subtransaction is rolled back and the caller looks
 * again.  Any other error is raised again.
 */
static bool
insert_keyed_mail(Datum *values, const char *nulls, int64 *id)
{
	KeyedInsert insert = {values, nulls, 0};

	if (!gatekeeper_subxact_try(keyed_insert_step, &insert, key_taken))
		return false;
	*id = insert.id;
	return true;
}

/*
 * The enqueue of a mail with a dedupe key: the holder's id, or the new
 * mail's.
 *
 * The insert must fail on a held key, so that the next round returns the
 * holder: under gatekeeper.on_duplicate = 'skip' the trigger would take
 * the new mail out again instead, and its id would name nothing.  For the
 * insert alone the setting is 'error', in a GUC nest level of its own (as
 * a function's SET clause does it), undone when the insert ends, or by
 * the subtransaction's or transaction's abort when it fails.
 */
static int64
enqueue_keyed(Datum *values, const char *nulls)
{
	Datum		key[2];
	int64		id;
	int			round;

	key[0] = values[ARG_QUEUE];
	key[1] = values[ARG_DEDUPE_KEY];
	if (SPI_execute_plan(gatekeeper_plan(&queue_exists_plan, queue_exists_sql, 1, key_argtypes),
						 key, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "looking up a queue failed");
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("queue \"%s\" does not exist", TextDatumGetCString(key[0])),
				 errhint("Create it with gatekeeper.create_queue().")));

	for (round = 0; round < ENQUEUE_ROUNDS; round++)
	{
		bool		inserted;

		CHECK_FOR_INTERRUPTS();
		if (find_holder(&live_holder_plan, live_holder_sql, key, &id) ||
			find_holder(&key_holder_plan, key_holder_sql, key, &id))
			return id;

		inserted = insert_keyed_mail(values, nulls, &id);
		if (inserted)
			return id;
	}
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not enqueue mail with dedupe key \"%s\" under concurrent changes",
					TextDatumGetCString(key[1]))));
	pg_unreachable();
}

/*
 * Raise edata again as an error of this function: its SQLSTATE, message,
 * detail, hint and fields, without the context gatekeeper's own statements
 * gave it (the context of enqueue's caller is added anew).
 */
static void
raise_plainly(ErrorData *edata)
{
	ereport(ERROR,
			(errcode(edata->sqlerrcode),
			 errmsg_internal("%s", edata->message),
			 edata->detail ? errdetail_internal("%s", edata->detail) : 0,
			 edata->hint ? errhint("%s", edata->hint) : 0,
			 edata->schema_name ? err_generic_string(PG_DIAG_SCHEMA_NAME, edata->schema_name) : 0,
			 edata->table_name ? err_generic_string(PG_DIAG_TABLE_NAME, edata->table_name) : 0,
			 edata->column_name ? err_generic_string(PG_DIAG_COLUMN_NAME, edata->column_name) : 0,
			 edata->datatype_name ? err_generic_string(PG_DIAG_DATATYPE_NAME, edata->datatype_name) : 0,
			 edata->constraint_name ? err_generic_string(PG_DIAG_CONSTRAINT_NAME, edata->constraint_name) : 0));
	pg_unreachable();
}

/*
 * gatekeeper_enqueue
 *		gatekeeper.enqueue(recipient, subject, body, queue, send_at, html,
 *		sender, headers, dedupe_key, priority, send_by, recipient_name,
 *		metadata, timezone, template, data) RETURNS bigint: the new mail's
 *		id, or that of the mail holding its dedupe key.  A templated mail
 *		has no subject or body of its own.
 */
Datum
gatekeeper_enqueue(PG_FUNCTION_ARGS)
{
	MemoryContext caller = CurrentMemoryContext;
	Datum		values[ENQUEUE_NARGS];
	char		nulls[ENQUEUE_NARGS];
	int64		id = 0;
	int			i;

	gatekeeper_require_schema();
	gatekeeper_delivery_check_once();
	if (PG_ARGISNULL(ARG_RECIPIENT) || PG_ARGISNULL(ARG_QUEUE) || PG_ARGISNULL(ARG_SEND_AT) ||
		(PG_ARGISNULL(ARG_TEMPLATE) && (PG_ARGISNULL(ARG_SUBJECT) || PG_ARGISNULL(ARG_BODY))))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("recipient, subject, body, queue and send_at must not be null")));
	if (PG_ARGISNULL(ARG_PRIORITY))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("priority must not be null")));

	for (i = 0; i < ENQUEUE_NARGS; i++)
	{
		values[i] = PG_GETARG_DATUM(i);
		nulls[i] = PG_ARGISNULL(i) ? 'n' : ' ';
	}

	PG_TRY();
	{
		int			nestlevel = -1;

		/*
		 * enqueue never skips a mail: it returns the id of the one holding
		 * the key.  Its own insert runs under 'error' whatever the session
		 * set, so that a key taken meanwhile is seen (and looked up again)
		 * rather than skipped, and its RETURNING is allowed.
		 */
		if (gatekeeper_on_duplicate != GATEKEEPER_ON_DUPLICATE_ERROR)
		{
			nestlevel = NewGUCNestLevel();
			(void) set_config_option("gatekeeper.on_duplicate", "error",
									 PGC_USERSET, PGC_S_SESSION,
									 GUC_ACTION_SAVE, true, 0, false);
		}
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		if (PG_ARGISNULL(ARG_DEDUPE_KEY))
			id = insert_mail(values, nulls);
		else
			id = enqueue_keyed(values, nulls);
		SPI_finish();
		if (nestlevel >= 0)
			AtEOXact_GUC(true, nestlevel);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(caller);
		edata = CopyErrorData();
		FlushErrorState();
		raise_plainly(edata);
	}
	PG_END_TRY();

	PG_RETURN_INT64(id);
}
