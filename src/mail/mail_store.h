/*-------------------------------------------------------------------------
 *
 * mail_store.h
 *		The mail's store as the rest of gatekeeper uses it: the one door
 *		into src/mail/.  Outside src/mail/ no file includes another header
 *		of this directory.
 *
 * Each move of a mail's state machine that C outside this directory
 * makes has one function here (src/mail/mail_store.c), named by the
 * SQL function that makes the same move.  The moves only SQL makes are
 * the SQL functions and triggers of this directory, reached by no C
 * outside it: enqueue (gatekeeper.enqueue, enqueue.c, and the insert
 * trigger on gatekeeper.mail, mail.c), cancel and cancel_queue, retry,
 * rotate (_rotate) and the owner's UPDATE or DELETE of mail
 * (mail_state_sweep.c, mail_state_sync.c); a claim's deferral to a
 * gate's next opening is part of the claim.
 *
 * Every move runs with SPI connected, inside a transaction.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_MAIL_STORE_H
#define GATEKEEPER_MAIL_STORE_H

#include "access/xact.h"
#include "datatype/timestamp.h"
#include "utils/array.h"
#include "smtp_trouble.h"

/* A claimed mail's columns, in the order gatekeeper.claim returns them. */
enum
{
	GATEKEEPER_CLAIM_ID,
	GATEKEEPER_CLAIM_ATTEMPT,
	GATEKEEPER_CLAIM_QUEUE,
	GATEKEEPER_CLAIM_RECIPIENT,
	GATEKEEPER_CLAIM_RECIPIENT_NAME,
	GATEKEEPER_CLAIM_SENDER,
	GATEKEEPER_CLAIM_SUBJECT,
	GATEKEEPER_CLAIM_BODY,
	GATEKEEPER_CLAIM_HTML,
	GATEKEEPER_CLAIM_HEADERS,	/* jsonb */
	GATEKEEPER_CLAIM_MESSAGE_ID,
	GATEKEEPER_CLAIM_METADATA,	/* jsonb */
	GATEKEEPER_CLAIM_COLUMNS
};

/*
 * Takes one claimed mail: its columns (values may be TOASTed: detoast
 * before the transaction ends) and when it became due.
 */
typedef void (*gatekeeper_claim_receiver) (void *arg, Datum *values, bool *nulls,
										   TimestampTz due);

/* A nack: a claim (id, attempt), what went wrong, and what became of it. */
typedef struct MailNack
{
	int64		id;
	int32		attempt;
	const char *error;			/* the relay's reply; NULL allowed */
	const SmtpReply *reply;		/* the reply as the worker read it, or NULL:
								 * its status and reason are read from error */
	bool		permanent;		/* fail at once (a 5xx) */
	const char *state;			/* out: "failed", "scheduled", or NULL: not
								 * a current claim */
} MailNack;

/* _PG_init: the executor and utility hooks of new mail and its COPY */
extern void mail_store_init(void);

/*
 * the counts noted in this (sub)transaction, published or forgotten
 * (src/mail/mail_count.c; src/xact.c calls them)
 */
extern void mail_store_at_xact_end(XactEvent event);
extern void mail_store_at_subxact_end(SubXactEvent event);

/* _PG_init, when preloaded: a dropped extension's or database's totals go */
extern void mail_store_count_init(void);

/* the shmem hooks' part: the queues' totals (src/mail/count_totals.c) */
extern void mail_store_totals_shmem_request(void);
extern void mail_store_totals_shmem_init(void);

/* a report ingest_report or record_event took, recorded or ignored */
extern void mail_store_count_report(bool recorded);

/* the retention segment new mail goes to; 0 when missing_ok and no table */
extern int16 mail_store_segment(bool missing_ok);

/*
 * claim: up to batch due mails handed to receive, within max_bytes of
 * content (0: no bound; the first always handed over); the number claimed
 */
extern int	mail_store_claim(text *worker, int batch, Interval *lease, ArrayType *filter,
							 int64 max_bytes,
							 gatekeeper_claim_receiver receive, void *arg);

/* ack: the current claims among (ids, attempts) sent; how many were */
extern int	mail_store_ack(const int64 *ids, const int32 *attempts, int n);

/* nack: each claim retried later or failed, its state set; how many were */
extern int	mail_store_nack(MailNack *nacks, int n);

/* unclaim: the claims handed back uncharged, due again at due; how many */
extern int	mail_store_unclaim(const int64 *ids, const int32 *attempts, int n,
							   const char *error, TimestampTz due);

/* extend: one claim's lease to lease_end; false when not a current claim */
extern bool mail_store_extend_one(int64 id, int32 attempt, TimestampTz lease_end);

/* extend: the claims' leases to lease_end, held[i] set; how many held */
extern int	mail_store_extend(const int64 *ids, const int32 *attempts, int n,
							  TimestampTz lease_end, bool *held);

/* reap: the claims whose lease ran out or whose server is gone settled */
extern int32 mail_store_reap(void);

/*
 * purge: rotate (finished mail past gatekeeper.retention removed with
 * its segment) and up to batch expired gate log rows; the rows removed
 */
extern int64 mail_store_purge(int32 batch);

#endif							/* GATEKEEPER_MAIL_STORE_H */
