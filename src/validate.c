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
#include "gatekeeper.h"

#include "datatype/timestamp.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

/* RFC 5321 limits */
#define MAX_LOCAL_PART	64
#define MAX_ADDRESS		254
#define MAX_LABEL		63

/* RFC 5322 recommends at most 78 characters a line; a name this long is absurd */
#define MAX_HEADER_NAME 76

/*
 * Header names gatekeeper writes itself; a user's header may not replace
 * them.  Compared case-insensitively.
 */
static const char *const owned_headers[] = {
	"bcc",
	"cc",
	"content-disposition",
	"content-transfer-encoding",
	"content-type",
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

/*
 * atext of RFC 5322 section 3.2.3: the characters of a dot-atom.
 */
static bool
is_atext(unsigned char c)
{
	if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
		return true;
	return strchr("!#$%&'*+-/=?^_`{|}~", c) != NULL && c != '\0';
}

/*
 * Raise the error for an invalid address, saying why.
 */
static void
invalid_address(const char *address, const char *what, const char *why)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("invalid %s address \"%s\"", what, address),
			 errdetail("%s", why)));
}

/*
 * gatekeeper_check_address
 *		Accept a bare mailbox "local@domain": a dot-atom local part and a
 *		domain of letter-digit-hyphen labels, within RFC 5321's lengths.
 *
 * Quoted local parts, domain literals and display names are refused: no
 * relay we hand mail to needs them, and every one of them has been a
 * source of parser disagreements.
 */
void
gatekeeper_check_address(const char *address, const char *what)
{
	const char *at;
	const char *p;
	size_t		len = strlen(address);
	size_t		label = 0;

	for (p = address; *p; p++)
	{
		if (*p == '\r' || *p == '\n')
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s address must not contain a line break", what),
					 errdetail("A CR or LF in an address could inject headers or SMTP commands.")));
	}

	if (len == 0)
		invalid_address(address, what, "The address is empty.");
	if (len > MAX_ADDRESS)
		invalid_address(address, what, "The address is longer than 254 characters.");

	at = strrchr(address, '@');
	if (at == NULL)
		invalid_address(address, what, "The address has no \"@\".");
	if (at == address)
		invalid_address(address, what, "The local part before \"@\" is empty.");
	if (at - address > MAX_LOCAL_PART)
		invalid_address(address, what, "The local part is longer than 64 characters.");

	/* local part: dot-atom */
	for (p = address; p < at; p++)
	{
		if (*p == '.')
		{
			if (p == address || p + 1 == at || p[1] == '.')
				invalid_address(address, what,
								"The local part has a leading, trailing or doubled dot.");
		}
		else if (!is_atext((unsigned char) *p))
			invalid_address(address, what,
							"The local part may hold only letters, digits, dots and !#$%&'*+-/=?^_`{|}~.");
	}

	/* domain: LDH labels separated by single dots */
	p = at + 1;
	if (*p == '\0')
		invalid_address(address, what, "The domain after \"@\" is empty.");
	for (; *p; p++)
	{
		unsigned char c = (unsigned char) *p;

		if (c == '.')
		{
			if (label == 0 || p[1] == '\0')
				invalid_address(address, what, "The domain has an empty label.");
			if (p[-1] == '-')
				invalid_address(address, what, "A domain label ends with a hyphen.");
			label = 0;
			continue;
		}
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			  (c >= '0' && c <= '9') || c == '-'))
			invalid_address(address, what,
							"The domain may hold only letters, digits, hyphens and dots.");
		if (c == '-' && label == 0)
			invalid_address(address, what, "A domain label starts with a hyphen.");
		if (++label > MAX_LABEL)
			invalid_address(address, what, "A domain label is longer than 63 characters.");
	}
	if (p[-1] == '-')
		invalid_address(address, what, "A domain label ends with a hyphen.");
}

/*
 * gatekeeper_check_header_value
 *		A subject or header value may hold any text but line breaks (and
 *		NUL, which text cannot hold anyway).
 */
void
gatekeeper_check_header_value(const char *value, const char *what)
{
	if (strpbrk(value, "\r\n") != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not contain a line break", what),
				 errdetail("A CR or LF in a header value could inject headers.")));
}

/*
 * gatekeeper_check_header_name
 *		RFC 5322 field name (printable ASCII but ':'), not one of ours.
 */
void
gatekeeper_check_header_name(const char *name)
{
	const char *p;
	const char *const *owned;

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
	}
	for (owned = owned_headers; *owned; owned++)
	{
		if (pg_strcasecmp(name, *owned) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("header \"%s\" is set by gatekeeper", name),
					 errdetail("From, To, Subject, Date, Message-ID and the MIME headers are written by gatekeeper itself."),
					 errhint("Use the sender and subject arguments for From and Subject.")));
	}
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
															   IntervalPGetDatum(value))))));

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
