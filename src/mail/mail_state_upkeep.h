/*-------------------------------------------------------------------------
 *
 * mail_state_upkeep.h
 *		What purge() uses of src/mail_state_upkeep.c: the pass that deletes
 *		stale dedupe keys and the shrinking of a drained mail_claim.  (The
 *		TRUNCATE and restore triggers there are SQL entry points only.)
 *
 * Both run with SPI connected, inside a transaction.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_MAIL_STATE_UPKEEP_H
#define GATEKEEPER_MAIL_STATE_UPKEEP_H

extern int64 mail_state_key_prune(int32 batch);
extern bool mail_state_claim_shrink(void);

#endif							/* GATEKEEPER_MAIL_STATE_UPKEEP_H */
