/*-------------------------------------------------------------------------
 *
 * suppression.h
 *		The suppression list, as the claim consults it (src/suppression.c).
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

#endif							/* GATEKEEPER_SUPPRESSION_H */
