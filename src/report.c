/*-------------------------------------------------------------------------
 *
 * report.c
 *		After the relay said 250: the VERP token that names a mail in its
 *		envelope, gatekeeper.ingest_report() for the DSNs and feedback
 *		reports that come back, and gatekeeper.record_event() for an ESP's
 *		webhook.
 *
 * A VERP token names one mail: the mail's id and the first 80 bits of an
 * HMAC-SHA256 of it under the secret that signs the unsubscribe tokens
 * (src/unsubscribe.c; the signed data starts with "gatekeeper verp", so
 * that neither kind of token can stand for the other), in lower-case
 * base32 (RFC 4648, no padding): 29 letters and digits, which survive an
 * MTA that lower-cases the local part, and fit it with room to spare.  A
 * queue's return_path carries it in the envelope sender
 * ('bounces+{token}@bounce.example'), and every mail carries it as the
 * DSN's ENVID, so a DSN names its mail by the address it is delivered to
 * or by its Original-Envelope-Id.  Failing both, a report names its mail
 * by the returned Message-ID, which gatekeeper writes as
 * <id.created@domain>: the id is read from it, and the whole must equal
 * the sent mail's.
 *
 * A report counts only when it names a mail gatekeeper sent and, where it
 * names a recipient (Final-Recipient or Original-Recipient, Original-Rcpt-To,
 * a webhook's recipient), that mail's recipient: gatekeeper._report()
 * checks both and writes the event and the suppression it calls for.
 * Anything else writes nothing and is counted as ignored
 * (gatekeeper.report_stats).  The parse itself (src/report_parse.c) raises
 * no error for what a message holds: a junk message gives no row and
 * leaves the caller's transaction alone.
 *
 * IDENTIFICATION
 *		src/report.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/tuplestore.h"

#include "gatekeeper.h"
#include "report.h"
#include "report_parse.h"
#include "stats.h"
#include "unsubscribe.h"

PG_FUNCTION_INFO_V1(gatekeeper_verp_token);
PG_FUNCTION_INFO_V1(gatekeeper_check_return_path);
PG_FUNCTION_INFO_V1(gatekeeper_ingest_report);
PG_FUNCTION_INFO_V1(gatekeeper_record_event);

#define VERP_MAC_LEN		10
#define VERP_RAW_LEN		(8 + VERP_MAC_LEN)
#define TOKEN_PLACEHOLDER	"{token}"

/* the largest message ingest_report() reads (54000 beyond) */
#define REPORT_MAX_MESSAGE	(64 * 1024 * 1024)

/* return_path lookups remembered per transaction */
#define RETURN_PATH_CACHE	16

static const char base32_digits[] = "abcdefghijklmnopqrstuvwxyz234567";
static const char verp_context[16] = "gatekeeper verp";

static SPIPlanPtr return_path_plan = NULL;
static const char return_path_sql[] =
"SELECT q.return_path FROM gatekeeper.queue q WHERE q.name = $1";

static SPIPlanPtr report_plan = NULL;
static const char report_sql[] =
"SELECT r.mail_id, r.recipient, r.event, r.status, r.detail "
"  FROM gatekeeper._report($1, $2, $3, $4, $5, $6, $7) r";

/* the return paths this transaction looked up */
static struct
{
	char		queue[NAMEDATALEN * 2];
	char	   *return_path;	/* in TopTransactionContext, or NULL */
}			return_paths[RETURN_PATH_CACHE];
static int	nreturn_paths = 0;
static LocalTransactionId return_paths_lxid = InvalidLocalTransactionId;

static void verp_mac(int64 id, uint8 *mac);
static char *verp_token(int64 id);
static bool verp_verify(const char *token, size_t len, int64 *id);
static bool token_in(const char *text, int64 *id);
static bool message_id_mail(const char *message_id, int64 *id);
static int	report_rows(int64 id, const char *message_id, const char *recipient1,
						const char *recipient2, const char *event, const char *status,
						const char *detail, const char *source, Tuplestorestate *out,
						TupleDesc desc);

/*
 * The first VERP_MAC_LEN bytes of the HMAC of a mail id, into mac.
 */
static void
verp_mac(int64 id, uint8 *mac)
{
	uint8		data[sizeof(verp_context) + 8];
	uint8		full[32];
	int			i;

	memcpy(data, verp_context, sizeof(verp_context));
	for (i = 0; i < 8; i++)
		data[sizeof(verp_context) + i] = (uint8) (((uint64) id) >> (56 - 8 * i));
	gatekeeper_token_sign(data, sizeof(data), full);
	memcpy(mac, full, VERP_MAC_LEN);
}

/*
 * The VERP token of a mail id.  SPI must be connected.
 */
static char *
verp_token(int64 id)
{
	uint8		raw[VERP_RAW_LEN];
	char	   *out = palloc(GATEKEEPER_VERP_TOKEN_LEN + 1);
	uint32		acc = 0;
	int			bits = 0;
	int			o = 0;
	int			i;

	for (i = 0; i < 8; i++)
		raw[i] = (uint8) (((uint64) id) >> (56 - 8 * i));
	verp_mac(id, raw + 8);
	for (i = 0; i < VERP_RAW_LEN; i++)
	{
		acc = (acc << 8) | raw[i];
		bits += 8;
		while (bits >= 5)
		{
			bits -= 5;
			out[o++] = base32_digits[(acc >> bits) & 31];
		}
	}
	if (bits > 0)
		out[o++] = base32_digits[(acc << (5 - bits)) & 31];
	out[o] = '\0';
	Assert(o == GATEKEEPER_VERP_TOKEN_LEN);
	return out;
}

/*
 * Whether len characters at token are a VERP token this database signed
 * (letters in either case); *id is then its mail.  The MAC is compared in
 * constant time.  SPI must be connected.
 */
static bool
verp_verify(const char *token, size_t len, int64 *id)
{
	uint8		raw[VERP_RAW_LEN + 1];
	uint8		mac[VERP_MAC_LEN];
	uint32		acc = 0;
	int			bits = 0;
	int			o = 0;
	uint64		v = 0;
	size_t		i;

	if (len != GATEKEEPER_VERP_TOKEN_LEN)
		return false;
	for (i = 0; i < len; i++)
	{
		const char *d = memchr(base32_digits, pg_ascii_tolower((unsigned char) token[i]), 32);

		if (d == NULL || token[i] == '\0')
			return false;
		acc = (acc << 5) | (uint32) (d - base32_digits);
		bits += 5;
		if (bits >= 8)
		{
			bits -= 8;
			raw[o++] = (acc >> bits) & 0xff;
		}
	}
	/* the bits past the last byte are zero in a token we wrote */
	if (o != VERP_RAW_LEN || (acc & ((1 << bits) - 1)) != 0)
		return false;
	for (i = 0; i < 8; i++)
		v = (v << 8) | raw[i];
	verp_mac((int64) v, mac);
	if (timingsafe_bcmp(mac, raw + 8, VERP_MAC_LEN) != 0)
		return false;
	*id = (int64) v;
	return true;
}

/*
 * Whether text (an address, or an ENVID) holds a valid VERP token as one
 * of the words of its local part (words are set apart by + - = . _ or
 * the part's ends); *id is then its mail.
 */
static bool
token_in(const char *text, int64 *id)
{
	const char *p = text;
	const char *at;
	const char *end;

	if (text == NULL)
		return false;
	at = strrchr(text, '@');
	end = at ? at : text + strlen(text);
	while (p < end)
	{
		size_t		n = 0;

		while (p + n < end && strchr("+-=._", p[n]) == NULL)
			n++;
		if (verp_verify(p, n, id))
			return true;
		p += n + 1;
	}
	return false;
}

/*
 * Whether message_id has the form of one gatekeeper writes,
 * <id.created@domain>; *id is then the id it names.
 */
static bool
message_id_mail(const char *message_id, int64 *id)
{
	const char *p = message_id;
	int64		v = 0;
	int			digits = 0;

	if (p == NULL || *p != '<')
		return false;
	for (p++; isdigit((unsigned char) *p); p++)
	{
		if (++digits > 18)
			return false;
		v = v * 10 + (*p - '0');
	}
	if (digits == 0 || *p != '.' || strchr(p, '@') == NULL)
		return false;
	*id = v;
	return true;
}

/*
 * Ask gatekeeper._report() to record one report about mail id, and put
 * the row it recorded, if any, into out.  Returns the rows recorded.
 */
static int
report_rows(int64 id, const char *message_id, const char *recipient1,
			const char *recipient2, const char *event, const char *status,
			const char *detail, const char *source, Tuplestorestate *out,
			TupleDesc desc)
{
	Oid			argtypes[7] = {INT8OID, TEXTOID, TEXTARRAYOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID};
	Datum		args[7];
	char		nulls[7] = {' ', ' ', ' ', ' ', ' ', ' ', ' '};
	Datum		recipients[2];
	bool		rnulls[2];
	int			ret;
	uint64		i;

	args[0] = Int64GetDatum(id);
	if (message_id)
		args[1] = CStringGetTextDatum(message_id);
	else
		nulls[1] = 'n';
	rnulls[0] = recipient1 == NULL;
	recipients[0] = recipient1 ? CStringGetTextDatum(recipient1) : (Datum) 0;
	rnulls[1] = recipient2 == NULL;
	recipients[1] = recipient2 ? CStringGetTextDatum(recipient2) : (Datum) 0;
	args[2] = gatekeeper_array(recipients, rnulls, 2, TEXTOID);
	args[3] = CStringGetTextDatum(event);
	if (status)
		args[4] = CStringGetTextDatum(status);
	else
		nulls[4] = 'n';
	if (detail)
		args[5] = CStringGetTextDatum(detail);
	else
		nulls[5] = 'n';
	args[6] = CStringGetTextDatum(source);

	ret = SPI_execute_plan(gatekeeper_plan(&report_plan, report_sql, 7, argtypes),
						   args, nulls, false, 0);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "gatekeeper._report() failed: %s", SPI_result_code_string(ret));
	for (i = 0; out != NULL && i < SPI_processed; i++)
	{
		Datum		values[5];
		bool		isnull[5];
		int			c;

		for (c = 0; c < 5; c++)
			values[c] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, c + 1,
									  &isnull[c]);
		tuplestore_putvalues(out, desc, values, isnull);
	}
	ret = (int) SPI_processed;
	SPI_freetuptable(SPI_tuptable);
	return ret;
}

/*
 * gatekeeper_report_envelope
 *		The envelope sender and VERP token of a mail: see report.h.
 */
char *
gatekeeper_report_envelope(const char *queue, int64 mail_id, char **token)
{
	MemoryContext caller = CurrentMemoryContext;
	char	   *template = NULL;
	char	   *result = NULL;
	bool		found = false;
	bool		pushed = false;
	int			i;

	/* the worker builds messages in a transaction with no snapshot yet */
	if (!ActiveSnapshotSet())
	{
		PushActiveSnapshot(GetTransactionSnapshot());
		pushed = true;
	}
	SPI_connect();
	if (return_paths_lxid != MyProc->lxid)
	{
		nreturn_paths = 0;
		return_paths_lxid = MyProc->lxid;
	}
	for (i = 0; i < nreturn_paths; i++)
	{
		if (strcmp(return_paths[i].queue, queue) == 0)
		{
			template = return_paths[i].return_path;
			found = true;
			break;
		}
	}
	if (!found)
	{
		Oid			argtype = TEXTOID;
		Datum		arg = CStringGetTextDatum(queue);
		bool		isnull = true;
		Datum		v = (Datum) 0;

		if (SPI_execute_plan(gatekeeper_plan(&return_path_plan, return_path_sql, 1, &argtype),
							 &arg, NULL, true, 1) != SPI_OK_SELECT)
			elog(ERROR, "reading the return_path of queue \"%s\" failed", queue);
		if (SPI_processed == 1)
			v = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		if (!isnull)
			template = MemoryContextStrdup(TopTransactionContext, TextDatumGetCString(v));
		if (nreturn_paths < RETURN_PATH_CACHE && strlen(queue) < sizeof(return_paths[0].queue))
		{
			strlcpy(return_paths[nreturn_paths].queue, queue, sizeof(return_paths[0].queue));
			return_paths[nreturn_paths].return_path = template;
			nreturn_paths++;
		}
	}

	{
		MemoryContext old = MemoryContextSwitchTo(caller);
		const char *at;

		*token = verp_token(mail_id);
		if (template != NULL)
		{
			at = strstr(template, TOKEN_PLACEHOLDER);
			if (at == NULL)
				result = pstrdup(template);
			else
				result = psprintf("%.*s%s%s", (int) (at - template), template, *token,
								  at + strlen(TOKEN_PLACEHOLDER));
		}
		MemoryContextSwitchTo(old);
	}
	SPI_finish();
	if (pushed)
		PopActiveSnapshot();
	return result;
}

/*
 * gatekeeper._verp_token(mail_id bigint) RETURNS text
 *		The token the worker puts in the mail's envelope (for tests, and for
 *		an operator checking a bounce address).
 */
Datum
gatekeeper_verp_token(PG_FUNCTION_ARGS)
{
	MemoryContext caller = CurrentMemoryContext;
	text	   *result;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("mail_id must not be null")));
	SPI_connect();
	result = (text *) MemoryContextAlloc(caller, VARHDRSZ + GATEKEEPER_VERP_TOKEN_LEN);
	SET_VARSIZE(result, VARHDRSZ + GATEKEEPER_VERP_TOKEN_LEN);
	memcpy(VARDATA(result), verp_token(PG_GETARG_INT64(0)), GATEKEEPER_VERP_TOKEN_LEN);
	SPI_finish();
	PG_RETURN_TEXT_P(result);
}

/*
 * gatekeeper._check_return_path(value text) RETURNS void
 *		Raise 22023 unless value (NULL: none) can be a queue's return_path:
 *		an address once {token} is replaced, {token} at most once, in the
 *		local part, as a word of its own (set apart by + - = . _ or the
 *		part's ends); 54000 when the local part or the address would be too
 *		long for SMTP (64 and 254 octets).
 */
Datum
gatekeeper_check_return_path(PG_FUNCTION_ARGS)
{
	char	   *value;
	const char *token;
	const char *at;
	const char *problem;
	char		sample[GATEKEEPER_VERP_TOKEN_LEN + 1];
	char	   *expanded;
	size_t		local_len;

	if (PG_ARGISNULL(0))
		PG_RETURN_VOID();
	value = text_to_cstring(PG_GETARG_TEXT_PP(0));
	at = strrchr(value, '@');
	token = strstr(value, TOKEN_PLACEHOLDER);
	if (token != NULL && strstr(token + 1, TOKEN_PLACEHOLDER) != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid return_path \"%s\"", value),
				 errdetail("{token} may appear at most once.")));
	if (token != NULL &&
		(at == NULL || token > at ||
		 (token > value && strchr("+-=._", token[-1]) == NULL) ||
		 strchr("+-=._@", token[strlen(TOKEN_PLACEHOLDER)]) == NULL))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid return_path \"%s\"", value),
				 errdetail("{token} must be a word of the local part of its own, set apart by one of + - = . _ or the local part's ends."),
				 errhint("Write it as 'bounces+{token}@bounce.example.com'.")));

	memset(sample, 'a', GATEKEEPER_VERP_TOKEN_LEN);
	sample[GATEKEEPER_VERP_TOKEN_LEN] = '\0';
	if (token != NULL)
		expanded = psprintf("%.*s%s%s", (int) (token - value), value, sample,
							token + strlen(TOKEN_PLACEHOLDER));
	else
		expanded = value;
	problem = gatekeeper_address_problem(expanded);
	if (problem != NULL || strchr(expanded, '<') != NULL || strchr(expanded, ' ') != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid return_path \"%s\"", value),
				 errdetail("%s", problem ? problem : "The return path must be a bare address.")));
	at = strrchr(expanded, '@');
	local_len = at ? (size_t) (at - expanded) : strlen(expanded);
	if (local_len > 64 || strlen(expanded) > 254)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("return_path \"%s\" is too long", value),
				 errdetail("With its token the local part has %d octets and the address %d; SMTP allows 64 and 254.",
						   (int) local_len, (int) strlen(expanded))));
	PG_RETURN_VOID();
}

/*
 * gatekeeper.ingest_report(message text, envelope_to text DEFAULT NULL)
 *		RETURNS TABLE (mail_id bigint, recipient text, event text,
 *					   status text, detail text)
 *		Read one raw message as the bounce mailbox received it: a DSN gives
 *		one row per recipient group that names a mail gatekeeper sent to
 *		that recipient; an ARF abuse report one complaint.  Anything else
 *		gives no row and writes nothing.  22004 for a NULL message, 54000
 *		for one over 64 MB; no other error comes of what it holds.
 */
Datum
gatekeeper_ingest_report(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	MemoryContext cxt;
	MemoryContext old;
	text	   *message;
	char	   *envelope_to = NULL;
	ParsedReport r;
	int64		id = 0;
	bool		have_mail = false;
	const char *message_id = NULL;
	int			rows = 0;
	int			i;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("message must not be null")));
	message = PG_GETARG_TEXT_PP(0);
	if (VARSIZE_ANY_EXHDR(message) > REPORT_MAX_MESSAGE)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("report is too large"),
				 errdetail("The message has %zu octets; ingest_report() reads at most %d.",
						   (size_t) VARSIZE_ANY_EXHDR(message), REPORT_MAX_MESSAGE)));
	InitMaterializedSRF(fcinfo, 0);

	cxt = AllocSetContextCreate(CurrentMemoryContext, "gatekeeper report",
								ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(cxt);
	if (!PG_ARGISNULL(1))
	{
		text	   *t = PG_GETARG_TEXT_PP(1);

		if (VARSIZE_ANY_EXHDR(t) <= 1000)
			envelope_to = report_clean(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t));
	}
	report_parse(VARDATA_ANY(message), VARSIZE_ANY_EXHDR(message), &r);

	SPI_connect();
	if (r.kind != REPORT_NONE)
	{
		/* the mail: by a token where the report carries one, else by Message-ID */
		const char *carriers[7];

		carriers[0] = envelope_to;
		carriers[1] = r.envid;
		carriers[2] = r.delivered_to[0];
		carriers[3] = r.delivered_to[1];
		carriers[4] = r.delivered_to[2];
		carriers[5] = r.original_mail_from;
		carriers[6] = r.returned_return_path;
		for (i = 0; i < (int) lengthof(carriers) && !have_mail; i++)
			have_mail = token_in(carriers[i], &id);
		if (!have_mail && message_id_mail(r.returned_message_id, &id))
		{
			have_mail = true;
			message_id = r.returned_message_id;
		}
	}
	if (have_mail && r.kind == REPORT_DSN)
	{
		for (i = 0; i < r.nrecipients; i++)
		{
			ReportRecipient *rr = &r.recipients[i];
			const char *event = NULL;

			if (rr->action == NULL)
				continue;
			if (strcmp(rr->action, "failed") == 0)
				event = "bounced";
			else if (strcmp(rr->action, "delayed") == 0)
				event = "deferred";
			else if (strcmp(rr->action, "delivered") == 0 ||
					 strcmp(rr->action, "relayed") == 0 ||
					 strcmp(rr->action, "expanded") == 0)
				event = "delivered";
			else
				continue;
			/* a group that names no recipient names none we sent to */
			if (rr->final_recipient == NULL && rr->original_recipient == NULL)
				continue;
			rows += report_rows(id, message_id, rr->final_recipient, rr->original_recipient,
								event, rr->status, rr->diagnostic, "dsn",
								rsinfo->setResult, rsinfo->setDesc);
		}
	}
	else if (have_mail && r.kind == REPORT_ARF &&
			 (strcmp(r.feedback_type, "abuse") == 0 ||
			  strcmp(r.feedback_type, "fraud") == 0 ||
			  strcmp(r.feedback_type, "virus") == 0))
	{
		char	   *detail = psprintf("Feedback-Type: %s%s%s", r.feedback_type,
									  r.user_agent ? "; User-Agent: " : "",
									  r.user_agent ? r.user_agent : "");

		rows += report_rows(id, message_id, r.original_rcpt_to, NULL, "complained",
							NULL, detail, "arf", rsinfo->setResult, rsinfo->setDesc);
	}
	gatekeeper_stats_count_report(rows > 0);
	SPI_finish();
	MemoryContextSwitchTo(old);
	MemoryContextDelete(cxt);
	return (Datum) 0;
}

/*
 * gatekeeper.record_event(message_id text, event text, status text,
 *						   detail text, recipient text) RETURNS bigint
 *		Record an ESP webhook's event for the sent mail whose Message-ID
 *		(with or without its angle brackets) is message_id, and whose
 *		recipient is recipient when given: its id, or NULL (and nothing
 *		written) when there is no such mail.  event is deferred, bounced,
 *		delivered or complained (22023 otherwise); message_id and event
 *		must not be NULL (22004).
 */
Datum
gatekeeper_record_event(PG_FUNCTION_ARGS)
{
	static const char *const events[] = {"deferred", "bounced", "delivered", "complained"};
	char	   *event;
	char	   *message_id = NULL;
	char	   *status = NULL;
	char	   *detail = NULL;
	char	   *recipient = NULL;
	int64		id;
	int			rows = 0;
	int			i;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("message_id and event must not be null")));
	event = text_to_cstring(PG_GETARG_TEXT_PP(1));
	for (i = 0; i < (int) lengthof(events); i++)
		if (strcmp(event, events[i]) == 0)
			break;
	if (i == (int) lengthof(events))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid event \"%s\"", event),
				 errdetail("event must be deferred, bounced, delivered or complained.")));

	{
		text	   *t = PG_GETARG_TEXT_PP(0);
		char	   *v = report_clean(VARDATA_ANY(t), Min(VARSIZE_ANY_EXHDR(t), 1000));

		if (v != NULL && v[0] != '<')
			message_id = psprintf("<%s>", v);
		else
			message_id = v;
	}
	if (!PG_ARGISNULL(2))
	{
		text	   *t = PG_GETARG_TEXT_PP(2);

		status = report_clean(VARDATA_ANY(t), Min(VARSIZE_ANY_EXHDR(t), 64));
	}
	if (!PG_ARGISNULL(3))
	{
		text	   *t = PG_GETARG_TEXT_PP(3);

		detail = report_clean(VARDATA_ANY(t), Min(VARSIZE_ANY_EXHDR(t), 4000));
	}
	if (!PG_ARGISNULL(4))
	{
		text	   *t = PG_GETARG_TEXT_PP(4);

		recipient = report_clean(VARDATA_ANY(t), Min(VARSIZE_ANY_EXHDR(t), 1000));
	}

	SPI_connect();
	if (message_id_mail(message_id, &id))
		rows = report_rows(id, message_id, recipient, NULL, event, status, detail,
						   "webhook", NULL, NULL);
	gatekeeper_stats_count_report(rows > 0);
	SPI_finish();
	if (rows == 0)
		PG_RETURN_NULL();
	PG_RETURN_INT64(id);
}
