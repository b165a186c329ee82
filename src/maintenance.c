/*-------------------------------------------------------------------------
 *
 * maintenance.c
 *		Vacuuming gatekeeper.mail_live after a burst of mail.
 *
 * Every mail leaves a dead version of its live row when a claim takes it
 * (the claim deletes it, src/mail/claim_take.c, and keeps the
 * claimed mail in gatekeeper.mail_claim's batch rows).  Opportunistic pruning frees their space on the
 * pages the claims touch, but only a vacuum enters it in the free space
 * map, so until autovacuum comes by (once per autovacuum_naptime, a
 * minute by default) every new version and every new live row goes to a
 * new page: a campaign of a few hundred thousand mails drained in a
 * minute leaves mail_live hundreds of megabytes large, and the next
 * campaign's claims walk and write a table spread over them.
 *
 * So the first delivery worker looks at mail_live's dead rows (its
 * statistics) at every housekeeping pass, and when they are many (at
 * least LIVE_VACUUM_MIN_DEAD) and outnumber the live mail (counted)
 * tenfold, which is to say a burst has just drained, starts a background
 * worker of its own to vacuum it.  The vacuum then finds pages that are
 * nearly all dead: it enters them in the free space map and gives the
 * empty tail back to the file system, before the next burst.  Under a steady load the live mail
 * is rarely a tenth of the dead rows and autovacuum, tuned for mail_live
 * in the install script, goes on doing the work.  The delivery worker
 * does not wait for the vacuum: it goes on delivering while the vacuum
 * worker runs, and starts no second one until the first has exited.  A
 * vacuum that could not remove the rows (a transaction older than them is
 * open) is not repeated every pass: the next waits 10 s, then 20 s, up to
 * 5 min, until one cleans again.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "maintenance.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "commands/vacuum.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "pgstat.h"
#include "catalog.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "tcop/tcopprot.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

PGDLLEXPORT void gatekeeper_vacuum_main(Datum main_arg);

/* dead live rows that make a vacuum worth starting */
#define LIVE_VACUUM_MIN_DEAD	10000

/* and how many times the live mail they must outnumber */
#define LIVE_VACUUM_DEAD_RATIO	10

/*
 * A vacuum that leaves at least half the dead rows it was started for was
 * held back (a transaction older than the rows keeps them): the next waits
 * this long, doubled each time it happens again, up to the most.
 */
#define LIVE_VACUUM_BACKOFF_MS		10000
#define LIVE_VACUUM_BACKOFF_MAX_MS	300000

static const char count_live_sql[] =
"SELECT count(*) FROM (SELECT FROM gatekeeper.mail_live LIMIT $1) l";
static SPIPlanPtr count_live_plan = NULL;

/* the vacuum worker this backend started last, or NULL */
static BackgroundWorkerHandle *vacuum_worker = NULL;

/* the dead rows it was started for, and the rows updated or deleted so far */
static int64 dead_at_start = 0;
static int64 changes_at_start = 0;

/* the wait after a vacuum held back, and no vacuum before */
static int	backoff_ms = 0;
static TimestampTz next_vacuum = 0;

/*
 * The live mail, counted up to limit rows.  Not the statistics' estimate
 * (n_live_tup): a vacuum that ran while mail was added and acked sets it to
 * what it saw, and the changes reported meanwhile are lost, so after a
 * burst it may hold thousands of mails that are gone.  The count stops at
 * the limit, a tenth of the dead rows: under a steady load it finds them
 * at once, and it reads the whole table only when the table is mostly
 * dead, just before the vacuum that makes it small again.
 */
static int64
count_live(int64 limit)
{
	Oid			type = INT8OID;
	Datum		arg = Int64GetDatum(limit);
	bool		isnull;
	int64		n;

	gatekeeper_plan(&count_live_plan, count_live_sql, 1, &type);
	if (SPI_execute_plan(count_live_plan, &arg, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not count the live mail");
	n = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	SPI_freetuptable(SPI_tuptable);
	return n;
}

/*
 * gatekeeper_live_maintenance
 *		Start a worker to vacuum mail_live when a burst has left it mostly
 *		dead.  Called by the first delivery worker's housekeeping, in a
 *		transaction, SPI connected; returns at once.
 */
void
gatekeeper_live_maintenance(void)
{
	Oid			relid = gatekeeper_relid(GATEKEEPER_REL_MAIL_LIVE, true);
	PgStat_StatTabEntry *stats;
	BackgroundWorker worker;
	pid_t		pid;
	int64		dead;
	int64		live;

	if (!OidIsValid(relid))
		return;
	if (vacuum_worker != NULL &&
		GetBackgroundWorkerPid(vacuum_worker, &pid) != BGWH_STOPPED)
		return;					/* still vacuuming, or about to */

	/* the counts as the other backends last reported them */
	pgstat_clear_snapshot();
	stats = pgstat_fetch_stat_tabentry(relid);
	if (stats == NULL)
		return;
	dead = stats->n_dead_tuples;

	if (vacuum_worker != NULL)
	{
		/*
		 * The last vacuum has ended: did it clean?  What it left is what is
		 * dead now less the rows updated or deleted since it started (each
		 * left a dead version).
		 */
		int64		changed = stats->tuples_updated + stats->tuples_deleted - changes_at_start;

		pfree(vacuum_worker);
		vacuum_worker = NULL;
		if (dead - changed >= dead_at_start / 2)
			backoff_ms = Min(Max(backoff_ms * 2, LIVE_VACUUM_BACKOFF_MS),
							 LIVE_VACUUM_BACKOFF_MAX_MS);
		else
			backoff_ms = 0;
		next_vacuum = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), backoff_ms);
	}
	if (dead < LIVE_VACUUM_MIN_DEAD || GetCurrentTimestamp() < next_vacuum)
		return;
	live = count_live(dead / LIVE_VACUUM_DEAD_RATIO + 1);
	if (live * LIVE_VACUUM_DEAD_RATIO > dead)
		return;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS |
		BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "gatekeeper");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "gatekeeper_vacuum_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "gatekeeper vacuum of mail_live");
	snprintf(worker.bgw_type, BGW_MAXLEN, "gatekeeper vacuum");
	worker.bgw_main_arg = ObjectIdGetDatum(MyDatabaseId);
	worker.bgw_notify_pid = 0;

	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

		if (!RegisterDynamicBackgroundWorker(&worker, &vacuum_worker))
		{
			static bool told = false;

			vacuum_worker = NULL;
			ereport(told ? DEBUG1 : LOG,
					(errmsg("gatekeeper could not start a worker to vacuum mail_live"),
					 errdetail("All background worker slots are in use; autovacuum will vacuum it."),
					 errhint("Raise max_worker_processes.")));
			told = true;
		}
		MemoryContextSwitchTo(old);
	}
	if (vacuum_worker == NULL)
		return;

	/* what the next pass judges the vacuum by */
	dead_at_start = dead;
	changes_at_start = stats->tuples_updated + stats->tuples_deleted;
	ereport(DEBUG1,
			(errmsg("gatekeeper vacuums mail_live: %lld dead rows, %lld live",
					(long long) dead, (long long) live)));
}

/*
 * gatekeeper_vacuum_main
 *		The vacuum worker: VACUUM gatekeeper.mail_live in the database
 *		main_arg names, and exit.
 */
void
gatekeeper_vacuum_main(Datum main_arg)
{
	Oid			relid;
	VacuumParams params;
	MemoryContext old;
	List	   *rels;

	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(main_arg), InvalidOid, 0);
	pgstat_report_appname("gatekeeper vacuum");

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	relid = gatekeeper_relid(GATEKEEPER_REL_MAIL_LIVE, true);
	if (!OidIsValid(relid))
	{
		CommitTransactionCommand();
		proc_exit(0);
	}
	pgstat_report_activity(STATE_RUNNING, "VACUUM gatekeeper.mail_live");

	/* as a VACUUM statement would run it, less parallel workers */
	memset(&params, 0, sizeof(params));
	params.options = VACOPT_VACUUM | VACOPT_PROCESS_TOAST | VACOPT_SKIP_LOCKED;
	params.freeze_min_age = -1;
	params.freeze_table_age = -1;
	params.multixact_freeze_min_age = -1;
	params.multixact_freeze_table_age = -1;
	params.is_wraparound = false;
	params.log_min_duration = -1;
	params.index_cleanup = VACOPTVALUE_UNSPECIFIED;
	params.truncate = VACOPTVALUE_UNSPECIFIED;
	params.nworkers = -1;

	/*
	 * vacuum() keeps its memory under PortalContext, as in a statement, and
	 * commits the transaction it is called in before its work: the list of
	 * relations must outlive that transaction too.
	 */
	PortalContext = AllocSetContextCreate(TopMemoryContext, "gatekeeper vacuum",
										  ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(PortalContext);
	rels = list_make1(makeVacuumRelation(NULL, relid, NIL));
	vacuum(rels, &params, NULL, true);
	MemoryContextSwitchTo(old);
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
	proc_exit(0);
}
