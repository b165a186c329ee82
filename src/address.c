/*-------------------------------------------------------------------------
 *
 * address.c
 *		Addresses, in one place: bare addresses (checked, keyed, compared)
 *		and mailboxes with display names.
 *
 * A bare address is "local@domain" with a dot-atom local part and a
 * domain of letter-digit-hyphen labels (gatekeeper_address_problem); the
 * gates and the suppression list key it with ASCII letters lower-cased
 * (gatekeeper_recipient_key), and a report's recipient is compared the
 * same way (gatekeeper_same_address).
 *
 * A sender (a mail's sender, gatekeeper.default_sender) may be a bare
 * address or a display name and an address, "Shop Émile <shop@example.com>";
 * a mail's recipient_name is the display name of its To.  The envelope
 * (MAIL FROM, RCPT TO) and the Message-ID's domain use the bare address;
 * the From and To fields show the name, written as an RFC 5322
 * quoted-string when it is ASCII and as RFC 2047 encoded-words when it is
 * not.  A name holds no control character (a CR or LF would inject
 * headers) and at most GATEKEEPER_NAME_MAX octets, so that a quoted name
 * and the longest address always fit a header line.
 *
 * IDENTIFICATION
 *		src/address.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/builtins.h"

#include "address.h"

/* RFC 5321 limits */
#define MAX_LOCAL_PART	64
#define MAX_ADDRESS		254
#define MAX_LABEL		63

/* RFC 2047 2: an encoded-word is at most 75 characters */
#define ENCODED_WORD_MAX	75
#define ENCODED_PREFIX		"=?UTF-8?B?"
#define ENCODED_SUFFIX		"?="
/* a line is kept to 78 characters where it can be (RFC 5322 2.1.1) */
#define LINE_SOFT_MAX		78

static const char base64_digits[] =
"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

PG_FUNCTION_INFO_V1(gatekeeper_address_key);
PG_FUNCTION_INFO_V1(gatekeeper_mailbox);

static bool is_atext(unsigned char c);
static const char *name_problem(const char *name);
static char *trim(const char *s, int len);
static int	utf8_len(const unsigned char *s, int remaining);
static void append_base64(StringInfo buf, const unsigned char *in, int len);

/* ------------------------------------------------------------ bare addresses */

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
 * gatekeeper_address_problem
 *		Why address is not a bare mailbox "local@domain" as gatekeeper
 *		accepts it, as a full sentence; NULL when it is one.
 *
 * A dot-atom local part and a domain of letter-digit-hyphen labels,
 * within RFC 5321's lengths.  Quoted local parts, domain literals and
 * display names are refused: no relay we hand mail to needs them, and
 * every one of them has been a source of parser disagreements.  Raises no
 * error, so that a setting's check hook can use it.
 */
const char *
gatekeeper_address_problem(const char *address)
{
	const char *at;
	const char *p;
	size_t		len = strlen(address);
	size_t		label = 0;

	if (len == 0)
		return "The address is empty.";
	if (len > MAX_ADDRESS)
		return "The address is longer than 254 characters.";

	at = strrchr(address, '@');
	if (at == NULL)
		return "The address has no \"@\".";
	if (at == address)
		return "The local part before \"@\" is empty.";
	if (at - address > MAX_LOCAL_PART)
		return "The local part is longer than 64 characters.";

	/* local part: dot-atom */
	for (p = address; p < at; p++)
	{
		if (*p == '.')
		{
			if (p == address || p + 1 == at || p[1] == '.')
				return "The local part has a leading, trailing or doubled dot.";
		}
		else if (!is_atext((unsigned char) *p))
			return "The local part may hold only letters, digits, dots and !#$%&'*+-/=?^_`{|}~.";
	}

	/* domain: LDH labels separated by single dots */
	p = at + 1;
	if (*p == '\0')
		return "The domain after \"@\" is empty.";
	for (; *p; p++)
	{
		unsigned char c = (unsigned char) *p;

		if (c == '.')
		{
			if (label == 0 || p[1] == '\0')
				return "The domain has an empty label.";
			if (p[-1] == '-')
				return "A domain label ends with a hyphen.";
			label = 0;
			continue;
		}
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			  (c >= '0' && c <= '9') || c == '-'))
			return "The domain may hold only letters, digits, hyphens and dots.";
		if (c == '-' && label == 0)
			return "A domain label starts with a hyphen.";
		if (++label > MAX_LABEL)
			return "A domain label is longer than 63 characters.";
	}
	if (p[-1] == '-')
		return "A domain label ends with a hyphen.";
	return NULL;
}

/*
 * gatekeeper_check_address
 *		Raise an error unless address is a bare mailbox that
 *		gatekeeper_address_problem accepts.
 */
void
gatekeeper_check_address(const char *address, const char *what)
{
	const char *problem;

	if (strpbrk(address, "\r\n") != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s address must not contain a line break", what),
				 errdetail("A CR or LF in an address could inject headers or SMTP commands.")));

	problem = gatekeeper_address_problem(address);
	if (problem != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid %s address \"%s\"", what, address),
				 errdetail("%s", problem)));
}

/*
 * gatekeeper_recipient_key
 *		The key a recipient's passes are kept under: the address with ASCII
 *		letters lower-cased, so Alice@Example.com and alice@example.com
 *		share one window.
 */
char *
gatekeeper_recipient_key(const char *recipient)
{
	char	   *key = pstrdup(recipient);
	char	   *p;

	for (p = key; *p; p++)
		*p = pg_ascii_tolower((unsigned char) *p);
	return key;
}

/*
 * gatekeeper._address_key(address text) RETURNS text
 *		The key an address is kept under in the suppression list (as the
 *		gates key it), or 22023 unless it is a valid address.
 */
Datum
gatekeeper_address_key(PG_FUNCTION_ARGS)
{
	char	   *address = text_to_cstring(PG_GETARG_TEXT_PP(0));

	gatekeeper_check_address(address, "suppressed");
	PG_RETURN_TEXT_P(cstring_to_text(gatekeeper_recipient_key(address)));
}

/*
 * gatekeeper_same_address
 *		Whether a (a report's recipient, perhaps NULL) is b, ASCII letters
 *		in any case (as the suppression list and the gates key addresses).
 */
bool
gatekeeper_same_address(const char *a, const char *b)
{
	if (a == NULL || strlen(a) != strlen(b))
		return false;
	for (; *a; a++, b++)
		if (pg_ascii_tolower((unsigned char) *a) != pg_ascii_tolower((unsigned char) *b))
			return false;
	return true;
}

/* ------------------------------------------------------------ mailboxes */

/*
 * trim
 *		A palloc'd copy of s[0..len) without leading and trailing spaces and
 *		tabs.
 */
static char *
trim(const char *s, int len)
{
	while (len > 0 && (*s == ' ' || *s == '\t'))
		s++, len--;
	while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\t'))
		len--;
	return pnstrdup(s, len);
}

/*
 * name_problem
 *		Why name cannot be a display name, as a full sentence, or NULL.
 */
static const char *
name_problem(const char *name)
{
	const unsigned char *p;

	if (strlen(name) > GATEKEEPER_NAME_MAX)
		return psprintf("The display name is longer than %d octets.", GATEKEEPER_NAME_MAX);
	for (p = (const unsigned char *) name; *p; p++)
	{
		if (*p < 0x20 || *p == 0x7f || (*p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f))
			return psprintf("The display name holds a control character (U+%04X) at octet %d.",
							*p == 0xc2 ? p[1] : *p,
							(int) (p - (const unsigned char *) name) + 1);
	}
	return NULL;
}

/*
 * gatekeeper_mailbox_problem
 *		Split value into display name and address; why it is not a mailbox,
 *		or NULL.
 *
 * The angle-bracketed address is the last '<' to the final '>' (an
 * address holds neither).  A name in double quotes is unquoted (a
 * backslash escapes the next character); an unquoted one is taken as it
 * is, between the spaces around it.  An empty name is no name.
 */
const char *
gatekeeper_mailbox_problem(const char *value, char **name, char **address)
{
	int			len = strlen(value);
	const char *lt;
	const char *problem;
	char	   *n = NULL;

	*name = NULL;
	*address = NULL;
	if (strpbrk(value, "\r\n") != NULL)
		return "It holds a line break, which could inject headers or SMTP commands.";

	while (len > 0 && (value[len - 1] == ' ' || value[len - 1] == '\t'))
		len--;
	if (len > 0 && value[len - 1] == '>')
	{
		lt = NULL;
		for (const char *p = value; p < value + len - 1; p++)
			if (*p == '<')
				lt = p;
		if (lt == NULL)
			return "It has a \">\" without a \"<\".";
		*address = pnstrdup(lt + 1, value + len - 1 - (lt + 1));
		n = trim(value, lt - value);
		if (n[0] == '"')
		{
			int			nlen = strlen(n);
			StringInfoData unq;
			int			i;

			if (nlen < 2 || n[nlen - 1] != '"')
				return "Its display name opens a quote that it does not close.";
			initStringInfo(&unq);
			for (i = 1; i < nlen - 1; i++)
			{
				if (n[i] == '\\' && i + 1 < nlen - 1)
					i++;
				else if (n[i] == '\\' || n[i] == '"')
					return "Its quoted display name holds an unescaped quote or backslash.";
				appendStringInfoChar(&unq, n[i]);
			}
			n = unq.data;
		}
		if ((problem = name_problem(n)) != NULL)
			return problem;
		*name = n[0] != '\0' ? n : NULL;
	}
	else
	{
		if (memchr(value, '<', len) != NULL || memchr(value, '>', len) != NULL)
			return "It has a \"<\" without a closing \">\" at its end.";
		*address = trim(value, len);
	}
	return gatekeeper_address_problem(*address);
}

/*
 * gatekeeper_parse_mailbox
 *		gatekeeper_mailbox_problem, raising 22023 for a problem.
 */
void
gatekeeper_parse_mailbox(const char *value, const char *what, char **name,
						 char **address)
{
	const char *problem = gatekeeper_mailbox_problem(value, name, address);
	const unsigned char *p;
	bool		printable = true;

	if (problem == NULL)
		return;
	/* a value with control characters is not repeated into the log */
	for (p = (const unsigned char *) value; *p; p++)
		if (*p < 0x20 || *p == 0x7f || (*p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f))
			printable = false;
	if (printable && *address != NULL && gatekeeper_address_problem(*address) == problem)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid %s address \"%s\"", what, value),
				 errdetail("%s", problem),
				 errhint("Give an address (shop@example.com) or a name and an address (Shop <shop@example.com>).")));
	if (printable)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid %s \"%s\"", what, value),
				 errdetail("%s", problem),
				 errhint("Give an address (shop@example.com) or a name and an address (Shop <shop@example.com>).")));
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("invalid %s", what),
			 errdetail("%s", problem)));
}

/*
 * gatekeeper_check_display_name
 *		Raise 22023 unless name can be a display name (a recipient_name).
 */
void
gatekeeper_check_display_name(const char *name, const char *what)
{
	const char *problem = name_problem(name);

	if (problem != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid %s", what),
				 errdetail("%s", problem)));
}

/*
 * utf8_len
 *		Octets in the UTF-8 character at s (1 for a stray octet), at most
 *		remaining.
 */
static int
utf8_len(const unsigned char *s, int remaining)
{
	int			n = 1;

	if (*s >= 0xf0)
		n = 4;
	else if (*s >= 0xe0)
		n = 3;
	else if (*s >= 0xc0)
		n = 2;
	return Min(n, remaining);
}

/*
 * append_base64
 *		RFC 4648 base64 of in[0..len), padded.
 */
static void
append_base64(StringInfo buf, const unsigned char *in, int len)
{
	int			i;

	for (i = 0; i < len; i += 3)
	{
		uint32		v = in[i] << 16;
		int			left = len - i;

		if (left > 1)
			v |= in[i + 1] << 8;
		if (left > 2)
			v |= in[i + 2];
		appendStringInfoChar(buf, base64_digits[(v >> 18) & 63]);
		appendStringInfoChar(buf, base64_digits[(v >> 12) & 63]);
		appendStringInfoChar(buf, left > 1 ? base64_digits[(v >> 6) & 63] : '=');
		appendStringInfoChar(buf, left > 2 ? base64_digits[v & 63] : '=');
	}
}

/*
 * gatekeeper_format_mailbox
 *		Append the From or To field body for name and address.
 *
 * An ASCII name is a quoted-string, '"' and '\' escaped, on one line (the
 * name's bound keeps it within 998 octets).  A name with any non-ASCII
 * octet is written as UTF-8 "B" encoded-words of at most 75 characters,
 * one a line after the first, never splitting a character; readers join
 * adjacent encoded-words without the folding between them.  The address
 * follows in angle brackets, on a line of its own when it would make the
 * line longer than 78 characters.
 */
void
gatekeeper_format_mailbox(StringInfo buf, const char *name, const char *address,
						  int used)
{
	int			col = used;
	int			addrlen = strlen(address) + 2;
	bool		ascii = true;
	const unsigned char *p;

	if (name == NULL || name[0] == '\0')
	{
		appendStringInfoString(buf, address);
		return;
	}
	for (p = (const unsigned char *) name; *p; p++)
		if (*p >= 0x80)
			ascii = false;

	if (ascii)
	{
		int			start = buf->len;

		appendStringInfoChar(buf, '"');
		for (p = (const unsigned char *) name; *p; p++)
		{
			if (*p == '"' || *p == '\\')
				appendStringInfoChar(buf, '\\');
			appendStringInfoChar(buf, *p);
		}
		appendStringInfoChar(buf, '"');
		col += buf->len - start;
	}
	else
	{
		const int	overhead = strlen(ENCODED_PREFIX) + strlen(ENCODED_SUFFIX);
		const unsigned char *s = (const unsigned char *) name;
		int			remaining = strlen(name);

		while (remaining > 0)
		{
			int			digits;
			int			max_octets;
			int			take = 0;
			int			start;

			/*
			 * As much as fits in an encoded-word of at most 75 characters
			 * and in what is left of a 78-character line; a word after the
			 * first, or a first word with too little room left (less than
			 * one character of four octets), starts a new line.
			 */
			digits = Min(ENCODED_WORD_MAX, LINE_SOFT_MAX - col) - overhead;
			if (col > used || digits < 8)
			{
				appendStringInfoString(buf, "\r\n ");
				col = 1;
				digits = Min(ENCODED_WORD_MAX, LINE_SOFT_MAX - col) - overhead;
			}
			max_octets = digits / 4 * 3;
			while (take < remaining)
			{
				int			c = utf8_len(s + take, remaining - take);

				if (take + c > max_octets)
					break;
				take += c;
			}
			start = buf->len;
			appendStringInfoString(buf, ENCODED_PREFIX);
			append_base64(buf, s, take);
			appendStringInfoString(buf, ENCODED_SUFFIX);
			col += buf->len - start;
			s += take;
			remaining -= take;
		}
	}

	if (col + 1 + addrlen > LINE_SOFT_MAX)
	{
		appendStringInfoString(buf, "\r\n <");
		col = 1;
	}
	else
		appendStringInfoString(buf, " <");
	appendStringInfoString(buf, address);
	appendStringInfoChar(buf, '>');
}

/*
 * gatekeeper._mailbox(value text, name text DEFAULT NULL)
 *		RETURNS TABLE (address text, display_name text, field text)
 *		value parsed as a sender (a bare address and its display name),
 *		with name, when given, as the display name instead (a recipient and
 *		its recipient_name), and the From/To field body the message builder
 *		writes for it after "From: ".  For tests and for a look before a
 *		campaign.
 */
Datum
gatekeeper_mailbox(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};
	char	   *name;
	char	   *address;
	StringInfoData field;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("value must not be null")));
	gatekeeper_parse_mailbox(text_to_cstring(PG_GETARG_TEXT_PP(0)), "sender",
							 &name, &address);
	if (!PG_ARGISNULL(1))
	{
		name = text_to_cstring(PG_GETARG_TEXT_PP(1));
		gatekeeper_check_display_name(name, "recipient_name");
	}
	initStringInfo(&field);
	gatekeeper_format_mailbox(&field, name, address, strlen("From: "));

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	desc = BlessTupleDesc(desc);
	values[0] = CStringGetTextDatum(address);
	if (name == NULL || name[0] == '\0')
		nulls[1] = true;
	else
		values[1] = CStringGetTextDatum(name);
	values[2] = CStringGetTextDatum(field.data);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}
