/*-------------------------------------------------------------------------
 *
 * live_count.h
 *		The live gauges' rows of gatekeeper.mail_live_count (live_count.c),
 *		as mail_count.c writes, deletes and recounts them.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_LIVE_COUNT_H
#define GATEKEEPER_LIVE_COUNT_H

extern void live_count_write(Datum *names, Datum *scheduled, Datum *retrying, int n,
							 bool prepare);
extern void live_count_delete(text *queue);
extern void live_count_lock(void);
extern int64 live_count_recount(void);

#endif							/* GATEKEEPER_LIVE_COUNT_H */
