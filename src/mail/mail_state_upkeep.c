/*-------------------------------------------------------------------------
 *
 * mail_state_upkeep.c
 *		The upkeep of the tables a mail's state lives in, which no one
 *		mail's transition does (issue 26, item 1): a TRUNCATE of
 *		gatekeeper.mail carried into mail_live, mail_claim, mail_key and
 *		mail_done; purge's pass over stale dedupe keys; the shrinking of a
 *		drained mail_claim; and the restore triggers, which merge the rows a
 *		restore loads into mail_live, mail_key and mail_done with the rows
 *		there.
 *
 * These were PL/pgSQL until 0.3.0.  The statements are the ones those
 * functions ran, so they take the same locks and raise the same errors;
 * each is a kept plan named for it (gatekeeper_plan), its SQL text a
 * static const char beside it.  The claimer's transitions are in
 * mail_state.c, cancel, reap, sync, rotation and purge in
 * mail_state_sweep.c, which calls the two passes here.
 *
 * IDENTIFICATION
 *		src/mail_state_upkeep.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "catalog.h"
#include "gatekeeper.h"
#include "mail_state_upkeep.h"
#include "xact.h"

#include "access/relation.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "common/pg_prng.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "storage/bufmgr.h"
#include "storage/itemptr.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/resowner.h"

PG_FUNCTION_INFO_V1(gatekeeper_mail_truncate);
PG_FUNCTION_INFO_V1(gatekeeper_mail_key_prune);
PG_FUNCTION_INFO_V1(gatekeeper_mail_claim_shrink);
PG_FUNCTION_INFO_V1(gatekeeper_mail_live_restore);
PG_FUNCTION_INFO_V1(gatekeeper_mail_key_restore);

/*
 * The state tables of gatekeeper.mail, in the order a TRUNCATE of it
 * empties them; mail_claim is also the table purge() shrinks.
 */
typedef enum StateTable
{
	STATE_TABLE_LIVE,
	STATE_TABLE_RUN,
	STATE_TABLE_CLAIM,
	STATE_TABLE_KEY,
	STATE_TABLE_DONE,
	NUM_STATE_TABLES
} StateTable;

static const char *const state_table_names[NUM_STATE_TABLES] = {
	[STATE_TABLE_LIVE] = "mail_live",
	[STATE_TABLE_RUN] = "mail_run",
	[STATE_TABLE_CLAIM] = "mail_claim",
	[STATE_TABLE_KEY] = "mail_key",
	[STATE_TABLE_DONE] = "mail_done",
};

/* whether a state table holds a row, and its emptying (by table name) */
static const char table_held_sql[] =
"SELECT EXISTS (SELECT FROM gatekeeper.%s)";

static const char table_truncate_sql[] =
"TRUNCATE gatekeeper.%s";

/*
 * purge's pass over mail_key: in the window of its pages [$1, $2), the
 * keys whose mail is not live with them (passed over by an index probe
 * per key: a scalar subquery, which the planner does not turn into a join
 * that would read all of mail_live) and that their mail does not hold
 * (claimed, or finished within its window), locked without waiting.
 */
static const char key_prune_lock_sql[] =
"SELECT k.ctid FROM gatekeeper.mail_key k "
" WHERE k.ctid = ANY (ARRAY( "
"        SELECT w.ctid FROM gatekeeper.mail_key w "
"         WHERE w.ctid >= $1 AND w.ctid < $2 "
"           AND (SELECT l.id FROM gatekeeper.mail_live l "
"                 WHERE l.id = w.id AND l.queue = w.queue "
"                   AND l.dedupe_key = w.dedupe_key) IS NULL)) "
"   AND NOT gatekeeper._mail_key_held(k.id, k.queue, k.dedupe_key) "
"   FOR UPDATE SKIP LOCKED";

/* the keys locked ($1), tested again under this statement's snapshot */
static const char key_prune_delete_sql[] =
"DELETE FROM gatekeeper.mail_key k "
" WHERE k.ctid = ANY ($1) "
"   AND NOT gatekeeper._mail_key_held(k.id, k.queue, k.dedupe_key)";

/*
 * mail_live_restore: a live row loaded for a mail that has one replaces
 * the columns of the row there ($5, the state, as text: the parameter
 * types of a kept plan are fixed, and gatekeeper.state's OID is not).
 */
static const char live_restore_sql[] =
"UPDATE gatekeeper.mail_live l "
"   SET queue = $2, priority = $3, send_at = $4, state = $5::gatekeeper.state, "
"       attempt = $6, uncharged = $7, worker = $8, message_id = $9, "
"       last_error = $10, dedupe_key = $11, segment = $12 "
" WHERE l.id = $1";

/* mail_done_restore: the live rows of the mail whose outcomes a statement loaded */
static const char done_restore_sql[] =
"DELETE FROM gatekeeper.mail_live l "
" WHERE l.id = ANY (ARRAY(SELECT n.id FROM new_done n))";

/* mail_key_restore: a key's row loaded for a key that has one names its mail */
static const char key_restore_sql[] =
"UPDATE gatekeeper.mail_key k SET id = $3 "
" WHERE k.queue = $1 AND k.dedupe_key = $2";

/*
 * The columns of a mail_live row that live_restore_sql takes, in the
 * order of its parameters, with their parameter types.
 */
#define LIVE_RESTORE_NARGS 12
static const struct
{
	const char *name;
	Oid			type;
}			live_restore_columns[LIVE_RESTORE_NARGS] = {
	{"id", INT8OID},
	{"queue", TEXTOID},
	{"priority", INT4OID},
	{"send_at", TIMESTAMPTZOID},
	{"state", TEXTOID},			/* gatekeeper.state, passed as text */
	{"attempt", INT4OID},
	{"uncharged", INT4OID},
	{"worker", TEXTOID},
	{"message_id", TEXTOID},
	{"last_error", TEXTOID},
	{"dedupe_key", TEXTOID},
	{"segment", INT2OID},
};

static SPIPlanPtr table_held_plan[NUM_STATE_TABLES];
static SPIPlanPtr table_truncate_plan[NUM_STATE_TABLES];
static SPIPlanPtr key_prune_lock_plan = NULL;
static SPIPlanPtr key_prune_delete_plan = NULL;
static SPIPlanPtr live_restore_plan = NULL;
static SPIPlanPtr done_restore_plan = NULL;
static SPIPlanPtr key_restore_plan = NULL;

static bool table_held(StateTable table);
static void table_truncate(StateTable table);
static BlockNumber relation_pages(Oid relid);
static HeapTuple live_restore(TriggerData *trigdata);
static void done_restore(TriggerData *trigdata);

/*
 * Whether a state table holds a row.  Runs inside SPI.
 */
static bool
table_held(StateTable table)
{
	bool		isnull;

	if (table_held_plan[table] == NULL)
		gatekeeper_plan(&table_held_plan[table],
						psprintf(table_held_sql, state_table_names[table]), 0, NULL);
	if (gatekeeper_execute_by_key(table_held_plan[table], NULL, NULL, true, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "could not read gatekeeper.%s", state_table_names[table]);
	return DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
									  &isnull));
}

/*
 * Empty a state table by TRUNCATE.  Runs inside SPI.
 */
static void
table_truncate(StateTable table)
{
	if (table_truncate_plan[table] == NULL)
		gatekeeper_plan(&table_truncate_plan[table],
						psprintf(table_truncate_sql, state_table_names[table]), 0, NULL);
	if (SPI_execute_plan(table_truncate_plan[table], NULL, NULL, false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "could not truncate gatekeeper.%s", state_table_names[table]);
}

/*
 * The size of a table's main fork in pages, as pg_relation_size() gives
 * it in bytes.
 */
static BlockNumber
relation_pages(Oid relid)
{
	Relation	rel = relation_open(relid, AccessShareLock);
	BlockNumber pages = RelationGetNumberOfBlocks(rel);

	relation_close(rel, AccessShareLock);
	return pages;
}

/*
 * _mail_truncate() RETURNS trigger
 *		AFTER TRUNCATE of gatekeeper.mail: the mails' state rows go along,
 *		as with a DELETE (_mail_sync): live rows, claimed batches, dedupe
 *		keys and outcomes, which would otherwise name contentless mail and,
 *		after RESTART IDENTITY, the ids of new mail.
 *
 * A table the same TRUNCATE names is empty by now and left alone:
 * truncating it again here would fail, the statement still holding it
 * open.  Rotation truncates the partitions themselves, which does not
 * fire this.
 */
Datum
gatekeeper_mail_truncate(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	int			t;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_BY_TRUNCATE(trigdata->tg_event) ||
		!TRIGGER_FIRED_AFTER(trigdata->tg_event))
		elog(ERROR, "gatekeeper._mail_truncate must be an AFTER TRUNCATE trigger");
	gatekeeper_require_schema();

	SPI_connect();
	for (t = 0; t < NUM_STATE_TABLES; t++)
	{
		if (table_held((StateTable) t))
			table_truncate((StateTable) t);
	}
	SPI_finish();

	return PointerGetDatum(NULL);
}

/*
 * mail_state_key_prune
 *		Delete the stale rows of mail_key (their mail no longer holds the
 *		key, and no insert of the key took them over since) in a window of
 *		its pages, so that the table stays about as large as the keyed
 *		unfinished mail; the rows deleted.  Runs inside SPI.
 *
 * purge() calls this every few seconds, and mail scheduled far ahead can
 * hold millions of keys: one pass reads batch / 100 pages (about batch
 * keys), a window chosen at random, never the whole table, and so costs
 * the same at any size; a stale key is found after about as many passes as
 * the table has windows (a stale key is harmless meanwhile: every reader of
 * mail_key asks _mail_key_held, and the key's next insert takes the row
 * over).  Candidates are locked first and tested again by the next
 * statement, under its newer snapshot, for the reason the insert trigger
 * does (src/mail.c, write_keys).
 */
int64
mail_state_key_prune(int32 batch)
{
	int64		span = Max(batch / 100, 1);
	int64		pages = relation_pages(gatekeeper_relid(GATEKEEPER_REL_MAIL_KEY, false));
	int64		first = 0;
	ItemPointerData bounds[2];
	Oid			types[2] = {TIDOID, TIDOID};
	Datum		args[2];
	Datum	   *locked;
	Oid			array_type = TIDARRAYOID;
	Datum		array;
	uint64		n;
	uint64		i;

	if (pages > span)
		first = (int64) floor(pg_prng_double(&pg_global_prng_state) *
							  (double) ((pages + span - 1) / span)) * span;
	ItemPointerSet(&bounds[0], (BlockNumber) first, 0);
	ItemPointerSet(&bounds[1], (BlockNumber) Min(first + span, (int64) InvalidBlockNumber), 0);
	args[0] = PointerGetDatum(&bounds[0]);
	args[1] = PointerGetDatum(&bounds[1]);

	gatekeeper_plan(&key_prune_lock_plan, key_prune_lock_sql, 2, types);
	if (gatekeeper_execute_by_key(key_prune_lock_plan, args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not lock stale dedupe keys");
	n = SPI_processed;
	if (n == 0)
		return 0;
	locked = palloc(n * sizeof(Datum));
	for (i = 0; i < n; i++)
	{
		bool		isnull;

		locked[i] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull);
	}
	array = gatekeeper_array(locked, NULL, (int) n, TIDOID);
	SPI_freetuptable(SPI_tuptable);

	gatekeeper_plan(&key_prune_delete_plan, key_prune_delete_sql, 1, &array_type);
	if (gatekeeper_execute_by_key(key_prune_delete_plan, &array, NULL, false, 0) != SPI_OK_DELETE)
		elog(ERROR, "could not delete stale dedupe keys");
	return (int64) SPI_processed;
}

/*
 * _mail_key_prune(batch int) RETURNS bigint
 *		mail_state_key_prune for SQL.  A NULL batch, or one under 200,
 *		reads one page, as PL/pgSQL's greatest(batch / 100, 1) did.
 */
Datum
gatekeeper_mail_key_prune(PG_FUNCTION_ARGS)
{
	int64		pruned;

	gatekeeper_require_schema();
	SPI_connect();
	pruned = mail_state_key_prune(PG_ARGISNULL(0) ? 0 : PG_GETARG_INT32(0));
	SPI_finish();

	PG_RETURN_INT64(pruned);
}

/* mail_state_claim_shrink's lock and TRUNCATE, in its subtransaction */
static bool
claim_shrink_step(void *arg)
{
	Oid			relid = *(Oid *) arg;

	/* under the lock no batch comes or goes: look again */
	if (!ConditionalLockRelationOid(relid, AccessExclusiveLock) ||
		table_held(STATE_TABLE_CLAIM))
		return false;
	table_truncate(STATE_TABLE_CLAIM);
	return true;
}

/* held by others, or a query of this very transaction reads it */
static bool
claim_in_use(ErrorData *error)
{
	return error->sqlerrcode == ERRCODE_LOCK_NOT_AVAILABLE ||
		error->sqlerrcode == ERRCODE_OBJECT_IN_USE;
}

/*
 * mail_state_claim_shrink
 *		Give mail_claim's space back once it holds no batch; whether it
 *		truncated the table.  Runs inside SPI.
 *
 * Every single ack, nack and hand-back writes a new version of its batch's
 * row (with its TOASTed gone array) and the batch's last one deletes it, so
 * a drained burst leaves the table, its TOAST and its indexes all dead, and
 * nothing but a vacuum makes that space usable again: autovacuum comes by
 * once a naptime, and until then every claim and ack goes on extending the
 * files.  A table with no batch left is emptied by TRUNCATE instead, at
 * once and whatever its size.  The lock is taken only if no one holds the
 * table (a claim, ack or reader in progress), so nothing ever waits behind
 * it; purge() tries again next time, as it does when a query of its own
 * transaction still reads the table (TRUNCATE fails with 55006).  Only
 * under READ COMMITTED, whose next statement sees every batch committed
 * before the lock (a REPEATABLE READ snapshot could miss a batch and
 * truncate it away).
 *
 * The lock and the TRUNCATE are a subtransaction's, as they were a
 * PL/pgSQL exception block's: when a batch came in meanwhile, or the
 * TRUNCATE fails, its rollback gives the lock back rather than hold it to
 * the caller's commit.
 */
bool
mail_state_claim_shrink(void)
{
	Oid			relid = gatekeeper_relid(GATEKEEPER_REL_MAIL_CLAIM, false);

	if (relation_pages(relid) == 0 || XactIsoLevel != XACT_READ_COMMITTED ||
		table_held(STATE_TABLE_CLAIM))
		return false;
	return gatekeeper_subxact_try(claim_shrink_step, &relid, claim_in_use);
}

/*
 * _mail_claim_shrink() RETURNS boolean
 *		mail_state_claim_shrink for SQL.
 */
Datum
gatekeeper_mail_claim_shrink(PG_FUNCTION_ARGS)
{
	bool		truncated;

	gatekeeper_require_schema();
	SPI_connect();
	truncated = mail_state_claim_shrink();
	SPI_finish();

	PG_RETURN_BOOL(truncated);
}

/*
 * A live row loaded (NEW) for a mail that has one replaces that row's
 * columns, and is not inserted (NULL); otherwise it is inserted as it is.
 * Runs inside SPI.
 */
static HeapTuple
live_restore(TriggerData *trigdata)
{
	TupleDesc	desc = RelationGetDescr(trigdata->tg_relation);
	HeapTuple	tuple = trigdata->tg_trigtuple;
	Oid			types[LIVE_RESTORE_NARGS];
	Datum		args[LIVE_RESTORE_NARGS];
	char		nulls[LIVE_RESTORE_NARGS];
	int			i;

	for (i = 0; i < LIVE_RESTORE_NARGS; i++)
	{
		int			attnum = SPI_fnumber(desc, live_restore_columns[i].name);
		bool		isnull;

		if (attnum <= 0)
			elog(ERROR, "gatekeeper.mail_live has no column %s", live_restore_columns[i].name);
		types[i] = live_restore_columns[i].type;
		args[i] = SPI_getbinval(tuple, desc, attnum, &isnull);
		nulls[i] = isnull ? 'n' : ' ';
		if (isnull)
			continue;
		if (strcmp(live_restore_columns[i].name, "state") == 0)
			args[i] = CStringGetTextDatum(SPI_getvalue(tuple, desc, attnum));
		else if (TupleDescAttr(desc, attnum - 1)->atttypid != types[i])
			elog(ERROR, "gatekeeper.mail_live.%s has an unexpected type",
				 live_restore_columns[i].name);
	}
	gatekeeper_plan(&live_restore_plan, live_restore_sql, LIVE_RESTORE_NARGS, types);
	if (gatekeeper_execute_by_key(live_restore_plan, args, nulls, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "could not restore a live row");
	return SPI_processed > 0 ? NULL : tuple;
}

/*
 * The outcomes a statement loaded into mail_done (the transition table
 * new_done) remove the live rows of their mail.  Runs inside SPI.
 */
static void
done_restore(TriggerData *trigdata)
{
	if (SPI_register_trigger_data(trigdata) != SPI_OK_TD_REGISTER)
		elog(ERROR, "SPI_register_trigger_data failed");
	gatekeeper_plan(&done_restore_plan, done_restore_sql, 0, NULL);
	if (gatekeeper_execute_by_key(done_restore_plan, NULL, NULL, false, 0) != SPI_OK_DELETE)
		elog(ERROR, "could not remove the live rows of restored outcomes");
}

/*
 * _mail_live_restore() RETURNS trigger
 *		BEFORE INSERT of a row of mail_live, and AFTER INSERT of a statement's
 *		rows of mail_done (as new_done), by a statement not gatekeeper's
 *		own: a restore.
 *
 * pg_dump dumps the data of mail and mail_done into their partitions
 * (mail_0, mail_done_0, ...), where the statement trigger of
 * gatekeeper.mail does not fire, and mail_live's rows as they were.  A
 * dump loaded through the partitioned tables instead
 * (--load-via-partition-root) passes the trigger, which sees a dump being
 * loaded (src/catalog.c, gatekeeper_writer) and makes no live rows either.
 * Rows loaded through them otherwise (check_function_bodies on) get fresh
 * live rows: a restored live row replaces the fresh one, and a restored
 * outcome removes the live row of its mail.
 */
Datum
gatekeeper_mail_live_restore(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	HeapTuple	result = NULL;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
		elog(ERROR, "gatekeeper._mail_live_restore must be an INSERT trigger");
	gatekeeper_require_schema();

	SPI_connect();
	if (TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) &&
		TRIGGER_FIRED_BEFORE(trigdata->tg_event) &&
		RelationGetRelid(trigdata->tg_relation) ==
		gatekeeper_relid(GATEKEEPER_REL_MAIL_LIVE, false))
		result = live_restore(trigdata);
	else if (TRIGGER_FIRED_FOR_STATEMENT(trigdata->tg_event) &&
			 trigdata->tg_newtable != NULL)
		done_restore(trigdata);
	else
		elog(ERROR, "gatekeeper._mail_live_restore fires before an INSERT of a row of mail_live, or after an INSERT statement with its new rows");
	SPI_finish();

	return PointerGetDatum(result);
}

/*
 * _mail_key_restore() RETURNS trigger
 *		BEFORE INSERT of a row of mail_key by a statement not gatekeeper's
 *		own: a restore.
 *
 * mail_key is dumped with the rest: its rows load as they were, stale ones
 * included (they stay stale).  A dump loaded through gatekeeper.mail with
 * the trigger on has already written the keys of the mails it made live;
 * a dumped row then replaces the key's row instead of failing.
 */
Datum
gatekeeper_mail_key_restore(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	TupleDesc	desc;
	HeapTuple	tuple;
	static const char *const columns[3] = {"queue", "dedupe_key", "id"};
	Oid			types[3] = {TEXTOID, TEXTOID, INT8OID};
	Datum		args[3];
	char		nulls[3];
	bool		replaced;
	int			i;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_BY_INSERT(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) || !TRIGGER_FIRED_BEFORE(trigdata->tg_event))
		elog(ERROR, "gatekeeper._mail_key_restore must be a BEFORE INSERT trigger for each row");
	gatekeeper_require_schema();

	desc = RelationGetDescr(trigdata->tg_relation);
	tuple = trigdata->tg_trigtuple;
	for (i = 0; i < 3; i++)
	{
		int			attnum = SPI_fnumber(desc, columns[i]);
		bool		isnull;

		if (attnum <= 0 || TupleDescAttr(desc, attnum - 1)->atttypid != types[i])
			elog(ERROR, "gatekeeper.mail_key has no column %s of the expected type", columns[i]);
		args[i] = SPI_getbinval(tuple, desc, attnum, &isnull);
		nulls[i] = isnull ? 'n' : ' ';
	}

	SPI_connect();
	gatekeeper_plan(&key_restore_plan, key_restore_sql, 3, types);
	if (gatekeeper_execute_by_key(key_restore_plan, args, nulls, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "could not restore a dedupe key's row");
	replaced = SPI_processed > 0;
	SPI_finish();

	return PointerGetDatum(replaced ? NULL : tuple);
}
