/*-------------------------------------------------------------------------
 *
 * mail_state.h
 *		The changes of a mail's state: a claimed mail's transitions
 *		(src/mail/mail_state.c; a nack's, src/mail/mail_nack.c), and reap,
 *		cancel, sync, rotate and purge (src/mail/mail_state_sweep.c); what
 *		src/mail/ uses of them (outside it, mail_store.h).
 *
 * Every function here runs with SPI connected, inside a transaction.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_MAIL_STATE_H
#define GATEKEEPER_MAIL_STATE_H

#include "access/attnum.h"
#include "access/tupdesc.h"
#include "datatype/timestamp.h"
#include "live_record.h"
#include "mail_store.h"

/*
 * The column lists of the tables a mail's state lives in, each written
 * once: every INSERT into them (this module's and the claim's) names its
 * columns by these.  MAIL_LIVE_COLUMNS is also the order of the row type
 * gatekeeper.mail_live, which the claim's records and mail_claim's
 * batches hold; MAIL_DONE_COLUMNS are mail_done's but finished_at, each
 * of them a mail_live column too, so a record's values fill them.
 */
#define MAIL_LIVE_COLUMNS \
	"id, queue, priority, send_at, state, attempt, uncharged, worker, " \
	"message_id, last_error, dedupe_key, segment"
#define MAIL_DONE_COLUMNS \
	"id, queue, state, attempt, uncharged, send_at, worker, " \
	"message_id, last_error, dedupe_key, segment"
#define MAIL_CLAIM_COLUMNS \
	"queue, worker, lease_until, lo, hi, open, mails, owner"

/*
 * A claim's owner, kept in its batch row (mail_claim.owner): the OID of
 * the role that claimed, or CLAIM_OWNER_BACKGROUND for a background
 * worker's claim, which no role is; NULL for a claim made before 0.3.0
 * by an external worker.  Only the owner (a superuser too, but not for a
 * background worker's claim) acks, nacks, extends or unclaims it.
 */
#define CLAIM_OWNER_BACKGROUND	InvalidOid

/* A queue's policy, as a nack or an unclaim applies it. */
typedef struct QueuePolicy
{
	char	   *name;
	int32		max_attempts;	/* 1 when the queue is gone */
	int64		retry_for;		/* usecs: 0 when the queue is gone */
	bool		notify;
	TimestampTz due;			/* unclaim: the earliest mail handed back */
} QueuePolicy;

/* claims in (id, attempt) order */
static inline int
mail_state_claim_cmp(int64 id1, int32 attempt1, int64 id2, int32 attempt2)
{
	if (id1 != id2)
		return id1 < id2 ? -1 : 1;
	return (attempt1 > attempt2) - (attempt1 < attempt2);
}

extern void mail_state_record_init(LiveRecord *lr, Oid type);
extern Datum mail_state_record_moved(LiveRecord *lr, Datum record, Datum state,
									 bool set_error, const char *error, TimestampTz send_at,
									 bool uncharged);
extern void mail_state_insert_live(LiveRecord *lr, Datum *records, int n);
extern void mail_state_insert_done(LiveRecord *lr, Datum *records, int n);

extern Oid	mail_state_claimant(void);
extern int	mail_state_id_cmp(const void *a, const void *b);
extern Datum *mail_state_take_claimed(const int64 *ids, const int32 *attempts, int n,
									  int *ntaken, LiveRecord *lr, MemoryContext keep);
extern Datum *mail_state_take_own(const int64 *ids, const int32 *attempts, int n,
								  int *ntaken, LiveRecord *lr, MemoryContext keep);
extern QueuePolicy *mail_state_load_policies(LiveRecord *lr, Datum *records, int n,
											 int *npolicies);
extern QueuePolicy *mail_state_find_policy(QueuePolicy *policies, int n, const char *name);
extern int	mail_state_ack(const int64 *ids, const int32 *attempts, int n);
extern int	mail_state_unclaim(const int64 *ids, const int32 *attempts, int n,
							   const char *error, TimestampTz due);
extern bool mail_state_extend_one(int64 id, int32 attempt, TimestampTz lease_end);
extern int	mail_state_extend(const int64 *ids, const int32 *attempts, int n,
							  TimestampTz lease_end, bool *held);

/* src/mail/mail_nack.c */
extern int	mail_state_nack(MailNack *nacks, int n);

/* src/mail_state_sweep.c */
extern int32 gatekeeper_mail_reap(void);
extern int64 gatekeeper_mail_purge(int32 batch);

#endif							/* GATEKEEPER_MAIL_STATE_H */
