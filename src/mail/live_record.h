/*-------------------------------------------------------------------------
 *
 * live_record.h
 *		A record of gatekeeper.mail_live's row type, read: what the claim,
 *		a claimed mail's transitions (src/mail/mail_state.c) and the
 *		outcomes' writer (src/mail/done_writer.c) share of it
 *		(src/mail/live_record.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_LIVE_RECORD_H
#define GATEKEEPER_LIVE_RECORD_H

#include "access/attnum.h"
#include "access/tupdesc.h"

/*
 * gatekeeper.mail_live's row type, as the claim's records and the
 * batches' arrays hold it: its descriptor, the attributes changed here
 * found by name, and the states a transition writes.
 */
typedef struct LiveRecord
{
	Oid			type;
	Oid			arraytype;
	TupleDesc	desc;
	AttrNumber	id;
	AttrNumber	queue;
	AttrNumber	send_at;
	AttrNumber	state;
	AttrNumber	attempt;
	AttrNumber	uncharged;
	AttrNumber	worker;
	AttrNumber	last_error;
	AttrNumber	segment;
	Oid			state_type;
	Datum		scheduled;		/* the enum values of gatekeeper.state */
	Datum		sent;
	Datum		failed;
} LiveRecord;

extern void mail_state_record_deform(LiveRecord *lr, Datum record, Datum *values, bool *nulls);
extern Datum mail_state_record_attr(LiveRecord *lr, Datum record, AttrNumber attnum,
									bool *isnull);
extern Datum mail_state_record_get(LiveRecord *lr, Datum record, AttrNumber attnum);

#endif							/* GATEKEEPER_LIVE_RECORD_H */
