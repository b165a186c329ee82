/*-------------------------------------------------------------------------
 *
 * message.c
 *		RFC 5322 message building.
 *
 * gatekeeper_build_message turns one claimed mail into the octets handed
 * to the relay: the header (RFC 5322, with RFC 2047 encoded-words for text
 * that is not ASCII, and long lines folded), then either a lone text/plain
 * body or a multipart/alternative body holding a text/plain and a text/html
 * part (RFC 2045, RFC 2046).  A text part travels as 7bit when it is ASCII
 * with short lines, and as quoted-printable otherwise, so that no line is
 * longer than 78 octets and UTF-8 arrives intact through any relay.  Every
 * line ends in CRLF.
 *
 * SMTP dot-stuffing is not done here: the SMTP client (src/smtp_io.c)
 * doubles a "." that begins a line when it sends with DATA, and sends the
 * final "." itself; with BDAT nothing is stuffed.  Stuffing here too would
 * deliver ".." to the reader.
 *
 * The text is taken to be UTF-8, which is what a UTF8 database holds.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "message.h"
#include "address.h"
#include "gatekeeper.h"
#include "validate.h"

#include "common/hashfn.h"
#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "pgtime.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/numeric.h"
#include "utils/timestamp.h"

/*
 * Longest header line we aim for, CRLF excluded: RFC 5322 2.1.1 asks for 78
 * at most, RFC 2047 2 for 76 on a line holding an encoded-word.
 */
#define HEADER_WIDTH		76

/* Longest encoded-word (RFC 2047 2). */
#define ENCODED_WORD_MAX	75

/* "=?UTF-8?B?" and "?=" around the encoded text. */
#define ENCODED_WORD_OVERHEAD 12

/*
 * Below this much room left on a line, an encoded-word goes to a fresh
 * line instead: enough for the overhead and one 4-octet character as Q.
 */
#define ENCODED_MIN_ROOM	30

/*
 * A word longer than this is written as encoded-words, which can be
 * folded, so that no header line comes near the 998-octet limit (enqueue
 * refuses longer words in angle brackets, which are otherwise kept whole).
 */
#define HEADER_WORD_MAX		GATEKEEPER_HEADER_WORD_MAX

/* RFC 5322 2.1.1: the longest line, CRLF excluded */
#define HEADER_LINE_MAX		998

/* Longest 7bit body line, CRLF excluded. */
#define BODY_7BIT_WIDTH		78

/* Longest quoted-printable line, CRLF excluded (RFC 2045 6.7 (5)). */
#define QP_WIDTH			76

typedef enum TransferEncoding
{
	TE_7BIT,
	TE_QUOTED_PRINTABLE,
	TE_BASE64
} TransferEncoding;

/* One header field being written, folded as it goes. */
typedef struct HeaderLine
{
	StringInfo	buf;
	int			linelen;		/* octets on the current physical line */
	bool		empty;			/* nothing written after "Name:" yet */
} HeaderLine;

static const char hexdigits[] = "0123456789ABCDEF";

static const char base64_digits[] =
"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static const char *const day_names[] = {
	"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"
};

static const char *const month_names[] = {
	"Jan", "Feb", "Mar", "Apr", "May", "Jun",
	"Jul", "Aug", "Sep", "Oct", "Nov", "Dec"
};

static void append_date_header(StringInfo buf);
static void append_header(StringInfo buf, const char *name, const char *value,
						  bool address);
static void append_custom_headers(StringInfo buf, const char *json);
static void append_mailbox_header(StringInfo buf, const char *name,
								  const char *mailbox, const char *display_name);
static int	custom_header_cmp(const void *a, const void *b);
static bool header_name_usable(const char *name);
static bool word_needs_encoding(const char *word, int len, bool address);
static void header_append(HeaderLine *hl, const char *ws, int wslen,
						  const char *token, int toklen);
static void header_fold(HeaderLine *hl);
static void header_put_word(HeaderLine *hl, const char *ws, int wslen,
							const char *word, int len);
static void header_put_encoded(HeaderLine *hl, const char *ws, int wslen,
							   const char *text, int len);
static bool q_char_is_literal(unsigned char c);
static int	utf8_char_len(const char *s, int remaining);
static TransferEncoding choose_encoding(const char *text);
static void append_text_7bit(StringInfo buf, const char *text);
static void append_text_qp(StringInfo buf, const char *text);
static void append_text_base64(StringInfo buf, const char *text);
static int	base64_encode(char *out, const char *in, int len);
static void append_part_headers(StringInfo buf, const char *subtype,
								TransferEncoding te);
static void encode_text(StringInfo buf, const char *text, TransferEncoding te);

/*
 * gatekeeper_build_message
 *		Append the RFC 5322 message for mail to buf, From being "from".
 *
 * Header order: Date, From, To, Subject, Message-ID, MIME-Version, the
 * user's headers, then the content headers.
 */
void
gatekeeper_build_message(StringInfo buf, const GatekeeperMail *mail,
						 const char *from)
{
	const char *body = mail->body ? mail->body : "";

	append_date_header(buf);
	append_mailbox_header(buf, "From", from ? from : "", NULL);
	append_mailbox_header(buf, "To", mail->recipient ? mail->recipient : "",
						  mail->recipient_name);
	append_header(buf, "Subject", mail->subject ? mail->subject : "", false);
	if (mail->message_id != NULL && mail->message_id[0] != '\0')
		append_header(buf, "Message-ID", mail->message_id, true);
	appendStringInfoString(buf, "MIME-Version: 1.0\r\n");

	if (mail->headers_json != NULL)
		append_custom_headers(buf, mail->headers_json);

	if (mail->html == NULL)
	{
		TransferEncoding te = choose_encoding(body);

		append_part_headers(buf, "plain", te);
		appendStringInfoString(buf, "\r\n");
		encode_text(buf, body, te);
	}
	else
	{
		StringInfoData plain;
		StringInfoData html;
		TransferEncoding plain_te = choose_encoding(body);
		TransferEncoding html_te = choose_encoding(mail->html);
		const char *message_id = mail->message_id ? mail->message_id : "";
		char		boundary[64];
		uint64		h;

		initStringInfo(&plain);
		initStringInfo(&html);
		encode_text(&plain, body, plain_te);
		encode_text(&html, mail->html, html_te);

		/*
		 * The boundary starts with "=_", which neither quoted-printable nor
		 * base64 output can contain ('=' there is always followed by a hex
		 * digit, '=' or a line break).  A 7bit part that happens to contain
		 * the boundary is re-encoded as quoted-printable, so it cannot occur
		 * in either part.
		 */
		h = hash_bytes_extended((const unsigned char *) message_id,
								strlen(message_id), (uint64) mail->id);
		snprintf(boundary, sizeof(boundary), "=_gatekeeper_%016" INT64_MODIFIER "x_%d",
				 h, mail->attempt);

		if (plain_te == TE_7BIT && strstr(plain.data, boundary) != NULL)
		{
			plain_te = TE_QUOTED_PRINTABLE;
			resetStringInfo(&plain);
			encode_text(&plain, body, plain_te);
		}
		if (html_te == TE_7BIT && strstr(html.data, boundary) != NULL)
		{
			html_te = TE_QUOTED_PRINTABLE;
			resetStringInfo(&html);
			encode_text(&html, mail->html, html_te);
		}

		appendStringInfo(buf,
						 "Content-Type: multipart/alternative;\r\n"
						 " boundary=\"%s\"\r\n"
						 "\r\n",
						 boundary);

		/*
		 * Each part's text ends with CRLF (or is empty); the CRLF written
		 * before each delimiter belongs to the delimiter (RFC 2046 5.1.1).
		 */
		appendStringInfo(buf, "--%s\r\n", boundary);
		append_part_headers(buf, "plain", plain_te);
		appendStringInfoString(buf, "\r\n");
		appendBinaryStringInfo(buf, plain.data, plain.len);
		appendStringInfo(buf, "\r\n--%s\r\n", boundary);
		append_part_headers(buf, "html", html_te);
		appendStringInfoString(buf, "\r\n");
		appendBinaryStringInfo(buf, html.data, html.len);
		appendStringInfo(buf, "\r\n--%s--\r\n", boundary);

		pfree(plain.data);
		pfree(html.data);
	}
}

/*
 * append_date_header
 *		Append "Date:" with the current time in RFC 5322 3.3 form.
 *
 * Day and month names come from fixed English tables, never from the
 * locale.  The offset is the server's time zone setting, UTC when none.
 */
static void
append_date_header(StringInfo buf)
{
	/* the field of the last second asked for: a worker writes many a second */
	static pg_time_t last_time = -1;
	static pg_tz *last_zone = NULL;
	static char last_field[64];
	pg_time_t	now = timestamptz_to_time_t(GetCurrentTimestamp());
	struct pg_tm *tm = NULL;
	long		offset;
	char		sign = '+';

	if (now == last_time && session_timezone == last_zone)
	{
		appendStringInfoString(buf, last_field);
		return;
	}
	if (session_timezone != NULL)
		tm = pg_localtime(&now, session_timezone);
	if (tm == NULL)
		tm = pg_gmtime(&now);
	if (tm == NULL)
		elog(ERROR, "could not convert the current time");

	offset = tm->tm_gmtoff;
	if (offset < 0)
	{
		sign = '-';
		offset = -offset;
	}

	snprintf(last_field, sizeof(last_field),
			 "Date: %s, %d %s %04d %02d:%02d:%02d %c%02ld%02ld\r\n",
			 day_names[tm->tm_wday % 7], tm->tm_mday,
			 month_names[tm->tm_mon % 12], tm->tm_year + 1900,
			 tm->tm_hour, tm->tm_min, tm->tm_sec,
			 sign, offset / 3600, (offset / 60) % 60);
	last_time = now;
	last_zone = session_timezone;
	appendStringInfoString(buf, last_field);
}

/*
 * append_mailbox_header
 *		From or To: mailbox is an address or "Name <address>" (validated at
 *		enqueue, or by the setting's check hook), display_name a name to
 *		write instead of the one it holds (a mail's recipient_name).  The
 *		name is written by src/address.c: a quoted-string, or encoded-words
 *		when it is not ASCII.
 */
static void
append_mailbox_header(StringInfo buf, const char *name, const char *mailbox,
					  const char *display_name)
{
	char	   *parsed_name;
	char	   *address;

	if (gatekeeper_mailbox_problem(mailbox, &parsed_name, &address) != NULL)
	{
		/* cannot happen for validated input: write it as before */
		append_header(buf, name, mailbox, true);
		return;
	}
	if (display_name != NULL && display_name[0] != '\0')
		parsed_name = (char *) display_name;
	appendStringInfoString(buf, name);
	appendBinaryStringInfo(buf, ": ", 2);
	gatekeeper_format_mailbox(buf, parsed_name, address, strlen(name) + 2);
	appendStringInfoString(buf, "\r\n");
}

/*
 * append_header
 *		Append one header field, folded, with RFC 2047 encoded-words for the
 *		words that need them.
 *
 * The value is split into whitespace-separated words.  Runs of adjacent
 * words that need encoding become encoded-words together (so the spaces
 * between them survive; whitespace between two encoded-words is not
 * displayed), each encoded-word at most 75 characters and never splitting
 * a UTF-8 character.  Other words are kept as they are.  "address" is for
 * From and To: a word holding '@' is an address and is never encoded.
 *
 * CR and LF cannot reach here through enqueue's validation; should one
 * appear anyway it becomes a space, so no header can ever be injected.
 */
static void
append_header(StringInfo buf, const char *name, const char *value, bool address)
{
	HeaderLine	hl;
	char	   *v = pstrdup(value);
	char	   *p;

	for (p = v; *p; p++)
	{
		if (*p == '\r' || *p == '\n')
			*p = ' ';
	}

	appendStringInfoString(buf, name);
	appendStringInfoChar(buf, ':');
	hl.buf = buf;
	hl.linelen = strlen(name) + 1;
	hl.empty = true;

	p = v;
	while (*p)
	{
		const char *ws = p;
		int			wslen;
		const char *word;
		int			wordlen;

		while (*p == ' ' || *p == '\t')
			p++;
		wslen = p - ws;
		if (*p == '\0')
			break;				/* trailing whitespace is dropped */

		word = p;
		while (*p && *p != ' ' && *p != '\t')
			p++;
		wordlen = p - word;

		if (!word_needs_encoding(word, wordlen, address))
		{
			header_put_word(&hl, ws, wslen, word, wordlen);
			continue;
		}

		/* extend the run over the following words that need encoding too */
		for (;;)
		{
			char	   *q = p;
			char	   *next;

			while (*q == ' ' || *q == '\t')
				q++;
			if (*q == '\0')
				break;
			next = q;
			while (*q && *q != ' ' && *q != '\t')
				q++;
			if (!word_needs_encoding(next, q - next, address))
				break;
			p = q;
		}
		header_put_encoded(&hl, ws, wslen, word, p - word);
	}

	appendStringInfoString(buf, "\r\n");
	pfree(v);
}

/* One of the user's headers, as append_custom_headers collects them. */
typedef struct CustomHeader
{
	char	   *name;
	char	   *value;
	int			position;		/* in the JSON object */
	bool		skip;			/* a second one of the same name */
} CustomHeader;

/*
 * append_custom_headers
 *		Append the user's headers, a JSON object of name -> value.
 *
 * enqueue has validated them; mail enqueued by an older version may still
 * hold what it now refuses, so here a name that is not a valid field name
 * or that gatekeeper reserves (gatekeeper_header_reserved, the one list
 * for both) is skipped, and so is each name after the first that differs
 * from it only in case.  Numbers and booleans are written as their JSON
 * text; null and nested values are skipped.  The order is jsonb's key
 * order.
 */
static void
append_custom_headers(StringInfo buf, const char *json)
{
	Jsonb	   *jb;
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	char	   *name = NULL;
	CustomHeader *headers;
	CustomHeader **sorted;
	int			n = 0;
	int			i;

	jb = DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(json)));
	if (!JB_ROOT_IS_OBJECT(jb) || JB_ROOT_COUNT(jb) == 0)
		return;

	headers = palloc0(sizeof(CustomHeader) * JB_ROOT_COUNT(jb));
	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
			name = pnstrdup(v.val.string.val, v.val.string.len);
		else if (tok == WJB_VALUE && name != NULL)
		{
			char	   *value = NULL;

			switch (v.type)
			{
				case jbvString:
					value = pnstrdup(v.val.string.val, v.val.string.len);
					break;
				case jbvNumeric:
					value = DatumGetCString(DirectFunctionCall1(numeric_out,
																NumericGetDatum(v.val.numeric)));
					break;
				case jbvBool:
					value = pstrdup(v.val.boolean ? "true" : "false");
					break;
				default:
					break;
			}
			if (value != NULL && header_name_usable(name) &&
				n < (int) JB_ROOT_COUNT(jb))
			{
				headers[n].name = name;
				headers[n].value = value;
				headers[n].position = n;
				n++;
			}
			name = NULL;
		}
	}

	/* the first of each name, in any case, is the one written */
	sorted = palloc(sizeof(CustomHeader *) * Max(n, 1));
	for (i = 0; i < n; i++)
		sorted[i] = &headers[i];
	qsort(sorted, n, sizeof(CustomHeader *), custom_header_cmp);
	for (i = 1; i < n; i++)
	{
		if (pg_strcasecmp(sorted[i - 1]->name, sorted[i]->name) == 0)
			sorted[i]->skip = true;
	}

	for (i = 0; i < n; i++)
	{
		if (!headers[i].skip)
			append_header(buf, headers[i].name, headers[i].value, false);
	}
	pfree(sorted);
}

/*
 * Order custom headers by name in any case, then by position, for qsort.
 */
static int
custom_header_cmp(const void *a, const void *b)
{
	const CustomHeader *ha = *(const CustomHeader *const *) a;
	const CustomHeader *hb = *(const CustomHeader *const *) b;
	int			c = pg_strcasecmp(ha->name, hb->name);

	if (c != 0)
		return c;
	return ha->position - hb->position;
}

/*
 * header_name_usable
 *		Is name a valid field name (RFC 5322 2.2: printable ASCII but ':')
 *		that gatekeeper does not reserve?
 */
static bool
header_name_usable(const char *name)
{
	const char *p;

	if (name[0] == '\0')
		return false;
	for (p = name; *p; p++)
	{
		unsigned char c = (unsigned char) *p;

		if (c < 33 || c > 126 || c == ':')
			return false;
	}
	return !gatekeeper_header_reserved(name);
}

/*
 * word_needs_encoding
 *		Must this whitespace-free word of a header value be an encoded-word?
 *
 * Yes when it is too long for a line, holds a control character, looks
 * like an encoded-word itself ("=?"), which a reader would decode, or
 * holds a non-ASCII octet.  Two kinds of word are written as they are
 * when they are short enough and free of control characters: an
 * angle-bracketed word ("<...>": an address, a URL), if it is ASCII
 * (enqueue refuses anything else; mail from older versions may still hold
 * it), and, in an address header, a word holding '@': encoded-words are
 * not allowed there, and raw UTF-8 (RFC 6532) is the better outcome.
 */
static bool
word_needs_encoding(const char *word, int len, bool address)
{
	int			i;
	bool		ascii = true;

	if (len > HEADER_WORD_MAX)
		return true;
	for (i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) word[i];

		if (c < 0x20 || c == 0x7f)
			return true;
		if (c > 0x7f)
			ascii = false;
	}

	if (len >= 2 && word[0] == '<' && word[len - 1] == '>')
		return !ascii;
	if (address && memchr(word, '@', len) != NULL)
		return false;
	if (!ascii)
		return true;

	for (i = 0; i + 1 < len; i++)
	{
		if (word[i] == '=' && word[i + 1] == '?')
			return true;
	}
	return false;
}

/*
 * header_append
 *		Write whitespace and a token to the current line of a header.
 *
 * The first token after "Name:" always gets exactly one space before it.
 */
static void
header_append(HeaderLine *hl, const char *ws, int wslen, const char *token,
			  int toklen)
{
	if (hl->empty || wslen == 0)
	{
		ws = " ";
		wslen = 1;
	}
	appendBinaryStringInfo(hl->buf, ws, wslen);
	appendBinaryStringInfo(hl->buf, token, toklen);
	hl->linelen += wslen + toklen;
	hl->empty = false;
}

/*
 * header_fold
 *		End the current physical line; the next token's whitespace becomes
 *		the folding whitespace (RFC 5322 3.2.2).
 */
static void
header_fold(HeaderLine *hl)
{
	appendStringInfoString(hl->buf, "\r\n");
	hl->linelen = 0;
	hl->empty = false;
}

/*
 * header_put_word
 *		Write a plain word, folding first if it would overrun the line.
 *
 * A word longer than a line stays whole: it cannot be split, and RFC 5322
 * only requires lines of at most 998 octets (longer words are encoded).
 * The fold goes before the whitespace, which starts the next line, unless
 * that line would pass 998 octets: then as much of the whitespace as
 * needed ends the current line instead, so that the value unfolds to what
 * it was.  enqueue bounds runs of whitespace so that this always fits;
 * should a longer run come from older mail, the spaces that fit on no line
 * are dropped rather than a line made too long.
 */
static void
header_put_word(HeaderLine *hl, const char *ws, int wslen, const char *word,
				int len)
{
	int			eff_ws = (hl->empty || wslen == 0) ? 1 : wslen;
	int			keep;

	if (hl->empty || hl->linelen + eff_ws + len <= HEADER_WIDTH)
	{
		header_append(hl, ws, wslen, word, len);
		return;
	}

	if (wslen > 1 && wslen + len > HEADER_LINE_MAX)
	{
		keep = Min(wslen + len - HEADER_LINE_MAX,
				   Min(wslen - 1, HEADER_LINE_MAX - hl->linelen));
		if (keep > 0)
		{
			appendBinaryStringInfo(hl->buf, ws, keep);
			hl->linelen += keep;
			ws += keep;
			wslen -= keep;
		}
		if (wslen + len > HEADER_LINE_MAX)
			wslen = Max(HEADER_LINE_MAX - len, 1);
	}
	header_fold(hl);
	header_append(hl, ws, wslen, word, len);
}

/*
 * header_put_encoded
 *		Write text as one or more UTF-8 encoded-words.
 *
 * Q encoding when it is no longer than B (mostly-ASCII text stays
 * readable), B otherwise.  Q uses only the characters RFC 2047 5 (3)
 * allows in a phrase, so the result is valid in any header.  Each
 * encoded-word fits in what is left of the current line (at most 76
 * characters a line, RFC 2047 2) or goes to a fresh line.
 */
static void
header_put_encoded(HeaderLine *hl, const char *ws, int wslen, const char *text,
				   int len)
{
	int			qlen = 0;
	int			blen = 4 * ((len + 2) / 3);
	bool		use_q;
	int			i;

	for (i = 0; i < len; i++)
		qlen += q_char_is_literal((unsigned char) text[i]) || text[i] == ' ' ? 1 : 3;
	use_q = qlen <= blen;

	while (len > 0)
	{
		char		word[ENCODED_WORD_MAX + 1];
		int			wlen = 0;
		int			eff_ws = (hl->empty || wslen == 0) ? 1 : wslen;
		int			room = HEADER_WIDTH - hl->linelen - eff_ws;
		int			avail;
		int			take = 0;

		if (room < ENCODED_MIN_ROOM)
		{
			header_fold(hl);
			if (wslen == 0 || wslen > 8)
			{
				ws = " ";
				wslen = 1;
			}
			room = HEADER_WIDTH - wslen;
		}
		avail = Min(room, ENCODED_WORD_MAX) - ENCODED_WORD_OVERHEAD;

		memcpy(word, use_q ? "=?UTF-8?Q?" : "=?UTF-8?B?", 10);
		wlen = 10;

		if (use_q)
		{
			int			used = 0;

			while (take < len)
			{
				int			clen = utf8_char_len(text + take, len - take);
				int			need = 0;
				int			j;

				for (j = 0; j < clen; j++)
				{
					unsigned char c = (unsigned char) text[take + j];

					need += (q_char_is_literal(c) || c == ' ') ? 1 : 3;
				}
				if (used + need > avail)
					break;
				for (j = 0; j < clen; j++)
				{
					unsigned char c = (unsigned char) text[take + j];

					if (c == ' ')
						word[wlen++] = '_';
					else if (q_char_is_literal(c))
						word[wlen++] = (char) c;
					else
					{
						word[wlen++] = '=';
						word[wlen++] = hexdigits[c >> 4];
						word[wlen++] = hexdigits[c & 0x0f];
					}
				}
				used += need;
				take += clen;
			}
		}
		else
		{
			int			maxbytes = (avail / 4) * 3;

			while (take < len)
			{
				int			clen = utf8_char_len(text + take, len - take);

				if (take + clen > maxbytes)
					break;
				take += clen;
			}
			wlen += base64_encode(word + wlen, text, take);
		}

		/* cannot happen: avail always holds a 4-octet character */
		if (take == 0)
			elog(ERROR, "could not encode a header word");

		word[wlen++] = '?';
		word[wlen++] = '=';
		header_append(hl, ws, wslen, word, wlen);

		text += take;
		len -= take;
		ws = " ";
		wslen = 1;
	}
}

/*
 * q_char_is_literal
 *		May c stand for itself in Q encoding, even inside a phrase?
 *		(RFC 2047 5 (3); space is handled apart, as '_'.)
 */
static bool
q_char_is_literal(unsigned char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
		(c >= '0' && c <= '9') || c == '!' || c == '*' || c == '+' ||
		c == '-' || c == '/';
}

/*
 * utf8_char_len
 *		Length of the UTF-8 character at s, never more than remaining.
 *
 * An invalid lead octet counts as one character, so encoding always makes
 * progress; valid UTF-8 is never split.
 */
static int
utf8_char_len(const char *s, int remaining)
{
	int			l = pg_utf_mblen((const unsigned char *) s);

	if (l < 1)
		l = 1;
	return Min(l, remaining);
}

/*
 * choose_encoding
 *		7bit for ASCII text whose lines are all short enough; otherwise
 *		quoted-printable, unless so much of the text would need "=XX" that
 *		base64 is smaller (text in Cyrillic, Greek, CJK, ...: QP triples
 *		it, base64 adds a third).
 */
static TransferEncoding
choose_encoding(const char *text)
{
	const char *p = text;
	size_t		total = 0;
	size_t		escaped = 0;
	bool		plain = true;

	while (*p)
	{
		size_t		n = strcspn(p, "\r\n");
		size_t		i;

		if (n > BODY_7BIT_WIDTH)
			plain = false;
		for (i = 0; i < n; i++)
		{
			unsigned char c = (unsigned char) p[i];

			if (c >= 0x7f || (c < 0x20 && c != '\t'))
			{
				plain = false;
				escaped++;
			}
			else if (c == '=')
				escaped++;
		}
		total += n + 2;
		p += n;
		if (p[0] == '\r' && p[1] == '\n')
			p += 2;
		else if (*p)
			p++;
	}

	if (plain)
		return TE_7BIT;
	if (total + 2 * escaped > total + total / 3)
		return TE_BASE64;
	return TE_QUOTED_PRINTABLE;
}

/*
 * encode_text
 *		Append text in the given transfer encoding.
 */
static void
encode_text(StringInfo buf, const char *text, TransferEncoding te)
{
	if (te == TE_7BIT)
		append_text_7bit(buf, text);
	else if (te == TE_BASE64)
		append_text_base64(buf, text);
	else
		append_text_qp(buf, text);
}

/*
 * append_text_7bit
 *		Append ASCII text with every line break (CRLF, LF or CR) as CRLF,
 *		ending with CRLF unless the text is empty.
 */
static void
append_text_7bit(StringInfo buf, const char *text)
{
	const char *p = text;

	while (*p)
	{
		size_t		n = strcspn(p, "\r\n");

		appendBinaryStringInfo(buf, p, n);
		appendBinaryStringInfo(buf, "\r\n", 2);
		p += n;
		if (p[0] == '\r' && p[1] == '\n')
			p += 2;
		else if (*p)
			p++;
	}
}

/* an octet quoted-printable writes as itself inside a line */
static inline bool
qp_literal(char ch)
{
	unsigned char c = (unsigned char) ch;

	return (c >= 33 && c <= 126 && c != '=') || c == ' ' || c == '\t';
}

/*
 * append_text_qp
 *		Append text as quoted-printable (RFC 2045 6.7), line breaks as CRLF.
 *
 * '=', control characters and every non-ASCII octet are encoded, and so
 * is whitespace at the end of a line.  Lines are at most 76 characters,
 * split with soft line breaks ("=" CRLF) that never cut an "=XX".  A "."
 * or "From " opening a physical line is encoded too, which keeps the
 * message intact through relays that are careless with either (the SMTP
 * client dot-stuffs correctly anyway).
 */
static void
append_text_qp(StringInfo buf, const char *text)
{
	const char *p = text;

	while (*p)
	{
		size_t		n = strcspn(p, "\r\n");
		size_t		i;
		int			col = 0;
		char	   *out;

		if (n > (MaxAllocSize - 16) / 4)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("mail text has a line too long to encode"),
					 errdetail("The line is %zu bytes long.", n)));

		/* worst case: every octet as =XX, plus a soft break per 25 of them */
		enlargeStringInfo(buf, (int) (n * 3 + (n / 24 + 1) * 3 + 2));
		out = buf->data + buf->len;

		for (i = 0; i < n; i++)
		{
			unsigned char c = (unsigned char) p[i];
			bool		last = (i == n - 1);
			bool		literal;
			int			width;

			/*
			 * Inside a line, a run of octets that stand for themselves
			 * (neither the line's last nor one that needs a soft break
			 * before it) is copied at once.
			 */
			if (col > 0 && col < QP_WIDTH - 1)
			{
				size_t		run = 0;
				size_t		room = (size_t) (QP_WIDTH - 1 - col);

				while (run < room && i + run < n - 1 && qp_literal(p[i + run]))
					run++;
				if (run > 0)
				{
					memcpy(out, p + i, run);
					out += run;
					col += (int) run;
					i += run - 1;
					continue;
				}
			}

			literal = (c >= 33 && c <= 126 && c != '=') ||
				((c == ' ' || c == '\t') && !last);
			width = literal ? 1 : 3;

			/*
			 * A soft break needs one column for its '='; the last character
			 * of the line needs none.
			 */
			if (col + width > (last ? QP_WIDTH : QP_WIDTH - 1))
			{
				*out++ = '=';
				*out++ = '\r';
				*out++ = '\n';
				col = 0;
			}
			if (col == 0 &&
				(c == '.' || (c == 'F' && n - i >= 5 && strncmp(p + i, "From ", 5) == 0)))
			{
				literal = false;
				width = 3;
			}
			if (literal)
				*out++ = (char) c;
			else
			{
				*out++ = '=';
				*out++ = hexdigits[c >> 4];
				*out++ = hexdigits[c & 0x0f];
			}
			col += width;
		}
		*out++ = '\r';
		*out++ = '\n';
		buf->len = out - buf->data;
		*out = '\0';

		p += n;
		if (p[0] == '\r' && p[1] == '\n')
			p += 2;
		else if (*p)
			p++;
	}
}

/*
 * append_part_headers
 *		Append Content-Type and Content-Transfer-Encoding for a text part.
 */
static void
append_part_headers(StringInfo buf, const char *subtype, TransferEncoding te)
{
	appendStringInfo(buf,
					 "Content-Type: text/%s; charset=UTF-8\r\n"
					 "Content-Transfer-Encoding: %s\r\n",
					 subtype,
					 te == TE_7BIT ? "7bit" :
					 te == TE_BASE64 ? "base64" : "quoted-printable");
}

/*
 * append_text_base64
 *		Append text as base64 (RFC 2045 6.8), in 76-character lines.  The
 *		text is first put in canonical form: every line break CRLF, and a
 *		final CRLF, as the other encodings write it.
 */
static void
append_text_base64(StringInfo buf, const char *text)
{
	StringInfoData canon;
	int			i;

	initStringInfo(&canon);
	append_text_7bit(&canon, text);

	enlargeStringInfo(buf, (canon.len + 2) / 3 * 4 + (canon.len / 57 + 1) * 2);
	for (i = 0; i < canon.len; i += 57)
	{
		buf->len += base64_encode(buf->data + buf->len, canon.data + i,
								  Min(57, canon.len - i));
		buf->data[buf->len++] = '\r';
		buf->data[buf->len++] = '\n';
	}
	buf->data[buf->len] = '\0';
	pfree(canon.data);
}

/*
 * base64_encode
 *		Write len octets of in as base64 to out, with padding and no line
 *		breaks; returns the number of characters written.
 */
static int
base64_encode(char *out, const char *in, int len)
{
	int			n = 0;
	int			j;

	for (j = 0; j < len; j += 3)
	{
		uint32		bits = (uint32) (unsigned char) in[j] << 16;

		if (j + 1 < len)
			bits |= (uint32) (unsigned char) in[j + 1] << 8;
		if (j + 2 < len)
			bits |= (uint32) (unsigned char) in[j + 2];
		out[n++] = base64_digits[(bits >> 18) & 0x3f];
		out[n++] = base64_digits[(bits >> 12) & 0x3f];
		out[n++] = j + 1 < len ? base64_digits[(bits >> 6) & 0x3f] : '=';
		out[n++] = j + 2 < len ? base64_digits[bits & 0x3f] : '=';
	}
	return n;
}
