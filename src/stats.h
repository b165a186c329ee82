/*-------------------------------------------------------------------------
 *
 * stats.h
 *		What the rest of gatekeeper uses of stats.c: the queues' totals.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_STATS_H
#define GATEKEEPER_STATS_H

#include "access/xact.h"
#include "commands/trigger.h"

extern Size gatekeeper_stats_shmem_size(void);
extern void gatekeeper_stats_shmem_request(void);
extern void gatekeeper_stats_shmem_init(void);
extern void gatekeeper_stats_init(void);

/* src/xact.c's hooks */
extern void gatekeeper_stats_at_xact_end(XactEvent event);
extern void gatekeeper_stats_at_subxact_end(SubXactEvent event);

typedef struct StatsTally StatsTally;

extern StatsTally *gatekeeper_stats_tally_start(void);
extern void gatekeeper_stats_count_enqueued(StatsTally *tally, Datum queue);
extern void gatekeeper_stats_count_done(StatsTally *tally, Datum queue, Oid state_type,
										Oid state);
extern void gatekeeper_stats_tally_end(StatsTally *tally);
extern void gatekeeper_stats_count_report(bool recorded);

#endif							/* GATEKEEPER_STATS_H */
