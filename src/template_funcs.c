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
#include "unsubscribe.h"
#include "validate.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/itemptr.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/tuplestore.h"

/* compiled versions (and names' lists of versions) one process keeps */
#define TEMPLATE_CACHE_MAX	256

typedef struct TemplateKey
{
	char		name[GATEKEEPER_TEMPLATE_NAME_MAX + 1];
	int32		version;
} TemplateKey;

/* which row of gatekeeper.template a version was read from */
typedef struct TemplateRow
{
	TransactionId xmin;
	ItemPointerData ctid;
} TemplateRow;

/* a template version, compiled */
typedef struct TemplateEntry
{
	TemplateKey key;
	TemplateRow row;			/* the row it was compiled from */
	MemoryContext context;		/* everything below */
	GatekeeperTemplate *subject;
	GatekeeperTemplate *body;
	GatekeeperTemplate *html;
	int			nheaders;
	char	  **header_names;
	GatekeeperTemplate **headers;
	Size		body_hint;		/* the last body and html rendered, and an */
	Size		html_hint;		/* eighth: what the next is given at first */
} TemplateEntry;

/* one version of a name, as a read of gatekeeper.template saw it */
typedef struct TemplateVersion
{
	int32		version;
	TimestampTz created_at;
	TemplateRow row;
	struct TemplateEntry *compiled; /* its compiled copy when last looked
									 * up (compiled_version checks it) */
} TemplateVersion;

/*
 * When a name's versions were read: a claim's rendering reads them once
 * per claim statement (kind 'c': the command that claimed), render() once
 * per snapshot (kind 's': the snapshot's command, xmin, xmax and the
 * transactions it sees as running, whose xids TemplateVersions keeps).
 * Nothing a read saw can have changed while the key is the same.  Kind
 * '\0': read at every call.
 */
typedef struct ReadKey
{
	char		kind;
	LocalTransactionId lxid;
	CommandId	cid;
	TransactionId xmin;
	TransactionId xmax;
	uint32		xcnt;
} ReadKey;

/* a name's versions, in order */
typedef struct TemplateVersions
{
	char		name[GATEKEEPER_TEMPLATE_NAME_MAX + 1];
	ReadKey		read;
	TransactionId *xip;			/* kind 's': the snapshot's running xids */
	uint32		xip_size;
	int			nversions;
	TemplateVersion *versions;
} TemplateVersions;

/*
 * A name's versions, without their parts (no TOAST is read): which
 * version a mail keeps, and whether the compiled copy is of the row.
 */
static SPIPlanPtr template_versions_plan = NULL;
static const char template_versions_sql[] =
"SELECT t.version, t.created_at, t.xmin, t.ctid FROM gatekeeper.template t "
" WHERE t.name = $1 ORDER BY t.version";

/* a version's parts, to compile them */
static SPIPlanPtr template_parts_plan = NULL;
static const char template_parts_sql[] =
"SELECT t.subject, t.body, t.html, t.headers, t.xmin, t.ctid FROM gatekeeper.template t "
" WHERE t.name = $1 AND t.version = $2";

static HTAB *template_cache = NULL;
static HTAB *versions_cache = NULL;
static MemoryContext template_cache_context = NULL;
static TemplateVersions *last_versions = NULL;
static TupleDesc render_desc = NULL;

static void compile_parts(TemplateEntry *entry, text *subject, text *body, text *html,
						  Jsonb *headers);
static void open_caches(void);
static TemplateVersions *read_versions(const char *name, const ReadKey *key,
									   const TransactionId *xip, bool read_only);
static TemplateVersion *find_version(const TemplateVersions *versions,
									 bool version_null, int32 version,
									 TimestampTz created_at);
static TemplateEntry *compiled_version(const char *name, TemplateVersion *v,
									   bool read_only);
static text *render_part(const GatekeeperTemplate *template, Jsonb *data,
						 GatekeeperTemplateMode mode, Size *left, Size *hint,
						 const char *what);
static void render_mail(TemplateEntry *entry, Jsonb *data, GatekeeperRenderedMail *result);
static void check_name(const char *name);
static bool fails_alone(int sqlerrcode);

PG_FUNCTION_INFO_V1(gatekeeper_template_check);
PG_FUNCTION_INFO_V1(gatekeeper_render);

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
	entry->body_hint = VARSIZE_ANY_EXHDR(body);
	entry->html_hint = html == NULL ? 0 : VARSIZE_ANY_EXHDR(html);
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
 * open_caches
 *		The process's caches of compiled versions and of names' versions,
 *		made at first use and emptied when they hold TEMPLATE_CACHE_MAX
 *		entries.
 */
static void
open_caches(void)
{
	HASHCTL		ctl;

	if (template_cache != NULL &&
		hash_get_num_entries(template_cache) < TEMPLATE_CACHE_MAX &&
		hash_get_num_entries(versions_cache) < TEMPLATE_CACHE_MAX)
		return;
	if (template_cache_context == NULL)
		template_cache_context = AllocSetContextCreate(CacheMemoryContext,
													   "gatekeeper templates",
													   ALLOCSET_DEFAULT_SIZES);
	else
		MemoryContextReset(template_cache_context);
	last_versions = NULL;
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(TemplateKey);
	ctl.entrysize = sizeof(TemplateEntry);
	ctl.hcxt = template_cache_context;
	template_cache = hash_create("gatekeeper templates", 64, &ctl,
								 HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = GATEKEEPER_TEMPLATE_NAME_MAX + 1;
	ctl.entrysize = sizeof(TemplateVersions);
	ctl.hcxt = template_cache_context;
	versions_cache = hash_create("gatekeeper template versions", 64, &ctl,
								 HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
}

/*
 * read_versions
 *		A name's versions as key says to read them: those kept, when the
 *		same key read them, or read now (read_only: with the active
 *		snapshot; else with a new one, which sees at least what the claim
 *		statement before it saw).  None: the name has no version.
 */
static TemplateVersions *
read_versions(const char *name, const ReadKey *key, const TransactionId *xip,
			  bool read_only)
{
	TemplateVersions *versions;
	Oid			type = TEXTOID;
	Datum		arg;
	bool		found;
	uint64		i;

	if (last_versions != NULL && strcmp(last_versions->name, name) == 0)
		versions = last_versions;
	else
	{
		check_name(name);
		open_caches();
		versions = hash_search(versions_cache, name, HASH_ENTER, &found);
		if (!found)
		{
			memset(&versions->read, 0, sizeof(ReadKey));
			versions->xip = NULL;
			versions->xip_size = 0;
			versions->nversions = 0;
			versions->versions = NULL;
		}
		last_versions = versions;
	}
	if (key->kind != '\0' && memcmp(&versions->read, key, sizeof(ReadKey)) == 0 &&
		(key->xcnt == 0 || memcmp(versions->xip, xip, sizeof(TransactionId) * key->xcnt) == 0))
		return versions;

	SPI_connect();
	arg = CStringGetTextDatum(name);
	if (SPI_execute_plan(gatekeeper_plan(&template_versions_plan, template_versions_sql, 1, &type),
						 &arg, NULL, read_only, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read the versions of template \"%s\"", name);
	if (versions->versions != NULL)
		pfree(versions->versions);
	versions->versions = NULL;
	versions->read.kind = '\0';
	versions->nversions = (int) SPI_processed;
	if (SPI_processed > 0)
		versions->versions = MemoryContextAlloc(template_cache_context,
												sizeof(TemplateVersion) * SPI_processed);
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		TemplateVersion *v = &versions->versions[i];
		bool		isnull;

		v->version = DatumGetInt32(SPI_getbinval(tuple, desc, 1, &isnull));
		v->created_at = DatumGetTimestampTz(SPI_getbinval(tuple, desc, 2, &isnull));
		v->row.xmin = DatumGetTransactionId(SPI_getbinval(tuple, desc, 3, &isnull));
		ItemPointerCopy((ItemPointer) DatumGetPointer(SPI_getbinval(tuple, desc, 4, &isnull)),
						&v->row.ctid);
		v->compiled = NULL;
	}
	SPI_finish();
	if (key->xcnt > versions->xip_size)
	{
		if (versions->xip != NULL)
			pfree(versions->xip);
		versions->xip = MemoryContextAlloc(template_cache_context,
										   sizeof(TransactionId) * key->xcnt);
		versions->xip_size = key->xcnt;
	}
	if (key->xcnt > 0)
		memcpy(versions->xip, xip, sizeof(TransactionId) * key->xcnt);
	versions->read = *key;

	/*
	 * A read with a new snapshot began with a new command id (the claim's
	 * had written): the claim's later mails see that one.
	 */
	if (!read_only)
		versions->read.cid = GetCurrentCommandId(false);
	return versions;
}

/*
 * find_version
 *		The version named (version_null: the one a mail created at
 *		created_at keeps, gatekeeper._template_version's: the latest made
 *		at or before it, else the first), or NULL.
 */
static TemplateVersion *
find_version(const TemplateVersions *versions, bool version_null, int32 version,
			 TimestampTz created_at)
{
	TemplateVersion *latest = NULL;
	int			i;

	if (versions->nversions == 0)
		return NULL;
	if (!version_null)
	{
		for (i = 0; i < versions->nversions; i++)
			if (versions->versions[i].version == version)
				return &versions->versions[i];
		return NULL;
	}
	for (i = 0; i < versions->nversions; i++)
		if (versions->versions[i].created_at <= created_at)
			latest = &versions->versions[i];
	return latest != NULL ? latest : &versions->versions[0];
}

/*
 * compiled_version
 *		The compiled form of version v of name: the one this process kept,
 *		when it was compiled from v's row, or one compiled now from the row
 *		(read_only as read_versions) and kept.  A version is never changed
 *		once written, so the row's identity (its xmin and ctid) says
 *		whether the copy is still the version's: a template dropped and
 *		made again has new rows.
 */
static TemplateEntry *
compiled_version(const char *name, TemplateVersion *v, bool read_only)
{
	TemplateKey key;
	TemplateEntry *entry;
	TemplateEntry compiled;
	bool		found;
	MemoryContext old;
	Oid			types[2] = {TEXTOID, INT4OID};
	Datum		args[2];
	Datum		parts[6];
	bool		isnull[6];
	int			k;
	text	   *subject;
	text	   *body;
	text	   *html;
	Jsonb	   *headers;

	/*
	 * The entry the version was last found compiled in: a removed entry's
	 * memory stays the table's (its free list), and emptying the caches
	 * frees the versions too.
	 */
	entry = v->compiled;
	if (entry != NULL && entry->key.version == v->version &&
		TransactionIdEquals(entry->row.xmin, v->row.xmin) &&
		ItemPointerEquals(&entry->row.ctid, &v->row.ctid) &&
		strcmp(entry->key.name, name) == 0)
		return entry;

	/* read_versions made the caches (and emptied them when full) */
	Assert(template_cache != NULL);
	memset(&key, 0, sizeof(key));
	strlcpy(key.name, name, sizeof(key.name));
	key.version = v->version;
	entry = hash_search(template_cache, &key, HASH_FIND, NULL);
	if (entry != NULL)
	{
		if (TransactionIdEquals(entry->row.xmin, v->row.xmin) &&
			ItemPointerEquals(&entry->row.ctid, &v->row.ctid))
		{
			v->compiled = entry;
			return entry;
		}
		MemoryContextDelete(entry->context);
		hash_search(template_cache, &key, HASH_REMOVE, NULL);
	}

	SPI_connect();
	args[0] = CStringGetTextDatum(name);
	args[1] = Int32GetDatum(v->version);
	if (SPI_execute_plan(gatekeeper_plan(&template_parts_plan, template_parts_sql, 2, types),
						 args, NULL, read_only, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read template \"%s\"", name);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("template \"%s\" has no version %d", name, v->version)));
	for (k = 0; k < 6; k++)
		parts[k] = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, k + 1,
								 &isnull[k]);

	/*
	 * Compiled in a context of the transaction's, which an error frees, and
	 * kept only once it compiled.
	 */
	subject = DatumGetTextPP(parts[0]);
	body = DatumGetTextPP(parts[1]);
	html = isnull[2] ? NULL : DatumGetTextPP(parts[2]);
	headers = isnull[3] ? NULL : DatumGetJsonbP(parts[3]);
	memset(&compiled, 0, sizeof(compiled));
	compiled.context = AllocSetContextCreate(CurrentMemoryContext, "gatekeeper template",
											 ALLOCSET_SMALL_SIZES);
	old = MemoryContextSwitchTo(compiled.context);
	compile_parts(&compiled, subject, body, html, headers);
	MemoryContextSwitchTo(old);
	compiled.row.xmin = DatumGetTransactionId(parts[4]);
	ItemPointerCopy((ItemPointer) DatumGetPointer(parts[5]), &compiled.row.ctid);
	MemoryContextSetParent(compiled.context, template_cache_context);
	SPI_finish();

	entry = hash_search(template_cache, &key, HASH_ENTER, &found);
	compiled.key = entry->key;
	*entry = compiled;
	v->compiled = entry;
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
 *		created_at gives it) over its data, after the claim statement.
 *		Returns NULL, or, when the mail cannot be rendered (no such
 *		version, data that is no object, a rendered header with a line
 *		break, parts over gatekeeper.max_message_size), why, so that the
 *		claim fails that mail alone.
 *
 * The template's versions are read once per claim, and a version compiled
 * once per process; per mail there is no SPI and no catalog lookup.  No
 * subtransaction either: once the version is found and compiled (outside
 * the PG_TRY, whose errors are the claim's), rendering only reads the
 * mail's data, copied into memory by the claim, and the process's compiled
 * copy, and writes into into: it holds no buffer, lock or relation, so an
 * error of the mail's own (fails_alone) leaves nothing to release but
 * memory, and any other is raised.
 */
char *
gatekeeper_template_render_claimed(const char *name, bool version_null, int32 version,
								   TimestampTz created_at, Jsonb *data,
								   GatekeeperRenderedMail *out, MemoryContext into)
{
	MemoryContext caller = CurrentMemoryContext;
	char	   *volatile error = NULL;
	TemplateVersions *versions;
	TemplateVersion *v;
	TemplateEntry *entry;
	ReadKey		key;

	memset(&key, 0, sizeof(key));
	key.kind = 'c';
	key.lxid = MyProc->lxid;
	key.cid = GetCurrentCommandId(false);
	versions = read_versions(name, &key, NULL, false);
	v = find_version(versions, version_null, version, created_at);
	if (v == NULL)
		return MemoryContextStrdup(into,
								   psprintf("template \"%s\" could not be rendered: template \"%s\" has no version %s",
											name, name,
											version_null ? "for the mail" : psprintf("%d", version)));
	entry = compiled_version(name, v, false);

	PG_TRY();
	{
		MemoryContextSwitchTo(into);
		render_mail(entry, data, out);
		MemoryContextSwitchTo(caller);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(caller);
		edata = CopyErrorData();
		if (!fails_alone(edata->sqlerrcode))
			PG_RE_THROW();
		FlushErrorState();
		error = MemoryContextStrdup(into,
									psprintf("template \"%s\" could not be rendered: %s",
											 name, edata->message));
		FreeErrorData(edata);
	}
	PG_END_TRY();
	return error;
}

/*
 * gatekeeper_template_headers_merge
 *		A templated mail's headers: the template's rendered header values
 *		but those whose name the mail's own headers (own) give, in any case,
 *		then the mail's own.  So the mail's value wins, and no name is
 *		handed to a claimer twice in different case.
 */
Jsonb *
gatekeeper_template_headers_merge(Jsonb *rendered, Jsonb *own)
{
	JsonbParseState *state = NULL;
	JsonbIterator *it;
	JsonbIteratorToken tok;
	JsonbValue	v;
	JsonbValue *object = NULL;
	bool		skip = false;
	Datum		merged;

	it = JsonbIteratorInit(&rendered->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
		{
			char	   *name = pnstrdup(v.val.string.val, v.val.string.len);

			skip = gatekeeper_headers_have(own, name);
			pfree(name);
		}
		if (skip && (tok == WJB_KEY || tok == WJB_VALUE))
			continue;
		object = pushJsonbValue(&state, tok,
								tok == WJB_KEY || tok == WJB_VALUE ? &v : NULL);
	}
	merged = DirectFunctionCall2(jsonb_concat, JsonbPGetDatum(JsonbValueToJsonb(object)),
								 JsonbPGetDatum(own));
	return DatumGetJsonbP(merged);
}

/*
 * render_part
 *		One part rendered as a text, in CurrentMemoryContext, within the
 *		*left octets the mail has left (which it takes from); its buffer is
 *		first given *hint octets, the last rendering of the part and an
 *		eighth (a campaign's mails are of a size), so that it is seldom
 *		enlarged and copied.
 */
static text *
render_part(const GatekeeperTemplate *template, Jsonb *data, GatekeeperTemplateMode mode,
			Size *left, Size *hint, const char *what)
{
	StringInfoData buf;
	text	   *result;

	buf.maxlen = (int) Min(*hint + VARHDRSZ + 1, (Size) MaxAllocSize);
	buf.data = palloc(buf.maxlen);
	buf.len = VARHDRSZ;
	buf.data[buf.len] = '\0';
	buf.cursor = 0;
	gatekeeper_template_render(template, data, mode, &buf, *left, what);
	result = (text *) buf.data;
	SET_VARSIZE(result, buf.len);
	*left -= buf.len - VARHDRSZ;
	*hint = (buf.len - VARHDRSZ) + (buf.len - VARHDRSZ) / 8;
	return result;
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
render_mail(TemplateEntry *entry, Jsonb *data, GatekeeperRenderedMail *result)
{
	Size		left = (Size) gatekeeper_max_message_size;
	Size		subject_hint = 256;

	if (data != NULL && (!JB_ROOT_IS_OBJECT(data) || JB_ROOT_IS_SCALAR(data)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("template data must be a JSON object")));

	/* a text's data is followed by the NUL the renderer keeps */
	result->subject = render_part(entry->subject, data, GATEKEEPER_TEMPLATE_TEXT, &left,
								  &subject_hint, "subject");
	gatekeeper_check_header_value(VARDATA(result->subject), "rendered subject");
	result->body = render_part(entry->body, data, GATEKEEPER_TEMPLATE_TEXT, &left,
							   &entry->body_hint, "body");
	result->html = entry->html == NULL ? NULL :
		render_part(entry->html, data, GATEKEEPER_TEMPLATE_HTML, &left, &entry->html_hint,
					"html");

	result->headers = NULL;
	if (entry->nheaders > 0)
	{
		JsonbParseState *state = NULL;
		StringInfoData buf;
		JsonbValue	v;
		JsonbValue *object;
		int			i;

		initStringInfo(&buf);
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
		pfree(buf.data);
	}
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
 * gatekeeper.render(template text, data jsonb, version int DEFAULT NULL)
 *		RETURNS TABLE (subject text, body text, html text, headers jsonb)
 *		A template's latest version (or the one named) rendered over data,
 *		exactly as the claim renders it: one row, 42704 when there is no
 *		such template or version.  The versions are read once per snapshot
 *		and a version compiled once per process, so that a statement
 *		rendering a campaign reads the template once.
 */
Datum
gatekeeper_render(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	char	   *name;
	bool		version_null = PG_ARGISNULL(2);
	int32		version = version_null ? 0 : PG_GETARG_INT32(2);
	TemplateVersions *versions;
	TemplateVersion *v;
	TemplateEntry *entry;
	GatekeeperRenderedMail mail;
	ReadKey		key;
	Snapshot	snapshot;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};
	MemoryContext old;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("template must not be null")));
	if (rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo) ||
		(rsinfo->allowedModes & SFRM_Materialize) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("set-valued function called in context that cannot accept a set")));
	name = text_to_cstring(PG_GETARG_TEXT_PP(0));

	/* the snapshot's key: what it sees (a standby's: read at every call) */
	memset(&key, 0, sizeof(key));
	snapshot = ActiveSnapshotSet() ? GetActiveSnapshot() : NULL;
	if (snapshot != NULL && snapshot->snapshot_type == SNAPSHOT_MVCC &&
		!snapshot->takenDuringRecovery)
	{
		key.kind = 's';
		key.lxid = MyProc->lxid;
		key.cid = snapshot->curcid;
		key.xmin = snapshot->xmin;
		key.xmax = snapshot->xmax;
		key.xcnt = snapshot->xcnt;
	}
	versions = read_versions(name, &key, snapshot != NULL ? snapshot->xip : NULL, true);
	if (version_null && versions->nversions > 0)
		v = &versions->versions[versions->nversions - 1];
	else
		v = find_version(versions, false, version, 0);
	if (v == NULL && version_null)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("template \"%s\" does not exist", name)));
	if (v == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("template \"%s\" has no version %d", name, version)));
	entry = compiled_version(name, v, true);

	render_mail(entry, PG_ARGISNULL(1) ? NULL : PG_GETARG_JSONB_P(1), &mail);

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

	if (render_desc == NULL)
	{
		TupleDesc	desc;

		old = MemoryContextSwitchTo(TopMemoryContext);
		desc = CreateTemplateTupleDesc(4);
		TupleDescInitEntry(desc, (AttrNumber) 1, "subject", TEXTOID, -1, 0);
		TupleDescInitEntry(desc, (AttrNumber) 2, "body", TEXTOID, -1, 0);
		TupleDescInitEntry(desc, (AttrNumber) 3, "html", TEXTOID, -1, 0);
		TupleDescInitEntry(desc, (AttrNumber) 4, "headers", JSONBOID, -1, 0);
		render_desc = desc;
		MemoryContextSwitchTo(old);
	}
	old = MemoryContextSwitchTo(rsinfo->econtext->ecxt_per_query_memory);
	rsinfo->returnMode = SFRM_Materialize;
	rsinfo->setResult = tuplestore_begin_heap(false, false, work_mem);
	rsinfo->setDesc = CreateTupleDescCopy(render_desc);
	tuplestore_putvalues(rsinfo->setResult, render_desc, values, nulls);
	MemoryContextSwitchTo(old);
	PG_RETURN_NULL();
}
