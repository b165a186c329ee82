/*-------------------------------------------------------------------------
 *
 * smtp_session.h
 *		The SMTP session machine: one relay connection from its greeting to
 *		its QUIT, and the transactions it carries.
 *
 * IDENTIFICATION
 *		src/smtp_session.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef SMTP_SESSION_H
#define SMTP_SESSION_H

#include "smtp_conn.h"

extern void smtp_session_connected(SmtpConn *c);
extern void smtp_session_tls_progress(SmtpConn *c);
extern void smtp_session_readable(SmtpConn *c);
extern void smtp_session_failed(SmtpConn *c, const char *fmt,...) pg_attribute_printf(2, 3);
extern void smtp_session_lost(SmtpConn *c, bool relay_ended, const char *error);
extern void smtp_session_send(SmtpConn *c, const char *fmt,...) pg_attribute_printf(2, 3);
extern void smtp_session_expect(SmtpConn *c, SmtpCommand command, GatekeeperDelivery *d);
extern SmtpExpect smtp_session_expected(SmtpConn *c);
extern void smtp_session_take(SmtpConn *c, GatekeeperDelivery *d);
extern TimestampTz smtp_session_deadline(SmtpConn *c, TimestampTz now);
extern void smtp_session_check_time(SmtpConn *c, TimestampTz now);

#endif							/* SMTP_SESSION_H */
