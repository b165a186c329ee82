/*-------------------------------------------------------------------------
 *
 * xact.h
 *		gatekeeper's one transaction callback (src/xact.c).  The hooks it
 *		calls at the end of every transaction and subtransaction are
 *		declared in their modules' headers (gate_store.h, live_count.h,
 *		stats.h, wake.h), each for src/xact.c only.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_XACT_H
#define GATEKEEPER_XACT_H

#include "access/xact.h"

/* src/xact.c: register the callbacks, once per process (_PG_init) */
extern void gatekeeper_xact_init(void);

#endif							/* GATEKEEPER_XACT_H */
