/*-------------------------------------------------------------------------
 *
 * claim_take.h
 *		One queue's share of a claim taken without the executor
 *		(src/claim_take.c), for src/claim.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_CLAIM_TAKE_H
#define GATEKEEPER_CLAIM_TAKE_H

#include "due_floor.h"

/* A taken mail's columns: the claim statement's RETURNING list (claim.c). */
enum
{
	CT_ID,
	CT_ATTEMPT,
	CT_QUEUE,
	CT_RECIPIENT,
	CT_RECIPIENT_NAME,
	CT_SENDER,
	CT_SUBJECT,
	CT_BODY,
	CT_HTML,
	CT_HEADERS,
	CT_MESSAGE_ID,
	CT_METADATA,				/* the last column claim returns */
	CT_EXPIRED,
	CT_PRIORITY,
	CT_SEND_AT,
	CT_SEND_BY,
	CT_TIMEZONE,
	CT_DUE,					/* since when it waits: send_at, or its enqueue */
	CT_TEMPLATE,				/* a templated mail's template, version, data */
	CT_TEMPLATE_VERSION,
	CT_DATA,
	CT_CREATED_AT,
	CT_RECORD,				/* the claim state as a mail_live record */
	CLAIM_TAKE_COLUMNS
};

/*
 * Takes one mail's columns; the values live until the next mail is taken
 * (may be TOASTed).
 */
typedef void (*claim_take_receiver) (void *arg, Datum *values, bool *nulls);

extern int	gatekeeper_claim_take(const char *queue, int share, const DueKey *floor,
								  text *worker, const char *domain,
								  const char *default_sender,
								  claim_take_receiver receive, void *arg);

#endif							/* GATEKEEPER_CLAIM_TAKE_H */
