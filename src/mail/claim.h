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
#include "mail_store.h"

/*
 * max_bytes: the most content (subject, body, html and headers, each
 * {message_id} at its Message-ID's length) the mails handed over may hold
 * together, the first always handed over; 0 for no bound.
 */
extern int	gatekeeper_claim_mails(text *worker, int batch, Interval *lease, ArrayType *filter,
								   int64 max_bytes,
								   gatekeeper_claim_receiver receive, void *arg);

#endif							/* GATEKEEPER_CLAIM_H */
