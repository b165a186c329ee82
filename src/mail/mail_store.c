/*-------------------------------------------------------------------------
 *
 * mail_store.c
 *		The mail's store as the rest of gatekeeper uses it (mail_store.h):
 *		each move a thin door onto the file of src/mail/ that makes it.
 *
 * The moves themselves live in claim.c (claim), mail_state.c (ack, nack,
 * unclaim, extend), mail_state_sweep.c (reap, purge and rotate), mail.c
 * and mail_copy.c (new mail, its COPY) and mail_count.c (the counts, at
 * transaction end); no logic is added here.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "mail_store.h"
#include "claim.h"
#include "mail.h"
#include "mail_copy.h"
#include "mail_state.h"

/*
 * mail_store_init
 *		Install, in _PG_init, the hook that writes a COPY into
 *		gatekeeper.mail straight into its segment, and the executor hook
 *		that refuses RETURNING from skipping inserts.
 */
void
mail_store_init(void)
{
	gatekeeper_mail_copy_init();
	gatekeeper_mail_init();
}

/*
 * mail_store_segment
 *		The retention segment new mail goes to in this transaction; 0 when
 *		the extension's table is not there and missing_ok.
 */
int16
mail_store_segment(bool missing_ok)
{
	return gatekeeper_current_segment(missing_ok);
}

/*
 * mail_store_claim
 *		claim: up to batch due mails for worker, each handed to receive
 *		(gatekeeper_claim_mails, src/mail/claim.c).
 */
int
mail_store_claim(text *worker, int batch, Interval *lease, ArrayType *filter,
				 int64 max_bytes, gatekeeper_claim_receiver receive, void *arg)
{
	return gatekeeper_claim_mails(worker, batch, lease, filter, max_bytes,
								  receive, arg);
}

/*
 * mail_store_ack
 *		ack: the claims still open go to mail_done as sent; returns how
 *		many were (mail_state_ack).
 */
int
mail_store_ack(const int64 *ids, const int32 *attempts, int n)
{
	return mail_state_ack(ids, attempts, n);
}

/*
 * mail_store_nack
 *		nack: each claim still open retried later or failed, its resulting
 *		state set in its MailNack (mail_state_nack).
 */
int
mail_store_nack(MailNack *nacks, int n)
{
	return mail_state_nack(nacks, n);
}

/*
 * mail_store_unclaim
 *		unclaim: the claims still open handed back unsent and uncharged,
 *		due at due at the earliest (mail_state_unclaim).
 */
int
mail_store_unclaim(const int64 *ids, const int32 *attempts, int n,
				   const char *error, TimestampTz due)
{
	return mail_state_unclaim(ids, attempts, n, error, due);
}

/*
 * mail_store_extend_one
 *		extend: one claim's batch lease to lease_end, never shorter;
 *		whether the claim is current (mail_state_extend_one).
 */
bool
mail_store_extend_one(int64 id, int32 attempt, TimestampTz lease_end)
{
	return mail_state_extend_one(id, attempt, lease_end);
}

/*
 * mail_store_extend
 *		extend, for the background worker: the claims' leases to lease_end,
 *		held[i] set to whether claim i was open (mail_state_extend).
 */
int
mail_store_extend(const int64 *ids, const int32 *attempts, int n,
				  TimestampTz lease_end, bool *held)
{
	return mail_state_extend(ids, attempts, n, lease_end, held);
}

/*
 * mail_store_reap
 *		reap: the claims whose lease ran out or whose server is gone
 *		settled (gatekeeper_mail_reap, src/mail/mail_state_sweep.c).
 */
int32
mail_store_reap(void)
{
	return gatekeeper_mail_reap();
}

/*
 * mail_store_purge
 *		purge: the retention segments rotated and expired gate log rows
 *		removed (gatekeeper_mail_purge, src/mail/mail_state_sweep.c).
 */
int64
mail_store_purge(int32 batch)
{
	return gatekeeper_mail_purge(batch);
}
