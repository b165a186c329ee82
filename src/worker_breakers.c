/*-------------------------------------------------------------------------
 *
 * worker_breakers.c
 *		A circuit breaker per relay of gatekeeper.smtp_url, as the worker
 *		keeps it: closed while the relay takes sessions and mail, open for
 *		a backoff after it refused them, half-open once the backoff is
 *		over and the next mail tries it again.
 *
 * A relay's breaker opens when no session could be opened with it, or when
 * it refused MAIL FROM with the same 5xx for several transactions in a
 * row (it refuses the worker, not the mail).  The backoff starts at a
 * second and doubles up to 30 s while it keeps failing; a session that
 * works closes the breaker.  The log says once when a relay is given up
 * and once when it is reached again.  What becomes of the mail meanwhile
 * (the next relay takes it, or it is handed back uncharged) is the
 * worker's loop's to decide (src/worker.c); this file only says which
 * relay may have mail, and when delivery can go on.
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

#include "utils/timestamp.h"

/* backoff while the relay refuses the session */
#define BACKOFF_MIN_MS				1000
#define BACKOFF_MAX_MS				30000

/* the same 5xx to MAIL FROM this many times in a row opens the breaker */
#define MAIL_REFUSALS_TO_TRIP		3

/* a relay's breaker: the relay gets no mail until backoff_until */
typedef struct Breaker
{
	TimestampTz backoff_until;
	int			backoff_ms;		/* 0: closed */
	int			mail_refusals;	/* the same 5xx to MAIL FROM in a row */
	int			mail_refusal_code;
} Breaker;

/* the relays of gatekeeper.smtp_url, by their number in the list */
static Breaker breakers[GATEKEEPER_MAX_RELAYS];

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
 * worker_breaker_state: relay's breaker as worker_status shows it.
 */
const char *
worker_breaker_state(int relay, TimestampTz now)
{
	if (breakers[relay].backoff_until > now)
		return "open";
	if (breakers[relay].backoff_ms > 0)
		return "half-open";
	return "closed";
}

/*
 * worker_breaker_trip: open relay's breaker at now, for a backoff of 1 s
 * doubling to 30 s, and say once in the log what the relay said.
 * session: no session could be opened, rather than MAIL FROM being
 * refused.
 */
void
worker_breaker_trip(int relay, const char *error, bool session, TimestampTz now)
{
	Breaker    *b = &breakers[relay];

	if (b->backoff_ms == 0)
	{
		if (session)
			ereport(LOG,
					(errmsg("gatekeeper worker could not reach the SMTP relay: %s",
							error[0] != '\0' ? error : "no reason given"),
					 errdetail("Delivery is retried with backoff; the mail stays scheduled meanwhile.")));
		else
			ereport(LOG,
					(errmsg("gatekeeper worker stops sending: the SMTP relay refuses its mail: %s",
							error),
					 errdetail("Delivery is retried with backoff; the mail stays scheduled, uncharged, meanwhile.")));
	}
	b->backoff_ms = b->backoff_ms == 0 ? BACKOFF_MIN_MS : Min(b->backoff_ms * 2, BACKOFF_MAX_MS);
	b->backoff_until = TimestampTzPlusMilliseconds(now, b->backoff_ms);
	b->mail_refusals = 0;
	b->mail_refusal_code = 0;
}

/*
 * worker_breaker_close: a session with relay worked: close its breaker.
 */
void
worker_breaker_close(int relay)
{
	if (breakers[relay].backoff_ms > 0)
		ereport(LOG,
				(errmsg("gatekeeper worker reaches the SMTP relay again")));
	breakers[relay].backoff_ms = 0;
	breakers[relay].backoff_until = 0;
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
 * worker_breaker_mail_passed: a transaction with relay got past MAIL FROM:
 * the refusals before it were the mails' own.
 */
void
worker_breaker_mail_passed(int relay)
{
	breakers[relay].mail_refusals = 0;
	breakers[relay].mail_refusal_code = 0;
}
