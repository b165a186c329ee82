/*-------------------------------------------------------------------------
 *
 * smtp_client.c
 *		The SMTP client's API, which the background worker uses: an SMTP
 *		client that never blocks, every relay connection in the worker's
 *		wait set.
 *
 * Up to gatekeeper.smtp_connections connections to each relay listed in
 * gatekeeper.smtp_url (smtp:// or smtps://, numbered from 0 in the list's
 * order) are opened as there is mail for them, and reused from one message
 * to the next; the worker chooses the relay of each message.  Each is a
 * non-blocking socket (through OpenSSL once TLS is on) that is read
 * whenever it is readable and written whenever there is something to write
 * and room for it; the replies that have arrived are consumed and the
 * connection moves on, so one slow relay connection holds up nothing but
 * itself.
 *
 * This file holds what the worker calls and the wait: smtp_client_wait
 * waits on the latch, postmaster death and every connection's socket, and
 * hands each event to the connection's relay (smtp_relay.c), which runs
 * the session machine (smtp_session.c) and acts on what it returns.  Each
 * relay's connections and the mail waiting for them are smtp_relay.c's,
 * its settings smtp_config.c's.  A
 * relay taken off the list keeps its place here until its connections
 * have finished what they carry.
 *
 * IDENTIFICATION
 *		src/smtp_client.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "smtp_client.h"

#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "smtp_config.h"
#include "smtp_conn.h"
#include "smtp_relay.h"
#include "gatekeeper.h"
#include "storage/latch.h"
#include "utils/memutils.h"
#include "utils/wait_event.h"

static MemoryContext smtp_cxt = NULL;

/* the relays of gatekeeper.smtp_url; those from nrelays on were dropped */
static SmtpRelay relays[GATEKEEPER_MAX_RELAYS];
static int	nrelays = 0;
static int	nrelays_used = 0;	/* ever configured */

static WaitEventSet *wait_set = NULL;
static WaitEvent *wait_events = NULL;
static int	wait_events_cap = 0;
static bool wait_set_stale = true;	/* a connection came or went */

static void prepare_wait_set(void);
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
	List	   *urls;
	int			i;

	if (smtp_cxt == NULL)
		smtp_cxt = AllocSetContextCreate(TopMemoryContext, "gatekeeper SMTP client",
										 ALLOCSET_DEFAULT_SIZES);
	urls = smtp_config_split(gatekeeper_smtp_url ? gatekeeper_smtp_url : "");
	nrelays = Max(Min(list_length(urls), GATEKEEPER_MAX_RELAYS), 1);
	for (i = 0; i < Max(nrelays, nrelays_used); i++)
		smtp_relay_configure(&relays[i], smtp_cxt,
							 i < list_length(urls) ? (char *) list_nth(urls, i) : "");
	nrelays_used = Max(nrelays, nrelays_used);
	list_free_deep(urls);
}

/*
 * smtp_client_relays
 *		How many relays gatekeeper.smtp_url lists (1 when it is empty: that
 *		relay's mail comes back UNREACHABLE).
 */
int
smtp_client_relays(void)
{
	return nrelays;
}

/*
 * smtp_client_relay_url
 *		The URL of a relay, as in gatekeeper.smtp_url.
 */
const char *
smtp_client_relay_url(int relay)
{
	return relays[relay].cfg.url;
}

/*
 * smtp_client_load_password
 *		Read the relay password from gatekeeper.smtp_password_file; forget
 *		the one read before.  Returns false, having said why in the log,
 *		when the file cannot be used: then no mail should be delivered.
 */
bool
smtp_client_load_password(void)
{
	return smtp_config_load_password();
}

/*
 * smtp_client_room
 *		How many more transactions a relay would take now.
 */
int
smtp_client_room(int relay)
{
	return smtp_relay_room(&relays[relay]);
}

/*
 * smtp_client_room_at
 *		The soonest time a relay held back by its rate= takes another
 *		transaction; DT_NOEND when none is.
 */
TimestampTz
smtp_client_room_at(void)
{
	TimestampTz at = DT_NOEND;
	int			i;

	for (i = 0; i < nrelays; i++)
		at = Min(at, smtp_relay_room_at(&relays[i]));
	return at;
}

/*
 * smtp_client_submit
 *		Take a built message for a relay; it goes on the first of the
 *		relay's connections with room.
 */
void
smtp_client_submit(int relay, GatekeeperDelivery *d)
{
	d->relay = relay;
	smtp_relay_submit(&relays[relay], d);
}

/*
 * smtp_client_next_done
 *		A delivery whose outcome is known, or NULL.
 */
GatekeeperDelivery *
smtp_client_next_done(void)
{
	int			i;

	for (i = 0; i < nrelays_used; i++)
	{
		GatekeeperDelivery *d = smtp_relay_next_done(&relays[i]);

		if (d != NULL)
			return d;
	}
	return NULL;
}

/*
 * smtp_client_abort_unsent
 *		Give back, UNREACHABLE with error, every delivery for a relay not
 *		yet written to a connection.  What is on the wire finishes.
 */
void
smtp_client_abort_unsent(int relay, const char *error)
{
	smtp_relay_abort_unsent(&relays[relay], error);
}

/*
 * smtp_client_connections
 *		A relay's connections open or opening.
 */
int
smtp_client_connections(int relay)
{
	return relays[relay].nconns;
}

/*
 * smtp_client_busy
 *		Deliveries the client holds.
 */
int
smtp_client_busy(void)
{
	int			busy = 0;
	int			i;

	for (i = 0; i < nrelays_used; i++)
		busy += smtp_relay_busy(&relays[i]);
	return busy;
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
	bool		latch = false;
	int			n;
	int			i;
	int			r;

	for (r = 0; r < nrelays_used; r++)
	{
		SmtpRelay  *relay = &relays[r];
		TimestampTz at;

		if (smtp_relay_free_closed(relay))
			wait_set_stale = true;

		/* the earliest deadline of any connection bounds the wait */
		at = smtp_relay_deadline(relay, now);
		if (at != 0)
			timeout_ms = Min(timeout_ms, at <= now ? 0 :
							 TimestampDifferenceMilliseconds(now, at) + 1);
		if (relay->nbacklog > 0 && relay->connect_hold_until > now)
			timeout_ms = Min(timeout_ms,
							 TimestampDifferenceMilliseconds(now, relay->connect_hold_until) + 1);
		/* a backlog held back by rate= goes on when its time comes */
		if (relay->nbacklog > 0 && smtp_relay_room_at(relay) != DT_NOEND)
			timeout_ms = Min(timeout_ms, smtp_relay_room_at(relay) <= now ? 0 :
							 TimestampDifferenceMilliseconds(now, smtp_relay_room_at(relay)) + 1);
	}

	prepare_wait_set();

	/*
	 * Acting on one event may close this connection, or open others that
	 * fail at once; a closed connection stays allocated, marked CS_CLOSED,
	 * until smtp_relay_free_closed runs after the last event, so the
	 * events still to come, and every caller, find it marked, never freed.
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
		if (c == NULL)
			continue;
		smtp_relay_conn_event(c, ev->events);
	}

	/* late replies, broken connections, idle connections */
	now = GetCurrentTimestamp();
	for (r = 0; r < nrelays_used; r++)
	{
		smtp_relay_check_time(&relays[r], now);
		if (smtp_relay_free_closed(&relays[r]))
			wait_set_stale = true;
	}
	return latch;
}

/*
 * prepare_wait_set
 *		Bring the wait set up to date with the connections before a wait:
 *		rebuilt when a socket came or went, else told what changed.
 */
static void
prepare_wait_set(void)
{
	dlist_iter	iter;
	bool		stale = wait_set == NULL || wait_set_stale;
	int			r;

	for (r = 0; r < nrelays_used; r++)
	{
		dlist_foreach(iter, &relays[r].conns)
		{
			SmtpConn   *c = dlist_container(SmtpConn, node, iter.cur);

			if (c->sock_changed || (c->sock != PGINVALID_SOCKET && c->pos < 0))
				stale = true;
		}
	}
	if (stale)
	{
		rebuild_wait_set();
		return;
	}
	for (r = 0; r < nrelays_used; r++)
	{
		dlist_foreach(iter, &relays[r].conns)
		{
			SmtpConn   *c = dlist_container(SmtpConn, node, iter.cur);

			if (c->events_changed && c->pos >= 0)
				ModifyWaitEvent(wait_set, c->pos, c->events, NULL);
			c->events_changed = false;
		}
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
	int			n = 2;
	int			r;

	for (r = 0; r < nrelays_used; r++)
		n += relays[r].nconns;

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
	for (r = 0; r < nrelays_used; r++)
	{
		dlist_foreach(iter, &relays[r].conns)
		{
			SmtpConn   *c = dlist_container(SmtpConn, node, iter.cur);

			c->pos = -1;
			c->sock_changed = false;
			c->events_changed = false;
			if (c->sock == PGINVALID_SOCKET)
				continue;
			if (c->state == CS_CONNECTING)
				c->events = WL_SOCKET_WRITEABLE;
			else if (c->events == 0)
				c->events = WL_SOCKET_READABLE;
			c->pos = AddWaitEventToSet(wait_set, c->events, c->sock, NULL, c);
		}
	}
	wait_set_stale = false;
}
