/*-------------------------------------------------------------------------
 *
 * worker_step.c
 *		One step of the background worker's loop (src/worker.c): its
 *		transaction, and the failures it survives.
 *
 * A step (a claim, the recording of outcomes, the extension of leases,
 * housekeeping, an announcement) runs in a transaction begun in
 * worker_spi's order by worker_begin_step, which also watches the
 * extension come and go: a step runs only while the extension exists at
 * the version the library serves, and the worker says once in the log
 * what it waits for otherwise.  The step's work runs in a subtransaction
 * (gatekeeper_subxact_catch, src/xact.c) and its transaction is committed
 * by worker_finish_step with the commit's failure caught
 * (gatekeeper_commit_catch): a step that fails either way is rolled back,
 * and the worker, which may have mail on the wire, goes on.  A
 * WorkerTrouble per step keeps its failures in a row and the backoff
 * before its next try (worker_step_failed, worker_step_passed), and
 * worker_log_survived says in the log what failed and what the worker does
 * next.
 *
 * IDENTIFICATION
 *		src/worker_step.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "worker_step.h"
#include "gatekeeper.h"
#include "xact.h"

#include "access/xact.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "pgstat.h"
#include "storage/lmgr.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

/* the extension this worker last saw, to log its coming and going */
static Oid	known_extension = InvalidOid;

/*
 * An extension of another version than the library's, which this worker
 * waits to see updated (it said so once in the log), and that version.
 */
static Oid	outdated_extension = InvalidOid;
static char outdated_version[NAMEDATALEN];

/*
 * Start a transaction in worker_spi's order and check that the extension
 * exists, at the version the library serves.  Returns false, with the
 * transaction open, when it does not: an extension of another version
 * (older: ALTER EXTENSION gatekeeper UPDATE has not run yet) is left alone
 * as if it were missing, and the worker says once in the log what it
 * waits for.  While the transaction lasts the extension cannot be
 * dropped.
 */
bool
worker_begin_step(const char *activity)
{
	Oid			ext;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, activity);

	ext = get_extension_oid("gatekeeper", true);
	if (OidIsValid(ext))
	{
		/* DROP EXTENSION locks it; once we hold it, look again */
		LockDatabaseObject(ExtensionRelationId, ext, 0, AccessShareLock);
		if (get_extension_oid("gatekeeper", true) != ext)
			ext = InvalidOid;
	}
	if (OidIsValid(ext))
	{
		const char *version;

		if (gatekeeper_schema(&version) == GATEKEEPER_SCHEMA_CURRENT)
			outdated_extension = InvalidOid;
		else
		{
			if (ext != outdated_extension || strcmp(version, outdated_version) != 0)
			{
				gatekeeper_report_schema(LOG, version);
				outdated_extension = ext;
				strlcpy(outdated_version, version, sizeof(outdated_version));
			}
			ext = InvalidOid;
		}
	}
	else
		outdated_extension = InvalidOid;

	if (ext != known_extension)
	{
		/* log the comings and goings of the extension, never its absence */
		if (OidIsValid(ext))
			ereport(LOG,
					(errmsg("gatekeeper worker found extension gatekeeper in database \"%s\"",
							gatekeeper_database)));
		else
			ereport(LOG,
					(errmsg("extension gatekeeper was dropped from database \"%s\"; gatekeeper worker waits for it",
							gatekeeper_database)));
		known_extension = ext;
	}

	return OidIsValid(ext);
}

/*
 * worker_run_step: run step in a subtransaction of the transaction
 * worker_begin_step began, and commit it.  When the step or the commit
 * fails, everything is rolled back and failed is called with the error
 * (and failed_arg) while the error is still at hand; the result says
 * whether the step's work is committed.
 */
bool
worker_run_step(GatekeeperSubxactStep step, void *arg,
				WorkerStepFailed failed, void *failed_arg)
{
	ErrorData  *error;

	if (!gatekeeper_subxact_catch(step, arg, &error))
	{
		if (error != NULL)
			failed(error, failed_arg);
		worker_end_step();
		return false;
	}
	if (!worker_finish_step(&error))
	{
		failed(error, failed_arg);
		FreeErrorData(error);
		return false;
	}
	return true;
}

/*
 * worker_end_step: commit the transaction begun by worker_begin_step, whose work needs nothing
 * more of the worker once committed.  A commit that fails is said in the
 * log, and the worker goes on.
 */
void
worker_end_step(void)
{
	ErrorData  *error;

	if (!worker_finish_step(&error))
	{
		worker_log_survived(error, "'s transaction failed at its commit",
					 "Nothing of it was kept; the worker goes on.");
		FreeErrorData(error);
	}
}

/*
 * worker_finish_step: commit the transaction begun by worker_begin_step, for a step
 * whose work is kept in the worker's memory only once it is in the
 * database.  When the commit fails the transaction is aborted and the
 * result is false, with the error in *error (for FreeErrorData): see
 * gatekeeper_commit_catch.
 */
bool
worker_finish_step(ErrorData **error)
{
	bool		committed;

	SPI_finish();
	PopActiveSnapshot();
	committed = gatekeeper_commit_catch(error);
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
	return committed;
}

/*
 * What a worker without a usable extension waits for, for worker_status
 * and pg_stat_activity.
 */
const char *
worker_waiting_for(void)
{
	return OidIsValid(outdated_extension) ?
		"waiting for ALTER EXTENSION gatekeeper UPDATE" :
		"waiting for CREATE EXTENSION gatekeeper";
}

/*
 * worker_step_failed: a step the worker survives failed, and was rolled back:
 * count the failure and return the wait before the step's next try,
 * gatekeeper.naptime doubling with each failure in a row up to a minute,
 * within [floor_ms, ceiling_ms]; remember when that wait ends and what the
 * error said.  The caller logs it (worker_log_survived).
 */
int64
worker_step_failed(WorkerTrouble *trouble, ErrorData *error, int64 floor_ms, int64 ceiling_ms)
{
	int64		wait_ms = Max(gatekeeper_naptime, 1);
	int			i;

	for (i = 0; i < trouble->failures && wait_ms < WORKER_BACKOFF_MAX_MS; i++)
		wait_ms *= 2;
	wait_ms = Min(wait_ms, WORKER_BACKOFF_MAX_MS);
	wait_ms = Max(Min(wait_ms, ceiling_ms), floor_ms);

	trouble->failures++;
	trouble->retry_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait_ms);
	snprintf(trouble->why, sizeof(trouble->why), "%s failed: %s", trouble->what,
			 error->message ? error->message : "unknown error");
	return wait_ms;
}

/*
 * worker_step_passed: the step passed; it may run whenever it is due.
 */
void
worker_step_passed(WorkerTrouble *trouble)
{
	trouble->failures = 0;
	trouble->retry_at = 0;
}

/*
 * worker_log_survived: log the error of a step the worker survives,
 * "gatekeeper worker<what>: " and the error's message, then what the
 * worker does next, then the error's own detail, hint and context.
 */
void
worker_log_survived(ErrorData *error, const char *what, const char *next)
{
	ereport(LOG,
			(errcode(error->sqlerrcode),
			 errmsg("gatekeeper worker%s: %s", what,
					error->message ? error->message : "unknown error"),
			 errdetail("%s%s%s", next,
					   error->detail ? " " : "",
					   error->detail ? error->detail : ""),
			 error->hint ? errhint("%s", error->hint) : 0,
			 error->context ? errcontext("%s", error->context) : 0));
}

/*
 * worker_extension_ready: whether the last step found the extension, at
 * the version the library serves.
 */
bool
worker_extension_ready(void)
{
	return OidIsValid(known_extension);
}

/*
 * worker_extension_outdated: whether the last step found the extension at
 * another version, which the worker waits to see updated.
 */
bool
worker_extension_outdated(void)
{
	return OidIsValid(outdated_extension);
}
