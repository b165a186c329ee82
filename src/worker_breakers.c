/*-------------------------------------------------------------------------
 *
 * worker_breakers.c
 *		A circuit breaker per relay of gatekeeper.smtp_url, as the worker
 *		keeps it: closed while the relay takes sessions and mail, open for
 *		a backoff after it refused them, half-open once the backoff is
 *		over and the next mail tries it again.
 *
 * A relay's breaker opens when no session could be opened with it, when
 * it refused MAIL FROM with the same 5xx for several transactions in a
 * row (it refuses the worker, not the mail), or when it answered several
 * transactions in a row with a 4xx to MAIL FROM or to the data (it is throttled,
 * out of disk or defers everything: SES's "454 Throttling failure", "421
 * 4.7.0 too many messages").  The backoff starts at a second and doubles
 * up to 30 s while it keeps failing; a session that works closes the
 * breaker, except one opened by deferrals, which only a transaction the
 * relay takes or refuses for good closes.  The log says once when a relay
 * is given up and once when it is reached again.
 *
 * The breakers judge each outcome the SMTP client hands back
 * (worker_breaker_judge): they hold a refusal that may be the relay's
 * (a suspect) until they know, and say of every delivery they let go
 * whether its relay took it.  What becomes of the mail then (the next
 * relay takes it, it is recorded, or it is handed back uncharged) is the
 * worker's loop's to do (src/worker.c); this file never calls it.
 *
 * IDENTIFICATION
 *		src/worker_breakers.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "worker_breakers.h"
#include "gatekeeper.h"
#include "smtp_client.h"

#include "lib/ilist.h"
#include "utils/timestamp.h"

/* backoff while the relay refuses the session */
#define BACKOFF_MIN_MS				1000
#define BACKOFF_MAX_MS				30000

/* the same 5xx to MAIL FROM this many times in a row opens the breaker */
#define MAIL_REFUSALS_TO_TRIP		3

/* and this many transactions in a row answered with a 4xx */
#define DEFERRALS_TO_TRIP			3

/* a relay's breaker: the relay gets no mail until backoff_until */
typedef struct Breaker
{
	TimestampTz backoff_until;
	int			backoff_ms;		/* 0: closed */
	BreakerCause cause;			/* why it opened, while backoff_ms > 0 */
	int			mail_refusals;	/* the same 5xx to MAIL FROM in a row */
	int			mail_refusal_code;
	int			deferrals;		/* transactions answered 4xx in a row */
} Breaker;

/* the relays of gatekeeper.smtp_url, by their number in the list */
static Breaker breakers[GATEKEEPER_MAX_RELAYS];

/*
 * The suspects: deliveries refused at MAIL FROM, or deferred at MAIL FROM
 * or the data, held until their relay's part is known.
 */
static dlist_head suspects = DLIST_STATIC_INIT(suspects);
static int	nsuspects = 0;

static void trip(int relay, GatekeeperRelayStatus *rs, const char *error, BreakerCause cause,
				 TimestampTz now);

/*
 * worker_breakers_reset: every breaker closed, as for a new
 * gatekeeper.smtp_url.
 */
void
worker_breakers_reset(void)
{
	memset(breakers, 0, sizeof(breakers));
}

/*
 * worker_breakers_next: the relay the next mail goes to, the first of the
 * nrelays in gatekeeper.smtp_url's order whose breaker is closed, or
 * half-open (its backoff is over), and that has room for it; -1 for none.
 */
int
worker_breakers_next(TimestampTz now, int nrelays)
{
	int			i;

	for (i = 0; i < nrelays; i++)
	{
		if (now >= breakers[i].backoff_until && smtp_client_room(i) > 0)
			return i;
	}
	return -1;
}

/*
 * worker_breakers_resume: when delivery can go on: now or earlier while
 * one of the nrelays relays' breakers is not open, else when the first
 * backoff ends.
 */
TimestampTz
worker_breakers_resume(int nrelays)
{
	TimestampTz resumes = DT_NOEND;
	int			i;

	for (i = 0; i < nrelays; i++)
		resumes = Min(resumes, breakers[i].backoff_until);
	return resumes;
}

/*
 * worker_breaker_open: whether relay's breaker is open at now.
 */
bool
worker_breaker_open(int relay, TimestampTz now)
{
	return breakers[relay].backoff_until > now;
}

/*
 * worker_breakers_throttled: whether every one of the nrelays relays'
 * breakers is open at now, and one at least because its relay defers
 * every transaction.
 */
bool
worker_breakers_throttled(int nrelays, TimestampTz now)
{
	bool		throttled = false;
	int			i;

	for (i = 0; i < nrelays; i++)
	{
		if (breakers[i].backoff_until <= now)
			return false;
		if (breakers[i].cause == BREAKER_DEFERRED)
			throttled = true;
	}
	return throttled;
}

/*
 * worker_breaker_state: relay's breaker as worker_status shows it:
 * "throttled" is an open breaker whose relay defers every transaction.
 */
const char *
worker_breaker_state(int relay, TimestampTz now)
{
	if (breakers[relay].backoff_until > now)
		return breakers[relay].cause == BREAKER_DEFERRED ? "throttled" : "open";
	if (breakers[relay].backoff_ms > 0)
		return "half-open";
	return "closed";
}

/*
 * worker_breaker_trip: open relay's breaker at now, for a backoff of 1 s
 * doubling to 30 s, and say once in the log what the relay said and why
 * it is given no mail (cause).
 */
void
worker_breaker_trip(int relay, const char *error, BreakerCause cause, TimestampTz now)
{
	Breaker    *b = &breakers[relay];

	if (b->backoff_ms == 0 || b->cause != cause)
	{
		if (cause == BREAKER_SESSION)
			ereport(LOG,
					(errmsg("gatekeeper worker could not reach the SMTP relay: %s",
							error[0] != '\0' ? error : "no reason given"),
					 errdetail("Delivery is retried with backoff; the mail stays scheduled meanwhile.")));
		else if (cause == BREAKER_REFUSED)
			ereport(LOG,
					(errmsg("gatekeeper worker stops sending: the SMTP relay refuses its mail: %s",
							error),
					 errdetail("Delivery is retried with backoff; the mail stays scheduled, uncharged, meanwhile.")));
		else
			ereport(LOG,
					(errmsg("gatekeeper worker stops sending: the SMTP relay defers every transaction: %s",
							error),
					 errdetail("The mail goes to the next relay of gatekeeper.smtp_url, or stays scheduled, uncharged; the relay is tried again with backoff.")));
	}
	b->backoff_ms = b->backoff_ms == 0 ? BACKOFF_MIN_MS : Min(b->backoff_ms * 2, BACKOFF_MAX_MS);
	b->backoff_until = TimestampTzPlusMilliseconds(now, b->backoff_ms);
	b->cause = cause;
	b->mail_refusals = 0;
	b->mail_refusal_code = 0;
	b->deferrals = 0;
}

/*
 * worker_breaker_close: a session with relay worked (session), or a
 * transaction got past it (the relay took the mail, or refused it for
 * good): close its breaker.  A session alone does not close a breaker
 * opened by deferrals: a throttled relay still takes sessions.
 */
void
worker_breaker_close(int relay, bool session)
{
	Breaker    *b = &breakers[relay];

	if (b->backoff_ms == 0 || (session && b->cause == BREAKER_DEFERRED))
		return;
	if (b->cause == BREAKER_DEFERRED)
		ereport(LOG,
				(errmsg("gatekeeper worker sends again: the SMTP relay takes mail again")));
	else
		ereport(LOG,
				(errmsg("gatekeeper worker reaches the SMTP relay again")));
	b->backoff_ms = 0;
	b->backoff_until = 0;
}

/*
 * worker_breaker_mail_refused: relay refused a MAIL FROM with reply_code.
 * Returns whether that makes enough of the same refusal in a row to open
 * its breaker; *in_a_row receives how many.
 */
bool
worker_breaker_mail_refused(int relay, int reply_code, int *in_a_row)
{
	Breaker    *b = &breakers[relay];

	if (reply_code == b->mail_refusal_code)
		b->mail_refusals++;
	else
	{
		b->mail_refusals = 1;
		b->mail_refusal_code = reply_code;
	}
	*in_a_row = b->mail_refusals;
	return b->mail_refusals >= MAIL_REFUSALS_TO_TRIP;
}

/*
 * worker_breaker_deferred: relay answered a transaction with a 4xx.
 * Returns whether that makes enough in a row to open its breaker;
 * *in_a_row receives how many.
 */
bool
worker_breaker_deferred(int relay, int *in_a_row)
{
	Breaker    *b = &breakers[relay];

	*in_a_row = ++b->deferrals;
	return b->deferrals >= DEFERRALS_TO_TRIP;
}

/*
 * worker_breaker_mail_passed: a transaction with relay was decided by the
 * mail (taken, or refused for good past MAIL FROM): the refusals and
 * deferrals before it were the mails' own.
 */
void
worker_breaker_mail_passed(int relay)
{
	breakers[relay].mail_refusals = 0;
	breakers[relay].mail_refusal_code = 0;
	breakers[relay].deferrals = 0;
}

/*
 * worker_breaker_judge
 *		The breaker of the relay d went to looks at the relay's part in d's
 *		outcome (rs: what worker_status shows of that relay).  Each delivery
 *		it lets go of, d itself unless it holds d as a suspect and the
 *		suspects it releases, goes on out, UNREACHABLE when it is to be
 *		handed on to the next relay, else to be recorded.  Returns true when
 *		the relay's breaker opened, tripped saying why.
 *
 * UNREACHABLE (no session could be opened) opens the relay's breaker, and
 * the mail, which the relay did not take, goes to the next relay.  A 5xx
 * to MAIL FROM, and a 4xx to MAIL FROM or to the data, is held as a
 * suspect (a reply to RCPT TO is about its recipient: a full mailbox, a
 * greylisting domain, never the relay's state): the same refusal, or a deferral, for several transactions in a
 * row is the relay's (it refuses the worker, or is throttled, out of disk
 * or deferring everything, not the mail), and opens its breaker with
 * every suspect of that relay handed on uncharged; a transaction the
 * relay takes, or refuses for good past MAIL FROM, shows the suspects'
 * refusals were the mails' own, and they fail or are retried as their
 * replies say.  A transaction whose fate is unknown (the data went and
 * no reply came) is never handed on: it is retried after its backoff.
 */
bool
worker_breaker_judge(GatekeeperDelivery *d, GatekeeperRelayStatus *rs, dlist_head *out,
					 char *tripped, size_t tripped_len)
{
	int			relay = d->relay;
	TimestampTz now = GetCurrentTimestamp();
	bool		open = worker_breaker_open(relay, now);
	int			in_a_row;

	if (d->outcome == GATEKEEPER_UNREACHABLE)
	{
		bool		trips = !open;

		if (trips)
		{
			strlcpy(tripped, d->error, tripped_len);
			trip(relay, rs, tripped, BREAKER_SESSION, now);
		}
		dlist_push_tail(out, &d->queue_node);
		return trips;
	}
	/* what the relay said, counted when it said it, whatever the mail's fate */
	if (d->outcome == GATEKEEPER_RETRY)
		rs->deferred_total++;
	if (d->reply.code >= 400)
	{
		strlcpy(rs->last_reply, d->error, sizeof(rs->last_reply));
		rs->last_reply_at = now;
	}
	if ((d->outcome == GATEKEEPER_FAIL && d->reply.answered == SMTP_ANSWER_MAIL) ||
		(d->outcome == GATEKEEPER_RETRY && d->reply.code / 100 == 4 &&
		 d->reply.answered != SMTP_ANSWER_RCPT))
	{
		bool		deferred = d->outcome == GATEKEEPER_RETRY;
		bool		trips;

		if (open)
		{
			d->outcome = GATEKEEPER_UNREACHABLE;
			dlist_push_tail(out, &d->queue_node);
			return false;
		}
		dlist_push_tail(&suspects, &d->queue_node);
		nsuspects++;
		if (deferred)
			trips = worker_breaker_deferred(relay, &in_a_row);
		else
			trips = worker_breaker_mail_refused(relay, d->reply.code, &in_a_row);
		if (trips)
		{
			snprintf(tripped, tripped_len, "%s (%d transactions in a row)",
					 d->error, in_a_row);
			trip(relay, rs, tripped, deferred ? BREAKER_DEFERRED : BREAKER_REFUSED, now);
			worker_breakers_release(relay, true, out);
		}
		return trips;
	}

	if (d->session_reached)
		worker_breaker_close(relay, true);
	if (d->outcome == GATEKEEPER_SENT || d->outcome == GATEKEEPER_FAIL)
	{
		worker_breaker_close(relay, false);
		worker_breaker_mail_passed(relay);
		worker_breakers_release(relay, false, out);
	}
	dlist_push_tail(out, &d->queue_node);
	return false;
}

/*
 * trip
 *		Open relay's breaker for cause: the relay gets no mail for a backoff,
 *		what waits for its connections goes back to be handed on, the log
 *		says once what the relay said, and rs shows it.
 */
static void
trip(int relay, GatekeeperRelayStatus *rs, const char *error, BreakerCause cause,
	 TimestampTz now)
{
	worker_breaker_trip(relay, error, cause, now);
	strlcpy(rs->last_error, error, sizeof(rs->last_error));
	rs->last_error_at = now;
	smtp_client_abort_unsent(relay, error);
}

/*
 * worker_breakers_release
 *		Let go of every suspect of relay (-1: of every relay), onto out:
 *		relays_fault, the relay's refusal, and the mail is UNREACHABLE, to
 *		go to the next relay, uncharged; else the refusal or deferral was
 *		the mail's own, and it is recorded as its reply said.
 */
void
worker_breakers_release(int relay, bool relays_fault, dlist_head *out)
{
	dlist_mutable_iter miter;

	dlist_foreach_modify(miter, &suspects)
	{
		GatekeeperDelivery *d = dlist_container(GatekeeperDelivery, queue_node, miter.cur);

		if (relay >= 0 && d->relay != relay)
			continue;
		dlist_delete(&d->queue_node);
		nsuspects--;
		if (relays_fault)
			d->outcome = GATEKEEPER_UNREACHABLE;
		dlist_push_tail(out, &d->queue_node);
	}
}

/*
 * worker_breakers_suspects
 *		How many deliveries the breakers hold as suspects.
 */
int
worker_breakers_suspects(void)
{
	return nsuspects;
}
