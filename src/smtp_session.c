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
 * Transactions, once the session is ready, are smtp_txn.c's: this file
 * reads the replies and hands a ready session's to it.
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
 * smtp_relay.c only, which calls the entry points here and acts on what
 * each returns (SmtpStep: go on, the session became ready, close the
 * connection, or the session failed, c->failure saying why); the
 * deliveries a step decided or gives back wait on the connection for it
 * (smtp_chat.c).  Nothing here calls up into the relay.
 *
 * IDENTIFICATION
 *		src/smtp_session.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "smtp_session.h"

#include "common/base64.h"
#include "smtp_chat.h"
#include "smtp_io.h"
#include "smtp_txn.h"

static SmtpStep step_result(SmtpConn *c);
static void session_fail(SmtpConn *c, const char *fmt,...) pg_attribute_printf(2, 3);
static void session_lost(SmtpConn *c, bool relay_ended, const char *error);
static void session_close(SmtpConn *c);
static bool io_done(SmtpConn *c, int result, const char *err);
static void conn_tls_start(SmtpConn *c);
static void conn_tls_handshake(SmtpConn *c);
static void conn_timed_out(SmtpConn *c);
static void conn_requeue_txns(SmtpConn *c);
static bool conn_consume(SmtpConn *c);
static void conn_reply(SmtpConn *c, int code, const char *line, bool last);
static void conn_session_reply(SmtpConn *c, int code);
static void conn_after_ehlo(SmtpConn *c);
static void conn_auth(SmtpConn *c, int code);
static void conn_become_ready(SmtpConn *c);
static char *helo_for(SmtpConn *c);
static void sanitize(char *dst, size_t dstlen, const char *src, size_t srclen);

/*
 * step_result
 *		What the step just taken on c asks of its relay; the next step
 *		starts afresh.
 */
static SmtpStep
step_result(SmtpConn *c)
{
	SmtpStep	step = c->step;

	c->step = SMTP_STEP_GOING;
	return step;
}

/*
 * session_close
 *		The session on c is over: its relay closes it.
 */
static void
session_close(SmtpConn *c)
{
	c->step = SMTP_STEP_CLOSE;
}

/*
 * smtp_session_connected
 *		The connection attempt of c made progress: see how.
 */
SmtpStep
smtp_session_connected(SmtpConn *c)
{
	char		err[256];

	if (!io_done(c, smtp_io_connect_result(c, err, sizeof(err)), err))
		return step_result(c);
	smtp_io_progress(c);
	if (c->relay->cfg.smtps)
		conn_tls_start(c);
	else
	{
		c->state = CS_GREETING;
		smtp_io_update_events(c);
	}
	return step_result(c);
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
		session_fail(c, "%s", err);
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
		session_fail(c, "%s", err);
		return;
	}
	c->state = CS_TLS;
	smtp_io_progress(c);
	conn_tls_handshake(c);
}

/*
 * smtp_session_tls_progress
 *		Go on with the TLS handshake of c.
 */
SmtpStep
smtp_session_tls_progress(SmtpConn *c)
{
	conn_tls_handshake(c);
	return step_result(c);
}

/*
 * conn_tls_handshake
 *		Go on with the TLS handshake of c; once TLS is on, the greeting
 *		(smtps) or a new EHLO (STARTTLS) follows.
 */
static void
conn_tls_handshake(SmtpConn *c)
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
		smtp_chat_send(c, "EHLO %s\r\n", helo);
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
SmtpStep
smtp_session_check_time(SmtpConn *c, TimestampTz now)
{
	if (c->state == CS_CLOSED)
		return SMTP_STEP_GOING;
	smtp_io_settle_timer(c, now);
	if (c->state == CS_QUIT)
	{
		if (now >= c->deadline)
			session_close(c);
	}
	else if (c->output_lost && now >= c->deadline)
		session_lost(c, false, c->output_error);
	else if ((c->nexpect > 0 || c->state != CS_READY) && now >= c->deadline)
		conn_timed_out(c);
	else if (c->state == CS_READY && c->ntxns == 0 && c->nexpect == 0 &&
			 (c->retire ||
			  now >= TimestampTzPlusMilliseconds(c->idle_since, SMTP_IDLE_QUIT_MS)))
	{
		smtp_chat_send(c, "QUIT\r\n");
		c->state = CS_QUIT;
		smtp_io_set_deadline(c, now, SMTP_QUIT_WAIT_MS);
		smtp_io_flush(c);
	}
	return step_result(c);
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
		session_fail(c, "%s", error);
		return;
	}
	if (c->nexpect > 0 && c->expect[c->exphead].behind)
		smtp_txn_distrust(c, "did not answer commands pipelined behind a final \".\"");
	dlist_foreach_modify(miter, &c->txns)
	{
		GatekeeperDelivery *d = dlist_container(GatekeeperDelivery, queue_node, miter.cur);

		if (d->txn->stage == ST_NONE)
			continue;
		smtp_chat_take(c, d);
		smtp_chat_finish(c, d, GATEKEEPER_RETRY, 0, "relay %s: %s%s%s", c->relay->cfg.peer, error,
				   c->reply.text[0] ? "; last reply: " : "", c->reply.text);
	}
	conn_requeue_txns(c);
	session_close(c);
}

/*
 * session_lost
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
 * refused session (session_fail), the relay's fault, and the worker
 * backs off.
 */
static void
session_lost(SmtpConn *c, bool relay_ended, const char *error)
{
	dlist_mutable_iter miter;

	if (c->state == CS_QUIT)
	{
		session_close(c);
		return;
	}
	dlist_foreach_modify(miter, &c->txns)
	{
		GatekeeperDelivery *d = dlist_container(GatekeeperDelivery, queue_node, miter.cur);

		if (d->txn->stage == ST_NONE ||
			(d->outcome == GATEKEEPER_PENDING && (relay_ended || d->txn->replies == 0)))
			continue;			/* not taken: requeued below */
		smtp_chat_take(c, d);
		smtp_chat_finish(c, d, GATEKEEPER_RETRY, 0, "relay %s: %s%s%s", c->relay->cfg.peer, error,
				   c->reply.text[0] ? "; last reply: " : "", c->reply.text);
	}
	if (c->state < CS_READY || (!c->reused && c->ntxns > 0))
		session_fail(c, "%s", error);
	else
	{
		conn_requeue_txns(c);
		session_close(c);
	}
}

/*
 * conn_requeue_txns
 *		Give every transaction left on c back, for its relay to put at the
 *		head of its backlog, in their order, as if never sent.
 */
static void
conn_requeue_txns(SmtpConn *c)
{
	while (!dlist_is_empty(&c->txns))
	{
		GatekeeperDelivery *d = dlist_tail_element(GatekeeperDelivery, queue_node,
												   &c->txns);

		smtp_chat_take(c, d);
		smtp_chat_give_back(c, d);
	}
	c->data_wait = NULL;
}

/*
 * session_fail
 *		A session could not be opened on c, or ended before the relay
 *		answered a transaction.  The transactions still on c are given back,
 *		and the relay's connections decide what becomes of them
 *		(smtp_relay.c, on SMTP_STEP_FAILED with c->failure).
 */
static void
session_fail(SmtpConn *c, const char *fmt,...)
{
	char		msg[256];
	va_list		ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	snprintf(c->failure, sizeof(c->failure), "relay %s: %s", c->relay->cfg.peer, msg);

	conn_requeue_txns(c);
	c->step = SMTP_STEP_FAILED;
}

/*
 * smtp_session_readable
 *		Read what has arrived on c, a buffer at a time, and act on every
 *		complete reply line; at the end of the input, give c up.
 */
SmtpStep
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
			session_lost(c, false, err);
			return step_result(c);
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
			return step_result(c);
		/* after STARTTLS's 220 the socket belongs to the handshake */
		if (c->state == CS_TLS)
			return step_result(c);
		if (drained)
			break;
	}

	if (eof)
	{
		session_lost(c, false, c->output_lost ? c->output_error :
					 "connection closed by the relay");
		return step_result(c);
	}
	smtp_io_flush(c);
	return step_result(c);
}

/*
 * conn_consume
 *		Act on the complete reply lines in c's input.  Returns false when
 *		c's session ended meanwhile.  A line over SMTP_LINE_MAX octets, a reply
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
			session_lost(c, true, "relay sent a reply line longer than 512 octets");
			return false;
		}
		len = nl - start;
		c->in_pos += len + 1;
		c->reply_octets += len + 1;
		if (c->reply_octets > SMTP_REPLY_OCTETS_MAX)
		{
			session_lost(c, true, "relay sent a reply longer than 65536 octets");
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
			session_lost(c, true, err);
			return false;
		}
		conn_reply(c, code, line, last);
		if (c->step >= SMTP_STEP_CLOSE)
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
	/* the reply's code and status are its first line's (RFC 2034) */
	if (c->reply_lines == 0)
		(void) smtp_reply_parse(&c->reading, line);
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
		snprintf(c->reading.text, sizeof(c->reading.text), "%.*s(reply to AUTH)", (int) n, line);
	}
	else
		strlcpy(c->reading.text, line, sizeof(c->reading.text));
	c->reply = c->reading;
	c->reply_lines = 0;
	smtp_io_progress(c);

	if (c->state == CS_READY)
	{
		char		lost[SMTP_REPLY_MAX + 64];

		if (!smtp_txn_reply(c, lost, sizeof(lost)))
			session_lost(c, true, lost);
	}
	else
		conn_session_reply(c, c->reply.code);
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
				session_fail(c, "greeting refused the session: %s", c->reply.text);
				return;
			}
			{
				char	   *helo = helo_for(c);

				c->state = CS_EHLO;
				smtp_chat_send(c, "EHLO %s\r\n", helo);
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
				smtp_chat_send(c, "HELO %s\r\n", helo);
				pfree(helo);
			}
			else
				session_fail(c, "EHLO refused: %s", c->reply.text);
			break;
		case CS_HELO:
			if (code / 100 != 2)
				session_fail(c, "HELO refused: %s", c->reply.text);
			else
				conn_after_ehlo(c);
			break;
		case CS_STARTTLS:
			if (code != 220)
				session_fail(c, "STARTTLS refused: %s", c->reply.text);
			else if (c->in_len > c->in_pos)
				session_fail(c, "relay sent more than its reply to STARTTLS");
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
			session_close(c);
			break;
		default:
			session_fail(c, "unexpected reply: %s", c->reply.text);
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
		smtp_chat_send(c, "STARTTLS\r\n");
		return;
	}
	if (!c->tls && credentials && !smtp_io_peer_loopback(c))
	{
		session_fail(c, "the relay does not offer STARTTLS, which is required "
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
		session_fail(c, "login refused: %s", c->reply.text);
		return;
	}

	if (c->auth_plain)
	{
		if (c->auth_step > 0)
		{
			session_fail(c, "login refused: %s", c->reply.text);
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
			smtp_chat_send(c, "AUTH LOGIN\r\n");
			return;
		}
		if (c->auth_step > 2)
		{
			session_fail(c, "login refused: %s", c->reply.text);
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
		smtp_chat_send(c, "AUTH PLAIN %s\r\n", enc);
	else
		smtp_chat_send(c, "%s\r\n", enc);
	c->auth_step++;
	explicit_bzero(enc, enclen);
	pfree(enc);
}

/*
 * conn_become_ready
 *		The session is open: transactions may flow (the relay hands it
 *		some, on SMTP_STEP_READY).
 */
static void
conn_become_ready(SmtpConn *c)
{
	c->state = CS_READY;
	c->idle_since = GetCurrentTimestamp();
	c->last_ok = true;
	c->step = SMTP_STEP_READY;
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
