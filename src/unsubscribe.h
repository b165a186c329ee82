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

/*
 * Raise 22023 (54000 when too long for a header line) unless url is an
 * https URL holding {token} once that can carry a token for queue.
 */
extern void gatekeeper_check_unsubscribe_url(const char *url, const char *queue);

/*
 * url_template with {token} replaced by the signed token for (recipient,
 * queue), palloc'd.  Reads the database's secret: call inside a
 * transaction, with SPI connected, as a role that may read it (the claim
 * is SECURITY DEFINER).
 */
extern char *gatekeeper_unsubscribe_url(const char *url_template,
										const char *recipient, const char *queue);

#endif							/* GATEKEEPER_UNSUBSCRIBE_H */
