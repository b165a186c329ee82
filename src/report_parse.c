/*-------------------------------------------------------------------------
 *
 * report_parse.c
 *		Reading what a bounce mailbox receives: delivery status
 *		notifications (RFC 3464) and feedback reports (RFC 5965, ARF).
 *
 * A report is a MIME message (RFC 2045, 2046) holding, somewhere in its
 * tree, a multipart/report whose parts are a human-readable text, the
 * machine-readable part (message/delivery-status, or
 * message/global-delivery-status under RFC 6533, or
 * message/feedback-report) and the message it reports on, whole
 * (message/rfc822, message/global) or its headers (text/rfc822-headers,
 * message/global-headers).  The machine-readable part and the returned
 * headers are read wherever their types appear (OpenSMTPD writes its DSN
 * as a multipart/mixed).  This module walks that tree and reads the
 * fields gatekeeper needs; it judges nothing (src/report.c decides which
 * mail, if any, a report names).
 *
 * The input is hostile: anyone can send mail to a bounce address.  So
 * every loop is bounded and every copy is capped: a multipart nests at
 * most REPORT_MAX_DEPTH deep (the walk recurses once per level, no more),
 * a message is split into at most REPORT_MAX_PARTS parts in all, a header
 * block holds at most REPORT_MAX_FIELDS fields of which each value is
 * unfolded into at most REPORT_MAX_VALUE octets, and only the parts read
 * (the machine-readable one, the returned headers) are decoded from
 * base64 or quoted-printable, each into at most REPORT_MAX_DECODED
 * octets.  A missing boundary ends the multipart at the end of the data,
 * a missing blank line makes everything headers, and anything else that
 * does not parse is passed over: the function never raises an error for
 * what the message holds.  Lines may end in CRLF or bare LF.
 *
 * IDENTIFICATION
 *		src/report_parse.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "mb/pg_wchar.h"

#include "report_parse.h"

#define REPORT_MAX_DEPTH	8
#define REPORT_MAX_PARTS	256
#define REPORT_MAX_FIELDS	512
#define REPORT_MAX_VALUE	4096
#define REPORT_MAX_DECODED	(1024 * 1024)
#define REPORT_MAX_BOUNDARY 200
#define REPORT_MAX_TEXT		1000	/* longest string kept */
#define REPORT_MAX_BODY		(64 * 1024) /* longest text part kept */

/* octets of data */
typedef struct Span
{
	const char *p;
	size_t		n;
} Span;

/* one walk over a message */
typedef struct Walk
{
	ParsedReport *out;
	int			parts;			/* entities visited so far */
	bool		have_status;	/* a machine-readable part was read */
	bool		have_returned;	/* the returned headers were read */
	bool		have_text;		/* a text/plain part was kept */
} Walk;

/* what the headers of one entity say of its content */
typedef struct Entity
{
	char		type[128];		/* lower-cased "type/subtype" */
	char		boundary[REPORT_MAX_BOUNDARY + 1];
	char		report_type[64];	/* lower-cased */
	char		encoding[32];	/* lower-cased Content-Transfer-Encoding */
	Span		body;
} Entity;

/* a header block read field by field */
typedef struct FieldReader
{
	const char *p;
	const char *end;
	int			fields;
} FieldReader;

/* what read_group does with each field of a group (its name lower-cased) */
typedef void (*GroupField) (const char *name, const char *value, ParsedReport *out);

static const char *line_end(const char *p, const char *end, const char **next);
static bool next_field(FieldReader *r, char *name, size_t name_size,
					   char *value, size_t value_size);
static Span read_entity(Span data, Entity *e, Walk *w, bool top);
static void walk(Span data, int depth, bool in_report, Walk *w);
static void read_top_field(const char *name, const char *value, ParsedReport *out);
static void walk_multipart(const Entity *e, int depth, bool in_report, Walk *w);
static Span decode(const Entity *e);
static void read_delivery_status(Span body, Walk *w);
static void read_group(Span body, ParsedReport *out, GroupField field);
static void feedback_report_field(const char *name, const char *value, ParsedReport *out);
static void returned_field(const char *name, const char *value, ParsedReport *out);
static void keep_text(Span body, Walk *w);
static bool starts_with_any(const char *lower, const char *const *words);
static bool contains_any(const char *lower, const char *const *words);
static void content_type(const char *value, Entity *e);
static void copy_lower(char *dst, size_t size, const char *src, size_t n);
static char *typed_address(const char *value);
static char *angle_address(const char *value);
static char *message_id(const char *value);
static char *status_code(const char *value);
static char *xtext_decode(const char *value);
static const char *skip_space(const char *p);

/*
 * report_parse
 *		Walk the message's MIME tree and fill *out.
 */
void
report_parse(const char *data, size_t len, ParsedReport *out)
{
	Walk		w;
	Span		all;

	memset(out, 0, sizeof(*out));
	memset(&w, 0, sizeof(w));
	w.out = out;
	all.p = data;
	all.n = len;
	walk(all, 0, false, &w);

	/* a Subject that quotes the mail's own words says no delay */
	out->delay_notice = (out->delay_subject && !out->failure_subject) || out->delay_text;
	if (out->nrecipients > 0)
		out->kind = REPORT_DSN;
	else if (out->feedback_type != NULL)
		out->kind = REPORT_ARF;
	else
		out->kind = REPORT_NONE;
}

/*
 * The end of the line at p (its CR LF, or LF, or end), with *next set to
 * where the next line starts.
 */
static const char *
line_end(const char *p, const char *end, const char **next)
{
	const char *nl = memchr(p, '\n', end - p);

	if (nl == NULL)
	{
		*next = end;
		return end;
	}
	*next = nl + 1;
	if (nl > p && nl[-1] == '\r')
		return nl - 1;
	return nl;
}

/*
 * Read the next field of a header block: its name (truncated to
 * name_size - 1) and its value unfolded (continuation lines joined by one
 * space, truncated to value_size - 1).  False at the blank line that ends
 * the block, at the end of the data, or past REPORT_MAX_FIELDS; a line
 * that is no field ("From " lines, junk) is passed over.
 */
static bool
next_field(FieldReader *r, char *name, size_t name_size, char *value, size_t value_size)
{
	while (r->p < r->end && r->fields < REPORT_MAX_FIELDS)
	{
		const char *next;
		const char *eol = line_end(r->p, r->end, &next);
		const char *colon;
		size_t		vlen = 0;
		const char *v;

		if (eol == r->p)
		{
			r->p = next;		/* the blank line: the body follows */
			r->fields = REPORT_MAX_FIELDS;
			return false;
		}
		r->fields++;
		colon = memchr(r->p, ':', eol - r->p);
		if (colon == NULL || colon == r->p || *r->p == ' ' || *r->p == '\t')
		{
			r->p = next;
			continue;
		}
		copy_lower(name, name_size, r->p, colon - r->p);
		/* trailing white space before the colon is tolerated */
		while (name[0] && (name[strlen(name) - 1] == ' ' || name[strlen(name) - 1] == '\t'))
			name[strlen(name) - 1] = '\0';

		/* the value, and each continuation line after it */
		v = colon + 1;
		for (;;)
		{
			while (v < eol && (*v == ' ' || *v == '\t'))
				v++;
			if (v < eol)
			{
				size_t		room = value_size - 1 - vlen;
				size_t		n = Min((size_t) (eol - v), room);

				if (vlen > 0 && room > 0)
				{
					value[vlen++] = ' ';
					n = Min(n, room - 1);
				}
				memcpy(value + vlen, v, n);
				vlen += n;
			}
			r->p = next;
			if (r->p >= r->end || (*r->p != ' ' && *r->p != '\t'))
				break;
			eol = line_end(r->p, r->end, &next);
			v = r->p;
		}
		value[vlen] = '\0';
		return true;
	}
	/* out of fields: what is left is no header */
	r->p = r->end;
	return false;
}

/*
 * Read an entity's headers into *e; returns its body.  The top-level
 * message's delivery addresses are kept too.
 */
static Span
read_entity(Span data, Entity *e, Walk *w, bool top)
{
	FieldReader r;
	char		name[64];
	char	   *value = palloc(REPORT_MAX_VALUE + 1);

	memset(e, 0, sizeof(*e));
	strlcpy(e->type, "text/plain", sizeof(e->type));
	r.p = data.p;
	r.end = data.p + data.n;
	r.fields = 0;
	while (next_field(&r, name, sizeof(name), value, REPORT_MAX_VALUE + 1))
	{
		if (strcmp(name, "content-type") == 0)
			content_type(value, e);
		else if (strcmp(name, "content-transfer-encoding") == 0)
		{
			const char *v = skip_space(value);
			size_t		n = strcspn(v, " \t;(");

			copy_lower(e->encoding, sizeof(e->encoding), v, n);
		}
		else if (top && strcmp(name, "delivered-to") == 0 && w->out->delivered_to[0] == NULL)
			w->out->delivered_to[0] = angle_address(value);
		else if (top && strcmp(name, "x-original-to") == 0 && w->out->delivered_to[1] == NULL)
			w->out->delivered_to[1] = angle_address(value);
		else if (top && strcmp(name, "to") == 0 && w->out->delivered_to[2] == NULL)
			w->out->delivered_to[2] = angle_address(value);
		else if (top)
			read_top_field(name, value, w->out);
	}
	pfree(value);
	e->body.p = r.p;
	e->body.n = (data.p + data.n) - r.p;
	return e->body;
}

/*
 * The top-level fields that tell a bounce written for people from an
 * auto-reply (RFC 3834): who it is from, its Subject, its markings.
 */
static void
read_top_field(const char *name, const char *value, ParsedReport *out)
{
	static const char *const daemons[] = {
		"mailer-daemon", "mailer daemon", "mail-daemon", "mailerdaemon", "postmaster",
		"mail delivery", "mdaemon", NULL
	};
	static const char *const failures[] = {
		"undeliver", "delivery status notification (failure)", "delivery failure",
		"mail delivery failed", "failure notice", "returned mail", "returned to sender",
		"delivery has failed", "non-delivery", "not be delivered", "delivery failed",
		"nondeliverable", "failed delivery", "delivery problem", "could not deliver", NULL
	};
	static const char *const replies[] = {
		"auto:", "automatic reply", "autoreply", "auto-reply", "auto reply", "out of office",
		"out of the office", "vacation", "away from", "abwesenheit", "absence", NULL
	};
	char		lower[256];

	copy_lower(lower, sizeof(lower), value, strlen(value));
	if (strcmp(name, "from") == 0)
		out->from_daemon = contains_any(lower, daemons);
	else if (strcmp(name, "subject") == 0)
	{
		const char *v = skip_space(lower);

		out->failure_subject = contains_any(v, failures);
		out->delay_subject = strstr(v, "delay") != NULL || strncmp(v, "warning:", 8) == 0;
		if (starts_with_any(v, replies))
			out->auto_reply = true;
	}
	else if (strcmp(name, "auto-submitted") == 0)
	{
		const char *v = skip_space(lower);

		if (strncmp(v, "no", 2) != 0)
			out->auto_reply = true;
	}
	else if (strcmp(name, "x-autoreply") == 0 || strcmp(name, "x-autorespond") == 0 ||
			 (strcmp(name, "precedence") == 0 && strstr(lower, "auto_reply") != NULL))
		out->auto_reply = true;
	else if (strcmp(name, "return-path") == 0 && strstr(lower, "<>") != NULL)
		out->from_daemon = true;
}

/*
 * Whether lower starts with one of words.
 */
static bool
starts_with_any(const char *lower, const char *const *words)
{
	for (; *words != NULL; words++)
		if (strncmp(lower, *words, strlen(*words)) == 0)
			return true;
	return false;
}

/*
 * Whether lower holds one of words.
 */
static bool
contains_any(const char *lower, const char *const *words)
{
	for (; *words != NULL; words++)
		if (strstr(lower, *words) != NULL)
			return true;
	return false;
}

/*
 * Visit one entity: a multipart is split and its parts visited one level
 * deeper; the parts of a report are read.  in_report: the entity is a
 * part of a multipart/report (a delivery status and returned headers are
 * read in any multipart).
 */
static void
walk(Span data, int depth, bool in_report, Walk *w)
{
	Entity		e;

	if (w->parts >= REPORT_MAX_PARTS)
		return;
	w->parts++;
	read_entity(data, &e, w, depth == 0);

	if (strncmp(e.type, "multipart/", 10) == 0)
	{
		if (depth < REPORT_MAX_DEPTH && e.boundary[0] != '\0')
			walk_multipart(&e, depth, strcmp(e.type, "multipart/report") == 0, w);
		return;
	}
	if (strcmp(e.type, "text/plain") == 0 && !w->have_text)
	{
		w->have_text = true;
		keep_text(decode(&e), w);
		return;
	}
	/*
	 * Delivery status in awkward layouts: OpenSMTPD sends its
	 * message/delivery-status in a multipart/mixed, and some MTAs label
	 * the report's second part text/plain.  Only groups that name a
	 * recipient or an action are kept from either.
	 */
	if (depth > 0 && !w->have_status &&
		(strcmp(e.type, "message/delivery-status") == 0 ||
		 strcmp(e.type, "message/global-delivery-status") == 0 ||
		 (in_report && strcmp(e.type, "text/plain") == 0)))
	{
		read_delivery_status(decode(&e), w);
		w->have_status = w->out->nrecipients > 0;
		return;
	}
	/*
	 * Likewise the returned headers: OpenSMTPD's text/rfc822-headers sit
	 * in a multipart/mixed, and their type says what they are.
	 */
	if (strcmp(e.type, "message/delivery-status") == 0 ||
		strcmp(e.type, "message/global-delivery-status") == 0 ||
		strcmp(e.type, "text/rfc822-headers") == 0 ||
		strcmp(e.type, "message/global-headers") == 0)
		in_report = true;
	if (!in_report)
	{
		/* a complaint forwarded as the message it is about */
		if (depth > 0 && !w->have_returned &&
			(strcmp(e.type, "message/rfc822") == 0 || strcmp(e.type, "message/global") == 0))
		{
			w->have_returned = true;
			w->out->forwarded = true;
			read_group(decode(&e), w->out, returned_field);
		}
		return;
	}
	if (strcmp(e.type, "message/delivery-status") == 0 ||
		strcmp(e.type, "message/global-delivery-status") == 0)
	{
		if (!w->have_status)
		{
			w->have_status = true;
			read_delivery_status(decode(&e), w);
		}
	}
	else if (strcmp(e.type, "message/feedback-report") == 0)
	{
		if (!w->have_status)
		{
			w->have_status = true;
			read_group(decode(&e), w->out, feedback_report_field);
		}
	}
	else if (strcmp(e.type, "message/rfc822") == 0 ||
			 strcmp(e.type, "message/global") == 0 ||
			 strcmp(e.type, "text/rfc822-headers") == 0 ||
			 strcmp(e.type, "message/global-headers") == 0)
	{
		if (!w->have_returned)
		{
			w->have_returned = true;
			read_group(decode(&e), w->out, returned_field);
		}
	}
}

/*
 * Split a multipart body at its boundary and visit each part.  The
 * preamble and epilogue are passed over; a part whose closing delimiter
 * is missing runs to the end of the data.
 */
static void
walk_multipart(const Entity *e, int depth, bool in_report, Walk *w)
{
	const char *p = e->body.p;
	const char *end = e->body.p + e->body.n;
	size_t		blen = strlen(e->boundary);
	const char *part = NULL;

	while (p < end && w->parts < REPORT_MAX_PARTS)
	{
		const char *next;
		const char *eol = line_end(p, end, &next);

		if ((size_t) (eol - p) >= blen + 2 && p[0] == '-' && p[1] == '-' &&
			memcmp(p + 2, e->boundary, blen) == 0 &&
			((size_t) (eol - p) == blen + 2 || p[blen + 2] == ' ' || p[blen + 2] == '\t' ||
			 ((size_t) (eol - p) >= blen + 4 && p[blen + 2] == '-' && p[blen + 3] == '-')))
		{
			bool		close = (size_t) (eol - p) >= blen + 4 &&
				p[blen + 2] == '-' && p[blen + 3] == '-';

			if (part != NULL)
			{
				Span		s;
				const char *stop = p;

				/* the line break before the delimiter belongs to it */
				if (stop > part && stop[-1] == '\n')
					stop--;
				if (stop > part && stop[-1] == '\r')
					stop--;
				s.p = part;
				s.n = stop - part;
				walk(s, depth + 1, in_report, w);
			}
			if (close)
				return;
			part = next;
		}
		p = next;
	}
	if (part != NULL && part < end && w->parts < REPORT_MAX_PARTS)
	{
		Span		s;

		s.p = part;
		s.n = end - part;
		walk(s, depth + 1, in_report, w);
	}
}

/*
 * An entity's body decoded from base64 or quoted-printable (others as
 * they are), at most REPORT_MAX_DECODED octets of it.
 */
static Span
decode(const Entity *e)
{
	Span		out;
	const char *p = e->body.p;
	const char *end = e->body.p + e->body.n;
	char	   *buf;
	size_t		n = 0;

	if (strcmp(e->encoding, "base64") == 0)
	{
		uint32		acc = 0;
		int			bits = 0;

		buf = palloc(Min(e->body.n, (size_t) REPORT_MAX_DECODED) + 1);
		for (; p < end && n < REPORT_MAX_DECODED; p++)
		{
			unsigned char c = (unsigned char) *p;
			int			v;

			if (c >= 'A' && c <= 'Z')
				v = c - 'A';
			else if (c >= 'a' && c <= 'z')
				v = c - 'a' + 26;
			else if (c >= '0' && c <= '9')
				v = c - '0' + 52;
			else if (c == '+')
				v = 62;
			else if (c == '/')
				v = 63;
			else if (c == '=')
				break;
			else
				continue;
			acc = (acc << 6) | v;
			bits += 6;
			if (bits >= 8)
			{
				bits -= 8;
				buf[n++] = (char) ((acc >> bits) & 0xff);
			}
		}
	}
	else if (strcmp(e->encoding, "quoted-printable") == 0)
	{
		buf = palloc(Min(e->body.n, (size_t) REPORT_MAX_DECODED) + 1);
		while (p < end && n < REPORT_MAX_DECODED)
		{
			if (*p != '=')
			{
				buf[n++] = *p++;
				continue;
			}
			if (end - p >= 3 && isxdigit((unsigned char) p[1]) && isxdigit((unsigned char) p[2]))
			{
				char		hex[3] = {p[1], p[2], '\0'};

				buf[n++] = (char) strtol(hex, NULL, 16);
				p += 3;
			}
			else if (end - p >= 2 && p[1] == '\n')
				p += 2;			/* a soft line break */
			else if (end - p >= 3 && p[1] == '\r' && p[2] == '\n')
				p += 3;
			else
				buf[n++] = *p++;
		}
	}
	else
	{
		out.p = e->body.p;
		out.n = Min(e->body.n, (size_t) REPORT_MAX_DECODED);
		return out;
	}
	buf[n] = '\0';
	out.p = buf;
	out.n = n;
	return out;
}

/*
 * The fields of a message/delivery-status body: a per-message group
 * (Original-Envelope-Id is what is kept of it), then per-recipient groups,
 * each ended by a blank line.
 */
static void
read_delivery_status(Span body, Walk *w)
{
	ParsedReport *out = w->out;
	FieldReader r;
	char		name[64];
	char	   *value = palloc(REPORT_MAX_VALUE + 1);
	int			groups = 0;

	r.p = body.p;
	r.end = body.p + body.n;
	while (r.p < r.end && groups < REPORT_MAX_RECIPIENTS + 8)
	{
		ReportRecipient rr;
		bool		recipient = false;

		memset(&rr, 0, sizeof(rr));
		r.fields = 0;
		groups++;
		while (next_field(&r, name, sizeof(name), value, REPORT_MAX_VALUE + 1))
		{
			if (strcmp(name, "original-envelope-id") == 0 && out->envid == NULL)
				out->envid = xtext_decode(value);
			else if (strcmp(name, "final-recipient") == 0)
			{
				recipient = true;
				if (rr.final_recipient == NULL)
					rr.final_recipient = typed_address(value);
			}
			else if (strcmp(name, "original-recipient") == 0 && rr.original_recipient == NULL)
				rr.original_recipient = typed_address(value);
			else if (strcmp(name, "action") == 0 && rr.action == NULL)
			{
				const char *v = skip_space(value);
				char		action[32];

				recipient = true;
				copy_lower(action, sizeof(action), v, strcspn(v, " \t;("));
				rr.action = report_clean(action, strlen(action));
			}
			else if (strcmp(name, "status") == 0 && rr.status == NULL)
				rr.status = status_code(value);
			else if (strcmp(name, "diagnostic-code") == 0 && rr.diagnostic == NULL)
			{
				const char *semi = strchr(value, ';');
				const char *v = skip_space(semi ? semi + 1 : value);

				rr.diagnostic = report_clean(v, strlen(v));
			}
		}
		/*
		 * A status that says only its class (Exim's 5.0.0) gives way to the
		 * code of the remote server's reply, when the diagnostic quotes one
		 * ("550 5.1.1 No such user"): that is the code the synchronous
		 * path would have judged.
		 */
		if (rr.diagnostic != NULL &&
			(rr.status == NULL || strcmp(rr.status + 1, ".0.0") == 0))
		{
			const char *d = rr.diagnostic;

			if (strlen(d) > 4 && d[0] >= '2' && d[0] <= '5' &&
				isdigit((unsigned char) d[1]) && isdigit((unsigned char) d[2]) &&
				(d[3] == ' ' || d[3] == '-') &&
				(rr.status == NULL || d[4] == rr.status[0]))
			{
				char	   *code = status_code(d + 4);

				if (code != NULL)
					rr.status = code;
			}
		}
		if (recipient && out->nrecipients < REPORT_MAX_RECIPIENTS)
			out->recipients[out->nrecipients++] = rr;
	}
	pfree(value);
}

/*
 * Read the one header group of body (after the blank lines some senders
 * put first), handing each field to field.
 */
static void
read_group(Span body, ParsedReport *out, GroupField field)
{
	FieldReader r;
	char		name[64];
	char	   *value = palloc(REPORT_MAX_VALUE + 1);

	r.p = body.p;
	r.end = body.p + body.n;
	r.fields = 0;
	while (r.p < r.end && (*r.p == '\r' || *r.p == '\n'))
		r.p++;
	while (next_field(&r, name, sizeof(name), value, REPORT_MAX_VALUE + 1))
		field(name, value, out);
	pfree(value);
}

/*
 * A field of a message/feedback-report body (read_group's field).
 */
static void
feedback_report_field(const char *name, const char *value, ParsedReport *out)
{
	if (strcmp(name, "feedback-type") == 0 && out->feedback_type == NULL)
	{
		const char *v = skip_space(value);
		char		type[32];

		copy_lower(type, sizeof(type), v, strcspn(v, " \t;("));
		out->feedback_type = report_clean(type, strlen(type));
	}
	else if (strcmp(name, "user-agent") == 0 && out->user_agent == NULL)
		out->user_agent = report_clean(value, strlen(value));
	else if (strcmp(name, "original-mail-from") == 0 && out->original_mail_from == NULL)
		out->original_mail_from = angle_address(value);
	else if (strcmp(name, "original-rcpt-to") == 0 && out->original_rcpt_to == NULL)
		out->original_rcpt_to = angle_address(value);
	else if (strcmp(name, "removal-recipient") == 0 && out->removal_recipient == NULL)
		out->removal_recipient = angle_address(value);
}

/*
 * A header of the returned message (read_group's field): its Message-ID
 * and Return-Path are kept.
 */
static void
returned_field(const char *name, const char *value, ParsedReport *out)
{
	if (strcmp(name, "message-id") == 0 && out->returned_message_id == NULL)
		out->returned_message_id = message_id(value);
	else if (strcmp(name, "return-path") == 0 && out->returned_return_path == NULL)
		out->returned_return_path = angle_address(value);
}

/*
 * Keep a text part as out->text: at most REPORT_MAX_BODY octets of it, cut
 * at the line where an MTA starts the copy of the returned message (its
 * words are the sender's, not the MTA's), NUL octets made spaces.
 * Sendmail's first line, "The original message was received at ...",
 * starts no copy.
 */
static void
keep_text(Span body, Walk *w)
{
	static const char *const copies[] = {
		"copy of the message", "copy of the original message", "original message follows",
		"----- original message", "original message headers", "below this line",
		"headers of the original", "message headers follow", "returned message",
		"undelivered message", "header of the original", "forwarded message", NULL
	};

	/*
	 * What says the report is a warning of a delay, not a failure (OpenSMTPD's
	 * "temporary failure report", Courier's "advisory notice only", Postfix's
	 * and sendmail's "warning only"): it is read as a deferral.
	 */
	static const char *const delays[] = {
		"temporary failure report", "advisory notice only", "warning message only",
		"this is a warning only", "will keep trying", "will continue trying",
		"do not need to resend", "do not need to re-send", NULL
	};
	const char *p = body.p;
	const char *end = body.p + Min(body.n, (size_t) REPORT_MAX_BODY);
	char	   *out;
	size_t		i;

	while (p < end)
	{
		const char *next;
		const char *eol = line_end(p, end, &next);
		char		lower[256];

		copy_lower(lower, sizeof(lower), p, eol - p);
		if (contains_any(lower, copies) &&
			strstr(lower, "original message was received") == NULL)
		{
			end = p;
			break;
		}
		if (contains_any(lower, delays))
			w->out->delay_text = true;
		p = next;
	}
	out = palloc(end - body.p + 1);
	for (i = 0; i < (size_t) (end - body.p); i++)
		out[i] = body.p[i] == '\0' ? ' ' : body.p[i];
	out[i] = '\0';
	w->out->text = out;
}

/*
 * Content-Type: the type and the parameters boundary and report-type
 * (quoted or not; RFC 2231 continuations are not read).
 */
static void
content_type(const char *value, Entity *e)
{
	const char *p = skip_space(value);
	size_t		n = strcspn(p, " \t;(");

	copy_lower(e->type, sizeof(e->type), p, n);
	p += n;
	while (*p)
	{
		const char *pname;
		size_t		pname_len;
		char		buf[REPORT_MAX_BOUNDARY + 1];
		size_t		blen = 0;

		p = strchr(p, ';');
		if (p == NULL)
			break;
		p = skip_space(p + 1);
		pname = p;
		pname_len = strcspn(p, "= \t;");
		p += pname_len;
		p = skip_space(p);
		if (*p != '=')
			continue;
		p = skip_space(p + 1);
		if (*p == '"')
		{
			p++;
			while (*p && *p != '"')
			{
				if (*p == '\\' && p[1])
					p++;
				if (blen < REPORT_MAX_BOUNDARY)
					buf[blen++] = *p;
				p++;
			}
			if (*p == '"')
				p++;
		}
		else
		{
			while (*p && *p != ';' && *p != ' ' && *p != '\t')
			{
				if (blen < REPORT_MAX_BOUNDARY)
					buf[blen++] = *p;
				p++;
			}
		}
		buf[blen] = '\0';
		if (pname_len == 8 && pg_strncasecmp(pname, "boundary", 8) == 0 &&
			e->boundary[0] == '\0')
			strlcpy(e->boundary, buf, sizeof(e->boundary));
		else if (pname_len == 11 && pg_strncasecmp(pname, "report-type", 11) == 0)
			copy_lower(e->report_type, sizeof(e->report_type), buf, blen);
	}
}

/*
 * n octets of src lower-cased (ASCII) into dst of size octets, truncated.
 */
static void
copy_lower(char *dst, size_t size, const char *src, size_t n)
{
	size_t		i;

	n = Min(n, size - 1);
	for (i = 0; i < n; i++)
		dst[i] = pg_ascii_tolower((unsigned char) src[i]);
	dst[n] = '\0';
}

/*
 * report_clean
 *		A palloc'd copy of n octets trimmed of white space, at most
 * REPORT_MAX_TEXT octets, printable: control characters become spaces,
 * and octets that are not ASCII become '?' unless the database is UTF-8
 * and they form whole, legal characters (cut only between characters).
 * NULL when nothing is left.
 */
char *
report_clean(const char *p, size_t n)
{
	char	   *out;
	size_t		o = 0;
	size_t		i = 0;
	bool		utf8 = GetDatabaseEncoding() == PG_UTF8;

	while (n > 0 && (*p == ' ' || *p == '\t'))
		p++, n--;
	while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t' || p[n - 1] == '\r' || p[n - 1] == '\n'))
		n--;
	if (n == 0)
		return NULL;
	out = palloc(Min(n, (size_t) REPORT_MAX_TEXT) + 1);
	while (i < n && o < REPORT_MAX_TEXT)
	{
		unsigned char c = (unsigned char) p[i];

		if (c < 0x20 || c == 0x7f)
		{
			out[o++] = ' ';
			i++;
		}
		else if (c < 0x80)
		{
			out[o++] = (char) c;
			i++;
		}
		else
		{
			int			len = pg_utf_mblen((const unsigned char *) p + i);

			if (utf8 && len > 1 && i + len <= n && o + len <= REPORT_MAX_TEXT &&
				pg_utf8_islegal((const unsigned char *) p + i, len))
			{
				memcpy(out + o, p + i, len);
				o += len;
				i += len;
			}
			else
			{
				out[o++] = '?';
				i++;
			}
		}
	}
	out[o] = '\0';
	return out;
}

/*
 * The address of "type; address" (Final-Recipient, Original-Recipient),
 * without angle brackets.
 */
static char *
typed_address(const char *value)
{
	const char *semi = strchr(value, ';');

	return angle_address(semi ? semi + 1 : value);
}

/*
 * The address of a field that holds one: inside angle brackets when there
 * are any, else the value trimmed (its first word).
 */
static char *
angle_address(const char *value)
{
	const char *lt = strchr(value, '<');
	const char *p;
	size_t		n;

	if (lt != NULL)
	{
		const char *gt = strchr(lt + 1, '>');

		if (gt == NULL)
			return NULL;
		return report_clean(lt + 1, gt - lt - 1);
	}
	p = skip_space(value);
	n = strcspn(p, " \t,;");
	return report_clean(p, n);
}

/*
 * A Message-ID as "<...>", or NULL.
 */
static char *
message_id(const char *value)
{
	const char *lt = strchr(value, '<');
	const char *gt = lt ? strchr(lt, '>') : NULL;

	if (lt == NULL || gt == NULL || gt - lt > 998)
		return NULL;
	return report_clean(lt, gt - lt + 1);
}

/*
 * The RFC 3463 code at the start of a Status field, or NULL.
 */
static char *
status_code(const char *value)
{
	const char *p = skip_space(value);
	const char *q = p;
	int			dots = 0;
	int			digits = 0;

	if (*q < '2' || *q > '5' || q[1] != '.')
		return NULL;
	for (; *q; q++)
	{
		if (isdigit((unsigned char) *q))
		{
			if (++digits > 3)
				return NULL;
		}
		else if (*q == '.' && digits > 0 && dots < 2)
		{
			dots++;
			digits = 0;
		}
		else
			break;
	}
	if (dots != 2 || digits == 0)
		return NULL;
	return report_clean(p, q - p);
}

/*
 * An xtext (RFC 3461) value decoded: "+XX" is the octet of two hex digits.
 */
static char *
xtext_decode(const char *value)
{
	const char *p = skip_space(value);
	char	   *buf = palloc(strlen(p) + 1);
	size_t		n = 0;
	char	   *out;

	while (*p && *p != ' ' && *p != '\t')
	{
		if (*p == '+' && isxdigit((unsigned char) p[1]) && isxdigit((unsigned char) p[2]))
		{
			char		hex[3] = {p[1], p[2], '\0'};

			buf[n++] = (char) strtol(hex, NULL, 16);
			p += 3;
		}
		else
			buf[n++] = *p++;
	}
	out = report_clean(buf, n);
	pfree(buf);
	return out;
}

/*
 * p past spaces and tabs.
 */
static const char *
skip_space(const char *p)
{
	while (*p == ' ' || *p == '\t')
		p++;
	return p;
}
