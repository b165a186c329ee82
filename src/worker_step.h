/*-------------------------------------------------------------------------
 *
 * worker_step.h
 *		What the worker's loop (worker.c) and its announcements
 *		(worker_announce.c) use of worker_step.c: a step's transaction,
 *		and the failures a step survives.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_WORKER_STEP_H
#define GATEKEEPER_WORKER_STEP_H

#include "xact.h"

#include "datatype/timestamp.h"
#include "utils/elog.h"

/* the longest wait after failures in a row of a step (worker_step_failed) */
#define WORKER_BACKOFF_MAX_MS		60000

/*
 * A step of the worker's loop that the worker survives when it fails: how
 * many times in a row it failed, until when its next try waits (a wake-up
 * does not cut that wait short: a claim that failed at every commit of due
 * mail would fill the log), and what the last failure said, for
 * worker_status.  worker_step_failed and worker_step_passed keep it.
 */
typedef struct WorkerTrouble
{
	const char *what;			/* "claim", ...: worker_status says "<what>
								 * failed: <error>" */
	int			failures;		/* in a row; 0 once the step passed */
	TimestampTz retry_at;		/* no try before this */
	char		why[64];		/* worker_status's state while it fails */
} WorkerTrouble;

/* what a step does when its work or its commit failed (worker_run_step) */
typedef void (*WorkerStepFailed) (ErrorData *error, void *arg);

extern bool worker_begin_step(const char *activity);
extern bool worker_run_step(GatekeeperSubxactStep step, void *arg,
							WorkerStepFailed failed, void *failed_arg);
extern void worker_end_step(void);
extern bool worker_finish_step(ErrorData **error);
extern bool worker_extension_ready(void);
extern bool worker_extension_outdated(void);
extern const char *worker_waiting_for(void);

extern int64 worker_step_failed(WorkerTrouble *trouble, ErrorData *error,
								int64 floor_ms, int64 ceiling_ms);
extern void worker_step_passed(WorkerTrouble *trouble);
extern void worker_log_survived(ErrorData *error, const char *what, const char *next);

#endif							/* GATEKEEPER_WORKER_STEP_H */
