/*-------------------------------------------------------------------------
 *
 * claim_queues.h
 *		The queues a claim may take from, with their policies
 *		(src/claim_queues.c), for src/claim.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_CLAIM_QUEUES_H
#define GATEKEEPER_CLAIM_QUEUES_H

#include "utils/array.h"
#include "utils/timestamp.h"
#include "window.h"

/* A gate as a queue applies it. */
typedef struct QueueGate
{
	char	   *name;
	int32		id;
	int32		max_sends;
	TimestampTz expiry;			/* of a pass made now */
} QueueGate;

/* A queue taking part in this claim. */
typedef struct ClaimQueue
{
	char	   *name;
	int			weight;
	bool		defer;			/* on_gate_closed = 'defer' */
	int			ngates;
	QueueGate  *gates;
	bool		limited;		/* has a rate limit */
	double		tokens;			/* rate limit budget for this claim */
	int			cap;			/* most mails this claim may take from it */
	int			got;			/* claimed so far (winners and losers) */
	int			sent;			/* winners */
	bool		more;			/* may hold more due mail */
	bool		transactional;	/* global unsubscribes and complaints do not stop it */
	char	   *unsubscribe_url;	/* NULL: no List-Unsubscribe */
	char	   *feedback_id;	/* NULL: no Feedback-ID */
	bool		has_window;		/* sends only within window */
	GatekeeperWindow window;
	char	   *send_window;	/* as given, for messages */
	char	   *timezone;		/* for mail that names none */
} ClaimQueue;

extern ClaimQueue *claim_load_queues(ArrayType *filter, int *nqueues);
extern void claim_spend_tokens(ClaimQueue *queues, int nqueues);

#endif							/* GATEKEEPER_CLAIM_QUEUES_H */
