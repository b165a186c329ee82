/*-------------------------------------------------------------------------
 *
 * worker_record.h
 *		What the worker's loop (worker.c) uses of worker_record.c: the
 *		recording of outcomes, run in a subtransaction.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_WORKER_RECORD_H
#define GATEKEEPER_WORKER_RECORD_H

#include "smtp_client.h"

/* the outcomes a round records, and what it found */
typedef struct RecordStep
{
	GatekeeperDelivery **items;
	int			n;
	int			nsent;
	int			acked;			/* of the sent, how many were still claimed */
} RecordStep;

extern bool worker_record_step(void *arg);

#endif							/* GATEKEEPER_WORKER_RECORD_H */
