/*-------------------------------------------------------------------------
 *
 * worker_standbys.h
 *		What the worker's loop (worker.c) uses of worker_standbys.c:
 *		claimed mail held until gatekeeper.claim_standbys standbys have
 *		flushed its claim.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_WORKER_STANDBYS_H
#define GATEKEEPER_WORKER_STANDBYS_H

#include "access/xlogdefs.h"
#include "worker_slots.h"

extern int	worker_standbys_hold(int mails, XLogRecPtr lsn);
extern int	worker_standbys_clear(void);
extern void worker_standbys_forget(void);
extern bool worker_standbys_holding(void);
extern const char *worker_standbys_why(void);
extern void worker_standbys_report(GatekeeperWorkerStatus *status);
extern int	worker_standbys_poll_ms(void);

#endif							/* GATEKEEPER_WORKER_STANDBYS_H */
