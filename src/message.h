/*-------------------------------------------------------------------------
 *
 * message.h
 *		What the rest of gatekeeper uses of message.c: the claimed mail and
 *		the RFC 5322 message built for it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_MESSAGE_H
#define GATEKEEPER_MESSAGE_H

#include "datatype/timestamp.h"
#include "lib/stringinfo.h"

/*
 * One claimed mail, as gatekeeper.claim returns it.  Strings are
 * NUL-terminated; sender, html and headers_json may be NULL.
 */
typedef struct GatekeeperMail
{
	int64		id;
	int32		attempt;
	char	   *queue;
	char	   *recipient;
	char	   *recipient_name; /* display name in To, or NULL */
	char	   *sender;
	char	   *subject;
	char	   *body;
	char	   *html;
	char	   *headers_json;	/* a JSON object of header name -> value */
	char	   *message_id;		/* "<...@...>", identical on every attempt */
	TimestampTz due;			/* since when it waits: its send_at, or its
								 * enqueue when that was later; 0 if unknown */
} GatekeeperMail;

/*
 * The RFC 5322 message for one mail, CRLF line endings, appended to buf.
 * from is the sender to write in From (the mail's sender or the default
 * sender: an address, or a display name and an address).
 */
extern void gatekeeper_build_message(StringInfo buf, const GatekeeperMail *mail,
									 const char *from);

#endif							/* GATEKEEPER_MESSAGE_H */
