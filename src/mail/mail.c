/*-------------------------------------------------------------------------
 *
 * mail.c
 *		The trigger that validates every mail entering gatekeeper.mail.
 *
 * Mail arrives by gatekeeper.enqueue, by INSERT and by COPY; all three
 * pass through this one trigger, so the same validation holds for all of
 * them, and a bad row aborts the statement: nothing is written.  In the
 * same pass over the statement's transition table the trigger writes the
 * statement's mail_live rows (the claim state, one narrow row per mail)
 * straight into the table, in batches of multi-row heap inserts with
 * their index entries (src/live_writer.c), then the keys of keyed mail into
 * gatekeeper.mail_key (see write_keys), and notes that due mail was
 * written, so the delivery workers are woken when the transaction commits.
 * Due mail of a notify queue is announced (NOTIFY gatekeeper, '<queue>')
 * at commit, once per statement and queue; mail due later is left to the
 * first worker.
 *
 * The trigger's settings, gatekeeper.on_duplicate and
 * gatekeeper.current_segment, are defined with the others in
 * src/gatekeeper.c.
 *
 * IDENTIFICATION
 *		src/mail.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "mail.h"
#include "address.h"
#include "catalog.h"
#include "gatekeeper.h"
#include "live_writer.h"
#include "mail_count.h"
#include "unsubscribe.h"
#include "validate.h"
#include "wake.h"
#include "window.h"

#include "access/detoast.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "parser/parsetree.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

PG_FUNCTION_INFO_V1(gatekeeper_mail_check);
PG_FUNCTION_INFO_V1(gatekeeper_segment);

static ExecutorStart_hook_type prev_executor_start = NULL;

static void gatekeeper_mail_executor_start(QueryDesc *queryDesc, int eflags);
static bool inserts_mail_returning(PlannedStmt *stmt, Plan *plan);
static void connect_for_trigger(TriggerData *trigdata);
static bool lock_keys(void);

/* The columns the trigger reads, by attribute number. */
typedef struct MailColumns
{
	Oid			relid;
	int			natts;
	int			queue;
	int			recipient;
	int			sender;
	int			subject;
	int			body;
	int			html;
	int			headers;
	int			send_at;
	int			send_by;
	int			dedupe_key;
	int			recipient_name;
	int			timezone;
	int			template;
	int			template_version;
	int			data;
	int			segment;
} MailColumns;

static MailColumns columns;

/* the partition a COPY is being written into (gatekeeper_mail_copying_into) */
static Oid	copying_into = InvalidOid;

/*
 * Queues known to exist in the current command, with their notify flag.  A
 * COPY of a million rows names a handful of queues; looking each up once
 * per command is enough, because drop_queue locks gatekeeper.mail against
 * writers before it checks that nothing references the queue.
 */
#define QUEUE_CACHE_SIZE 8

typedef struct QueueCache
{
	LocalTransactionId lxid;
	CommandId	cid;
	int			n;
	int			next;
	char	   *names[QUEUE_CACHE_SIZE];
	char	   *unsubscribe_urls[QUEUE_CACHE_SIZE]; /* NULL: none */
	bool		notify[QUEUE_CACHE_SIZE];	/* the queue announces its mail (it
											 * has notify, and is not paused) */
	bool		announced[QUEUE_CACHE_SIZE];	/* and this command did */
} QueueCache;

static QueueCache queue_cache;
static SPIPlanPtr queue_notify_plan = NULL;

/*
 * The templates a command's mail names, with their latest version, looked
 * up (and locked) once per command, as the queues are.
 */
#define TEMPLATE_CACHE_SIZE 8

typedef struct TemplateCache
{
	LocalTransactionId lxid;
	CommandId	cid;
	int			n;
	int			next;
	char	   *names[TEMPLATE_CACHE_SIZE];
	int32		latest[TEMPLATE_CACHE_SIZE];
} TemplateCache;

static TemplateCache template_cache;
static SPIPlanPtr template_latest_plan = NULL;

/*
 * A template's latest version, its rows locked FOR KEY SHARE: a
 * drop_template waits for this transaction, then sees its mail (and is
 * refused), and one that went first leaves no rows to find.
 */
static const char template_latest_sql[] =
"SELECT max(v.version) FROM (SELECT t.version FROM gatekeeper.template t "
" WHERE t.name = $1 FOR KEY SHARE) v";

/* The queue's unsubscribe_url and whether it announces its mail. */
static const char queue_notify_sql[] = "SELECT unsubscribe_url, notify AND NOT paused FROM gatekeeper.queue WHERE name = $1";

/*
 * The statements over the trigger's transition table, new_mail.  Ids at or
 * above the lowest new one in mail_done mean a restore (pg_dump loads
 * finished mail's outcomes first) or ids given by hand: only then is each
 * new mail looked up there.  The question is asked as max(id), which the
 * planner always answers from the end of each partition's primary key;
 * asked as EXISTS over an id range it was costed as a third of mail_done,
 * and with finished mail out of id order or not yet vacuumed planned as a
 * scan of all of it, on every enqueueing statement
 * (sql/36_enqueue_probe_retained.sql).
 */
static const char any_done_sql[] =
"SELECT coalesce((SELECT max(d.id) FROM gatekeeper.mail_done d) >= "
"                (SELECT min(n.id) FROM new_mail n), false)";

/*
 * The highest id in mail_done: new mail above it cannot be finished, and
 * only a row at or below it (a restore, ids given by hand) has the
 * statement's finished ids looked up (finished_ids), then, once: asked as
 * max(id) of mail_done alone, since the min(id) of the transition table
 * was a second pass over all of it, a spilled COPY's rows read back from
 * disk (3% of a bulk COPY: docs/internals.md, "Bulk enqueue").
 */
static const char max_done_sql[] =
"SELECT max(d.id) FROM gatekeeper.mail_done d";

/*
 * Whether every id gatekeeper.mail's sequence gives from here on is above
 * those of finished mail (its last value, once given, is at or above
 * them): then no new mail of a COPY that takes its ids from it can be a
 * finished one being restored (gatekeeper_mail_intake_begin).
 */
static const char ids_new_sql[] =
"SELECT coalesce((SELECT max(d.id) FROM gatekeeper.mail_done d) <= "
"                pg_sequence_last_value(pg_get_serial_sequence('gatekeeper.mail', 'id')::regclass), "
"                NOT EXISTS (SELECT FROM gatekeeper.mail_done))";

static const char done_ids_sql[] =
"SELECT n.id FROM new_mail n JOIN gatekeeper.mail_done d ON d.id = n.id ORDER BY 1";

static const char insert_live_sql[] =
"INSERT INTO gatekeeper.mail_live (id, queue, priority, send_at, dedupe_key, segment) "
"SELECT n.id, n.queue, n.priority, n.send_at, n.dedupe_key, n.segment FROM new_mail n";

static const char insert_live_restore_sql[] =
"INSERT INTO gatekeeper.mail_live (id, queue, priority, send_at, dedupe_key, segment) "
"SELECT n.id, n.queue, n.priority, n.send_at, n.dedupe_key, n.segment FROM new_mail n "
" WHERE NOT EXISTS (SELECT FROM gatekeeper.mail_done d WHERE d.id = n.id)";

static const char is_live_sql[] =
"SELECT EXISTS (SELECT FROM gatekeeper.mail_live l WHERE l.id = $1) "
"    OR coalesce((SELECT r.last_id >= $1 FROM gatekeeper.mail_run r "
"                  WHERE r.id <= $1 ORDER BY r.id DESC LIMIT 1), false)";

/*
 * The keys of the statement's keyed mails in gatekeeper.mail_key, in three
 * statements (see write_keys): lock the rows the keys have now, delete
 * those whose mail has finished, insert the new mails' keys.
 */
static const char lock_keys_sql[] =
"SELECT FROM gatekeeper.mail_key k "
" WHERE (k.queue, k.dedupe_key) IN "
"       (SELECT n.queue, n.dedupe_key FROM new_mail n WHERE n.dedupe_key IS NOT NULL) "
" ORDER BY k.queue, k.dedupe_key FOR UPDATE OF k";

static const char clear_keys_sql[] =
"DELETE FROM gatekeeper.mail_key k "
" WHERE (k.queue, k.dedupe_key) IN "
"       (SELECT n.queue, n.dedupe_key FROM new_mail n WHERE n.dedupe_key IS NOT NULL) "
"   AND NOT gatekeeper._mail_key_held(k.id, k.queue, k.dedupe_key)";

static const char insert_keys_sql[] =
"INSERT INTO gatekeeper.mail_key (queue, dedupe_key, id) "
"SELECT n.queue, n.dedupe_key, n.id FROM new_mail n "
" WHERE n.dedupe_key IS NOT NULL "
"   AND EXISTS (SELECT FROM gatekeeper.mail_live l WHERE l.id = n.id) "
"   AND NOT EXISTS (SELECT FROM gatekeeper.mail_key k "
"                    WHERE k.queue = n.queue AND k.dedupe_key = n.dedupe_key AND k.id = n.id)";

/*
 * gatekeeper.on_duplicate = 'skip' (see skip_held_keys): the statement's
 * keys, each given to its first mail unless held; then the keyed mails
 * that did not get theirs (whose key's row names another mail) are the
 * skipped ones: their ids; the live rows of the others, when the SQL path
 * writes them; the skipped mails taken out again.
 *
 * These plans are made once and kept, perhaps first for a statement of a
 * few rows on small tables: each looks a mail's key up with a scalar
 * subquery, one probe of a unique index per row of the statement, which
 * the planner turns neither into a hash of the whole table nor into a
 * rescan of the statement's rows per row of the table.
 */
static const char take_keys_sql[] =
"INSERT INTO gatekeeper.mail_key (queue, dedupe_key, id) "
"SELECT DISTINCT ON (n.queue, n.dedupe_key) n.queue, n.dedupe_key, n.id FROM new_mail n "
" WHERE n.dedupe_key IS NOT NULL "
"   AND (SELECT l.id FROM gatekeeper.mail_live l "
"         WHERE l.queue = n.queue AND l.dedupe_key = n.dedupe_key) IS NULL "
" ORDER BY n.queue, n.dedupe_key, n.id "
"ON CONFLICT (queue, dedupe_key) DO NOTHING";

#define SKIPPED_MAIL \
"n.dedupe_key IS NOT NULL " \
"AND (SELECT k.id FROM gatekeeper.mail_key k " \
"      WHERE k.queue = n.queue AND k.dedupe_key = n.dedupe_key) IS DISTINCT FROM n.id"

static const char skipped_ids_sql[] =
"SELECT n.id FROM new_mail n WHERE " SKIPPED_MAIL " ORDER BY 1";

static const char insert_live_kept_sql[] =
"INSERT INTO gatekeeper.mail_live (id, queue, priority, send_at, dedupe_key, segment) "
"SELECT n.id, n.queue, n.priority, n.send_at, n.dedupe_key, n.segment FROM new_mail n "
" WHERE NOT (" SKIPPED_MAIL ")";

/*
 * One statement per retention segment (mail_0 .. mail_3): the skipped
 * mails' row versions found by a probe of the partition's primary key per
 * skipped mail (the LIMIT keeps the probe a parameterised scan, never a
 * join that rescans the statement's rows), then deleted by TID.
 */
static const char delete_skipped_sql[] =
"DELETE FROM gatekeeper.%s m "
" WHERE m.ctid = ANY (ARRAY("
"   SELECT x.ctid FROM new_mail n "
"    CROSS JOIN LATERAL (SELECT p.ctid FROM gatekeeper.%s p "
"                         WHERE p.id = n.id AND p.segment = n.segment LIMIT 1) x "
"    WHERE n.segment = %d AND " SKIPPED_MAIL "))";

static SPIPlanPtr take_keys_plan = NULL;
static SPIPlanPtr skipped_ids_plan = NULL;
static SPIPlanPtr insert_live_kept_plan = NULL;
static SPIPlanPtr delete_skipped_plans[4];

/*
 * After the stale rows are gone: the first of the statement's mails whose
 * key another mail holds, for the error (see held_key_error).
 */
static const char held_key_sql[] =
"SELECT n.id, n.queue, n.dedupe_key FROM new_mail n "
" WHERE n.dedupe_key IS NOT NULL "
"   AND (SELECT k.id FROM gatekeeper.mail_key k "
"         WHERE k.queue = n.queue AND k.dedupe_key = n.dedupe_key) <> n.id "
"   AND (SELECT l.id FROM gatekeeper.mail_live l WHERE l.id = n.id) IS NOT NULL "
" ORDER BY n.id LIMIT 1";

static SPIPlanPtr held_key_plan = NULL;
static SPIPlanPtr lock_keys_plan = NULL;
static SPIPlanPtr clear_keys_plan = NULL;
static SPIPlanPtr insert_keys_plan = NULL;
static SPIPlanPtr any_done_plan = NULL;
static SPIPlanPtr max_done_plan = NULL;
static SPIPlanPtr done_ids_plan = NULL;
static SPIPlanPtr ids_new_plan = NULL;
static SPIPlanPtr insert_live_plan = NULL;
static SPIPlanPtr insert_live_restore_plan = NULL;
static SPIPlanPtr is_live_plan = NULL;

/*
 * Look up the attribute numbers of the columns we check.
 */
static void
load_columns(Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);

	if (columns.relid == RelationGetRelid(rel) && columns.natts == desc->natts)
		return;

	columns.queue = SPI_fnumber(desc, "queue");
	columns.recipient = SPI_fnumber(desc, "recipient");
	columns.sender = SPI_fnumber(desc, "sender");
	columns.subject = SPI_fnumber(desc, "subject");
	columns.body = SPI_fnumber(desc, "body");
	columns.html = SPI_fnumber(desc, "html");
	columns.headers = SPI_fnumber(desc, "headers");
	columns.send_at = SPI_fnumber(desc, "send_at");
	columns.send_by = SPI_fnumber(desc, "send_by");
	columns.dedupe_key = SPI_fnumber(desc, "dedupe_key");
	columns.recipient_name = SPI_fnumber(desc, "recipient_name");
	columns.timezone = SPI_fnumber(desc, "timezone");
	columns.template = SPI_fnumber(desc, "template");
	columns.template_version = SPI_fnumber(desc, "template_version");
	columns.data = SPI_fnumber(desc, "data");
	columns.segment = SPI_fnumber(desc, "segment");
	if (columns.template <= 0 || columns.template_version <= 0 || columns.data <= 0 ||
		columns.segment <= 0 ||
		columns.queue <= 0 || columns.recipient <= 0 || columns.sender <= 0 ||
		columns.subject <= 0 || columns.body <= 0 || columns.html <= 0 ||
		columns.headers <= 0 || columns.send_at <= 0 || columns.send_by <= 0 ||
		columns.dedupe_key <= 0 || columns.recipient_name <= 0 || columns.timezone <= 0)
		elog(ERROR, "gatekeeper_mail_check fired on a table that is not gatekeeper.mail");

	columns.relid = RelationGetRelid(rel);
	columns.natts = desc->natts;
}

/*
 * Raise an error unless the queue exists; returns its place in the
 * cache, which holds its unsubscribe_url and notify flag.
 */
static int
check_queue_exists(const char *queue)
{
	int			i;
	Datum		arg;
	bool		found;
	char	   *url = NULL;
	bool		notify = false;
	Oid			argtype = TEXTOID;
	SPIPlanPtr	plan;

	if (queue_cache.lxid != MyProc->lxid ||
		queue_cache.cid != GetCurrentCommandId(false))
	{
		for (i = 0; i < queue_cache.n; i++)
		{
			pfree(queue_cache.names[i]);
			if (queue_cache.unsubscribe_urls[i] != NULL)
				pfree(queue_cache.unsubscribe_urls[i]);
		}
		queue_cache.n = 0;
		queue_cache.next = 0;
		queue_cache.lxid = MyProc->lxid;
		queue_cache.cid = GetCurrentCommandId(false);
	}
	for (i = 0; i < queue_cache.n; i++)
		if (strcmp(queue_cache.names[i], queue) == 0)
			return i;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	plan = gatekeeper_plan(&queue_notify_plan, queue_notify_sql, 1, &argtype);
	arg = CStringGetTextDatum(queue);
	if (SPI_execute_plan(plan, &arg, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "queue lookup failed");
	found = SPI_processed > 0;
	if (found)
	{
		char	   *value = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
		bool		isnull;

		if (value != NULL)
			url = MemoryContextStrdup(TopMemoryContext, value);
		notify = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
											SPI_tuptable->tupdesc, 2, &isnull)) && !isnull;
	}
	SPI_finish();

	if (!found)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("queue \"%s\" does not exist", queue),
				 errhint("Create it with gatekeeper.create_queue().")));

	if (queue_cache.n < QUEUE_CACHE_SIZE)
		i = queue_cache.n++;
	else
	{
		i = queue_cache.next++ % QUEUE_CACHE_SIZE;
		pfree(queue_cache.names[i]);
		if (queue_cache.unsubscribe_urls[i] != NULL)
			pfree(queue_cache.unsubscribe_urls[i]);
	}
	queue_cache.names[i] = MemoryContextStrdup(TopMemoryContext, queue);
	queue_cache.unsubscribe_urls[i] = url;
	queue_cache.notify[i] = notify;
	queue_cache.announced[i] = false;
	return i;
}

/*
 * Raise 42704 unless the template exists; returns its latest version.
 */
static int32
check_template_exists(const char *template)
{
	int			i;
	Datum		arg;
	bool		isnull = true;
	int32		latest = 0;
	Oid			argtype = TEXTOID;
	SPIPlanPtr	plan;

	if (template_cache.lxid != MyProc->lxid ||
		template_cache.cid != GetCurrentCommandId(false))
	{
		for (i = 0; i < template_cache.n; i++)
			pfree(template_cache.names[i]);
		template_cache.n = 0;
		template_cache.next = 0;
		template_cache.lxid = MyProc->lxid;
		template_cache.cid = GetCurrentCommandId(false);
	}
	for (i = 0; i < template_cache.n; i++)
		if (strcmp(template_cache.names[i], template) == 0)
			return template_cache.latest[i];

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	plan = gatekeeper_plan(&template_latest_plan, template_latest_sql, 1, &argtype);
	arg = CStringGetTextDatum(template);
	if (SPI_execute_plan(plan, &arg, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "template lookup failed");
	if (SPI_processed > 0)
		latest = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
											 SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();

	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("template \"%s\" does not exist", template),
				 errhint("Create it with gatekeeper.create_template().")));

	if (template_cache.n < TEMPLATE_CACHE_SIZE)
		i = template_cache.n++;
	else
	{
		i = template_cache.next++ % TEMPLATE_CACHE_SIZE;
		pfree(template_cache.names[i]);
	}
	template_cache.names[i] = MemoryContextStrdup(TopMemoryContext, template);
	template_cache.latest[i] = latest;

	/*
	 * The lookup locks rows: SPI gave it a command id of its own, which
	 * the statement's later rows see.  The lookups are kept under that
	 * one; kept under the command the lookup began in, every row looked
	 * its template up again.
	 */
	template_cache.cid = GetCurrentCommandId(false);
	return latest;
}

/*
 * Announce a new mail of a notify queue: due by the statement's start, at
 * commit (once per statement and queue here; async.c folds the rest);
 * due later, by the first worker when it comes due.
 */
static void
announce_mail(int cached, TimestampTz send_at)
{
	if (send_at <= GetCurrentStatementStartTimestamp())
	{
		if (!queue_cache.announced[cached])
		{
			gatekeeper_notify_queue(queue_cache.names[cached]);
			queue_cache.announced[cached] = true;
		}
	}
	else
		gatekeeper_announce_later(send_at);
}

/*
 * A mail's columns, deformed once: values and nulls by attribute number
 * less one, as a slot or heap_deform_tuple gives them.  The checks read
 * each column from here instead of walking the tuple per column (every
 * column after the first text one has no cached offset).
 */
typedef struct MailRow
{
	Datum	   *values;
	bool	   *isnull;
} MailRow;

/*
 * The text of a column, or NULL.
 */
static char *
column_text(const MailRow *mail, int attnum)
{
	if (mail->isnull[attnum - 1])
		return NULL;
	return TextDatumGetCString(mail->values[attnum - 1]);
}

/*
 * The raw byte size of a column, 0 when NULL, without detoasting it.
 */
static Size
column_size(const MailRow *mail, int attnum)
{
	if (mail->isnull[attnum - 1])
		return 0;
	return toast_raw_datum_size(mail->values[attnum - 1]) - VARHDRSZ;
}

/*
 * A mail without a template has a subject and a body: the columns were
 * NOT NULL before templates, and a mail missing one is refused as the
 * constraint refused it (23502, naming the row's partition).
 */
static void
not_null_violation(const MailRow *mail, const char *column)
{
	ereport(ERROR,
			(errcode(ERRCODE_NOT_NULL_VIOLATION),
			 errmsg("null value in column \"%s\" of relation \"mail_%d\" violates not-null constraint",
					column, (int) DatumGetInt16(mail->values[columns.segment - 1])),
			 errdetail("A mail without a template must have a subject and a body.")));
}

/*
 * A templated mail: the template (and the version, when given) exists,
 * the data is a JSON object, and the mail has no subject, body or html of
 * its own, which the template's rendering gives it when it is claimed.
 * The rendered mail is checked against gatekeeper.max_message_size then.
 */
static void
check_templated(const MailRow *mail, const char *template, bool to_go)
{
	if (!mail->isnull[columns.subject - 1] || !mail->isnull[columns.body - 1] ||
		!mail->isnull[columns.html - 1])
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a templated mail must not have a subject, body or html of its own"),
				 errdetail("Its template \"%s\" gives them when the mail is sent.", template)));
	if (!mail->isnull[columns.data - 1])
	{
		Jsonb	   *data = DatumGetJsonbP(mail->values[columns.data - 1]);

		if (!JB_ROOT_IS_OBJECT(data) || JB_ROOT_IS_SCALAR(data))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("template data must be a JSON object")));
	}
	if (to_go)
	{
		int32		latest = check_template_exists(template);

		if (!mail->isnull[columns.template_version - 1])
		{
			int32		version = DatumGetInt32(mail->values[columns.template_version - 1]);

			if (version < 1 || version > latest)
				ereport(ERROR,
						(errcode(ERRCODE_UNDEFINED_OBJECT),
						 errmsg("template \"%s\" has no version %d", template, version),
						 errdetail("Its latest version is %d.", latest)));
		}
	}
}

/*
 * The addresses and names of a mail: a recipient always; when the mail is
 * still to go, a valid recipient, sender, recipient_name and timezone.
 * Returns the recipient.
 */
static char *
check_mail_addresses(const MailRow *mail, bool to_go)
{
	char	   *recipient;
	char	   *sender;

	recipient = column_text(mail, columns.recipient);
	if (recipient == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("recipient must not be null")));
	if (to_go)
		gatekeeper_check_address(recipient, "recipient");

	sender = column_text(mail, columns.sender);
	if (sender != NULL && to_go)
	{
		char	   *name;
		char	   *address;

		gatekeeper_parse_mailbox(sender, "sender", &name, &address);
	}
	if (to_go)
	{
		char	   *name = column_text(mail, columns.recipient_name);

		if (name != NULL)
			gatekeeper_check_display_name(name, "recipient_name");
	}
	if (to_go)
	{
		char	   *zone = column_text(mail, columns.timezone);

		if (zone != NULL)
			(void) gatekeeper_check_timezone(zone, "timezone");
	}
	return recipient;
}

/*
 * The content of a mail: a template's (check_templated), or a subject and
 * a body of its own; headers that are valid when the mail is still to go.
 * Returns the number of Message-ID placeholders its headers hold.
 */
static int
check_mail_content(const MailRow *mail, bool to_go)
{
	char	   *template = column_text(mail, columns.template);

	if (template != NULL)
		check_templated(mail, template, to_go);
	else
	{
		char	   *subject = column_text(mail, columns.subject);

		if (subject == NULL)
			not_null_violation(mail, "subject");
		if (to_go)
			gatekeeper_check_header_value(subject, "subject");

		if (mail->isnull[columns.body - 1])
			not_null_violation(mail, "body");
	}

	if (!mail->isnull[columns.headers - 1] && to_go)
		return gatekeeper_check_headers(DatumGetJsonbP(mail->values[columns.headers - 1]));
	return 0;
}

/*
 * The size of a mail, which must be within gatekeeper.max_message_size:
 * its subject, body, html, headers and data.  The claim fills each
 * placeholder in with the mail's Message-ID: it counts at the longest a
 * Message-ID may be, so that what the worker holds and the relay gets is
 * within the limit too.  Returns the size.
 */
static Size
check_mail_size(const MailRow *mail, int placeholders)
{
	Size		size;

	size = column_size(mail, columns.subject) +
		column_size(mail, columns.body) +
		column_size(mail, columns.html) +
		column_size(mail, columns.headers) +
		column_size(mail, columns.data) +
		(Size) placeholders * (GATEKEEPER_MESSAGE_ID_MAX -
							   strlen(GATEKEEPER_MESSAGE_ID_PLACEHOLDER));
	if (size > (Size) gatekeeper_max_message_size && placeholders > 0)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("mail is larger than gatekeeper.max_message_size"),
				 errdetail_plural("Subject, body, html and headers hold %zu bytes, counting its %d %s placeholder at %d bytes, the longest Message-ID; the limit is %d bytes.",
								  "Subject, body, html and headers hold %zu bytes, counting each of its %d %s placeholders at %d bytes, the longest Message-ID; the limit is %d bytes.",
								  placeholders,
								  size, placeholders, GATEKEEPER_MESSAGE_ID_PLACEHOLDER,
								  GATEKEEPER_MESSAGE_ID_MAX, gatekeeper_max_message_size)));
	if (size > (Size) gatekeeper_max_message_size)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("mail is larger than gatekeeper.max_message_size"),
				 errdetail("Subject, body, html and headers hold %zu bytes; the limit is %d bytes.",
						   size, gatekeeper_max_message_size)));
	return size;
}

/*
 * The schedule of a mail: a send_at always; for a new mail still to go,
 * a finite send_at and send_by, send_by not before send_at.  Only such a
 * mail is checked so: a restore of finished mail (pg_dump) loads as it
 * is.  Returns send_at.
 */
static TimestampTz
check_mail_schedule(const MailRow *mail, bool inserting, bool scheduled)
{
	TimestampTz send_at;
	TimestampTz send_by = 0;
	bool		send_by_null = mail->isnull[columns.send_by - 1];

	if (mail->isnull[columns.send_at - 1])
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("send_at must not be null")));
	send_at = DatumGetTimestampTz(mail->values[columns.send_at - 1]);
	if (!send_by_null)
		send_by = DatumGetTimestampTz(mail->values[columns.send_by - 1]);

	if (scheduled && inserting)
	{
		if (TIMESTAMP_NOT_FINITE(send_at) ||
			(!send_by_null && TIMESTAMP_NOT_FINITE(send_by)))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("send_at and send_by must be finite"),
					 errdetail("An infinite time can be neither waited for nor computed with.")));

		if (!send_by_null && send_by < send_at)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("send_by must not be before send_at")));
	}
	return send_at;
}

/*
 * The queue of a mail: named always; for a mail still to go, one that
 * exists (a restore of finished mail may name a queue dropped since),
 * whose RFC 8058 headers, which the claim adds to the mail of a queue
 * with an unsubscribe_url, keep the mail (size bytes without them) within
 * gatekeeper.max_message_size.  A new mail is announced to the queue's
 * listeners (announce_mail).
 */
static void
check_mail_queue(const MailRow *mail, const char *recipient, Size size,
				 TimestampTz send_at, bool inserting, bool scheduled, bool to_go)
{
	char	   *queue = column_text(mail, columns.queue);
	int			cached;
	const char *url;

	if (queue == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("queue must not be null")));
	if (!scheduled)
		return;
	cached = check_queue_exists(queue);
	url = queue_cache.unsubscribe_urls[cached];
	if (url != NULL && to_go)
	{
		Jsonb	   *headers = NULL;
		Size		added;

		if (!mail->isnull[columns.headers - 1])
			headers = DatumGetJsonbP(mail->values[columns.headers - 1]);
		added = gatekeeper_unsubscribe_headers_size(url, recipient, queue, headers);
		if (size + added > (Size) gatekeeper_max_message_size)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("mail is larger than gatekeeper.max_message_size"),
					 errdetail("Subject, body, html and headers hold %zu bytes, and the List-Unsubscribe headers of queue \"%s\" add %zu; the limit is %d bytes.",
							   size, queue, added, gatekeeper_max_message_size)));
	}

	if (inserting && queue_cache.notify[cached])
		announce_mail(cached, send_at);
}

/*
 * Reject a mail, with the SQLSTATEs the README documents, when any field is
 * malformed.  inserting: the mail is new, not an update of one; scheduled:
 * it is still to go.
 */
static void
check_mail(const MailRow *mail, bool inserting, bool scheduled)
{
	char	   *recipient;
	int			placeholders;
	Size		size;
	TimestampTz send_at;
	bool		to_go;

	/*
	 * The content of mail that is still to go (new mail, or mail being
	 * changed) must be sendable.  Finished mail inserted as such is a
	 * restore (pg_dump) of history, perhaps written by a version with
	 * other rules: it loads as it is, so that a restore never fails on it.
	 */
	to_go = scheduled || !inserting;

	recipient = check_mail_addresses(mail, to_go);
	placeholders = check_mail_content(mail, to_go);
	size = check_mail_size(mail, placeholders);
	send_at = check_mail_schedule(mail, inserting, scheduled);
	check_mail_queue(mail, recipient, size, send_at, inserting, scheduled, to_go);

	/* wake the workers at commit when this mail is due within a nap */
	if (scheduled &&
		send_at <= GetCurrentStatementStartTimestamp() + (int64) gatekeeper_naptime * 1000)
		gatekeeper_wake_at_commit();
}

/*
 * Where in the statement a bad row is, for the error's context line: its
 * position among the statement's rows (for COPY, its line, not counting a
 * header) and its recipient.
 */
typedef struct RowContext
{
	int64		row;
	const MailRow *mail;		/* NULL: no row being checked */
} RowContext;

static void
row_error_context(void *arg)
{
	RowContext *where = (RowContext *) arg;
	char	   *recipient = NULL;
	StringInfoData buf;
	const char *p;

	if (where->mail == NULL)
		return;
	if (columns.recipient > 0)
		recipient = column_text(where->mail, columns.recipient);
	if (recipient == NULL)
	{
		errcontext("row %lld of the statement, recipient NULL",
				   (long long) where->row);
		return;
	}

	/* the recipient as a quoted literal, control characters escaped */
	initStringInfo(&buf);
	for (p = recipient; *p != '\0' && buf.len < 200; p += pg_mblen(p))
	{
		unsigned char c = (unsigned char) *p;

		if (c < 0x20 || c == 0x7f)
			appendStringInfo(&buf, "\\x%02x", c);
		else if (c == '"')
			appendStringInfoString(&buf, "\\\"");
		else
			appendBinaryStringInfo(&buf, p, pg_mblen(p));
	}
	if (*p != '\0')
		appendStringInfoString(&buf, "...");
	errcontext("row %lld of the statement, recipient \"%s\"",
			   (long long) where->row, buf.data);
}

/*
 * Whether the mail with this id is live, for the update of a mail.
 */
static bool
mail_is_live(HeapTuple tuple, TupleDesc desc)
{
	bool		isnull;
	Datum		id = heap_getattr(tuple, 1, desc, &isnull);
	bool		live;
	Oid			type = INT8OID;

	if (isnull)
		return false;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	gatekeeper_plan(&is_live_plan, is_live_sql, 1, &type);
	if (SPI_execute_plan(is_live_plan, &id, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "live mail lookup failed");
	live = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	return live;
}

/*
 * The ids of the statement's mails that are finished (in mail_done), sorted,
 * or NULL when there are none: *n is set to their count.  Unless the caller
 * already saw a row at or below mail_done's highest id (may_be), whether
 * any can be is asked first.
 */
static int64 *
finished_ids(TriggerData *trigdata, bool may_be, int *n)
{
	bool		isnull;
	int64	   *ids = NULL;

	*n = 0;
	connect_for_trigger(trigdata);
	if (!may_be)
	{
		gatekeeper_plan(&any_done_plan, any_done_sql, 0, NULL);
		if (SPI_execute_plan(any_done_plan, NULL, NULL, true, 1) != SPI_OK_SELECT)
			elog(ERROR, "finished mail lookup failed");
		may_be = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	}
	if (may_be)
	{
		gatekeeper_plan(&done_ids_plan, done_ids_sql, 0, NULL);
		if (SPI_execute_plan(done_ids_plan, NULL, NULL, true, 0) != SPI_OK_SELECT)
			elog(ERROR, "finished mail lookup failed");
		ids = gatekeeper_spi_ids(CurTransactionContext, n);
	}
	SPI_finish();
	return ids;
}

/*
 * The highest id of finished mail, or PG_INT64_MIN when there is none.
 */
static int64
finished_max(void)
{
	bool		isnull;
	Datum		d;
	int64		max = PG_INT64_MIN;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	gatekeeper_plan(&max_done_plan, max_done_sql, 0, NULL);
	if (SPI_execute_plan(max_done_plan, NULL, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "finished mail lookup failed");
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (!isnull)
		max = DatumGetInt64(d);
	SPI_finish();
	return max;
}

/*
 * Order of int64s, for bsearch.
 */
static int
int64_cmp(const void *a, const void *b)
{
	int64		x = *(const int64 *) a;
	int64		y = *(const int64 *) b;

	return (x > y) - (x < y);
}

/*
 * Write the live rows of the statement's new mails, those not finished.
 */
static void
insert_live(TriggerData *trigdata, bool restoring)
{
	connect_for_trigger(trigdata);
	if (restoring)
	{
		gatekeeper_plan(&insert_live_restore_plan, insert_live_restore_sql, 0, NULL);
		if (SPI_execute_plan(insert_live_restore_plan, NULL, NULL, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "could not write live mail");
	}
	else
	{
		gatekeeper_plan(&insert_live_plan, insert_live_sql, 0, NULL);
		if (SPI_execute_plan(insert_live_plan, NULL, NULL, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "could not write live mail");
	}
	SPI_finish();
}

/*
 * Fail the statement on a mail (id, queue, dedupe_key in tuple) whose key
 * another mail holds: 23505 on mail_key_pkey, as the insert of its key
 * would (enqueue() tells it by the constraint's name), with the row, queue
 * and key in the context line, as live_error_context gives them for
 * mail_dedupe, to any role that may insert.
 */
static void
held_key_error(TriggerData *trigdata, HeapTuple tuple, TupleDesc tupdesc)
{
	bool		isnull;
	int64		id = DatumGetInt64(SPI_getbinval(tuple, tupdesc, 1, &isnull));
	char	   *queue = SPI_getvalue(tuple, tupdesc, 2);
	char	   *key = SPI_getvalue(tuple, tupdesc, 3);
	TupleDesc	desc = RelationGetDescr(trigdata->tg_relation);
	TupleTableSlot *slot = MakeSingleTupleTableSlot(desc, &TTSOpsMinimalTuple);
	int64		row = 0;

	/* its position among the statement's rows */
	tuplestore_rescan(trigdata->tg_newtable);
	while (tuplestore_gettupleslot(trigdata->tg_newtable, true, false, slot))
	{
		row++;
		if (DatumGetInt64(slot_getattr(slot, 1, &isnull)) == id)
			break;
		ExecClearTuple(slot);
	}
	ExecDropSingleTupleTableSlot(slot);

	ereport(ERROR,
			(errcode(ERRCODE_UNIQUE_VIOLATION),
			 errmsg("duplicate key value violates unique constraint \"%s\"", "mail_key_pkey"),
			 errdetail("A mail of queue \"%s\" holds dedupe key \"%s\": it is scheduled or claimed, or it finished within the queue's dedupe_window.",
					   queue, key),
			 err_generic_string(PG_DIAG_SCHEMA_NAME, "gatekeeper"),
			 err_generic_string(PG_DIAG_TABLE_NAME, "mail_key"),
			 err_generic_string(PG_DIAG_CONSTRAINT_NAME, "mail_key_pkey"),
			 errcontext("row %lld of the statement, queue \"%s\", dedupe key \"%s\"",
						(long long) row, queue, key)));
}

/*
 * SPI_connect for a statement trigger whose SQL reads its transition
 * tables (new_mail, old_mail): they are registered with the connection.
 */
static void
connect_for_trigger(TriggerData *trigdata)
{
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_register_trigger_data(trigdata) != SPI_OK_TD_REGISTER)
		elog(ERROR, "SPI_register_trigger_data failed");
}

/*
 * Lock the rows of gatekeeper.mail_key that the statement's new mails'
 * keys name, and delete those whose mail no longer holds its key (as
 * write_keys explains).  Returns whether any row was locked.
 */
static bool
lock_keys(void)
{
	gatekeeper_plan(&lock_keys_plan, lock_keys_sql, 0, NULL);
	if (SPI_execute_plan(lock_keys_plan, NULL, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not lock dedupe keys");
	if (SPI_processed == 0)
		return false;
	gatekeeper_plan(&clear_keys_plan, clear_keys_sql, 0, NULL);
	if (SPI_execute_plan(clear_keys_plan, NULL, NULL, false, 0) != SPI_OK_DELETE)
		elog(ERROR, "could not clear stale dedupe keys");
	return true;
}

/*
 * Write the keys of the statement's new keyed mails into mail_key, after
 * their live rows: a key held by another mail (claimed, or finished within
 * its queue's dedupe_window) fails the statement with 23505 on
 * mail_key_pkey (held_key_error), as mail_dedupe fails it for a scheduled
 * one; a key whose row is stale (its mail no longer holds it) is taken
 * over.
 *
 * The rows are locked first and tested for staleness only in the next
 * statement: SPI takes a new snapshot per statement (READ COMMITTED), so
 * that test sees the holder as the row's last writer, which we waited
 * for, committed it.  Tested in the locking statement itself, a row taken
 * over meanwhile by a concurrent insert would be rechecked against the
 * older snapshot, which misses the new holder's live row: it would look
 * stale, and two unfinished mails would share the key.  Mails whose live
 * row was not written (finished, in a restore) get no key; a row the
 * restore already loaded for the same mail is kept as it is.
 */
static void
write_keys(TriggerData *trigdata)
{
	connect_for_trigger(trigdata);
	if (lock_keys())
	{
		gatekeeper_plan(&held_key_plan, held_key_sql, 0, NULL);
		if (SPI_execute_plan(held_key_plan, NULL, NULL, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not look up held dedupe keys");
		if (SPI_processed > 0)
			held_key_error(trigdata, SPI_tuptable->vals[0], SPI_tuptable->tupdesc);
	}
	gatekeeper_plan(&insert_keys_plan, insert_keys_sql, 0, NULL);
	if (SPI_execute_plan(insert_keys_plan, NULL, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not write dedupe keys");
	SPI_finish();
}

/*
 * gatekeeper.on_duplicate = 'skip': take the keys of the statement's new
 * mails where they are free, before any of their live rows is written,
 * and return the ids of the keyed mails that got none (sorted; *n their
 * count): those the trigger leaves out.
 *
 * The key rows are locked, and those whose mail no longer holds the key
 * deleted, as write_keys does; then each key goes to the statement's
 * first mail with it (by id: the first row, for ids the identity gives)
 * unless a row of mail_key remains (a holder, live or finished within its
 * window) or a scheduled mail holds it in mail_live.  ON CONFLICT DO
 * NOTHING waits for a concurrent statement's uncommitted key and skips
 * the mail if that commits, so the skip is as exact as the error would
 * be.  One race is left to the deadlock detector: a statement that fails
 * on held keys (on_duplicate 'error') writes its live rows before its
 * keys, this one its keys first, and each may then wait for the other.
 */
static int64 *
skip_held_keys(TriggerData *trigdata, int *n)
{
	int64	   *skipped = NULL;

	*n = 0;
	connect_for_trigger(trigdata);
	(void) lock_keys();
	gatekeeper_plan(&take_keys_plan, take_keys_sql, 0, NULL);
	if (SPI_execute_plan(take_keys_plan, NULL, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not write dedupe keys");
	/* not read-only: the next statement sees the keys just written */
	gatekeeper_plan(&skipped_ids_plan, skipped_ids_sql, 0, NULL);
	if (SPI_execute_plan(skipped_ids_plan, NULL, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not find the mails whose dedupe key is held");
	skipped = gatekeeper_spi_ids(CurTransactionContext, n);
	SPI_finish();
	return skipped;
}

/*
 * Write the live rows of the statement's new mails but the skipped ones,
 * by SQL (when the direct path cannot).
 */
static void
insert_live_kept(TriggerData *trigdata)
{
	connect_for_trigger(trigdata);
	gatekeeper_plan(&insert_live_kept_plan, insert_live_kept_sql, 0, NULL);
	if (SPI_execute_plan(insert_live_kept_plan, NULL, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not write live mail");
	SPI_finish();
}

/*
 * Take the skipped mails out of gatekeeper.mail again: the statement has
 * inserted them, and a statement trigger cannot drop its rows otherwise.
 * Deleted from the partitions themselves, by TID: a join of the
 * partitioned table with the statement's rows can be planned as a rescan
 * of those rows per row of the table.  The mails have no live row, key or
 * outcome, so nothing else is to be removed (the parent's _mail_sync does
 * not fire).
 */
static void
delete_skipped(TriggerData *trigdata, int nskipped)
{
	uint64		deleted = 0;
	int			segment;

	connect_for_trigger(trigdata);
	for (segment = 0; segment < (int) lengthof(delete_skipped_plans); segment++)
	{
		if (delete_skipped_plans[segment] == NULL)
		{
			char		partition[NAMEDATALEN];

			snprintf(partition, sizeof(partition), "mail_%d", segment);
			gatekeeper_plan(&delete_skipped_plans[segment],
							psprintf(delete_skipped_sql, partition, partition, segment),
							0, NULL);
		}
		if (SPI_execute_plan(delete_skipped_plans[segment], NULL, NULL, false, 0) != SPI_OK_DELETE)
			elog(ERROR, "could not remove skipped mail");
		deleted += SPI_processed;
	}
	if (deleted != (uint64) nskipped)
		elog(ERROR, "removed %llu skipped mails of %d",
			 (unsigned long long) deleted, nskipped);
	SPI_finish();
}

/*
 * One statement's new mail, taken in row by row: each checked, its live
 * row given to the live writer (none when the SQL path writes them
 * afterwards), counted.  The insert trigger takes the rows of its
 * transition table in so (check_new_mail), and a COPY into
 * gatekeeper.mail its rows as it reads them (gatekeeper_mail_intake_rows).
 */
struct MailIntake
{
	LiveWriter *live;			/* NULL: the SQL path writes the live rows */
	MailCount  *count;
	bool		keyed;			/* a row had a dedupe key */
	RowContext	where;			/* the row being checked, for errors */
	ErrorContextCallback errcallback;
	MemoryContext per_row;		/* what a row's check allocates */
};

static void
intake_start(MailIntake *in, LiveWriter *live)
{
	in->live = live;
	in->count = mail_count_start(live != NULL ? gatekeeper_live_writer_relid(live) : InvalidOid);
	in->keyed = false;
	in->where.row = 0;
	in->where.mail = NULL;
	in->errcallback.callback = row_error_context;
	in->errcallback.arg = &in->where;
	in->per_row = AllocSetContextCreate(CurrentMemoryContext,
										"gatekeeper mail check",
										ALLOCSET_DEFAULT_SIZES);
}

/*
 * Take in the statement's next row: finished, a restored mail that gets
 * no live row; skip, one left out (on_duplicate 'skip'), checked all the
 * same.  What the check allocates is freed after it.
 */
static void
intake_row(MailIntake *in, MailRow *mail, bool finished, bool skip)
{
	MemoryContext old = MemoryContextSwitchTo(in->per_row);

	in->where.row++;
	in->where.mail = mail;
	in->errcallback.previous = error_context_stack;
	error_context_stack = &in->errcallback;
	check_mail(mail, true, !finished);
	error_context_stack = in->errcallback.previous;
	in->where.mail = NULL;
	if (!in->keyed)
		in->keyed = !mail->isnull[columns.dedupe_key - 1];
	if (!skip)
	{
		if (in->live != NULL && !finished)
			gatekeeper_live_writer_add(in->live, mail->values, mail->isnull, in->where.row);
		if (!mail->isnull[columns.queue - 1])
			mail_count_move(in->count, mail->values[columns.queue - 1], COUNT_ENQUEUED,
							in->live != NULL && !finished ? 1 : 0, 0);
	}
	MemoryContextSwitchTo(old);
	MemoryContextReset(in->per_row);
}

/*
 * The statement's counts noted, once its live rows and keys are written.
 */
static void
intake_end(MailIntake *in)
{
	mail_count_end(in->count);
	MemoryContextDelete(in->per_row);
}

/*
 * The statement's new mail, in the trigger's transition table: validate
 * every row and write its live row (src/live_writer.c, or the SQL path),
 * its key and its counts, in one pass; nothing when the rows are a dump
 * being loaded.
 */
static void
check_new_mail(TriggerData *trigdata, Relation rel, TupleDesc desc)
{
	TupleTableSlot *slot;
	int64	   *done = NULL;
	int			ndone = 0;
	bool		done_known = false;
	int64		max_done = PG_INT64_MAX;
	int64	   *skipped = NULL;
	int			nskipped = 0;
	bool		skipping = false;
	MailIntake	in;

	/* a dump loaded through gatekeeper.mail: the rows as they were */
	if (gatekeeper_writer() == GATEKEEPER_WRITER_DUMP)
		return;

	slot = MakeSingleTupleTableSlot(desc, &TTSOpsMinimalTuple);

	if (gatekeeper_on_duplicate == GATEKEEPER_ON_DUPLICATE_SKIP)
	{
		/* a restore of finished mail loads as it is, never skipped */
		done = finished_ids(trigdata, false, &ndone);
		done_known = true;
		if (ndone == 0)
		{
			skipping = true;
			skipped = skip_held_keys(trigdata, &nskipped);
		}
	}
	else
		max_done = finished_max();
	intake_start(&in, ndone == 0 ?
				 gatekeeper_live_writer_open(desc, tuplestore_tuple_count(trigdata->tg_newtable)) :
				 NULL);

	/* read pointer 0: lookups by SPI read the table with pointers of their own */
	tuplestore_select_read_pointer(trigdata->tg_newtable, 0);
	tuplestore_rescan(trigdata->tg_newtable);
	while (tuplestore_gettupleslot(trigdata->tg_newtable, true, false, slot))
	{
		MailRow		mail;
		bool		finished = false;
		bool		skip = false;

		/* every column deformed once, read in place from the tuplestore */
		slot_getallattrs(slot);
		mail.values = slot->tts_values;
		mail.isnull = slot->tts_isnull;
		if (!done_known && !mail.isnull[0] && DatumGetInt64(mail.values[0]) <= max_done)
		{
			/*
			 * A row that may be finished: the statement's finished ids,
			 * once.  Rows before it are above every finished id.  The
			 * lookup reads the transition table with a read pointer of
			 * its own; this loop's is pointer 0.
			 */
			done = finished_ids(trigdata, true, &ndone);
			done_known = true;
			tuplestore_select_read_pointer(trigdata->tg_newtable, 0);
		}
		if (ndone > 0 || nskipped > 0)
		{
			int64		id = DatumGetInt64(mail.values[0]);

			if (ndone > 0)
				finished = bsearch(&id, done, ndone, sizeof(int64), int64_cmp) != NULL;
			else
				skip = bsearch(&id, skipped, nskipped, sizeof(int64), int64_cmp) != NULL;
		}
		intake_row(&in, &mail, finished, skip);
		ExecClearTuple(slot);
	}
	ExecDropSingleTupleTableSlot(slot);

	if (in.live != NULL)
		gatekeeper_live_writer_close(in.live);
	else if (skipping)
		insert_live_kept(trigdata);
	else
		insert_live(trigdata, ndone > 0);
	if (in.keyed && !skipping)
		write_keys(trigdata);
	if (nskipped > 0)
	{
		delete_skipped(trigdata, nskipped);
		ereport(NOTICE,
				(errmsg_plural("skipped %d row whose dedupe key is held",
							   "skipped %d rows whose dedupe key is held",
							   nskipped, nskipped),
				 errdetail("gatekeeper.on_duplicate is skip: a row whose key a mail of its queue holds (scheduled, claimed, or finished within the queue's dedupe_window), or an earlier row of the statement, is not enqueued.")));
	}
	intake_end(&in);
}

/*
 * gatekeeper_mail_check
 *		The trigger function of gatekeeper.mail.
 *
 * AFTER INSERT FOR EACH STATEMENT, over the statement's new rows: one
 * call per INSERT or COPY, however many rows, so COPY keeps its
 * multi-row inserts and the function's pinned settings are applied once;
 * an error aborts the statement, so nothing is written.  Then the live
 * rows, in one statement.  BEFORE UPDATE FOR EACH ROW of the content
 * columns, for the rare update of a mail.
 */
Datum
gatekeeper_mail_check(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Relation	rel;
	TupleDesc	desc;

	if (!CALLED_AS_TRIGGER(fcinfo))
		elog(ERROR, "gatekeeper_mail_check must be called as a trigger");
	rel = trigdata->tg_relation;
	desc = RelationGetDescr(rel);
	gatekeeper_require_schema();
	load_columns(rel);

	if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) &&
		TRIGGER_FIRED_BEFORE(trigdata->tg_event) &&
		TRIGGER_FIRED_FOR_ROW(trigdata->tg_event))
	{
		HeapTuple	tuple = trigdata->tg_newtuple;
		MailRow		mail;

		mail.values = palloc(desc->natts * sizeof(Datum));
		mail.isnull = palloc(desc->natts * sizeof(bool));
		heap_deform_tuple(tuple, desc, mail.values, mail.isnull);
		check_mail(&mail, false, mail_is_live(tuple, desc));
		pfree(mail.values);
		pfree(mail.isnull);
		return PointerGetDatum(tuple);
	}

	if (TRIGGER_FIRED_BY_INSERT(trigdata->tg_event) &&
		TRIGGER_FIRED_AFTER(trigdata->tg_event) &&
		TRIGGER_FIRED_FOR_STATEMENT(trigdata->tg_event) &&
		trigdata->tg_newtable != NULL)
	{
		/*
		 * On a partition: only a COPY into gatekeeper.mail that
		 * src/mail_copy.c writes there.  Rotation moves mail that has its
		 * live row already, and a restore loads the rows as they were.
		 */
		if (rel->rd_rel->relispartition && RelationGetRelid(rel) != copying_into)
			return PointerGetDatum(NULL);
		check_new_mail(trigdata, rel, desc);
		return PointerGetDatum(NULL);
	}

	elog(ERROR, "gatekeeper_mail_check fired for an event it does not handle");
	return PointerGetDatum(NULL);	/* keep compiler quiet */
}

/*
 * gatekeeper_mail_intake_begin
 *		Take in the rows of a COPY into part, the current segment's
 *		partition of gatekeeper.mail, as the COPY reads them
 *		(src/mail/mail_copy.c), instead of the partition's insert trigger
 *		over a transition table; or NULL when they need the trigger's
 *		statements over that table: a dump being loaded, on_duplicate
 *		'skip', rows that may hold dedupe keys or the ids of finished mail
 *		(a COPY naming dedupe_key or id, or a sequence behind mail_done), or
 *		live rows the direct path may not write.  attnums are the COPY's
 *		columns.  Called as the trigger function runs: as its owner, with
 *		its search_path.
 */
MailIntake *
gatekeeper_mail_intake_begin(Relation part, List *attnums)
{
	TupleDesc	desc = RelationGetDescr(part);
	MailIntake *in;
	LiveWriter *live;
	bool		isnull;
	bool		ids_new;

	if (gatekeeper_writer() == GATEKEEPER_WRITER_DUMP ||
		gatekeeper_on_duplicate == GATEKEEPER_ON_DUPLICATE_SKIP)
		return NULL;
	gatekeeper_require_schema();
	load_columns(part);
	if (list_member_int(attnums, columns.dedupe_key) ||
		list_member_int(attnums, SPI_fnumber(desc, "id")) ||
		TupleDescAttr(desc, columns.dedupe_key - 1)->atthasdef)
		return NULL;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	gatekeeper_plan(&ids_new_plan, ids_new_sql, 0, NULL);
	if (SPI_execute_plan(ids_new_plan, NULL, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "finished mail lookup failed");
	ids_new = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)) &&
		!isnull;
	SPI_finish();
	if (!ids_new)
		return NULL;

	/* how many rows is not known: runs from the writer's RUN_MIN_ROWS-th on */
	live = gatekeeper_live_writer_open(desc, -1);
	if (live == NULL)
		return NULL;
	in = palloc0(sizeof(MailIntake));
	intake_start(in, live);
	return in;
}

/*
 * gatekeeper_mail_intake_rows
 *		Check the next n rows of the COPY, in its slots, and give their live
 *		rows to the writer, as the trigger does with its transition table's.
 *		The rows are then written by the caller.
 */
void
gatekeeper_mail_intake_rows(MailIntake *in, TupleTableSlot **slots, int n)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		MailRow		mail;

		slot_getallattrs(slots[i]);
		mail.values = slots[i]->tts_values;
		mail.isnull = slots[i]->tts_isnull;
		intake_row(in, &mail, false, false);
	}
}

/*
 * gatekeeper_mail_intake_end
 *		The COPY's last live rows written and its counts noted.
 */
void
gatekeeper_mail_intake_end(MailIntake *in)
{
	if (in->keyed)
		elog(ERROR, "a COPY taken in row by row had a dedupe key");
	gatekeeper_live_writer_close(in->live);
	intake_end(in);
	pfree(in);
}

/*
 * gatekeeper_mail_copying_into
 *		The partition of gatekeeper.mail that a COPY into gatekeeper.mail is
 *		being written into now (src/mail_copy.c), InvalidOid once it ends:
 *		the partition's insert trigger checks those rows as gatekeeper.mail's
 *		would.  Any other insert into a partition is not mail being
 *		enqueued: rotation moving mail that has its live row, a restore
 *		loading a partition's rows.
 */
void
gatekeeper_mail_copying_into(Oid relid)
{
	copying_into = relid;
}

/*
 * The retention segment new mail goes to, read from gatekeeper.segment once
 * per transaction and remembered, since every row of a COPY asks.  Read
 * from the table directly, not by SQL: the inserting role needs no
 * privilege on it.  A transaction that began before a rotation may go on
 * adding mail to the segment before; that segment is the newest but one,
 * and its tables are locked against the next rotations while the
 * transaction lasts.  missing_ok: 0 when the extension's table is not
 * there (for gatekeeper.current_segment, which any session may show).
 */
int16
gatekeeper_current_segment(bool missing_ok)
{
	static LocalTransactionId cached_lxid = InvalidLocalTransactionId;
	static int16 cached = 0;

	if (cached_lxid != MyProc->lxid)
	{
		Oid			relid = gatekeeper_relid(GATEKEEPER_REL_SEGMENT, true);
		Relation	rel;
		TableScanDesc scan;
		HeapTuple	tuple;
		bool		isnull;
		bool		pushed = false;
		int16		segment;

		if (!OidIsValid(relid))
		{
			if (missing_ok)
				return 0;
			elog(ERROR, "table gatekeeper.segment is missing");
		}
		if (!ActiveSnapshotSet())
		{
			PushActiveSnapshot(GetTransactionSnapshot());
			pushed = true;
		}
		rel = table_open(relid, AccessShareLock);
		scan = table_beginscan(rel, GetActiveSnapshot(), 0, NULL);
		tuple = heap_getnext(scan, ForwardScanDirection);
		if (tuple == NULL)
			elog(ERROR, "table gatekeeper.segment is empty");
		segment = DatumGetInt16(heap_getattr(tuple, 1, RelationGetDescr(rel), &isnull));
		if (isnull || segment < 0 || segment > 3)
			elog(ERROR, "table gatekeeper.segment holds no segment");
		table_endscan(scan);
		table_close(rel, AccessShareLock);
		if (pushed)
			PopActiveSnapshot();
		cached = segment;
		cached_lxid = MyProc->lxid;
	}
	return cached;
}

/*
 * gatekeeper_segment
 *		_segment(): the retention segment new mail goes to.
 *
 * The default of gatekeeper.mail.segment falls back to it when the
 * setting below is not defined (the library not yet loaded in a session
 * where it is not preloaded); its call loads the library.
 */
Datum
gatekeeper_segment(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT16(gatekeeper_current_segment(false));
}

/*
 * gatekeeper_mail_init
 *		Install the executor hook below, in every process that loads the
 *		library.
 */
void
gatekeeper_mail_init(void)
{
	prev_executor_start = ExecutorStart_hook;
	ExecutorStart_hook = gatekeeper_mail_executor_start;
}

/*
 * With gatekeeper.on_duplicate = 'skip', an INSERT into gatekeeper.mail
 * with RETURNING (at the top or in a WITH) is refused before it runs: the
 * rows a statement skips are taken out by its statement trigger, after
 * RETURNING has already handed out their ids, and an application would
 * store mail that never exists.  Checked at every execution, not when the
 * statement is planned, since a prepared statement may run under either
 * setting.  gatekeeper.enqueue never skips (it returns the holder's id)
 * and runs its own insert under 'error'.
 */
static void
gatekeeper_mail_executor_start(QueryDesc *queryDesc, int eflags)
{
	if (gatekeeper_on_duplicate == GATEKEEPER_ON_DUPLICATE_SKIP &&
		(eflags & EXEC_FLAG_EXPLAIN_ONLY) == 0)
	{
		PlannedStmt *stmt = queryDesc->plannedstmt;
		bool		refuse = false;

		if (stmt->commandType == CMD_INSERT && stmt->hasReturning)
			refuse = inserts_mail_returning(stmt, stmt->planTree);
		if (!refuse && stmt->hasModifyingCTE)
		{
			ListCell   *lc;

			foreach(lc, stmt->subplans)
			{
				if (inserts_mail_returning(stmt, (Plan *) lfirst(lc)))
				{
					refuse = true;
					break;
				}
			}
		}
		if (refuse)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("INSERT into gatekeeper.mail with RETURNING is not supported when gatekeeper.on_duplicate is 'skip'"),
					 errdetail("RETURNING would give the ids of skipped rows, which never become mail."),
					 errhint("Leave out RETURNING and find the mail by its dedupe key with gatekeeper.find(), "
							 "or call gatekeeper.enqueue(), which returns the id of the mail holding the key.")));
	}

	if (prev_executor_start)
		prev_executor_start(queryDesc, eflags);
	else
		standard_ExecutorStart(queryDesc, eflags);
}

/*
 * Whether plan is an INSERT with RETURNING into gatekeeper.mail.  A
 * modifying statement is the top of its plan, or of its WITH's subplan.
 */
static bool
inserts_mail_returning(PlannedStmt *stmt, Plan *plan)
{
	ModifyTable *modify;
	Oid			mail;

	if (plan == NULL || !IsA(plan, ModifyTable))
		return false;
	modify = (ModifyTable *) plan;
	if (modify->operation != CMD_INSERT || modify->returningLists == NIL)
		return false;
	mail = gatekeeper_relid(GATEKEEPER_REL_MAIL, true);
	return OidIsValid(mail) &&
		rt_fetch(modify->nominalRelation, stmt->rtable)->relid == mail;
}
