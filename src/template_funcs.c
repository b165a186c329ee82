/*-------------------------------------------------------------------------
 *
 * template_funcs.c
 *		Templates as mail: a version's parts (subject, body, html, headers)
 *		checked when it is made, compiled once per process and rendered
 *		into a mail's content; and their SQL functions.
 *
 * A version of a template never changes once written (alter_template adds
 * the next), so each process keeps the versions it rendered compiled,
 * keyed by name and version.  drop_template followed by create_template
 * may give a name's version 1 other parts, so an entry is used only while
 * the parts the caller read are the ones it was compiled from; comparing
 * them costs a fraction of rendering them.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "template.h"
#include "template_funcs.h"
#include "catalog.h"
#include "gatekeeper.h"
#include "validate.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "storage/proc.h"
#include "utils/resowner.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"

/* compiled versions one process keeps before it starts again */
#define TEMPLATE_CACHE_MAX	256

typedef struct TemplateKey
{
	char		name[GATEKEEPER_TEMPLATE_NAME_MAX + 1];
	int32		version;
} TemplateKey;

/* a template version, compiled */
typedef struct TemplateEntry
{
	TemplateKey key;
	MemoryContext context;		/* everything below */
	text	   *subject_source;
	text	   *body_source;
	text	   *html_source;	/* NULL: no html part */
	Jsonb	   *headers_source; /* NULL: no headers */
	GatekeeperTemplate *subject;
	GatekeeperTemplate *body;
	GatekeeperTemplate *html;
	int			nheaders;
	char	  **header_names;
	GatekeeperTemplate **headers;
	LocalTransactionId read_in;	/* its parts were read from the table in
								 * this transaction (the claim's) */
} TemplateEntry;


/*
 * The parts of the template version a claimed mail names; $2 NULL: the
 * version a mail created at $3 keeps (gatekeeper._template_version).
 */
static SPIPlanPtr claimed_version_plan = NULL;
static const char claimed_version_sql[] =
"SELECT t.version, t.subject, t.body, t.html, t.headers FROM gatekeeper.template t "
" WHERE t.name = $1 AND t.version = coalesce($2, gatekeeper._template_version($1, $3))";

static HTAB *template_cache = NULL;
static MemoryContext template_cache_context = NULL;

static void compile_parts(TemplateEntry *entry, text *subject, text *body, text *html,
						  Jsonb *headers);
static TemplateEntry *compiled_version(const char *name, int32 version, text *subject,
									   text *body, text *html, Jsonb *headers);
static bool same_source(const void *a, const void *b);
static void render_mail(const TemplateEntry *entry, Jsonb *data, GatekeeperRenderedMail *result);
static void check_name(const char *name);
static TemplateEntry *claimed_version(const char *name, bool version_null, int32 version,
									  TimestampTz created_at);
static bool fails_alone(int sqlerrcode);

PG_FUNCTION_INFO_V1(gatekeeper_template_check);
PG_FUNCTION_INFO_V1(gatekeeper_template_render_sql);

/*
 * check_name
 *		A template's name: 1 to GATEKEEPER_TEMPLATE_NAME_MAX octets.
 */
static void
check_name(const char *name)
{
	size_t		len = strlen(name);

	if (len == 0 || len > GATEKEEPER_TEMPLATE_NAME_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("template name must have 1 to %d octets", GATEKEEPER_TEMPLATE_NAME_MAX),
				 errdetail("It has %zu.", len)));
}

/*
 * compile_parts
 *		Compile a version's parts into entry, in CurrentMemoryContext: 22023
 *		naming the part that does not parse, or whose subject or header
 *		would be no valid header before any name is filled in.
 */
static void
compile_parts(TemplateEntry *entry, text *subject, text *body, text *html, Jsonb *headers)
{
	char	   *subject_text = text_to_cstring(subject);

	gatekeeper_check_header_value(subject_text, "template subject");
	entry->subject = gatekeeper_template_compile(subject_text, strlen(subject_text),
												 "template subject");
	entry->body = gatekeeper_template_compile(VARDATA_ANY(body), VARSIZE_ANY_EXHDR(body),
											  "template body");
	entry->html = html == NULL ? NULL :
		gatekeeper_template_compile(VARDATA_ANY(html), VARSIZE_ANY_EXHDR(html),
									"template html");
	entry->nheaders = 0;
	if (headers != NULL)
	{
		JsonbIterator *it;
		JsonbValue	v;
		JsonbIteratorToken tok;
		int			n = JB_ROOT_COUNT(headers);

		(void) gatekeeper_check_headers(headers);
		entry->header_names = palloc(sizeof(char *) * Max(n, 1));
		entry->headers = palloc(sizeof(GatekeeperTemplate *) * Max(n, 1));
		it = JsonbIteratorInit(&headers->root);
		while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
		{
			if (tok == WJB_KEY)
				entry->header_names[entry->nheaders] =
					pnstrdup(v.val.string.val, v.val.string.len);
			else if (tok == WJB_VALUE)
			{
				entry->headers[entry->nheaders] =
					gatekeeper_template_compile(v.val.string.val, v.val.string.len,
												psprintf("template header \"%s\"",
														 entry->header_names[entry->nheaders]));
				entry->nheaders++;
			}
		}
	}
}

/*
 * same_source
 *		Are two varlenas (a text, a jsonb) the same octets?
 */
static bool
same_source(const void *a, const void *b)
{
	if (a == NULL || b == NULL)
		return a == b;
	return VARSIZE_ANY(a) == VARSIZE_ANY(b) &&
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

/*
 * compiled_version
 *		The compiled form of a template version whose parts are these: the
 *		one this process kept, or one compiled now and kept.
 */
static TemplateEntry *
compiled_version(const char *name, int32 version, text *subject, text *body, text *html,
				 Jsonb *headers)
{
	TemplateKey key;
	TemplateEntry *entry;
	TemplateEntry compiled;
	bool		found;
	MemoryContext old;

	check_name(name);
	if (template_cache == NULL ||
		hash_get_num_entries(template_cache) >= TEMPLATE_CACHE_MAX)
	{
		HASHCTL		ctl;

		if (template_cache_context == NULL)
			template_cache_context = AllocSetContextCreate(CacheMemoryContext,
														   "gatekeeper templates",
														   ALLOCSET_DEFAULT_SIZES);
		else
			MemoryContextReset(template_cache_context);
		memset(&ctl, 0, sizeof(ctl));
		ctl.keysize = sizeof(TemplateKey);
		ctl.entrysize = sizeof(TemplateEntry);
		ctl.hcxt = template_cache_context;
		template_cache = hash_create("gatekeeper templates", 64, &ctl,
									 HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}

	memset(&key, 0, sizeof(key));
	strlcpy(key.name, name, sizeof(key.name));
	key.version = version;
	entry = hash_search(template_cache, &key, HASH_FIND, NULL);
	if (entry != NULL)
	{
		if (same_source(entry->subject_source, subject) &&
			same_source(entry->body_source, body) &&
			same_source(entry->html_source, html) &&
			same_source(entry->headers_source, headers))
			return entry;
		MemoryContextDelete(entry->context);
		hash_search(template_cache, &key, HASH_REMOVE, NULL);
	}

	/*
	 * Compiled in a context of the transaction's, which an error frees, and
	 * kept only once it compiled.
	 */
	compiled.context = AllocSetContextCreate(CurrentMemoryContext, "gatekeeper template",
											 ALLOCSET_SMALL_SIZES);
	old = MemoryContextSwitchTo(compiled.context);
	compile_parts(&compiled, subject, body, html, headers);
	compiled.subject_source = (text *) datumCopy(PointerGetDatum(subject), false, -1);
	compiled.body_source = (text *) datumCopy(PointerGetDatum(body), false, -1);
	compiled.html_source = html == NULL ? NULL :
		(text *) datumCopy(PointerGetDatum(html), false, -1);
	compiled.headers_source = headers == NULL ? NULL :
		(Jsonb *) datumCopy(PointerGetDatum(headers), false, -1);
	MemoryContextSwitchTo(old);
	MemoryContextSetParent(compiled.context, template_cache_context);

	entry = hash_search(template_cache, &key, HASH_ENTER, &found);
	compiled.key = entry->key;
	compiled.read_in = InvalidLocalTransactionId;
	*entry = compiled;
	return entry;
}

/*
 * claimed_version
 *		The compiled template version a claimed mail names (version_null:
 *		the one its created_at gives it), read from gatekeeper.template
 *		once per transaction: no version a mail being claimed uses can
 *		change or go meanwhile (drop_template waits for the claim, then
 *		refuses).  42704 when there is no such version.
 */
static TemplateEntry *
claimed_version(const char *name, bool version_null, int32 version, TimestampTz created_at)
{
	Oid			types[3] = {TEXTOID, INT4OID, TIMESTAMPTZOID};
	Datum		args[3];
	char		nulls[3] = {' ', version_null ? 'n' : ' ', ' '};
	Datum		parts[5];
	bool		isnull[5];
	TemplateEntry *entry;
	int			k;

	if (!version_null && template_cache != NULL)
	{
		TemplateKey key;

		memset(&key, 0, sizeof(key));
		strlcpy(key.name, name, sizeof(key.name));
		key.version = version;
		entry = hash_search(template_cache, &key, HASH_FIND, NULL);
		if (entry != NULL && entry->read_in == MyProc->lxid)
			return entry;
	}

	args[0] = CStringGetTextDatum(name);
	args[1] = Int32GetDatum(version);
	args[2] = TimestampTzGetDatum(created_at);
	if (SPI_execute_plan(gatekeeper_plan(&claimed_version_plan, claimed_version_sql, 3, types),
						 args, nulls, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read template \"%s\"", name);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("template \"%s\" has no version %s", name,
						version_null ? "for the mail" : psprintf("%d", version))));
	for (k = 0; k < 5; k++)
		parts[k] = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, k + 1,
								 &isnull[k]);
	entry = compiled_version(name, DatumGetInt32(parts[0]), DatumGetTextPP(parts[1]),
							 DatumGetTextPP(parts[2]),
							 isnull[3] ? NULL : DatumGetTextPP(parts[3]),
							 isnull[4] ? NULL : DatumGetJsonbP(parts[4]));
	entry->read_in = MyProc->lxid;
	return entry;
}

/*
 * fails_alone
 *		Whether an error rendering a claimed mail is the mail's own (its
 *		data, its template, a limit it exceeds), which fails that mail,
 *		rather than the claim's (a cancel, memory, the server), which is
 *		raised.
 */
static bool
fails_alone(int sqlerrcode)
{
	int			category = ERRCODE_TO_CATEGORY(sqlerrcode);

	return category == ERRCODE_DATA_EXCEPTION ||
		category == ERRCODE_PROGRAM_LIMIT_EXCEEDED ||
		category == ERRCODE_SYNTAX_ERROR_OR_ACCESS_RULE_VIOLATION;
}

/*
 * gatekeeper_template_render_claimed
 *		A claimed templated mail's content, rendered into out (allocated in
 *		into) from the version it names (version_null: the one its
 *		created_at gives it) over its data; SPI must be connected.  Returns
 *		NULL, or, when the mail cannot be rendered (no such version, data
 *		that is no object, a rendered header with a line break, parts over
 *		gatekeeper.max_message_size), why: in a subtransaction, so that the
 *		claim fails that mail alone.
 */
char *
gatekeeper_template_render_claimed(const char *name, bool version_null, int32 version,
								   TimestampTz created_at, Jsonb *data,
								   GatekeeperRenderedMail *out, MemoryContext into)
{
	MemoryContext caller = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	char	   *volatile error = NULL;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(caller);
	PG_TRY();
	{
		TemplateEntry *entry = claimed_version(name, version_null, version, created_at);

		MemoryContextSwitchTo(into);
		render_mail(entry, data, out);
		MemoryContextSwitchTo(caller);
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(caller);
		CurrentResourceOwner = owner;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(caller);
		edata = CopyErrorData();
		if (!fails_alone(edata->sqlerrcode))
			PG_RE_THROW();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(caller);
		CurrentResourceOwner = owner;
		error = MemoryContextStrdup(into,
									psprintf("template \"%s\" could not be rendered: %s",
											 name, edata->message));
		FreeErrorData(edata);
	}
	PG_END_TRY();
	return error;
}

/*
 * render_mail
 *		A compiled version rendered over data (a JSON object, or NULL) into
 *		a mail's parts, together within gatekeeper.max_message_size: the
 *		subject and header values as text, then checked as enqueue checks
 *		them (no line breaks or control characters); the body as text; the
 *		html part with {{x}} HTML-escaped.
 */
static void
render_mail(const TemplateEntry *entry, Jsonb *data, GatekeeperRenderedMail *result)
{
	StringInfoData buf;
	Size		left = (Size) gatekeeper_max_message_size;
	char	   *subject;

	if (data != NULL && (!JB_ROOT_IS_OBJECT(data) || JB_ROOT_IS_SCALAR(data)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("template data must be a JSON object")));

	initStringInfo(&buf);
	gatekeeper_template_render(entry->subject, data, GATEKEEPER_TEMPLATE_TEXT, &buf, left,
							   "subject");
	subject = pstrdup(buf.data);
	gatekeeper_check_header_value(subject, "rendered subject");
	result->subject = cstring_to_text_with_len(buf.data, buf.len);
	left -= buf.len;

	resetStringInfo(&buf);
	gatekeeper_template_render(entry->body, data, GATEKEEPER_TEMPLATE_TEXT, &buf, left,
							   "body");
	result->body = cstring_to_text_with_len(buf.data, buf.len);
	left -= buf.len;

	result->html = NULL;
	if (entry->html != NULL)
	{
		resetStringInfo(&buf);
		gatekeeper_template_render(entry->html, data, GATEKEEPER_TEMPLATE_HTML, &buf, left,
								   "html");
		result->html = cstring_to_text_with_len(buf.data, buf.len);
		left -= buf.len;
	}

	result->headers = NULL;
	if (entry->nheaders > 0)
	{
		JsonbParseState *state = NULL;
		JsonbValue	v;
		JsonbValue *object;
		int			i;

		pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
		for (i = 0; i < entry->nheaders; i++)
		{
			char	   *what = psprintf("header \"%s\"", entry->header_names[i]);
			Size		name_len = strlen(entry->header_names[i]);

			if (name_len > left)
				ereport(ERROR,
						(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
						 errmsg("rendered %s is larger than gatekeeper.max_message_size", what)));
			left -= name_len;
			resetStringInfo(&buf);
			gatekeeper_template_render(entry->headers[i], data, GATEKEEPER_TEMPLATE_TEXT,
									   &buf, left, what);
			gatekeeper_check_header_value(buf.data, psprintf("rendered %s", what));
			left -= buf.len;

			v.type = jbvString;
			v.val.string.val = entry->header_names[i];
			v.val.string.len = name_len;
			pushJsonbValue(&state, WJB_KEY, &v);
			v.type = jbvString;
			v.val.string.val = pnstrdup(buf.data, buf.len);
			v.val.string.len = buf.len;
			pushJsonbValue(&state, WJB_VALUE, &v);
		}
		object = pushJsonbValue(&state, WJB_END_OBJECT, NULL);
		result->headers = JsonbValueToJsonb(object);
	}
	pfree(buf.data);
}

/*
 * gatekeeper._template_check(name text, subject text, body text, html text,
 *							  headers jsonb) RETURNS void
 *		Refuse a template version that cannot be made: NULL where a part is
 *		required (22004), a name too long or empty, or a part that does not
 *		parse (22023, with the position), parts together larger than
 *		gatekeeper.max_message_size (54000).
 */
Datum
gatekeeper_template_check(PG_FUNCTION_ARGS)
{
	TemplateEntry entry;
	text	   *html = PG_ARGISNULL(3) ? NULL : PG_GETARG_TEXT_PP(3);
	Jsonb	   *headers = PG_ARGISNULL(4) ? NULL : PG_GETARG_JSONB_P(4);
	Size		size;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("template name must not be null")));
	if (PG_ARGISNULL(1) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("template subject and body must not be null")));
	check_name(text_to_cstring(PG_GETARG_TEXT_PP(0)));

	size = VARSIZE_ANY_EXHDR(PG_GETARG_TEXT_PP(1)) + VARSIZE_ANY_EXHDR(PG_GETARG_TEXT_PP(2)) +
		(html ? VARSIZE_ANY_EXHDR(html) : 0) + (headers ? VARSIZE(headers) : 0);
	if (size > (Size) gatekeeper_max_message_size)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("template is larger than gatekeeper.max_message_size"),
				 errdetail("Its parts have %zu octets; the limit is %d.",
						   size, gatekeeper_max_message_size)));

	memset(&entry, 0, sizeof(entry));
	compile_parts(&entry, PG_GETARG_TEXT_PP(1), PG_GETARG_TEXT_PP(2), html, headers);
	PG_RETURN_VOID();
}

/*
 * gatekeeper._render(name text, version int, subject text, body text,
 *					  html text, headers jsonb, data jsonb,
 *					  OUT subject text, OUT body text, OUT html text,
 *					  OUT headers jsonb)
 *		A template version (its parts as read from gatekeeper.template)
 *		rendered over data: what render() shows and the claim sends.
 */
Datum
gatekeeper_template_render_sql(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};
	TemplateEntry *entry;
	GatekeeperRenderedMail mail;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2) || PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("template name, version, subject and body must not be null")));
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	entry = compiled_version(text_to_cstring(PG_GETARG_TEXT_PP(0)), PG_GETARG_INT32(1),
							 PG_GETARG_TEXT_PP(2), PG_GETARG_TEXT_PP(3),
							 PG_ARGISNULL(4) ? NULL : PG_GETARG_TEXT_PP(4),
							 PG_ARGISNULL(5) ? NULL : PG_GETARG_JSONB_P(5));
	render_mail(entry, PG_ARGISNULL(6) ? NULL : PG_GETARG_JSONB_P(6), &mail);

	values[0] = PointerGetDatum(mail.subject);
	values[1] = PointerGetDatum(mail.body);
	if (mail.html != NULL)
		values[2] = PointerGetDatum(mail.html);
	else
		nulls[2] = true;
	if (mail.headers != NULL)
		values[3] = JsonbPGetDatum(mail.headers);
	else
		nulls[3] = true;
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}
