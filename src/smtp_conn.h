/*-------------------------------------------------------------------------
 *
 * smtp_conn.h
 *		The SMTP client's private types: a relay, a connection to it, and
 *		the client's own state of a transaction.
 *
 * Only the client's layers include this: smtp_io.c (bytes on a socket),
 * smtp_chat.c (commands and the replies they wait for), smtp_txn.c (a
 * ready session's transactions), smtp_session.c (the session machine),
 * smtp_relay.c (a relay's connections) and smtp_client.c (the API the
 * worker uses), each calling only those listed before it.  It declares
 * no functions; each layer's header declares its own.
 *
 * IDENTIFICATION
 *		src/smtp_conn.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef SMTP_CONN_H
#define SMTP_CONN_H

#include "smtp_client.h"
#include "smtp_config.h"

#include <openssl/ssl.h>

#include "lib/ilist.h"
#include "lib/stringinfo.h"
#include "utils/timestamp.h"

/* a connection with nothing to do for this long says QUIT */
#define SMTP_IDLE_QUIT_MS		5000

/* how long a QUIT may wait for its reply */
#define SMTP_QUIT_WAIT_MS		1000

/* transactions queued on one connection, by what the relay offers */
#define SMTP_DEPTH_CHUNKING		8
#define SMTP_DEPTH_PIPELINING	2	/* one on the wire, one ready */
#define SMTP_DEPTH_BEHIND_DOT	3	/* one's message on the wire, the next's
									 * commands behind it, one ready */
#define SMTP_DEPTH_LOCKSTEP		1

/* after a session failure while other connections work, wait before the next */
#define SMTP_CONNECT_HOLD_MS	2000

/* the longest reply line kept for error text */
#define SMTP_REPLY_MAX			SMTP_REPLY_TEXT_MAX

/* RFC 5321 4.5.3.1.5: a reply line, CRLF included, and (ours) a whole reply */
#define SMTP_LINE_MAX			512
#define SMTP_REPLY_OCTETS_MAX	65536

/* a connection's input buffer: what one read takes, and a partial line */
#define SMTP_INPUT_SIZE			16384

/* stages of a transaction: what was written last */
#define ST_NONE		0
#define ST_MAIL		1			/* lock-step: MAIL FROM written */
#define ST_RCPT		2			/* lock-step: RCPT TO written */
#define ST_DATA		3			/* DATA written (pipelined or not) */
#define ST_BODY		4			/* the message is written or queued */
#define ST_DONE		5

/* the client's own state of a delivery's transaction */
typedef struct SmtpTxn
{
	int			stage;			/* commands written so far */
	int			replies;		/* replies received so far */
} SmtpTxn;

typedef enum SmtpState
{
	CS_CONNECTING,
	CS_TLS,						/* TLS handshake */
	CS_GREETING,
	CS_EHLO,
	CS_HELO,
	CS_STARTTLS,
	CS_AUTH,
	CS_READY,
	CS_QUIT,
	CS_CLOSED					/* closed, to be freed between events */
} SmtpState;

typedef enum SmtpCommand
{
	CMD_RSET,
	CMD_MAIL,
	CMD_RCPT,
	CMD_DATA,
	CMD_DOT,
	CMD_BDAT
} SmtpCommand;

/*
 * What a step of the session machine asks of the connection's relay
 * (smtp_relay.c acts on it): the session and its transactions never call
 * up.
 */
typedef enum SmtpStep
{
	SMTP_STEP_GOING,			/* nothing: the session goes on */
	SMTP_STEP_READY,			/* the session became ready: hand it mail */
	SMTP_STEP_CLOSE,			/* the session is over: close the connection */
	SMTP_STEP_FAILED			/* the session failed, the relay's fault:
								 * failure says why */
} SmtpStep;

/* a reply the connection waits for, in the order the commands went out */
typedef struct SmtpExpect
{
	SmtpCommand command;
	GatekeeperDelivery *d;
	bool		behind;			/* written behind a final "." still unanswered */
} SmtpExpect;

/* a piece of output: a command string (owned) or a message (borrowed: it
 * stays with its delivery until the outcome, as the mail may go again) */
typedef struct SmtpSegment
{
	const char *data;
	size_t		len;
	char	   *owned;			/* pfree when written */
	bool		stuff;			/* a message to dot-stuff and end with "." */
} SmtpSegment;

/*
 * A relay: its settings, its connections, and the deliveries waiting for
 * a connection (backlog) or handed back with their outcome (done).
 */
typedef struct SmtpRelay
{
	SmtpConfig	cfg;
	MemoryContext cxt;			/* its connections' contexts hang here */
	SSL_CTX    *tls_ctx;		/* made on the first TLS connection */
	dlist_head	conns;
	int			nconns;			/* open or opening */
	dlist_head	backlog;
	int			nbacklog;
	dlist_head	done;
	TimestampTz connect_hold_until;
	TimestampTz next_send;		/* rate=: the next transaction not before */
	bool		misorders;		/* answered out of order behind a final ".":
								 * nothing goes behind one any more */
} SmtpRelay;

typedef struct SmtpConn
{
	dlist_node	node;
	MemoryContext cxt;			/* everything of the connection, itself too */
	SmtpRelay  *relay;			/* the relay it connects to */
	SmtpState	state;
	pgsocket	sock;
	SSL		   *ssl;
	int			addr;			/* the address being tried */
	bool		tls;			/* TLS is on */
	bool		after_starttls; /* the TLS handshake follows STARTTLS */
	int			pos;			/* its position in the wait set, or -1 */
	bool		sock_changed;	/* its socket changed: the wait set is stale */
	bool		events_changed; /* events changed: the wait set must learn */
	bool		retire;			/* QUIT when idle at once: settings changed */
	bool		reused;			/* a transaction was finished on it */
	bool		last_ok;		/* the last transaction succeeded, nothing open */
	bool		need_rset;		/* lock-step: a transaction failed */
	int			auth_step;
	uint32		events;			/* registered in the wait set */
	bool		tls_read_wants_write;
	bool		tls_write_wants_read;

	/* what EHLO said */
	bool		esmtp;
	bool		pipelining;
	bool		chunking;
	bool		eightbit;
	bool		smtputf8;
	bool		dsn;			/* DSN (RFC 3461) is offered */
	bool		enhanced;		/* ENHANCEDSTATUSCODES (RFC 2034) is offered */
	bool		starttls;
	bool		auth_plain;
	bool		auth_login;
	bool		size;			/* SIZE is offered */
	uint64		size_limit;		/* its limit, 0 for none */

	/* input: a fixed buffer, never more */
	char		in[SMTP_INPUT_SIZE];
	int			in_len;			/* octets in it */
	int			in_pos;			/* octets of it already consumed */
	int			reply_lines;	/* lines of the reply being read */
	int			reply_octets;	/* and their octets */
	SmtpReply	reading;		/* the reply being read: its first line */
	SmtpReply	reply;			/* the last reply read, whole */

	/* output */
	SmtpSegment *segs;
	int			nsegs;
	int			seghead;
	int			segcap;
	size_t		segoff;			/* octets of the head segment consumed */
	StringInfoData chunk;		/* the head segment dot-stuffed, a piece */
	int			chunk_off;		/* octets of chunk written */
	bool		at_bol;			/* the next octet begins a line */
	bool		stuffed_all;	/* chunk holds the last piece and "." */
	bool		output_lost;	/* a write failed: read what is left */
	char		output_error[256];	/* why */

	/* replies expected, a ring */
	SmtpExpect *expect;
	int			nexpect;
	int			exphead;
	int			expcap;

	/*
	 * Where the reply to sort_d's final "." was due, one came that may
	 * answer a command behind it (smtp_txn.c, conn_sort_reply): the
	 * replies still due are gathered to find the "."'s.
	 */
	GatekeeperDelivery *sort_d;
	bool		sort_in_order;	/* they read as answers in order */
	SmtpReply	sort_first;		/* the reply where the "."'s was due */
	int			sort_found;		/* replies that can only be the "."'s */
	SmtpReply	sort_reply;		/* the last of them */

	/* transactions on this connection, oldest first */
	dlist_head	txns;
	int			ntxns;

	/* what the last step left for the relay (smtp_chat.c) */
	SmtpStep	step;			/* what it asks of the relay */
	char		failure[300];	/* SMTP_STEP_FAILED: why */
	dlist_head	finished;		/* deliveries decided, to be handed back */
	dlist_head	giveback;		/* never taken: back to the backlog's head */
	GatekeeperDelivery *data_wait;	/* waits for its 354 */

	TimestampTz deadline;		/* the reply awaited is late after this */
	bool		timer_restart;	/* progress since: deadline is the timeout
								 * from the next look at the clock */
	TimestampTz idle_since;
} SmtpConn;

#endif							/* SMTP_CONN_H */
