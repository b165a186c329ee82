/*-------------------------------------------------------------------------
 *
 * smtp_relay.c
 *		One relay's connections and the deliveries waiting for them.
 *
 * Up to the relay's smtp_connections connections are opened as there is
 * mail for them, and reused from one message to the next.  A delivery
 * submitted waits on the relay's backlog until a ready connection has room
 * for it (dispatch: least loaded first), and goes, once its outcome is
 * known, on the relay's done list, whence the worker takes it.
 *
 * Lifetime: this is the one place a connection is opened, closed and
 * freed.  A connection's memory is a context of its own.  Closing a
 * connection only closes its socket and marks it; smtp_relay_free_closed,
 * which smtp_client_wait calls before and after it acts on events, frees
 * the closed connections, so no caller, however deep, ever holds a freed
 * connection.
 *
 * When a session cannot be opened and no other connection is open, the
 * mail waiting for a connection is UNREACHABLE: the relay's fault, handed
 * back uncharged.  While other connections work, no new one is tried for a
 * moment instead.
 *
 * The relay owns dispatch: it hands each connection's events to the
 * session machine (smtp_session.c) and acts on the step each returns
 * (relay_act): the deliveries the step decided go on the done list, those
 * it gave back to the head of the backlog, and the connection is handed
 * mail, closed, or given up as failed.  The session and its transactions
 * never call up into this file.
 *
 * IDENTIFICATION
 *		src/smtp_relay.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "smtp_relay.h"

#include "smtp_io.h"
#include "smtp_session.h"
#include "smtp_txn.h"
#include "storage/latch.h"
#include "utils/memutils.h"

static int	conn_depth(SmtpConn *c);
static bool conn_usable(SmtpConn *c);
static SmtpConn *conn_open(SmtpRelay *r);
static void conn_close(SmtpConn *c);
static void relay_act(SmtpConn *c, SmtpStep step);
static void relay_collect(SmtpConn *c);
static void relay_conn_failed(SmtpConn *c, const char *error);
static void relay_finish(SmtpRelay *r, GatekeeperDelivery *d, GatekeeperOutcome outcome,
						 const char *error);
static int	relay_txns(SmtpRelay *r);
static void relay_unreachable(SmtpRelay *r, const char *error);

/*
 * smtp_relay_configure
 *		Take the settings of the relay named by url as they are now, its
 *		memory in cxt.  When they differ from what the open connections were
 *		made with, those connections are retired: they finish what they
 *		carry, then QUIT.
 */
void
smtp_relay_configure(SmtpRelay *r, MemoryContext cxt, const char *url)
{
	dlist_iter	iter;

	if (r->cxt == NULL)
	{
		r->cxt = cxt;
		dlist_init(&r->conns);
		dlist_init(&r->backlog);
		dlist_init(&r->done);
	}
	if (r->cfg.url != NULL && smtp_config_matches(&r->cfg, url))
		return;

	dlist_foreach(iter, &r->conns)
	{
		SmtpConn   *c = dlist_container(SmtpConn, node, iter.cur);

		c->retire = true;
	}
	smtp_relay_forget(r);
	smtp_config_load(&r->cfg, r->cxt, url);
	r->connect_hold_until = 0;
	r->next_send = 0;
}

/*
 * smtp_relay_forget
 *		Forget r's settings, the password wiped, and its TLS context; its
 *		connections, if any, carry on with what they hold.
 */
void
smtp_relay_forget(SmtpRelay *r)
{
	smtp_config_free(&r->cfg);
	if (r->tls_ctx != NULL)
		SSL_CTX_free(r->tls_ctx);
	r->tls_ctx = NULL;
}

/*
 * smtp_relay_room
 *		How many more transactions r would take now: what the open
 *		connections can queue, plus one for each connection it may still
 *		open, less what already waits.
 */
int
smtp_relay_room(SmtpRelay *r)
{
	dlist_iter	iter;
	int			capacity = 0;
	int			usable = 0;

	if (!r->cfg.valid)
		return Max(r->cfg.connections, 1);	/* they come back UNREACHABLE, and say why */
	if (r->cfg.rate_limited &&
		(r->cfg.rate == 0 || GetCurrentTimestamp() < r->next_send || r->nbacklog > 0))
		return 0;				/* its rate= is used up for now */
	dlist_foreach(iter, &r->conns)
	{
		SmtpConn   *c = dlist_container(SmtpConn, node, iter.cur);

		if (!conn_usable(c))
			continue;
		usable++;
		capacity += c->state == CS_READY ? conn_depth(c) : 1;
	}
	capacity += Max(r->cfg.connections - usable, 0);
	capacity = Max(capacity - relay_txns(r) - r->nbacklog, 0);
	return r->cfg.rate_limited ? Min(capacity, 1) : capacity;
}

/*
 * smtp_relay_room_at
 *		When r, held back by its rate=, may take the next transaction;
 *		DT_NOEND when no rate holds it.
 */
TimestampTz
smtp_relay_room_at(SmtpRelay *r)
{
	if (!r->cfg.valid || !r->cfg.rate_limited || r->cfg.rate == 0)
		return DT_NOEND;
	return r->next_send;
}

/*
 * smtp_relay_submit
 *		Take a built message; it goes on the first connection with room.
 */
void
smtp_relay_submit(SmtpRelay *r, GatekeeperDelivery *d)
{
	d->outcome = GATEKEEPER_PENDING;
	memset(&d->reply, 0, sizeof(d->reply));
	d->session_reached = false;
	d->error[0] = '\0';
	if (d->txn == NULL)
		d->txn = MemoryContextAllocZero(d->cxt, sizeof(SmtpTxn));
	d->txn->stage = ST_NONE;
	d->txn->replies = 0;

	if (!r->cfg.valid && r->cfg.parsed)
		r->cfg.valid = smtp_config_resolve(&r->cfg);
	if (!r->cfg.valid)
	{
		relay_finish(r, d, GATEKEEPER_UNREACHABLE, r->cfg.problem);
		return;
	}
	dlist_push_tail(&r->backlog, &d->queue_node);
	r->nbacklog++;
	smtp_relay_dispatch(r);
}

/*
 * smtp_relay_next_done
 *		A delivery of r whose outcome is known, or NULL.
 */
GatekeeperDelivery *
smtp_relay_next_done(SmtpRelay *r)
{
	if (dlist_is_empty(&r->done))
		return NULL;
	return dlist_container(GatekeeperDelivery, queue_node, dlist_pop_head_node(&r->done));
}

/*
 * smtp_relay_abort_unsent
 *		Give back, UNREACHABLE with error, every delivery not yet written to
 *		a connection.  What is on the wire finishes.
 */
void
smtp_relay_abort_unsent(SmtpRelay *r, const char *error)
{
	dlist_iter	iter;

	relay_unreachable(r, error);
	dlist_foreach(iter, &r->conns)
	{
		SmtpConn   *c = dlist_container(SmtpConn, node, iter.cur);
		dlist_mutable_iter miter;

		dlist_foreach_modify(miter, &c->txns)
		{
			GatekeeperDelivery *d = dlist_container(GatekeeperDelivery, queue_node, miter.cur);

			if (d->txn->stage != ST_NONE)
				continue;
			dlist_delete(&d->queue_node);
			c->ntxns--;
			relay_finish(r, d, GATEKEEPER_UNREACHABLE, error);
		}
	}
}

/*
 * smtp_relay_dispatch
 *		Hand waiting deliveries to ready connections with room, least loaded
 *		first, and open connections while mail waits for one.
 */
void
smtp_relay_dispatch(SmtpRelay *r)
{
	TimestampTz now;
	int			opening = 0;
	dlist_iter	iter;

	while (r->nbacklog > 0)
	{
		SmtpConn   *best = NULL;

		dlist_foreach(iter, &r->conns)
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

		/*
		 * rate=: transactions start at least 1/rate s apart, and 5% more,
		 * so that no second holds more than rate of them at the relay
		 * either, whatever the backlog and the network's jitter.
		 */
		if (r->cfg.rate_limited)
		{
			TimestampTz at = GetCurrentTimestamp();

			if (r->cfg.rate == 0 || at < r->next_send)
				break;
			r->next_send = at + (USECS_PER_SEC * 105 / 100 + r->cfg.rate - 1) / r->cfg.rate;
		}
		{
			GatekeeperDelivery *d = dlist_container(GatekeeperDelivery, queue_node,
													dlist_pop_head_node(&r->backlog));

			r->nbacklog--;
			dlist_push_tail(&best->txns, &d->queue_node);
			best->ntxns++;
			smtp_txn_start(best);
			/* what the relay would refuse is decided before it is written */
			relay_collect(best);
		}
	}
	if (r->nbacklog == 0)
		return;

	/* one connection being set up per delivery still waiting */
	now = GetCurrentTimestamp();
	if (now < r->connect_hold_until)
		return;
	dlist_foreach(iter, &r->conns)
	{
		SmtpConn   *c = dlist_container(SmtpConn, node, iter.cur);

		if (c->state < CS_READY && !c->retire)
			opening++;
	}
	while (opening < r->nbacklog)
	{
		int			usable = 0;

		dlist_foreach(iter, &r->conns)
		{
			if (conn_usable(dlist_container(SmtpConn, node, iter.cur)))
				usable++;
		}
		if (usable >= r->cfg.connections)
			break;
		if (conn_open(r) == NULL)
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
	if (smtp_txn_behind_dot(c))
		return SMTP_DEPTH_BEHIND_DOT;
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
 * smtp_relay_usable
 *		Whether any connection of r is open, or opening, for new work.
 */
bool
smtp_relay_usable(SmtpRelay *r)
{
	dlist_iter	iter;

	dlist_foreach(iter, &r->conns)
	{
		if (conn_usable(dlist_container(SmtpConn, node, iter.cur)))
			return true;
	}
	return false;
}

/*
 * conn_open
 *		Start a new connection to the relay.  Returns it; it may already
 *		have failed (then it is gone and NULL is returned).
 */
static SmtpConn *
conn_open(SmtpRelay *r)
{
	/*
	 * Sizes of no standard kind (ALLOCSET_DEFAULT_SIZES starts at 8 kB): such
	 * a context is really freed when it is deleted, not kept for reuse, so
	 * that a memory checker sees a use of a freed connection.
	 */
	MemoryContext cxt = AllocSetContextCreate(r->cxt, "gatekeeper SMTP connection",
											  0, 16 * 1024, ALLOCSET_DEFAULT_MAXSIZE);
	SmtpConn   *c = MemoryContextAllocZero(cxt, sizeof(SmtpConn));
	MemoryContext old = MemoryContextSwitchTo(cxt);
	char		error[256];

	c->cxt = cxt;
	initStringInfo(&c->chunk);
	MemoryContextSwitchTo(old);
	c->relay = r;
	c->sock = PGINVALID_SOCKET;
	c->addr = -1;
	c->pos = -1;
	dlist_init(&c->txns);
	dlist_init(&c->finished);
	dlist_init(&c->giveback);
	dlist_push_tail(&r->conns, &c->node);
	r->nconns++;
	c->state = CS_CONNECTING;
	smtp_io_set_deadline(c, GetCurrentTimestamp(), r->cfg.timeout);
	if (!smtp_io_connect_next(c, error, sizeof(error)))
	{
		char		failure[300];

		snprintf(failure, sizeof(failure), "relay %s: %s", r->cfg.peer, error);
		relay_conn_failed(c, failure);
		return NULL;
	}
	return c;
}

/*
 * conn_close
 *		Close c: its socket and TLS go at once, its memory when
 *		smtp_relay_free_closed runs between events.  Its transactions must be
 *		gone already.
 */
static void
conn_close(SmtpConn *c)
{
	Assert(c->ntxns == 0);
	if (c->state == CS_CLOSED)
		return;
	smtp_io_close(c);
	c->state = CS_CLOSED;
	c->nexpect = 0;
	c->nsegs = 0;
	c->relay->nconns--;
}

/*
 * smtp_relay_free_closed
 *		Free r's connections that were closed, and say whether there were
 *		any.  The one place a connection is freed; called by
 *		smtp_client_wait only, before and after it acts on events, when
 *		nothing holds a connection.
 */
bool
smtp_relay_free_closed(SmtpRelay *r)
{
	dlist_mutable_iter miter;
	bool		freed = false;

	dlist_foreach_modify(miter, &r->conns)
	{
		SmtpConn   *c = dlist_container(SmtpConn, node, miter.cur);

		if (c->state != CS_CLOSED)
			continue;
		dlist_delete(&c->node);
		MemoryContextDelete(c->cxt);
		freed = true;
	}
	return freed;
}

/*
 * smtp_relay_conn_event
 *		Act on what the wait set reported of c (events): the connection
 *		attempt or the TLS handshake went on, replies can be read, output
 *		can be written.  What the session's step asks is done here.
 */
void
smtp_relay_conn_event(SmtpConn *c, uint32 events)
{
	if (c->state == CS_CLOSED)
		return;
	if (c->state == CS_CONNECTING)
	{
		relay_act(c, smtp_session_connected(c));
		return;
	}
	if (c->state == CS_TLS)
	{
		relay_act(c, smtp_session_tls_progress(c));
		return;
	}
	if ((events & WL_SOCKET_READABLE) ||
		(c->tls_read_wants_write && (events & WL_SOCKET_WRITEABLE)))
		relay_act(c, smtp_session_readable(c));
	if (c->state != CS_CLOSED &&
		((events & WL_SOCKET_WRITEABLE) ||
		 (c->tls_write_wants_read && (events & WL_SOCKET_READABLE))))
		smtp_io_flush(c);
}

/*
 * smtp_relay_check_time
 *		Act on what time did to r's connections (late replies, broken
 *		connections, idle ones: smtp_session_check_time), then hand waiting
 *		mail to connections with room.
 */
void
smtp_relay_check_time(SmtpRelay *r, TimestampTz now)
{
	dlist_iter	iter;

	dlist_foreach(iter, &r->conns)
	{
		SmtpConn   *c = dlist_container(SmtpConn, node, iter.cur);

		relay_act(c, smtp_session_check_time(c, now));
	}
	smtp_relay_dispatch(r);
}

/*
 * smtp_relay_deadline
 *		The earliest time one of r's connections must hear from the relay,
 *		give up, or say QUIT; 0 for none.
 */
TimestampTz
smtp_relay_deadline(SmtpRelay *r, TimestampTz now)
{
	dlist_iter	iter;
	TimestampTz earliest = 0;

	dlist_foreach(iter, &r->conns)
	{
		TimestampTz at = smtp_session_deadline(dlist_container(SmtpConn, node, iter.cur), now);

		if (at != 0 && (earliest == 0 || at < earliest))
			earliest = at;
	}
	return earliest;
}

/*
 * smtp_relay_busy
 *		Deliveries r holds: on its connections or waiting for one.
 */
int
smtp_relay_busy(SmtpRelay *r)
{
	return relay_txns(r) + r->nbacklog;
}

/*
 * relay_txns
 *		Transactions on r's connections.
 */
static int
relay_txns(SmtpRelay *r)
{
	dlist_iter	iter;
	int			n = 0;

	dlist_foreach(iter, &r->conns)
		n += dlist_container(SmtpConn, node, iter.cur)->ntxns;
	return n;
}

/*
 * relay_act
 *		Do what a step of c's session asks (step): take the deliveries it
 *		decided and gave back (relay_collect), then hand the session mail
 *		when it became ready, close c when its session is over, or give it
 *		up when it failed (relay_conn_failed).
 */
static void
relay_act(SmtpConn *c, SmtpStep step)
{
	relay_collect(c);
	switch (step)
	{
		case SMTP_STEP_GOING:
			break;
		case SMTP_STEP_READY:
			smtp_relay_dispatch(c->relay);
			break;
		case SMTP_STEP_CLOSE:
			conn_close(c);
			break;
		case SMTP_STEP_FAILED:
			relay_conn_failed(c, c->failure);
			break;
	}
}

/*
 * relay_collect
 *		The deliveries a step left on c: those decided go on the done list,
 *		in their order; those given back (never taken by the relay) to the
 *		head of the backlog, as if never sent.
 */
static void
relay_collect(SmtpConn *c)
{
	SmtpRelay  *r = c->relay;

	while (!dlist_is_empty(&c->finished))
		dlist_push_tail(&r->done, dlist_pop_head_node(&c->finished));
	/* given back last first: each goes before those given back before it */
	while (!dlist_is_empty(&c->giveback))
	{
		dlist_push_head(&r->backlog, dlist_pop_head_node(&c->giveback));
		r->nbacklog++;
	}
}

/*
 * relay_conn_failed
 *		A session could not be opened on c, whose transactions are back on
 *		the backlog already, or ended before the relay answered one: close
 *		c.  When no other connection is open or opening, the mail waiting
 *		for one is UNREACHABLE with error; otherwise it waits for the
 *		others, and no new connection is tried for a moment.
 */
static void
relay_conn_failed(SmtpConn *c, const char *error)
{
	SmtpRelay  *r = c->relay;

	conn_close(c);
	if (!smtp_relay_usable(r))
		relay_unreachable(r, error);
	else
		r->connect_hold_until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
															SMTP_CONNECT_HOLD_MS);
}

/*
 * relay_finish
 *		Set d's outcome (unless a refusal set it already, or it is
 *		UNREACHABLE, which says the relay never took it) and hand it back.
 */
static void
relay_finish(SmtpRelay *r, GatekeeperDelivery *d, GatekeeperOutcome outcome,
			 const char *error)
{
	if (d->outcome == GATEKEEPER_PENDING || outcome == GATEKEEPER_UNREACHABLE)
	{
		d->outcome = outcome;
		memset(&d->reply, 0, sizeof(d->reply));
		strlcpy(d->error, error, sizeof(d->error));
	}
	d->txn->stage = ST_DONE;
	dlist_push_tail(&r->done, &d->queue_node);
}

/*
 * relay_unreachable
 *		Every delivery of r waiting for a connection is UNREACHABLE with error.
 */
static void
relay_unreachable(SmtpRelay *r, const char *error)
{
	while (!dlist_is_empty(&r->backlog))
	{
		GatekeeperDelivery *d = dlist_container(GatekeeperDelivery, queue_node,
												dlist_pop_head_node(&r->backlog));

		r->nbacklog--;
		relay_finish(r, d, GATEKEEPER_UNREACHABLE, error);
	}
}
