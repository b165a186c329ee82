/*-------------------------------------------------------------------------
 *
 * smtp_client.h
 *		The event-driven SMTP client the background worker delivers with.
 *
 * gatekeeper.smtp_url lists the relays, numbered from 0 in its order, each
 * with its own connections.  The worker hands the client built messages
 * for one relay (smtp_client_submit) as long as that relay has room for
 * them (smtp_client_room), waits on the client's wait set
 * (smtp_client_wait, which also watches the latch and postmaster death),
 * and takes back each delivery as its outcome is known
 * (smtp_client_next_done).  Nothing here ever waits for one relay
 * connection.
 *
 * The client is in layers, as Postfix's smtp client is: smtp_config.c
 * (the relay URL, the password file, DNS), smtp_io.c (a connection's
 * socket, TLS and bounded buffers), smtp_chat.c (commands and the
 * replies they wait for), smtp_txn.c (a ready session's transactions),
 * smtp_session.c (the session machine), smtp_relay.c (a relay's
 * connections, the one place one is opened and freed, and the dispatch
 * of their events) and smtp_client.c (this API, and the wait), each
 * calling only the layers before it.  Their private types are in smtp_conn.h,
 * which the worker does not include.
 *
 * IDENTIFICATION
 *		src/smtp_client.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef SMTP_CLIENT_H
#define SMTP_CLIENT_H

#include "gatekeeper.h"
#include "message.h"
#include "smtp_trouble.h"

#include "lib/ilist.h"

/* What became of one delivery attempt. */
typedef enum GatekeeperOutcome
{
	GATEKEEPER_PENDING,			/* not known yet */
	GATEKEEPER_SENT,			/* relay replied 2xx to the data */
	GATEKEEPER_RETRY,			/* 4xx reply, timeout, lost connection */
	GATEKEEPER_FAIL,			/* 5xx reply for this mail: permanent */
	GATEKEEPER_UNREACHABLE		/* the relay refused the session: hand back
								 * uncharged */
} GatekeeperOutcome;

/*
 * One claimed mail on its way to the relay.  The worker owns it (and its
 * memory context); the client holds it between smtp_client_submit and
 * smtp_client_next_done.
 */
typedef struct GatekeeperDelivery
{
	MemoryContext cxt;			/* everything of this delivery */
	GatekeeperMail mail;
	const char *from;			/* the envelope sender: a bare address */
	const char *envid;			/* the DSN's ENVID (its VERP token), or NULL */
	const char *from_field;		/* the sender as given, perhaps with a name */
	StringInfoData message;		/* built message; data freed once written */
	size_t		bytes;			/* what it holds, for gatekeeper.max_in_flight */
	bool		needs_8bit;		/* the message has octets above 127 */
	bool		needs_utf8;		/* an envelope address is not ASCII */
	TimestampTz lease_until;	/* when its claim runs out */
	dlist_node	live_node;		/* the worker's list of claimed mail */
	dlist_node	queue_node;		/* the worker's or the client's queue */

	/* set by the client */
	int			relay;			/* the relay it was submitted to, from 0 */
	GatekeeperOutcome outcome;
	SmtpReply	reply;			/* the reply that decided it, as read and
								 * classified (code 0 if none) */
	bool		session_reached;	/* a session with the relay was open */
	char		error[256];		/* why it was not sent, with the peer */

	/* the client's own state of the transaction, opaque to the worker */
	struct SmtpTxn *txn;
} GatekeeperDelivery;

extern bool smtp_client_load_password(void);
extern void smtp_client_configure(void);
extern int	smtp_client_relays(void);
extern const char *smtp_client_relay_url(int relay);
extern int	smtp_client_room(int relay);
extern TimestampTz smtp_client_room_at(void);
extern void smtp_client_submit(int relay, GatekeeperDelivery *d);
extern GatekeeperDelivery *smtp_client_next_done(void);
extern void smtp_client_abort_unsent(int relay, const char *error);
extern bool smtp_client_wait(long timeout_ms);
extern int	smtp_client_connections(int relay);
extern int	smtp_client_busy(void);
extern bool smtp_client_needs_8bit(const char *data, size_t len);
extern bool smtp_client_address_ascii(const char *address);

#endif							/* SMTP_CLIENT_H */
