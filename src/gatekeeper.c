/*-------------------------------------------------------------------------
 *
 * gatekeeper.c
 *		Module initialization and settings.
 *
 * _PG_init defines the gatekeeper.* settings and registers the one
 * transaction callback (src/xact.c).  When the library is loaded through
 * shared_preload_libraries it also asks for the modules' shared memory
 * (the workers' slots, src/worker_slots.c; the gates, src/gate_store.c;
 * the due floors, src/due_floor.c; the totals, src/mail/count_totals.c)
 * and registers
 * gatekeeper.workers background workers (src/worker.c).  When it is loaded
 * on demand (CREATE EXTENSION, or the first call of one of its functions)
 * it defines the reloadable settings only, and everything that touches
 * shared memory quietly does nothing.
 *
 * The settings are defined here, each with its check hook, and so are the
 * settings other modules show (gatekeeper.on_duplicate and
 * gatekeeper.current_segment, whose values src/mail/mail.c keeps).  Their
 * variables live in src/settings.c, below every module: the check hooks
 * here call into the modules whose rules they apply (the relay URL's
 * reader, the key table's, the address parser), and the modules read the
 * variables, so nothing calls back into this file.
 *
 * IDENTIFICATION
 *		src/gatekeeper.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "gatekeeper.h"
#include "address.h"
#include "catalog.h"
#include "dkim.h"
#include "due_floor.h"
#include "gate_store.h"
#include "mail/mail_store.h"
#include "smtp_config.h"
#include "worker_slots.h"
#include "xact.h"

#include <ctype.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "access/xact.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "postmaster/postmaster.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/guc.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

PG_MODULE_MAGIC;

/*
 * gatekeeper.lease as set.  A real, not an int: an integer setting in
 * milliseconds overflows on '30d' and PostgreSQL then answers "Value
 * exceeds integer range" instead of naming the 7-day bound; a real takes
 * any duration to the range check.  gatekeeper_lease is its whole value.
 */
static double lease_setting = 5 * 60 * 1000;

static const struct config_enum_entry on_duplicate_options[] = {
	{"error", GATEKEEPER_ON_DUPLICATE_ERROR, false},
	{"skip", GATEKEEPER_ON_DUPLICATE_SKIP, false},
	{NULL, 0, false}
};

/* gatekeeper.current_segment stores nothing: show_current_segment reads it */
static int	current_segment_setting = 0;

static emit_log_hook_type prev_emit_log_hook = NULL;
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

void		_PG_init(void);

PG_FUNCTION_INFO_V1(gatekeeper_retry_delay_interval);

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
static const char *show_current_segment(void);
static void gatekeeper_define_settings(void);
static void define_mail_settings(void);
static void define_worker_settings(void);
static void define_relay_settings(void);
static void define_message_settings(void);
static char *hide_userinfo(const char *text);
static void gatekeeper_emit_log(ErrorData *edata);
static void gatekeeper_shmem_request(void);
static void gatekeeper_shmem_startup(void);
static void gatekeeper_register_workers(void);

/*
 * Module load: define the settings; when preloaded, also request shared
 * memory and register the workers.
 */
void
_PG_init(void)
{
	gatekeeper_define_settings();
	gatekeeper_xact_init();

	/*
	 * Changed and refused settings are logged: keep the relay credentials
	 * out, in every process that checks the settings.
	 */
	prev_emit_log_hook = emit_log_hook;
	emit_log_hook = gatekeeper_emit_log;

	/* the planner policy, in every process: see gatekeeper_planner */
	gatekeeper_planner_init();

	/*
	 * COPY into gatekeeper.mail, batched (src/mail/mail_copy.c); no
	 * RETURNING of rows on_duplicate = 'skip' takes out (src/mail/mail.c)
	 */
	mail_store_init();

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
	mail_store_count_init();

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
 * gatekeeper.current_segment as shown: the segment this transaction's new
 * mail goes to, 0 outside a transaction or without the extension.
 */
static const char *
show_current_segment(void)
{
	static const char *const names[] = {"0", "1", "2", "3"};

	if (!IsTransactionState())
		return names[0];
	return names[mail_store_segment(true)];
}

/*
 * Define the settings that can change while the server runs.  Safe to call
 * more than once.
 */
static void
gatekeeper_define_settings(void)
{
	static bool defined = false;

	if (defined)
		return;
	defined = true;

	define_mail_settings();
	define_worker_settings();
	define_relay_settings();
	define_message_settings();
}

/*
 * The settings of the insert trigger (src/mail/mail.c): where new mail goes,
 * what a held dedupe key does, how large a mail may be.
 */
static void
define_mail_settings(void)
{
	/*
	 * gatekeeper.current_segment: the retention segment new mail goes to
	 * (src/mail/mail.c), as a read-only setting.
	 *
	 * The default of gatekeeper.mail.segment is
	 * coalesce(current_setting('gatekeeper.current_segment', true)::smallint,
	 * gatekeeper._segment()): every row of an INSERT or COPY evaluates it,
	 * and a call of _segment() costs a save and restore of every setting
	 * (its pinned search_path), about 5% of a COPY in perf, where reading
	 * a setting costs a lookup.  Its value is not stored: the show hook
	 * reads the segment as _segment() does.  PGC_INTERNAL, so no role can
	 * set it.
	 */
	DefineCustomIntVariable("gatekeeper.current_segment",
							"The retention segment new mail goes to (read only).",
							"The default of gatekeeper.mail.segment: gatekeeper.segment as this transaction reads it.",
							&current_segment_setting,
							0, 0, 3,
							PGC_INTERNAL,
							GUC_NO_SHOW_ALL | GUC_NOT_IN_SAMPLE | GUC_DISALLOW_IN_FILE | GUC_NO_RESET_ALL,
							NULL, NULL, show_current_segment);

	/*
	 * gatekeeper.on_duplicate: what a bulk INSERT or COPY does with a row
	 * whose dedupe key is held (src/mail/mail.c).  An enum, so that SET refuses
	 * any other value (with the list of the two) as a check hook would.
	 * enqueue() pins 'error': it returns the holder's id itself.
	 */
	DefineCustomEnumVariable("gatekeeper.on_duplicate",
							 "What a bulk INSERT or COPY into gatekeeper.mail does with a row whose dedupe key is held.",
							 "error fails the statement with SQLSTATE 23505; skip leaves the row out and counts it in a NOTICE at the end of the statement.",
							 &gatekeeper_on_duplicate,
							 GATEKEEPER_ON_DUPLICATE_ERROR,
							 on_duplicate_options,
							 PGC_USERSET,
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
}

/*
 * The workers' rhythm and the claim's terms: naps, batches, leases,
 * retries, retention, standbys, soft bounces.
 */
static void
define_worker_settings(void)
{
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
							"d = retry_delay * 2^(n-1), at most 10 minutes (or retry_delay when longer); "
							"a queue's retry_for keeps a mail that is only deferred retrying that long.",
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
 * The relays the workers deliver to and how: URLs, credentials, TLS,
 * connections, timeouts, the bytes in flight.
 */
static void
define_relay_settings(void)
{
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
}

/*
 * What the workers write into each message: the default sender, the
 * Message-ID's domain, the DKIM keys.
 */
static void
define_message_settings(void)
{
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
 * One relay of gatekeeper.smtp_url, checked by the SMTP client's own reader
 * of relay URLs (smtp_config_check_url), so that what the worker cannot use
 * is refused here, at ALTER SYSTEM and at a reload (which then keeps the
 * value in force and logs why).  The message names the relay as subject
 * says, which does not repeat a URL with user information (GUC's own would).
 */
static bool
check_relay_url(const char *url, const char *subject)
{
	SmtpUrl		u;
	SmtpUrlProblem problem;

	if (url[0] == '\0' || smtp_config_check_url(url, subject, &u, &problem))
		return true;
	GUC_check_errmsg("%s", problem.message);
	if (problem.detail[0] != '\0')
		GUC_check_errdetail("%s", problem.detail);
	if (problem.hint[0] != '\0')
		GUC_check_errhint("%s", problem.hint);
	return false;
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
 * shmem_request_hook: ask for the shared state.
 */
static void
gatekeeper_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();

	RequestAddinShmemSpace(gatekeeper_slots_shmem_size());
	RequestAddinShmemSpace(gatekeeper_gate_shmem_size());
	RequestAddinShmemSpace(gatekeeper_due_floor_shmem_size());
	mail_store_totals_shmem_request();
}

/*
 * shmem_startup_hook: create or attach to the shared state of every
 * module.  It is created again, empty, whenever the postmaster
 * reinitializes shared memory after a crash.
 */
static void
gatekeeper_shmem_startup(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	gatekeeper_slots_shmem_init();
	gatekeeper_gate_shmem_init();
	gatekeeper_due_floor_shmem_init();
	mail_store_totals_shmem_init();
	LWLockRelease(AddinShmemInitLock);
}

/*
 * _retry_delay() RETURNS interval
 *		0.2.0's, gone (nack's backoff reads gatekeeper.retry_delay in C); the
 *		symbol stays for the older scripts (gatekeeper_gone).
 */
Datum
gatekeeper_retry_delay_interval(PG_FUNCTION_ARGS)
{
	gatekeeper_gone("0.2.0", "_retry_delay");
}

