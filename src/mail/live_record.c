/*-------------------------------------------------------------------------
 *
 * live_record.c
 *		Reading a record of gatekeeper.mail_live's row type, as the claim
 *		returns it and a batch holds it: all its values, or one.
 *
 * Below both a claimed mail's transitions (src/mail/mail_state.c, which
 * also looks the row type up: mail_state_record_init) and the outcomes'
 * writer (src/mail/done_writer.c), which both read records and one of
 * which calls the other.
 *
 * IDENTIFICATION
 *		src/mail/live_record.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "live_record.h"

#include "access/htup_details.h"
#include "fmgr.h"
#include "storage/itemptr.h"

/* A record as a heap tuple of its row type, pointing into the record. */
static void
record_tuple(Datum record, HeapTupleData *tuple)
{
	HeapTupleHeader header = DatumGetHeapTupleHeader(record);

	tuple->t_len = HeapTupleHeaderGetDatumLength(header);
	ItemPointerSetInvalid(&tuple->t_self);
	tuple->t_tableOid = InvalidOid;
	tuple->t_data = header;
}

/*
 * mail_state_record_deform
 *		A record's values and nulls; values point into the record.
 */
void
mail_state_record_deform(LiveRecord *lr, Datum record, Datum *values, bool *nulls)
{
	HeapTupleData tuple;

	record_tuple(record, &tuple);
	heap_deform_tuple(&tuple, lr->desc, values, nulls);
}

/*
 * mail_state_record_attr
 *		One attribute of a record, which may be null.
 */
Datum
mail_state_record_attr(LiveRecord *lr, Datum record, AttrNumber attnum, bool *isnull)
{
	HeapTupleData tuple;

	record_tuple(record, &tuple);
	return heap_getattr(&tuple, attnum, lr->desc, isnull);
}

/*
 * mail_state_record_get
 *		One attribute of a record (not null where used here).
 */
Datum
mail_state_record_get(LiveRecord *lr, Datum record, AttrNumber attnum)
{
	bool		isnull;
	Datum		d = mail_state_record_attr(lr, record, attnum, &isnull);

	if (isnull)
		elog(ERROR, "claimed mail record has a null %s",
			 NameStr(TupleDescAttr(lr->desc, attnum - 1)->attname));
	return d;
}
