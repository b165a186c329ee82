/*-------------------------------------------------------------------------
 *
 * smtp_chat.c
 *		One connection's commands and replies, as Postfix's smtp_chat.c:
 *		a command queued, the reply it waits for noted, the reply that came
 *		matched to it; and the deliveries a step decided or gives back,
 *		left on the connection for its relay to take.
 *
 * The session machine (smtp_session.c) and its transactions (smtp_txn.c)
 * call down to this file and to smtp_io.c only, never up to the relay:
 * what they decide of a delivery waits on the connection (finished, or
 * giveback: never answered, to go again), and what becomes of the
 * connection is the step's result, which smtp_relay.c acts on.
 *
 * IDENTIFICATION
 *		src/smtp_chat.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "smtp_chat.h"

#include "smtp_io.h"

/*
 * smtp_chat_send
 *		Queue a command on c.
 */
void
smtp_chat_send(SmtpConn *c, const char *fmt,...)
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
 * smtp_chat_expect
 *		Note that c waits for one more reply.
 */
void
smtp_chat_expect(SmtpConn *c, SmtpCommand command, GatekeeperDelivery *d)
{
	SmtpExpect *e;
	bool		behind = false;

	/*
	 * A transaction's command queued after a final "." still unanswered,
	 * or after such a command: behind the "." (smtp_txn.c)
	 */
	if (c->nexpect > 0 &&
		(command == CMD_MAIL || command == CMD_RCPT || command == CMD_DATA))
	{
		SmtpExpect *prev = &c->expect[(c->exphead + c->nexpect - 1) % c->expcap];

		behind = prev->command == CMD_DOT || prev->behind;
	}
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
	e = &c->expect[(c->exphead + c->nexpect) % c->expcap];
	e->command = command;
	e->d = d;
	e->behind = behind;
	c->nexpect++;
}

/*
 * smtp_chat_expected
 *		The reply c waited for longest, taken off its queue: what the reply
 *		just read answers (c waits for one, nexpect > 0).
 */
SmtpExpect
smtp_chat_expected(SmtpConn *c)
{
	SmtpExpect	e = c->expect[c->exphead];

	Assert(c->nexpect > 0);
	c->exphead = (c->exphead + 1) % c->expcap;
	c->nexpect--;
	return e;
}

/*
 * smtp_chat_take
 *		Take d off c's transactions: its outcome is decided, or it goes back.
 */
void
smtp_chat_take(SmtpConn *c, GatekeeperDelivery *d)
{
	dlist_delete(&d->queue_node);
	c->ntxns--;
}

/*
 * smtp_chat_finish
 *		Set the outcome of d, taken off c's transactions (unless a refusal
 *		set it already), and leave it for c's relay to hand back.
 */
void
smtp_chat_finish(SmtpConn *c, GatekeeperDelivery *d, GatekeeperOutcome outcome,
				 int code, const char *fmt,...)
{
	if (d->outcome == GATEKEEPER_PENDING)
	{
		va_list		ap;

		d->outcome = outcome;
		memset(&d->reply, 0, sizeof(d->reply));
		d->reply.code = code;
		va_start(ap, fmt);
		vsnprintf(d->error, sizeof(d->error), fmt, ap);
		va_end(ap);
	}
	smtp_chat_decided(c, d);
}

/*
 * smtp_chat_decided
 *		d, taken off c's transactions, has its outcome: leave it for c's
 *		relay to hand back.
 */
void
smtp_chat_decided(SmtpConn *c, GatekeeperDelivery *d)
{
	d->txn->stage = ST_DONE;
	dlist_push_tail(&c->finished, &d->queue_node);
}

/*
 * smtp_chat_give_back
 *		d, taken off c's transactions, was never taken by the relay: leave
 *		it for c's relay to put back at the head of its backlog, as if never
 *		sent (gave back in the order of this call: the last given goes
 *		first).
 */
void
smtp_chat_give_back(SmtpConn *c, GatekeeperDelivery *d)
{
	d->txn->stage = ST_NONE;
	d->txn->replies = 0;
	d->outcome = GATEKEEPER_PENDING;
	d->error[0] = '\0';
	dlist_push_tail(&c->giveback, &d->queue_node);
}
