/*-------------------------------------------------------------------------
 *
 * claim_writer.c
 *		A claim's batch rows written into gatekeeper.mail_claim past the
 *		executor.
 *
 * The statement it replaces (src/claim.c, claim_batch_sql),
 *
 *		INSERT INTO mail_claim (queue, worker, lease_until, lo, hi, open, mails, owner)
 *		SELECT $1, $2, now() + $3, $4[i], $5[i], ..., $7[...], $8
 *		  FROM generate_series(1, cardinality($4)) i
 *
 * started an executor for a function scan, a projection that sliced the
 * array of every mail's record and an insert, once per queue of every
 * claim: about 4% of a claimer's CPU at batch 100, more than writing the
 * row itself (docs/internals.md, "The claim's statements").  Here each row is
 * formed from its slice of the records, the columns the statement leaves
 * out (the batch number, gone) get their defaults as the statement gives
 * them, and the row is inserted with its index entries (the primary key
 * checked as the statement checks it).  heap_insert compresses and moves
 * the records out of line as the statement's insert does.
 *
 * The direct path is taken only when it does what the statement would:
 * mail_claim a heap without insert triggers, its columns of the types the
 * statement gives them.  Otherwise the statement runs.
 *
 * IDENTIFICATION
 *		src/claim_writer.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "claim_writer.h"
#include "catalog.h"
#include "mail_exec.h"

#include "access/table.h"
#include "access/tableam.h"
#include "catalog/pg_am.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "nodes/makefuncs.h"
#include "optimizer/optimizer.h"
#include "rewrite/rewriteHandler.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"

/* the columns the statement names, in its order */
static const char *const claim_names[] = {
	"queue", "worker", "lease_until", "lo", "hi", "open", "mails", "owner"
};
enum
{
	C_QUEUE, C_WORKER, C_LEASE_UNTIL, C_LO, C_HI, C_OPEN, C_MAILS, C_OWNER, C_NUM
};

/*
 * mail_claim's layout as the direct path writes it: where each named
 * column is, and every other column's default, planned.  Read once and
 * kept until the table changes (any invalidation of its relcache entry:
 * an ALTER TABLE, a new trigger, the extension made again), so a claim
 * reads no catalog and plans nothing.
 */
typedef struct ClaimLayout
{
	bool		valid;
	uint32		generation;		/* gatekeeper_relid_generation when read */
	Oid			records_type;	/* the mails column's type it was read for */
	bool		plain;			/* the columns are of the statement's types */
	AttrNumber	att[C_NUM];
	Expr	  **defaults;		/* per column; NULL: none, or named above */
} ClaimLayout;

static ClaimLayout layout;
static MemoryContext layout_cxt = NULL;

static ClaimLayout *
claim_layout(Relation rel, Oid records_type)
{
	TupleDesc	desc = RelationGetDescr(rel);
	const Oid	types[C_NUM] = {TEXTOID, TEXTOID, TIMESTAMPTZOID, INT8OID, INT8OID,
	INT4OID, records_type, OIDOID};
	uint32		generation = gatekeeper_relid_generation(GATEKEEPER_REL_MAIL_CLAIM);
	MemoryContext old;
	int			i;

	if (layout.valid && layout.generation == generation &&
		layout.records_type == records_type)
		return &layout;

	if (layout_cxt == NULL)
		layout_cxt = AllocSetContextCreate(TopMemoryContext, "gatekeeper claim writer",
										   ALLOCSET_SMALL_SIZES);
	MemoryContextReset(layout_cxt);
	memset(&layout, 0, sizeof(layout));
	old = MemoryContextSwitchTo(layout_cxt);
	layout.plain = true;
	for (i = 0; i < C_NUM; i++)
	{
		layout.att[i] = SPI_fnumber(desc, claim_names[i]);
		if (layout.att[i] <= 0 || TupleDescAttr(desc, layout.att[i] - 1)->atttypid != types[i])
			layout.plain = false;
	}
	layout.defaults = palloc0(desc->natts * sizeof(Expr *));
	for (i = 0; layout.plain && i < desc->natts; i++)
	{
		Form_pg_attribute a = TupleDescAttr(desc, i);
		Node	   *expr;
		int			k;

		if (a->attgenerated)
			layout.plain = false;
		if (a->attisdropped || a->attgenerated)
			continue;
		for (k = 0; k < C_NUM && layout.att[k] != i + 1; k++)
			;
		if (k < C_NUM)
			continue;
		/* the batch number from its identity sequence, gone '{}' */
		expr = build_column_default(rel, i + 1);
		if (expr != NULL)
			layout.defaults[i] = expression_planner((Expr *) expr);
	}
	MemoryContextSwitchTo(old);
	layout.generation = generation;
	layout.records_type = records_type;
	layout.valid = true;
	return &layout;
}

/*
 * gatekeeper_claim_write
 *		Write nrows batch rows of queue's claim by owner into mail_claim:
 *		row i holds records[start[i]] up to records[start[i + 1]] (mail_live
 *		records of type records_type's elements), of ids lo[i] to hi[i].
 *		False, with nothing written, when the statement must write them.
 */
bool
gatekeeper_claim_write(Datum queue, text *worker, Oid owner, TimestampTz lease_until, int nrows,
					   const int64 *lo, const int64 *hi, const int *start,
					   Datum *records, Oid record_type, Oid records_type)
{
	Relation	rel;
	MailExec	x;
	ExprContext *econtext;
	TupleTableSlot *slot;
	TupleDesc	desc;
	ClaimLayout *l;
	ExprState **defaults;
	uint32		found;
	int16		typlen;
	bool		typbyval;
	char		typalign;
	int			i;
	int			k;

	rel = table_open(gatekeeper_relid(GATEKEEPER_REL_MAIL_CLAIM, false), RowExclusiveLock);
	desc = RelationGetDescr(rel);
	l = claim_layout(rel, records_type);
	if (rel->rd_rel->relam != HEAP_TABLE_AM_OID || !l->plain ||
		!gatekeeper_triggers_only(rel, TRIGGER_TYPE_INSERT, NULL, 0, &found))
	{
		table_close(rel, NoLock);
		return false;
	}
	mail_exec_open(&x, rel, GetCurrentCommandId(true));
	defaults = palloc0(desc->natts * sizeof(ExprState *));
	for (k = 0; k < desc->natts; k++)
		if (l->defaults[k] != NULL)
			defaults[k] = ExecInitExpr(l->defaults[k], NULL);
	econtext = GetPerTupleExprContext(x.estate);
	slot = table_slot_create(rel, NULL);
	get_typlenbyvalalign(record_type, &typlen, &typbyval, &typalign);

	for (i = 0; i < nrows; i++)
	{
		Datum	   *v = slot->tts_values;
		bool	   *n = slot->tts_isnull;

		ExecClearTuple(slot);
		ResetPerTupleExprContext(x.estate);
		for (k = 0; k < desc->natts; k++)
		{
			n[k] = true;
			v[k] = (Datum) 0;
			if (defaults[k] != NULL)
				v[k] = ExecEvalExprSwitchContext(defaults[k], econtext, &n[k]);
		}
#define SET(col, value) (v[l->att[col] - 1] = (value), n[l->att[col] - 1] = false)
		SET(C_QUEUE, queue);
		SET(C_LEASE_UNTIL, TimestampTzGetDatum(lease_until));
		SET(C_OWNER, ObjectIdGetDatum(owner));
		SET(C_LO, Int64GetDatum(lo[i]));
		SET(C_HI, Int64GetDatum(hi[i]));
		SET(C_OPEN, Int32GetDatum(start[i + 1] - start[i]));
		SET(C_MAILS, PointerGetDatum(construct_array(records + start[i],
													 start[i + 1] - start[i], record_type,
													 typlen, typbyval, typalign)));
#undef SET
		v[l->att[C_WORKER] - 1] = PointerGetDatum(worker);
		n[l->att[C_WORKER] - 1] = worker == NULL;
		ExecStoreVirtualTuple(slot);
		mail_exec_check(&x, slot);
		mail_exec_insert(&x, slot);
	}

	ExecDropSingleTupleTableSlot(slot);
	mail_exec_close(&x);
	table_close(rel, NoLock);
	/* as SPI does after a statement: later commands see the rows */
	CommandCounterIncrement();
	return true;
}
