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

#include "utils/builtins.h"

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
