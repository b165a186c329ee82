/*-------------------------------------------------------------------------
 *
 * unsubscribe.h
 *		One-click unsubscribe (RFC 8058): signed tokens naming a recipient
 *		and a queue, and the URLs that carry them (src/unsubscribe.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_UNSUBSCRIBE_H
#define GATEKEEPER_UNSUBSCRIBE_H

#include "utils/jsonb.h"

/*
 * Raise 22023 (54000 when too long for a header line) unless url is an
 * https URL holding {token} once that can carry a token for queue.
 */
extern bool gatekeeper_headers_have(Jsonb *headers, const char *name);
extern void gatekeeper_check_unsubscribe_url(const char *url, const char *queue);

/*
 * url_template with {token} replaced by the signed token for (recipient,
 * queue), palloc'd.  Reads the database's secret: call inside a
 * transaction, with SPI connected, as a role that may read it (the claim
 * is SECURITY DEFINER).
 */
extern char *gatekeeper_unsubscribe_url(const char *url_template,
										const char *recipient, const char *queue);

/*
 * The octets of the List-Unsubscribe and List-Unsubscribe-Post header lines
 * the claim adds to a mail to recipient in a queue whose unsubscribe_url is
 * url_template (0 when the mail's own headers hold List-Unsubscribe):
 * counted against gatekeeper.max_message_size at enqueue.  Reads no secret.
 */
extern Size gatekeeper_unsubscribe_headers_size(const char *url_template,
												const char *recipient,
												const char *queue,
												Jsonb *headers);

/*
 * HMAC-SHA256 (32 bytes into mac) of data under the secret that signs the
 * unsubscribe tokens.  Call inside a transaction with SPI connected.
 */
extern void gatekeeper_token_sign(const uint8 *data, int len, uint8 *mac);

/* the most bytes gatekeeper_token_secret copies */
#define GATEKEEPER_TOKEN_SECRET_MAX 64

/*
 * A copy of the secret itself, for a signer that keeps its key across
 * transactions (src/report.c).  Inside a transaction with SPI connected.
 */
extern int	gatekeeper_token_secret(uint8 *key);

#endif							/* GATEKEEPER_UNSUBSCRIBE_H */
