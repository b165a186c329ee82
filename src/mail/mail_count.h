/*-------------------------------------------------------------------------
 *
 * mail_count.h
 *		How every move of the mail counts (mail_count.c): a statement's
 *		changes to the queues' totals and live gauges, gathered by queue
 *		and kept until the transaction ends.  For src/mail/ only; outside
 *		it, mail_store.h is the door.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_MAIL_COUNT_H
#define GATEKEEPER_MAIL_COUNT_H

#include "count_totals.h"

/* A move that adds to no total, only to the gauges */
#define COUNT_NONE		(-1)

typedef struct MailCount MailCount;

extern MailCount *mail_count_start(Oid live_relid);
extern void mail_count_move(MailCount *count, Datum queue, int kind, int64 scheduled,
							int64 retrying);
extern int	mail_count_outcome(Oid state_type, Oid state);
extern void mail_count_end(MailCount *count);
extern void mail_count_set_aside(text *queue);

#endif							/* GATEKEEPER_MAIL_COUNT_H */
