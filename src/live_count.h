/*-------------------------------------------------------------------------
 *
 * live_count.h
 *		What the rest of gatekeeper uses of live_count.c: the live mail's
 *		counts by queue, noted by a writer of mail_live that the triggers
 *		do not see.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_LIVE_COUNT_H
#define GATEKEEPER_LIVE_COUNT_H

typedef struct LiveTally LiveTally;

extern LiveTally *gatekeeper_live_tally_start(void);
extern void gatekeeper_live_tally_add(LiveTally *tally, Datum queue,
									  int64 scheduled, int64 claimed);
extern void gatekeeper_live_tally_end(LiveTally *tally);

#endif							/* GATEKEEPER_LIVE_COUNT_H */
