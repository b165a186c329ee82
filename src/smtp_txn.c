/*-------------------------------------------------------------------------
 *
 * smtp_txn.c
 *		The transactions of a ready SMTP session: what is written for each
 *		mail, and what each reply to it decides.
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
 * (smtp_relay.c, relay_conn_failed).
 *
 * The session (smtp_session.c) reads the replies and hands each that
 * answers a transaction's command here (smtp_txn_reply), and owns what
 * becomes of the connection: smtp_txn_reply says when the session is
 * over, and why.  A delivery decided here is left on the connection
 * (smtp_chat_finish) for its relay to hand back; nothing here calls up.
 *
 * IDENTIFICATION
 *		src/smtp_txn.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "smtp_txn.h"

#include "smtp_chat.h"
#include "smtp_io.h"

static void conn_write_txn(SmtpConn *c, GatekeeperDelivery *d);
static void conn_lockstep_next(SmtpConn *c, GatekeeperDelivery *d);
static void conn_write_message(SmtpConn *c, GatekeeperDelivery *d);
static void conn_txn_done(SmtpConn *c, GatekeeperDelivery *d);
static void txn_fail(SmtpConn *c, GatekeeperDelivery *d, SmtpAnswer answered,
					 const char *what);
static bool conn_may_follow_dot(SmtpConn *c);
static int	reply_subject(SmtpConn *c);
static bool conn_misordered(SmtpConn *c, GatekeeperDelivery *d, char *lost, size_t lostlen);
static bool conn_sort_reply(SmtpConn *c, int code, bool first, char *lost, size_t lostlen);
static bool recipient_ascii(const char *address);
static char *envelope_address(const char *address);
static void append_dsn_notify(StringInfo buf, SmtpConn *c, GatekeeperDelivery *d);

/*
 * smtp_txn_start
 *		Write the transactions queued on c that may be written now.
 */
void
smtp_txn_start(SmtpConn *c)
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
			smtp_chat_send(c, "RSET\r\n");
			smtp_chat_expect(c, CMD_RSET, NULL);
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
		smtp_chat_take(c, d);
		smtp_chat_finish(c, d, GATEKEEPER_FAIL, 552,
				   "relay %s: message of %d octets exceeds the relay's SIZE limit of "
				   UINT64_FORMAT " octets; not sent", c->relay->cfg.peer, d->message.len, c->size_limit);
		pfree(from);
		pfree(rcpt);
		return;
	}
	if ((d->needs_8bit && !c->eightbit) || (d->needs_utf8 && !c->smtputf8))
	{
		smtp_chat_take(c, d);
		smtp_chat_finish(c, d, GATEKEEPER_FAIL, 0, "relay %s does not offer %s, which this mail needs; not sent",
				   c->relay->cfg.peer, d->needs_utf8 && !c->smtputf8 ? "SMTPUTF8" : "8BITMIME");
		pfree(from);
		pfree(rcpt);
		return;
	}

	old = MemoryContextSwitchTo(c->cxt);
	initStringInfo(&cmd);
	MemoryContextSwitchTo(old);
	/*
	 * With DATA, a reply still due is a final "."'s: this goes behind it,
	 * and needs no RSET (the "." ended the transaction)
	 */
	if (c->pipelining && !c->last_ok && !(c->nexpect > 0 && !c->chunking))
	{
		appendStringInfoString(&cmd, "RSET\r\n");
		smtp_chat_expect(c, CMD_RSET, NULL);
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
	smtp_chat_expect(c, CMD_MAIL, d);
	c->last_ok = false;

	if (c->pipelining)
	{
		appendStringInfoString(&cmd, "RCPT TO:");
		appendStringInfoString(&cmd, rcpt);
		append_dsn_notify(&cmd, c, d);
		appendStringInfoString(&cmd, "\r\n");
		smtp_chat_expect(c, CMD_RCPT, d);
		if (c->chunking)
		{
			appendStringInfo(&cmd, "BDAT %d LAST\r\n", d->message.len);
			smtp_chat_expect(c, CMD_BDAT, d);
			smtp_io_push(c, cmd.data, cmd.len, cmd.data);
			smtp_io_push(c, d->message.data, d->message.len, NULL);
			d->txn->stage = ST_BODY;
		}
		else
		{
			appendStringInfoString(&cmd, "DATA\r\n");
			smtp_chat_expect(c, CMD_DATA, d);
			smtp_io_push(c, cmd.data, cmd.len, cmd.data);
			c->data_wait = d;
			d->txn->stage = ST_DATA;
		}
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
		smtp_chat_send(c, "RCPT TO:%s%s\r\n", rcpt, notify.data);
		smtp_chat_expect(c, CMD_RCPT, d);
		pfree(notify.data);
		pfree(rcpt);
		d->txn->stage = ST_RCPT;
	}
	else if (d->txn->stage == ST_RCPT)
	{
		smtp_chat_send(c, "DATA\r\n");
		smtp_chat_expect(c, CMD_DATA, d);
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
	smtp_chat_expect(c, CMD_DOT, d);
	d->txn->stage = ST_BODY;
}

/*
 * smtp_txn_reply
 *		A reply to a transaction's command: c->reply.  Returns false when
 *		the session is over, the relay's doing (421, a reply nobody asked
 *		for, replies out of order): lost says why.
 */
bool
smtp_txn_reply(SmtpConn *c, char *lost, size_t lostlen)
{
	int			code = c->reply.code;
	SmtpExpect	e;
	GatekeeperDelivery *d;
	bool		ok = code / 100 == 2;

	if (c->sort_d != NULL)
		return conn_sort_reply(c, code, false, lost, lostlen);
	if (code == 421 || c->nexpect == 0)
	{
		/* 421 (RFC 5321 3.8), or a reply nobody asked for: the end */
		snprintf(lost, lostlen, "the relay ended the session: %s", c->reply.text);
		return false;
	}
	e = smtp_chat_expected(c);
	d = e.d;
	if (d != NULL)
		d->txn->replies++;

	/* what cannot answer the command it is due for: out of order */
	if (e.behind &&
		((code == 354 && e.command != CMD_DATA) || (ok && e.command == CMD_DATA)))
	{
		smtp_txn_distrust(c, "answered out of order behind a final \".\"");
		return conn_misordered(c, d, lost, lostlen);
	}

	switch (e.command)
	{
		case CMD_RSET:
			break;
		case CMD_MAIL:
			if (!ok)
			{
				txn_fail(c, d, SMTP_ANSWER_MAIL, "MAIL FROM");
				if (!c->pipelining)
					conn_txn_done(c, d);
			}
			else if (!c->pipelining)
				conn_lockstep_next(c, d);
			break;
		case CMD_RCPT:
			if (!ok)
			{
				txn_fail(c, d, SMTP_ANSWER_RCPT, "RCPT TO");
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
					smtp_chat_send(c, ".\r\n");
					smtp_chat_expect(c, CMD_DOT, d);
					d->txn->stage = ST_BODY;
				}
				else
					conn_write_message(c, d);
			}
			else
			{
				txn_fail(c, d, SMTP_ANSWER_DATA, "DATA");
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
				c->sort_first = c->reply;
				c->sort_found = 0;
				return conn_sort_reply(c, code, true, lost, lostlen);
			}
			/* FALLTHROUGH */
		case CMD_BDAT:
			if (!ok)
				txn_fail(c, d, SMTP_ANSWER_DATA, e.command == CMD_DOT ? "the message" : "BDAT");
			conn_txn_done(c, d);
			break;
	}
	smtp_txn_start(c);
	return true;
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
	smtp_chat_take(c, d);
	c->reused = true;
	if (d->outcome == GATEKEEPER_PENDING)
	{
		c->last_ok = c->nexpect == 0;
		smtp_chat_finish(c, d, GATEKEEPER_SENT, 250, "%s", "");
	}
	else
	{
		c->last_ok = false;
		c->need_rset = true;
		smtp_chat_decided(c, d);
	}
	if (c->ntxns == 0)
		c->idle_since = GetCurrentTimestamp();
}

/*
 * txn_fail
 *		d was refused by c's last reply, which answered its command what:
 *		the first refusal decides.  The reply goes with d as it was read,
 *		with what the classifier says of it (src/smtp_trouble.c: a hard
 *		bounce only when it answered RCPT TO); the error text is for
 *		people.
 */
static void
txn_fail(SmtpConn *c, GatekeeperDelivery *d, SmtpAnswer answered, const char *what)
{
	if (d->outcome != GATEKEEPER_PENDING)
		return;
	d->outcome = c->reply.code / 100 == 5 ? GATEKEEPER_FAIL : GATEKEEPER_RETRY;
	d->reply = c->reply;
	smtp_reply_classify(&d->reply, answered);
	if (answered == SMTP_ANSWER_RCPT)
		snprintf(d->error, sizeof(d->error), "%s (relay %s, reply to RCPT TO)",
				 c->reply.text, c->relay->cfg.peer);
	else
		snprintf(d->error, sizeof(d->error), "relay %s refused %s: %s", c->relay->cfg.peer, what,
				 c->reply.text);
}

/*
 * conn_may_follow_dot
 *		Whether the next transaction may be written behind what c waits
 *		for: a final "." and nothing after it, to a relay trusted with it.
 */
static bool
conn_may_follow_dot(SmtpConn *c)
{
	return smtp_txn_behind_dot(c) && c->sort_d == NULL && c->data_wait == NULL &&
		c->nexpect > 0 &&
		c->expect[(c->exphead + c->nexpect - 1) % c->expcap].command == CMD_DOT;
}

/*
 * smtp_txn_behind_dot
 *		Whether c's relay gets transactions behind a final ".": it offers
 *		PIPELINING and ENHANCEDSTATUSCODES and not CHUNKING (which needs no
 *		"."), and never answered out of order.
 */
bool
smtp_txn_behind_dot(const SmtpConn *c)
{
	return c->pipelining && !c->chunking && c->enhanced && !c->relay->misorders;
}

/*
 * reply_subject
 *		The subject of the enhanced status code (RFC 3463) of c's last
 *		reply, "2.1.5" -> 1, or -1 when it has none or the relay does not
 *		offer ENHANCEDSTATUSCODES.
 */
static int
reply_subject(SmtpConn *c)
{
	if (!c->enhanced || c->reply.klass == 0)
		return -1;
	return c->reply.subject;
}

/*
 * smtp_txn_distrust
 *		c's relay did what (answered out of order, or not at all) with
 *		commands behind a final ".": none go behind one to it again, in this
 *		worker's life.
 */
void
smtp_txn_distrust(SmtpConn *c, const char *what)
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
 *		so d goes again, uncharged, and c is given up: returns false, lost
 *		saying why.
 */
static bool
conn_misordered(SmtpConn *c, GatekeeperDelivery *d, char *lost, size_t lostlen)
{
	d->outcome = GATEKEEPER_PENDING;
	memset(&d->reply, 0, sizeof(d->reply));
	d->error[0] = '\0';
	d->txn->replies = 0;
	c->reused = true;
	strlcpy(lost, "the relay answered out of order", lostlen);
	return false;
}

/*
 * conn_sort_reply
 *		A reply while c gathers what is due behind the final "." of
 *		sort_d's message; first for the reply that came where the "."'s was
 *		due, already taken off the ring.  Once all are in: read in order,
 *		the first is the "."'s; else the one reply that can only be the
 *		"."'s (neither 354 nor an address status, X.1.Y) is; else sort_d is
 *		RETRY.  Then c is given up: what was behind goes again, uncharged.
 *		Returns false once c is given up (lost says why), true while
 *		replies are still due.
 */
static bool
conn_sort_reply(SmtpConn *c, int code, bool first, char *lost, size_t lostlen)
{
	GatekeeperDelivery *d = c->sort_d;
	const char *peer = c->relay->cfg.peer;
	const SmtpReply *dot_reply = NULL;

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
			SmtpCommand command = smtp_chat_expected(c).command;

			if (command == CMD_DATA ? (code != 354 && code < 400) : code == 354)
				c->sort_in_order = false;
		}
		if (code != 354 && reply_subject(c) != 1)
		{
			c->sort_found++;
			c->sort_reply = c->reply;
		}
		if (c->nexpect > 0)
			return true;
	}

	c->sort_d = NULL;
	if (c->sort_in_order)
	{
		smtp_txn_distrust(c, "answered a final \".\" as if it were MAIL FROM or RCPT TO");
		dot_reply = &c->sort_first;
	}
	else
	{
		smtp_txn_distrust(c, "answered out of order behind a final \".\"");
		if (c->sort_found == 1)
		{
			dot_reply = &c->sort_reply;
		}
	}
	if (dot_reply != NULL)
	{
		if (dot_reply->code / 100 != 2)
		{
			c->reply = *dot_reply;
			txn_fail(c, d, SMTP_ANSWER_DATA, "the message");
		}
		conn_txn_done(c, d);
	}
	else
	{
		smtp_chat_take(c, d);
		smtp_chat_finish(c, d, GATEKEEPER_RETRY, 0,
						  "relay %s answered out of order behind the final \".\" of the message: "
						  "its reply is not known", peer);
	}
	c->reused = true;
	strlcpy(lost, "the relay answered out of order", lostlen);
	return false;
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
	if (!recipient_ascii(d->mail.recipient))
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
 * recipient_ascii
 *		Whether an address is all ASCII (the rfc822 type of ORCPT can carry
 *		it).
 */
static bool
recipient_ascii(const char *address)
{
	const unsigned char *p;

	for (p = (const unsigned char *) address; *p; p++)
	{
		if (*p & 0x80)
			return false;
	}
	return true;
}
