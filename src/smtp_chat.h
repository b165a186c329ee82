/*-------------------------------------------------------------------------
 *
 * smtp_chat.h
 *		What the session machine and its transactions share of one
 *		connection: commands queued, the replies they wait for, and the
 *		deliveries they decided or give back (src/smtp_chat.c).
 *
 * IDENTIFICATION
 *		src/smtp_chat.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef SMTP_CHAT_H
#define SMTP_CHAT_H

#include "smtp_conn.h"

extern void smtp_chat_send(SmtpConn *c, const char *fmt,...) pg_attribute_printf(2, 3);
extern void smtp_chat_expect(SmtpConn *c, SmtpCommand command, GatekeeperDelivery *d);
extern SmtpExpect smtp_chat_expected(SmtpConn *c);
extern void smtp_chat_take(SmtpConn *c, GatekeeperDelivery *d);
extern void smtp_chat_finish(SmtpConn *c, GatekeeperDelivery *d, GatekeeperOutcome outcome,
							 int code, const char *fmt,...) pg_attribute_printf(5, 6);
extern void smtp_chat_decided(SmtpConn *c, GatekeeperDelivery *d);
extern void smtp_chat_give_back(SmtpConn *c, GatekeeperDelivery *d);

#endif							/* SMTP_CHAT_H */
