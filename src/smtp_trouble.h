/*-------------------------------------------------------------------------
 *
 * smtp_trouble.h
 *		What a failure means: the reason of a relay's refusal or of a
 *		bounce, read from its status and its text together
 *		(src/smtp_trouble.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_SMTP_TROUBLE_H
#define GATEKEEPER_SMTP_TROUBLE_H

/* why a mail failed; the names are gatekeeper.events' reason */
typedef enum TroubleReason
{
	TROUBLE_USER_UNKNOWN,		/* the mailbox does not exist: hard */
	TROUBLE_HOST_UNKNOWN,		/* the domain does not exist: hard */
	TROUBLE_MAILBOX_FULL,
	TROUBLE_MESSAGE_TOO_LARGE,
	TROUBLE_POLICY_BLOCKED,		/* blocked by policy or reputation */
	TROUBLE_SPAM_FILTERED,		/* content: spam or a virus */
	TROUBLE_AUTH_FAILURE,		/* SPF, DKIM, DMARC */
	TROUBLE_EXPIRED,			/* retried until the MTA gave up */
	TROUBLE_RATE_LIMITED,
	TROUBLE_SYSTEM_ERROR,
	TROUBLE_OTHER
} TroubleReason;

/* the most of a reply's text kept with it */
#define SMTP_REPLY_TEXT_MAX		200

/* what a relay's reply answered */
typedef enum SmtpAnswer
{
	SMTP_ANSWER_NONE,			/* no reply decided it (a timeout, a limit) */
	SMTP_ANSWER_MAIL,			/* MAIL FROM */
	SMTP_ANSWER_RCPT,			/* RCPT TO: the recipient's */
	SMTP_ANSWER_DATA,			/* DATA, BDAT or the message */
} SmtpAnswer;

/*
 * A relay's reply, read once where it arrives (src/smtp_session.c) and
 * carried with its delivery to the outcome, the nack's event, the
 * suppression list and the breakers.  The code and its RFC 3463 status
 * are the first line's (RFC 2034); the text is what last_error shows.
 * What the classifier says of it is filled by smtp_reply_classify once
 * the reply is known to decide a mail.
 */
typedef struct SmtpReply
{
	int			code;			/* the three-digit reply code, 0 for none */
	int			klass;			/* class.subject.detail (RFC 3463) of the */
	int			subject;		/* first line; klass 0 when it has none */
	int			detail;
	char		status[16];		/* "5.1.1", else the code "550", else "" */
	char		text[SMTP_REPLY_TEXT_MAX];	/* the reply's last line */
	SmtpAnswer	answered;		/* what it answered */
	TroubleReason reason;		/* why the mail failed, by the classifier */
	bool		hard;			/* a hard bounce: never mail the address again */
	bool		relay_wide;		/* says something of the relay or the
								 * transaction, not of the recipient */
} SmtpReply;

/*
 * Read a reply's first line ("550-5.1.1 ...", "250 OK"): its code and its
 * enhanced status code; the rest of r is cleared.  Returns whether line
 * starts with a reply code.
 */
extern bool smtp_reply_parse(SmtpReply *r, const char *line);

/*
 * What the classifier says of reply r, which answered what, set in r:
 * its reason, whether it is a hard bounce, whether it is relay-wide.
 */
extern void smtp_reply_classify(SmtpReply *r, SmtpAnswer answered);

/*
 * The status and reason of a failed delivery, for its event and the
 * suppression list: a reply the worker read and classified (reply not
 * NULL, with a status) says them itself; else (an external worker's
 * nack, a failure no reply decided: a timeout, a lost connection) they
 * are read from the error text: *status is the reply that starts it
 * ("550 5.1.1 ..." gives 5.1.1, "550 ..." 550), "" for none, and the
 * reason is the classifier's of the text.
 */
extern TroubleReason smtp_trouble_of_failure(const SmtpReply *reply, const char *error,
											 char *status, size_t status_len);

/*
 * The reason of a failure from its status and its text together: status
 * is an RFC 3463 code ("5.1.1"), a reply ("550 5.1.1 ...", "550"), or a
 * nack's error as src/smtp_txn.c writes it; text is the diagnostic (the
 * same error, a DSN's Diagnostic-Code, a bounce's lines).  Either may be
 * NULL.  The text's words decide over the code where they say the
 * mailbox is full, the message too large or blocked ("550 5.1.1 mailbox
 * full" is mailbox_full); a refusal of anything but the recipient (the
 * MAIL FROM, the data) never reads as an unknown address.
 */
extern TroubleReason smtp_trouble_reason(const char *status, const char *text);

/* the reason's name: "user_unknown", ... */
extern const char *smtp_trouble_name(TroubleReason reason);

/*
 * Whether a bounce of this reason is hard: the address failed (user or
 * host unknown), never mail it again.
 */
extern bool smtp_trouble_hard(TroubleReason reason);

/*
 * Where free text (a bounce written for people) quotes the status of the
 * failure: *status set to the RFC 3463 code (or the three-digit reply
 * when the text gives none), *line to the line that says it, trimmed,
 * both palloc'd; NULL when the text quotes none.  The reply an MTA
 * quotes ("550 5.1.1 ...", "said: 550 ...", "(#5.1.1)", Yahoo's "554:
 * delivery error") comes first, a bare code next, and failing both the
 * line of a phrase MTAs write for a failure ("User unknown", "mailbox is
 * full", "permission to post").  Returns whether any was found.
 */
extern bool smtp_trouble_in_text(const char *text, char **status, char **line);

#endif							/* GATEKEEPER_SMTP_TROUBLE_H */
