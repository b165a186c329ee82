/*-------------------------------------------------------------------------
 *
 * report_parse.h
 *		Reading delivery status notifications (RFC 3464) and feedback
 *		reports (RFC 5965) out of a raw message (src/report_parse.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_REPORT_PARSE_H
#define GATEKEEPER_REPORT_PARSE_H

/* per-recipient groups of one DSN kept; the rest are passed over */
#define REPORT_MAX_RECIPIENTS	32

typedef enum ReportKind
{
	REPORT_NONE,				/* not a report this module understands */
	REPORT_DSN,					/* multipart/report; delivery-status */
	REPORT_ARF					/* multipart/report; feedback-report */
} ReportKind;

/* One per-recipient group of a DSN; any field may be NULL. */
typedef struct ReportRecipient
{
	char	   *final_recipient;	/* the bare address of Final-Recipient */
	char	   *original_recipient; /* of Original-Recipient (our ORCPT) */
	char	   *action;			/* lower-cased: failed, delayed, ... */
	char	   *status;			/* an RFC 3463 code, "5.1.1" */
	char	   *diagnostic;		/* Diagnostic-Code less its type */
} ReportRecipient;

/*
 * What a report says.  Every string is palloc'd in the caller's memory
 * context, printable (control characters and, unless the database is
 * UTF-8 and they are well formed, non-ASCII octets are replaced) and
 * bounded in length; NULL when absent.
 */
typedef struct ParsedReport
{
	ReportKind	kind;
	char	   *envid;			/* Original-Envelope-Id, xtext decoded */
	char	   *delivered_to[3];	/* the report's Delivered-To, X-Original-To,
									 * To addresses */
	char	   *returned_message_id;	/* the returned message's Message-ID */
	char	   *returned_return_path;	/* and its Return-Path address */
	/* a bounce written for people, and what tells it from an auto-reply */
	char	   *text;			/* the first text/plain part, decoded, NUL
								 * ended, cut where the returned message's
								 * copy starts; not cleaned */
	bool		from_daemon;	/* From a mailer-daemon or postmaster */
	bool		failure_subject;	/* a Subject that says delivery failed */
	bool		auto_reply;		/* marked (RFC 3834) or titled as one */
	bool		delay_subject;	/* a Subject that says delivery is delayed */
	bool		delay_text;		/* a text that says it warns of a delay */
	bool		delay_notice;	/* either, and no Subject of a failure */
	bool		forwarded;		/* a message/rfc822 outside any report */
	/* ARF */
	char	   *feedback_type;	/* lower-cased */
	char	   *user_agent;
	char	   *original_mail_from;
	char	   *original_rcpt_to;
	char	   *removal_recipient;	/* an opt-out's Removal-Recipient */
	/* DSN */
	int			nrecipients;
	ReportRecipient recipients[REPORT_MAX_RECIPIENTS];
} ParsedReport;

/*
 * Parse len octets of a raw message (RFC 5322 with MIME) into *out.
 * Never raises an error for what the message holds: a message that is not
 * a report, or is malformed, truncated or nested past the bounds, gives
 * kind REPORT_NONE or whatever could be read of it.  Work and memory are
 * linear in len and bounded by the module's limits.
 */
extern void report_parse(const char *data, size_t len, ParsedReport *out);

/*
 * A palloc'd, printable copy of n octets, trimmed and at most 1000 octets
 * long, as the fields of ParsedReport are made; NULL when nothing is left.
 */
extern char *report_clean(const char *p, size_t n);

#endif							/* GATEKEEPER_REPORT_PARSE_H */
