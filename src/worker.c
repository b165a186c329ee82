/*-------------------------------------------------------------------------
 *
 * worker.c
 *		The gatekeeper background worker: claims due mail, delivers it over
 *		SMTP and records what became of it.
 *
 * Each of gatekeeper.workers workers connects to gatekeeper.database and
 * loops: sleep on its latch (a commit of due mail sets it), then one pass.
 * A pass
 *
 *	1. checks that the extension exists, and idles quietly while it does
 *	   not (CREATE EXTENSION may come later, DROP EXTENSION at any time);
 *	2. every few seconds reaps expired leases and purges old mail;
 *	3. claims up to gatekeeper.batch_size due mails with gatekeeper.claim,
 *	   and builds their messages, in one transaction;
 *	4. delivers them over SMTP outside any transaction;
 *	5. records the outcomes (ack, nack, unclaim) in a transaction of its own.
 *
 * A worker that hits an error exits and is restarted by the postmaster
 * after bgw_restart_time; it does not try to carry on.  Every wait goes
 * through the process latch and SIGTERM is handled by die(), so shutdown
 * and DROP DATABASE ... WITH (FORCE) end a worker promptly.
 *
 * When its database does not exist, a worker says so once, then waits
 * unconnected (its successors see the failed attempt in shared memory) and
 * exits to be restarted when the database appears.
 *
 * IDENTIFICATION
 *		src/worker.c
 *
 *-------------------------------------------------------------------------
 */
#include "gatekeeper.h"
#include "address.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "tcop/tcopprot.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

/* how often expired leases are reaped and old mail is purged */
#define HOUSEKEEPING_INTERVAL_MS	5000

/* backoff while no relay can be reached */
#define BACKOFF_MIN_MS				1000
#define BACKOFF_MAX_MS				30000

/* how often a worker without its database looks for it */
#define DATABASE_POLL_MS			5000

/* this worker's slot in shared memory, and its name in claims */
static int	worker_slot;
static char worker_name[64];

/* the extension the saved plans were prepared for */
static Oid	plans_extension = InvalidOid;

/* saved plans, prepared on first use */
static SPIPlanPtr claim_plan = NULL;
static SPIPlanPtr ack_plan = NULL;
static SPIPlanPtr nack_plan = NULL;
static SPIPlanPtr unclaim_plan = NULL;
static SPIPlanPtr reap_plan = NULL;
static SPIPlanPtr purge_plan = NULL;
static SPIPlanPtr next_due_plan = NULL;

/* what one pass claimed, and its messages; reset at each pass */
static MemoryContext batch_context = NULL;

static TimestampTz next_housekeeping = 0;

/* delivery is off while the relay cannot be reached */
static TimestampTz backoff_until = 0;
static int	backoff_ms = 0;

/* whether gatekeeper.smtp_url is set and looks usable, and its value */
static bool smtp_enabled = false;
static char *smtp_url_seen = NULL;

/* mails per claim: gatekeeper.batch_size, or fewer (see check_settings) */
static int	claim_size = 1;

static void wait_for_database(void) pg_attribute_noreturn();
static bool database_ready(const char *name);
static void check_settings(void);
static long gatekeeper_pass(bool woken);
static bool begin_work(const char *activity, Oid *extension);
static void end_work(void);
static void forget_plans(void);
static void forget_plan(SPIPlanPtr *plan);
static SPIPlanPtr prepare_plan(SPIPlanPtr *plan, const char *query,
							   int nargs, Oid *argtypes);
static void housekeeping(void);
static int	claim_mail(GatekeeperDelivery **items, int *ndeliver,
					   TimestampTz *next_due, bool *have_next_due);
static void copy_mail(GatekeeperMail *mail, HeapTuple tuple, TupleDesc desc);
static char *copy_text(HeapTuple tuple, TupleDesc desc, int column);
static bool build_message(GatekeeperDelivery *item);
static void record_outcomes(Oid extension, GatekeeperDelivery *items, int n);
static void note_relay_state(GatekeeperDelivery *items, int n);

/*
 * Entry point of a gatekeeper worker.  main_arg is its slot number.
 */
void
gatekeeper_worker_main(Datum main_arg)
{
	long		timeout = 0;
	bool		woken;

	worker_slot = DatumGetInt32(main_arg);

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	/*
	 * If our predecessor in this slot never finished connecting, the
	 * database is probably gone: wait for it without connecting, instead of
	 * failing again every bgw_restart_time.
	 */
	if (gatekeeper_slot_connecting(worker_slot, true))
		wait_for_database();

	BackgroundWorkerInitializeConnection(gatekeeper_database, NULL, 0);
	gatekeeper_slot_attach(worker_slot);

	snprintf(worker_name, sizeof(worker_name), "bgworker:%d", (int) MyProcPid);
	SetConfigOption("application_name", MyBgworkerEntry->bgw_name,
					PGC_USERSET, PGC_S_SESSION);
	/* everything is schema-qualified; this only closes the door */
	SetConfigOption("search_path", "pg_catalog, pg_temp",
					PGC_USERSET, PGC_S_SESSION);
	/* statements touching one batch by index never repay compiling them */
	SetConfigOption("jit", "off", PGC_USERSET, PGC_S_SESSION);

	batch_context = AllocSetContextCreate(TopMemoryContext,
										  "gatekeeper batch",
										  ALLOCSET_DEFAULT_SIZES);
	check_settings();

	ereport(LOG,
			(errmsg("gatekeeper worker started in database \"%s\"",
					gatekeeper_database)));

	for (;;)
	{
		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 timeout,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);

		CHECK_FOR_INTERRUPTS();

		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			gatekeeper_smtp_reset();
			check_settings();
		}

		/* the pass sees every mail whose commit set the flag until now */
		woken = gatekeeper_slot_woken(worker_slot, true);

		timeout = gatekeeper_pass(woken);

		/*
		 * However long the nap, expired leases are reaped and old mail is
		 * purged on time: external workers rely on the reaping too.
		 */
		if (timeout > 0)
		{
			TimestampTz current = GetCurrentTimestamp();

			timeout = next_housekeeping <= current ? 0 :
				Min(timeout, TimestampDifferenceMilliseconds(current, next_housekeeping));
		}

		/* due mail committed during the pass: go again at once */
		if (timeout > 0 && backoff_until <= GetCurrentTimestamp() &&
			gatekeeper_slot_woken(worker_slot, false))
			timeout = 0;
	}
}

/*
 * Wait, connected to no database, until gatekeeper.database exists and
 * accepts connections; then exit so that the postmaster restarts this
 * worker, which connects.
 */
static void
wait_for_database(void)
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
			(void) gatekeeper_slot_connecting(worker_slot, false);
			ereport(LOG,
					(errmsg("gatekeeper worker found database \"%s\" and restarts to connect to it",
							gatekeeper_database)));
			proc_exit(1);
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

/*
 * Act on the settings, at start and after each reload.
 *
 * Delivery is on when gatekeeper.smtp_url is an smtp:// or smtps:// URL
 * and the password file, if one is named, can be used; off when the URL
 * is empty.  The relay password is read from its file here, so at start
 * and at every reload.
 *
 * A claim takes gatekeeper.batch_size mails, but no more than the relay
 * connections can finish within four fifths of the lease even if every
 * transfer runs into gatekeeper.smtp_timeout: a lease that ran out during
 * delivery would let another worker send the same mail again.
 */
static void
check_settings(void)
{
	const char *url = gatekeeper_smtp_url ? gatekeeper_smtp_url : "";
	int64		rounds;

	if (url[0] == '\0')
		smtp_enabled = false;
	else if (!gatekeeper_smtp_load_password())
		smtp_enabled = false;	/* the log says why */
	else if (pg_strncasecmp(url, "smtp://", 7) == 0 ||
			 pg_strncasecmp(url, "smtps://", 8) == 0)
		smtp_enabled = true;
	else
	{
		smtp_enabled = false;
		ereport(WARNING,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("gatekeeper.smtp_url must begin with \"smtp://\" or \"smtps://\""),
				 errdetail("The gatekeeper worker delivers no mail until it is corrected.")));
	}

	rounds = ((int64) gatekeeper_lease * 4 / 5) / Max(gatekeeper_smtp_timeout, 1);
	if (smtp_enabled &&
		(int64) gatekeeper_lease < 2 * (int64) gatekeeper_smtp_timeout)
		ereport(WARNING,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("gatekeeper.lease is too short for gatekeeper.smtp_timeout"),
				 errdetail("A delivery can outlast its lease, and another worker may then send the same mail again."),
				 errhint("Make gatekeeper.lease at least twice gatekeeper.smtp_timeout.")));
	claim_size = (int) Min((int64) gatekeeper_batch_size,
						   Max(rounds, 1) * gatekeeper_smtp_connections);

	/* a new relay deserves a fresh try */
	if (smtp_url_seen == NULL || strcmp(smtp_url_seen, url) != 0)
	{
		if (smtp_url_seen != NULL)
			pfree(smtp_url_seen);
		smtp_url_seen = MemoryContextStrdup(TopMemoryContext, url);
		backoff_ms = 0;
		backoff_until = 0;
	}
}

/*
 * One pass; returns how long to sleep, in milliseconds, before the next.
 * woken: a commit woke the worker since the last pass.
 */
static long
gatekeeper_pass(bool woken)
{
	GatekeeperDelivery *items = NULL;
	int			n;
	int			ndeliver = 0;
	TimestampTz next_due = 0;
	bool		have_next_due = false;
	TimestampTz current;
	Oid			extension;

	MemoryContextReset(batch_context);

	/*
	 * Housekeeping also looks for the extension; a wake while it is missing
	 * is most likely CREATE EXTENSION committing (its script wakes us), so
	 * look at once rather than at the next round.
	 */
	current = GetCurrentTimestamp();
	if (current >= next_housekeeping || (woken && !OidIsValid(plans_extension)))
	{
		housekeeping();
		current = GetCurrentTimestamp();
	}

	/* nothing to deliver with, or the relay is down: only housekeeping */
	if (!smtp_enabled || !OidIsValid(plans_extension) || current < backoff_until)
	{
		long		timeout = gatekeeper_naptime;

		if (next_housekeeping > current)
			timeout = Min(timeout,
						  TimestampDifferenceMilliseconds(current, next_housekeeping));
		if (backoff_until > current)
			timeout = Min(timeout,
						  TimestampDifferenceMilliseconds(current, backoff_until));
		return timeout;
	}

	/* claim and build, in one transaction */
	extension = plans_extension;
	n = claim_mail(&items, &ndeliver, &next_due, &have_next_due);

	if (n > 0)
	{
		/* deliver, outside any transaction */
		if (ndeliver > 0)
		{
			char		activity[64];

			snprintf(activity, sizeof(activity), "delivering %d mail%s",
					 ndeliver, ndeliver == 1 ? "" : "s");
			pgstat_report_activity(STATE_RUNNING, activity);
			gatekeeper_smtp_deliver(items, ndeliver);
			pgstat_report_activity(STATE_IDLE, NULL);
		}

		record_outcomes(extension, items, n);
		note_relay_state(items, ndeliver);
	}

	current = GetCurrentTimestamp();
	if (backoff_until > current)
		return Min(gatekeeper_naptime,
				   TimestampDifferenceMilliseconds(current, backoff_until));

	/* a full batch: more is waiting */
	if (n >= claim_size)
		return 0;

	if (have_next_due)
	{
		if (next_due > current)
			return Min(gatekeeper_naptime,
					   TimestampDifferenceMilliseconds(current, next_due));

		/*
		 * Due mail the claim did not return: the claim may have suppressed
		 * or deferred part of a batch (look again at once) or a rate limit
		 * holds it (then a nap is right).  Only a claim that made progress
		 * earns another try.
		 */
		if (n > 0)
			return 0;
	}
	return gatekeeper_naptime;
}

/*
 * Start a transaction in worker_spi's order and check that the extension
 * exists.  Returns false, with the transaction open, when it does not.
 * While the transaction lasts the extension cannot be dropped.
 */
static bool
begin_work(const char *activity, Oid *extension)
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

	if (ext != plans_extension)
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
		forget_plans();
		plans_extension = ext;
	}

	*extension = ext;
	return OidIsValid(ext);
}

/*
 * Commit the transaction begun by begin_work.
 */
static void
end_work(void)
{
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
}

/*
 * Free the saved plans: the extension they were prepared for is gone.
 */
static void
forget_plans(void)
{
	forget_plan(&claim_plan);
	forget_plan(&ack_plan);
	forget_plan(&nack_plan);
	forget_plan(&unclaim_plan);
	forget_plan(&reap_plan);
	forget_plan(&purge_plan);
	forget_plan(&next_due_plan);
}

/*
 * Free one saved plan, if it was prepared.
 */
static void
forget_plan(SPIPlanPtr *plan)
{
	if (*plan != NULL)
	{
		SPI_freeplan(*plan);
		*plan = NULL;
	}
}

/*
 * The saved plan in *plan, preparing it on first use.
 */
static SPIPlanPtr
prepare_plan(SPIPlanPtr *plan, const char *query, int nargs, Oid *argtypes)
{
	if (*plan == NULL)
	{
		SPIPlanPtr	p = SPI_prepare(query, nargs, argtypes);

		if (p == NULL)
			elog(ERROR, "SPI_prepare failed for \"%s\": %s",
				 query, SPI_result_code_string(SPI_result));
		if (SPI_keepplan(p) != 0)
			elog(ERROR, "SPI_keepplan failed for \"%s\"", query);
		*plan = p;
	}
	return *plan;
}

/*
 * Reap expired leases and purge a batch of old mail, in a transaction of
 * their own, when the extension exists.
 */
static void
housekeeping(void)
{
	Oid			extension;

	if (begin_work("housekeeping", &extension))
	{
		SPIPlanPtr	plan;
		int			ret;
		bool		isnull;
		int64		purged = 0;

		plan = prepare_plan(&reap_plan, "SELECT gatekeeper.reap()", 0, NULL);
		ret = SPI_execute_plan(plan, NULL, NULL, false, 0);
		if (ret != SPI_OK_SELECT)
			elog(ERROR, "gatekeeper.reap() failed: %s",
				 SPI_result_code_string(ret));

		plan = prepare_plan(&purge_plan, "SELECT gatekeeper.purge()", 0, NULL);
		ret = SPI_execute_plan(plan, NULL, NULL, false, 0);
		if (ret != SPI_OK_SELECT)
			elog(ERROR, "gatekeeper.purge() failed: %s",
				 SPI_result_code_string(ret));
		if (SPI_processed == 1)
		{
			Datum		d = SPI_getbinval(SPI_tuptable->vals[0],
										  SPI_tuptable->tupdesc, 1, &isnull);

			if (!isnull)
				purged = DatumGetInt64(d);
		}

		/* purge deletes in batches: with more to purge, go on next pass */
		next_housekeeping = purged > 0 ? 0 :
			TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
										HOUSEKEEPING_INTERVAL_MS);
	}
	else
	{
		/* no extension: idle, and look again after a nap */
		next_housekeeping = 0;
		end_work();
		pgstat_report_activity(STATE_IDLE, "waiting for CREATE EXTENSION gatekeeper");
		return;
	}
	end_work();
}

/*
 * Claim a batch of due mail and build its messages, in one transaction.
 *
 * Returns the number of mails claimed.  *items receives them all, the
 * *ndeliver that can be delivered first, then those already failed (no
 * sender, a message that cannot be built).  When the batch was not full,
 * *next_due receives the next scheduled send_at, if any.
 */
static int
claim_mail(GatekeeperDelivery **items, int *ndeliver,
		   TimestampTz *next_due, bool *have_next_due)
{
	static const char *claim_query =
		/* by name: 0.1.0's claim, until ALTER EXTENSION UPDATE, has fewer columns */
		"SELECT * FROM gatekeeper.claim($1::text, $2::int, $3::interval)";
	Oid			argtypes[3] = {TEXTOID, INT4OID, INTERVALOID};
	Datum		values[3];
	Interval   *lease;
	Oid			extension;
	SPIPlanPtr	plan;
	int			ret;
	int			n = 0;
	int			head;
	int			tail;
	uint64		i;
	GatekeeperMail *mails;
	const char *default_sender;

	if (!begin_work("claiming", &extension))
	{
		end_work();
		return 0;
	}

	lease = (Interval *) palloc0(sizeof(Interval));
	lease->time = (int64) gatekeeper_lease * 1000;

	values[0] = CStringGetTextDatum(worker_name);
	values[1] = Int32GetDatum(claim_size);
	values[2] = IntervalPGetDatum(lease);

	plan = prepare_plan(&claim_plan, claim_query, 3, argtypes);
	ret = SPI_execute_plan(plan, values, NULL, false, 0);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "gatekeeper.claim() failed: %s",
			 SPI_result_code_string(ret));

	/* copy the claimed mail into memory that outlives the transaction */
	n = (int) SPI_processed;
	mails = MemoryContextAllocZero(batch_context,
								   sizeof(GatekeeperMail) * Max(n, 1));
	*items = MemoryContextAllocZero(batch_context,
									sizeof(GatekeeperDelivery) * Max(n, 1));
	for (i = 0; i < SPI_processed; i++)
		copy_mail(&mails[i], SPI_tuptable->vals[i], SPI_tuptable->tupdesc);
	SPI_freetuptable(SPI_tuptable);

	/* when the batch was not full, find when the next mail is due */
	*have_next_due = false;
	if (n < claim_size)
	{
		plan = prepare_plan(&next_due_plan, "SELECT gatekeeper.next_due()",
							0, NULL);
		ret = SPI_execute_plan(plan, NULL, NULL, false, 0);
		if (ret != SPI_OK_SELECT)
			elog(ERROR, "gatekeeper.next_due() failed: %s",
				 SPI_result_code_string(ret));
		if (SPI_processed == 1)
		{
			bool		isnull;
			Datum		d = SPI_getbinval(SPI_tuptable->vals[0],
										  SPI_tuptable->tupdesc, 1, &isnull);

			if (!isnull)
			{
				*next_due = DatumGetTimestampTz(d);
				*have_next_due = true;
			}
		}
		SPI_freetuptable(SPI_tuptable);
	}

	/* build the messages: deliverable ones from the front, failed from the back */
	default_sender = MemoryContextStrdup(batch_context,
										 gatekeeper_default_sender ?
										 gatekeeper_default_sender : "");
	head = 0;
	tail = n;
	for (i = 0; i < (uint64) n; i++)
	{
		GatekeeperDelivery item;

		memset(&item, 0, sizeof(item));
		item.mail = &mails[i];
		if (mails[i].sender != NULL && mails[i].sender[0] != '\0')
			item.from_field = mails[i].sender;
		else if (default_sender[0] != '\0')
			item.from_field = default_sender;
		if (item.from_field != NULL)
		{
			/* the envelope takes the bare address of "Name <address>" */
			MemoryContext old = MemoryContextSwitchTo(batch_context);
			char	   *name;
			char	   *address;

			if (gatekeeper_mailbox_problem(item.from_field, &name, &address) == NULL)
				item.from = address;
			else
				item.from = item.from_field;
			MemoryContextSwitchTo(old);
		}

		if (item.from == NULL)
		{
			item.outcome = GATEKEEPER_FAIL;
			strlcpy(item.error,
					"mail has no sender and gatekeeper.default_sender is not set",
					sizeof(item.error));
			(*items)[--tail] = item;
		}
		else if (!build_message(&item))
		{
			item.outcome = GATEKEEPER_FAIL;
			(*items)[--tail] = item;
		}
		else
			(*items)[head++] = item;

		CHECK_FOR_INTERRUPTS();
	}
	Assert(head == tail);
	*ndeliver = head;

	end_work();

	return n;
}

/*
 * Copy one row of gatekeeper.claim's result into *mail, in batch_context.
 */
static void
copy_mail(GatekeeperMail *mail, HeapTuple tuple, TupleDesc desc)
{
	bool		isnull;
	Datum		d;

	d = SPI_getbinval(tuple, desc, 1, &isnull);
	if (isnull)
		elog(ERROR, "gatekeeper.claim() returned a null id");
	mail->id = DatumGetInt64(d);

	d = SPI_getbinval(tuple, desc, 2, &isnull);
	if (isnull)
		elog(ERROR, "gatekeeper.claim() returned a null attempt");
	mail->attempt = DatumGetInt32(d);

	mail->queue = copy_text(tuple, desc, SPI_fnumber(desc, "queue"));
	mail->recipient = copy_text(tuple, desc, SPI_fnumber(desc, "recipient"));
	mail->recipient_name = copy_text(tuple, desc, SPI_fnumber(desc, "recipient_name"));
	mail->sender = copy_text(tuple, desc, SPI_fnumber(desc, "sender"));
	mail->subject = copy_text(tuple, desc, SPI_fnumber(desc, "subject"));
	mail->body = copy_text(tuple, desc, SPI_fnumber(desc, "body"));
	mail->html = copy_text(tuple, desc, SPI_fnumber(desc, "html"));
	mail->headers_json = copy_text(tuple, desc, SPI_fnumber(desc, "headers"));
	mail->message_id = copy_text(tuple, desc, SPI_fnumber(desc, "message_id"));
}

/*
 * A text or jsonb column of a claimed row as a C string in batch_context,
 * or NULL (also when the row has no such column).  Detoasts inside the
 * transaction.
 */
static char *
copy_text(HeapTuple tuple, TupleDesc desc, int column)
{
	bool		isnull;
	Datum		d;
	MemoryContext oldcontext;
	char	   *result;

	if (column <= 0)
		return NULL;
	d = SPI_getbinval(tuple, desc, column, &isnull);
	if (isnull)
		return NULL;

	oldcontext = MemoryContextSwitchTo(batch_context);
	if (SPI_gettypeid(desc, column) == JSONBOID)
	{
		Jsonb	   *jb = DatumGetJsonbP(d);

		result = JsonbToCString(NULL, &jb->root, VARSIZE(jb));
	}
	else
		result = TextDatumGetCString(d);
	MemoryContextSwitchTo(oldcontext);

	return result;
}

/*
 * Build item's message in a subtransaction, so that a mail whose message
 * cannot be built fails alone, with the error recorded, instead of taking
 * the worker (and, at each restart, the worker again) down.  Cancellation
 * and running out of memory are not the mail's fault: they are rethrown.
 */
static bool
build_message(GatekeeperDelivery *item)
{
	MemoryContext oldcontext = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	volatile bool ok = true;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(batch_context);

	PG_TRY();
	{
		initStringInfo(&item->message);
		gatekeeper_build_message(&item->message, item->mail,
								 item->from_field ? item->from_field : item->from);

		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcontext);
		CurrentResourceOwner = oldowner;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(batch_context);
		edata = CopyErrorData();
		FlushErrorState();

		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcontext);
		CurrentResourceOwner = oldowner;

		if (edata->sqlerrcode == ERRCODE_QUERY_CANCELED ||
			edata->sqlerrcode == ERRCODE_OUT_OF_MEMORY)
			ReThrowError(edata);

		snprintf(item->error, sizeof(item->error),
				 "could not build message: %s", edata->message);
		FreeErrorData(edata);
		ok = false;
	}
	PG_END_TRY();

	return ok;
}

/* A mail to nack, with the key its gate rows are locked under. */
typedef struct FailedItem
{
	GatekeeperDelivery *item;
	char	   *key;
} FailedItem;

/*
 * qsort order of FailedItems: recipient key, then mail id.
 */
static int
failed_item_cmp(const void *a, const void *b)
{
	const FailedItem *x = (const FailedItem *) a;
	const FailedItem *y = (const FailedItem *) b;
	int			c = strcmp(x->key, y->key);

	if (c != 0)
		return c;
	return (x->item->mail->id > y->item->mail->id) - (x->item->mail->id < y->item->mail->id);
}

/*
 * Record what became of each claimed mail, in a transaction of its own:
 * sent mail is acked in one call, retries and failures are nacked, and mail
 * no relay could be reached for is handed back uncharged.
 */
static void
record_outcomes(Oid extension, GatekeeperDelivery *items, int n)
{
	Oid			now_extension;
	Datum	   *ids;
	Datum	   *attempts;
	int			nsent = 0;
	int			nunreachable = 0;
	const char *unreachable_error = NULL;
	FailedItem *failed;
	int			nfailed;
	int			ret;
	int			i;
	SPIPlanPtr	plan;

	if (!begin_work("recording outcomes", &now_extension) ||
		now_extension != extension)
	{
		/* the mail went with the extension: nothing left to record */
		ereport(LOG,
				(errmsg("extension gatekeeper was dropped while %d mail%s being delivered; the outcomes are not recorded",
						n, n == 1 ? " was" : "s were")));
		end_work();
		return;
	}

	ids = palloc(sizeof(Datum) * n);
	attempts = palloc(sizeof(Datum) * n);

	/* sent */
	for (i = 0; i < n; i++)
	{
		if (items[i].outcome != GATEKEEPER_SENT)
			continue;
		ids[nsent] = Int64GetDatum(items[i].mail->id);
		attempts[nsent] = Int32GetDatum(items[i].mail->attempt);
		nsent++;
	}
	if (nsent > 0)
	{
		Oid			argtypes[2] = {INT8ARRAYOID, INT4ARRAYOID};
		Datum		values[2];

		values[0] = gatekeeper_array(ids, NULL, nsent, INT8OID);
		values[1] = gatekeeper_array(attempts, NULL, nsent, INT4OID);
		plan = prepare_plan(&ack_plan,
							"SELECT gatekeeper.ack($1::bigint[], $2::int[])",
							2, argtypes);
		ret = SPI_execute_plan(plan, values, NULL, false, 0);
		if (ret != SPI_OK_SELECT)
			elog(ERROR, "gatekeeper.ack() failed: %s",
				 SPI_result_code_string(ret));
		if (SPI_processed == 1)
		{
			bool		isnull;
			Datum		d = SPI_getbinval(SPI_tuptable->vals[0],
										  SPI_tuptable->tupdesc, 1, &isnull);

			if (!isnull && DatumGetInt32(d) < nsent)
				ereport(LOG,
						(errmsg("%d of %d mails delivered by gatekeeper worker were no longer claimed by it",
								nsent - DatumGetInt32(d), nsent),
						 errdetail("Their leases ran out during delivery, so they may be sent again."),
						 errhint("Consider raising gatekeeper.lease or lowering gatekeeper.batch_size.")));
		}
		SPI_freetuptable(SPI_tuptable);
	}

	/*
	 * Retries and failures.  A failure gives back its gate passes, so they
	 * are reported in the order every transaction locks gate rows in (see
	 * gate.c): by recipient key.  In claim order, two workers failing mail
	 * for the same recipients could deadlock.
	 */
	nfailed = 0;
	failed = palloc(sizeof(FailedItem) * n);
	for (i = 0; i < n; i++)
	{
		if (items[i].outcome != GATEKEEPER_RETRY && items[i].outcome != GATEKEEPER_FAIL)
			continue;
		failed[nfailed].item = &items[i];
		failed[nfailed].key = gatekeeper_recipient_key(items[i].mail->recipient);
		nfailed++;
	}
	qsort(failed, nfailed, sizeof(FailedItem), failed_item_cmp);
	for (i = 0; i < nfailed; i++)
	{
		Oid			argtypes[4] = {INT8OID, INT4OID, TEXTOID, BOOLOID};
		Datum		values[4];
		GatekeeperDelivery *item = failed[i].item;

		if (item->error[0] == '\0')
			snprintf(item->error, sizeof(item->error),
					 "relay replied %ld", item->reply_code);

		values[0] = Int64GetDatum(item->mail->id);
		values[1] = Int32GetDatum(item->mail->attempt);
		values[2] = CStringGetTextDatum(item->error);
		values[3] = BoolGetDatum(item->outcome == GATEKEEPER_FAIL);

		plan = prepare_plan(&nack_plan,
							"SELECT gatekeeper.nack($1::bigint, $2::int, $3::text, $4::boolean)",
							4, argtypes);
		ret = SPI_execute_plan(plan, values, NULL, false, 0);
		if (ret != SPI_OK_SELECT)
			elog(ERROR, "gatekeeper.nack() failed: %s",
				 SPI_result_code_string(ret));
		SPI_freetuptable(SPI_tuptable);
	}

	/* unreachable: hand back, uncharged */
	for (i = 0; i < n; i++)
	{
		if (items[i].outcome != GATEKEEPER_UNREACHABLE)
			continue;
		ids[nunreachable] = Int64GetDatum(items[i].mail->id);
		attempts[nunreachable] = Int32GetDatum(items[i].mail->attempt);
		if (unreachable_error == NULL && items[i].error[0] != '\0')
			unreachable_error = items[i].error;
		nunreachable++;
	}
	if (nunreachable > 0)
	{
		Oid			argtypes[4] = {INT8ARRAYOID, INT4ARRAYOID, TEXTOID, INTERVALOID};
		Datum		values[4];
		Interval   *delay = (Interval *) palloc0(sizeof(Interval));

		values[0] = gatekeeper_array(ids, NULL, nunreachable, INT8OID);
		values[1] = gatekeeper_array(attempts, NULL, nunreachable, INT4OID);
		values[2] = CStringGetTextDatum(unreachable_error ? unreachable_error :
										"no SMTP relay could be reached");
		/* the worker backs off; the mail itself is due again at once */
		values[3] = IntervalPGetDatum(delay);

		plan = prepare_plan(&unclaim_plan,
							"SELECT gatekeeper.unclaim($1::bigint[], $2::int[], $3::text, $4::interval)",
							4, argtypes);
		ret = SPI_execute_plan(plan, values, NULL, false, 0);
		if (ret != SPI_OK_SELECT)
			elog(ERROR, "gatekeeper.unclaim() failed: %s",
				 SPI_result_code_string(ret));
		SPI_freetuptable(SPI_tuptable);
	}

	end_work();
}

/*
 * Back off while no relay can be reached; a delivery that reached one ends
 * the backoff.  Logs only when the state changes.
 */
static void
note_relay_state(GatekeeperDelivery *items, int n)
{
	int			i;
	bool		reached = false;
	const char *error = NULL;

	for (i = 0; i < n; i++)
	{
		if (items[i].outcome == GATEKEEPER_UNREACHABLE)
		{
			if (error == NULL)
				error = items[i].error;
		}
		else
			reached = true;
	}

	if (reached)
	{
		if (backoff_ms > 0)
			ereport(LOG,
					(errmsg("gatekeeper worker reaches the SMTP relay again")));
		backoff_ms = 0;
		backoff_until = 0;
	}
	else if (error != NULL)
	{
		if (backoff_ms == 0)
			ereport(LOG,
					(errmsg("gatekeeper worker could not reach the SMTP relay: %s",
							error[0] != '\0' ? error : "no reason given"),
					 errdetail("Delivery is retried with backoff; the mail stays scheduled meanwhile.")));
		backoff_ms = backoff_ms == 0 ? BACKOFF_MIN_MS :
			Min(backoff_ms * 2, BACKOFF_MAX_MS);
		backoff_until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													backoff_ms);
	}
}
