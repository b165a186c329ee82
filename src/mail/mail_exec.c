/*-------------------------------------------------------------------------
 *
 * mail_exec.c
 *		The one executor helper of the mail's direct writers.
 *
 * The hot writes of the mail tables (a claim's deletes and run updates,
 * its batch rows, the outcome rows of finished mail, new mail's live rows
 * and runs) go past the executor: no plan, no projection, no transition
 * table (docs/internals.md, "Direct writes").  What each of them still
 * needs from the executor is the same: a result relation with its indexes
 * open, an executor state for the index entries' expressions and the
 * constraints, the tuple written and then its index entries, and all of it
 * closed again.  This file is that, once.  The caller opens and locks the
 * relation, decides that the direct path may write it (no trigger of the
 * user's, the columns it expects) and closes it.
 *
 * IDENTIFICATION
 *		src/mail/mail_exec.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "mail_exec.h"

#include "executor/executor.h"
#include "nodes/makefuncs.h"
#include "utils/rel.h"

/*
 * mail_exec_estate
 *		An executor state for direct writes made under command cid, for
 *		relations that share one.
 */
EState *
mail_exec_estate(CommandId cid)
{
	EState	   *estate = CreateExecutorState();

	estate->es_output_cid = cid;
	return estate;
}

/*
 * mail_exec_open
 *		Set x up to write rel under command cid: its result relation info
 *		and its indexes, in an executor state of its own.
 */
void
mail_exec_open(MailExec *x, Relation rel, CommandId cid)
{
	mail_exec_open_in(x, rel, mail_exec_estate(cid));
	x->own_estate = true;
}

/*
 * mail_exec_open_in
 *		Set x up to write rel in estate, which other relations written by
 *		the same caller share and the caller frees.
 */
void
mail_exec_open_in(MailExec *x, Relation rel, EState *estate)
{
	x->own_estate = false;
	x->estate = estate;
	x->cid = estate->es_output_cid;
	x->rel = rel;
	x->rri = makeNode(ResultRelInfo);
	/* no range table: ri_RangeTableIndex 0, which ExecConstraints allows */
	InitResultRelInfo(x->rri, rel, 0, NULL, 0);
	ExecOpenIndices(x->rri, false);
}

/*
 * mail_exec_close
 *		Close x's indexes and free its executor state if it is its own; the
 *		relation stays open.
 */
void
mail_exec_close(MailExec *x)
{
	if (x->rri == NULL)
		return;
	ExecCloseIndices(x->rri);
	if (x->own_estate)
		FreeExecutorState(x->estate);
	x->rri = NULL;
	x->estate = NULL;
}

/*
 * mail_exec_check
 *		Check the slot's row against the relation's constraints (NOT NULL,
 *		CHECK), as the executor does before an insert.
 */
void
mail_exec_check(MailExec *x, TupleTableSlot *slot)
{
	if (RelationGetDescr(x->rel)->constr != NULL)
		ExecConstraints(x->rri, slot, x->estate);
}

/*
 * mail_exec_index
 *		Insert the index entries of the slot's row, just written (update:
 *		a new version of a row by a non-HOT update); unique indexes are
 *		checked as the executor checks them.
 */
void
mail_exec_index(MailExec *x, TupleTableSlot *slot, bool update)
{
	ResetPerTupleExprContext(x->estate);
	list_free(ExecInsertIndexTuples(x->rri, slot, x->estate, update, false, NULL, NIL));
}

/*
 * mail_exec_insert
 *		Insert the slot's row and its index entries.
 */
void
mail_exec_insert(MailExec *x, TupleTableSlot *slot)
{
	table_tuple_insert(x->rel, slot, x->cid, 0, NULL);
	mail_exec_index(x, slot, false);
}

/*
 * mail_exec_insert_heap
 *		Insert n rows at once, as COPY does, without their index entries:
 *		the caller then calls mail_exec_index for each slot, doing its own
 *		work for each row after its entries exist.
 */
void
mail_exec_insert_heap(MailExec *x, TupleTableSlot **slots, int n, BulkInsertState bistate)
{
	table_multi_insert(x->rel, slots, n, x->cid, 0, bistate);
}

/*
 * mail_exec_update
 *		Replace the row at tid by the slot's, under snapshot (waiting for a
 *		concurrent writer if wait), with the new version's index entries
 *		unless the update was HOT.  The result is table_tuple_update's.
 */
TM_Result
mail_exec_update(MailExec *x, ItemPointer tid, TupleTableSlot *slot,
				 Snapshot snapshot, bool wait, TM_FailureData *tmfd)
{
	LockTupleMode lockmode;
	bool		update_indexes;
	TM_Result	result;

	result = table_tuple_update(x->rel, tid, slot, x->cid, snapshot, InvalidSnapshot,
								wait, tmfd, &lockmode, &update_indexes);
	if (result == TM_Ok && update_indexes)
		mail_exec_index(x, slot, true);
	return result;
}

/*
 * mail_exec_delete
 *		Delete the row at tid of rel under snapshot (waiting for a
 *		concurrent writer if wait); index entries go with the row at the
 *		next vacuum.  The result is table_tuple_delete's.
 */
TM_Result
mail_exec_delete(Relation rel, ItemPointer tid, CommandId cid, Snapshot snapshot,
				 bool wait, TM_FailureData *tmfd)
{
	return table_tuple_delete(rel, tid, cid, snapshot, InvalidSnapshot, wait, tmfd, false);
}
