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
