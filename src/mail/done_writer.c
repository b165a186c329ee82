/*-------------------------------------------------------------------------
 *
 * done_writer.c
 *		Finished mail's outcomes written into gatekeeper.mail_done past
 *		the executor: every ack's, nack's and claim's.
 *
 * The statement it replaces,
 *
 *		INSERT INTO mail_done (...) SELECT ..., now() FROM unnest($1)
 *
 * with $1 the finished mails' mail_live records, went through the
 * executor row by row: unnest, the projection, partition routing, and the
 * count trigger's transition table filled and read back.  It was two
 * thirds of an ack's cost in the worker's profile (docs/internals.md,
 * "The ack's outcome rows").  Here each record is deformed once, its
 * outcome row formed for its segment's partition, the rows written with
 * table_multi_insert() and their index entries inserted (the primary key
 * checked as the statement checks it), and the outcomes counted into the
 * queues' totals through the one tally the count trigger uses too
 * (mail_count.c).
 *
 * The direct path is taken only when it does what the statement would:
 * mail_done's insert triggers are its own two (the restore trigger, which
 * gatekeeper's own statements skip, and the count trigger, enabled) and
 * the partitions the rows go to have none; each of those partitions'
 * columns are mail_done's, of the record's types.  Otherwise the statement
 * runs (src/mail_state.c).
 *
 * IDENTIFICATION
 *		src/done_writer.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "done_writer.h"
#include "catalog.h"
#include "mail_exec.h"
#include "mail_count.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_am.h"
#include "catalog/pg_type.h"
#include "catalog/pg_trigger.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/timestamp.h"

/* rows a partition's buffer holds before they are written */
#define DONE_BATCH 1000

/* One segment's partition of mail_done, open for writing. */
typedef struct DonePart
{
	Relation	rel;
	MailExec	x;				/* opened at the partition's first row */
	AttrNumber *source;			/* per attribute: the record's, 0 for
								 * finished_at, -1 for a dropped one */
	int			queue_att;		/* the partition's queue and state, */
	int			state_att;		/* as indexes into a slot's values */
	TupleTableSlot *slots[DONE_BATCH];
	int			nslots;
	int			nmade;
} DonePart;

/*
 * Whether the partitioned mail_done's insert triggers that fire now are
 * only its own two, the count trigger among them, so the direct path
 * counts what the statement would have counted and fires nothing it would
 * have fired.
 */
static bool
done_triggers_plain(Relation parent)
{
	/* the restore trigger fires only for writers other than gatekeeper's own */
	static const char *const own[] = {"mail_done_restore", "mail_done_count"};
	uint32		found;

	return gatekeeper_triggers_only(parent, TRIGGER_TYPE_INSERT, own, lengthof(own), &found) &&
		(found & 2) != 0;
}

/*
 * Open segment's partition: false when the direct path may not write it.
 * Its indexes are opened at its first row.
 */
static bool
open_part(DonePart *p, int segment, LiveRecord *lr)
{
	Oid			relid = gatekeeper_relid(GATEKEEPER_REL_MAIL_DONE_PART(segment), false);
	TupleDesc	desc;
	uint32		found;
	int			i;

	p->rel = table_open(relid, RowExclusiveLock);
	desc = RelationGetDescr(p->rel);
	/* a row trigger of the partitioned table is each partition's */
	if (p->rel->rd_rel->relam != HEAP_TABLE_AM_OID ||
		!gatekeeper_triggers_only(p->rel, TRIGGER_TYPE_INSERT, NULL, 0, &found))
		return false;
	p->source = palloc(desc->natts * sizeof(AttrNumber));
	p->queue_att = p->state_att = -1;
	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		int			src;

		p->source[i] = -1;
		if (att->attisdropped)
			continue;
		if (strcmp(NameStr(att->attname), "finished_at") == 0)
		{
			if (att->atttypid != TIMESTAMPTZOID)
				return false;
			p->source[i] = 0;
			continue;
		}
		src = SPI_fnumber(lr->desc, NameStr(att->attname));
		if (src <= 0 || TupleDescAttr(lr->desc, src - 1)->atttypid != att->atttypid)
			return false;
		p->source[i] = src;
		if (src == lr->queue)
			p->queue_att = i;
		else if (src == lr->state)
			p->state_att = i;
	}
	return p->queue_att >= 0 && p->state_att >= 0;
}

/* The segment a record's row goes to; -1 when it names none. */
static int
record_segment(LiveRecord *lr, Datum record)
{
	bool		isnull;
	Datum		d = mail_state_record_attr(lr, record, lr->segment, &isnull);

	return isnull ? -1 : DatumGetInt16(d);
}

/*
 * Write a partition's buffered rows, their index entries (the primary key
 * checked, as the statement checks it), and count them.
 */
static void
flush_part(DonePart *p, MailCount *count, Oid state_type)
{
	int			k;

	if (p->nslots == 0)
		return;
	mail_exec_insert_heap(&p->x, p->slots, p->nslots, NULL);
	for (k = 0; k < p->nslots; k++)
	{
		TupleTableSlot *slot = p->slots[k];

		mail_exec_index(&p->x, slot, false);
		if (!slot->tts_isnull[p->queue_att] && !slot->tts_isnull[p->state_att])
			mail_count_move(count, slot->tts_values[p->queue_att],
							mail_count_outcome(state_type,
											   DatumGetObjectId(slot->tts_values[p->state_att])),
							0, 0);
		ExecClearTuple(slot);
	}
	p->nslots = 0;
}

/*
 * gatekeeper_done_write
 *		Write n records into mail_done, in the state each holds, finished
 *		now; false (nothing written) when the statement must write them.
 */
bool
gatekeeper_done_write(LiveRecord *lr, Datum *records, int n)
{
	Relation	parent;
	EState	   *estate;
	DonePart	parts[GATEKEEPER_SEGMENTS];
	bool		written[GATEKEEPER_SEGMENTS];
	Datum	   *values;
	bool	   *nulls;
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	MailCount  *count;
	bool		plain;
	int			i;
	int			k;

	parent = table_open(gatekeeper_relid(GATEKEEPER_REL_MAIL_DONE, false), RowExclusiveLock);
	plain = done_triggers_plain(parent);
	memset(parts, 0, sizeof(parts));
	memset(written, 0, sizeof(written));
	estate = mail_exec_estate(GetCurrentCommandId(true));
	values = palloc(lr->desc->natts * sizeof(Datum));
	nulls = palloc(lr->desc->natts * sizeof(bool));

	/* every partition the rows go to checked before any row is written */
	for (i = 0; plain && i < n; i++)
	{
		int			segment = record_segment(lr, records[i]);

		if (segment >= 0 && segment < GATEKEEPER_SEGMENTS)
			written[segment] = true;
	}
	for (i = 0; plain && i < GATEKEEPER_SEGMENTS; i++)
		if (written[i])
			plain = open_part(&parts[i], i, lr);

	/* each record's row, in its segment's partition */
	count = plain ? mail_count_start(InvalidOid) : NULL;
	for (i = 0; plain && i < n; i++)
	{
		int			segment;
		DonePart   *p;
		TupleTableSlot *slot;
		TupleDesc	desc;

		mail_state_record_deform(lr, records[i], values, nulls);
		segment = nulls[lr->segment - 1] ? -1 : DatumGetInt16(values[lr->segment - 1]);
		if (segment < 0 || segment >= GATEKEEPER_SEGMENTS)
			ereport(ERROR,
					(errcode(ERRCODE_CHECK_VIOLATION),
					 errmsg("no partition of relation \"%s\" found for row",
							RelationGetRelationName(parent))));
		p = &parts[segment];
		if (p->x.rri == NULL)
			mail_exec_open_in(&p->x, p->rel, estate);
		if (p->nslots == p->nmade)
			p->slots[p->nmade++] = table_slot_create(p->rel, NULL);
		slot = p->slots[p->nslots++];
		desc = RelationGetDescr(p->rel);
		for (k = 0; k < desc->natts; k++)
		{
			if (p->source[k] > 0)
			{
				slot->tts_values[k] = values[p->source[k] - 1];
				slot->tts_isnull[k] = nulls[p->source[k] - 1];
			}
			else
			{
				slot->tts_values[k] = TimestampTzGetDatum(now);
				slot->tts_isnull[k] = p->source[k] < 0;
			}
		}
		ExecStoreVirtualTuple(slot);
		ExecMaterializeSlot(slot);
		mail_exec_check(&p->x, slot);
		if (p->nslots == DONE_BATCH)
			flush_part(p, count, lr->state_type);
	}
	for (i = 0; plain && i < GATEKEEPER_SEGMENTS; i++)
		flush_part(&parts[i], count, lr->state_type);
	if (count != NULL)
		mail_count_end(count);

	for (i = 0; i < GATEKEEPER_SEGMENTS; i++)
	{
		DonePart   *p = &parts[i];

		if (p->rel == NULL)
			continue;
		for (k = 0; k < p->nmade; k++)
			ExecDropSingleTupleTableSlot(p->slots[k]);
		mail_exec_close(&p->x);
		table_close(p->rel, NoLock);
	}
	FreeExecutorState(estate);
	table_close(parent, NoLock);
	if (plain)
		/* as SPI does after a statement: later commands see the rows */
		CommandCounterIncrement();
	return plain;
}
