/*-------------------------------------------------------------------------
 *
 * smtp_relay.h
 *		One relay's connections and the deliveries waiting for them: the
 *		one place a connection is opened, closed and freed.
 *
 * IDENTIFICATION
 *		src/smtp_relay.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef SMTP_RELAY_H
#define SMTP_RELAY_H

#include "smtp_conn.h"

extern void smtp_relay_configure(SmtpRelay *r, MemoryContext cxt, const char *url);
extern void smtp_relay_forget(SmtpRelay *r);
extern int	smtp_relay_room(SmtpRelay *r);
extern TimestampTz smtp_relay_room_at(SmtpRelay *r);
extern void smtp_relay_submit(SmtpRelay *r, GatekeeperDelivery *d);
extern GatekeeperDelivery *smtp_relay_next_done(SmtpRelay *r);
extern void smtp_relay_abort_unsent(SmtpRelay *r, const char *error);
extern void smtp_relay_dispatch(SmtpRelay *r);
extern bool smtp_relay_usable(SmtpRelay *r);
extern bool smtp_relay_free_closed(SmtpRelay *r);
extern void smtp_relay_conn_event(SmtpConn *c, uint32 events);
extern void smtp_relay_check_time(SmtpRelay *r, TimestampTz now);
extern TimestampTz smtp_relay_deadline(SmtpRelay *r, TimestampTz now);
extern int	smtp_relay_busy(SmtpRelay *r);

#endif							/* SMTP_RELAY_H */
