/*-------------------------------------------------------------------------
 *
 * worker_database.c
 *		A worker whose database does not exist: it waits unconnected,
 *		looking for the database twice a second, and hands its slot over to
 *		a new worker that connects as soon as the database appears.
 *
 * IDENTIFICATION
 *		src/worker_database.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "worker_database.h"
#include "gatekeeper.h"
#include "worker_slots.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/guc.h"
#include "utils/snapmgr.h"
#include "utils/wait_event.h"

/* how often a worker without its database looks for it */
#define DATABASE_POLL_MS			500

static bool database_ready(const char *name);
static void hand_over(void) pg_attribute_noreturn();

/*
 * Wait, connected to no database, until gatekeeper.database exists and
 * accepts connections; then hand this slot over to a worker that connects
 * (hand_over), so delivery starts within DATABASE_POLL_MS of CREATE
 * DATABASE rather than after bgw_restart_time.  slot is the worker's.
 */
void
worker_wait_for_database(int slot)
{
	char		activity[NAMEDATALEN + 64];

	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	SetConfigOption("application_name", MyBgworkerEntry->bgw_name,
					PGC_USERSET, PGC_S_SESSION);

	ereport(LOG,
			(errmsg("gatekeeper worker is waiting for database \"%s\"",
					gatekeeper_database),
			 errdetail("The previous attempt to connect to it failed.")));

	snprintf(activity, sizeof(activity), "waiting for database \"%s\"",
			 gatekeeper_database);

	for (;;)
	{
		CHECK_FOR_INTERRUPTS();

		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		if (database_ready(gatekeeper_database))
		{
			(void) gatekeeper_slot_connecting(slot, false);
			ereport(LOG,
					(errmsg("gatekeeper worker found database \"%s\" and restarts to connect to it",
							gatekeeper_database)));
			hand_over();
		}

		pgstat_report_activity(STATE_IDLE, activity);

		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 DATABASE_POLL_MS,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/*
 * End this process, which can connect to no database any more, so that a
 * new one serves its slot at once: a dynamic worker registered as this
 * one was (the same function, slot, name and restart time), after which
 * exit status 0 unregisters this one.  Without a free background worker
 * slot, exit 1: the postmaster restarts this one after bgw_restart_time.
 */
static void
hand_over(void)
{
	BackgroundWorker worker;

	memcpy(&worker, MyBgworkerEntry, sizeof(worker));
	worker.bgw_notify_pid = 0;
	if (RegisterDynamicBackgroundWorker(&worker, NULL))
		proc_exit(0);
	proc_exit(1);
}

/*
 * Whether database name exists and accepts connections.  Reads the shared
 * catalog pg_database with a plain scan, which works without a database.
 */
static bool
database_ready(const char *name)
{
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tuple;
	bool		ready = false;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	(void) GetTransactionSnapshot();

	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database form = (Form_pg_database) GETSTRUCT(tuple);

		if (strcmp(NameStr(form->datname), name) == 0)
		{
			ready = form->datallowconn;
#ifdef DATCONNLIMIT_INVALID_DB
			if (form->datconnlimit == DATCONNLIMIT_INVALID_DB)
				ready = false;
#endif
			break;
		}
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);

	CommitTransactionCommand();

	return ready;
}
