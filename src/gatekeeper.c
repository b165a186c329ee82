/*-------------------------------------------------------------------------
 *
 * gatekeeper.c
 *		Module initialization, settings, shared state and wake-on-commit.
 *
 * _PG_init defines the gatekeeper.* settings.  When the library is loaded
 * through shared_preload_libraries it also asks for a little shared memory
 * and registers gatekeeper.workers background workers (src/worker.c).  When
 * it is loaded on demand (CREATE EXTENSION, or the first call of one of its
 * functions) it defines the reloadable settings only, and everything here
 * that touches shared memory quietly does nothing.
 *
 * Shared memory holds one slot per worker: the worker's PID, its PGPROC
 * number and database (never a pointer), a flag saying its last attempt to
 * connect did not finish, and an atomic "wake" flag.  A transaction that
 * writes due mail calls gatekeeper_wake_at_commit(); at commit, and only at
 * commit, the workers connected to that database are woken through their
 * latches.
 *
 * Shared memory also holds this server's incarnation: a random number
 * drawn whenever it is initialized (at start, and again after a crash),
 * which the background workers' claims carry in their worker name, so
 * that a promoted standby or a restarted server knows the claims of
 * workers that are gone (see gatekeeper.reap in the install script).
 *
 * Wake-ups for external senders: a transaction that writes mail of a
 * notify queue due later calls gatekeeper_announce_later(); at commit the
 * earliest such time goes to shared memory and the first worker, which
 * announces mail as it comes due, is woken to look at it (src/worker.c).
 *
 * The library serves one version of the schema, its own: the functions
 * that read or write the extension's tables first ask
 * gatekeeper_require_schema(), which refuses in a database whose
 * extension is another version (see gatekeeper_schema).
 *
 * IDENTIFICATION
 *		src/gatekeeper.c
 *
 *-------------------------------------------------------------------------
 */
#include "gatekeeper.h"
#include "address.h"
#include "dkim.h"
#include "due_floor.h"
#include "stats.h"
#include "mail.h"
#include "smtp_config.h"

#include <ctype.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "commands/async.h"
#include "commands/dbcommands.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "optimizer/planner.h"
#include "port/atomics.h"
#include "postmaster/bgworker.h"
#include "postmaster/postmaster.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/sinval.h"
#include "storage/spin.h"
#include "tcop/pquery.h"
#include "utils/acl.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/memutils.h"

PG_MODULE_MAGIC;

/* Settings; see the Settings table of the specification */
char	   *gatekeeper_database = NULL;
int			gatekeeper_workers = 1;
int			gatekeeper_naptime = 1000;
int			gatekeeper_batch_size = 500;
int			gatekeeper_lease = 5 * 60 * 1000;

/*
 * gatekeeper.lease as set.  A real, not an int: an integer setting in
 * milliseconds overflows on '30d' and PostgreSQL then answers "Value
 * exceeds integer range" instead of naming the 7-day bound; a real takes
 * any duration to the range check.  gatekeeper_lease is its whole value.
 */
static double lease_setting = 5 * 60 * 1000;
int			gatekeeper_retry_delay = 30 * 1000;
char	   *gatekeeper_smtp_url = NULL;
char	   *gatekeeper_smtp_user = NULL;
char	   *gatekeeper_smtp_password_file = NULL;
char	   *gatekeeper_dkim_key_table = NULL;
int			gatekeeper_smtp_connections = 16;
int			gatekeeper_smtp_timeout = 30 * 1000;
char	   *gatekeeper_helo_name = NULL;
char	   *gatekeeper_smtp_ca_file = NULL;
int			gatekeeper_max_in_flight = 64 * 1024 * 1024;
char	   *gatekeeper_default_sender = NULL;
char	   *gatekeeper_message_id_domain = NULL;
int			gatekeeper_retention = 7 * 24 * 60 * 60;
int			gatekeeper_soft_bounce_limit = 5;
int			gatekeeper_max_message_size = 10 * 1024 * 1024;
int			gatekeeper_gate_memory = 256 * 1024;
int			gatekeeper_claim_standbys = 0;

/* set by the background workers (src/worker.c), read by the claim */
bool		gatekeeper_background_claim = false;

/*
 * The delivery latency buckets, in seconds: from the pipeline's
 * milliseconds after a commit wakes the worker, through a busy relay's
 * seconds, to the hour of a backlog.
 */
const double gatekeeper_latency_bounds[GATEKEEPER_LATENCY_BUCKETS] = {
	0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600
};

/*
 * One background worker's slot.  pid is 0 while no worker is connected
 * through this slot.
 */
typedef struct GatekeeperSlot
{
	pid_t		pid;			/* the worker's PID, or 0 */
	int			pgprocno;		/* its PGPROC, whose latch wakes it */
	Oid			database;		/* the database it is connected to */
	bool		connecting;		/* a connection attempt has not finished */
	pg_atomic_uint32 wake;		/* due mail was committed since it looked */
	GatekeeperWorkerStatus status;	/* protected by the mutex */
} GatekeeperSlot;

typedef struct GatekeeperShared
{
	slock_t		mutex;			/* protects every slot's pid, pgprocno,
								 * database and connecting */
	pg_atomic_uint64 announce_due;	/* earliest due time of notify queues'
									 * mail committed since the first worker
									 * looked, or DT_NOEND */
	uint64		incarnation;	/* drawn when shared memory is initialized;
								 * never changes after */
	int			nslots;
	GatekeeperSlot slots[FLEXIBLE_ARRAY_MEMBER];
} GatekeeperShared;

/* NULL unless the library was preloaded */
static GatekeeperShared *gatekeeper_shared = NULL;

static emit_log_hook_type prev_emit_log_hook = NULL;
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;
static planner_hook_type prev_planner_hook = NULL;

/* wake-on-commit state of this backend */
static bool wake_pending = false;
static bool xact_callback_registered = false;

/* the earliest due time this transaction asked to be announced, or DT_NOEND */
static TimestampTz announce_pending = DT_NOEND;

void		_PG_init(void);

PG_FUNCTION_INFO_V1(gatekeeper_wake);
PG_FUNCTION_INFO_V1(gatekeeper_announce);
PG_FUNCTION_INFO_V1(gatekeeper_worker_status);
PG_FUNCTION_INFO_V1(gatekeeper_delivery_latency);
PG_FUNCTION_INFO_V1(gatekeeper_retry_delay_interval);
PG_FUNCTION_INFO_V1(gatekeeper_own_statement);
PG_FUNCTION_INFO_V1(gatekeeper_incarnation_sql);

static bool check_database(char **newval, void **extra, GucSource source);
static bool check_helo_name(char **newval, void **extra, GucSource source);
static bool check_smtp_url(char **newval, void **extra, GucSource source);
static bool check_relay_url(const char *url, const char *subject);
static bool check_dkim_key_table(char **newval, void **extra, GucSource source);
static bool check_smtp_password_file(char **newval, void **extra, GucSource source);
static bool check_smtp_ca_file(char **newval, void **extra, GucSource source);
static bool check_message_id_domain(char **newval, void **extra, GucSource source);
static bool check_file_setting(const char *name, const char *value, const char *current);
static bool check_default_sender(char **newval, void **extra, GucSource source);
static bool check_lease(double *newval, void **extra, GucSource source);
static void assign_lease(double newval, void *extra);
static char *hide_userinfo(const char *text);
static void gatekeeper_emit_log(ErrorData *edata);
static PlannedStmt *gatekeeper_planner(Query *parse, const char *query_string,
									   int cursorOptions, ParamListInfo boundParams);
static Size gatekeeper_shmem_size(void);
static void gatekeeper_shmem_request(void);
static void gatekeeper_shmem_startup(void);
static void gatekeeper_register_workers(void);
static void gatekeeper_xact_callback(XactEvent event, void *arg);
static void gatekeeper_wake_workers(void);
static void gatekeeper_register_xact_callback(void);
static void gatekeeper_post_announcement(TimestampTz due);
static void gatekeeper_slot_detach(int code, Datum arg);
static GatekeeperSlot *gatekeeper_slot(int slotno);

/*
 * Module load: define the settings; when preloaded, also request shared
 * memory and register the workers.
 */
void
_PG_init(void)
{
	gatekeeper_define_settings();

	/*
	 * Changed and refused settings are logged: keep the relay credentials
	 * out, in every process that checks the settings.
	 */
	prev_emit_log_hook = emit_log_hook;
	emit_log_hook = gatekeeper_emit_log;

	/* the planner policy, in every process: see gatekeeper_planner */
	prev_planner_hook = planner_hook;
	planner_hook = gatekeeper_planner;

	/*
	 * Loaded on demand: the reloadable settings are all a backend needs.
	 * The postmaster-only ones could not take effect now anyway.
	 */
	if (!process_shared_preload_libraries_in_progress)
	{
		MarkGUCPrefixReserved("gatekeeper");
		return;
	}

	DefineCustomStringVariable("gatekeeper.database",
							   "Database the gatekeeper workers run in.",
							   NULL,
							   &gatekeeper_database,
							   "postgres",
							   PGC_POSTMASTER,
							   0,
							   check_database, NULL, NULL);

	DefineCustomIntVariable("gatekeeper.workers",
							"Number of gatekeeper delivery workers.",
							"Zero starts none: mail is then claimed by external workers only, "
							"and nothing reaps expired leases or purges finished mail.",
							&gatekeeper_workers,
							1, 0, 64,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("gatekeeper.gate_memory",
							"Shared memory for the gates' live passes.",
							"A recipient passed through a gate takes 64 bytes.  When it is full, "
							"gate_pass fails with SQLSTATE 53200 and claims defer gated mail.",
							&gatekeeper_gate_memory,
							256 * 1024, 1024, INT_MAX / 2,
							PGC_POSTMASTER,
							GUC_UNIT_KB,
							NULL, NULL, NULL);

	MarkGUCPrefixReserved("gatekeeper");

	/* pg_upgrade's server must not deliver mail */
	if (IsBinaryUpgrade)
		return;

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = gatekeeper_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = gatekeeper_shmem_startup;
	gatekeeper_stats_init();

	gatekeeper_register_workers();
}

/*
 * The relay login is half of the relay's credentials, which no role but a
 * superuser may see (SPEC, Security), and GUC_SUPERUSER_ONLY settings are
 * shown to members of pg_read_all_settings (so of pg_monitor) too: to
 * them SHOW and current_setting() say only whether one is set (pg_settings
 * lists it for no one, GUC_NO_SHOW_ALL).  The workers read the variable.
 */
static const char *
show_smtp_user(void)
{
	const char *user = gatekeeper_smtp_user ? gatekeeper_smtp_user : "";

	if (user[0] == '\0' || superuser())
		return user;
	return "(hidden)";
}

/*
 * Define the settings that can change while the server runs.  Safe to call
 * more than once.
 */
void
gatekeeper_define_settings(void)
{
	static bool defined = false;

	if (defined)
		return;
	defined = true;

	gatekeeper_define_segment_setting();
	gatekeeper_define_on_duplicate_setting();

	DefineCustomIntVariable("gatekeeper.naptime",
							"Longest sleep of a gatekeeper worker between passes.",
							"A commit of mail that is due wakes the workers at once.",
							&gatekeeper_naptime,
							1000, 10, 60 * 60 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("gatekeeper.batch_size",
							"Mails a gatekeeper worker claims at once.",
							NULL,
							&gatekeeper_batch_size,
							500, 1, 10000,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("gatekeeper.retry_delay",
							"Base of the exponential backoff between delivery attempts.",
							"The n-th retry of a mail waits a random time between d/2 and d, "
							"d = retry_delay * 2^(n-1), at most 6 hours.",
							&gatekeeper_retry_delay,
							30 * 1000, 10, 6 * 60 * 60 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomRealVariable("gatekeeper.lease",
							 "How long a gatekeeper worker's claim lasts.",
							 "Mail still claimed when its lease runs out is reaped: "
							 "returned to scheduled, or made unknown for at-most-once queues.",
							 &lease_setting,
							 /* bounded by check_lease, which names the bounds */
							 5 * 60 * 1000, 0, DBL_MAX,
							 PGC_SIGHUP,
							 GUC_UNIT_MS,
							 check_lease, assign_lease, NULL);

	DefineCustomStringVariable("gatekeeper.smtp_url",
							   "SMTP relay the gatekeeper workers deliver to.",
							   "smtp://host:port or smtps://host:port, without user or password.  "
							   "Empty: the workers deliver nothing, but still reap and purge.",
							   &gatekeeper_smtp_url,
							   "",
							   PGC_SIGHUP,
							   GUC_SUPERUSER_ONLY,
							   check_smtp_url, NULL, NULL);

	DefineCustomStringVariable("gatekeeper.smtp_user",
							   "User name for the SMTP relay.",
							   NULL,
							   &gatekeeper_smtp_user,
							   "",
							   PGC_SIGHUP,
							   GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL,
							   NULL, NULL, show_smtp_user);

	/*
	 * The password itself is in no setting: pg_read_all_settings reads
	 * every setting, GUC_SUPERUSER_ONLY ones included.  The workers read
	 * the file (src/smtp.c).
	 */
	DefineCustomStringVariable("gatekeeper.smtp_password_file",
							   "File holding the password for the SMTP relay.",
							   "Read by the workers at start and at each reload; it must be "
							   "readable by the server's OS user only.  Empty: no password.",
							   &gatekeeper_smtp_password_file,
							   "",
							   PGC_SIGHUP,
							   GUC_SUPERUSER_ONLY,
							   check_smtp_password_file, NULL, NULL);

	/*
	 * Key files are checked like the password file; the keys are read by
	 * the workers (src/dkim.c).
	 */
	DefineCustomStringVariable("gatekeeper.dkim_key_table",
							   "OpenDKIM-style key table the gatekeeper workers sign mail with.",
							   "Lines \"<name> <domain>:<selector>:<key file>\"; each key file a PEM "
							   "RSA (at least 1024 bits) or Ed25519 private key readable by the "
							   "server's OS user only.  Empty: mail goes unsigned.",
							   &gatekeeper_dkim_key_table,
							   "",
							   PGC_SIGHUP,
							   GUC_SUPERUSER_ONLY,
							   check_dkim_key_table, NULL, NULL);

	DefineCustomIntVariable("gatekeeper.smtp_connections",
							"Parallel SMTP connections per gatekeeper worker.",
							NULL,
							&gatekeeper_smtp_connections,
							16, 1, 256,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("gatekeeper.smtp_timeout",
							"Time the SMTP relay has for each reply.",
							"A connection whose relay does not answer in time is closed; "
							"the others carry on.",
							&gatekeeper_smtp_timeout,
							30 * 1000, 100, 60 * 60 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomStringVariable("gatekeeper.helo_name",
							   "Name the gatekeeper workers give in EHLO.",
							   "Empty: the host's fully qualified name, or its address "
							   "literal when it has none.",
							   &gatekeeper_helo_name,
							   "",
							   PGC_SIGHUP,
							   0,
							   check_helo_name, NULL, NULL);

	DefineCustomStringVariable("gatekeeper.smtp_ca_file",
							   "File of the CAs that verify the SMTP relay's certificate.",
							   "Empty: the system's store.  Verification is always on.",
							   &gatekeeper_smtp_ca_file,
							   "",
							   PGC_SIGHUP,
							   GUC_SUPERUSER_ONLY,
							   check_smtp_ca_file, NULL, NULL);

	DefineCustomIntVariable("gatekeeper.max_in_flight",
							"Bytes of mail a gatekeeper worker holds at once.",
							"Claimed mail and built messages count; one message is always "
							"allowed, however large.",
							&gatekeeper_max_in_flight,
							64 * 1024 * 1024, 64 * 1024, INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomStringVariable("gatekeeper.default_sender",
							   "From address of mail that names no sender.",
							   "An address (local@domain), or a name and an address "
							   "(Shop <local@domain>).  Mail without a sender fails when this is empty.",
							   &gatekeeper_default_sender,
							   "",
							   PGC_SIGHUP,
							   0,
							   check_default_sender, NULL, NULL);

	DefineCustomStringVariable("gatekeeper.message_id_domain",
							   "Right-hand side of the Message-ID of each mail.",
							   "Empty: the domain of the mail's sender.",
							   &gatekeeper_message_id_domain,
							   "",
							   PGC_SIGHUP,
							   0,
							   check_message_id_domain, NULL, NULL);

	DefineCustomIntVariable("gatekeeper.retention",
							"How long finished mail and expired gate passes are kept.",
							NULL,
							&gatekeeper_retention,
							7 * 24 * 60 * 60, 1, INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("gatekeeper.claim_standbys",
							"Streaming standbys a claim must reach before its mail goes on the wire.",
							"With N > 0 a background worker sends a claimed mail only once the "
							"claim's commit is flushed on N streaming standbys, so that a failover "
							"re-sends at most the mail that was in flight.  0: do not wait.",
							&gatekeeper_claim_standbys,
							0, 0, MAX_BACKENDS,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("gatekeeper.max_message_size",
							"Largest mail accepted at enqueue.",
							NULL,
							&gatekeeper_max_message_size,
							10 * 1024 * 1024, 1024, (int) MaxAllocSize,
							PGC_SIGHUP,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomIntVariable("gatekeeper.soft_bounce_limit",
							"Bounces that are not hard, of mails to one address within 30 days, that suppress it.",
							NULL,
							&gatekeeper_soft_bounce_limit,
							5, 1, 1000,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);
}

/*
 * check_lease
 *		gatekeeper.lease is 1 second to 7 days: no longer than claim() takes,
 *		or every claim of the workers would be refused.
 */
static bool
check_lease(double *newval, void **extra, GucSource source)
{
	if (*newval < 1000 || *newval > 7 * 24 * 60 * 60 * 1000.0)
	{
		GUC_check_errmsg("gatekeeper.lease must be between 1 second and 7 days");
		GUC_check_errdetail("The lease given was %.0f seconds.", *newval / 1000);
		return false;
	}
	return true;
}

/*
 * assign_lease
 *		gatekeeper.lease in whole milliseconds, for the workers.
 */
static void
assign_lease(double newval, void *extra)
{
	gatekeeper_lease = (int) rint(newval);
}

/*
 * gatekeeper.database must name a database.
 */
static bool
check_database(char **newval, void **extra, GucSource source)
{
	(void) extra;
	(void) source;

	if (*newval == NULL || (*newval)[0] == '\0')
	{
		GUC_check_errdetail("gatekeeper.database must not be empty.");
		return false;
	}
	return true;
}

/*
 * gatekeeper.smtp_url names the relays, in the order they are used, as a
 * comma-separated list of at most GATEKEEPER_MAX_RELAYS URLs; each is
 * checked by check_relay_url, and one unusable relay refuses the whole
 * value, the message naming it.
 */
static bool
check_smtp_url(char **newval, void **extra, GucSource source)
{
	List	   *urls;
	ListCell   *lc;
	bool		ok = true;

	if (*newval == NULL || (*newval)[0] == '\0')
		return true;
	urls = smtp_config_split(*newval);
	if (list_length(urls) > GATEKEEPER_MAX_RELAYS)
	{
		GUC_check_errmsg("gatekeeper.smtp_url names more than %d relays", GATEKEEPER_MAX_RELAYS);
		GUC_check_errdetail("It names %d.", list_length(urls));
		ok = false;
	}
	foreach(lc, urls)
	{
		const char *url = lfirst(lc);
		int			n = foreach_current_index(lc) + 1;
		char		subject[300];

		if (!ok)
			break;
		if (list_length(urls) == 1)
			strlcpy(subject, "gatekeeper.smtp_url", sizeof(subject));
		else if (url[0] == '\0' || strchr(url, '@') != NULL)
			snprintf(subject, sizeof(subject), "relay %d of gatekeeper.smtp_url", n);
		else
			snprintf(subject, sizeof(subject), "relay %d of gatekeeper.smtp_url (\"%.200s\")", n, url);
		if (url[0] == '\0')
		{
			GUC_check_errmsg("%s is empty", subject);
			GUC_check_errhint("Separate the relays' URLs with single commas.");
			ok = false;
		}
		else
			ok = check_relay_url(url, subject);
	}
	list_free_deep(urls);
	return ok;
}

/*
 * One relay of gatekeeper.smtp_url names the relay and nothing else: a
 * password in it would be readable by pg_read_all_settings and written
 * wherever the setting is logged or copied, and a user name belongs
 * beside the password.  The message names the relay as subject says,
 * which does not repeat a URL with user information (GUC's own would).
 */
static bool
check_relay_url(const char *url, const char *subject)
{
	const char *authority;
	const char *end;
	const char *at = NULL;
	const char *p;
	const char *host;
	const char *hostend;
	const char *port = NULL;

	if (url[0] == '\0')
		return true;

	authority = strstr(url, "://");
	authority = authority ? authority + 3 : url;
	end = authority + strcspn(authority, "/?#");
	for (p = authority; p < end; p++)
	{
		if (*p == '@')
			at = p;
	}
	if (at != NULL)
	{
		if (memchr(authority, ':', at - authority) != NULL)
		{
			GUC_check_errmsg("%s must not contain a password", subject);
			GUC_check_errdetail("Every setting can be read by members of pg_read_all_settings.");
			GUC_check_errhint("Put the password in a file that only the server's OS user can read, "
							  "name it in gatekeeper.smtp_password_file, and set the user name in "
							  "gatekeeper.smtp_user.");
		}
		else
		{
			GUC_check_errmsg("%s must not contain a user name", subject);
			GUC_check_errhint("Set the user name in gatekeeper.smtp_user and the password file in "
							  "gatekeeper.smtp_password_file.");
		}
		return false;
	}

	/*
	 * What the worker cannot use is refused here, at ALTER SYSTEM and at a
	 * reload (which then keeps the value in force and logs why), rather
	 * than accepted and found out by the worker alone: smtp://
	 * or smtps://, a host, an optional port of 1 to 65535, nothing after.
	 */
	if (pg_strncasecmp(url, "smtp://", 7) != 0 && pg_strncasecmp(url, "smtps://", 8) != 0)
	{
		GUC_check_errmsg("%s must begin with smtp:// or smtps://", subject);
		GUC_check_errhint("For example smtp://relay.example.com:587 (STARTTLS when offered) or "
						  "smtps://relay.example.com:465.");
		return false;
	}
	if (*end != '\0' && strcmp(end, "/") != 0)
	{
		GUC_check_errmsg("%s must be smtp://host:port or smtps://host:port, with nothing after the port", subject);
		return false;
	}
	host = authority;
	if (*host == '[')
	{
		hostend = memchr(host, ']', end - host);
		if (hostend == NULL || hostend == host + 1)
		{
			GUC_check_errmsg("%s has an unterminated or empty IPv6 address", subject);
			return false;
		}
		if (hostend + 1 < end)
		{
			if (hostend[1] != ':')
			{
				GUC_check_errmsg("%s does not name a host and port", subject);
				return false;
			}
			port = hostend + 2;
		}
	}
	else
	{
		hostend = memchr(host, ':', end - host);
		if (hostend == NULL)
			hostend = end;
		else
			port = hostend + 1;
		if (hostend == host)
		{
			GUC_check_errmsg("%s does not name a host", subject);
			return false;
		}
		for (p = host; p < hostend; p++)
		{
			if (!(isalnum((unsigned char) *p) || *p == '.' || *p == '-' || *p == '_'))
			{
				GUC_check_errmsg("%s has an invalid host name", subject);
				return false;
			}
		}
	}
	if (port != NULL)
	{
		long		n = 0;

		if (port >= end)
		{
			GUC_check_errmsg("%s has an empty port", subject);
			return false;
		}
		for (p = port; p < end && *p != '/'; p++)
		{
			if (!isdigit((unsigned char) *p) || (n = n * 10 + (*p - '0')) > 65535)
			{
				GUC_check_errmsg("%s has an invalid port", subject);
				GUC_check_errdetail("A port is a number from 1 to 65535.");
				return false;
			}
		}
		if (n == 0)
		{
			GUC_check_errmsg("%s has an invalid port", subject);
			GUC_check_errdetail("A port is a number from 1 to 65535.");
			return false;
		}
	}
	return true;
}

/*
 * gatekeeper.dkim_key_table must name a key table whose every key can be
 * used (src/dkim.c), checked when the value is set and, in the
 * postmaster, at each reload, so that a bad table or key is refused with
 * the reason in the log and the value in force stays.  Other processes
 * check only a value that changes: the files are read again by the
 * workers, which stop delivering when they cannot use them.  At server
 * start every value is taken: a value refused there would leave the
 * setting empty, and the workers would send mail unsigned; they find the
 * fault themselves and deliver nothing instead.
 */
static bool
check_dkim_key_table(char **newval, void **extra, GucSource source)
{
	char		problem[512];

	if (!check_file_setting("gatekeeper.dkim_key_table", *newval, gatekeeper_dkim_key_table))
		return false;
	if (*newval == NULL || (*newval)[0] == '\0')
		return true;
	if (process_shared_preload_libraries_in_progress)
		return true;
	if (IsUnderPostmaster && gatekeeper_dkim_key_table != NULL &&
		strcmp(*newval, gatekeeper_dkim_key_table) == 0)
		return true;
	if (!gatekeeper_dkim_check_table(*newval, problem, sizeof(problem)))
	{
		GUC_check_errdetail("%s", problem);
		return false;
	}
	return true;
}

/*
 * The file settings name a file by its absolute path: the workers and the
 * backends that check a new value resolve a relative one against the data
 * directory, which a restore or a standby built elsewhere moves.  Like
 * check_dkim_key_table, a value is refused only when it changes after the
 * server started (at start the workers find the fault and deliver
 * nothing, rather than work without the file).
 */
static bool
check_file_setting(const char *name, const char *value, const char *current)
{
	if (value == NULL || value[0] == '\0')
		return true;
	if (process_shared_preload_libraries_in_progress)
		return true;
	if (IsUnderPostmaster && current != NULL && strcmp(value, current) == 0)
		return true;
	if (!is_absolute_path(value))
	{
		GUC_check_errmsg("%s must be an absolute path", name);
		GUC_check_errdetail("The path given was \"%s\".", value);
		return false;
	}
	return true;
}

/*
 * gatekeeper.smtp_password_file must name a file the workers can take the
 * relay password from, checked as they check it (src/smtp_client.c): a
 * private file (gatekeeper_read_private_file's rule) of one line of 1 to
 * 1024 bytes.  When the value changes only; the password read here is
 * wiped at once.
 */
static bool
check_smtp_password_file(char **newval, void **extra, GucSource source)
{
	char		problem[512];
	char	   *data = NULL;
	size_t		len = 0;
	bool		ok;

	if (!check_file_setting("gatekeeper.smtp_password_file", *newval,
							gatekeeper_smtp_password_file))
		return false;
	if (*newval == NULL || (*newval)[0] == '\0' || process_shared_preload_libraries_in_progress)
		return true;
	if (IsUnderPostmaster && gatekeeper_smtp_password_file != NULL &&
		strcmp(*newval, gatekeeper_smtp_password_file) == 0)
		return true;
	if (!gatekeeper_read_private_file(*newval, 1024 + 2, &data, &len, "relay password file",
									  problem, sizeof(problem)))
	{
		problem[0] = pg_toupper((unsigned char) problem[0]);
		GUC_check_errmsg("gatekeeper.smtp_password_file cannot be used");
		GUC_check_errdetail("%s.", problem);
		return false;
	}
	if (len > 0 && data[len - 1] == '\n')
		len--;
	if (len > 0 && data[len - 1] == '\r')
		len--;
	ok = len > 0 && len <= 1024 && memchr(data, '\0', len) == NULL &&
		memchr(data, '\r', len) == NULL && memchr(data, '\n', len) == NULL;
	explicit_bzero(data, len);
	pfree(data);
	if (!ok)
	{
		GUC_check_errmsg("gatekeeper.smtp_password_file does not hold a password");
		GUC_check_errdetail("It must hold one line of 1 to 1024 bytes, without NUL.");
		return false;
	}
	return true;
}

/*
 * gatekeeper.smtp_ca_file must name a file the workers can read when the
 * value changes; OpenSSL reads the certificates when a worker connects.
 */
static bool
check_smtp_ca_file(char **newval, void **extra, GucSource source)
{
	int			fd;
	struct stat st;

	if (!check_file_setting("gatekeeper.smtp_ca_file", *newval, gatekeeper_smtp_ca_file))
		return false;
	if (*newval == NULL || (*newval)[0] == '\0' || process_shared_preload_libraries_in_progress)
		return true;
	if (IsUnderPostmaster && gatekeeper_smtp_ca_file != NULL &&
		strcmp(*newval, gatekeeper_smtp_ca_file) == 0)
		return true;
	fd = open(*newval, O_RDONLY | PG_BINARY | O_CLOEXEC, 0);
	if (fd < 0)
	{
		GUC_check_errmsg("gatekeeper.smtp_ca_file cannot be read: %m");
		return false;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
	{
		close(fd);
		GUC_check_errmsg("gatekeeper.smtp_ca_file is not a regular file");
		return false;
	}
	close(fd);
	return true;
}

/*
 * gatekeeper.message_id_domain becomes the right side of every
 * Message-ID the claim makes (<id.time@domain>): a dot-atom of RFC 5322
 * (letters, digits and !#$%&'*+-/=?^_`{|}~, in labels apart by single
 * dots), at most 255 octets, so that no Message-ID is malformed.
 */
static bool
check_message_id_domain(char **newval, void **extra, GucSource source)
{
	const char *v = *newval;
	const char *p;
	bool		dot = true;		/* at the start, or just after a dot */

	if (v == NULL || v[0] == '\0')
		return true;
	if (strlen(v) > 255)
	{
		GUC_check_errmsg("gatekeeper.message_id_domain must be at most 255 octets");
		return false;
	}
	for (p = v; *p; p++)
	{
		if (*p == '.')
		{
			if (dot)
				break;
			dot = true;
		}
		else if (isalnum((unsigned char) *p) || strchr("!#$%&'*+-/=?^_`{|}~", *p) != NULL)
			dot = false;
		else
			break;
	}
	if (*p != '\0' || dot)
	{
		GUC_check_errmsg("gatekeeper.message_id_domain must be a domain such as mail.example.com");
		GUC_check_errdetail("It becomes the right side of every Message-ID: letters, digits and "
							"!#$%%&'*+-/=?^_`{|}~ in labels separated by single dots.");
		return false;
	}
	return true;
}

/*
 * gatekeeper.default_sender is an address or a display name and an
 * address, as a mail's sender is: the envelope and the Message-ID's domain
 * take the bare address, From shows the name.
 */
static bool
check_default_sender(char **newval, void **extra, GucSource source)
{
	const char *problem;
	char	   *name;
	char	   *address;

	(void) extra;
	(void) source;

	if (*newval == NULL || (*newval)[0] == '\0')
		return true;

	problem = gatekeeper_mailbox_problem(*newval, &name, &address);
	if (problem == NULL)
		return true;

	GUC_check_errdetail("%s", problem);
	GUC_check_errhint("Give an address (shop@example.com) or a name and an address (Shop <shop@example.com>).");
	return false;
}

/*
 * gatekeeper.helo_name, when set, is a domain name or an address literal
 * ("[192.0.2.1]"): one word of printable ASCII.
 */
static bool
check_helo_name(char **newval, void **extra, GucSource source)
{
	const char *p;

	(void) extra;
	(void) source;

	if (*newval == NULL || (*newval)[0] == '\0')
		return true;
	if (strlen(*newval) > 255)
	{
		GUC_check_errdetail("gatekeeper.helo_name must be at most 255 characters.");
		return false;
	}
	for (p = *newval; *p; p++)
	{
		if (*p <= ' ' || *p >= 0x7f)
		{
			GUC_check_errdetail("gatekeeper.helo_name must be a domain name or an address literal, without spaces or control characters.");
			return false;
		}
	}
	return true;
}

/*
 * emit_log_hook: when the configuration is reloaded the postmaster logs
 * each changed setting with its new value.  For the relay credentials,
 * log that they changed, not what to; for a relay URL that embeds them
 * (smtp://user:password@host), log it with its user information hidden.
 */
static void
gatekeeper_emit_log(ErrorData *edata)
{
	if (edata->message != NULL &&
		strstr(edata->message, "gatekeeper.smtp_") != NULL)
	{
		if (edata->message_id != NULL &&
			strcmp(edata->message_id, "parameter \"%s\" changed to \"%s\"") == 0 &&
			strstr(edata->message, "\"gatekeeper.smtp_user\"") != NULL)
			edata->message = pstrdup("parameter \"gatekeeper.smtp_user\" changed");
		else if (strstr(edata->message, "gatekeeper.smtp_url") != NULL)
		{
			edata->message = hide_userinfo(edata->message);

			/* the statement that set it may hold what was refused */
			if (edata->elevel >= ERROR)
				edata->hide_stmt = true;
		}
	}

	if (prev_emit_log_hook)
		prev_emit_log_hook(edata);
}

/*
 * A copy of text with the user information of every URL in it ("user:pw@"
 * after "://") replaced by "***@".
 */
static char *
hide_userinfo(const char *text)
{
	StringInfoData buf;
	const char *p = text;
	const char *scheme;

	initStringInfo(&buf);
	while ((scheme = strstr(p, "://")) != NULL)
	{
		const char *authority = scheme + 3;
		const char *at = NULL;
		const char *q;

		for (q = authority; *q && *q != '/' && *q != '?' && *q != '#' &&
			 *q != '"' && *q != ' '; q++)
		{
			if (*q == '@')
				at = q;
		}
		appendBinaryStringInfo(&buf, p, authority - p);
		if (at != NULL)
		{
			appendStringInfoString(&buf, "***");
			p = at;
		}
		else
			p = authority;
	}
	appendStringInfoString(&buf, p);
	return buf.data;
}

/*
 * Register gatekeeper.workers static background workers.  A worker that
 * exits with an error is restarted after bgw_restart_time, never at once,
 * so an error that repeats does not spin.
 */
static void
gatekeeper_register_workers(void)
{
	BackgroundWorker worker;
	int			i;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS |
		BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 10;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "gatekeeper");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "gatekeeper_worker_main");
	snprintf(worker.bgw_type, BGW_MAXLEN, "gatekeeper worker");
	worker.bgw_notify_pid = 0;

	for (i = 0; i < gatekeeper_workers; i++)
	{
		snprintf(worker.bgw_name, BGW_MAXLEN, "gatekeeper worker %d", i + 1);
		worker.bgw_main_arg = Int32GetDatum(i);
		RegisterBackgroundWorker(&worker);
	}
}

/*
 * Bytes of shared memory: a header and one slot per worker.
 */
static Size
gatekeeper_shmem_size(void)
{
	return add_size(offsetof(GatekeeperShared, slots),
					mul_size(sizeof(GatekeeperSlot), gatekeeper_workers));
}

/*
 * shmem_request_hook: ask for the shared state.
 */
static void
gatekeeper_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();

	RequestAddinShmemSpace(gatekeeper_shmem_size());
	RequestAddinShmemSpace(gatekeeper_gate_shmem_size());
	RequestAddinShmemSpace(gatekeeper_due_floor_shmem_size());
	gatekeeper_stats_shmem_request();
}

/*
 * shmem_startup_hook: create or attach to the shared state.  It is created
 * again, empty, whenever the postmaster reinitializes shared memory after a
 * crash.
 */
static void
gatekeeper_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	gatekeeper_shared = ShmemInitStruct("gatekeeper",
										gatekeeper_shmem_size(),
										&found);
	if (!found)
	{
		int			i;

		SpinLockInit(&gatekeeper_shared->mutex);
		pg_atomic_init_u64(&gatekeeper_shared->announce_due, (uint64) DT_NOEND);

		/*
		 * Random, not the start time: a crash-restart initializes shared
		 * memory again under the same postmaster start time, and a
		 * primary and its standbys share the system identifier.
		 */
		if (!pg_strong_random(&gatekeeper_shared->incarnation,
							  sizeof(gatekeeper_shared->incarnation)))
			gatekeeper_shared->incarnation = (uint64) GetCurrentTimestamp() ^
				((uint64) MyProcPid << 32);
		gatekeeper_shared->nslots = gatekeeper_workers;
		for (i = 0; i < gatekeeper_workers; i++)
		{
			GatekeeperSlot *slot = &gatekeeper_shared->slots[i];

			slot->pid = 0;
			slot->pgprocno = INVALID_PGPROCNO;
			slot->database = InvalidOid;
			slot->connecting = false;
			memset(&slot->status, 0, sizeof(slot->status));
			pg_atomic_init_u32(&slot->wake, 0);
		}
	}
	gatekeeper_gate_shmem_init();
	gatekeeper_due_floor_shmem_init();
	gatekeeper_stats_shmem_init();
	LWLockRelease(AddinShmemInitLock);
}

/*
 * Wake the workers when the current transaction commits.  Called for every
 * row of mail written that is due now (or within a nap), so it does nothing
 * but set a flag once it has been called in a transaction.  A no-op when
 * the library was not preloaded: then there are no workers to wake.
 */
void
gatekeeper_wake_at_commit(void)
{
	if (wake_pending || gatekeeper_shared == NULL)
		return;

	gatekeeper_register_xact_callback();
	wake_pending = true;
}

/*
 * Register the transaction callback, once per backend.
 */
static void
gatekeeper_register_xact_callback(void)
{
	if (!xact_callback_registered)
	{
		RegisterXactCallback(gatekeeper_xact_callback, NULL);
		xact_callback_registered = true;
	}
}

/*
 * NOTIFY gatekeeper, '<queue>' at commit.  PostgreSQL folds the same
 * notification made twice in a transaction into one (commands/async.c), so
 * callers need not remember whom they announced.
 */
void
gatekeeper_notify_queue(const char *queue)
{
	Async_Notify(GATEKEEPER_CHANNEL, queue);
}

/*
 * Have the first background worker announce mail of a notify queue that is
 * due at "due", later than now: if this transaction commits, the earliest
 * such time goes to shared memory and the worker is woken to look.  Called
 * for every such row, so it does little.  A no-op without preloading: then
 * there is no worker.
 */
void
gatekeeper_announce_later(TimestampTz due)
{
	if (gatekeeper_shared == NULL)
		return;
	if (announce_pending == DT_NOEND)
		gatekeeper_register_xact_callback();
	if (due < announce_pending)
		announce_pending = due;
}

/*
 * For the first worker: the earliest due time posted since it last asked,
 * or DT_NOEND; asking consumes it.
 */
TimestampTz
gatekeeper_announce_posted(void)
{
	if (gatekeeper_shared == NULL)
		return DT_NOEND;
	return (TimestampTz) pg_atomic_exchange_u64(&gatekeeper_shared->announce_due,
												(uint64) DT_NOEND);
}

/*
 * gatekeeper._announce(queue, due): announce a notify queue's mail made due
 * at "due" by a function (unclaim, reap, nack): at commit when it is due by
 * now, else by the worker when it comes due.
 */
Datum
gatekeeper_announce(PG_FUNCTION_ARGS)
{
	char	   *queue = text_to_cstring(PG_GETARG_TEXT_PP(0));
	TimestampTz due = PG_GETARG_TIMESTAMPTZ(1);

	if (due <= GetCurrentTimestamp())
		gatekeeper_notify_queue(queue);
	else
		gatekeeper_announce_later(due);
	PG_RETURN_VOID();
}

/*
 * gatekeeper._wake(): SQL access to gatekeeper_wake_at_commit(), for SQL
 * functions that make mail due (resume, for one).
 */
Datum
gatekeeper_wake(PG_FUNCTION_ARGS)
{
	(void) fcinfo;

	gatekeeper_wake_at_commit();
	PG_RETURN_VOID();
}

/*
 * gatekeeper._retry_delay(): gatekeeper.retry_delay as an interval, for
 * nack's backoff.  Read here rather than with current_setting(), which
 * in a session that has not loaded the library yet returns a placeholder's
 * bare text: '30000' means 30000 ms to this setting, 30000 s to ::interval.
 * Calling this loads the library, which defines the setting.
 */
Datum
gatekeeper_retry_delay_interval(PG_FUNCTION_ARGS)
{
	Interval   *result = palloc0(sizeof(Interval));

	result->time = (int64) gatekeeper_retry_delay * INT64CONST(1000);
	PG_RETURN_INTERVAL_P(result);
}

/*
 * At commit, wake the workers if this transaction wrote due mail; at abort
 * or PREPARE TRANSACTION forget it (a prepared transaction's mail is found
 * by the next pass).
 */
static void
gatekeeper_xact_callback(XactEvent event, void *arg)
{
	TimestampTz announce = announce_pending;

	(void) arg;

	if (!wake_pending && announce == DT_NOEND)
		return;

	switch (event)
	{
		case XACT_EVENT_COMMIT:
			announce_pending = DT_NOEND;
			if (announce != DT_NOEND)
				gatekeeper_post_announcement(announce);
			if (wake_pending)
			{
				wake_pending = false;
				gatekeeper_wake_workers();
			}
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			wake_pending = false;
			announce_pending = DT_NOEND;
			break;
		default:
			break;
	}
}

/*
 * Set the wake flag and the latch of every worker connected to this
 * database, except this process.  Runs after the commit is visible, so a
 * worker that wakes sees the mail.  Must not fail.
 */
static void
gatekeeper_wake_workers(void)
{
	int			i;

	for (i = 0; i < gatekeeper_shared->nslots; i++)
	{
		GatekeeperSlot *slot = &gatekeeper_shared->slots[i];
		pid_t		pid;
		int			pgprocno;
		Oid			database;

		SpinLockAcquire(&gatekeeper_shared->mutex);
		pid = slot->pid;
		pgprocno = slot->pgprocno;
		database = slot->database;
		SpinLockRelease(&gatekeeper_shared->mutex);

		if (pid == 0 || pid == MyProcPid || database != MyDatabaseId)
			continue;

		/*
		 * The worker may exit, and its PGPROC be reused, right after we read
		 * its slot: then another process gets a spurious wakeup, which every
		 * latch user tolerates.
		 */
		pg_atomic_write_u32(&slot->wake, 1);
		SetLatch(&GetPGProcByNumber(pgprocno)->procLatch);
	}
}

/*
 * Post a due time to announce (the minimum of what is posted wins) and wake
 * the first worker, which announces, when it serves this database (while
 * it is not running, it looks at everything when it starts).  Runs after
 * the commit is visible, so the worker that looks sees the mail.  Must not
 * fail.
 */
static void
gatekeeper_post_announcement(TimestampTz due)
{
	GatekeeperSlot *slot;
	uint64		old;
	pid_t		pid;
	int			pgprocno;
	Oid			database;

	if (gatekeeper_shared->nslots == 0)
		return;
	slot = &gatekeeper_shared->slots[0];
	SpinLockAcquire(&gatekeeper_shared->mutex);
	pid = slot->pid;
	pgprocno = slot->pgprocno;
	database = slot->database;
	SpinLockRelease(&gatekeeper_shared->mutex);
	if (pid == 0 || database != MyDatabaseId)
		return;

	old = pg_atomic_read_u64(&gatekeeper_shared->announce_due);
	while ((TimestampTz) old > due &&
		   !pg_atomic_compare_exchange_u64(&gatekeeper_shared->announce_due, &old, (uint64) due))
		;
	SetLatch(&GetPGProcByNumber(pgprocno)->procLatch);
}

/*
 * The slot of worker slotno; a can't-happen error when there is none.
 */
static GatekeeperSlot *
gatekeeper_slot(int slotno)
{
	if (gatekeeper_shared == NULL ||
		slotno < 0 || slotno >= gatekeeper_shared->nslots)
		elog(FATAL, "gatekeeper worker slot %d does not exist", slotno);

	return &gatekeeper_shared->slots[slotno];
}

/*
 * Mark whether worker slotno is trying to connect to its database, and
 * return what the mark was.  A worker that finds it already set knows its
 * predecessor failed to connect (the database does not exist, say).
 */
bool
gatekeeper_slot_connecting(int slotno, bool connecting)
{
	GatekeeperSlot *slot = gatekeeper_slot(slotno);
	bool		was;

	SpinLockAcquire(&gatekeeper_shared->mutex);
	was = slot->connecting;
	slot->connecting = connecting;
	SpinLockRelease(&gatekeeper_shared->mutex);

	return was;
}

/*
 * Publish this connected worker in slot slotno so that commits of due mail
 * wake it; it is withdrawn when the process exits.
 */
void
gatekeeper_slot_attach(int slotno)
{
	GatekeeperSlot *slot = gatekeeper_slot(slotno);

	SpinLockAcquire(&gatekeeper_shared->mutex);
	slot->pid = MyProcPid;
	slot->pgprocno = MyProc->pgprocno;
	slot->database = MyDatabaseId;
	slot->connecting = false;
	memset(&slot->status, 0, sizeof(slot->status));
	SpinLockRelease(&gatekeeper_shared->mutex);

	before_shmem_exit(gatekeeper_slot_detach, Int32GetDatum(slotno));
}

/*
 * before_shmem_exit callback: withdraw this worker from its slot.
 */
static void
gatekeeper_slot_detach(int code, Datum arg)
{
	GatekeeperSlot *slot = gatekeeper_slot(DatumGetInt32(arg));

	(void) code;

	SpinLockAcquire(&gatekeeper_shared->mutex);
	if (slot->pid == MyProcPid)
	{
		slot->pid = 0;
		slot->pgprocno = INVALID_PGPROCNO;
		slot->database = InvalidOid;
	}
	SpinLockRelease(&gatekeeper_shared->mutex);
}

/*
 * Whether due mail was committed for worker slotno since it last consumed
 * the flag; consume clears it.
 */
bool
gatekeeper_slot_woken(int slotno, bool consume)
{
	GatekeeperSlot *slot = gatekeeper_slot(slotno);

	if (consume)
		return pg_atomic_exchange_u32(&slot->wake, 0) != 0;
	return pg_atomic_read_u32(&slot->wake) != 0;
}

/*
 * gatekeeper_plan
 *		The statement kept in *plan, prepared on first use for the life of
 *		the backend, with a generic plan: the statements of the claim and
 *		the gates are written to plan well without knowing their
 *		parameters, and planning them once matters on paths that run
 *		thousands of times a second.  Each is a file-level static named for
 *		its statement, its SQL text a static const char beside it.  A kept
 *		plan outlives DROP EXTENSION: the plan cache re-plans it by name
 *		when the objects it used change.
 */
SPIPlanPtr
gatekeeper_plan(SPIPlanPtr *plan, const char *sql, int nargs, Oid *argtypes)
{
	SPIPlanPtr	p;

	if (*plan != NULL)
		return *plan;
	p = SPI_prepare_cursor(sql, nargs, argtypes, CURSOR_OPT_GENERIC_PLAN);
	if (p == NULL)
		elog(ERROR, "SPI_prepare failed for \"%s\": %s", sql,
			 SPI_result_code_string(SPI_result));
	SPI_keepplan(p);
	*plan = p;
	return p;
}

/* statements of gatekeeper_execute_by_key running now (nested: >1) */
static int	own_statements = 0;

/* every statement this process plans is gatekeeper's own (the worker) */
static bool own_session = false;

/*
 * gatekeeper_planner
 *		The planner hook, where gatekeeper's one planner policy lives.
 *
 * gatekeeper steers the planner in one way only: at plan time, for its own
 * statements, here.  No planner setting is changed while a statement runs
 * or for a session, and no C function carries a SET clause.  Planning is
 * where the settings act (JIT included: the planner decides whether a plan
 * is compiled), and a kept plan that an invalidation made stale is planned
 * again inside the statement's execution, through this hook, under the
 * same policy; a statement already planned pays nothing for it.
 *
 * - A statement run by key (gatekeeper_execute_by_key: the claim, the
 *   acks, the suppression lookup), with whatever its triggers plan, is
 *   planned with sequential scans, hash and merge joins and index-only
 *   scans off, and without JIT.  These statements are planned once,
 *   generically, and the first planning happens on a fresh install (or
 *   after a table was emptied), when the tables are nearly empty: the
 *   planner then rightly prefers a sequential scan or a hash join, and that
 *   plan would stay cached while the table grows to millions of rows, until
 *   an ANALYZE invalidates it; they are written as key lookups and get
 *   them.  Index-only scans are off because one keeps its leaf page pinned
 *   until the statement ends, which held VACUUM off mail_due's first leaf
 *   page under a few claimers (src/claim.c, claim_fairly).  A statement
 *   touching one batch by index never repays compiling it.
 * - The background worker runs nothing but gatekeeper's statements, each
 *   touching a batch at most: every one it plans is planned without JIT.
 * - SQL-language functions are planned by PostgreSQL's SQL and PL/pgSQL
 *   executors on their own calls: the two that must keep to mail_live's
 *   indexes whatever its statistics say (_live_stats and _live_due, read
 *   by queue_stats) carry the same settings as SET clauses, PostgreSQL's
 *   way of giving a function settings.
 *
 * Nothing else in gatekeeper sets a planner setting; every kept plan is
 * prepared generic by gatekeeper_plan.
 */
static PlannedStmt *
gatekeeper_planner(Query *parse, const char *query_string, int cursorOptions,
				   ParamListInfo boundParams)
{
	PlannedStmt *result;
	int			nestlevel = -1;

	if (own_statements > 0 || own_session)
	{
		nestlevel = NewGUCNestLevel();
		(void) set_config_option("jit", "off", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
	}
	if (own_statements > 0)
	{
		(void) set_config_option("enable_seqscan", "off", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
		(void) set_config_option("enable_hashjoin", "off", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
		(void) set_config_option("enable_mergejoin", "off", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
		(void) set_config_option("enable_indexonlyscan", "off", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
	}

	if (prev_planner_hook)
		result = prev_planner_hook(parse, query_string, cursorOptions, boundParams);
	else
		result = standard_planner(parse, query_string, cursorOptions, boundParams);

	/* an error unwinds the nest level with its (sub)transaction */
	if (nestlevel >= 0)
		AtEOXact_GUC(true, nestlevel);
	return result;
}

/*
 * gatekeeper_own_session
 *		Make every statement this process plans from now on gatekeeper's own,
 *		planned without JIT (see gatekeeper_planner): for the background
 *		worker, which runs nothing else.
 */
void
gatekeeper_own_session(void)
{
	own_session = true;
}

/*
 * gatekeeper_execute_by_key
 *		SPI_execute_plan for a statement that finds its rows by key (the
 *		primary key of gatekeeper.mail or gatekeeper.gate_pass), planned so
 *		that it always does (see gatekeeper_planner).
 */
int
gatekeeper_execute_by_key(SPIPlanPtr plan, Datum *values, const char *nulls,
						  bool read_only, long count)
{
	return gatekeeper_execute_by_key_into(plan, values, nulls, read_only, count, NULL);
}

/*
 * gatekeeper_execute_by_key_into
 *		The same, sending the rows the statement returns to dest (NULL:
 *		to SPI_tuptable, as SPI_execute_plan does).
 *
 * A receiver of its own lets a caller that copies the rows out anyway
 * take them from the executor's slots, without SPI forming each into a
 * tuple first (for a claim, a copy of every mail's content).
 */
int
gatekeeper_execute_by_key_into(SPIPlanPtr plan, Datum *values, const char *nulls,
							   bool read_only, long count, DestReceiver *dest)
{
	int			nargs = SPI_getargcount(plan);
	SPIExecuteOptions options;
	ParamListInfo params = NULL;
	int			ret;
	int			i;

	if (nargs > 0)
	{
		params = makeParamList(nargs);
		for (i = 0; i < nargs; i++)
		{
			ParamExternData *prm = &params->params[i];

			prm->value = values[i];
			prm->isnull = nulls != NULL && nulls[i] == 'n';
			prm->pflags = PARAM_FLAG_CONST;
			prm->ptype = SPI_getargtypeid(plan, i);
		}
	}
	memset(&options, 0, sizeof(options));
	options.params = params;
	options.read_only = read_only;
	options.tcount = count;
	options.dest = dest;

	own_statements++;
	PG_TRY();
	{
		ret = SPI_execute_plan_extended(plan, &options);
	}
	PG_FINALLY();
	{
		own_statements--;
	}
	PG_END_TRY();
	return ret;
}

/*
 * gatekeeper_writer
 *		Who writes the statement running now: gatekeeper's own code, a dump
 *		being loaded, or an application (or the owner, by hand).  The one way
 *		gatekeeper tells them apart, in C and, through _own_statement(), in
 *		its triggers' WHEN clauses.
 *
 * A dump being loaded comes first.  pg_dump --load-via-partition-root
 * loads the mail through gatekeeper.mail, where the insert trigger would
 * validate each row and give it a live row; but the queues' rows load
 * after the mail's, and the mail's own live rows and outcomes after that:
 * every mail of a queue but the default one would be refused, or made
 * live a second time.  A dump's loading is told by check_function_bodies
 * being off (pg_dump's scripts and pg_restore turn it off, for the same
 * reason: what is loaded was checked when it was made, and may refer to
 * what comes later) in a statement run by a role that may insert into
 * mail_live itself (as the role loading a dump of gatekeeper's tables
 * must; an application's role may not, and its rows are checked whatever
 * it sets), as the statement the client sent (COPY, or INSERT for a dump
 * made with --inserts): a call of enqueue() or anything else in a session
 * left so after loading a dump is mail as usual.  Its rows load as a dump
 * into the partitions does: unchecked (src/mail.c), uncounted
 * (src/stats.c), made live by the dump's own mail_live rows, which the
 * restore triggers merge with what is there.
 *
 * Otherwise gatekeeper writes when its C code runs the statement
 * (gatekeeper_execute_by_key) or when the statement runs inside a trigger
 * (gatekeeper's tables fire only gatekeeper's triggers: the insert trigger
 * of gatekeeper.mail writing live rows and keys, _mail_sync moving them):
 * those statements keep the live rows, keys and outcomes in step
 * themselves, so the restore triggers (mail_live_restore, mail_key_restore,
 * mail_done_restore) are not for them.  Every ack and every claim that
 * finishes mail is such a statement: mail_done_restore's DELETE, probing
 * mail_live for every outcome, cost about 4% of the drain.  In C a trigger
 * function asks about the statement that fired it only whether it is a
 * dump, which does not depend on the depth it asks from.
 */
GatekeeperWriter
gatekeeper_writer(void)
{
	if (!check_function_bodies && ActivePortal != NULL &&
		(ActivePortal->commandTag == CMDTAG_COPY ||
		 ActivePortal->commandTag == CMDTAG_INSERT))
	{
		Oid			nsp = get_namespace_oid("gatekeeper", true);
		Oid			live = OidIsValid(nsp) ? get_relname_relid("mail_live", nsp) : InvalidOid;

		if (OidIsValid(live) &&
			pg_class_aclcheck(live, GetOuterUserId(), ACL_INSERT) == ACLCHECK_OK)
			return GATEKEEPER_WRITER_DUMP;
	}
	if (own_statements > 0)
		return GATEKEEPER_WRITER_OWN;
	{
		LOCAL_FCINFO(depth_fcinfo, 0);

		InitFunctionCallInfoData(*depth_fcinfo, NULL, 0, InvalidOid, NULL, NULL);
		if (DatumGetInt32(pg_trigger_depth(depth_fcinfo)) > 0)
			return GATEKEEPER_WRITER_OWN;
	}
	return GATEKEEPER_WRITER_APPLICATION;
}

/*
 * gatekeeper_own_statement
 *		_own_statement(): whether gatekeeper writes the statement running now
 *		(gatekeeper_writer), for the WHEN clauses of the restore triggers,
 *		which ask it at the statement's own trigger depth.  Not settable
 *		from SQL.
 */
Datum
gatekeeper_own_statement(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(gatekeeper_writer() == GATEKEEPER_WRITER_OWN);
}

/*
 * The version of gatekeeper's SQL objects in this database, as the library
 * sees it.  The library serves one version of the schema, its own
 * (GATEKEEPER_VERSION, the control file's default_version, given by the
 * Makefile): in a database whose extension is older, every entry point
 * that reads or writes the extension's tables refuses with 0A000 and the
 * background worker waits, until ALTER EXTENSION gatekeeper UPDATE.  The
 * update scripts, 0.1.0's included, run with this library loaded and call
 * none of those entry points before their objects are the new version's
 * (PostgreSQL sets extversion to the target before it runs a step's
 * script).
 *
 * The version is pg_extension.extversion, read by name through its index.
 * pg_extension has no system cache, so nothing invalidates a copy: it is
 * kept for the current command of the current transaction, and read again
 * once any invalidation message arrived (another backend's committed
 * ALTER EXTENSION, whose script changes pg_proc and pg_class, sends them).
 * A transaction's own ALTER EXTENSION ends its command.
 */
static struct
{
	LocalTransactionId lxid;
	CommandId	cid;
	uint64		inval;
	GatekeeperSchema schema;
	char		version[NAMEDATALEN];
}			schema_seen;

/*
 * gatekeeper_schema
 *		Whether this database has the extension, at the library's version or
 *		another.  *version, when asked, is set to the extension's version
 *		("" without the extension); it is valid until the next call.
 */
GatekeeperSchema
gatekeeper_schema(const char **version)
{
	CommandId	cid = GetCurrentCommandId(false);

	if (schema_seen.lxid != MyProc->lxid || schema_seen.cid != cid ||
		schema_seen.inval != SharedInvalidMessageCounter)
	{
		Relation	rel;
		ScanKeyData key;
		SysScanDesc scan;
		HeapTuple	tuple;

		rel = table_open(ExtensionRelationId, AccessShareLock);
		ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber,
					F_NAMEEQ, CStringGetDatum("gatekeeper"));
		scan = systable_beginscan(rel, ExtensionNameIndexId, true, NULL, 1, &key);
		tuple = systable_getnext(scan);
		schema_seen.version[0] = '\0';
		schema_seen.schema = GATEKEEPER_SCHEMA_MISSING;
		if (HeapTupleIsValid(tuple))
		{
			bool		isnull;
			Datum		d = heap_getattr(tuple, Anum_pg_extension_extversion,
										 RelationGetDescr(rel), &isnull);

			if (!isnull)
				text_to_cstring_buffer(DatumGetTextPP(d), schema_seen.version,
									   sizeof(schema_seen.version));
			schema_seen.schema = strcmp(schema_seen.version, GATEKEEPER_VERSION) == 0 ?
				GATEKEEPER_SCHEMA_CURRENT : GATEKEEPER_SCHEMA_OTHER;
		}
		systable_endscan(scan);
		table_close(rel, AccessShareLock);
		/* after the lock: the messages it took in are reflected in the read */
		schema_seen.lxid = MyProc->lxid;
		schema_seen.cid = cid;
		schema_seen.inval = SharedInvalidMessageCounter;
	}
	if (version != NULL)
		*version = schema_seen.version;
	return schema_seen.schema;
}

/*
 * gatekeeper_report_schema
 *		Say at elevel that this database's extension is not the library's
 *		version (the worker's LOG, a function's ERROR: the same message).
 */
void
gatekeeper_report_schema(int elevel, const char *version)
{
	ereport(elevel,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("extension gatekeeper in database \"%s\" is version %s, but its library serves %s",
					get_database_name(MyDatabaseId), version, GATEKEEPER_VERSION),
			 elevel >= ERROR ?
			 errdetail("The library no longer has the code of version %s's functions.", version) :
			 errdetail("The gatekeeper worker delivers no mail in this database until then."),
			 errhint("Run ALTER EXTENSION gatekeeper UPDATE.")));
}

/*
 * gatekeeper_require_schema
 *		Refuse (0A000) unless this database's extension is the library's
 *		version: the first call of every SQL entry point that reads or
 *		writes the extension's tables.
 */
void
gatekeeper_require_schema(void)
{
	const char *version;

	if (gatekeeper_schema(&version) == GATEKEEPER_SCHEMA_OTHER)
		gatekeeper_report_schema(ERROR, version);
}

/*
 * gatekeeper_array
 *		A one-dimensional array of n elements of a built-in type, for an SPI
 *		argument.  nulls may be NULL when no element is null.
 */
Datum
gatekeeper_array(Datum *elems, bool *nulls, int n, Oid elemtype)
{
	int16		typlen;
	bool		typbyval;
	char		typalign;
	int			dims[1];
	int			lbs[1] = {1};

	if (n == 0)
		return PointerGetDatum(construct_empty_array(elemtype));
	get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
	dims[0] = n;
	return PointerGetDatum(construct_md_array(elems, nulls, 1, dims, lbs,
											  elemtype, typlen, typbyval, typalign));
}

/*
 * gatekeeper_slot_report
 *		Publish worker slotno's status for gatekeeper.worker_status.
 */
void
gatekeeper_slot_report(int slotno, const GatekeeperWorkerStatus *status)
{
	GatekeeperSlot *slot = gatekeeper_slot(slotno);

	SpinLockAcquire(&gatekeeper_shared->mutex);
	slot->status = *status;
	SpinLockRelease(&gatekeeper_shared->mutex);
}

/*
 * gatekeeper._worker_status(): one row per connected worker and relay of
 * gatekeeper.smtp_url (one row, relay_url NULL, for a worker without a
 * relay), from shared memory (nothing is read from tables, so it answers
 * at once).  No rows when the library was not preloaded.
 */
Datum
gatekeeper_worker_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	GatekeeperWorkerStatus *st = palloc(sizeof(GatekeeperWorkerStatus));
	int			i;

	gatekeeper_require_schema();
	InitMaterializedSRF(fcinfo, 0);
	if (gatekeeper_shared == NULL)
		return (Datum) 0;

	for (i = 0; i < gatekeeper_shared->nslots; i++)
	{
		GatekeeperSlot *slot = &gatekeeper_shared->slots[i];
		pid_t		pid;
		int			r;

		SpinLockAcquire(&gatekeeper_shared->mutex);
		pid = slot->pid;
		*st = slot->status;
		SpinLockRelease(&gatekeeper_shared->mutex);
		if (pid == 0 || st->started == 0)
			continue;

		for (r = 0; r < Max(st->nrelays, 1); r++)
		{
			static const GatekeeperRelayStatus none = {.breaker = "closed"};
			const GatekeeperRelayStatus *rs = r < st->nrelays ? &st->relays[r] : &none;
			Datum		values[15];
			bool		nulls[15];

			memset(nulls, 0, sizeof(nulls));
			values[0] = Int32GetDatum((int32) pid);
			values[1] = TimestampTzGetDatum(st->started);
			values[2] = CStringGetTextDatum(st->state);
			values[3] = Int32GetDatum(st->in_flight);
			values[4] = Int32GetDatum(rs->connections);
			values[5] = CStringGetTextDatum(rs->breaker);
			values[6] = TimestampTzGetDatum(rs->last_success);
			nulls[6] = rs->last_success == 0;
			values[7] = CStringGetTextDatum(rs->last_error);
			nulls[7] = rs->last_error[0] == '\0';
			values[8] = TimestampTzGetDatum(rs->last_error_at);
			nulls[8] = rs->last_error_at == 0;
			values[9] = Int64GetDatum(rs->sent_total);
			values[10] = Int64GetDatum(st->unsigned_total);
			values[11] = Int64GetDatum(rs->deferred_total);
			values[12] = Int64GetDatum(rs->failed_total);
			values[13] = Int32GetDatum(i + 1);
			values[14] = CStringGetTextDatum(rs->url);
			nulls[14] = r >= st->nrelays;
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		}
	}
	pfree(st);
	return (Datum) 0;
}

/*
 * gatekeeper._delivery_latency(): one row per connected worker, from
 * shared memory: the upper bounds of the latency buckets in seconds, the
 * mails the relay accepted within each (cumulative, as Prometheus counts
 * a histogram's buckets), all of them, and the sum of their latencies in
 * seconds.  Since the worker started, like its sent_total.
 */
Datum
gatekeeper_delivery_latency(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum		bounds[GATEKEEPER_LATENCY_BUCKETS];
	int			i;
	int			b;

	InitMaterializedSRF(fcinfo, 0);
	if (gatekeeper_shared == NULL)
		return (Datum) 0;
	for (b = 0; b < GATEKEEPER_LATENCY_BUCKETS; b++)
		bounds[b] = Float8GetDatum(gatekeeper_latency_bounds[b]);

	for (i = 0; i < gatekeeper_shared->nslots; i++)
	{
		GatekeeperSlot *slot = &gatekeeper_shared->slots[i];
		GatekeeperWorkerStatus st;
		pid_t		pid;
		Datum		counts[GATEKEEPER_LATENCY_BUCKETS];
		int64		total = 0;
		Datum		values[5];
		bool		nulls[5] = {false, false, false, false, false};

		SpinLockAcquire(&gatekeeper_shared->mutex);
		pid = slot->pid;
		st = slot->status;
		SpinLockRelease(&gatekeeper_shared->mutex);
		if (pid == 0 || st.started == 0)
			continue;

		for (b = 0; b < GATEKEEPER_LATENCY_BUCKETS; b++)
		{
			total += st.latency_buckets[b];
			counts[b] = Int64GetDatum(total);
		}
		total += st.latency_buckets[GATEKEEPER_LATENCY_BUCKETS];
		values[0] = Int32GetDatum(i + 1);
		values[1] = gatekeeper_array(bounds, NULL, GATEKEEPER_LATENCY_BUCKETS, FLOAT8OID);
		values[2] = gatekeeper_array(counts, NULL, GATEKEEPER_LATENCY_BUCKETS, INT8OID);
		values[3] = Int64GetDatum(total);
		values[4] = Float8GetDatum(st.latency_sum);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/*
 * gatekeeper_incarnation
 *		This server's incarnation as text (16 hex digits), or NULL when the
 *		library was not preloaded (then no background worker claims).
 */
const char *
gatekeeper_incarnation(void)
{
	static char text[17];

	if (gatekeeper_shared == NULL)
		return NULL;
	if (text[0] == '\0')
		snprintf(text, sizeof(text), "%016llx",
				 (unsigned long long) gatekeeper_shared->incarnation);
	return text;
}

/*
 * gatekeeper._incarnation() RETURNS text
 *		gatekeeper_incarnation() for SQL: reap() takes back the claims of
 *		background workers of any other incarnation.
 */
Datum
gatekeeper_incarnation_sql(PG_FUNCTION_ARGS)
{
	const char *incarnation = gatekeeper_incarnation();

	if (incarnation == NULL)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text(incarnation));
}
