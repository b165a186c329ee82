/*-------------------------------------------------------------------------
 *
 * worker.c
 *		The gatekeeper background worker: claims due mail, delivers it over
 *		SMTP and records what became of it, as a continuous pipeline.
 *
 * Each of gatekeeper.workers workers connects to gatekeeper.database and
 * loops over six verbs:
 *
 *	housekeep	every few seconds, reap expired leases and purge old mail,
 *				and the first worker has mail_live vacuumed after a burst
 *				(src/maintenance.c)
 *				(and find out whether the extension exists: without it the
 *				worker idles quietly; CREATE EXTENSION may come later, DROP
 *				EXTENSION at any time);
 *	announce	(the first worker only) NOTIFY gatekeeper, '<queue>' for the
 *				notify queues' mail that comes due after its commit, when it
 *				comes due, before claiming it itself (src/worker_announce.c);
 *	claim		when the mail in flight runs low, claim more (src/claim.c,
 *				called directly), in a short transaction that first records
 *				the outcomes waiting (one commit for both);
 *	send		build each claimed mail's message just before it goes on the
 *				wire, while the SMTP client (src/smtp_client.c) has room and
 *				gatekeeper.max_in_flight bytes allow;
 *	record		take the outcomes the relay's replies decided and record
 *				them (ack, nack, unclaim: src/mail_state.c, called directly,
 *				each once per round) in small transactions, every few
 *				milliseconds or few hundred outcomes, or in the next
 *				claim's;
 *	extend		extend the leases of mail still in flight before they run
 *				out, each batch row of its claims once;
 *
 * then sleeps in the client's wait set (its sockets, the latch a commit of
 * due mail sets, postmaster death) for as long as nap() says.
 *
 * Failover (SPEC "Failover").  A worker's claims carry its name,
 * "bgworker:<pid>@<incarnation>", the incarnation being drawn whenever the
 * server's shared memory is initialized (src/gatekeeper.c): reap(), which
 * housekeeping runs as soon as a worker starts, takes back at once the
 * claims of every other incarnation's workers, which are gone (this server
 * was promoted, or restarted).  With gatekeeper.claim_standbys = N, the
 * mail of a claim stays on "pending", held, until N streaming standbys
 * have flushed the claim's commit, so a failover re-sends at most the mail
 * that was in flight; the mail already cleared goes on meanwhile.  While
 * transactions are read-only (default_transaction_read_only, as failover
 * managers set it while they switch) the worker claims, sends and records
 * nothing, and waits for the reload that ends the spell.  On a standby no
 * worker runs: they start when recovery ends.
 *
 * The relay's faults are not the mail's: when no session can be opened
 * (no connection, a refused greeting, EHLO, STARTTLS or login, a session
 * that ends before any transaction was answered, a reply that breaks RFC
 * 5321's limits), or the relay refuses MAIL FROM with the same 5xx for
 * several transactions in a row, that relay's breaker opens: the relay
 * gets no mail for a backoff (1 s, doubling to 30 s), the worker says once
 * in the log what the relay said, and shows it in gatekeeper.worker_status.
 * (A relay that ends a session after a few messages is no fault: the
 * client sends what it did not answer again at once, and the worker never
 * sees it.)
 *
 * Several relays (gatekeeper.smtp_url is a list): each mail goes to the
 * first relay in the list whose breaker is closed (or half-open: its
 * backoff is over) and that has room, so the next relay takes what the
 * first one's connections cannot, and all of a relay's mail while its
 * breaker is open.  Mail a relay did not take (the UNREACHABLE outcomes:
 * the session failed before the relay answered it, or its MAIL FROM was
 * refused) goes to the next relay at once, within the same claim,
 * uncharged; mail whose outcome is unknown (RETRY) is never sent to
 * another relay.  Only while every relay's breaker is open does the mail
 * go back uncharged (unclaim) and the worker back off.
 *
 * A worker that hits an error exits and is restarted by the postmaster
 * after bgw_restart_time; it does not try to carry on, except when a
 * claim, the recording of outcomes, an extension of leases, its
 * housekeeping or an announcement fails.  Each may fail while mail the
 * worker claimed is on the wire or already went, for reasons that are not
 * the worker's (a trigger of the user's, a deadlock with an application's
 * transaction, the disk, a full NOTIFY queue), and exiting then would send
 * that mail again once its lease ran out.  Each runs in a subtransaction,
 * and its transaction's commit is caught too (gatekeeper_commit_catch: a
 * deferred trigger fails there); when either fails, the step is rolled
 * back, the worker says why in the log (and worker_status), keeps what it
 * holds (the mail on the wire, the outcomes not recorded, their leases
 * extended) and tries again after a backoff (src/worker_step.c).  What
 * a step did enters the worker's memory only once its commit passed
 * (worker_finish_step).  Its session settings are its own (no lock or
 * statement timeout, READ COMMITTED, commits flushed), so the database's
 * or role's cannot make it fail so.  Every wait goes through the process
 * latch and SIGTERM is handled by die(), so shutdown and DROP DATABASE
 * ... WITH (FORCE) end a worker promptly.
 *
 * When its database does not exist, a worker says so once, then waits
 * unconnected (its successors see the failed attempt in shared memory),
 * looking for it twice a second, and hands its slot over to a new worker
 * that connects as soon as the database appears.
 *
 * IDENTIFICATION
 *		src/worker.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "gatekeeper.h"
#include "address.h"
#include "catalog.h"
#include "mail/mail_store.h"
#include "dkim.h"
#include "message.h"
#include "wake.h"
#include "worker.h"
#include "worker_announce.h"
#include "worker_breakers.h"
#include "worker_database.h"
#include "worker_delivery.h"
#include "worker_record.h"
#include "worker_slots.h"
#include "worker_standbys.h"
#include "worker_step.h"
#include "xact.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_database.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "lib/ilist.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "maintenance.h"
#include "progress.h"
#include "report.h"
#include "smtp_client.h"
#include "smtp_config.h"

/* how often expired leases are reaped and old mail is purged */
#define HOUSEKEEPING_INTERVAL_MS	5000
/* mails purge() removes in a pass, as its SQL default */
#define PURGE_BATCH					10000

/*
 * Outcomes are recorded when this many wait, or the oldest is this old (or
 * nothing else is on its way).  A round's transaction, its statements'
 * start and its commit cost the same for 10 mails as for 500; 25 ms
 * rounds measured about a tenth less worker CPU per mail than 10 ms ones
 * (docs/internals.md, "The ack's outcome rows").  What a crash sends
 * again stays bounded by
 * the window either way (claim()).
 */
#define RECORD_BATCH				512
#define RECORD_DELAY_MS				25

/* a lease is extended when less than this part of it is left */
#define LEASE_EXTEND_DIVISOR		3

/* this worker's slot in shared memory, and its name in claims */
static int	worker_slot;
static char worker_name[64];

/*
 * The statements the worker runs, each kept by gatekeeper_plan() on first
 * use.  A kept plan outlives DROP EXTENSION: the plan cache re-plans it by
 * name once the extension is back.
 */
/* the queues the background workers serve */
static const char next_due_sql[] =
"SELECT gatekeeper.next_due(ARRAY(SELECT q.name FROM gatekeeper.queue q WHERE q.background))";

static SPIPlanPtr next_due_plan = NULL;

static TimestampTz next_housekeeping = 0;

/*
 * The pipeline.  Every claimed mail not yet recorded is on "live", in the
 * order its lease runs out; each is also on one of "pending" (claimed, not
 * yet handed to the client), the client's own queues, "outcomes" (decided,
 * to be recorded) or "suspects" (refused at MAIL FROM: the mail's fault or
 * the relay's, not known yet).
 */
static dlist_head live = DLIST_STATIC_INIT(live);
static int	nlive = 0;
static int64 live_bytes = 0;
static dlist_head pending = DLIST_STATIC_INIT(pending);
static int	npending = 0;
static dlist_head outcomes = DLIST_STATIC_INIT(outcomes);
static int	noutcomes = 0;
static int64 noutcome_bytes = 0;	/* their deliveries' bytes */
static TimestampTz outcomes_since = 0;

/*
 * gatekeeper.claim_standbys: "pending" is in claim order, and its first
 * npending_cleared mails are those whose claims the standbys have flushed
 * (all of them while claim_standbys is 0); the rest are held
 * (src/worker_standbys.c).
 */
static int	npending_cleared = 0;

/* transactions are read-only (a failover manager switching), or not */
static bool read_only = false;

/* when to claim next, and the mean size of a claimed mail */
static TimestampTz next_claim_at = 0;
static double mail_bytes_mean = 0;

/* the steps the worker survives when they fail (src/worker_step.c) */
static WorkerTrouble claim_trouble = {.what = "claim"};
static WorkerTrouble record_trouble = {.what = "recording outcomes"};
static WorkerTrouble extend_trouble = {.what = "extending leases"};
static WorkerTrouble housekeeping_trouble = {.what = "housekeeping"};

/* extend's work, run in a subtransaction (extend_step) */
typedef struct ExtendStep
{
	GatekeeperDelivery **mails;	/* the mails whose leases run out soon */
	int			n;
	bool	   *held;			/* whether each one's claim was still open */
	TimestampTz until;			/* when their leases run out now */
} ExtendStep;

/* the relays of gatekeeper.smtp_url, by their number in the list */
static int	nrelays = 1;

/* whether gatekeeper.smtp_url is set and looks usable, and its value */
static bool smtp_enabled = false;
static char *smtp_url_seen = NULL;

/*
 * Why mail is held although a relay is set: the DKIM keys, read at start
 * and at each reload, cannot be used.  "" when nothing holds it.
 * worker_status shows it as every relay's last_error.
 */
static char held_why[256];

/* the last claim left due mail it wanted: a queue's rate_limit holds it */
static bool rate_held = false;

/* what gatekeeper.worker_status shows of this worker */
static GatekeeperWorkerStatus status;

static void check_settings(void);
static void housekeep(bool woken);
static bool claim(bool woken);
static void deliver(void);
static void collect(void);
static void record(void);
static void extend(void);
static bool extend_step(void *arg);
static void extend_failed(ErrorData *error, void *arg);
static long nap(void);
static void report(const char *state);
static bool watch_read_only(void);
static void housekeeping(void);
static bool housekeeping_step(void *arg);
static void housekeeping_failed(ErrorData *error, void *arg);
static int	claim_window(void);
static int	undecided(void);
static int	claim_mail(int want, int64 max_bytes, TimestampTz *next_due, bool *have_next_due);
static bool claim_step(void *arg);
static void drop_taken(int n);
static void claim_failed(ErrorData *error);
static void take_mail(void *arg, Datum *values, bool *nulls, TimestampTz due);
static bool build_message(GatekeeperDelivery *d, const char *default_sender);
static void hold_mail(void);
static void hand_back_pending(const char *error);
static void judge(GatekeeperDelivery *d);
static void decided(GatekeeperDelivery *d);
static void observe_latency(GatekeeperDelivery *d);
static void reroute(GatekeeperDelivery *d);
static void let_go(dlist_head *out);
static GatekeeperRelayStatus *relay_status(int relay);
static void record_outcomes(void);
static bool record_outcomes_here(RecordStep *step);
static void outcomes_recorded(const RecordStep *step);
static void record_failed(ErrorData *error);
static void forget_outcomes(void);
static void outcomes_dropped(void);
static int	claim_here(int want, int64 max_bytes, TimestampTz *next_due, bool *have_next_due);
static void forget_delivery(GatekeeperDelivery *d);

/*
 * Entry point of a gatekeeper worker.  main_arg is its slot number.
 */
void
gatekeeper_worker_main(Datum main_arg)
{
	worker_slot = DatumGetInt32(main_arg);
	/* each relay's connections= and rate= are shared by the workers */
	smtp_config_set_share(worker_slot, gatekeeper_workers);
	gatekeeper_background_claim = true;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	/*
	 * If our predecessor in this slot never finished connecting, the
	 * database is probably gone: wait for it without connecting, instead of
	 * failing again every bgw_restart_time.
	 */
	if (gatekeeper_slot_connecting(worker_slot, true))
		worker_wait_for_database(worker_slot);

	BackgroundWorkerInitializeConnection(gatekeeper_database, NULL, 0);
	gatekeeper_slot_attach(worker_slot);

	/* the claims name this server's incarnation: see reap() */
	snprintf(worker_name, sizeof(worker_name), "bgworker:%d@%s", (int) MyProcPid,
			 gatekeeper_incarnation());
	SetConfigOption("application_name", MyBgworkerEntry->bgw_name,
					PGC_USERSET, PGC_S_SESSION);
	/* everything is schema-qualified; this only closes the door */
	SetConfigOption("search_path", "pg_catalog, pg_temp",
					PGC_USERSET, PGC_S_SESSION);

	/*
	 * The settings its promise rests on, over whatever ALTER DATABASE or
	 * ALTER ROLE gave the session (as autovacuum pins its own): a lock
	 * timeout or a serialization failure would end the worker with mail on
	 * the wire, to go again once its lease ran out.  A lock held long is
	 * waited for (pg_stat_activity shows the wait).  Functions that set
	 * these for themselves still may.  synchronous_commit: check_settings.
	 */
	SetConfigOption("lock_timeout", "0", PGC_SUSET, PGC_S_SESSION);
	SetConfigOption("statement_timeout", "0", PGC_SUSET, PGC_S_SESSION);
	SetConfigOption("default_transaction_isolation", "read committed",
					PGC_SUSET, PGC_S_SESSION);
	/* its statements are planned without JIT: see gatekeeper_planner */
	gatekeeper_own_session();

	memset(&status, 0, sizeof(status));
	status.started = GetCurrentTimestamp();
	check_settings();

	ereport(LOG,
			(errmsg("gatekeeper worker started in database \"%s\"",
					gatekeeper_database)));

	for (;;)
	{
		bool		woken;

		CHECK_FOR_INTERRUPTS();

		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			check_settings();
		}

		/* this round sees every mail whose commit set the flag until now */
		woken = gatekeeper_slot_woken(worker_slot, true);

		if (watch_read_only())
		{
			housekeep(woken);
			if (worker_slot == 0)
				worker_announce();
			claim(woken);
			npending_cleared += worker_standbys_clear();
			deliver();
			record();
			extend();
		}
		report(NULL);

		(void) smtp_client_wait(nap());
		collect();
	}
}


/*
 * Act on the settings, at start and after each reload.
 *
 * Delivery is on when gatekeeper.smtp_url is an smtp:// or smtps:// URL
 * and the password file and the DKIM key table, if named, can be used;
 * off when the URL is empty.  The relay password and the DKIM keys are
 * read from their files here, so at start and at every reload.  A changed relay gets a fresh try, without the
 * backoff of the old one.
 */
static void
check_settings(void)
{
	const char *url = gatekeeper_smtp_url ? gatekeeper_smtp_url : "";

	held_why[0] = '\0';

	/*
	 * A claim must be on disk before its mail goes on the wire: a claim
	 * lost in a crash would send its mail again.  The worker's commits
	 * wait at least for the local flush, whatever the server's, the
	 * database's or the role's synchronous_commit; a setting that waits
	 * for standbys too is kept.
	 */
	if (synchronous_commit == SYNCHRONOUS_COMMIT_OFF)
		SetConfigOption("synchronous_commit", "local", PGC_SUSET, PGC_S_SESSION);

	if (url[0] == '\0')
		smtp_enabled = false;
	else if (!smtp_client_load_password())
		smtp_enabled = false;	/* the log says why */
	else if (!gatekeeper_dkim_load())
	{
		smtp_enabled = false;	/* the log says why */
		snprintf(held_why, sizeof(held_why), "gatekeeper.dkim_key_table cannot be used: %s",
				 gatekeeper_dkim_problem());
	}
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

	smtp_client_configure();
	nrelays = smtp_client_relays();

	if (smtp_url_seen == NULL || strcmp(smtp_url_seen, url) != 0)
	{
		int			i;

		if (smtp_url_seen != NULL)
			pfree(smtp_url_seen);
		smtp_url_seen = MemoryContextStrdup(TopMemoryContext, url);
		worker_breakers_reset();

		/* a relay's row stays with its URL, and starts again for a new one */
		status.nrelays = url[0] != '\0' ? nrelays : 0;
		for (i = 0; i < status.nrelays; i++)
		{
			GatekeeperRelayStatus *rs = &status.relays[i];

			if (strcmp(rs->url, smtp_client_relay_url(i)) != 0)
			{
				memset(rs, 0, sizeof(*rs));
				strlcpy(rs->url, smtp_client_relay_url(i), sizeof(rs->url));
			}
		}
	}
	if (held_why[0] != '\0')
		hold_mail();
}

/*
 * hold_mail: deliver nothing until the next reload, because of held_why
 * (the DKIM keys cannot be used); the claimed mail not yet on the wire goes
 * back uncharged (it would otherwise go unsigned), and worker_status says
 * why, as every relay's last_error.  Signing is the worker's own part: no
 * mail fails, and no relay's breaker opens, for a key it cannot use.
 */
static void
hold_mail(void)
{
	TimestampTz now = GetCurrentTimestamp();
	int			i;

	smtp_enabled = false;
	for (i = 0; i < status.nrelays; i++)
	{
		strlcpy(status.relays[i].last_error, held_why, sizeof(status.relays[i].last_error));
		status.relays[i].last_error_at = now;
	}
	hand_back_pending(held_why);
}

/*
 * housekeep: reap and purge every few seconds, in a transaction of their
 * own.  A wake while the extension is missing is most likely CREATE
 * EXTENSION committing (its script wakes us): look at once.
 */
static void
housekeep(bool woken)
{
	TimestampTz now = GetCurrentTimestamp();

	if (now >= next_housekeeping || (woken && !worker_extension_ready()))
		housekeeping();
	if (woken)
		next_claim_at = 0;
}

/*
 * The mails claimed whose outcome is not decided yet: those being built,
 * on the wire, or held as suspects.
 */
static int
undecided(void)
{
	return nlive - noutcomes;
}

/*
 * The number of mails the worker keeps claimed: enough to keep every
 * connection's queue (of every relay) full twice over, within
 * gatekeeper.batch_size.
 */
static int
claim_window(void)
{
	return Max(Min(gatekeeper_batch_size, gatekeeper_smtp_connections * 16 * nrelays), 1);
}

/*
 * claim: when half the window has drained, and mail may be due, claim up
 * to the rest of it, as many as gatekeeper.max_in_flight bytes allow by
 * the mean size of mail claimed so far, and in any case no more bytes
 * than max_in_flight leaves (the first mail always).  The window counts every mail
 * claimed and not yet recorded, so that a crash sends at most a window's
 * mail again (t/022).  The outcomes waiting to be recorded are recorded in
 * the claim's transaction, so they do not count; record() claims at once
 * when only they hold the next claim back.  Returns whether it claimed
 * (and so recorded the outcomes), even if the claim itself failed.
 */
static bool
claim(bool woken)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz next_due = 0;
	bool		have_next_due = false;
	int			window = claim_window();
	int			want;
	int			n;
	int			held;
	int64		held_bytes;

	if (!smtp_enabled || !worker_extension_ready() || worker_breakers_resume(nrelays) > now)
		return false;
	if (now < claim_trouble.retry_at ||
		(noutcomes > 0 && now < record_trouble.retry_at))
		return false;

	/* the outcomes waiting are recorded in the claim's transaction */
	held = nlive - noutcomes;
	held_bytes = live_bytes - noutcome_bytes;
	if (now < next_claim_at || held > window / 2)
		return false;
	if (held > 0 && held_bytes >= gatekeeper_max_in_flight / 2)
		return false;

	/*
	 * How many to ask for: until sizes are known, take each mail to be as
	 * large as it may be.  A claim holds what it returns three times for a
	 * moment (the claim's result set, SPI's copy of it, and ours), so it
	 * asks for a third of the room left.  The mean is only a guess (40
	 * mails of 4 MB after 300 tiny ones came in one claim of 160 MB): the
	 * claim itself stops at the room left in bytes (src/claim.c,
	 * hold_back_over_budget), and what it held back is the first the next
	 * claim finds.
	 */
	want = window - held;
	{
		double		mean = mail_bytes_mean > 0 ? mail_bytes_mean :
			(double) gatekeeper_max_message_size;
		double		room = ((double) gatekeeper_max_in_flight - (double) held_bytes) / 3;

		want = (int) Min((double) want, Max(room / mean, 1.0));
	}

	n = claim_mail(want, Max((int64) gatekeeper_max_in_flight - held_bytes, 1),
				   &next_due, &have_next_due);

	now = GetCurrentTimestamp();

	/*
	 * Due mail the claim could not take, although it wanted more: a queue's
	 * rate_limit holds it (paused queues' mail is never due here, and
	 * gated or windowed mail is moved to later).  worker_status says so
	 * rather than "idle" while the worker waits for the next tokens.
	 */
	rate_held = n >= 0 && n < want && have_next_due && next_due <= now;
	if (n < 0)
		next_claim_at = Max(claim_trouble.retry_at, record_trouble.retry_at);
	else if (n >= want)
		next_claim_at = now;
	else if (have_next_due && next_due > now)
		next_claim_at = Min(next_due, TimestampTzPlusMilliseconds(now, gatekeeper_naptime));
	else if (have_next_due && n > 0)
	{
		/*
		 * Due mail the claim did not return: the claim may have suppressed
		 * or deferred part of it (look again at once) or a rate limit holds
		 * it (then a nap is right).  Only a claim that made progress earns
		 * another try.
		 */
		next_claim_at = now;
	}
	else
		next_claim_at = TimestampTzPlusMilliseconds(now, gatekeeper_naptime);
	(void) woken;
	return true;
}

/*
 * deliver: build the next claimed mails' messages and hand them to the SMTP
 * client, each for the first relay whose breaker is closed and that has
 * room (worker_breakers_next), while gatekeeper.max_in_flight bytes allow
 * (one message always may go).  A mail without a sender, or whose message
 * cannot be built, fails here.  Building happens in a transaction, one
 * per round, so that whatever it needs of the catalog is at hand; a mail
 * another relay did not take was built already.
 */
static void
deliver(void)
{
	const char *default_sender;
	bool		in_xact = false;
	int			relay;
	TimestampTz now;

	if (npending_cleared == 0)
		return;
	default_sender = gatekeeper_default_sender ? gatekeeper_default_sender : "";

	now = GetCurrentTimestamp();
	while (npending_cleared > 0 && (relay = worker_breakers_next(now, nrelays)) >= 0)
	{
		GatekeeperDelivery *d;

		if (live_bytes > gatekeeper_max_in_flight && smtp_client_busy() > 0)
			break;
		d = dlist_container(GatekeeperDelivery, queue_node, dlist_pop_head_node(&pending));
		npending--;
		npending_cleared--;

		if (d->message.data == NULL)
		{
			if (!in_xact)
			{
				SetCurrentStatementStartTimestamp();
				StartTransactionCommand();
				in_xact = true;
			}
			if (!build_message(d, default_sender))
			{
				decided(d);
				in_xact = IsTransactionState();
				continue;
			}
		}
		smtp_client_submit(relay, d);
		CHECK_FOR_INTERRUPTS();
	}
	if (in_xact)
		CommitTransactionCommand();
	collect();
}

/*
 * collect: take every outcome the client has decided.
 */
static void
collect(void)
{
	GatekeeperDelivery *d;

	while ((d = smtp_client_next_done()) != NULL)
		judge(d);

	/* refusals at MAIL FROM with nothing else to compare: the mail's own */
	if (worker_breakers_suspects() > 0 && npending == 0 && smtp_client_busy() == 0)
	{
		dlist_head	out;

		dlist_init(&out);
		worker_breakers_release(-1, false, &out);
		let_go(&out);
	}
}

/*
 * record: record the outcomes when enough have come, the oldest has waited
 * long enough, no other mail is on its way, or they alone hold the next
 * claim back (half the window is decided: see claim()).
 */
static void
record(void)
{
	TimestampTz now;
	int			window = claim_window();

	if (noutcomes == 0)
		return;
	now = GetCurrentTimestamp();
	if (now < record_trouble.retry_at)
		return;
	if (noutcomes < RECORD_BATCH && nlive > noutcomes + worker_breakers_suspects() &&
		!(nlive > window / 2 && undecided() <= window / 2) &&
		now < TimestampTzPlusMilliseconds(outcomes_since, RECORD_DELAY_MS))
		return;
	/* a claim that may go now records them in its own transaction */
	if (claim(false))
		return;
	record_outcomes();
}

/*
 * extend: extend the leases of mail still in flight when less than a
 * third of the lease is left, in one call for all of them: each batch row
 * of their claims is extended once (src/mail_state.c).  "live" is in
 * lease order: only its head needs looking at.  A mail the claim no longer
 * holds (its lease ran out, and it was reaped) is said so in the log.
 */
static void
extend(void)
{
	TimestampTz now = GetCurrentTimestamp();
	int64		margin = (int64) gatekeeper_lease / LEASE_EXTEND_DIVISOR;
	dlist_head	done_extending;
	dlist_iter	iter;
	ExtendStep	step;
	int			i;

	if (dlist_is_empty(&live) || now < extend_trouble.retry_at)
		return;
	if (dlist_container(GatekeeperDelivery, live_node, dlist_head_node(&live))->lease_until >
		TimestampTzPlusMilliseconds(now, margin))
		return;

	if (!worker_begin_step("extending leases"))
	{
		worker_end_step();
		return;
	}
	/* kept past the commit: the leases are moved on once it passed */
	step.mails = MemoryContextAlloc(TopMemoryContext, nlive * sizeof(GatekeeperDelivery *));
	step.n = 0;
	dlist_foreach(iter, &live)
	{
		GatekeeperDelivery *d = dlist_container(GatekeeperDelivery, live_node, iter.cur);

		if (d->lease_until > TimestampTzPlusMilliseconds(now, margin) || step.n == nlive)
			break;
		step.mails[step.n++] = d;
	}
	step.held = MemoryContextAlloc(TopMemoryContext, Max(step.n, 1) * sizeof(bool));

	/*
	 * In a subtransaction: an extension that fails (a trigger of the
	 * user's, the disk), or whose commit fails, must not end the worker,
	 * whose mail on the wire would go again.  It is tried again soon, well
	 * within the margin left, while the leases still run; the leases the
	 * worker knows of move on only once the extension is committed.
	 */
	if (worker_run_step(extend_step, &step, extend_failed, &step))
	{
		worker_step_passed(&extend_trouble);

		dlist_init(&done_extending);
		for (i = 0; i < step.n; i++)
		{
			GatekeeperDelivery *d = step.mails[i];

			dlist_delete(&d->live_node);
			dlist_push_tail(&done_extending, &d->live_node);
			d->lease_until = step.until;
			if (!step.held[i])
				ereport(LOG,
						(errmsg("gatekeeper worker no longer holds mail %lld: its lease ran out",
								(long long) d->mail.id),
						 errdetail("It may be sent again by another claim.")));
		}

		/* extended leases run out last */
		while (!dlist_is_empty(&done_extending))
			dlist_push_tail(&live, dlist_pop_head_node(&done_extending));
	}
	pfree(step.mails);
	pfree(step.held);
}

/*
 * extend_step: extend's work, for worker_run_step: one call of
 * src/mail_state.c for every mail whose lease runs out soon.
 */
static bool
extend_step(void *arg)
{
	ExtendStep *step = (ExtendStep *) arg;
	int64	   *ids = palloc(step->n * sizeof(int64));
	int32	   *attempts = palloc(step->n * sizeof(int32));
	int			i;

	for (i = 0; i < step->n; i++)
	{
		ids[i] = step->mails[i]->mail.id;
		attempts[i] = step->mails[i]->mail.attempt;
	}
	step->until = TimestampTzPlusMilliseconds(GetCurrentTransactionStartTimestamp(),
											  gatekeeper_lease);
	(void) mail_store_extend(ids, attempts, step->n, step->until, step->held);
	return true;
}

/*
 * An extension of the leases of arg's mails (an ExtendStep) failed, and was
 * rolled back: say what it said, and try again within a quarter of the
 * margin a lease is extended at.
 */
static void
extend_failed(ErrorData *error, void *arg)
{
	int			n = ((ExtendStep *) arg)->n;
	int64		margin_ms = (int64) gatekeeper_lease / LEASE_EXTEND_DIVISOR;
	int64		retry_ms = worker_step_failed(&extend_trouble, error, 1, Max(margin_ms / 4, 1));

	worker_log_survived(error,
						psprintf(" could not extend the leases of %d mail%s", n, n == 1 ? "" : "s"),
						psprintf("The worker tries again in " INT64_FORMAT " ms; mail whose lease runs out meanwhile may be sent again by another claim.",
								 retry_ms));
}

/*
 * nap: how long to sleep before the next round, in milliseconds: until the
 * soonest of housekeeping, the next claim (when the window has room), the
 * end of the backoff (while every relay's breaker is open), recording the outcomes, extending a lease, or at
 * most gatekeeper.naptime.  The SMTP client shortens it further for its
 * own deadlines, and any relay reply or latch ends it.
 */
static long
nap(void)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz wake = TimestampTzPlusMilliseconds(now, gatekeeper_naptime);
	TimestampTz resumes = worker_breakers_resume(nrelays);
	bool		delivering = smtp_enabled && worker_extension_ready();

	/* without the extension, housekeeping looks for it once a nap */
	if (worker_extension_ready() || next_housekeeping > now)
		wake = Min(wake, next_housekeeping);
	if (resumes > now)
		wake = Min(wake, resumes);
	else if (delivering)
	{
		if (nlive <= claim_window() / 2)
			wake = Min(wake, next_claim_at);
		if (npending_cleared > 0 && worker_breakers_next(now, nrelays) >= 0 &&
			(live_bytes <= gatekeeper_max_in_flight || smtp_client_busy() == 0))
			wake = now;
		/* mail held back by a relay's rate= goes when the relay may take it */
		else if (npending_cleared > 0)
			wake = Min(wake, Max(smtp_client_room_at(), now));
		/* the standbys' progress wakes nobody: look again shortly */
		if (worker_standbys_holding())
			wake = Min(wake, TimestampTzPlusMilliseconds(now, worker_standbys_poll_ms()));
	}
	if (noutcomes > 0 && !read_only)
		wake = Min(wake, Max(record_trouble.retry_at,
							 TimestampTzPlusMilliseconds(outcomes_since, RECORD_DELAY_MS)));
	if (worker_slot == 0 && worker_extension_ready())
		wake = Min(wake, worker_announce_next());
	/* a read-only spell ends with a reload, whose signal sets the latch */
	if (read_only)
		wake = TimestampTzPlusMilliseconds(now, gatekeeper_naptime);
	else if (!dlist_is_empty(&live))
		wake = Min(wake,
				   Max(extend_trouble.retry_at,
					   TimestampTzPlusMilliseconds(dlist_container(GatekeeperDelivery, live_node,
																   dlist_head_node(&live))->lease_until,
												   -(int64) gatekeeper_lease / LEASE_EXTEND_DIVISOR)));
	if (wake <= now)
		return 0;
	return (long) TimestampDifferenceMilliseconds(now, wake);
}

/*
 * report: publish this worker's status in shared memory.
 */
static void
report(const char *state)
{
	TimestampTz now = GetCurrentTimestamp();
	const char *announce_why;
	int			i;

	if (state == NULL)
	{
		if (read_only)
			state = "read-only: default_transaction_read_only is on";
		else if (!worker_extension_ready())
			state = worker_extension_outdated() ? worker_waiting_for() : "waiting for extension";
		else if (!smtp_enabled)
			state = held_why[0] != '\0' ? "holding mail: DKIM keys cannot be used" : "no relay";
		else if (worker_breakers_resume(nrelays) > now)
			state = worker_breakers_throttled(nrelays, now) ? "throttled" : "backing off";
		else if (worker_standbys_holding())
			state = worker_standbys_why();
		else if (record_trouble.failures > 0)
			state = record_trouble.why;
		else if (claim_trouble.failures > 0)
			state = claim_trouble.why;
		else if (extend_trouble.failures > 0)
			state = extend_trouble.why;
		else if (housekeeping_trouble.failures > 0)
			state = housekeeping_trouble.why;
		else if ((announce_why = worker_announce_trouble()) != NULL)
			state = announce_why;
		else if (nlive > 0)
			state = "delivering";
		else if (rate_held)
			state = "throttled: a queue's rate_limit holds its due mail";
		else
			state = "idle";
	}
	strlcpy(status.state, state, sizeof(status.state));
	for (i = 0; i < status.nrelays; i++)
	{
		GatekeeperRelayStatus *rs = &status.relays[i];

		strlcpy(rs->breaker, worker_breaker_state(i, now), sizeof(rs->breaker));
		rs->connections = smtp_client_connections(i);
	}
	status.in_flight = nlive;
	worker_standbys_report(&status);
	gatekeeper_slot_report(worker_slot, &status);

	/*
	 * pg_stat_activity too: what it delivers, else the state it waits in
	 * ("idle", "backing off", ...), not the last transaction's activity
	 * ("claiming"), which would otherwise stay in its query column.
	 */
	if (nlive > 0)
	{
		char		activity[64];

		snprintf(activity, sizeof(activity), "delivering %d mail%s",
				 nlive, nlive == 1 ? "" : "s");
		pgstat_report_activity(STATE_RUNNING, activity);
	}
	else if (!worker_extension_ready())
		pgstat_report_activity(STATE_IDLE, worker_waiting_for());
	else
		pgstat_report_activity(STATE_IDLE, status.state);
}

/*
 * Whether the worker may write: false during a read-only spell, when
 * default_transaction_read_only is on (a failover manager sets it while it
 * switches, and a reload ends it), or should recovery be in progress.
 * The worker then claims, sends and records nothing, which is what a
 * switchover needs: mail it holds claimed is either sent and recorded
 * here once the spell ends, or taken back by the node promoted meanwhile.
 * It says so once in the log and in worker_status.
 */
static bool
watch_read_only(void)
{
	bool		now_read_only = DefaultXactReadOnly || RecoveryInProgress();

	if (now_read_only && !read_only)
		ereport(LOG,
				(errmsg("gatekeeper worker waits: transactions are read-only"),
				 errdetail("default_transaction_read_only is on; the worker claims, sends and records no mail until a reload turns it off.")));
	read_only = now_read_only;
	return !read_only;
}

/*
 * Reap expired leases and purge a batch of old mail, in a transaction of
 * their own, when the extension exists.
 */
static void
housekeeping(void)
{
	int64		purged = 0;

	if (!worker_begin_step("housekeeping"))
	{
		/* no extension, or not yet updated: idle, and look again after a nap */
		next_housekeeping = 0;
		worker_end_step();
		pgstat_report_activity(STATE_IDLE, worker_waiting_for());
		return;
	}

	/*
	 * In a subtransaction: housekeeping that fails (a trigger of the
	 * user's, the disk), or whose commit fails, must not end the worker,
	 * whose mail on the wire would go again; it is tried again after a
	 * backoff.
	 */
	if (!worker_run_step(housekeeping_step, &purged, housekeeping_failed, NULL))
		return;
	worker_step_passed(&housekeeping_trouble);

	/* purge deletes in batches: with more to purge, go on next pass */
	next_housekeeping = purged > 0 ? 0 :
		TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
									HOUSEKEEPING_INTERVAL_MS);
}

/*
 * Housekeeping failed, and was rolled back: say what it said, and try
 * again after a backoff of at least its interval.
 */
static void
housekeeping_failed(ErrorData *error, void *arg)
{
	int64		backoff_ms = worker_step_failed(&housekeeping_trouble, error,
										 HOUSEKEEPING_INTERVAL_MS,
										 WORKER_BACKOFF_MAX_MS);

	next_housekeeping = housekeeping_trouble.retry_at;
	worker_log_survived(error, "'s housekeeping failed",
				 psprintf("The worker goes on delivering, and tries again in " INT64_FORMAT " ms.",
						  backoff_ms));
}

/*
 * housekeeping_step: housekeeping's work, for worker_run_step;
 * *arg receives how many finished mails were purged.
 */
static bool
housekeeping_step(void *arg)
{
	int64	   *purged = (int64 *) arg;

	/* the mail store's reap and purge, as reap() and purge() run them */
	(void) mail_store_reap();
	*purged = mail_store_purge(PURGE_BATCH);

	/* the first worker has mail_live vacuumed after a burst */
	if (worker_slot == 0)
		gatekeeper_live_maintenance();
	if (worker_slot == 0)
		gatekeeper_progress_watch();
	return true;
}

/* claim_mail's claim, run in a subtransaction (claim_step) */
typedef struct ClaimStep
{
	int			want;
	int64		max_bytes;
	int			n;				/* how many it claimed */
	TimestampTz *next_due;
	bool	   *have_next_due;
} ClaimStep;

/* What claim_mail's receiver fills in. */
typedef struct ClaimTaken
{
	TimestampTz lease_until;
	int64		bytes;
} ClaimTaken;

/*
 * Claim up to want due mails and put them on "pending", in a transaction
 * that first records the outcomes waiting, if any: one commit (and one
 * WAL flush) instead of two.  Returns how many were claimed, or -1 when
 * the claim, or the recording before it, failed; when fewer than want,
 * *next_due receives the next scheduled send_at, if any.
 *
 * The claim runs in a subtransaction, so that a claim that fails takes
 * neither the outcomes with it (their mail went: undone, it would go
 * again) nor the worker (the mail it has on the wire would go again once
 * its lease ran out).  The subtransaction is rolled back, the deliveries
 * the claim had handed over are dropped before any was built (none of
 * their mail is claimed now), the outcomes are committed, and the worker
 * says what failed and claims again after a backoff (claim_failed).
 */
static int
claim_mail(int want, int64 max_bytes, TimestampTz *next_due, bool *have_next_due)
{
	bool		recording = noutcomes > 0;
	RecordStep	record_step;
	int			held;
	ClaimStep	step;
	bool		claimed;
	ErrorData  *error;

	*have_next_due = false;
	if (!worker_begin_step(recording ? "recording outcomes and claiming" : "claiming"))
	{
		worker_end_step();
		if (recording)
			outcomes_dropped();
		return 0;
	}
	if (recording && !record_outcomes_here(&record_step))
	{
		/* the outcomes are what hold the claim back: no claim either */
		worker_end_step();
		return -1;
	}

	held = nlive;
	step.want = want;
	step.max_bytes = max_bytes;
	step.n = 0;
	step.next_due = next_due;
	step.have_next_due = have_next_due;
	claimed = gatekeeper_subxact_catch(claim_step, &step, &error);
	if (!claimed)
	{
		drop_taken(nlive - held);
		claim_failed(error);
		if (!recording)
		{
			worker_end_step();
			return -1;
		}
	}

	/*
	 * A commit that fails takes the outcomes and the claim with it: the
	 * outcomes wait, as after a failed recording, and what the claim had
	 * handed over is dropped, none of it built yet.
	 */
	if (!worker_finish_step(&error))
	{
		if (claimed)
			drop_taken(nlive - held);
		if (recording)
			record_failed(error);
		else
			claim_failed(error);
		FreeErrorData(error);
		return -1;
	}
	if (recording)
		outcomes_recorded(&record_step);
	if (!claimed)
		return -1;
	worker_step_passed(&claim_trouble);
	if (step.n > 0)
		npending_cleared += worker_standbys_hold(step.n, XactLastCommitEnd);
	return step.n;
}

/* claim_mail's claim, for gatekeeper_subxact_catch */
static bool
claim_step(void *arg)
{
	ClaimStep  *step = (ClaimStep *) arg;

	step->n = claim_here(step->want, step->max_bytes, step->next_due, step->have_next_due);
	return true;
}

/*
 * Drop the n deliveries a claim that failed had handed over: the last n
 * on "pending" and on "live" (take_mail), none of them built yet.
 */
static void
drop_taken(int n)
{
	while (n-- > 0)
	{
		GatekeeperDelivery *d = dlist_container(GatekeeperDelivery, queue_node,
												dlist_tail_node(&pending));

		Assert(&d->live_node == dlist_tail_node(&live));
		Assert(d->message.data == NULL);
		dlist_delete(&d->queue_node);
		npending--;
		forget_delivery(d);
	}
}

/*
 * A claim failed, and was rolled back: say what it said, and claim again
 * after gatekeeper.naptime, doubling with each failure in a row up to a
 * minute.  A wake-up does not cut that wait short: a claim that fails at
 * every commit of due mail would fill the log.
 */
static void
claim_failed(ErrorData *error)
{
	int64		backoff_ms = worker_step_failed(&claim_trouble, error, 0,
											 WORKER_BACKOFF_MAX_MS);

	worker_log_survived(error, " could not claim mail",
				 psprintf("The worker goes on delivering the %d mail%s it holds and claims again in " INT64_FORMAT " ms.",
						  nlive, nlive == 1 ? "" : "s", backoff_ms));
}

/*
 * claim_here: claim_mail's claim, in the worker's transaction.
 */
static int
claim_here(int want, int64 max_bytes, TimestampTz *next_due, bool *have_next_due)
{
	Interval   *lease;
	SPIPlanPtr	plan;
	int			ret;
	int			n;
	ClaimTaken	taken;

	/* the envelopes of what is claimed now read the queues and key anew */
	gatekeeper_report_envelope_refresh();

	lease = (Interval *) palloc0(sizeof(Interval));
	lease->time = (int64) gatekeeper_lease * 1000;
	taken.lease_until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), gatekeeper_lease);
	taken.bytes = 0;
	n = mail_store_claim(cstring_to_text(worker_name), want, lease, NULL,
						 max_bytes, take_mail, &taken);
	if (n > 0)
		mail_bytes_mean = mail_bytes_mean == 0 ? (double) taken.bytes / n :
			0.5 * mail_bytes_mean + 0.5 * (double) taken.bytes / n;

	/* when the claim was not full, find when the next mail is due */
	if (n < want)
	{
		plan = gatekeeper_plan(&next_due_plan, next_due_sql, 0, NULL);
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
	return n;
}

/*
 * take_mail: the claim's receiver.  A claimed mail becomes a new delivery
 * (src/worker_delivery.c), on "live" and "pending".
 */
static void
take_mail(void *arg, Datum *values, bool *nulls, TimestampTz due)
{
	ClaimTaken *taken = (ClaimTaken *) arg;
	GatekeeperDelivery *d = worker_delivery_new(values, nulls, due);

	d->lease_until = taken->lease_until;
	dlist_push_tail(&live, &d->live_node);
	nlive++;
	live_bytes += d->bytes;
	taken->bytes += d->bytes;
	dlist_push_tail(&pending, &d->queue_node);
	npending++;
}

/*
 * Build d's message (src/worker_delivery.c): counted when it went
 * unsigned, and what d holds from then on counted in live_bytes.
 */
static bool
build_message(GatekeeperDelivery *d, const char *default_sender)
{
	int64		before = (int64) d->bytes;
	bool		is_unsigned = false;

	if (!worker_delivery_build(d, default_sender, &is_unsigned))
		return false;
	if (is_unsigned)
		status.unsigned_total++;
	live_bytes += (int64) d->bytes - before;
	return true;
}

/*
 * Act on one outcome from the client: the breakers of the relay it went
 * to judge the relay's part in it (worker_breaker_judge, which holds the
 * suspects), and what they let go waits to be recorded, or is handed on
 * to the next relay (reroute).  When the relay's breaker opened and every
 * relay's is open, the mail not yet on the wire goes back uncharged and
 * the worker claims nothing until one resumes.
 */
static void
judge(GatekeeperDelivery *d)
{
	dlist_head	out;
	char		tripped[300];

	dlist_init(&out);
	if (worker_breaker_judge(d, relay_status(d->relay), &out, tripped, sizeof(tripped)))
	{
		TimestampTz now = GetCurrentTimestamp();

		if (worker_breakers_resume(nrelays) > now)
		{
			hand_back_pending(tripped);
			next_claim_at = worker_breakers_resume(nrelays);
		}
	}
	let_go(&out);
}

/*
 * The deliveries the breakers let go of (out): UNREACHABLE ones, which
 * their relay did not take, are handed on; the others are recorded.
 */
static void
let_go(dlist_head *out)
{
	while (!dlist_is_empty(out))
	{
		GatekeeperDelivery *d = dlist_container(GatekeeperDelivery, queue_node,
												dlist_pop_head_node(out));

		if (d->outcome == GATEKEEPER_UNREACHABLE)
			reroute(d);
		else
		{
			if (d->outcome == GATEKEEPER_SENT)
				observe_latency(d);
			decided(d);
		}
	}
}

/*
 * Count the relay's acceptance of d in the delivery latency histogram:
 * the time from when it was due to now, when its 2xx was read.
 */
static void
observe_latency(GatekeeperDelivery *d)
{
	double		seconds;
	int			b;

	if (d->mail.due == 0)
		return;
	seconds = (double) (GetCurrentTimestamp() - d->mail.due) / USECS_PER_SEC;
	if (seconds < 0)
		seconds = 0;			/* the clock went back */
	for (b = 0; b < GATEKEEPER_LATENCY_BUCKETS; b++)
		if (seconds <= gatekeeper_latency_bounds[b])
			break;
	status.latency_buckets[b]++;
	status.latency_sum += seconds;
}

/*
 * Queue d's outcome to be recorded.
 */
static void
decided(GatekeeperDelivery *d)
{
	if (noutcomes == 0)
		outcomes_since = GetCurrentTimestamp();
	dlist_push_tail(&outcomes, &d->queue_node);
	noutcomes++;
	noutcome_bytes += d->bytes;
}

/*
 * d came back UNREACHABLE: its relay did not take it (the session failed
 * before the relay answered it, or refused its MAIL FROM).  While another
 * relay's breaker is not open, d goes to it, first of the mail cleared to
 * go, within this claim and uncharged; else it is handed back uncharged.
 */
static void
reroute(GatekeeperDelivery *d)
{
	TimestampTz now = GetCurrentTimestamp();

	if (worker_breakers_resume(nrelays) > now)
	{
		decided(d);
		return;
	}
	dlist_push_head(&pending, &d->queue_node);
	npending++;
	npending_cleared++;
}

/*
 * hand_back_pending: every claimed mail not yet handed to the client goes
 * back uncharged, with error as the reason.
 */
static void
hand_back_pending(const char *error)
{
	while (!dlist_is_empty(&pending))
	{
		GatekeeperDelivery *d = dlist_container(GatekeeperDelivery, queue_node,
												dlist_pop_head_node(&pending));

		npending--;
		d->outcome = GATEKEEPER_UNREACHABLE;
		strlcpy(d->error, error, sizeof(d->error));
		decided(d);
	}
	npending_cleared = 0;
	worker_standbys_forget();
}

/*
 * What worker_status shows of relay (of a relay no longer listed, what
 * nobody sees).
 */
static GatekeeperRelayStatus *
relay_status(int relay)
{
	static GatekeeperRelayStatus unlisted;

	if (relay >= 0 && relay < status.nrelays)
		return &status.relays[relay];
	return &unlisted;
}

/*
 * Record the outcomes waiting, in a transaction of their own (when no
 * claim takes them into its own: claim_mail), one call of
 * src/mail_state.c per kind: sent mail is acked, retries and failures are
 * nacked (the module gives the failures' gate passes back in the one
 * order every transaction locks them in), and mail the relay would not
 * take a session for is handed back uncharged.  Then the deliveries are
 * forgotten.
 */
static void
record_outcomes(void)
{
	RecordStep	step;
	ErrorData  *error;

	if (!worker_begin_step("recording outcomes"))
	{
		worker_end_step();
		outcomes_dropped();
		return;
	}
	if (!record_outcomes_here(&step))
	{
		worker_end_step();
		return;
	}
	if (!worker_finish_step(&error))
	{
		record_failed(error);
		FreeErrorData(error);
		return;
	}
	outcomes_recorded(&step);
}

/*
 * The extension went, and with it the mail whose outcomes wait: nothing
 * left to record.
 */
static void
outcomes_dropped(void)
{
	ereport(LOG,
			(errmsg("extension gatekeeper was dropped while %d mail%s being delivered; the outcomes are not recorded",
					noutcomes, noutcomes == 1 ? " was" : "s were")));
	forget_outcomes();
}

/*
 * record_outcomes_here: record the outcomes waiting in the worker's
 * transaction (sent: ack; retry or failure: nack; unreachable: unclaim),
 * in a subtransaction, into *step.  Returns false when that failed:
 * nothing was recorded, and the outcomes wait, their leases extended as
 * any mail in flight (extend), to be recorded after a backoff
 * (record_failed).  Exiting instead would send every mail among them that
 * went again, once its lease ran out.  The worker forgets them only once
 * the transaction is committed (outcomes_recorded): a commit that fails
 * leaves them waiting just the same.
 */
static bool
record_outcomes_here(RecordStep *step)
{
	ErrorData  *error;
	dlist_iter	iter;
	int			i;

	step->n = noutcomes;
	step->items = palloc(sizeof(GatekeeperDelivery *) * step->n);
	i = 0;
	dlist_foreach(iter, &outcomes)
		step->items[i++] = dlist_container(GatekeeperDelivery, queue_node, iter.cur);
	step->nsent = 0;
	step->acked = 0;

	if (!gatekeeper_subxact_catch(worker_record_step, step, &error))
	{
		record_failed(error);
		return false;
	}
	return true;
}

/*
 * outcomes_recorded: the transaction that recorded the outcomes waiting
 * (record_outcomes_here) is committed: count them in the relays' totals
 * and forget their deliveries.
 */
static void
outcomes_recorded(const RecordStep *step)
{
	TimestampTz now = GetCurrentTimestamp();
	dlist_iter	iter;

	worker_step_passed(&record_trouble);
	if (step->acked < step->nsent)
		ereport(LOG,
				(errmsg("%d of %d mails delivered by gatekeeper worker were no longer claimed by it",
						step->nsent - step->acked, step->nsent),
				 errdetail("Their leases ran out during delivery, so they may be sent again."),
				 errhint("Consider raising gatekeeper.lease.")));
	dlist_foreach(iter, &outcomes)
	{
		GatekeeperDelivery *d = dlist_container(GatekeeperDelivery, queue_node, iter.cur);
		GatekeeperRelayStatus *rs = relay_status(d->relay);

		if (d->outcome == GATEKEEPER_SENT)
		{
			rs->sent_total++;
			rs->last_success = now;
		}
		else if (d->outcome == GATEKEEPER_FAIL)
			rs->failed_total++;
	}
	forget_outcomes();
}

/*
 * Recording the outcomes failed, and was rolled back: say what it said,
 * and try again after a backoff, as after a failed claim.  Until then the
 * worker claims nothing: the outcomes waiting are what a claim would
 * record first, and they must not pile up.
 */
static void
record_failed(ErrorData *error)
{
	int64		backoff_ms = worker_step_failed(&record_trouble, error, 0,
											 WORKER_BACKOFF_MAX_MS);

	worker_log_survived(error,
				 psprintf(" could not record the outcomes of %d mail%s",
						  noutcomes, noutcomes == 1 ? "" : "s"),
				 psprintf("The worker holds them, and their claims, and records them again in " INT64_FORMAT " ms; it claims no mail until then.",
						  backoff_ms));
}

/*
 * forget_outcomes: the outcomes waiting are recorded (or their extension
 * is gone): forget their deliveries.
 */
static void
forget_outcomes(void)
{
	while (!dlist_is_empty(&outcomes))
		forget_delivery(dlist_container(GatekeeperDelivery, queue_node,
										dlist_pop_head_node(&outcomes)));
	noutcomes = 0;
	noutcome_bytes = 0;
}

/*
 * Forget a delivery whose outcome is recorded.
 */
static void
forget_delivery(GatekeeperDelivery *d)
{
	dlist_delete(&d->live_node);
	nlive--;
	live_bytes -= d->bytes;
	MemoryContextDelete(d->cxt);
}
