/*-------------------------------------------------------------------------
 *
 * report.h
 *		After the relay said 250: VERP tokens, the envelope a mail goes out
 *		with, and the reports that come back (src/report.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_REPORT_H
#define GATEKEEPER_REPORT_H

/* the length of a VERP token: base32 of the mail id and a truncated HMAC */
#define GATEKEEPER_VERP_TOKEN_LEN	29

/*
 * The envelope sender for mail mail_id of queue: its return_path with
 * {token} replaced, or NULL when the queue has none (the From address is
 * the envelope sender then); *token is set to the mail's VERP token, for
 * the DSN's ENVID, either way.  palloc'd in the current memory context.
 * Call inside a transaction (SPI is connected and finished inside, when
 * something must be read).  The queues' return paths and the secret's
 * HMAC key are read once and kept, across transactions, until
 * gatekeeper_report_envelope_refresh: the worker refreshes them at each
 * claim, so a mail goes with what its queue held when it was claimed or
 * later, and no mail costs a statement of its own.
 */
extern char *gatekeeper_report_envelope(const char *queue, int64 mail_id, char **token);

/* forget what gatekeeper_report_envelope kept: the next one reads again */
extern void gatekeeper_report_envelope_refresh(void);

/*
 * What a bounce of mail mail_id to address_key (the address with its ASCII
 * letters lower-cased, as the suppression list keys it) does to the
 * suppression list: a hard bounce (hard: what src/smtp_trouble.c's
 * classifier said of the reply or the report, user or host unknown)
 * suppresses the address
 * everywhere; any other does once gatekeeper.soft_bounce_limit mails to it
 * bounced within 30 days.  Call it after the bounce's event is written, in
 * a transaction with an active snapshot; it connects to SPI itself.  The
 * one place of the rule: ingest_report, record_event and the nacks
 * (src/mail/mail_state.c) all come here.
 */
extern void report_bounce(const char *address_key, bool hard, const char *detail,
						  int64 mail_id);

#endif							/* GATEKEEPER_REPORT_H */
