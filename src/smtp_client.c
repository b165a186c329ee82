/*-------------------------------------------------------------------------
 *
 * smtp_client.c
 *		An SMTP client that never blocks: one state machine per relay
 *		connection, every socket in the worker's wait set.
 *
 * Up to gatekeeper.smtp_connections connections to the relay named by
 * gatekeeper.smtp_url (smtp:// or smtps://) are opened as there is mail
 * for them, and reused from one message to the next.  Each is a
 * non-blocking socket (through OpenSSL once TLS is on) that is read
 * whenever it is readable and written whenever there is something to write
 * and room for it; the replies that have arrived are consumed and the
 * connection moves on, so one slow relay connection holds up nothing but
 * itself.
 *
 * A session: greeting, EHLO (HELO when EHLO is refused with 5xx), STARTTLS
 * when offered (and required before credentials go to a relay that is not
 * on the loopback), EHLO again, AUTH PLAIN or LOGIN when credentials are
 * set and the relay offers AUTH.  Certificates and host names are always
 * verified (gatekeeper.smtp_ca_file, else the system's store).
 *
 * Transactions: with PIPELINING and CHUNKING a transaction is one write,
 * "MAIL FROM, RCPT TO, BDAT <n> LAST, the message", and the next follows
 * without waiting for the replies of the one before; with PIPELINING only,
 * "MAIL, RCPT, DATA" is one write and the dot-stuffed message follows the
 * 354, and the next transaction the reply to its final "."; without
 * PIPELINING, one command at a time.  A transaction that follows another
 * whose success is not known yet starts with RSET, so that whatever the
 * one before left open (a MAIL accepted before a refused RCPT, say) can
 * never lend its envelope to the next; in lock-step RSET follows only a
 * failed transaction.
 *
 * Outcomes: 2xx to the data is SENT; 5xx to MAIL FROM, RCPT TO, DATA or the
 * data is FAIL (mail_refused when it was MAIL FROM: the worker decides
 * whether that is the mail's fault or the relay's); 4xx, a reply that does
 * not come within gatekeeper.smtp_timeout, or a connection that breaks
 * after the relay began to answer a transaction and before its last reply
 * is RETRY.  A mail larger than the relay's SIZE fails before a byte of it
 * is sent.  When a session cannot be opened (no connection, a refused
 * greeting, EHLO, STARTTLS or AUTH, a certificate that does not verify)
 * and no other connection is open, the mail waiting for a connection is
 * UNREACHABLE: the relay's fault, handed back uncharged.
 *
 * When the relay ends a session (it closes or resets the connection, or
 * says 421), every reply it sent before is read and acted on first: a
 * failed write only stops the writing, and the connection is given up
 * once the reading finds its end.  A transaction the relay never answered
 * is not the mail's doing: it goes out again at once, uncharged, on
 * another connection, provided the relay finished a transaction on this
 * one (so a relay that limits the messages of a session delays nothing).
 * A session that ends before any transaction was answered is a refused
 * session, the relay's fault like any other.  A reply that breaks RFC 5321
 * (a line over 512 octets, a reply over 64 kB, a line that is not a reply)
 * ends the session the same way: nothing a relay sends can grow the
 * worker's memory, which holds one fixed input buffer per connection.
 *
 * Lifetime: a connection's memory is a context of its own.  Closing a
 * connection only closes its socket and marks it; smtp_client_wait frees
 * the closed connections when it has finished with every event, so no
 * caller, however deep, ever holds a freed connection.
 *
 * A connection with nothing to do for a few seconds is closed with QUIT.
 * Every error names the relay, and no error holds the password.
 *
 * IDENTIFICATION
 *		src/smtp_client.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "smtp_client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "common/base64.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

/* a connection with nothing to do for this long says QUIT */
#define SMTP_IDLE_QUIT_MS		5000

/* how long a QUIT may wait for its reply */
#define SMTP_QUIT_WAIT_MS		1000

/* transactions queued on one connection, by what the relay offers */
#define SMTP_DEPTH_CHUNKING		8
#define SMTP_DEPTH_PIPELINING	2	/* one on the wire, one ready */
#define SMTP_DEPTH_LOCKSTEP		1

/* after a session failure while other connections work, wait before the next */
#define SMTP_CONNECT_HOLD_MS	2000

/* the longest reply line kept for error text */
#define SMTP_REPLY_MAX			200

/* RFC 5321 4.5.3.1.5: a reply line, CRLF included, and (ours) a whole reply */
#define SMTP_LINE_MAX			512
#define SMTP_REPLY_OCTETS_MAX	65536

/* a connection's input buffer: what one read takes, and a partial line */
#define SMTP_INPUT_SIZE			16384

/* longest relay password read from gatekeeper.smtp_password_file */
#define SMTP_PASSWORD_MAX		1024

/* stages of a transaction: what was written last */
#define ST_NONE		0
#define ST_MAIL		1			/* lock-step: MAIL FROM written */
#define ST_RCPT		2			/* lock-step: RCPT TO written */
#define ST_DATA		3			/* DATA written (pipelined or not) */
#define ST_BODY		4			/* the message is written or queued */
#define ST_DONE		5

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

/* a reply the connection waits for, in the order the commands went out */
typedef struct SmtpExpect
{
	SmtpCommand command;
	GatekeeperDelivery *d;
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

typedef struct SmtpConn
{
	dlist_node	node;
	MemoryContext cxt;			/* everything of the connection, itself too */
	SmtpState	state;
	pgsocket	sock;
	SSL		   *ssl;
	int			addr;			/* the address being tried */
	bool		tls;			/* TLS is on */
	bool		after_starttls; /* the TLS handshake follows STARTTLS */
	int			pos;			/* its position in the wait set, or -1 */
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
	char		reply[SMTP_REPLY_MAX];	/* its last line */

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

	/* transactions on this connection, oldest first */
	dlist_head	txns;
	int			ntxns;
	GatekeeperDelivery *data_wait;	/* waits for its 354 */

	TimestampTz deadline;		/* the reply awaited is late after this */
	TimestampTz idle_since;
} SmtpConn;

/* the relay settings the connections were opened with */
typedef struct SmtpConfig
{
	char	   *url;
	char	   *host;			/* as in the URL, without brackets */
	char	   *port;
	char	   *peer;			/* "host:port", for messages */
	char	   *user;
	char	   *password;
	char	   *helo;			/* empty: work it out per connection */
	char	   *ca_file;
	int			connections;
	int			timeout;
	bool		smtps;
	bool		parsed;			/* the URL is well-formed */
	bool		valid;			/* and its host resolved */
	char		problem[256];	/* why not valid */
	struct addrinfo *addrs;
	int			naddrs;
} SmtpConfig;

static MemoryContext smtp_cxt = NULL;
static SmtpConfig cfg;
static dlist_head conns = DLIST_STATIC_INIT(conns);
static int	nconns = 0;
static int	nready = 0;
static dlist_head backlog = DLIST_STATIC_INIT(backlog);
static int	nbacklog = 0;
static dlist_head done = DLIST_STATIC_INIT(done);
static int	ntxns_total = 0;
static TimestampTz connect_hold_until = 0;
static SSL_CTX *tls_ctx = NULL;
static char *host_fqdn = NULL;

/*
 * The relay password as smtp_client_load_password last read it from
 * gatekeeper.smtp_password_file, in TopMemoryContext; NULL for none.
 */
static char *smtp_password = NULL;

static WaitEventSet *wait_set = NULL;
static WaitEvent *wait_events = NULL;
static int	wait_events_cap = 0;
static bool wait_set_stale = true;

static void config_load(void);
static void config_free(void);
static bool config_matches(void);
static bool parse_url(const char *url);
static bool resolve(void);
static void percent_decode(char *s);
static const char *fqdn(void);
static void dispatch(void);
static int	conn_depth(SmtpConn *c);
static bool conn_usable(SmtpConn *c);
static SmtpConn *conn_open(void);
static bool conn_connect_next(SmtpConn *c);
static void conn_connected(SmtpConn *c);
static void conn_close(SmtpConn *c);
static void conns_free_closed(void);
static void conn_timed_out(SmtpConn *c);
static void conn_lost(SmtpConn *c, bool relay_ended, const char *error);
static void conn_requeue_txns(SmtpConn *c);
static void conn_session_failed(SmtpConn *c, const char *fmt,...) pg_attribute_printf(2, 3);
static bool conn_peer_loopback(SmtpConn *c);
static void conn_readable(SmtpConn *c);
static bool conn_consume(SmtpConn *c);
static void conn_output_lost(SmtpConn *c, const char *error);
static void conn_flush(SmtpConn *c);
static void conn_reply(SmtpConn *c, int code, const char *line, bool last);
static void conn_session_reply(SmtpConn *c, int code);
static void conn_ready_reply(SmtpConn *c, int code);
static void conn_after_ehlo(SmtpConn *c);
static void conn_auth(SmtpConn *c, int code);
static void conn_become_ready(SmtpConn *c);
static void conn_start_txns(SmtpConn *c);
static void conn_write_txn(SmtpConn *c, GatekeeperDelivery *d);
static void conn_lockstep_next(SmtpConn *c, GatekeeperDelivery *d);
static void conn_write_message(SmtpConn *c, GatekeeperDelivery *d);
static void conn_txn_done(SmtpConn *c, GatekeeperDelivery *d);
static void conn_send(SmtpConn *c, const char *fmt,...) pg_attribute_printf(2, 3);
static void conn_push(SmtpConn *c, const char *data, size_t len, char *owned);
static void conn_stuff_piece(SmtpConn *c, SmtpSegment *s);
static void conn_expect(SmtpConn *c, SmtpCommand command, GatekeeperDelivery *d);
static void conn_tls_start(SmtpConn *c);
static void conn_tls_handshake(SmtpConn *c);
static ssize_t conn_read(SmtpConn *c, char *buf, size_t len, bool *eof, char *err, size_t errlen);
static ssize_t conn_write(SmtpConn *c, const char *buf, size_t len, char *err, size_t errlen);
static void conn_update_events(SmtpConn *c);
static void txn_fail(SmtpConn *c, GatekeeperDelivery *d, int code, const char *what);
static void txn_finish(GatekeeperDelivery *d, GatekeeperOutcome outcome, int code,
					   const char *fmt,...) pg_attribute_printf(4, 5);
static void txn_to_backlog(GatekeeperDelivery *d);
static void backlog_unreachable(const char *error);
static char *envelope_address(const char *address);
static void append_dsn_notify(StringInfo buf, SmtpConn *c, GatekeeperDelivery *d);
static char *helo_for(SmtpConn *c);
static void tls_error(SmtpConn *c, const char *what, char *buf, size_t len);
static void sanitize(char *dst, size_t dstlen, const char *src, size_t srclen);
static void rebuild_wait_set(void);

/*
 * smtp_client_configure
 *		Take the relay settings as they are now.  When they differ from what
 *		the open connections were made with, those connections are retired:
 *		they finish what they carry, then QUIT.
 */
void
smtp_client_configure(void)
{
	dlist_iter	iter;

	if (smtp_cxt == NULL)
		smtp_cxt = AllocSetContextCreate(TopMemoryContext, "gatekeeper SMTP client",
										 ALLOCSET_DEFAULT_SIZES);
	if (cfg.url != NULL && config_matches())
		return;

	dlist_foreach(iter, &conns)
	{
		SmtpConn   *c = dlist_container(SmtpConn, node, iter.cur);

		c->retire = true;
	}
	config_free();
	config_load();
	connect_hold_until = 0;
}

/*
 * smtp_client_load_password
 *		Read the relay password from gatekeeper.smtp_password_file; forget
 *		the one read before.  Returns false, having said why in the log,
 *		when the file cannot be used: then no mail should be delivered.
 *
 * The file must be a regular file that only the server's OS user can
 * read, with the rule PostgreSQL applies to its SSL key: owned by that
 * user with no group or other permissions (u=rw, 0600, or less), or owned
 * by root with at most u=rw,g=r (0640).  One trailing newline (LF or
 * CRLF) is not part of the password.  The password is never logged.
 * Problems are logged at LOG, as PostgreSQL logs a bad configuration
 * file at reload: the server log is where an administrator looks.
 */
bool
smtp_client_load_password(void)
{
	const char *path = gatekeeper_smtp_password_file;
	char		buf[SMTP_PASSWORD_MAX + 2];
	struct stat st;
	ssize_t		len = 0;
	int			fd;

	if (smtp_password != NULL)
	{
		explicit_bzero(smtp_password, strlen(smtp_password));
		pfree(smtp_password);
		smtp_password = NULL;
	}
	if (path == NULL || path[0] == '\0')
		return true;

	fd = open(path, O_RDONLY | PG_BINARY | O_CLOEXEC, 0);
	if (fd < 0)
	{
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("could not open relay password file \"%s\": %m", path),
				 errdetail("The gatekeeper worker delivers no mail until gatekeeper.smtp_password_file can be read.")));
		return false;
	}
	if (fstat(fd, &st) != 0)
	{
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("could not stat relay password file \"%s\": %m", path)));
		close(fd);
		return false;
	}
	if (!S_ISREG(st.st_mode))
	{
		ereport(LOG,
				(errcode(ERRCODE_CONFIG_FILE_ERROR),
				 errmsg("relay password file \"%s\" is not a regular file", path),
				 errdetail("The gatekeeper worker delivers no mail until it is corrected.")));
		close(fd);
		return false;
	}
	if (st.st_uid != geteuid() && st.st_uid != 0)
	{
		ereport(LOG,
				(errcode(ERRCODE_CONFIG_FILE_ERROR),
				 errmsg("relay password file \"%s\" must be owned by the database user or root", path),
				 errdetail("The gatekeeper worker delivers no mail until it is corrected.")));
		close(fd);
		return false;
	}
	if ((st.st_uid == geteuid() && (st.st_mode & (S_IRWXG | S_IRWXO))) ||
		(st.st_uid == 0 && (st.st_mode & (S_IWGRP | S_IXGRP | S_IRWXO))))
	{
		ereport(LOG,
				(errcode(ERRCODE_CONFIG_FILE_ERROR),
				 errmsg("relay password file \"%s\" has group or world access", path),
				 errdetail("File must have permissions u=rw (0600) or less if owned by the database user, "
						   "or permissions u=rw,g=r (0640) or less if owned by root.  "
						   "The gatekeeper worker delivers no mail until it is corrected.")));
		close(fd);
		return false;
	}

	for (;;)
	{
		ssize_t		n = read(fd, buf + len, sizeof(buf) - 1 - len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
		{
			ereport(LOG,
					(errcode_for_file_access(),
					 errmsg("could not read relay password file \"%s\": %m", path)));
			explicit_bzero(buf, sizeof(buf));
			close(fd);
			return false;
		}
		if (n == 0 || len + n >= (ssize_t) sizeof(buf) - 1)
		{
			len += n;
			break;
		}
		len += n;
	}
	close(fd);
	buf[len] = '\0';

	if (len > 0 && buf[len - 1] == '\n')
		buf[--len] = '\0';
	if (len > 0 && buf[len - 1] == '\r')
		buf[--len] = '\0';

	if (len > SMTP_PASSWORD_MAX || len == 0 ||
		memchr(buf, '\0', len) != NULL || strpbrk(buf, "\r\n") != NULL)
	{
		ereport(LOG,
				(errcode(ERRCODE_CONFIG_FILE_ERROR),
				 errmsg("relay password file \"%s\" does not hold a password", path),
				 errdetail("It must hold one line of 1 to %d bytes, without NUL.  "
						   "The gatekeeper worker delivers no mail until it is corrected.",
						   SMTP_PASSWORD_MAX)));
		explicit_bzero(buf, sizeof(buf));
		return false;
	}

	smtp_password = MemoryContextStrdup(TopMemoryContext, buf);
	explicit_bzero(buf, sizeof(buf));
	return true;
}


/*
 * smtp_client_room
 *		How many more transactions the client would take now: what the open
 *		connections can queue, plus one for each connection it may still
 *		open, less what already waits.
 */
int
smtp_client_room(void)
{
	dlist_iter	iter;
	int			capacity = 0;
	int			usable = 0;

	if (!cfg.valid)
		return cfg.connections;	/* they come back UNREACHABLE, and say why */
	dlist_foreach(iter, &conns)
	{
		SmtpConn   *c = dlist_container(SmtpConn, node, iter.cur);

		if (!conn_usable(c))
			continue;
		usable++;
		capacity += c->state == CS_READY ? conn_depth(c) : 1;
	}
	capacity += Max(cfg.connections - usable, 0);
	return Max(capacity - ntxns_total - nbacklog, 0);
}

/*
 * smtp_client_submit
 *		Take a built message; it goes on the first connection with room.
 */
void
smtp_client_submit(GatekeeperDelivery *d)
{
	d->outcome = GATEKEEPER_PENDING;
	d->reply_code = 0;
	d->mail_refused = false;
	d->session_reached = false;
	d->error[0] = '\0';
	d->stage = ST_NONE;
	d->replies = 0;

	if (!cfg.valid && cfg.parsed)
		cfg.valid = resolve();
	if (!cfg.valid)
	{
		txn_finish(d, GATEKEEPER_UNREACHABLE, 0, "%s", cfg.problem);
		return;
	}
	dlist_push_tail(&backlog, &d->queue_node);
	nbacklog++;
	dispatch();
}

/*
 * smtp_client_next_done
 *		A delivery whose outcome is known, or NULL.
 */
GatekeeperDelivery *
smtp_client_next_done(void)
{
	if (dlist_is_empty(&done))
		return NULL;
	return dlist_container(GatekeeperDelivery, queue_node, dlist_pop_head_node(&done));
}

/*
 * smtp_client_abort_unsent
 *		Give back, UNREACHABLE with error, every delivery not yet written to
 *		a connection.  What is on the wire finishes.
 */
void
smtp_client_abort_unsent(const char *error)
{
	dlist_iter	iter;

	backlog_unreachable(error);
	dlist_foreach(iter, &conns)
	{
		SmtpConn   *c = dlist_container(SmtpConn, node, iter.cur);
		dlist_mutable_iter miter;

		dlist_foreach_modify(miter, &c->txns)
		{
			GatekeeperDelivery *d = dlist_container(GatekeeperDelivery, queue_node, miter.cur);

			if (d->stage != ST_NONE)
				continue;
			dlist_delete(&d->queue_node);
			c->ntxns--;
			ntxns_total--;
			txn_finish(d, GATEKEEPER_UNREACHABLE, 0, "%s", error);
		}
	}
}

/*
 * smtp_client_connections
 *		Connections open or opening.
 */
int
smtp_client_connections(void)
{
	return nconns;
}

/*
 * smtp_client_busy
 *		Deliveries the client holds.
 */
int
smtp_client_busy(void)
{
	return ntxns_total + nbacklog;
}

/*
 * smtp_client_needs_8bit
 *		Whether a message has an octet above 127 (needs 8BITMIME).
 */
bool
smtp_client_needs_8bit(const char *data, size_t len)
{
	const unsigned char *p = (const unsigned char *) data;
	const unsigned char *end = p + len;

	while (p + 8 <= end)
	{
		uint64		w;

		memcpy(&w, p, 8);
		if (w & UINT64CONST(0x8080808080808080))
			return true;
		p += 8;
	}
	while (p < end)
	{
		if (*p++ & 0x80)
			return true;
	}
	return false;
}

/*
 * smtp_client_address_ascii
 *		Whether an address is ASCII (else the envelope needs SMTPUTF8).
 */
bool
smtp_client_address_ascii(const char *address)
{
	return address == NULL || !smtp_client_needs_8bit(address, strlen(address));
}

/*
 * smtp_client_wait
 *		Wait up to timeout_ms for the latch, postmaster death or any relay
 *		connection, and act on what happened: read replies, write what can
 *		be written, time out late replies, QUIT idle connections.  Returns
 *		whether the latch was set (and resets it).
 */
bool
smtp_client_wait(long timeout_ms)
{
	TimestampTz now = GetCurrentTimestamp();
	dlist_iter	iter;
	bool		latch = false;
	int			n;
	int			i;

	conns_free_closed();

	/* the earliest deadline of any connection bounds the wait */
	dlist_foreach(iter, &conns)
	{
		SmtpConn   *c = dlist_container(SmtpConn, node, iter.cur);
		TimestampTz at = 0;

		if (c->nexpect > 0 || c->state != CS_READY || c->output_lost)
			at = c->deadline;
		else if (c->ntxns == 0)
			at = c->retire ? now :
				TimestampTzPlusMilliseconds(c->idle_since, SMTP_IDLE_QUIT_MS);
		if (at != 0)
			timeout_ms = Min(timeout_ms, at <= now ? 0 :
							 TimestampDifferenceMilliseconds(now, at) + 1);
	}
	if (nbacklog > 0 && connect_hold_until > now)
		timeout_ms = Min(timeout_ms, TimestampDifferenceMilliseconds(now, connect_hold_until) + 1);

	if (wait_set_stale || wait_set == NULL)
		rebuild_wait_set();

	/*
	 * Acting on one event may close this connection, or open others that
	 * fail at once; a closed connection stays allocated, marked CS_CLOSED,
	 * until conns_free_closed runs after the last event, so the events
	 * still to come, and every caller, find it marked, never freed.
	 */
	n = WaitEventSetWait(wait_set, Max(timeout_ms, 0), wait_events,
						 wait_events_cap, PG_WAIT_EXTENSION);
	for (i = 0; i < n; i++)
	{
		WaitEvent  *ev = &wait_events[i];
		SmtpConn   *c = (SmtpConn *) ev->user_data;

		if (ev->events & WL_LATCH_SET)
		{
			ResetLatch(MyLatch);
			latch = true;
			continue;
		}
		if (c == NULL || c->state == CS_CLOSED)
			continue;
		if (c->state == CS_CONNECTING)
		{
			conn_connected(c);
			continue;
		}
		if (c->state == CS_TLS)
		{
			conn_tls_handshake(c);
			continue;
		}
		if ((ev->events & WL_SOCKET_READABLE) ||
			(c->tls_read_wants_write && (ev->events & WL_SOCKET_WRITEABLE)))
			conn_readable(c);
		if (c->state != CS_CLOSED &&
			((ev->events & WL_SOCKET_WRITEABLE) ||
			 (c->tls_write_wants_read && (ev->events & WL_SOCKET_READABLE))))
			conn_flush(c);
	}

	/* late replies, broken connections, idle connections */
	now = GetCurrentTimestamp();
	dlist_foreach(iter, &conns)
	{
		SmtpConn   *c = dlist_container(SmtpConn, node, iter.cur);

		if (c->state == CS_CLOSED)
			continue;
		if (c->state == CS_QUIT)
		{
			if (now >= c->deadline)
				conn_close(c);
		}
		else if (c->output_lost && now >= c->deadline)
			conn_lost(c, false, c->output_error);
		else if ((c->nexpect > 0 || c->state != CS_READY) && now >= c->deadline)
			conn_timed_out(c);
		else if (c->state == CS_READY && c->ntxns == 0 && c->nexpect == 0 &&
				 (c->retire ||
				  now >= TimestampTzPlusMilliseconds(c->idle_since, SMTP_IDLE_QUIT_MS)))
		{
			conn_send(c, "QUIT\r\n");
			c->state = CS_QUIT;
			c->deadline = TimestampTzPlusMilliseconds(now, SMTP_QUIT_WAIT_MS);
			nready--;
			conn_flush(c);
		}
	}
	dispatch();
	conns_free_closed();
	return latch;
}

/*
 * config_load
 *		Read the relay settings into cfg; cfg.valid says whether they can be
 *		used, cfg.problem why not.
 */
static void
config_load(void)
{
	MemoryContext old = MemoryContextSwitchTo(smtp_cxt);
	const char *url = gatekeeper_smtp_url ? gatekeeper_smtp_url : "";

	memset(&cfg, 0, sizeof(cfg));
	cfg.url = pstrdup(url);
	cfg.connections = Max(gatekeeper_smtp_connections, 1);
	cfg.timeout = Max(gatekeeper_smtp_timeout, 1);
	cfg.helo = pstrdup(gatekeeper_helo_name ? gatekeeper_helo_name : "");
	cfg.ca_file = pstrdup(gatekeeper_smtp_ca_file ? gatekeeper_smtp_ca_file : "");
	cfg.valid = parse_url(url);
	if (cfg.valid)
	{
		if (gatekeeper_smtp_user != NULL && gatekeeper_smtp_user[0] != '\0')
		{
			pfree(cfg.user);
			cfg.user = pstrdup(gatekeeper_smtp_user);
		}
		if (smtp_password != NULL)
		{
			pfree(cfg.password);
			cfg.password = pstrdup(smtp_password);
		}

		cfg.parsed = true;
		cfg.valid = resolve();
	}
	MemoryContextSwitchTo(old);
}

/*
 * resolve
 *		The relay's addresses.  Resolved once per configuration (getaddrinfo
 *		blocks), and again after a failure only when mail is submitted, which
 *		the worker's backoff spaces out.
 */
static bool
resolve(void)
{
	struct addrinfo hints;
	struct addrinfo *ai;
	int			rc;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV;
	cfg.naddrs = 0;
	rc = getaddrinfo(cfg.host, cfg.port, &hints, &cfg.addrs);
	if (rc != 0)
	{
		snprintf(cfg.problem, sizeof(cfg.problem),
				 "relay %s: could not resolve \"%s\": %s",
				 cfg.peer, cfg.host, gai_strerror(rc));
		cfg.addrs = NULL;
		return false;
	}
	for (ai = cfg.addrs; ai != NULL; ai = ai->ai_next)
		cfg.naddrs++;
	return true;
}

/*
 * config_free
 *		Forget cfg, the password wiped.
 */
static void
config_free(void)
{
	if (cfg.password != NULL)
		explicit_bzero(cfg.password, strlen(cfg.password));
	if (cfg.addrs != NULL)
		freeaddrinfo(cfg.addrs);
	if (tls_ctx != NULL)
		SSL_CTX_free(tls_ctx);
	tls_ctx = NULL;
	/* the strings live in smtp_cxt; they are few and small */
	memset(&cfg, 0, sizeof(cfg));
}

/*
 * config_matches
 *		Whether the settings are still those cfg was loaded from.
 */
static bool
config_matches(void)
{
	const char *user = gatekeeper_smtp_user ? gatekeeper_smtp_user : "";
	const char *password = smtp_password ? smtp_password : "";

	return strcmp(cfg.url, gatekeeper_smtp_url ? gatekeeper_smtp_url : "") == 0 &&
		strcmp(cfg.user, user) == 0 &&
		strcmp(cfg.password, password) == 0 &&
		strcmp(cfg.helo, gatekeeper_helo_name ? gatekeeper_helo_name : "") == 0 &&
		strcmp(cfg.ca_file, gatekeeper_smtp_ca_file ? gatekeeper_smtp_ca_file : "") == 0 &&
		cfg.connections == Max(gatekeeper_smtp_connections, 1) &&
		cfg.timeout == Max(gatekeeper_smtp_timeout, 1);
}

/*
 * parse_url
 *		smtp://[user[:password]@]host[:port][/] or smtps://...; fills
 *		cfg.host, port, peer, user, password and smtps.
 */
static bool
parse_url(const char *url)
{
	const char *p;
	const char *end;
	const char *at = NULL;
	const char *q;
	char	   *hostport;
	char	   *colon;

	cfg.user = pstrdup("");
	cfg.password = pstrdup("");
	cfg.host = pstrdup("");
	cfg.port = pstrdup("");
	cfg.peer = pstrdup("");

	if (url[0] == '\0')
	{
		strlcpy(cfg.problem, "gatekeeper.smtp_url is not set", sizeof(cfg.problem));
		return false;
	}
	if (pg_strncasecmp(url, "smtps://", 8) == 0)
	{
		cfg.smtps = true;
		p = url + 8;
	}
	else if (pg_strncasecmp(url, "smtp://", 7) == 0)
		p = url + 7;
	else
	{
		strlcpy(cfg.problem, "gatekeeper.smtp_url must begin with smtp:// or smtps://",
				sizeof(cfg.problem));
		return false;
	}

	end = p + strcspn(p, "/?#");
	for (q = p; q < end; q++)
	{
		if (*q == '@')
			at = q;
	}
	if (at != NULL)
	{
		const char *sep = memchr(p, ':', at - p);

		cfg.user = pnstrdup(p, (sep ? sep : at) - p);
		percent_decode(cfg.user);
		if (sep != NULL)
		{
			cfg.password = pnstrdup(sep + 1, at - sep - 1);
			percent_decode(cfg.password);
		}
		p = at + 1;
	}

	hostport = pnstrdup(p, end - p);
	if (hostport[0] == '[')
	{
		char	   *rb = strchr(hostport, ']');

		if (rb == NULL)
		{
			strlcpy(cfg.problem, "gatekeeper.smtp_url has an unterminated IPv6 address",
					sizeof(cfg.problem));
			return false;
		}
		*rb = '\0';
		cfg.host = pstrdup(hostport + 1);
		colon = rb[1] == ':' ? rb + 1 : NULL;
	}
	else
	{
		colon = strrchr(hostport, ':');
		if (colon != NULL)
			*colon = '\0';
		cfg.host = pstrdup(hostport);
	}
	cfg.port = pstrdup(colon != NULL && colon[1] != '\0' ? colon + 1 :
					   (cfg.smtps ? "465" : "25"));
	if (cfg.host[0] == '\0' || strspn(cfg.port, "0123456789") != strlen(cfg.port))
	{
		strlcpy(cfg.problem, "gatekeeper.smtp_url does not name a host and port",
				sizeof(cfg.problem));
		return false;
	}
	cfg.peer = psprintf(strchr(cfg.host, ':') ? "[%s]:%s" : "%s:%s", cfg.host, cfg.port);
	return true;
}

/*
 * percent_decode
 *		Decode %XX escapes of a URL's user information in place.
 */
static void
percent_decode(char *s)
{
	char	   *w = s;

	while (*s)
	{
		if (s[0] == '%' && isxdigit((unsigned char) s[1]) && isxdigit((unsigned char) s[2]))
		{
			char		hex[3] = {s[1], s[2], '\0'};

			*w++ = (char) strtol(hex, NULL, 16);
			s += 3;
		}
		else
			*w++ = *s++;
	}
	*w = '\0';
}

/*
 * fqdn
 *		This host's fully qualified name (getaddrinfo's canonical name of
 *		gethostname), or the bare host name when that has no dot.
 */
static const char *
fqdn(void)
{
	char		name[256];
	struct addrinfo hints;
	struct addrinfo *res = NULL;

	if (host_fqdn != NULL)
		return host_fqdn;
	if (gethostname(name, sizeof(name)) != 0)
		strlcpy(name, "localhost", sizeof(name));
	name[sizeof(name) - 1] = '\0';
	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = AI_CANONNAME;
	hints.ai_socktype = SOCK_STREAM;
	if (getaddrinfo(name, NULL, &hints, &res) == 0 && res != NULL &&
		res->ai_canonname != NULL && strchr(res->ai_canonname, '.') != NULL)
		strlcpy(name, res->ai_canonname, sizeof(name));
	if (res != NULL)
		freeaddrinfo(res);
	host_fqdn = MemoryContextStrdup(TopMemoryContext, name);
	return host_fqdn;
}

/*
 * helo_for
 *		The name c says in EHLO: gatekeeper.helo_name, else the host's FQDN,
 *		else (no dot in it) the address literal of c's own end.
 */
static char *
helo_for(SmtpConn *c)
{
	const char *name = cfg.helo[0] != '\0' ? cfg.helo : fqdn();
	struct sockaddr_storage ss;
	socklen_t	len = sizeof(ss);
	char		addr[INET6_ADDRSTRLEN];

	if (strchr(name, '.') != NULL || cfg.helo[0] != '\0')
		return pstrdup(name);
	if (getsockname(c->sock, (struct sockaddr *) &ss, &len) == 0)
	{
		if (ss.ss_family == AF_INET &&
			inet_ntop(AF_INET, &((struct sockaddr_in *) &ss)->sin_addr, addr, sizeof(addr)))
			return psprintf("[%s]", addr);
		if (ss.ss_family == AF_INET6 &&
			inet_ntop(AF_INET6, &((struct sockaddr_in6 *) &ss)->sin6_addr, addr, sizeof(addr)))
			return psprintf("[IPv6:%s]", addr);
	}
	return pstrdup("[127.0.0.1]");
}

/*
 * dispatch
 *		Hand waiting deliveries to ready connections with room, least loaded
 *		first, and open connections while mail waits for one.
 */
static void
dispatch(void)
{
	TimestampTz now;
	int			opening = 0;
	dlist_iter	iter;

	while (nbacklog > 0)
	{
		SmtpConn   *best = NULL;

		dlist_foreach(iter, &conns)
		{
			SmtpConn   *c = dlist_container(SmtpConn, node, iter.cur);

			if (c->state != CS_READY || c->retire || c->output_lost ||
				c->ntxns >= conn_depth(c))
				continue;
			if (best == NULL || c->ntxns < best->ntxns)
				best = c;
		}
		if (best == NULL)
			break;
		{
			GatekeeperDelivery *d = dlist_container(GatekeeperDelivery, queue_node,
													dlist_pop_head_node(&backlog));

			nbacklog--;
			dlist_push_tail(&best->txns, &d->queue_node);
			best->ntxns++;
			ntxns_total++;
			conn_start_txns(best);
		}
	}
	if (nbacklog == 0)
		return;

	/* one connection being set up per delivery still waiting */
	now = GetCurrentTimestamp();
	if (now < connect_hold_until)
		return;
	dlist_foreach(iter, &conns)
	{
		SmtpConn   *c = dlist_container(SmtpConn, node, iter.cur);

		if (c->state < CS_READY && !c->retire)
			opening++;
	}
	while (opening < nbacklog)
	{
		int			usable = 0;

		dlist_foreach(iter, &conns)
		{
			if (conn_usable(dlist_container(SmtpConn, node, iter.cur)))
				usable++;
		}
		if (usable >= cfg.connections)
			break;
		if (conn_open() == NULL)
			break;
		opening++;
	}
}

/*
 * conn_depth
 *		Transactions one connection may hold, by what its relay offers.
 */
static int
conn_depth(SmtpConn *c)
{
	if (c->pipelining && c->chunking)
		return SMTP_DEPTH_CHUNKING;
	if (c->pipelining)
		return SMTP_DEPTH_PIPELINING;
	return SMTP_DEPTH_LOCKSTEP;
}

/*
 * conn_usable
 *		Whether c is open, or opening, for new work: not closed, not saying
 *		QUIT, not retired, not broken.
 */
static bool
conn_usable(SmtpConn *c)
{
	return c->state != CS_CLOSED && c->state != CS_QUIT && !c->retire &&
		!c->output_lost;
}

/*
 * conn_open
 *		Start a new connection to the relay.  Returns it; it may already
 *		have failed (then it is gone and NULL is returned).
 */
static SmtpConn *
conn_open(void)
{
	/*
	 * Sizes of no standard kind (ALLOCSET_DEFAULT_SIZES starts at 8 kB): such
	 * a context is really freed when it is deleted, not kept for reuse, so
	 * that a memory checker sees a use of a freed connection.
	 */
	MemoryContext cxt = AllocSetContextCreate(smtp_cxt, "gatekeeper SMTP connection",
											  0, 16 * 1024, ALLOCSET_DEFAULT_MAXSIZE);
	SmtpConn   *c = MemoryContextAllocZero(cxt, sizeof(SmtpConn));
	MemoryContext old = MemoryContextSwitchTo(cxt);

	c->cxt = cxt;
	initStringInfo(&c->chunk);
	MemoryContextSwitchTo(old);
	c->sock = PGINVALID_SOCKET;
	c->addr = -1;
	c->pos = -1;
	dlist_init(&c->txns);
	dlist_push_tail(&conns, &c->node);
	nconns++;
	c->state = CS_CONNECTING;
	c->deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), cfg.timeout);
	return conn_connect_next(c) ? c : NULL;
}

/*
 * conn_connect_next
 *		Start connecting c to the next address of the relay; when none is
 *		left, the session failed.
 */
static bool
conn_connect_next(SmtpConn *c)
{
	char		err[256] = "";

	for (;;)
	{
		struct addrinfo *ai = cfg.addrs;
		int			i;
		int			one = 1;

		if (c->sock != PGINVALID_SOCKET)
		{
			close(c->sock);
			c->sock = PGINVALID_SOCKET;
			wait_set_stale = true;
		}
		c->addr++;
		if (c->addr >= cfg.naddrs)
		{
			conn_session_failed(c, "could not connect: %s",
								err[0] ? err : "no address");
			return false;
		}
		for (i = 0; i < c->addr; i++)
			ai = ai->ai_next;

		c->sock = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
						 ai->ai_protocol);
		if (c->sock == PGINVALID_SOCKET)
		{
			snprintf(err, sizeof(err), "could not create a socket: %m");
			continue;
		}
		(void) setsockopt(c->sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		wait_set_stale = true;
		if (connect(c->sock, ai->ai_addr, ai->ai_addrlen) == 0 || errno == EINPROGRESS)
		{
			c->events = 0;
			c->pos = -1;
			return true;		/* conn_connected when writable */
		}
		snprintf(err, sizeof(err), "%m");
	}
}

/*
 * conn_connected
 *		The connection attempt of c finished: see how.
 */
static void
conn_connected(SmtpConn *c)
{
	int			error = 0;
	socklen_t	len = sizeof(error);

	if (getsockopt(c->sock, SOL_SOCKET, SO_ERROR, &error, &len) != 0)
		error = errno;
	if (error == EINPROGRESS || error == EALREADY)
		return;
	if (error != 0)
	{
		if (c->addr + 1 < cfg.naddrs)
		{
			(void) conn_connect_next(c);
			return;
		}
		errno = error;
		conn_session_failed(c, "could not connect: %m");
		return;
	}
	c->deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), cfg.timeout);
	if (cfg.smtps)
		conn_tls_start(c);
	else
	{
		c->state = CS_GREETING;
		conn_update_events(c);
	}
}

/*
 * conn_close
 *		Close c: its socket and TLS go at once, its memory when
 *		conns_free_closed runs between events.  Its transactions must be
 *		gone already.
 */
static void
conn_close(SmtpConn *c)
{
	Assert(c->ntxns == 0);
	if (c->state == CS_CLOSED)
		return;
	if (c->ssl != NULL)
	{
		SSL_free(c->ssl);
		c->ssl = NULL;
	}
	if (c->sock != PGINVALID_SOCKET)
		close(c->sock);
	c->sock = PGINVALID_SOCKET;
	wait_set_stale = true;
	if (c->state == CS_READY)
		nready--;
	c->state = CS_CLOSED;
	c->nexpect = 0;
	c->nsegs = 0;
	nconns--;
}

/*
 * conns_free_closed
 *		Free the connections that were closed.  The one place a connection
 *		is freed; called by smtp_client_wait only, before and after it acts
 *		on events, when nothing holds a connection.
 */
static void
conns_free_closed(void)
{
	dlist_mutable_iter miter;

	dlist_foreach_modify(miter, &conns)
	{
		SmtpConn   *c = dlist_container(SmtpConn, node, miter.cur);

		if (c->state != CS_CLOSED)
			continue;
		dlist_delete(&c->node);
		MemoryContextDelete(c->cxt);
	}
}

/*
 * conn_timed_out
 *		The reply c waits for is late.  Its transactions not yet written go
 *		back to the backlog; the others are retried later (RETRY): a relay
 *		that is slow may yet take a mail it did not answer.
 */
static void
conn_timed_out(SmtpConn *c)
{
	char		error[256];
	dlist_mutable_iter miter;

	snprintf(error, sizeof(error), "timed out after %d ms waiting for the relay",
			 cfg.timeout);
	if (c->state < CS_READY)
	{
		conn_session_failed(c, "%s", error);
		return;
	}
	dlist_foreach_modify(miter, &c->txns)
	{
		GatekeeperDelivery *d = dlist_container(GatekeeperDelivery, queue_node, miter.cur);

		if (d->stage == ST_NONE)
			continue;
		dlist_delete(&d->queue_node);
		c->ntxns--;
		ntxns_total--;
		txn_finish(d, GATEKEEPER_RETRY, 0, "relay %s: %s%s%s", cfg.peer, error,
				   c->reply[0] ? "; last reply: " : "", c->reply);
	}
	conn_requeue_txns(c);
	conn_close(c);
}

/*
 * conn_lost
 *		The session on c is over, not by a timeout: the relay closed or
 *		reset the connection, a read or write failed, or (relay_ended) the
 *		relay said 421 or broke the protocol.  Every reply that arrived
 *		before has been acted on.
 *
 * A transaction a reply refused keeps that outcome.  One the relay began
 * to answer and then dropped (MAIL and RCPT accepted, the data's reply
 * missing) may have been taken: RETRY.  One the relay never answered, or
 * every one still open when the relay itself ended the session, was not
 * taken, and is not the mail's doing: it goes back to the head of the
 * backlog, uncharged, to go out at once on another connection.  That
 * cannot go round for ever: it happens only when the relay finished a
 * transaction on c; a session that ended before any was answered is a
 * refused session (conn_session_failed), the relay's fault, and the
 * worker backs off.
 */
static void
conn_lost(SmtpConn *c, bool relay_ended, const char *error)
{
	dlist_mutable_iter miter;

	if (c->state == CS_QUIT)
	{
		conn_close(c);
		return;
	}
	dlist_foreach_modify(miter, &c->txns)
	{
		GatekeeperDelivery *d = dlist_container(GatekeeperDelivery, queue_node, miter.cur);

		if (d->stage == ST_NONE ||
			(d->outcome == GATEKEEPER_PENDING && (relay_ended || d->replies == 0)))
			continue;			/* not taken: requeued below */
		dlist_delete(&d->queue_node);
		c->ntxns--;
		ntxns_total--;
		txn_finish(d, GATEKEEPER_RETRY, 0, "relay %s: %s%s%s", cfg.peer, error,
				   c->reply[0] ? "; last reply: " : "", c->reply);
	}
	if (c->state < CS_READY || (!c->reused && c->ntxns > 0))
		conn_session_failed(c, "%s", error);
	else
	{
		conn_requeue_txns(c);
		conn_close(c);
	}
}

/*
 * conn_requeue_txns
 *		Put every transaction left on c back at the head of the backlog, in
 *		their order, as if never sent.
 */
static void
conn_requeue_txns(SmtpConn *c)
{
	while (!dlist_is_empty(&c->txns))
	{
		GatekeeperDelivery *d = dlist_tail_element(GatekeeperDelivery, queue_node,
												   &c->txns);

		dlist_delete(&d->queue_node);
		c->ntxns--;
		ntxns_total--;
		txn_to_backlog(d);
	}
	c->data_wait = NULL;
}

/*
 * conn_session_failed
 *		A session could not be opened on c, or ended before the relay
 *		answered a transaction.  The transactions still on c go back to the
 *		backlog.  When no other connection is open or opening, the mail
 *		waiting for one is UNREACHABLE with this error; otherwise it waits
 *		for the others, and no new connection is tried for a moment.
 */
static void
conn_session_failed(SmtpConn *c, const char *fmt,...)
{
	char		msg[256];
	char		error[300];
	va_list		ap;
	dlist_iter	iter;
	bool		others = false;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	snprintf(error, sizeof(error), "relay %s: %s", cfg.peer, msg);

	conn_requeue_txns(c);
	conn_close(c);

	dlist_foreach(iter, &conns)
	{
		if (conn_usable(dlist_container(SmtpConn, node, iter.cur)))
			others = true;
	}
	if (!others)
		backlog_unreachable(error);
	else
		connect_hold_until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														 SMTP_CONNECT_HOLD_MS);
}

/*
 * conn_readable
 *		Read what has arrived on c, a buffer at a time, and act on every
 *		complete reply line; at the end of the input, give c up.
 */
static void
conn_readable(SmtpConn *c)
{
	bool		eof = false;
	char		err[256];

	for (;;)
	{
		ssize_t		n;

		/* what was consumed makes room; a partial line stays */
		if (c->in_pos > 0)
		{
			memmove(c->in, c->in + c->in_pos, c->in_len - c->in_pos);
			c->in_len -= c->in_pos;
			c->in_pos = 0;
		}
		Assert(c->in_len < SMTP_LINE_MAX);
		err[0] = '\0';
		n = conn_read(c, c->in + c->in_len, SMTP_INPUT_SIZE - c->in_len, &eof,
					  err, sizeof(err));
		if (n < 0)
		{
			conn_lost(c, false, err);
			return;
		}
		if (n == 0)
			break;
		c->in_len += n;
		if (!conn_consume(c))
			return;
		/* after STARTTLS's 220 the socket belongs to the handshake */
		if (c->state == CS_TLS)
			return;
	}

	if (eof)
	{
		conn_lost(c, false, c->output_lost ? c->output_error :
				  "connection closed by the relay");
		return;
	}
	conn_flush(c);
}

/*
 * conn_consume
 *		Act on the complete reply lines in c's input.  Returns false when c
 *		was closed meanwhile.  A line over SMTP_LINE_MAX octets, a reply
 *		over SMTP_REPLY_OCTETS_MAX or a line that is no reply ends the
 *		session: the relay broke RFC 5321.
 */
static bool
conn_consume(SmtpConn *c)
{
	while (c->in_pos < c->in_len)
	{
		char	   *start = c->in + c->in_pos;
		int			avail = c->in_len - c->in_pos;
		char	   *nl = memchr(start, '\n', Min(avail, SMTP_LINE_MAX));
		size_t		len;
		int			code = 0;
		bool		last;
		char		line[SMTP_REPLY_MAX];
		char		err[SMTP_REPLY_MAX + 64];

		if (nl == NULL)
		{
			if (avail < SMTP_LINE_MAX)
				return true;	/* the rest of the line is still to come */
			conn_lost(c, true, "relay sent a reply line longer than 512 octets");
			return false;
		}
		len = nl - start;
		c->in_pos += len + 1;
		c->reply_octets += len + 1;
		if (c->reply_octets > SMTP_REPLY_OCTETS_MAX)
		{
			conn_lost(c, true, "relay sent a reply longer than 65536 octets");
			return false;
		}
		if (len > 0 && start[len - 1] == '\r')
			len--;
		if (len >= 3 && isdigit((unsigned char) start[0]) &&
			isdigit((unsigned char) start[1]) && isdigit((unsigned char) start[2]))
			code = (start[0] - '0') * 100 + (start[1] - '0') * 10 + (start[2] - '0');
		last = len < 4 || start[3] != '-';
		sanitize(line, sizeof(line), start, len);

		if (code == 0)
		{
			snprintf(err, sizeof(err), "relay sent a line that is not an SMTP reply: %s", line);
			conn_lost(c, true, err);
			return false;
		}
		conn_reply(c, code, line, last);
		if (c->state == CS_CLOSED)
			return false;
	}
	return true;
}

/*
 * conn_reply
 *		One reply line arrived on c; act when it ends a reply.
 */
static void
conn_reply(SmtpConn *c, int code, const char *line, bool last)
{
	/* EHLO's lines name the extensions */
	if (c->state == CS_EHLO && code == 250 && c->reply_lines > 0)
	{
		const char *kw = strlen(line) > 4 ? line + 4 : "";

		if (pg_strncasecmp(kw, "PIPELINING", 10) == 0)
			c->pipelining = true;
		else if (pg_strncasecmp(kw, "CHUNKING", 8) == 0)
			c->chunking = true;
		else if (pg_strncasecmp(kw, "8BITMIME", 8) == 0)
			c->eightbit = true;
		else if (pg_strncasecmp(kw, "SMTPUTF8", 8) == 0)
			c->smtputf8 = true;
		else if (pg_strncasecmp(kw, "DSN", 3) == 0 && (kw[3] == ' ' || kw[3] == '\0'))
			c->dsn = true;
		else if (pg_strncasecmp(kw, "STARTTLS", 8) == 0)
			c->starttls = true;
		else if (pg_strncasecmp(kw, "SIZE", 4) == 0 && (kw[4] == ' ' || kw[4] == '\0'))
		{
			c->size = true;
			c->size_limit = strtoull(kw + 4, NULL, 10);
		}
		else if (pg_strncasecmp(kw, "AUTH", 4) == 0 && (kw[4] == ' ' || kw[4] == '='))
		{
			char		mechs[SMTP_REPLY_MAX];
			char	   *tok;
			char	   *save = NULL;

			strlcpy(mechs, kw + 5, sizeof(mechs));
			for (tok = strtok_r(mechs, " ", &save); tok; tok = strtok_r(NULL, " ", &save))
			{
				if (pg_strcasecmp(tok, "PLAIN") == 0)
					c->auth_plain = true;
				else if (pg_strcasecmp(tok, "LOGIN") == 0)
					c->auth_login = true;
			}
		}
	}
	c->reply_lines++;
	if (!last)
		return;
	c->reply_octets = 0;

	/* a reply during the login keeps its codes only: it may echo a secret */
	if (c->state == CS_AUTH)
	{
		size_t		n = 3;

		while (line[n] == ' ' || line[n] == '.' || isdigit((unsigned char) line[n]))
			n++;
		snprintf(c->reply, sizeof(c->reply), "%.*s(reply to AUTH)", (int) n, line);
	}
	else
		strlcpy(c->reply, line, sizeof(c->reply));
	c->reply_lines = 0;
	c->deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), cfg.timeout);

	if (c->state == CS_READY)
		conn_ready_reply(c, code);
	else
		conn_session_reply(c, code);
}

/*
 * conn_session_reply
 *		A reply while the session is being opened.
 */
static void
conn_session_reply(SmtpConn *c, int code)
{
	switch (c->state)
	{
		case CS_GREETING:
			if (code / 100 != 2)
			{
				conn_session_failed(c, "greeting refused the session: %s", c->reply);
				return;
			}
			{
				char	   *helo = helo_for(c);

				c->state = CS_EHLO;
				conn_send(c, "EHLO %s\r\n", helo);
				pfree(helo);
			}
			break;
		case CS_EHLO:
			if (code / 100 == 2)
			{
				c->esmtp = true;
				conn_after_ehlo(c);
			}
			else if (code / 100 == 5)
			{
				char	   *helo = helo_for(c);

				c->state = CS_HELO;
				conn_send(c, "HELO %s\r\n", helo);
				pfree(helo);
			}
			else
				conn_session_failed(c, "EHLO refused: %s", c->reply);
			break;
		case CS_HELO:
			if (code / 100 != 2)
				conn_session_failed(c, "HELO refused: %s", c->reply);
			else
				conn_after_ehlo(c);
			break;
		case CS_STARTTLS:
			if (code != 220)
				conn_session_failed(c, "STARTTLS refused: %s", c->reply);
			else if (c->in_len > c->in_pos)
				conn_session_failed(c, "relay sent more than its reply to STARTTLS");
			else
			{
				c->in_len = 0;
				c->in_pos = 0;
				c->after_starttls = true;
				conn_tls_start(c);
			}
			break;
		case CS_AUTH:
			conn_auth(c, code);
			break;
		case CS_QUIT:
			conn_close(c);
			break;
		default:
			conn_session_failed(c, "unexpected reply: %s", c->reply);
			break;
	}
}

/*
 * conn_after_ehlo
 *		EHLO (or HELO) was accepted: STARTTLS, AUTH, or ready.
 */
static void
conn_after_ehlo(SmtpConn *c)
{
	bool		credentials = cfg.user[0] != '\0';

	if (!c->tls && c->starttls)
	{
		c->state = CS_STARTTLS;
		conn_send(c, "STARTTLS\r\n");
		return;
	}
	if (!c->tls && credentials && !conn_peer_loopback(c))
	{
		conn_session_failed(c, "the relay does not offer STARTTLS, which is required "
							"before credentials go to a relay not on the loopback");
		return;
	}
	if (credentials && (c->auth_plain || c->auth_login))
	{
		c->state = CS_AUTH;
		c->auth_step = 0;
		conn_auth(c, 0);
		return;
	}
	conn_become_ready(c);
}

/*
 * conn_peer_loopback
 *		Whether c is connected to a loopback address (127.0.0.0/8, ::1, or
 *		127.0.0.0/8 mapped into IPv6): judged by the address connected to,
 *		never by the relay's name, which anyone's DNS may point anywhere.
 */
static bool
conn_peer_loopback(SmtpConn *c)
{
	struct sockaddr_storage ss;
	socklen_t	len = sizeof(ss);

	if (getpeername(c->sock, (struct sockaddr *) &ss, &len) != 0)
		return false;
	if (ss.ss_family == AF_INET)
	{
		uint32		addr = ntohl(((struct sockaddr_in *) &ss)->sin_addr.s_addr);

		return (addr >> 24) == 127;
	}
	if (ss.ss_family == AF_INET6)
	{
		const struct in6_addr *a6 = &((struct sockaddr_in6 *) &ss)->sin6_addr;

		return IN6_IS_ADDR_LOOPBACK(a6) ||
			(IN6_IS_ADDR_V4MAPPED(a6) && a6->s6_addr[12] == 127);
	}
	return false;
}

/*
 * conn_auth
 *		AUTH PLAIN (initial response) or LOGIN, step by step.  code is the
 *		reply to the last step, 0 to begin.
 */
static void
conn_auth(SmtpConn *c, int code)
{
	const char *user = cfg.user;
	const char *password = cfg.password;
	char	   *raw;
	char	   *enc;
	int			rawlen;
	int			enclen;

	if (code != 0 && code / 100 == 2)
	{
		conn_become_ready(c);
		return;
	}
	if (code != 0 && code != 334)
	{
		conn_session_failed(c, "login refused: %s", c->reply);
		return;
	}

	if (c->auth_plain)
	{
		if (c->auth_step > 0)
		{
			conn_session_failed(c, "login refused: %s", c->reply);
			return;
		}
		rawlen = strlen(user) + strlen(password) + 2;
		raw = palloc(rawlen + 1);
		raw[0] = '\0';
		memcpy(raw + 1, user, strlen(user) + 1);
		memcpy(raw + 2 + strlen(user), password, strlen(password));
	}
	else
	{
		if (c->auth_step == 0)
		{
			c->auth_step++;
			conn_send(c, "AUTH LOGIN\r\n");
			return;
		}
		if (c->auth_step > 2)
		{
			conn_session_failed(c, "login refused: %s", c->reply);
			return;
		}
		raw = pstrdup(c->auth_step == 1 ? user : password);
		rawlen = strlen(raw);
	}
	enclen = pg_b64_enc_len(rawlen);
	enc = palloc(enclen + 1);
	enclen = pg_b64_encode(raw, rawlen, enc, enclen);
	if (enclen < 0)
		elog(ERROR, "could not encode the relay login");
	enc[enclen] = '\0';
	explicit_bzero(raw, rawlen);
	pfree(raw);
	if (c->auth_plain)
		conn_send(c, "AUTH PLAIN %s\r\n", enc);
	else
		conn_send(c, "%s\r\n", enc);
	c->auth_step++;
	explicit_bzero(enc, enclen);
	pfree(enc);
}

/*
 * conn_become_ready
 *		The session is open: transactions may flow.
 */
static void
conn_become_ready(SmtpConn *c)
{
	c->state = CS_READY;
	c->idle_since = GetCurrentTimestamp();
	c->last_ok = true;
	nready++;
	dispatch();
}

/*
 * conn_start_txns
 *		Write the transactions queued on c that may be written now.
 */
static void
conn_start_txns(SmtpConn *c)
{
	while (c->state == CS_READY && !c->output_lost)
	{
		dlist_iter	iter;
		GatekeeperDelivery *next = NULL;

		dlist_foreach(iter, &c->txns)
		{
			GatekeeperDelivery *d = dlist_container(GatekeeperDelivery, queue_node, iter.cur);

			if (d->stage == ST_NONE)
			{
				next = d;
				break;
			}
		}
		if (next == NULL)
			break;
		/*
		 * Only BDAT lets a transaction follow one whose replies are still
		 * due: in lock-step, and with DATA, the next waits for every reply
		 * (RFC 2920 lets commands follow the final ".", but relays exist
		 * that hold the 354 of a DATA pipelined behind it until more input
		 * comes, and it never would).
		 */
		if (c->nexpect > 0 && !(c->pipelining && c->chunking))
			break;
		if (!c->pipelining && c->need_rset)
		{
			/* lock-step: RSET alone, and the transaction once it is answered */
			conn_send(c, "RSET\r\n");
			conn_expect(c, CMD_RSET, NULL);
			c->need_rset = false;
			break;
		}
		conn_write_txn(c, next);
	}
	conn_flush(c);
}

/*
 * conn_write_txn
 *		Begin transaction d on c: everything at once when pipelining, else
 *		its MAIL FROM.
 */
static void
conn_write_txn(SmtpConn *c, GatekeeperDelivery *d)
{
	char	   *from = envelope_address(d->from ? d->from : "");
	char	   *rcpt = envelope_address(d->mail.recipient);
	StringInfoData cmd;
	MemoryContext old;

	d->session_reached = true;

	/* what the relay would refuse is not sent */
	if (c->size_limit > 0 && (uint64) d->message.len > c->size_limit)
	{
		dlist_delete(&d->queue_node);
		c->ntxns--;
		ntxns_total--;
		txn_finish(d, GATEKEEPER_FAIL, 552,
				   "relay %s: message of %d octets exceeds the relay's SIZE limit of "
				   UINT64_FORMAT " octets; not sent", cfg.peer, d->message.len, c->size_limit);
		pfree(from);
		pfree(rcpt);
		return;
	}
	if ((d->needs_8bit && !c->eightbit) || (d->needs_utf8 && !c->smtputf8))
	{
		dlist_delete(&d->queue_node);
		c->ntxns--;
		ntxns_total--;
		txn_finish(d, GATEKEEPER_FAIL, 0, "relay %s does not offer %s, which this mail needs; not sent",
				   cfg.peer, d->needs_utf8 && !c->smtputf8 ? "SMTPUTF8" : "8BITMIME");
		pfree(from);
		pfree(rcpt);
		return;
	}

	old = MemoryContextSwitchTo(c->cxt);
	initStringInfo(&cmd);
	MemoryContextSwitchTo(old);
	if (c->pipelining && !c->last_ok)
	{
		appendStringInfoString(&cmd, "RSET\r\n");
		conn_expect(c, CMD_RSET, NULL);
	}
	c->need_rset = false;
	appendStringInfo(&cmd, "MAIL FROM:%s", from);
	if (c->size)
		appendStringInfo(&cmd, " SIZE=%d", d->message.len);
	if (d->needs_8bit)
		appendStringInfoString(&cmd, " BODY=8BITMIME");
	if (d->needs_utf8)
		appendStringInfoString(&cmd, " SMTPUTF8");
	if (c->dsn && d->envid != NULL)
		appendStringInfo(&cmd, " RET=HDRS ENVID=%s", d->envid);
	appendStringInfoString(&cmd, "\r\n");
	conn_expect(c, CMD_MAIL, d);
	c->last_ok = false;

	if (c->pipelining)
	{
		appendStringInfo(&cmd, "RCPT TO:%s", rcpt);
		append_dsn_notify(&cmd, c, d);
		appendStringInfoString(&cmd, "\r\n");
		conn_expect(c, CMD_RCPT, d);
		if (c->chunking)
		{
			appendStringInfo(&cmd, "BDAT %d LAST\r\n", d->message.len);
			conn_expect(c, CMD_BDAT, d);
			conn_push(c, cmd.data, cmd.len, cmd.data);
			conn_push(c, d->message.data, d->message.len, NULL);
			d->stage = ST_BODY;
		}
		else
		{
			appendStringInfoString(&cmd, "DATA\r\n");
			conn_expect(c, CMD_DATA, d);
			conn_push(c, cmd.data, cmd.len, cmd.data);
			c->data_wait = d;
			d->stage = ST_DATA;
		}
	}
	else
	{
		conn_push(c, cmd.data, cmd.len, cmd.data);
		d->stage = ST_MAIL;
	}
	pfree(from);
	pfree(rcpt);
}

/*
 * conn_lockstep_next
 *		Without PIPELINING: the next command of d once the last succeeded.
 */
static void
conn_lockstep_next(SmtpConn *c, GatekeeperDelivery *d)
{
	if (d->stage == ST_MAIL)
	{
		char	   *rcpt = envelope_address(d->mail.recipient);
		StringInfoData notify;

		initStringInfo(&notify);
		append_dsn_notify(&notify, c, d);
		conn_send(c, "RCPT TO:%s%s\r\n", rcpt, notify.data);
		conn_expect(c, CMD_RCPT, d);
		pfree(notify.data);
		pfree(rcpt);
		d->stage = ST_RCPT;
	}
	else if (d->stage == ST_RCPT)
	{
		conn_send(c, "DATA\r\n");
		conn_expect(c, CMD_DATA, d);
		c->data_wait = d;
		d->stage = ST_DATA;
	}
}

/*
 * conn_write_message
 *		After 354: the message, dot-stuffed, and the final ".".
 */
static void
conn_write_message(SmtpConn *c, GatekeeperDelivery *d)
{
	conn_push(c, d->message.data, d->message.len, NULL);
	c->segs[(c->seghead + c->nsegs - 1) % c->segcap].stuff = true;
	conn_expect(c, CMD_DOT, d);
	d->stage = ST_BODY;
}

/*
 * conn_stuff_piece
 *		The next piece of message segment s, dot-stuffed, into c->chunk;
 *		after the last piece, CRLF if the message did not end with one,
 *		and ".".  Stuffing a piece at a time keeps no second copy of a
 *		large message.
 */
static void
conn_stuff_piece(SmtpConn *c, SmtpSegment *s)
{
	const char *p = s->data + c->segoff;
	const char *end = s->data + s->len;
	const char *stop = p + Min((size_t) (end - p), (size_t) 65536);

	if (c->segoff == 0)
		c->at_bol = true;
	resetStringInfo(&c->chunk);
	c->chunk_off = 0;
	while (p < stop)
	{
		const char *nl = memchr(p, '\n', stop - p);
		const char *e = nl ? nl + 1 : stop;

		if (c->at_bol && *p == '.')
			appendStringInfoChar(&c->chunk, '.');
		appendBinaryStringInfo(&c->chunk, p, e - p);
		c->at_bol = nl != NULL;
		p = e;
	}
	c->segoff = p - s->data;
	if (p == end)
	{
		if (!c->at_bol)
			appendStringInfoString(&c->chunk, "\r\n");
		appendStringInfoString(&c->chunk, ".\r\n");
		c->stuffed_all = true;
	}
}

/*
 * conn_ready_reply
 *		A reply to a transaction's command.
 */
static void
conn_ready_reply(SmtpConn *c, int code)
{
	SmtpExpect	e;
	GatekeeperDelivery *d;
	bool		ok = code / 100 == 2;

	if (code == 421 || c->nexpect == 0)
	{
		char		error[SMTP_REPLY_MAX + 64];

		/* 421 (RFC 5321 3.8), or a reply nobody asked for: the end */
		snprintf(error, sizeof(error), "the relay ended the session: %s", c->reply);
		conn_lost(c, true, error);
		return;
	}
	e = c->expect[c->exphead];
	c->exphead = (c->exphead + 1) % c->expcap;
	c->nexpect--;
	d = e.d;
	if (d != NULL)
		d->replies++;

	switch (e.command)
	{
		case CMD_RSET:
			break;
		case CMD_MAIL:
			if (!ok)
			{
				txn_fail(c, d, code, "MAIL FROM");
				d->mail_refused = d->outcome == GATEKEEPER_FAIL && code / 100 == 5 &&
					d->reply_code == code;
				if (!c->pipelining)
					conn_txn_done(c, d);
			}
			else if (!c->pipelining)
				conn_lockstep_next(c, d);
			break;
		case CMD_RCPT:
			if (!ok)
			{
				txn_fail(c, d, code, "RCPT TO");
				if (!c->pipelining)
					conn_txn_done(c, d);
			}
			else if (!c->pipelining)
				conn_lockstep_next(c, d);
			break;
		case CMD_DATA:
			c->data_wait = NULL;
			if (code == 354)
			{
				if (d->outcome != GATEKEEPER_PENDING)
				{
					/* pipelined behind a refusal: end the empty message */
					conn_send(c, ".\r\n");
					conn_expect(c, CMD_DOT, d);
					d->stage = ST_BODY;
				}
				else
					conn_write_message(c, d);
			}
			else
			{
				txn_fail(c, d, code, "DATA");
				conn_txn_done(c, d);
			}
			break;
		case CMD_DOT:
		case CMD_BDAT:
			if (!ok)
				txn_fail(c, d, code, e.command == CMD_DOT ? "the message" : "BDAT");
			conn_txn_done(c, d);
			break;
	}
	conn_start_txns(c);
}

/*
 * conn_txn_done
 *		d's last reply arrived: hand it back.
 */
static void
conn_txn_done(SmtpConn *c, GatekeeperDelivery *d)
{
	if (d->stage == ST_DONE)
		return;
	d->stage = ST_DONE;
	dlist_delete(&d->queue_node);
	c->ntxns--;
	ntxns_total--;
	c->reused = true;
	if (d->outcome == GATEKEEPER_PENDING)
	{
		c->last_ok = c->nexpect == 0;
		txn_finish(d, GATEKEEPER_SENT, 250, "%s", "");
	}
	else
	{
		c->last_ok = false;
		c->need_rset = true;
		dlist_push_tail(&done, &d->queue_node);
	}
	if (c->ntxns == 0)
		c->idle_since = GetCurrentTimestamp();
}

/*
 * txn_fail
 *		d was refused with code in reply to what: the first refusal decides.
 */
static void
txn_fail(SmtpConn *c, GatekeeperDelivery *d, int code, const char *what)
{
	if (d->outcome != GATEKEEPER_PENDING)
		return;
	d->outcome = code / 100 == 5 ? GATEKEEPER_FAIL : GATEKEEPER_RETRY;
	d->reply_code = code;

	/*
	 * A refusal of the recipient starts with the reply, which nack reads
	 * for a hard bounce (RFC 3463 5.1.x); no other refusal is one.
	 */
	if (strcmp(what, "RCPT TO") == 0)
		snprintf(d->error, sizeof(d->error), "%s (relay %s, reply to RCPT TO)",
				 c->reply, cfg.peer);
	else
		snprintf(d->error, sizeof(d->error), "relay %s refused %s: %s", cfg.peer, what, c->reply);
}

/*
 * txn_finish
 *		Set d's outcome (unless a refusal set it already) and hand it back.
 */
static void
txn_finish(GatekeeperDelivery *d, GatekeeperOutcome outcome, int code, const char *fmt,...)
{
	if (d->outcome == GATEKEEPER_PENDING || outcome == GATEKEEPER_UNREACHABLE)
	{
		va_list		ap;

		d->outcome = outcome;
		d->reply_code = code;
		va_start(ap, fmt);
		vsnprintf(d->error, sizeof(d->error), fmt, ap);
		va_end(ap);
	}
	d->stage = ST_DONE;
	dlist_push_tail(&done, &d->queue_node);
}

/*
 * txn_to_backlog
 *		Put d back at the head of the backlog, as if never sent.
 */
static void
txn_to_backlog(GatekeeperDelivery *d)
{
	d->stage = ST_NONE;
	d->replies = 0;
	d->outcome = GATEKEEPER_PENDING;
	d->error[0] = '\0';
	dlist_push_head(&backlog, &d->queue_node);
	nbacklog++;
}

/*
 * backlog_unreachable
 *		Every delivery waiting for a connection is UNREACHABLE with error.
 */
static void
backlog_unreachable(const char *error)
{
	while (!dlist_is_empty(&backlog))
	{
		GatekeeperDelivery *d = dlist_container(GatekeeperDelivery, queue_node,
												dlist_pop_head_node(&backlog));

		nbacklog--;
		txn_finish(d, GATEKEEPER_UNREACHABLE, 0, "%s", error);
	}
}

/*
 * conn_send
 *		Queue a command on c.
 */
static void
conn_send(SmtpConn *c, const char *fmt,...)
{
	char	   *s;
	va_list		ap;
	StringInfoData buf;
	MemoryContext old = MemoryContextSwitchTo(c->cxt);

	initStringInfo(&buf);
	for (;;)
	{
		int			needed;

		va_start(ap, fmt);
		needed = appendStringInfoVA(&buf, fmt, ap);
		va_end(ap);
		if (needed == 0)
			break;
		enlargeStringInfo(&buf, needed);
	}
	MemoryContextSwitchTo(old);
	s = buf.data;
	conn_push(c, s, buf.len, s);
	if (c->state != CS_READY)
		c->deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), cfg.timeout);
}

/*
 * conn_push
 *		Queue a piece of output on c.
 */
static void
conn_push(SmtpConn *c, const char *data, size_t len, char *owned)
{
	SmtpSegment *s;

	if (c->nsegs == c->segcap)
	{
		int			cap = Max(8, c->segcap * 2);
		SmtpSegment *segs = MemoryContextAlloc(c->cxt, sizeof(SmtpSegment) * cap);
		int			i;

		for (i = 0; i < c->nsegs; i++)
			segs[i] = c->segs[(c->seghead + i) % c->segcap];
		if (c->segs)
			pfree(c->segs);
		c->segs = segs;
		c->segcap = cap;
		c->seghead = 0;
	}
	s = &c->segs[(c->seghead + c->nsegs) % c->segcap];
	s->data = data;
	s->len = len;
	s->owned = owned;
	s->stuff = false;
	c->nsegs++;
	if (c->nexpect == 0 || c->state != CS_READY)
		c->deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), cfg.timeout);
}

/*
 * conn_expect
 *		Note that c waits for one more reply.
 */
static void
conn_expect(SmtpConn *c, SmtpCommand command, GatekeeperDelivery *d)
{
	if (c->nexpect == c->expcap)
	{
		int			cap = Max(16, c->expcap * 2);
		SmtpExpect *e = MemoryContextAlloc(c->cxt, sizeof(SmtpExpect) * cap);
		int			i;

		for (i = 0; i < c->nexpect; i++)
			e[i] = c->expect[(c->exphead + i) % c->expcap];
		if (c->expect)
			pfree(c->expect);
		c->expect = e;
		c->expcap = cap;
		c->exphead = 0;
	}
	if (c->nexpect == 0)
		c->deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), cfg.timeout);
	c->expect[(c->exphead + c->nexpect) % c->expcap].command = command;
	c->expect[(c->exphead + c->nexpect) % c->expcap].d = d;
	c->nexpect++;
}

/*
 * conn_flush
 *		Write as much of c's output as the socket takes.
 */
static void
conn_flush(SmtpConn *c)
{
	char		err[256];

	if (c->state == CS_CLOSED || c->output_lost)
		return;
	while (c->nsegs > 0)
	{
		SmtpSegment *s = &c->segs[c->seghead];
		ssize_t		n;

		err[0] = '\0';
		if (s->stuff)
		{
			if (c->chunk_off >= c->chunk.len)
			{
				if (c->stuffed_all)
				{
					/* all of it written */
					c->stuffed_all = false;
					resetStringInfo(&c->chunk);
					c->chunk_off = 0;
					c->seghead = (c->seghead + 1) % c->segcap;
					c->nsegs--;
					c->segoff = 0;
					continue;
				}
				conn_stuff_piece(c, s);
			}
			n = conn_write(c, c->chunk.data + c->chunk_off, c->chunk.len - c->chunk_off,
						   err, sizeof(err));
			if (n < 0)
			{
				conn_output_lost(c, err);
				return;
			}
			if (n == 0)
				break;
			c->chunk_off += n;
			if (c->nexpect > 0)
				c->deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), cfg.timeout);
			continue;
		}
		n = conn_write(c, s->data + c->segoff, s->len - c->segoff, err, sizeof(err));
		if (n < 0)
		{
			conn_output_lost(c, err);
			return;
		}
		if (n == 0 && s->len > c->segoff)
			break;
		c->segoff += n;
		if (c->nexpect > 0)
			c->deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), cfg.timeout);
		if (c->segoff >= s->len)
		{
			if (s->owned)
				pfree(s->owned);
			c->seghead = (c->seghead + 1) % c->segcap;
			c->nsegs--;
			c->segoff = 0;
		}
	}
	conn_update_events(c);
}

/*
 * conn_output_lost
 *		A write to c failed: the relay has closed or reset the connection.
 *		Nothing more is written; the replies it sent before are still to be
 *		read, and conn_readable gives c up when it reaches their end (or the
 *		wait does, if that never comes).
 */
static void
conn_output_lost(SmtpConn *c, const char *error)
{
	if (!c->output_lost)
	{
		c->output_lost = true;
		strlcpy(c->output_error, error, sizeof(c->output_error));
		c->deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), SMTP_QUIT_WAIT_MS);
	}
	conn_update_events(c);
}

/*
 * conn_update_events
 *		Register in the wait set what c waits for now.
 */
static void
conn_update_events(SmtpConn *c)
{
	uint32		events = WL_SOCKET_READABLE;

	if (c->sock == PGINVALID_SOCKET)
		return;
	if (c->state == CS_CONNECTING || (c->nsegs > 0 && !c->output_lost) ||
		c->tls_read_wants_write)
		events |= WL_SOCKET_WRITEABLE;
	if (c->events != events)
	{
		c->events = events;
		if (wait_set != NULL && !wait_set_stale && c->pos >= 0)
			ModifyWaitEvent(wait_set, c->pos, events, NULL);
		else
			wait_set_stale = true;
	}
}

/*
 * rebuild_wait_set
 *		The wait set: latch, postmaster death, and every connection.
 */
static void
rebuild_wait_set(void)
{
	dlist_iter	iter;
	int			n = 2 + nconns;

	if (wait_set != NULL)
		FreeWaitEventSet(wait_set);
	if (wait_events_cap < n)
	{
		if (wait_events != NULL)
			pfree(wait_events);
		wait_events_cap = Max(n, 16);
		wait_events = MemoryContextAlloc(TopMemoryContext, sizeof(WaitEvent) * wait_events_cap);
	}
	wait_set = CreateWaitEventSet(TopMemoryContext, n);
	AddWaitEventToSet(wait_set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
	AddWaitEventToSet(wait_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
	dlist_foreach(iter, &conns)
	{
		SmtpConn   *c = dlist_container(SmtpConn, node, iter.cur);

		c->pos = -1;
		if (c->sock == PGINVALID_SOCKET)
			continue;
		if (c->state == CS_CONNECTING)
			c->events = WL_SOCKET_WRITEABLE;
		else if (c->events == 0)
			c->events = WL_SOCKET_READABLE;
		c->pos = AddWaitEventToSet(wait_set, c->events, c->sock, NULL, c);
	}
	wait_set_stale = false;
}

/*
 * conn_tls_start
 *		Begin TLS on c (smtps, or after STARTTLS), verifying the relay's
 *		certificate and that it names the host of gatekeeper.smtp_url.
 */
static void
conn_tls_start(SmtpConn *c)
{
	char		buf[256];

	if (tls_ctx == NULL)
	{
		tls_ctx = SSL_CTX_new(TLS_client_method());
		if (tls_ctx == NULL)
		{
			tls_error(c, "could not create a TLS context", buf, sizeof(buf));
			conn_session_failed(c, "%s", buf);
			return;
		}
		SSL_CTX_set_min_proto_version(tls_ctx, TLS1_2_VERSION);
		SSL_CTX_set_verify(tls_ctx, SSL_VERIFY_PEER, NULL);
		SSL_CTX_set_mode(tls_ctx, SSL_MODE_ENABLE_PARTIAL_WRITE |
						 SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
		if (cfg.ca_file[0] != '\0' ?
			SSL_CTX_load_verify_locations(tls_ctx, cfg.ca_file, NULL) != 1 :
			SSL_CTX_set_default_verify_paths(tls_ctx) != 1)
		{
			char		what[300];

			snprintf(what, sizeof(what), "could not load the CAs of %s",
					 cfg.ca_file[0] ? cfg.ca_file : "the system's store");
			tls_error(c, what, buf, sizeof(buf));
			SSL_CTX_free(tls_ctx);
			tls_ctx = NULL;
			conn_session_failed(c, "%s", buf);
			return;
		}
	}
	ERR_clear_error();
	c->ssl = SSL_new(tls_ctx);
	if (c->ssl == NULL || SSL_set_fd(c->ssl, c->sock) != 1)
	{
		tls_error(c, "could not start TLS", buf, sizeof(buf));
		conn_session_failed(c, "%s", buf);
		return;
	}
	if (strspn(cfg.host, "0123456789.") == strlen(cfg.host) || strchr(cfg.host, ':'))
		X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), cfg.host);
	else
	{
		SSL_set_tlsext_host_name(c->ssl, cfg.host);
		SSL_set1_host(c->ssl, cfg.host);
	}
	c->state = CS_TLS;
	c->deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), cfg.timeout);
	conn_tls_handshake(c);
}

/*
 * conn_tls_handshake
 *		Go on with the TLS handshake of c.
 */
static void
conn_tls_handshake(SmtpConn *c)
{
	int			r;
	char		buf[256];

	ERR_clear_error();
	r = SSL_connect(c->ssl);
	if (r == 1)
	{
		c->tls = true;
		c->tls_read_wants_write = false;
		if (!c->after_starttls)
			c->state = CS_GREETING;
		else
		{
			char	   *helo = helo_for(c);

			/* after STARTTLS, what EHLO said before is forgotten */
			c->pipelining = c->chunking = c->eightbit = c->smtputf8 = c->dsn = false;
			c->starttls = c->auth_plain = c->auth_login = false;
			c->size = false;
			c->size_limit = 0;
			c->state = CS_EHLO;
			conn_send(c, "EHLO %s\r\n", helo);
			pfree(helo);
			conn_flush(c);
			return;
		}
		conn_update_events(c);
		return;
	}
	switch (SSL_get_error(c->ssl, r))
	{
		case SSL_ERROR_WANT_READ:
			c->tls_read_wants_write = false;
			conn_update_events(c);
			return;
		case SSL_ERROR_WANT_WRITE:
			c->tls_read_wants_write = true;
			conn_update_events(c);
			return;
		default:
			{
				long		v = SSL_get_verify_result(c->ssl);

				if (v != X509_V_OK)
					snprintf(buf, sizeof(buf), "TLS handshake failed: certificate does not verify: %s",
							 X509_verify_cert_error_string(v));
				else
					tls_error(c, "TLS handshake failed", buf, sizeof(buf));
				conn_session_failed(c, "%s", buf);
			}
	}
}

/*
 * conn_read
 *		Read from c: > 0 octets read, 0 nothing more now (*eof when the
 *		relay closed), -1 an error described in err.
 */
static ssize_t
conn_read(SmtpConn *c, char *buf, size_t len, bool *eof, char *err, size_t errlen)
{
	if (c->ssl != NULL && c->tls)
	{
		int			r;

		ERR_clear_error();
		r = SSL_read(c->ssl, buf, (int) len);
		if (r > 0)
			return r;
		c->tls_read_wants_write = false;
		switch (SSL_get_error(c->ssl, r))
		{
			case SSL_ERROR_WANT_READ:
				return 0;
			case SSL_ERROR_WANT_WRITE:
				c->tls_read_wants_write = true;
				return 0;
			case SSL_ERROR_ZERO_RETURN:
				*eof = true;
				return 0;
			case SSL_ERROR_SYSCALL:
				if (errno == 0 || errno == ECONNRESET)
				{
					*eof = true;
					return 0;
				}
				snprintf(err, errlen, "could not read: %m");
				return -1;
			default:
				tls_error(c, "could not read", err, errlen);
				return -1;
		}
	}
	for (;;)
	{
		ssize_t		n = recv(c->sock, buf, len, 0);

		if (n > 0)
			return n;
		if (n == 0)
		{
			*eof = true;
			return 0;
		}
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 0;
		if (errno == ECONNRESET)
		{
			*eof = true;
			return 0;
		}
		snprintf(err, errlen, "could not read: %m");
		return -1;
	}
}

/*
 * conn_write
 *		Write to c: octets written (0: none now), or -1 with err.
 */
static ssize_t
conn_write(SmtpConn *c, const char *buf, size_t len, char *err, size_t errlen)
{
	if (len == 0)
		return 0;
	if (c->ssl != NULL && c->tls)
	{
		int			r;

		ERR_clear_error();
		r = SSL_write(c->ssl, buf, (int) Min(len, (size_t) INT_MAX));
		if (r > 0)
			return r;
		c->tls_write_wants_read = false;
		switch (SSL_get_error(c->ssl, r))
		{
			case SSL_ERROR_WANT_WRITE:
				return 0;
			case SSL_ERROR_WANT_READ:
				c->tls_write_wants_read = true;
				return 0;
			case SSL_ERROR_SYSCALL:
				snprintf(err, errlen, "could not write: %m");
				return -1;
			default:
				tls_error(c, "could not write", err, errlen);
				return -1;
		}
	}
	for (;;)
	{
		ssize_t		n = send(c->sock, buf, len, MSG_NOSIGNAL);

		if (n >= 0)
			return n;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 0;
		snprintf(err, errlen, "could not write: %m");
		return -1;
	}
}

/*
 * tls_error
 *		OpenSSL's reason for a failure, after what.
 */
static void
tls_error(SmtpConn *c, const char *what, char *buf, size_t len)
{
	unsigned long e = ERR_get_error();
	char		reason[200];

	if (e != 0)
		ERR_error_string_n(e, reason, sizeof(reason));
	else
		strlcpy(reason, "no reason given", sizeof(reason));
	snprintf(buf, len, "%s: %s", what, reason);
	ERR_clear_error();
}

/*
 * envelope_address
 *		The SMTP path for an address, "<local@domain>": the part between
 *		angle brackets when there is one ("Name <a@b>"), else all of it.
 */
static char *
envelope_address(const char *address)
{
	const char *lt = strrchr(address, '<');
	const char *start;
	const char *end;

	if (lt != NULL && strchr(lt, '>') != NULL)
	{
		start = lt + 1;
		end = strchr(lt, '>');
	}
	else
	{
		start = address;
		end = address + strlen(address);
	}
	while (start < end && (*start == ' ' || *start == '\t'))
		start++;
	while (end > start && (end[-1] == ' ' || end[-1] == '\t'))
		end--;
	return psprintf("<%.*s>", (int) (end - start), start);
}

/*
 * append_dsn_notify
 *		When the relay offers DSN (RFC 3461), RCPT TO's parameters asking
 *		for a report of failure or delay (not of success) and carrying the
 *		recipient as given (ORCPT, xtext; left out for an address that is
 *		not ASCII, which the rfc822 type cannot carry).
 */
static void
append_dsn_notify(StringInfo buf, SmtpConn *c, GatekeeperDelivery *d)
{
	const char *p;

	if (!c->dsn || d->envid == NULL)
		return;
	appendStringInfoString(buf, " NOTIFY=FAILURE,DELAY");
	if (!smtp_client_address_ascii(d->mail.recipient))
		return;
	appendStringInfoString(buf, " ORCPT=rfc822;");
	for (p = d->mail.recipient; *p; p++)
	{
		unsigned char ch = (unsigned char) *p;

		if (ch < 33 || ch > 126 || ch == '+' || ch == '=')
			appendStringInfo(buf, "+%02X", ch);
		else
			appendStringInfoChar(buf, (char) ch);
	}
}

/*
 * sanitize
 *		Copy a reply line for error text: control characters become spaces.
 */
static void
sanitize(char *dst, size_t dstlen, const char *src, size_t srclen)
{
	size_t		i;
	size_t		n = Min(srclen, dstlen - 1);

	for (i = 0; i < n; i++)
	{
		unsigned char ch = (unsigned char) src[i];

		dst[i] = (ch < 0x20 || ch == 0x7f) ? ' ' : (char) ch;
	}
	dst[n] = '\0';
}
