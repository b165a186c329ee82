/*-------------------------------------------------------------------------
 *
 * xact.h
 *		gatekeeper's one transaction callback (src/xact.c), and the hooks of
 *		the modules it calls at the end of every transaction and
 *		subtransaction.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_XACT_H
#define GATEKEEPER_XACT_H

#include "access/xact.h"

/* src/xact.c: register the callbacks, once per process (_PG_init) */
extern void gatekeeper_xact_init(void);

/*
 * The modules' hooks, in the order src/xact.c calls them.  Each is called
 * for every event and acts on those it cares about; none is called from
 * anywhere else.
 */
/* src/gate_store.c */
extern void gate_store_at_xact_end(XactEvent event);
extern void gate_store_at_subxact_end(SubXactEvent event);
/* src/live_count.c */
extern void gatekeeper_live_count_at_xact_end(XactEvent event);
extern void gatekeeper_live_count_at_subxact_end(SubXactEvent event);
/* src/stats.c */
extern void gatekeeper_stats_at_xact_end(XactEvent event);
extern void gatekeeper_stats_at_subxact_end(SubXactEvent event);
/* src/wake.c */
extern void gatekeeper_wake_at_xact_end(XactEvent event);

#endif							/* GATEKEEPER_XACT_H */
