/*-------------------------------------------------------------------------
 *
 * suppression.h
 *		The suppression list, as the claim consults it and the reports,
 *		the nacks and unsubscribes add to it (src/suppression.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_SUPPRESSION_H
#define GATEKEEPER_SUPPRESSION_H

/*
 * One mail the claim asks about: its recipient's key (as
 * gatekeeper_recipient_key makes it), its queue and whether that queue is
 * transactional.  gatekeeper_suppression_check sets reason to the entry's
 * reason ("hard_bounce", "complaint", "unsubscribe", "manual",
 * "soft_bounce"; a static
 * string) when the mail must not go, NULL otherwise.
 */
typedef struct GatekeeperSuppressionProbe
{
	const char *key;
	const char *queue;
	bool		transactional;
	const char *reason;
} GatekeeperSuppressionProbe;

/*
 * Look up n mails in one statement, one index probe per distinct
 * recipient.  Call inside a transaction with SPI connected.
 */
extern void gatekeeper_suppression_check(GatekeeperSuppressionProbe *probes, int n);

/*
 * Add an entry for an address key (queue NULL: every queue; detail may be
 * NULL; mail_id 0: no mail), or give the entry there the new reason when
 * that stops more; true when the entry is new.  Call inside a transaction
 * with SPI connected.
 */
extern bool gatekeeper_suppression_add(const char *address_key, const char *reason,
									   const char *queue, const char *detail, int64 mail_id);

#endif							/* GATEKEEPER_SUPPRESSION_H */
