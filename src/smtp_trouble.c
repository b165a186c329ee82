/*-------------------------------------------------------------------------
 *
 * smtp_trouble.c
 *		What a failure means: one classifier of the reason a mail failed,
 *		for the relay's own refusals (the nacks of src/mail/mail_state.c), the
 *		reports that come back (src/report.c) and the reason column of
 *		gatekeeper.events (gatekeeper._bounce_reason wraps it).
 *
 * A server's code and its words often disagree: "550 5.1.1 mailbox full",
 * "550 5.1.1 message blocked as spam", Office 365's "550 5.1.351" or
 * "5.4.4 host unknown", Outlook's "550 5.5.0 ... mailbox unavailable",
 * Exim's "5.0.0" with "User unknown" after it, Office 365's "5.4.1
 * Recipient address rejected: Access denied" (its directory-based edge
 * blocking: no such recipient), Courier's "5.0.0" with "550 User <gone>
 * unknown" (the words are read with the addresses in angle brackets taken
 * out).  So the reason is read from both, in this order:
 *
 *	1. the words that say the failure is not the address's, whatever the
 *	   code (authentication, a full mailbox, a message too large, a block
 *	   list, a rate limit, spam or a virus, an MTA that gave up);
 *	2. the words that say the address does not exist (host unknown, user
 *	   unknown), and then words of a policy block;
 *	3. the RFC 3463 code (x.1.1 user unknown, x.2.2 mailbox full, ...);
 *	4. words of an expiry or a system error;
 *	5. a reply without an enhanced code: 550, 551, 553 to a recipient
 *	   mean it does not exist (the synchronous rule since 0.1.0);
 *	6. other.
 *
 * Only user_unknown and host_unknown are hard bounces (smtp_trouble_hard).
 * A refusal of anything but the recipient, as src/smtp_txn.c writes it
 * ("relay <peer> refused MAIL FROM: <reply>"), says nothing of the
 * recipient's address: its reason is its reply's, but an unknown address
 * reads as other.
 *
 * IDENTIFICATION
 *		src/smtp_trouble.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/builtins.h"

#include "smtp_trouble.h"

PG_FUNCTION_INFO_V1(gatekeeper_bounce_reason);

/* the most of a text the classifier reads */
#define TROUBLE_MAX_TEXT	4000

/* a list of phrases and the reason they give */
typedef struct TroublePhrases
{
	TroubleReason reason;
	const char *const *phrases;
} TroublePhrases;

static const char *const reason_names[] = {
	"user_unknown", "host_unknown", "mailbox_full", "message_too_large",
	"policy_blocked", "spam_filtered", "auth_failure", "expired",
	"rate_limited", "system_error", "other"
};

/* 1. words that say the failure is not the address's, whatever the code */
static const char *const sender_words[] = {
	"sender address rejected", "sender domain", "sender verify", "sender rejected",
	"invalid sender", "sender unknown", "unknown sender", "sender address", NULL
};
static const char *const auth_words[] = {
	"dmarc", "spf ", "spf:", "spf=", "spf check", "dkim", "unauthenticated",
	"authentication", "not authenticated", "sender policy framework", NULL
};
static const char *const full_words[] = {
	"mailbox full", "mailbox is full", "mailbox has exceeded", "mailbox size limit",
	"mailbox exceeded", "over quota", "overquota", "quota exceeded", "exceeded quota",
	"exceeds quota", "quota exceed", "quotaexceeded", "exceeded storage", "storage allocation",
	"user is over", "mailbox is over", "full mailbox", "inbox is full", "mailfolder is full",
	"mailbox quota", "disk quota", "out of storage", "insufficient storage for the mailbox", NULL
};
static const char *const large_words[] = {
	"message too large", "message is too large", "too big", "message size exceeds",
	"exceeds the maximum size", "exceeds maximum", "size limit", "message length exceeds",
	"message exceeds", "size exceeds", "message too long", "maximum message size", NULL
};
static const char *const blocklist_words[] = {
	"spamhaus", "spamcop", "blocklist", "block list", "blacklist", "black list", "dnsbl",
	" rbl", "listed at", "listed on", "listed in", "reputation", "relay access denied",
	"relaying denied", "not permitted to relay", "relay not permitted", "unable to relay",
	"relaying not allowed", "banned", NULL
};
static const char *const rate_words[] = {
	"rate limit", "rate-limit", "ratelimit", "too many", "throttl", "unusual rate",
	"sending rate", "too fast", "receiving mail at a rate", "unexpected volume",
	"temporarily deferred", NULL
};
static const char *const spam_words[] = {
	"spam", "junk mail", "virus", "malware", "infected", "unsolicited", "bulk mail",
	"content rejected", "message content", "content filter", "content restriction", "phish",
	"suspicious", NULL
};

/*
 * an expiry in words no code can overrule: qmail's "(#4.4.1) ... in the
 * queue too long", WorkMail's "4.4.7 Message expired: ... <421 4.4.2 ...>"
 */
static const char *const gave_up_words[] = {
	"queue too long", "message expired", "envelope expired", "retry timeout exceeded", NULL
};

/* 2. words that say the address does not exist, then a policy block */
static const char *const host_words[] = {
	"host unknown", "unknown host", "host not found", "domain not found", "no such domain",
	"domain does not exist", "domain doesn't exist", "unknown domain", "domain unknown",
	"name or service not known", "nxdomain", "no mx", "null mx", "bad destination",
	"non-existent host", "nonexistent host", "non-existent domain", "nonexistentdomain",
	"nonexistent domain", "host or domain name not found", "domain name not found",
	"unrouteable mail domain", "no route to domain", NULL
};
static const char *const user_words[] = {
	"user unknown", "unknown user", "no such user", "user not found", "user doesn't exist",
	"user does not exist", "no such mailbox", "mailbox not found", "mailbox unavailable",
	"mailbox does not exist", "mailbox doesn't exist", "invalid mailbox", "invalid recipient",
	"unknown recipient", "recipient unknown", "recipient not found", "recipientnotfound",
	"no such recipient", "recipient does not exist", "address does not exist",
	"does not exist", "doesn't exist", "doesn't have a", "no mailbox here", "not a valid mailbox",
	"unknown local part", "unknown address", "address unknown", "invalid address",
	"unrouteable address", "unroutable address", "address couldn't be found",
	"address could not be found", "address not found", "account is disabled",
	"account has been disabled", "account disabled", "mailbox disabled", "mailbox is disabled",
	"is disabled", "no longer active", "account is inactive", "mailbox is inactive",
	"addressee unknown", "not our customer", "no such address", "bad recipient",
	"mailbox name not allowed", "recipient address rejected: access denied", NULL
};
static const char *const policy_words[] = {
	"blocked", "denied", "policy", "prohibited", "not allowed", "not authorized",
	"refused by", "administrative", "permission to post", NULL
};

/* 4. words of an expiry or a system error */
static const char *const expired_words[] = {
	"expired", "retry timeout exceeded", "too long in queue", "delivery time",
	"could not be delivered within", "giving up", "given up", "time limit", NULL
};
static const char *const system_words[] = {
	"network error", "connection refused", "connection timed out", "timed out", "timeout", "temporary failure",
	"temporarily unavailable", "service unavailable", "local error", "internal error",
	"system error", "try again later", "insufficient system storage", "loops back",
	"mail loop", "too many hops", "routing loop", "unable to connect", "network", NULL
};

static const TroublePhrases not_address[] = {
	{TROUBLE_AUTH_FAILURE, auth_words},
	{TROUBLE_POLICY_BLOCKED, sender_words},
	{TROUBLE_MAILBOX_FULL, full_words},
	{TROUBLE_MESSAGE_TOO_LARGE, large_words},
	{TROUBLE_POLICY_BLOCKED, blocklist_words},
	{TROUBLE_RATE_LIMITED, rate_words},
	{TROUBLE_SPAM_FILTERED, spam_words},
	{TROUBLE_EXPIRED, gave_up_words},
};
static const TroublePhrases address[] = {
	{TROUBLE_HOST_UNKNOWN, host_words},
	{TROUBLE_USER_UNKNOWN, user_words},
	{TROUBLE_POLICY_BLOCKED, policy_words},
};
static const TroublePhrases weak[] = {
	{TROUBLE_EXPIRED, expired_words},
	{TROUBLE_SYSTEM_ERROR, system_words},
};

static char *lower_copy(const char *text);
static void drop_addresses(char *lower);
static bool phrases_in(const char *lower, const TroublePhrases *lists, int n,
					   TroubleReason *reason, const char **at);
static bool read_enhanced(const char *p, int *klass, int *subject, int *detail, int *len);
static bool read_reply(const char *p, int *code);
static TroubleReason by_code(int klass, int subject, int detail, bool *known);
static TroubleReason classify(const char *status, const char *text, bool address_refused);

/*
 * smtp_trouble_name
 *		The reason's name.
 */
const char *
smtp_trouble_name(TroubleReason reason)
{
	if ((int) reason < 0 || (int) reason >= (int) lengthof(reason_names))
		return "other";
	return reason_names[reason];
}

/*
 * smtp_trouble_hard
 *		Whether a bounce of this reason is hard.
 */
bool
smtp_trouble_hard(TroubleReason reason)
{
	return reason == TROUBLE_USER_UNKNOWN || reason == TROUBLE_HOST_UNKNOWN;
}

/*
 * A palloc'd copy of at most TROUBLE_MAX_TEXT octets of text with its
 * ASCII letters lower-cased; "" for NULL.
 */
static char *
lower_copy(const char *text)
{
	size_t		n = text ? strnlen(text, TROUBLE_MAX_TEXT) : 0;
	char	   *out = palloc(n + 1);
	size_t		i;

	for (i = 0; i < n; i++)
		out[i] = pg_ascii_tolower((unsigned char) text[i]);
	out[n] = '\0';
	return out;
}

/*
 * Takes out of lower, in place, each address in angle brackets and the
 * space after it, so that a phrase with the address inside reads as the
 * phrase: Courier's "550 User <gone> unknown" as "user unknown".
 */
static void
drop_addresses(char *lower)
{
	char	   *out = lower;
	const char *p = lower;

	while (*p != '\0')
	{
		size_t		n = (*p == '<') ? strcspn(p + 1, "<> \t\r\n") : 0;

		if (n > 0 && p[n + 1] == '>')
		{
			p += n + 2;
			if (*p == ' ')
				p++;
			continue;
		}
		*out++ = *p++;
	}
	*out = '\0';
}

/*
 * Whether lower (lower-cased text) holds a phrase of the n lists, taken
 * in their order: *reason is then the list's, *at (when not NULL) where
 * the phrase is.
 */
static bool
phrases_in(const char *lower, const TroublePhrases *lists, int n,
		   TroubleReason *reason, const char **at)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		const char *const *w;

		for (w = lists[i].phrases; *w != NULL; w++)
		{
			const char *hit = strstr(lower, *w);

			if (hit != NULL)
			{
				*reason = lists[i].reason;
				if (at != NULL)
					*at = hit;
				return true;
			}
		}
	}
	return false;
}

/*
 * Whether p starts with an RFC 3463 code, class 2, 4 or 5, each of its
 * other numbers one to three digits, and no digit or dot after it: its
 * numbers then, and its length in *len.
 */
static bool
read_enhanced(const char *p, int *klass, int *subject, int *detail, int *len)
{
	const char *q = p;
	int			v[3] = {0, 0, 0};
	int			i;

	if (*q != '2' && *q != '4' && *q != '5')
		return false;
	for (i = 0; i < 3; i++)
	{
		int			digits = 0;

		while (isdigit((unsigned char) *q))
		{
			if (++digits > 3)
				return false;
			v[i] = v[i] * 10 + (*q++ - '0');
		}
		if (digits == 0 || (i == 0 && digits != 1))
			return false;
		if (i < 2)
		{
			if (*q != '.')
				return false;
			q++;
		}
	}
	if (*q == '.' || isdigit((unsigned char) *q))
		return false;
	*klass = v[0];
	*subject = v[1];
	*detail = v[2];
	*len = (int) (q - p);
	return true;
}

/*
 * Whether p starts with a three-digit reply code of class 2 to 5 followed
 * by a space, a dash or the end: the code then.
 */
static bool
read_reply(const char *p, int *code)
{
	if (p[0] < '2' || p[0] > '5' || !isdigit((unsigned char) p[1]) ||
		!isdigit((unsigned char) p[2]) ||
		(p[3] != ' ' && p[3] != '-' && p[3] != '\0'))
		return false;
	*code = (p[0] - '0') * 100 + (p[1] - '0') * 10 + (p[2] - '0');
	return true;
}

/*
 * The reason an RFC 3463 code gives; *known false for a code that names
 * none (x.0.0, protocol and media errors).
 */
static TroubleReason
by_code(int klass, int subject, int detail, bool *known)
{
	*known = true;
	switch (subject)
	{
		case 1:
			if (detail == 1 || detail == 3 || detail == 6 || detail == 10 || detail == 351)
				return TROUBLE_USER_UNKNOWN;
			if (detail == 2)
				return TROUBLE_HOST_UNKNOWN;
			break;
		case 2:
			if (detail == 2)
				return TROUBLE_MAILBOX_FULL;
			if (detail == 3)
				return TROUBLE_MESSAGE_TOO_LARGE;
			if (detail == 1 && klass == 4)
				return TROUBLE_RATE_LIMITED;
			break;
		case 3:
			if (detail == 4)
				return TROUBLE_MESSAGE_TOO_LARGE;
			return TROUBLE_SYSTEM_ERROR;
		case 4:
			if (detail == 4)
				return TROUBLE_HOST_UNKNOWN;
			if (detail == 7)
				return TROUBLE_EXPIRED;
			return TROUBLE_SYSTEM_ERROR;
		case 7:
			if (detail >= 23 && detail <= 27)
				return TROUBLE_AUTH_FAILURE;
			if (detail == 28)
				return TROUBLE_RATE_LIMITED;
			return TROUBLE_POLICY_BLOCKED;
	}
	*known = false;
	return TROUBLE_OTHER;
}

/*
 * smtp_reply_parse
 *		Read a reply's first line: see smtp_trouble.h.
 */
bool
smtp_reply_parse(SmtpReply *r, const char *line)
{
	int			len;

	memset(r, 0, sizeof(SmtpReply));
	if (line == NULL || !read_reply(line, &r->code))
		return false;
	if (line[3] != '\0' &&
		read_enhanced(line + 4, &r->klass, &r->subject, &r->detail, &len))
		snprintf(r->status, sizeof(r->status), "%d.%d.%d", r->klass, r->subject, r->detail);
	else
		snprintf(r->status, sizeof(r->status), "%03d", r->code);
	return true;
}

/*
 * smtp_reply_classify
 *		What the classifier says of a reply that decided a mail: see
 *		smtp_trouble.h.  A refusal of anything but the recipient says
 *		nothing of the address, and is never a hard bounce.
 */
void
smtp_reply_classify(SmtpReply *r, SmtpAnswer answered)
{
	r->answered = answered;
	r->relay_wide = answered != SMTP_ANSWER_RCPT;
	r->reason = classify(r->status, r->text, !r->relay_wide);
	r->hard = smtp_trouble_hard(r->reason);
}

/*
 * smtp_trouble_of_failure
 *		The status and reason of a failed delivery: see smtp_trouble.h.
 */
TroubleReason
smtp_trouble_of_failure(const SmtpReply *reply, const char *error, char *status,
						size_t status_len)
{
	SmtpReply	read;

	if (reply != NULL && reply->status[0] != '\0')
	{
		strlcpy(status, reply->status, status_len);
		return reply->reason;
	}
	if (!smtp_reply_parse(&read, error) || read.code / 100 == 3)
		read.status[0] = '\0';
	strlcpy(status, read.status, status_len);
	return smtp_trouble_reason(error, error);
}

/*
 * smtp_trouble_reason
 *		The reason of a failure: see smtp_trouble.h and the file's head.
 */
TroubleReason
smtp_trouble_reason(const char *status, const char *text)
{
	return classify(status, text, true);
}

/*
 * classify
 *		The reason of a failure from status and text; address_refused false
 *		when what was refused is not the recipient (then it is never a hard
 *		bounce).  A text written as src/smtp_txn.c writes a refusal of
 *		anything but the recipient says so itself.
 */
static TroubleReason
classify(const char *status, const char *text, bool address_refused)
{
	char	   *lower = lower_copy(text);
	const char *s = status ? status : "";
	const char *refused;
	bool		have_enhanced = false;
	int			reply = 0;
	int			klass = 0;
	int			subject = 0;
	int			detail = 0;
	int			len;
	TroubleReason reason = TROUBLE_OTHER;
	bool		known;

	/*
	 * src/smtp_txn.c writes a refusal of anything but the recipient as
	 * "relay <peer> refused <what>: <reply>", and a recipient's refusal as
	 * "<reply> (relay <peer>, reply to RCPT TO)": the relay's name is no
	 * word of the reply.
	 */
	if (strncmp(s, "relay ", 6) == 0 && (refused = strstr(s, " refused ")) != NULL &&
		strstr(refused, ": ") != NULL)
	{
		address_refused = false;
		s = strstr(refused, ": ") + 2;
	}
	if (strncmp(lower, "relay ", 6) == 0 && (refused = strstr(lower, " refused ")) != NULL &&
		strstr(refused, ": ") != NULL)
	{
		address_refused = false;
		memmove(lower, strstr(refused, ": ") + 2, strlen(strstr(refused, ": ") + 2) + 1);
	}
	else
	{
		char	   *relay = strstr(lower, " (relay ");

		if (relay != NULL && strstr(relay, "reply to rcpt to)") != NULL)
			*relay = '\0';
	}

	/* the code: the status's, else the text's when it is a reply */
	if (read_enhanced(s, &klass, &subject, &detail, &len))
		have_enhanced = true;
	else if (read_reply(s, &reply) &&
			 read_enhanced(s + 4, &klass, &subject, &detail, &len))
		have_enhanced = true;
	if ((!have_enhanced || (subject == 0 && detail == 0)) && reply == 0)
	{
		int			k,
					su,
					d;

		/* (a reply without one is kept: the bare reply rule reads it) */
		if (read_reply(lower, &reply) && read_enhanced(lower + 4, &k, &su, &d, &len) &&
			(su != 0 || d != 0) && (!have_enhanced || k == klass))
		{
			have_enhanced = true;
			klass = k;
			subject = su;
			detail = d;
		}
	}

	drop_addresses(lower);
	if (phrases_in(lower, not_address, lengthof(not_address), &reason, NULL))
		goto done;
	if (phrases_in(lower, address, lengthof(address), &reason, NULL))
		goto done;
	if (have_enhanced)
	{
		reason = by_code(klass, subject, detail, &known);
		if (known)
			goto done;
	}
	if (phrases_in(lower, weak, lengthof(weak), &reason, NULL))
		goto done;
	reason = TROUBLE_OTHER;
	if (!have_enhanced && reply != 0)
	{
		if (reply == 550 || reply == 551 || reply == 553)
			reason = TROUBLE_USER_UNKNOWN;
		else if (reply == 552)
			reason = TROUBLE_MAILBOX_FULL;
		else if (reply == 421 || reply == 451 || reply == 452)
			reason = TROUBLE_SYSTEM_ERROR;
	}

done:
	pfree(lower);
	if (!address_refused && smtp_trouble_hard(reason))
		reason = TROUBLE_OTHER;
	return reason;
}

/*
 * smtp_trouble_in_text
 *		Where free text quotes the status of a failure: see smtp_trouble.h.
 */
bool
smtp_trouble_in_text(const char *text, char **status, char **line)
{
	const char *p;
	const char *found = NULL;
	const char *bare = NULL;
	char	   *code = NULL;
	char	   *bare_code = NULL;
	const char *start;
	const char *end;
	size_t		n;

	*status = NULL;
	*line = NULL;
	if (text == NULL)
		return false;

	/* a reply with its enhanced code, a qmail "(#5.1.1)", a bare code */
	for (p = text; *p && found == NULL; p++)
	{
		int			reply,
					k,
					s,
					d,
					len;
		bool		word_start = p == text ||
			!(isalnum((unsigned char) p[-1]) || p[-1] == '.' || p[-1] == '-');

		if (!word_start && p[-1] != '#')
			continue;
		if (word_start && read_reply(p, &reply) && reply >= 400 &&
			read_enhanced(p + 4, &k, &s, &d, &len) && k == reply / 100)
		{
			found = p;
			code = pnstrdup(p + 4, len);
		}
		else if (bare == NULL && read_enhanced(p, &k, &s, &d, &len) && k >= 4)
		{
			bare = p;
			bare_code = pnstrdup(p, len);
		}
	}
	if (found == NULL && bare != NULL)
	{
		found = bare;
		code = bare_code;
	}

	/* a reply without one, where a line starts with it or a server "said:" it */
	if (found == NULL)
	{
		for (p = text; *p && found == NULL; p++)
		{
			int			reply;
			const char *q = p;

			if (p != text && p[-1] != '\n' && p[-1] != ':' && p[-1] != ' ' && p[-1] != '\t')
				continue;
			if (p != text && (p[-1] == ' ' || p[-1] == '\t'))
			{
				/* at the start of a line, or after "...: " */
				const char *b = p - 1;

				while (b > text && (b[-1] == ' ' || b[-1] == '\t'))
					b--;
				if (b != text && b[-1] != ':' && b[-1] != '\n')
					continue;
			}
			/* Yahoo writes "554: delivery error: ..." */
			if (q[0] >= '4' && q[0] <= '5' && isdigit((unsigned char) q[1]) &&
				isdigit((unsigned char) q[2]) && q[3] == ':' && q[4] == ' ')
				reply = (q[0] - '0') * 100 + (q[1] - '0') * 10 + (q[2] - '0');
			else if (!read_reply(q, &reply) || q[3] != ' ')
				continue;
			if (reply >= 400 && q[4] != '\0' && !isdigit((unsigned char) q[4]))
			{
				found = p;
				code = pnstrdup(p, 3);
			}
		}
	}

	/* failing all, a phrase MTAs write for a failure */
	if (found == NULL)
	{
		char	   *lower = lower_copy(text);
		TroubleReason reason;
		const char *at = NULL;

		if (phrases_in(lower, address, 2, &reason, &at) ||
			phrases_in(lower, not_address, lengthof(not_address), &reason, &at) ||
			phrases_in(lower, address + 2, 1, &reason, &at) ||
			phrases_in(lower, weak, lengthof(weak), &reason, &at))
			found = text + (at - lower);
		pfree(lower);
		if (found == NULL)
			return false;
	}

	/* the line that says it, and the lines after it up to a blank one */
	start = found;
	while (start > text && start[-1] != '\n')
		start--;
	end = found;
	for (;;)
	{
		const char *nl = strchr(end, '\n');
		const char *next;

		if (nl == NULL)
		{
			end += strlen(end);
			break;
		}
		next = nl + 1;
		while (*next == ' ' || *next == '\t' || *next == '\r')
			next++;
		if (*next == '\n' || *next == '\0' || next - start > 900)
		{
			end = nl;
			break;
		}
		end = nl + 1;
	}
	n = end - start;
	{
		char	   *out = palloc(n + 1);
		size_t		o = 0;
		size_t		i;
		bool		space = false;

		/* white space, line breaks included, as one space */
		for (i = 0; i < n; i++)
		{
			char		c = start[i];

			if (c == ' ' || c == '\t' || c == '\r' || c == '\n')
			{
				space = o > 0;
				continue;
			}
			if (space)
				out[o++] = ' ';
			space = false;
			out[o++] = c;
		}
		out[o] = '\0';
		*line = out;
	}
	*status = code;
	return true;
}

/*
 * gatekeeper._bounce_reason(status text, detail text) RETURNS text
 *		The reason of a failure, as the suppression list and
 *		gatekeeper.events read it (smtp_trouble_reason); either argument
 *		may be NULL.
 */
Datum
gatekeeper_bounce_reason(PG_FUNCTION_ARGS)
{
	char	   *status = PG_ARGISNULL(0) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(0));
	char	   *detail = PG_ARGISNULL(1) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(1));

	PG_RETURN_TEXT_P(cstring_to_text(smtp_trouble_name(smtp_trouble_reason(status, detail))));
}
