/*-------------------------------------------------------------------------
 *
 * worker_breakers.h
 *		What the worker's loop (worker.c) uses of worker_breakers.c: a
 *		circuit breaker per relay of gatekeeper.smtp_url.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_WORKER_BREAKERS_H
#define GATEKEEPER_WORKER_BREAKERS_H

#include "datatype/timestamp.h"

extern void worker_breakers_reset(void);
extern int	worker_breakers_next(TimestampTz now, int nrelays);
extern TimestampTz worker_breakers_resume(int nrelays);
extern bool worker_breaker_open(int relay, TimestampTz now);
extern const char *worker_breaker_state(int relay, TimestampTz now);
extern void worker_breaker_trip(int relay, const char *error, bool session,
								TimestampTz now);
extern void worker_breaker_close(int relay);
extern bool worker_breaker_mail_refused(int relay, int reply_code, int *in_a_row);
extern void worker_breaker_mail_passed(int relay);

#endif							/* GATEKEEPER_WORKER_BREAKERS_H */
