/*-------------------------------------------------------------------------
 *
 * worker_breakers.h
 *		What the worker's loop (worker.c) uses of worker_breakers.c: a
 *		circuit breaker per relay of gatekeeper.smtp_url, and the judge of
 *		each outcome by it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_WORKER_BREAKERS_H
#define GATEKEEPER_WORKER_BREAKERS_H

#include "datatype/timestamp.h"
#include "lib/ilist.h"
#include "smtp_client.h"
#include "worker_slots.h"

/* why a relay's breaker opens */
typedef enum BreakerCause
{
	BREAKER_SESSION,			/* no session could be opened */
	BREAKER_REFUSED,			/* the same 5xx to MAIL FROM, in a row */
	BREAKER_DEFERRED			/* 4xx to every transaction, in a row */
} BreakerCause;

extern void worker_breakers_reset(void);
extern int	worker_breakers_next(TimestampTz now, int nrelays);
extern TimestampTz worker_breakers_resume(int nrelays);
extern bool worker_breaker_open(int relay, TimestampTz now);
extern const char *worker_breaker_state(int relay, TimestampTz now);
extern bool worker_breakers_throttled(int nrelays, TimestampTz now);
extern void worker_breaker_trip(int relay, const char *error, BreakerCause cause,
								TimestampTz now);
extern void worker_breaker_close(int relay, bool session);
extern bool worker_breaker_mail_refused(int relay, int reply_code, int *in_a_row);
extern bool worker_breaker_deferred(int relay, int *in_a_row);
extern void worker_breaker_mail_passed(int relay);
extern bool worker_breaker_judge(GatekeeperDelivery *d, GatekeeperRelayStatus *rs,
								 dlist_head *out, char *tripped, size_t tripped_len);
extern void worker_breakers_release(int relay, bool relays_fault, dlist_head *out);
extern int	worker_breakers_suspects(void);

#endif							/* GATEKEEPER_WORKER_BREAKERS_H */
