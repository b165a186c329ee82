/*-------------------------------------------------------------------------
 *
 * validate.c
 *		Address and header validation for mail entering the queue.
 *
 * Everything an application hands us ends up in an SMTP envelope or a
 * message header, so each check here closes a door: an address that a
 * relay would reject or misread, a CR or LF that would let a value start
 * a header of its own (header injection), a header name that would
 * override one gatekeeper writes itself.
 *
 * Each function raises an error with a documented SQLSTATE and returns
 * only when its input is acceptable.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "validate.h"

#include "datatype/timestamp.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

/* RFC 5322 recommends at most 78 characters a line; a name this long is absurd */
#define MAX_HEADER_NAME 76

/*
 * What src/message.c can always fold into lines of at most 998 octets
 * (RFC 5322 2.1.1): a word kept whole (in angle brackets) of at most
 * GATEKEEPER_HEADER_WORD_MAX octets, next to at most
 * GATEKEEPER_HEADER_SPACE_MAX spaces and tabs in a row.  Longer words
 * outside angle brackets are written as encoded-words, which fold
 * anywhere.
 */
#define MAX_HEADER_SPACE GATEKEEPER_HEADER_SPACE_MAX

/*
 * Header names gatekeeper writes itself, or that the relay and the reader's
 * side add: a user's header may not replace or repeat them.  This is the
 * one list; src/message.c asks gatekeeper_header_reserved() too, so what
 * enqueue refuses and what the builder skips cannot drift apart.  Compared
 * case-insensitively; every name beginning "Content-" is reserved as well
 * (the MIME structure is gatekeeper's).
 */
static const char *const reserved_headers[] = {
	"bcc",
	"cc",
	"date",
	"from",
	"message-id",
	"mime-version",
	"received",
	"return-path",
	"sender",
	"subject",
	"to",
	NULL
};

#define RESERVED_PREFIX "content-"

/*
 * gatekeeper_check_header_value
 *		A subject or header value: text without control characters, that
 *		src/message.c can write in lines of at most 998 octets, with
 *		nothing in angle brackets that would have to be encoded.
 *
 * A CR or LF would let the value start a header of its own; other control
 * characters (C0 but tab, DEL, C1) have no business in a header and some
 * software acts on them.  An angle-bracketed word ("<https://...>", a
 * message ID) is written as it is: RFC 2047 allows no encoded-word there,
 * so it must be printable ASCII, and it cannot be folded, so it must fit
 * a line.
 */
void
gatekeeper_check_header_value(const char *value, const char *what)
{
	const unsigned char *p;
	int			space = 0;

	if (strpbrk(value, "\r\n") != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not contain a line break", what),
				 errdetail("A CR or LF in a header value could inject headers.")));

	for (p = (const unsigned char *) value; *p; p++)
	{
		bool		control = (*p < 0x20 && *p != '\t') || *p == 0x7f ||
			(*p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f);

		if (control)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s must not contain control characters", what),
					 errdetail("It holds U+%04X at octet %d.",
							   *p == 0xc2 ? p[1] : *p,
							   (int) (p - (const unsigned char *) value) + 1)));

		if (*p == ' ' || *p == '\t')
		{
			if (++space > MAX_HEADER_SPACE)
				ereport(ERROR,
						(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
						 errmsg("%s has more than %d spaces and tabs in a row",
								what, MAX_HEADER_SPACE),
						 errdetail("Such a run cannot always be folded into header lines of at most 998 octets.")));
		}
		else
			space = 0;
	}

	/* words in angle brackets */
	p = (const unsigned char *) value;
	while (*p)
	{
		const unsigned char *word;
		size_t		len;
		size_t		i;

		while (*p == ' ' || *p == '\t')
			p++;
		word = p;
		while (*p && *p != ' ' && *p != '\t')
			p++;
		len = p - word;
		if (len < 2 || word[0] != '<' || word[len - 1] != '>')
			continue;

		for (i = 0; i < len; i++)
		{
			if (word[i] > 0x7e)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("%s must hold only ASCII in angle brackets", what),
						 errdetail("Text in angle brackets (an address, a URL, a message ID) cannot be encoded for mail."),
						 errhint("Percent-encode URLs and write domains in their ASCII (punycode) form.")));
		}
		if (len > GATEKEEPER_HEADER_WORD_MAX)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("%s holds %zu octets in angle brackets without a space, more than %d",
							what, len, GATEKEEPER_HEADER_WORD_MAX),
					 errdetail("Text in angle brackets cannot be folded, and a header line may not exceed 998 octets.")));
	}
}

/*
 * gatekeeper_header_reserved
 *		Is name (any case) a header gatekeeper owns: one of reserved_headers
 *		or a Content-* header?
 */
bool
gatekeeper_header_reserved(const char *name)
{
	const char *const *reserved;

	if (pg_strncasecmp(name, RESERVED_PREFIX, strlen(RESERVED_PREFIX)) == 0)
		return true;
	for (reserved = reserved_headers; *reserved; reserved++)
	{
		if (pg_strcasecmp(name, *reserved) == 0)
			return true;
	}
	return false;
}

/*
 * gatekeeper_check_header_name
 *		RFC 5322 field name (printable ASCII but ':'), not one of ours.
 */
void
gatekeeper_check_header_name(const char *name)
{
	const char *p;

	if (*name == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("header name must not be empty")));
	if (strlen(name) > MAX_HEADER_NAME)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("header name \"%.40s...\" is too long", name),
				 errdetail("Header names may have at most %d characters.", MAX_HEADER_NAME)));
	for (p = name; *p; p++)
	{
		unsigned char c = (unsigned char) *p;

		if (c < 33 || c > 126 || c == ':')
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid header name \"%s\"", name),
					 errdetail("Header names may hold only printable ASCII characters other than colon.")));

		/*
		 * RFC 5322 allows braces in a field name, but no name needs them,
		 * and a name must not look as if it could hold a placeholder: only
		 * values do.
		 */
		if (c == '{' || c == '}')
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid header name \"%s\"", name),
					 errdetail("Header names may not hold braces: placeholders such as %s are filled in header values only.",
							   GATEKEEPER_MESSAGE_ID_PLACEHOLDER)));
	}
	if (gatekeeper_header_reserved(name))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("header \"%s\" is set by gatekeeper", name),
				 errdetail("From, To, Subject, Date, Message-ID and the MIME (Content-*) headers are written by gatekeeper itself."),
				 errhint("Use the sender and subject arguments for From and Subject.")));
}

/*
 * Order header names case-insensitively, for qsort.
 */
static int
header_name_cmp(const void *a, const void *b)
{
	return pg_strcasecmp(*(char *const *) a, *(char *const *) b);
}

/*
 * gatekeeper_placeholder_find
 *		The first GATEKEEPER_MESSAGE_ID_PLACEHOLDER in the len octets at s,
 *		or NULL.  The one reading of placeholders: enqueue counts them with
 *		it, and the claim fills them in, left to right without overlapping.
 */
const char *
gatekeeper_placeholder_find(const char *s, int len)
{
	const int	plen = strlen(GATEKEEPER_MESSAGE_ID_PLACEHOLDER);
	const char *end = s + len;

	while (end - s >= plen)
	{
		const char *brace = memchr(s, '{', end - s - plen + 1);

		if (brace == NULL)
			break;
		if (memcmp(brace, GATEKEEPER_MESSAGE_ID_PLACEHOLDER, plen) == 0)
			return brace;
		s = brace + 1;
	}
	return NULL;
}

/*
 * How many placeholders the len octets at s hold.
 */
static int
count_placeholders(const char *s, int len)
{
	const int	plen = strlen(GATEKEEPER_MESSAGE_ID_PLACEHOLDER);
	const char *end = s + len;
	const char *at;
	int			n = 0;

	while ((at = gatekeeper_placeholder_find(s, end - s)) != NULL)
	{
		n++;
		s = at + plen;
	}
	return n;
}

/*
 * gatekeeper_headers_placeholders
 *		How many placeholders the claim fills in the values of headers (a
 *		JSON object; anything else holds none).
 */
int
gatekeeper_headers_placeholders(Jsonb *headers)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	int			n = 0;

	if (!JB_ROOT_IS_OBJECT(headers) || JB_ROOT_IS_SCALAR(headers))
		return 0;
	it = JsonbIteratorInit(&headers->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_VALUE && v.type == jbvString)
			n += count_placeholders(v.val.string.val, v.val.string.len);
	}
	return n;
}

/*
 * gatekeeper_check_headers
 *		The user's headers: a JSON object of valid, unreserved header names
 *		to valid values, no name given twice (JSON keys are distinct, but
 *		header names are compared in any case: "Reply-To" and "reply-to"
 *		would be two Reply-To fields).  Returns how many placeholders the
 *		values hold, for the size check.
 */
int
gatekeeper_check_headers(Jsonb *headers)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	char	   *name = NULL;
	char	  **names;
	int			n = 0;
	int			placeholders = 0;
	int			i;

	if (!JB_ROOT_IS_OBJECT(headers) || JB_ROOT_IS_SCALAR(headers))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("headers must be a JSON object of header names to strings")));

	names = palloc(sizeof(char *) * Max(JB_ROOT_COUNT(headers), 1));
	it = JsonbIteratorInit(&headers->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
		{
			name = pnstrdup(v.val.string.val, v.val.string.len);
			gatekeeper_check_header_name(name);
			names[n++] = name;
		}
		else if (tok == WJB_VALUE)
		{
			char	   *value;

			if (v.type != jbvString)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("value of header \"%s\" must be a string", name)));
			value = pnstrdup(v.val.string.val, v.val.string.len);
			gatekeeper_check_header_value(value, "header value");
			pfree(value);
			placeholders += count_placeholders(v.val.string.val, v.val.string.len);
		}
	}

	qsort(names, n, sizeof(char *), header_name_cmp);
	for (i = 1; i < n; i++)
	{
		if (pg_strcasecmp(names[i - 1], names[i]) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("header \"%s\" is given twice, as \"%s\" and \"%s\"",
							names[i], names[i - 1], names[i]),
					 errdetail("Header names are compared without regard to case.")));
	}
	for (i = 0; i < n; i++)
		pfree(names[i]);
	pfree(names);
	return placeholders;
}

/*
 * The bounds of each kind of duration an argument may give.  A kind's
 * range is documented in the README's SQLSTATE table and SPEC.
 */
typedef struct DurationKind
{
	const char *name;			/* the argument, as errors name it */
	int64		lo;				/* shortest, microseconds */
	int64		hi;				/* longest, microseconds */
	const char *range;			/* the same in words, for the error */
} DurationKind;

#define USECS_PER_YEAR	((int64) (DAYS_PER_YEAR * USECS_PER_DAY))

static const DurationKind duration_kinds[] = {
	{"period", USECS_PER_SEC, 10 * USECS_PER_YEAR, "1 second and 10 years"},
	{"dedupe_window", USECS_PER_SEC, 10 * USECS_PER_YEAR, "1 second and 10 years"},
	{"lease", 1000, 7 * USECS_PER_DAY, "1 millisecond and 7 days"},
	{"delay", 0, 10 * USECS_PER_YEAR, "0 and 10 years"},
	{"retry_for", 0, 10 * USECS_PER_YEAR, "0 and 10 years"},
	{NULL, 0, 0, NULL}
};

/*
 * gatekeeper_check_duration
 *		Normalise an interval of the named kind to the length it stands for,
 *		or raise 22023 when that length is outside the kind's bounds.
 *
 * The length is what extract(epoch) counts (a month is 30 days, a year
 * 365.25 days), and the result holds it in microseconds alone, with no
 * months or days: adding it to a timestamp then moves the timestamp by
 * exactly that much whatever the date and time zone, so '-1 mon +31 days'
 * is one day long on every day of the year, never zero or negative, and
 * no bounded value can overflow a timestamp computation.
 */
Interval *
gatekeeper_check_duration(const Interval *value, const char *kind)
{
	const DurationKind *k;
	long double usecs;
	Interval   *result;

	for (k = duration_kinds; k->name != NULL; k++)
		if (strcmp(k->name, kind) == 0)
			break;
	if (k->name == NULL)
		elog(ERROR, "unknown kind of duration \"%s\"", kind);

	usecs = (long double) value->time +
		(long double) value->day * USECS_PER_DAY +
		(long double) (value->month / MONTHS_PER_YEAR) * USECS_PER_YEAR +
		(long double) (value->month % MONTHS_PER_YEAR) * DAYS_PER_MONTH * USECS_PER_DAY;
	if (usecs < k->lo || usecs > k->hi)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be between %s", k->name, k->range),
				 errdetail("%s was %s.", k->name,
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   IntervalPGetDatum(value)))),
				 strcmp(k->name, "dedupe_window") == 0 ?
				 errhint("A dedupe_window of 0 holds a key only while its mail is scheduled or claimed.") : 0));

	result = palloc0(sizeof(Interval));
	result->time = (int64) usecs;
	return result;
}

PG_FUNCTION_INFO_V1(gatekeeper_duration);

/*
 * gatekeeper._duration(value interval, kind text) RETURNS interval
 *		gatekeeper_check_duration for the SQL functions; NULL stays NULL
 *		(STRICT), as alter_queue and alter_gate read NULL as "unchanged".
 */
Datum
gatekeeper_duration(PG_FUNCTION_ARGS)
{
	Interval   *value = PG_GETARG_INTERVAL_P(0);
	char	   *kind = text_to_cstring(PG_GETARG_TEXT_PP(1));

	PG_RETURN_INTERVAL_P(gatekeeper_check_duration(value, kind));
}
