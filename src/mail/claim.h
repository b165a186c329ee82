/*-------------------------------------------------------------------------
 *
 * claim.h
 *		The claim (src/claim.c) as the background worker calls it: without
 *		SQL between, the claimed mails handed to the worker one by one.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_CLAIM_H
#define GATEKEEPER_CLAIM_H

#include "datatype/timestamp.h"
#include "utils/array.h"

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

/*
 * max_bytes: the most content (subject, body, html and headers, each
 * {message_id} at its Message-ID's length) the mails handed over may hold
 * together, the first always handed over; 0 for no bound.
 */
extern int	gatekeeper_claim_mails(text *worker, int batch, Interval *lease, ArrayType *filter,
								   int64 max_bytes,
								   gatekeeper_claim_receiver receive, void *arg);

#endif							/* GATEKEEPER_CLAIM_H */
