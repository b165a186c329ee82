/*-------------------------------------------------------------------------
 *
 * xact.h
 *		gatekeeper's one transaction callback (src/xact.c).  The hooks it
 *		calls at the end of every transaction and subtransaction are
 *		declared in their modules' headers (gate_store.h, mail_store.h,
 *		wake.h), each for src/xact.c only.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_XACT_H
#define GATEKEEPER_XACT_H

#include "access/xact.h"

/* src/xact.c: register the callbacks, once per process (_PG_init) */
extern void gatekeeper_xact_init(void);

/*
 * A step run in a subtransaction (gatekeeper_subxact_try): true to keep
 * what it did, false to have it rolled back.
 */
typedef bool (*GatekeeperSubxactStep) (void *arg);

/* whether an error of the step is an expected outcome, not a failure */
typedef bool (*GatekeeperSubxactExpected) (ErrorData *error);

extern bool gatekeeper_subxact_try(GatekeeperSubxactStep step, void *arg,
								   GatekeeperSubxactExpected expected);
extern bool gatekeeper_subxact_catch(GatekeeperSubxactStep step, void *arg,
									 ErrorData **error);
extern bool gatekeeper_commit_catch(ErrorData **error);

#endif							/* GATEKEEPER_XACT_H */
