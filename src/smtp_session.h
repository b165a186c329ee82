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

extern SmtpStep smtp_session_connected(SmtpConn *c);
extern SmtpStep smtp_session_tls_progress(SmtpConn *c);
extern SmtpStep smtp_session_readable(SmtpConn *c);
extern SmtpStep smtp_session_check_time(SmtpConn *c, TimestampTz now);
extern TimestampTz smtp_session_deadline(SmtpConn *c, TimestampTz now);

#endif							/* SMTP_SESSION_H */
