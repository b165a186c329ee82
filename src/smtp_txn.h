/*-------------------------------------------------------------------------
 *
 * smtp_txn.h
 *		The transactions of a ready SMTP session.
 *
 * IDENTIFICATION
 *		src/smtp_txn.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef SMTP_TXN_H
#define SMTP_TXN_H

#include "smtp_conn.h"

extern void smtp_txn_start(SmtpConn *c);
extern bool smtp_txn_reply(SmtpConn *c, char *lost, size_t lostlen);
extern bool smtp_txn_behind_dot(const SmtpConn *c);
extern void smtp_txn_distrust(SmtpConn *c, const char *what);

#endif							/* SMTP_TXN_H */
