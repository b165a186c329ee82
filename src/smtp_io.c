/*-------------------------------------------------------------------------
 *
 * smtp_io.c
 *		The SMTP client's I/O layer: one relay connection's non-blocking
 *		socket, OpenSSL over it, and its bounded buffers.
 *
 * This layer moves bytes and knows nothing of SMTP's commands: it
 * connects to the relay's addresses in turn, runs the TLS handshake,
 * reads into the caller's fixed buffer, and writes a queue of segments
 * (commands it owns, messages it borrows from their deliveries), a
 * message dot-stuffed a piece at a time with its final "." so that no
 * second copy of a large message is ever made.  A failed write does not
 * end the connection: it stops the writing (output_lost) so that the
 * replies sent before can still be read.  What the connection waits for
 * is noted on it (events, events_changed, sock_changed); the wait set is
 * smtp_client.c's, which learns it before it waits.  Every error is
 * written into the caller's buffer as text (OpenSSL's reason, or errno's).
 *
 * IDENTIFICATION
 *		src/smtp_io.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "smtp_io.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/x509v3.h>

#include "storage/latch.h"
#include "utils/memutils.h"

/* the most output segments one sendmsg() gathers */
#define SMTP_WRITE_SEGMENTS		64

static ssize_t conn_write(SmtpConn *c, const char *buf, size_t len, char *err, size_t errlen);
static void conn_stuff_piece(SmtpConn *c, SmtpSegment *s);
static ssize_t conn_write_plain(SmtpConn *c, char *err, size_t errlen);
static ssize_t sock_send(SmtpConn *c, struct iovec *iov, int niov, char *err, size_t errlen);
static void conn_output_lost(SmtpConn *c, const char *error);
static void tls_error(const char *what, char *buf, size_t len);

/*
 * smtp_io_connect_next
 *		Start connecting c to the next address of its relay.  Returns false,
 *		with why in err, when none is left.
 */
bool
smtp_io_connect_next(SmtpConn *c, char *err, size_t errlen)
{
	SmtpConfig *cfg = &c->relay->cfg;
	char		last[256] = "";

	for (;;)
	{
		struct addrinfo *ai = cfg->addrs;
		int			i;
		int			one = 1;

		if (c->sock != PGINVALID_SOCKET)
		{
			close(c->sock);
			c->sock = PGINVALID_SOCKET;
			c->sock_changed = true;
		}
		c->addr++;
		if (c->addr >= cfg->naddrs)
		{
			snprintf(err, errlen, "could not connect: %s",
					 last[0] ? last : "no address");
			return false;
		}
		for (i = 0; i < c->addr; i++)
			ai = ai->ai_next;

		c->sock = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
						 ai->ai_protocol);
		if (c->sock == PGINVALID_SOCKET)
		{
			snprintf(last, sizeof(last), "could not create a socket: %m");
			continue;
		}
		(void) setsockopt(c->sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		c->sock_changed = true;
		if (connect(c->sock, ai->ai_addr, ai->ai_addrlen) == 0 || errno == EINPROGRESS)
		{
			c->events = 0;
			c->pos = -1;
			return true;		/* smtp_io_connect_result when writable */
		}
		snprintf(last, sizeof(last), "%m");
	}
}

/*
 * smtp_io_connect_result
 *		The connection attempt of c made progress: DONE when connected, WAIT
 *		while it goes on (perhaps to the next address), FAILED with err.
 */
int
smtp_io_connect_result(SmtpConn *c, char *err, size_t errlen)
{
	int			error = 0;
	socklen_t	len = sizeof(error);

	if (getsockopt(c->sock, SOL_SOCKET, SO_ERROR, &error, &len) != 0)
		error = errno;
	if (error == EINPROGRESS || error == EALREADY)
		return SMTP_IO_WAIT;
	if (error != 0)
	{
		if (c->addr + 1 < c->relay->cfg.naddrs)
			return smtp_io_connect_next(c, err, errlen) ? SMTP_IO_WAIT : SMTP_IO_FAILED;
		errno = error;
		snprintf(err, errlen, "could not connect: %m");
		return SMTP_IO_FAILED;
	}
	return SMTP_IO_DONE;
}

/*
 * smtp_io_tls_start
 *		Begin TLS on c (smtps, or after STARTTLS), verifying the relay's
 *		certificate and that it names the host of its URL.  Returns false
 *		with err when TLS cannot even begin.
 */
bool
smtp_io_tls_start(SmtpConn *c, char *err, size_t errlen)
{
	SmtpRelay  *r = c->relay;
	const char *host = r->cfg.host;

	if (r->tls_ctx == NULL)
	{
		r->tls_ctx = SSL_CTX_new(TLS_client_method());
		if (r->tls_ctx == NULL)
		{
			tls_error("could not create a TLS context", err, errlen);
			return false;
		}
		SSL_CTX_set_min_proto_version(r->tls_ctx, TLS1_2_VERSION);
		SSL_CTX_set_verify(r->tls_ctx, SSL_VERIFY_PEER, NULL);
		SSL_CTX_set_mode(r->tls_ctx, SSL_MODE_ENABLE_PARTIAL_WRITE |
						 SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
		if (r->cfg.ca_file[0] != '\0' ?
			SSL_CTX_load_verify_locations(r->tls_ctx, r->cfg.ca_file, NULL) != 1 :
			SSL_CTX_set_default_verify_paths(r->tls_ctx) != 1)
		{
			char		what[300];

			snprintf(what, sizeof(what), "could not load the CAs of %s",
					 r->cfg.ca_file[0] ? r->cfg.ca_file : "the system's store");
			tls_error(what, err, errlen);
			SSL_CTX_free(r->tls_ctx);
			r->tls_ctx = NULL;
			return false;
		}
	}
	ERR_clear_error();
	c->ssl = SSL_new(r->tls_ctx);
	if (c->ssl == NULL || SSL_set_fd(c->ssl, c->sock) != 1)
	{
		tls_error("could not start TLS", err, errlen);
		return false;
	}
	if (strspn(host, "0123456789.") == strlen(host) || strchr(host, ':'))
		X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), host);
	else
	{
		SSL_set_tlsext_host_name(c->ssl, host);
		SSL_set1_host(c->ssl, host);
	}
	return true;
}

/*
 * smtp_io_tls_handshake
 *		Go on with the TLS handshake of c: DONE (TLS is on), WAIT, or FAILED
 *		with err.
 */
int
smtp_io_tls_handshake(SmtpConn *c, char *err, size_t errlen)
{
	int			r;

	ERR_clear_error();
	r = SSL_connect(c->ssl);
	if (r == 1)
	{
		c->tls = true;
		c->tls_read_wants_write = false;
		return SMTP_IO_DONE;
	}
	switch (SSL_get_error(c->ssl, r))
	{
		case SSL_ERROR_WANT_READ:
			c->tls_read_wants_write = false;
			smtp_io_update_events(c);
			return SMTP_IO_WAIT;
		case SSL_ERROR_WANT_WRITE:
			c->tls_read_wants_write = true;
			smtp_io_update_events(c);
			return SMTP_IO_WAIT;
		default:
			{
				long		v = SSL_get_verify_result(c->ssl);

				if (v != X509_V_OK)
					snprintf(err, errlen, "TLS handshake failed: certificate does not verify: %s",
							 X509_verify_cert_error_string(v));
				else
					tls_error("TLS handshake failed", err, errlen);
				return SMTP_IO_FAILED;
			}
	}
}

/*
 * smtp_io_read
 *		Read from c: > 0 octets read, 0 nothing more now (*eof when the
 *		relay closed), -1 an error described in err.
 */
ssize_t
smtp_io_read(SmtpConn *c, char *buf, size_t len, bool *eof, char *err, size_t errlen)
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
				tls_error("could not read", err, errlen);
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
				tls_error("could not write", err, errlen);
				return -1;
		}
	}
	else
	{
		struct iovec iov;

		iov.iov_base = unconstify(char *, buf);
		iov.iov_len = len;
		return sock_send(c, &iov, 1, err, errlen);
	}
}

/*
 * smtp_io_push
 *		Queue a piece of output on c.
 */
void
smtp_io_push(SmtpConn *c, const char *data, size_t len, char *owned)
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
		smtp_io_progress(c);
}

/*
 * smtp_io_push_stuffed
 *		Queue a message on c, to be dot-stuffed and ended with ".".
 */
void
smtp_io_push_stuffed(SmtpConn *c, const char *data, size_t len)
{
	smtp_io_push(c, data, len, NULL);
	c->segs[(c->seghead + c->nsegs - 1) % c->segcap].stuff = true;
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
 * smtp_io_flush
 *		Write as much of c's output as the socket takes.
 */
void
smtp_io_flush(SmtpConn *c)
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
				smtp_io_progress(c);
			continue;
		}
		if (c->ssl != NULL && c->tls)
			n = conn_write(c, s->data + c->segoff, s->len - c->segoff, err, sizeof(err));
		else
			n = conn_write_plain(c, err, sizeof(err));
		if (n < 0)
		{
			conn_output_lost(c, err);
			return;
		}
		if (n == 0 && s->len > c->segoff)
			break;
		if (c->nexpect > 0)
			smtp_io_progress(c);
		/* what was written may span several segments */
		for (;;)
		{
			s = &c->segs[c->seghead];
			if ((size_t) n < s->len - c->segoff)
			{
				c->segoff += n;
				break;
			}
			n -= s->len - c->segoff;
			if (s->owned)
				pfree(s->owned);
			c->seghead = (c->seghead + 1) % c->segcap;
			c->nsegs--;
			c->segoff = 0;
			if (n == 0 || c->nsegs == 0 || c->segs[c->seghead].stuff)
				break;
		}
		Assert(n == 0 || c->nsegs > 0);
	}
	smtp_io_update_events(c);
}

/*
 * conn_write_plain
 *		Write the unstuffed segments at the head of c's output, up to
 *		SMTP_WRITE_SEGMENTS of them, in one sendmsg(): a transaction's
 *		commands and its BDAT message, and the transactions queued behind
 *		it, go out in one system call (and, with TCP_NODELAY, in as few
 *		packets as they fill) instead of one each.  Octets written (0: none
 *		now), or -1 with err.  Not for TLS, whose records SSL_write makes.
 */
static ssize_t
conn_write_plain(SmtpConn *c, char *err, size_t errlen)
{
	struct iovec iov[SMTP_WRITE_SEGMENTS];
	int			niov = 0;
	int			i;

	for (i = 0; i < c->nsegs && niov < SMTP_WRITE_SEGMENTS; i++)
	{
		SmtpSegment *s = &c->segs[(c->seghead + i) % c->segcap];
		size_t		off = i == 0 ? c->segoff : 0;

		if (s->stuff)
			break;
		if (s->len <= off)
			continue;
		iov[niov].iov_base = unconstify(char *, s->data) + off;
		iov[niov].iov_len = s->len - off;
		niov++;
	}
	if (niov == 0)
		return 0;
	return sock_send(c, iov, niov, err, errlen);
}

/*
 * sock_send
 *		Send the niov pieces iov on c's socket, without TLS: octets written
 *		(0: none now), or -1 with err.
 */
static ssize_t
sock_send(SmtpConn *c, struct iovec *iov, int niov, char *err, size_t errlen)
{
	struct msghdr msg;

	memset(&msg, 0, sizeof(msg));
	msg.msg_iov = iov;
	msg.msg_iovlen = niov;
	for (;;)
	{
		ssize_t		n = sendmsg(c->sock, &msg, MSG_NOSIGNAL);

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
 * smtp_io_progress
 *		c moved on: a write, a reply, a command queued.  The reply it
 *		awaits is late the relay's timeout after the next look at the clock
 *		(smtp_io_settle_timer, once per wait) rather than after now: reading
 *		the clock at every write and every reply was 2% of the worker's
 *		time.  The wait looks at the clock before and after it waits, so
 *		the deadline is at most one round of the worker's work later than
 *		the progress.
 */
void
smtp_io_progress(SmtpConn *c)
{
	c->timer_restart = true;
}

/*
 * smtp_io_set_deadline
 *		c's deadline, ms after now, in place of any progress noted.
 */
void
smtp_io_set_deadline(SmtpConn *c, TimestampTz now, int ms)
{
	c->deadline = TimestampTzPlusMilliseconds(now, ms);
	c->timer_restart = false;
}

/*
 * smtp_io_settle_timer
 *		The clock was read (now): progress noted since the last reading
 *		restarts c's deadline from it.
 */
void
smtp_io_settle_timer(SmtpConn *c, TimestampTz now)
{
	if (c->timer_restart)
		smtp_io_set_deadline(c, now, c->relay->cfg.timeout);
}

/*
 * conn_output_lost
 *		A write to c failed: the relay has closed or reset the connection.
 *		Nothing more is written; the replies it sent before are still to be
 *		read, and smtp_session_readable gives c up when it reaches their end (or the
 *		wait does, if that never comes).
 */
static void
conn_output_lost(SmtpConn *c, const char *error)
{
	if (!c->output_lost)
	{
		c->output_lost = true;
		strlcpy(c->output_error, error, sizeof(c->output_error));
		smtp_io_set_deadline(c, GetCurrentTimestamp(), SMTP_QUIT_WAIT_MS);
	}
	smtp_io_update_events(c);
}

/*
 * smtp_io_update_events
 *		Note what c waits for now, for the wait set to learn.
 */
void
smtp_io_update_events(SmtpConn *c)
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
		c->events_changed = true;
	}
}

/*
 * smtp_io_close
 *		Close c's TLS and socket.
 */
void
smtp_io_close(SmtpConn *c)
{
	if (c->ssl != NULL)
	{
		SSL_free(c->ssl);
		c->ssl = NULL;
	}
	if (c->sock != PGINVALID_SOCKET)
		close(c->sock);
	c->sock = PGINVALID_SOCKET;
	c->sock_changed = true;
}

/*
 * smtp_io_peer_loopback
 *		Whether c is connected to a loopback address (127.0.0.0/8, ::1, or
 *		127.0.0.0/8 mapped into IPv6): judged by the address connected to,
 *		never by the relay's name, which anyone's DNS may point anywhere.
 */
bool
smtp_io_peer_loopback(SmtpConn *c)
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
 * smtp_io_local_literal
 *		The address literal of c's own end, for EHLO: "[192.0.2.1]",
 *		"[IPv6:2001:db8::1]", or "[127.0.0.1]" when it cannot be known.
 */
char *
smtp_io_local_literal(SmtpConn *c)
{
	struct sockaddr_storage ss;
	socklen_t	len = sizeof(ss);
	char		addr[INET6_ADDRSTRLEN];

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
 * tls_error
 *		OpenSSL's reason for a failure, after what.
 */
static void
tls_error(const char *what, char *buf, size_t len)
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
