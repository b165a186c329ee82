/*-------------------------------------------------------------------------
 *
 * enqueue.c
 *		gatekeeper.enqueue(): the checks of its arguments whose errors an
 *		application must see plainly, then the enqueue itself.
 *
 * The enqueue (dedupe keys and all) is PL/pgSQL, gatekeeper._enqueue(); an
 * error raised inside it, a missing queue found by the insert trigger of
 * gatekeeper.mail say, reaches the application with PL/pgSQL's context:
 * the internal INSERT and the line of _enqueue.  The mistakes an
 * application makes most, a NULL where a value is needed and a queue that
 * does not exist, are checked here first, in C called straight from the
 * caller's statement, so their errors carry no context of gatekeeper's.
 *
 * IDENTIFICATION
 *		src/enqueue.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "gatekeeper.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "utils/builtins.h"

PG_FUNCTION_INFO_V1(gatekeeper_enqueue);

/* enqueue's arguments, in order */
#define ENQUEUE_NARGS 14

static const char queue_exists_sql[] =
"SELECT FROM gatekeeper.queue q WHERE q.name = $1";

static const char enqueue_sql[] =
"SELECT gatekeeper._enqueue($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)";

static SPIPlanPtr queue_exists_plan = NULL;
static SPIPlanPtr enqueue_plan = NULL;

/*
 * gatekeeper_enqueue
 *		gatekeeper.enqueue(recipient, subject, body, queue, send_at, html,
 *		sender, headers, dedupe_key, priority, send_by, recipient_name,
 *		metadata, timezone) RETURNS bigint: the new mail's id, or that of
 *		the mail holding its dedupe key.
 */
Datum
gatekeeper_enqueue(PG_FUNCTION_ARGS)
{
	Oid			types[ENQUEUE_NARGS] = {TEXTOID, TEXTOID, TEXTOID, TEXTOID, TIMESTAMPTZOID,
		TEXTOID, TEXTOID, JSONBOID, TEXTOID, INT4OID, TIMESTAMPTZOID, TEXTOID, JSONBOID, TEXTOID};
	Datum		values[ENQUEUE_NARGS];
	char		nulls[ENQUEUE_NARGS + 1];
	Datum		queue;
	Datum		id;
	bool		isnull;
	int			i;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2) || PG_ARGISNULL(3) ||
		PG_ARGISNULL(4))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("recipient, subject, body, queue and send_at must not be null")));
	if (PG_ARGISNULL(9))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("priority must not be null")));

	for (i = 0; i < ENQUEUE_NARGS; i++)
	{
		values[i] = PG_ARGISNULL(i) ? (Datum) 0 : PG_GETARG_DATUM(i);
		nulls[i] = PG_ARGISNULL(i) ? 'n' : ' ';
	}
	nulls[ENQUEUE_NARGS] = '\0';

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	queue = values[3];
	gatekeeper_plan(&queue_exists_plan, queue_exists_sql, 1, &types[3]);
	if (SPI_execute_plan(queue_exists_plan, &queue, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not look up queue");
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("queue \"%s\" does not exist", TextDatumGetCString(queue)),
				 errhint("Create it with gatekeeper.create_queue().")));

	gatekeeper_plan(&enqueue_plan, enqueue_sql, ENQUEUE_NARGS, types);
	if (SPI_execute_plan(enqueue_plan, values, nulls, false, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "gatekeeper._enqueue() failed");
	id = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	SPI_finish();
	if (isnull)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(id);
}
