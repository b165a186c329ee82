/*-------------------------------------------------------------------------
 *
 * delivery_check.c
 *		Whether the background worker will send this database's mail, said
 *		where a user looks: a WARNING at CREATE EXTENSION (and ALTER
 *		EXTENSION ... UPDATE), and at the first enqueue of a session,
 *		naming the cause and the fix.
 *
 * Without it a misconfigured server accepts mail that stays scheduled
 * forever, and only the server's log says why, if anything does.  Three
 * causes are told apart, each a setting: the library is not in
 * shared_preload_libraries (no worker exists); the workers serve another
 * database (gatekeeper.database); gatekeeper.smtp_url is empty (never
 * set, or a value the server could not use at start, which it logged and
 * ignored).  With gatekeeper.workers = 0 mail is meant for external
 * workers (gatekeeper.claim), and nothing is said.  A relay that is down
 * is not a setting: worker_status and the log say that.
 *
 * IDENTIFICATION
 *		src/delivery_check.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "gatekeeper.h"
#include "delivery_check.h"

#include "commands/dbcommands.h"
#include "fmgr.h"
#include "miscadmin.h"

PG_FUNCTION_INFO_V1(gatekeeper_delivery_check_sql);

/* whether this session's first enqueue was checked */
static bool session_checked = false;

/*
 * Say, with a WARNING, why no background worker will send this database's
 * mail, if one of the settings keeps it from doing so.  Returns whether
 * the mail can go as far as the settings tell.
 */
bool
gatekeeper_delivery_check(void)
{
	char	   *here;

	/* gatekeeper.database is defined only when the library is preloaded */
	if (gatekeeper_database == NULL)
	{
		ereport(WARNING,
				(errmsg("gatekeeper is not in shared_preload_libraries: no background worker sends this database's mail"),
				 errdetail("Mail stays scheduled until an external worker claims it with gatekeeper.claim()."),
				 errhint("Add gatekeeper to shared_preload_libraries in postgresql.conf, set gatekeeper.database and gatekeeper.smtp_url there, and restart the server.")));
		return false;
	}
	if (gatekeeper_workers == 0)
		return true;

	here = get_database_name(MyDatabaseId);
	if (here != NULL && strcmp(here, gatekeeper_database) != 0)
	{
		ereport(WARNING,
				(errmsg("the gatekeeper worker serves database \"%s\", not this database \"%s\"",
						gatekeeper_database, here),
				 errdetail("Mail enqueued here stays scheduled until an external worker claims it with gatekeeper.claim()."),
				 errhint("Set gatekeeper.database = '%s' in postgresql.conf and restart the server.",
						 here)));
		return false;
	}

	if (gatekeeper_smtp_url == NULL || gatekeeper_smtp_url[0] == '\0')
	{
		ereport(WARNING,
				(errmsg("gatekeeper.smtp_url is empty: the gatekeeper worker sends no mail"),
				 errdetail("A value the server could not use when it started is ignored, with a WARNING in the server log."),
				 errhint("Set gatekeeper.smtp_url to your relay and reload, for example: ALTER SYSTEM SET gatekeeper.smtp_url = 'smtp://127.0.0.1:25'; SELECT pg_reload_conf();")));
		return false;
	}
	return true;
}

/*
 * The check of a session's first enqueue: the first call of the session
 * checks, the others cost one test.
 */
void
gatekeeper_delivery_check_once(void)
{
	if (session_checked)
		return;
	session_checked = true;
	(void) gatekeeper_delivery_check();
}

/*
 * gatekeeper._delivery_check() RETURNS boolean: the check, for the
 * install and update scripts (CREATE EXTENSION, ALTER EXTENSION UPDATE).
 */
Datum
gatekeeper_delivery_check_sql(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(gatekeeper_delivery_check());
}
