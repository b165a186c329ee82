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
 * user's, the columns it expects) and closes it.  A bulk write (a COPY's)
 * may have its hash index entries held back and inserted in bucket order
 * (mail_exec_hold_hash).
 *
 * IDENTIFICATION
 *		src/mail/mail_exec.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "mail_exec.h"

#include "access/hash.h"
#include "catalog/pg_am_d.h"
#include "executor/executor.h"
#include "nodes/makefuncs.h"
#include "utils/memutils.h"
#include "utils/rel.h"

/*
 * A hash index entry held back: its key's hash code, its bits reversed
 * (where its bucket sorts), its index (of the result relation's) and the
 * row's TID.  A hash index's entry is only its key's hash code.
 */
typedef struct HeldEntry
{
	uint32		order;
	int16		index;			/* in ri_IndexRelationDescs */
	ItemPointerData tid;
} HeldEntry;

/*
 * The hash index entries of a bulk write, held back to be inserted in
 * bucket order (mail_exec_hold_hash): the entries, and at most how many
 * there may be before they are inserted.
 */
typedef struct MailExecHeld
{
	HeldEntry  *entries;
	int			n;
	int			size;			/* entries allocated */
	int			limit;
	int			nindexes;
	int		   *indexes;		/* held indexes, in ri_IndexRelationDescs */
	AttrNumber *attnums;		/* each one's column */
} MailExecHeld;

static void held_add(MailExec *x, TupleTableSlot *slot);
static uint32 reverse_bits(uint32 v);

/* held entries: by index, then bucket (the code's low bits first), then TID */
static inline int
held_cmp(const HeldEntry *a, const HeldEntry *b)
{
	if (a->index != b->index)
		return a->index < b->index ? -1 : 1;
	if (a->order != b->order)
		return a->order < b->order ? -1 : 1;
	return ItemPointerCompare((ItemPointer) &a->tid, (ItemPointer) &b->tid);
}

/* sort_held: qsort with held_cmp inlined */
#define ST_SORT sort_held
#define ST_ELEMENT_TYPE HeldEntry
#define ST_COMPARE(a, b) held_cmp(a, b)
#define ST_SCOPE static
#define ST_DEFINE
#include "lib/sort_template.h"

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
	x->held = NULL;
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
	mail_exec_index_held(x);
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
	if (x->held != NULL)
		held_add(x, slot);
}

/*
 * mail_exec_hold_hash
 *		From now on, hold back the entries of x's hash indexes on a column
 *		(gatekeeper.mail_recipient) and insert them in the order of their
 *		buckets, each time they take limit bytes (12 bytes an entry) and
 *		at close (mail_exec_index_held).
 *
 * A hash index finds an entry's bucket from the low bits of its key's hash
 * code, and keeps a bucket's page sorted by the code.  Entries inserted in
 * the order their rows come in go each to a page of the index at random,
 * reading and locking it, searching it and writing it again, its lines
 * out of the processor's cache: of a COPY into gatekeeper.mail, a fifth
 * of the time went there (docs/internals.md, "Bulk enqueue").  Sorted by
 * their codes' bits reversed, the entries of one bucket come together
 * whatever the index's size, and each page is found and stays in the
 * cache for a run of them, as hashbuild's spool sorts a large build's
 * entries by bucket.  An entry is only its key's hash code and its row's
 * TID, so the key is hashed once and not kept.  A hash index is never
 * unique, so no error of the statement's rows depends on when its entries
 * go in, and they all exist before the statement ends.  Only indexes on a
 * plain column, without a predicate, are held.
 */
void
mail_exec_hold_hash(MailExec *x, Size limit)
{
	ResultRelInfo *rri = x->rri;
	MemoryContext old = MemoryContextSwitchTo(x->estate->es_query_cxt);
	MailExecHeld *held;
	int			i;

	Assert(x->held == NULL);
	held = palloc0(sizeof(MailExecHeld));
	held->indexes = palloc(sizeof(int) * Max(rri->ri_NumIndices, 1));
	held->attnums = palloc(sizeof(AttrNumber) * Max(rri->ri_NumIndices, 1));
	for (i = 0; i < rri->ri_NumIndices; i++)
	{
		Relation	index = rri->ri_IndexRelationDescs[i];
		IndexInfo  *info = rri->ri_IndexRelationInfo[i];

		if (index->rd_rel->relam != HASH_AM_OID || !info->ii_ReadyForInserts ||
			info->ii_NumIndexKeyAttrs != 1 || info->ii_IndexAttrNumbers[0] <= 0 ||
			info->ii_Expressions != NIL || info->ii_Predicate != NIL)
			continue;
		/* ExecInsertIndexTuples passes it by; held_add makes its entries */
		info->ii_ReadyForInserts = false;
		held->indexes[held->nindexes] = i;
		held->attnums[held->nindexes] = info->ii_IndexAttrNumbers[0];
		held->nindexes++;
	}
	if (held->nindexes > 0)
	{
		held->limit = (int) Min(Max(limit / sizeof(HeldEntry), 1024), INT_MAX / 2);
		held->size = 1024;
		held->entries = palloc(sizeof(HeldEntry) * held->size);
		x->held = held;
	}
	MemoryContextSwitchTo(old);
}

/*
 * held_add
 *		Hold back the slot's row's entries of the held indexes (a null key
 *		has none, as hashinsert makes none), inserting what is held when it
 *		reaches its limit.
 */
static void
held_add(MailExec *x, TupleTableSlot *slot)
{
	MailExecHeld *held = x->held;
	int			j;

	for (j = 0; j < held->nindexes; j++)
	{
		Relation	index = x->rri->ri_IndexRelationDescs[held->indexes[j]];
		HeldEntry  *e;
		Datum		value;
		bool		isnull;

		value = slot_getattr(slot, held->attnums[j], &isnull);
		if (isnull)
			continue;
		if (held->n == held->size)
		{
			MemoryContext old = MemoryContextSwitchTo(x->estate->es_query_cxt);

			held->size *= 2;
			held->entries = repalloc_huge(held->entries, sizeof(HeldEntry) * held->size);
			MemoryContextSwitchTo(old);
		}
		e = &held->entries[held->n++];
		e->order = reverse_bits(_hash_datum2hashkey(index, value));
		e->index = held->indexes[j];
		e->tid = slot->tts_tid;
	}
	if (held->n >= held->limit)
		mail_exec_index_held(x);
}

/*
 * mail_exec_index_held
 *		Insert the held index entries, in the order of their buckets, as
 *		hashinsert would insert each: its key's hash code, its row's TID.
 */
void
mail_exec_index_held(MailExec *x)
{
	MailExecHeld *held = x->held;
	MemoryContext old;
	int			i;

	if (held == NULL || held->n == 0)
		return;
	sort_held(held->entries, held->n);
	old = MemoryContextSwitchTo(GetPerTupleMemoryContext(x->estate));
	for (i = 0; i < held->n; i++)
	{
		HeldEntry  *e = &held->entries[i];
		Relation	index = x->rri->ri_IndexRelationDescs[e->index];
		Datum		code = UInt32GetDatum(reverse_bits(e->order));
		bool		isnull = false;
		IndexTuple	itup;

		itup = index_form_tuple(RelationGetDescr(index), &code, &isnull);
		itup->t_tid = e->tid;
		_hash_doinsert(index, itup, x->rel);
		pfree(itup);
	}
	MemoryContextSwitchTo(old);
	held->n = 0;
}

/* v with its bits in the reverse order: its low bits sort first */
static uint32
reverse_bits(uint32 v)
{
	v = ((v >> 1) & 0x55555555) | ((v & 0x55555555) << 1);
	v = ((v >> 2) & 0x33333333) | ((v & 0x33333333) << 2);
	v = ((v >> 4) & 0x0F0F0F0F) | ((v & 0x0F0F0F0F) << 4);
	v = ((v >> 8) & 0x00FF00FF) | ((v & 0x00FF00FF) << 8);
	return (v >> 16) | (v << 16);
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
 * mail_exec_new_version
 *		Start the new version of the row in from: to cleared and given all of
 *		from's values (pointing into from's tuple, which stays as it is until
 *		the update), for the caller to change some of them and store with
 *		ExecStoreVirtualTuple before mail_exec_update.
 */
void
mail_exec_new_version(TupleTableSlot *from, TupleTableSlot *to)
{
	int			i;

	ExecClearTuple(to);
	slot_getallattrs(from);
	for (i = 0; i < to->tts_tupleDescriptor->natts; i++)
	{
		to->tts_values[i] = from->tts_values[i];
		to->tts_isnull[i] = from->tts_isnull[i];
	}
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
