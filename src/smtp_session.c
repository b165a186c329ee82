/*-------------------------------------------------------------------------
 *
 * smtp_session.c
 *		The SMTP session machine: one state machine per relay connection,
 *		fed whatever replies have arrived, never waiting for one.
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
 * 354, and the next transaction's "MAIL, RCPT, DATA" go in the same write,
 * behind the final "." (RFC 2920 allows a message's content to begin a
 * group), so that a mail costs one round trip, not two; without
 * PIPELINING, one command at a time.  A transaction that follows another
 * whose success is not known yet starts with RSET, so that whatever the
 * one before left open (a MAIL accepted before a refused RCPT, say) can
 * never lend its envelope to the next; behind a final "." there is nothing
 * open (the "." ends the transaction, whatever its reply), and in
 * lock-step RSET follows only a failed transaction.
 *
 * Behind a final ".": the reply to the "." is what decides a mail sent, so
 * the client makes sure it reads the right one.  Commands go behind a "."
 * only to a relay that offers ENHANCEDSTATUSCODES (RFC 2034), whose
 * replies to MAIL FROM and RCPT TO carry an address status (X.1.Y, RFC
 * 3463) and whose reply to DATA is 354.  RFC 2920 has replies come in the
 * order of the commands; smtp-sink -W, for one, answers the "." after the
 * commands behind it.  So where the "."'s reply is due, a 354 or a success
 * with an address status is not taken for it: the replies still due are
 * gathered first (conn_sort_reply).  When they read as answers in order
 * (no 354 but to DATA, DATA's a 354 or a refusal), the first is the
 * "."'s after all; else the one that can only be the "."'s (neither 354
 * nor an address status) decides the mail, and when none or several can,
 * the mail is RETRY.  Either way the connection is closed (the next
 * transaction's message never went, so it goes again, uncharged), and
 * nothing goes behind a "." to that relay again.  A 354 to MAIL or RCPT,
 * or a success to DATA, behind a ".", is the same misorder found later: the
 * relay is not trusted again, and the transaction goes again; so is a DATA
 * behind a "." never answered.
 *
 * Outcomes: 2xx to the data is SENT; 5xx to MAIL FROM, RCPT TO, DATA or the
 * data is FAIL (mail_refused when it was MAIL FROM: the worker decides
 * whether that is the mail's fault or the relay's); 4xx, a reply that does
 * not come within gatekeeper.smtp_timeout, or a connection that breaks
 * after the relay began to answer a transaction and before its last reply
 * is RETRY.  A mail larger than the relay's SIZE fails before a byte of it
 * is sent.  When a session cannot be opened (no connection, a refused
 * greeting, EHLO, STARTTLS or AUTH, a certificate that does not verify),
 * the relay's connections decide what becomes of the mail waiting
 * (smtp_relay_conn_failed).
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
 * A connection with nothing to do for a few seconds is closed with QUIT.
 * Every error names the relay, and no error holds the password.  Bytes go
 * through smtp_io.c; connections are opened, closed and freed by
 * smtp_relay.c only.
 *
 * IDENTIFICATION
 *		src/smtp_session.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "smtp_session.h"

#include "common/base64.h"
#include "smtp_io.h"
#include "smtp_relay.h"

static bool io_done(SmtpConn *c, int result, const char *err);
static void conn_tls_start(SmtpConn *c);
static void conn_timed_out(SmtpConn *c);
static void conn_lost(SmtpConn *c, bool relay_ended, const char *error);
static void conn_requeue_txns(SmtpConn *c);
static bool conn_consume(SmtpConn *c);
static void conn_reply(SmtpConn *c, int code, const char *line, bool last);
static void conn_session_reply(SmtpConn *c, int code);
static void conn_ready_reply(SmtpConn *c, int code);
static void conn_after_ehlo(SmtpConn *c);
static void conn_auth(SmtpConn *c, int code);
static void conn_become_ready(SmtpConn *c);
static void conn_write_txn(SmtpConn *c, GatekeeperDelivery *d);
static void conn_lockstep_next(SmtpConn *c, GatekeeperDelivery *d);
static void conn_write_message(SmtpConn *c, GatekeeperDelivery *d);
static void conn_txn_done(SmtpConn *c, GatekeeperDelivery *d);
static void conn_take(SmtpConn *c, GatekeeperDelivery *d);
static void conn_send(SmtpConn *c, const char *fmt,...) pg_attribute_printf(2, 3);
static void conn_expect(SmtpConn *c, SmtpCommand command, GatekeeperDelivery *d);
static void txn_fail(SmtpConn *c, GatekeeperDelivery *d, int code, const char *what);
static bool conn_may_follow_dot(SmtpConn *c);
static int	reply_subject(SmtpConn *c);
static void relay_misorders(SmtpConn *c, const char *what);
static void conn_misordered(SmtpConn *c, GatekeeperDelivery *d);
static void conn_sort_reply(SmtpConn *c, int code, bool first);
static char *envelope_address(const char *address);
static void append_dsn_notify(StringInfo buf, SmtpConn *c, GatekeeperDelivery *d);
static char *helo_for(SmtpConn *c);
static void sanitize(char *dst, size_t dstlen, const char *src, size_t srclen);

/*
 * smtp_session_connected
 *		The connection attempt of c made progress: see how.
 */
void
smtp_session_connected(SmtpConn *c)
{
	char		err[256];

	if (!io_done(c, smtp_io_connect_result(c, err, sizeof(err)), err))
		return;
	smtp_io_progress(c);
	if (c->relay->cfg.smtps)
		conn_tls_start(c);
	else
	{
		c->state = CS_GREETING;
		smtp_io_update_events(c);
	}
}

/*
 * io_done
 *		Whether a step of smtp_io.c that may wait is done; when it failed,
 *		so did the session, with err.
 */
static bool
io_done(SmtpConn *c, int result, const char *err)
{
	if (result == SMTP_IO_FAILED)
		smtp_session_failed(c, "%s", err);
	return result == SMTP_IO_DONE;
}

/*
 * conn_tls_start
 *		Begin TLS on c: smtps, or after STARTTLS's 220.
 */
static void
conn_tls_start(SmtpConn *c)
{
	char		err[256];

	if (!smtp_io_tls_start(c, err, sizeof(err)))
	{
		smtp_session_failed(c, "%s", err);
		return;
	}
	c->state = CS_TLS;
	smtp_io_progress(c);
	smtp_session_tls_progress(c);
}

/*
 * smtp_session_tls_progress
 *		Go on with the TLS handshake of c; once TLS is on, the greeting
 *		(smtps) or a new EHLO (STARTTLS) follows.
 */
void
smtp_session_tls_progress(SmtpConn *c)
{
	char		err[256];

	if (!io_done(c, smtp_io_tls_handshake(c, err, sizeof(err)), err))
		return;
	if (!c->after_starttls)
		c->state = CS_GREETING;
	else
	{
		char	   *helo = helo_for(c);

		/* after STARTTLS, what EHLO said before is forgotten */
		c->pipelining = c->chunking = c->eightbit = c->smtputf8 = c->dsn = false;
		c->enhanced = false;
		c->starttls = c->auth_plain = c->auth_login = false;
		c->size = false;
		c->size_limit = 0;
		c->state = CS_EHLO;
		conn_send(c, "EHLO %s\r\n", helo);
		pfree(helo);
		smtp_io_flush(c);
		return;
	}
	smtp_io_update_events(c);
}

/*
 * smtp_session_deadline
 *		When c must hear from the relay, or give up, or say QUIT for being
 *		idle; 0 for never.
 */
TimestampTz
smtp_session_deadline(SmtpConn *c, TimestampTz now)
{
	smtp_io_settle_timer(c, now);
	if (c->nexpect > 0 || c->state != CS_READY || c->output_lost)
		return c->deadline;
	if (c->ntxns == 0)
		return c->retire ? now :
			TimestampTzPlusMilliseconds(c->idle_since, SMTP_IDLE_QUIT_MS);
	return 0;
}

/*
 * smtp_session_check_time
 *		Act on what time did to c: a late reply, a connection whose writing
 *		broke and whose reading never found the end, a QUIT unanswered, an
 *		idle connection (QUIT).
 */
void
smtp_session_check_time(SmtpConn *c, TimestampTz now)
{
	if (c->state == CS_CLOSED)
		return;
	smtp_io_settle_timer(c, now);
	if (c->state == CS_QUIT)
	{
		if (now >= c->deadline)
			smtp_relay_close_conn(c);
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
		smtp_io_set_deadline(c, now, SMTP_QUIT_WAIT_MS);
		c->relay->nready--;
		smtp_io_flush(c);
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
			 c->relay->cfg.timeout);
	if (c->state < CS_READY)
	{
		smtp_session_failed(c, "%s", error);
		return;
	}
	if (c->nexpect > 0 && c->expect[c->exphead].behind)
		relay_misorders(c, "did not answer commands pipelined behind a final \".\"");
	dlist_foreach_modify(miter, &c->txns)
	{
		GatekeeperDelivery *d = dlist_container(GatekeeperDelivery, queue_node, miter.cur);

		if (d->txn->stage == ST_NONE)
			continue;
		conn_take(c, d);
		smtp_relay_finish(c->relay, d, GATEKEEPER_RETRY, 0, "relay %s: %s%s%s", c->relay->cfg.peer, error,
				   c->reply[0] ? "; last reply: " : "", c->reply);
	}
	conn_requeue_txns(c);
	smtp_relay_close_conn(c);
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
		smtp_relay_close_conn(c);
		return;
	}
	dlist_foreach_modify(miter, &c->txns)
	{
		GatekeeperDelivery *d = dlist_container(GatekeeperDelivery, queue_node, miter.cur);

		if (d->txn->stage == ST_NONE ||
			(d->outcome == GATEKEEPER_PENDING && (relay_ended || d->txn->replies == 0)))
			continue;			/* not taken: requeued below */
		conn_take(c, d);
		smtp_relay_finish(c->relay, d, GATEKEEPER_RETRY, 0, "relay %s: %s%s%s", c->relay->cfg.peer, error,
				   c->reply[0] ? "; last reply: " : "", c->reply);
	}
	if (c->state < CS_READY || (!c->reused && c->ntxns > 0))
		smtp_session_failed(c, "%s", error);
	else
	{
		conn_requeue_txns(c);
		smtp_relay_close_conn(c);
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

		conn_take(c, d);
		smtp_relay_requeue(c->relay, d);
	}
	c->data_wait = NULL;
}

/*
 * smtp_session_failed
 *		A session could not be opened on c, or ended before the relay
 *		answered a transaction.  The transactions still on c go back to the
 *		backlog, and the relay's connections decide what becomes of them
 *		(smtp_relay_conn_failed).
 */
void
smtp_session_failed(SmtpConn *c, const char *fmt,...)
{
	char		msg[256];
	char		error[300];
	va_list		ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	snprintf(error, sizeof(error), "relay %s: %s", c->relay->cfg.peer, msg);

	conn_requeue_txns(c);
	smtp_relay_conn_failed(c, error);
}

/*
 * smtp_session_readable
 *		Read what has arrived on c, a buffer at a time, and act on every
 *		complete reply line; at the end of the input, give c up.
 */
void
smtp_session_readable(SmtpConn *c)
{
	bool		eof = false;
	char		err[256];

	for (;;)
	{
		ssize_t		n;
		size_t		room;
		bool		drained;

		/* what was consumed makes room; a partial line stays */
		if (c->in_pos > 0)
		{
			memmove(c->in, c->in + c->in_pos, c->in_len - c->in_pos);
			c->in_len -= c->in_pos;
			c->in_pos = 0;
		}
		Assert(c->in_len < SMTP_LINE_MAX);
		err[0] = '\0';
		room = SMTP_INPUT_SIZE - c->in_len;
		n = smtp_io_read(c, c->in + c->in_len, room, &eof, err, sizeof(err));
		if (n < 0)
		{
			conn_lost(c, false, err);
			return;
		}
		if (n == 0)
			break;

		/*
		 * A plain socket that gave less than asked for is empty for now:
		 * the wait reports it again when more (or the end) comes, so the
		 * read that would only say EAGAIN is saved.  TLS reads a record at
		 * a time, and its buffer may hold more: it reads on.
		 */
		drained = (size_t) n < room && !(c->ssl != NULL && c->tls);
		c->in_len += n;
		if (!conn_consume(c))
			return;
		/* after STARTTLS's 220 the socket belongs to the handshake */
		if (c->state == CS_TLS)
			return;
		if (drained)
			break;
	}

	if (eof)
	{
		conn_lost(c, false, c->output_lost ? c->output_error :
				  "connection closed by the relay");
		return;
	}
	smtp_io_flush(c);
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
		else if (pg_strncasecmp(kw, "ENHANCEDSTATUSCODES", 19) == 0)
			c->enhanced = true;
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
	smtp_io_progress(c);

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
				smtp_session_failed(c, "greeting refused the session: %s", c->reply);
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
				smtp_session_failed(c, "EHLO refused: %s", c->reply);
			break;
		case CS_HELO:
			if (code / 100 != 2)
				smtp_session_failed(c, "HELO refused: %s", c->reply);
			else
				conn_after_ehlo(c);
			break;
		case CS_STARTTLS:
			if (code != 220)
				smtp_session_failed(c, "STARTTLS refused: %s", c->reply);
			else if (c->in_len > c->in_pos)
				smtp_session_failed(c, "relay sent more than its reply to STARTTLS");
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
			smtp_relay_close_conn(c);
			break;
		default:
			smtp_session_failed(c, "unexpected reply: %s", c->reply);
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
	bool		credentials = c->relay->cfg.user[0] != '\0';

	if (!c->tls && c->starttls)
	{
		c->state = CS_STARTTLS;
		conn_send(c, "STARTTLS\r\n");
		return;
	}
	if (!c->tls && credentials && !smtp_io_peer_loopback(c))
	{
		smtp_session_failed(c, "the relay does not offer STARTTLS, which is required "
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
 * conn_auth
 *		AUTH PLAIN (initial response) or LOGIN, step by step.  code is the
 *		reply to the last step, 0 to begin.
 */
static void
conn_auth(SmtpConn *c, int code)
{
	const char *user = c->relay->cfg.user;
	const char *password = c->relay->cfg.password;
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
		smtp_session_failed(c, "login refused: %s", c->reply);
		return;
	}

	if (c->auth_plain)
	{
		if (c->auth_step > 0)
		{
			smtp_session_failed(c, "login refused: %s", c->reply);
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
			smtp_session_failed(c, "login refused: %s", c->reply);
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
	c->relay->nready++;
	smtp_relay_dispatch(c->relay);
}

/*
 * smtp_session_start_txns
 *		Write the transactions queued on c that may be written now.
 */
void
smtp_session_start_txns(SmtpConn *c)
{
	while (c->state == CS_READY && !c->output_lost)
	{
		dlist_iter	iter;
		GatekeeperDelivery *next = NULL;

		dlist_foreach(iter, &c->txns)
		{
			GatekeeperDelivery *d = dlist_container(GatekeeperDelivery, queue_node, iter.cur);

			if (d->txn->stage == ST_NONE)
			{
				next = d;
				break;
			}
		}
		if (next == NULL)
			break;
		/*
		 * With BDAT a transaction follows one whose replies are still due;
		 * with DATA it follows only a final "." (conn_may_follow_dot); in
		 * lock-step it waits for every reply.
		 */
		if (c->nexpect > 0 && !(c->pipelining && c->chunking) && !conn_may_follow_dot(c))
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
	smtp_io_flush(c);
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
		conn_take(c, d);
		smtp_relay_finish(c->relay, d, GATEKEEPER_FAIL, 552,
				   "relay %s: message of %d octets exceeds the relay's SIZE limit of "
				   UINT64_FORMAT " octets; not sent", c->relay->cfg.peer, d->message.len, c->size_limit);
		pfree(from);
		pfree(rcpt);
		return;
	}
	if ((d->needs_8bit && !c->eightbit) || (d->needs_utf8 && !c->smtputf8))
	{
		conn_take(c, d);
		smtp_relay_finish(c->relay, d, GATEKEEPER_FAIL, 0, "relay %s does not offer %s, which this mail needs; not sent",
				   c->relay->cfg.peer, d->needs_utf8 && !c->smtputf8 ? "SMTPUTF8" : "8BITMIME");
		pfree(from);
		pfree(rcpt);
		return;
	}

	old = MemoryContextSwitchTo(c->cxt);
	initStringInfo(&cmd);
	MemoryContextSwitchTo(old);
	/* with DATA, what is still due is a final ".": this goes behind it */
	c->writing_behind = c->nexpect > 0 && !c->chunking;
	if (c->pipelining && !c->last_ok && !c->writing_behind)
	{
		appendStringInfoString(&cmd, "RSET\r\n");
		conn_expect(c, CMD_RSET, NULL);
	}
	c->need_rset = false;
	appendStringInfoString(&cmd, "MAIL FROM:");
	appendStringInfoString(&cmd, from);
	if (c->size)
		appendStringInfo(&cmd, " SIZE=%d", d->message.len);
	if (d->needs_8bit)
		appendStringInfoString(&cmd, " BODY=8BITMIME");
	if (d->needs_utf8)
		appendStringInfoString(&cmd, " SMTPUTF8");
	if (c->dsn && d->envid != NULL)
	{
		appendStringInfoString(&cmd, " RET=HDRS ENVID=");
		appendStringInfoString(&cmd, d->envid);
	}
	appendStringInfoString(&cmd, "\r\n");
	conn_expect(c, CMD_MAIL, d);
	c->last_ok = false;

	if (c->pipelining)
	{
		appendStringInfoString(&cmd, "RCPT TO:");
		appendStringInfoString(&cmd, rcpt);
		append_dsn_notify(&cmd, c, d);
		appendStringInfoString(&cmd, "\r\n");
		conn_expect(c, CMD_RCPT, d);
		if (c->chunking)
		{
			appendStringInfo(&cmd, "BDAT %d LAST\r\n", d->message.len);
			conn_expect(c, CMD_BDAT, d);
			smtp_io_push(c, cmd.data, cmd.len, cmd.data);
			smtp_io_push(c, d->message.data, d->message.len, NULL);
			d->txn->stage = ST_BODY;
		}
		else
		{
			appendStringInfoString(&cmd, "DATA\r\n");
			conn_expect(c, CMD_DATA, d);
			smtp_io_push(c, cmd.data, cmd.len, cmd.data);
			c->data_wait = d;
			d->txn->stage = ST_DATA;
		}
		c->writing_behind = false;
	}
	else
	{
		smtp_io_push(c, cmd.data, cmd.len, cmd.data);
		d->txn->stage = ST_MAIL;
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
	if (d->txn->stage == ST_MAIL)
	{
		char	   *rcpt = envelope_address(d->mail.recipient);
		StringInfoData notify;

		initStringInfo(&notify);
		append_dsn_notify(&notify, c, d);
		conn_send(c, "RCPT TO:%s%s\r\n", rcpt, notify.data);
		conn_expect(c, CMD_RCPT, d);
		pfree(notify.data);
		pfree(rcpt);
		d->txn->stage = ST_RCPT;
	}
	else if (d->txn->stage == ST_RCPT)
	{
		conn_send(c, "DATA\r\n");
		conn_expect(c, CMD_DATA, d);
		c->data_wait = d;
		d->txn->stage = ST_DATA;
	}
}

/*
 * conn_write_message
 *		After 354: the message, dot-stuffed, and the final ".".
 */
static void
conn_write_message(SmtpConn *c, GatekeeperDelivery *d)
{
	smtp_io_push_stuffed(c, d->message.data, d->message.len);
	conn_expect(c, CMD_DOT, d);
	d->txn->stage = ST_BODY;
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

	if (c->sort_d != NULL)
	{
		conn_sort_reply(c, code, false);
		return;
	}
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
		d->txn->replies++;

	/* what cannot answer the command it is due for: out of order */
	if (e.behind &&
		((code == 354 && e.command != CMD_DATA) || (ok && e.command == CMD_DATA)))
	{
		relay_misorders(c, "answered out of order behind a final \".\"");
		conn_misordered(c, d);
		return;
	}

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
					d->txn->stage = ST_BODY;
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
			if (c->nexpect > 0 && c->expect[c->exphead].behind &&
				(code == 354 || (ok && reply_subject(c) == 1)))
			{
				/* it may answer a command behind the ".": see them all */
				c->sort_d = d;
				c->sort_in_order = code != 354;
				c->sort_first_code = code;
				strlcpy(c->sort_first, c->reply, sizeof(c->sort_first));
				c->sort_found = 0;
				conn_sort_reply(c, code, true);
				return;
			}
			/* FALLTHROUGH */
		case CMD_BDAT:
			if (!ok)
				txn_fail(c, d, code, e.command == CMD_DOT ? "the message" : "BDAT");
			conn_txn_done(c, d);
			break;
	}
	smtp_session_start_txns(c);
}

/*
 * conn_txn_done
 *		d's last reply arrived: hand it back.
 */
static void
conn_txn_done(SmtpConn *c, GatekeeperDelivery *d)
{
	if (d->txn->stage == ST_DONE)
		return;
	d->txn->stage = ST_DONE;
	conn_take(c, d);
	c->reused = true;
	if (d->outcome == GATEKEEPER_PENDING)
	{
		c->last_ok = c->nexpect == 0;
		smtp_relay_finish(c->relay, d, GATEKEEPER_SENT, 250, "%s", "");
	}
	else
	{
		c->last_ok = false;
		c->need_rset = true;
		dlist_push_tail(&c->relay->done, &d->queue_node);
	}
	if (c->ntxns == 0)
		c->idle_since = GetCurrentTimestamp();
}

/*
 * conn_take
 *		Take d off c's transactions: its outcome is decided, or it goes back.
 */
static void
conn_take(SmtpConn *c, GatekeeperDelivery *d)
{
	dlist_delete(&d->queue_node);
	c->ntxns--;
	c->relay->ntxns--;
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
				 c->reply, c->relay->cfg.peer);
	else
		snprintf(d->error, sizeof(d->error), "relay %s refused %s: %s", c->relay->cfg.peer, what, c->reply);
}

/*
 * conn_may_follow_dot
 *		Whether the next transaction may be written behind what c waits
 *		for: a final "." and nothing after it, to a relay trusted with it.
 */
static bool
conn_may_follow_dot(SmtpConn *c)
{
	return smtp_session_behind_dot(c) && c->sort_d == NULL && c->data_wait == NULL &&
		c->nexpect > 0 &&
		c->expect[(c->exphead + c->nexpect - 1) % c->expcap].command == CMD_DOT;
}

/*
 * smtp_session_behind_dot
 *		Whether c's relay gets transactions behind a final ".": it offers
 *		PIPELINING and ENHANCEDSTATUSCODES and not CHUNKING (which needs no
 *		"."), and never answered out of order.
 */
bool
smtp_session_behind_dot(const SmtpConn *c)
{
	return c->pipelining && !c->chunking && c->enhanced && !c->relay->misorders;
}

/*
 * reply_subject
 *		The subject of the enhanced status code (RFC 3463) of c's last
 *		reply, "2.1.5" -> 1, or -1 when it has none.
 */
static int
reply_subject(SmtpConn *c)
{
	const char *p = c->reply + 4;
	int			subject = 0;

	if (!c->enhanced || strlen(c->reply) < 4 || !isdigit((unsigned char) p[0]) || p[1] != '.')
		return -1;
	p += 2;
	if (!isdigit((unsigned char) *p))
		return -1;
	while (isdigit((unsigned char) *p) && subject < 1000)
		subject = subject * 10 + (*p++ - '0');
	if (*p != '.' || !isdigit((unsigned char) p[1]))
		return -1;
	return subject;
}

/*
 * relay_misorders
 *		c's relay did what (answered out of order, or not at all) with
 *		commands behind a final ".": none go behind one to it again, in this
 *		worker's life.
 */
static void
relay_misorders(SmtpConn *c, const char *what)
{
	if (c->relay->misorders)
		return;
	c->relay->misorders = true;
	ereport(LOG,
			(errmsg("relay %s %s; transactions no longer follow one before its reply",
					c->relay->cfg.peer, what)));
}

/*
 * conn_misordered
 *		A reply came that cannot answer the command of d, which was behind a
 *		final ".": the relay answers out of order.  d's message never went,
 *		so d goes again, uncharged, and c is given up.
 */
static void
conn_misordered(SmtpConn *c, GatekeeperDelivery *d)
{
	d->outcome = GATEKEEPER_PENDING;
	d->reply_code = 0;
	d->mail_refused = false;
	d->error[0] = '\0';
	d->txn->replies = 0;
	c->reused = true;
	conn_lost(c, true, "the relay answered out of order");
}

/*
 * conn_sort_reply
 *		A reply while c gathers what is due behind the final "." of
 *		sort_d's message; first for the reply that came where the "."'s was
 *		due, already taken off the ring.  Once all are in: read in order,
 *		the first is the "."'s; else the one reply that can only be the
 *		"."'s (neither 354 nor an address status, X.1.Y) is; else sort_d is
 *		RETRY.  Then c is given up: what was behind goes again, uncharged.
 */
static void
conn_sort_reply(SmtpConn *c, int code, bool first)
{
	GatekeeperDelivery *d = c->sort_d;
	const char *peer = c->relay->cfg.peer;
	int			dot_code = 0;
	const char *dot_reply = NULL;

	if (!first && (code == 421 || c->nexpect == 0))
	{
		/* the end, or a reply nobody asked for: nothing to go by */
		c->sort_in_order = false;
		c->sort_found = 0;
		c->nexpect = 0;
	}
	else
	{
		if (!first)
		{
			SmtpCommand command = c->expect[c->exphead].command;

			c->exphead = (c->exphead + 1) % c->expcap;
			c->nexpect--;
			if (command == CMD_DATA ? (code != 354 && code < 400) : code == 354)
				c->sort_in_order = false;
		}
		if (code != 354 && reply_subject(c) != 1)
		{
			c->sort_found++;
			c->sort_code = code;
			strlcpy(c->sort_reply, c->reply, sizeof(c->sort_reply));
		}
		if (c->nexpect > 0)
			return;
	}

	c->sort_d = NULL;
	if (c->sort_in_order)
	{
		relay_misorders(c, "answered a final \".\" as if it were MAIL FROM or RCPT TO");
		dot_code = c->sort_first_code;
		dot_reply = c->sort_first;
	}
	else
	{
		relay_misorders(c, "answered out of order behind a final \".\"");
		if (c->sort_found == 1)
		{
			dot_code = c->sort_code;
			dot_reply = c->sort_reply;
		}
	}
	if (dot_reply != NULL)
	{
		if (dot_code / 100 != 2)
		{
			strlcpy(c->reply, dot_reply, sizeof(c->reply));
			txn_fail(c, d, dot_code, "the message");
		}
		conn_txn_done(c, d);
	}
	else
	{
		conn_take(c, d);
		smtp_relay_finish(c->relay, d, GATEKEEPER_RETRY, 0,
						  "relay %s answered out of order behind the final \".\" of the message: "
						  "its reply is not known", peer);
	}
	c->reused = true;
	conn_lost(c, true, "the relay answered out of order");
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
	smtp_io_push(c, s, buf.len, s);
	if (c->state != CS_READY)
		smtp_io_progress(c);
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
		smtp_io_progress(c);
	c->expect[(c->exphead + c->nexpect) % c->expcap].command = command;
	c->expect[(c->exphead + c->nexpect) % c->expcap].d = d;
	c->expect[(c->exphead + c->nexpect) % c->expcap].behind = c->writing_behind;
	c->nexpect++;
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
	{
		size_t		len = end - start;
		char	   *path = palloc(len + 3);

		path[0] = '<';
		memcpy(path + 1, start, len);
		path[len + 1] = '>';
		path[len + 2] = '\0';
		return path;
	}
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
 * helo_for
 *		The name c says in EHLO: gatekeeper.helo_name, else the host's FQDN,
 *		else (no dot in it) the address literal of c's own end.
 */
static char *
helo_for(SmtpConn *c)
{
	const char *helo = c->relay->cfg.helo;
	const char *name = helo[0] != '\0' ? helo : smtp_config_fqdn();

	if (strchr(name, '.') != NULL || helo[0] != '\0')
		return pstrdup(name);
	return smtp_io_local_literal(c);
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
