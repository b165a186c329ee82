/*-------------------------------------------------------------------------
 *
 * smtp_io.h
 *		The SMTP client's I/O layer: one connection's socket, TLS, bounded
 *		input and output, dot-stuffing.
 *
 * IDENTIFICATION
 *		src/smtp_io.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef SMTP_IO_H
#define SMTP_IO_H

#include "smtp_conn.h"

/* how a step that may have to wait for the socket went */
#define SMTP_IO_FAILED		(-1)
#define SMTP_IO_WAIT		0
#define SMTP_IO_DONE		1

extern bool smtp_io_connect_next(SmtpConn *c, char *err, size_t errlen);
extern int	smtp_io_connect_result(SmtpConn *c, char *err, size_t errlen);
extern bool smtp_io_tls_start(SmtpConn *c, char *err, size_t errlen);
extern int	smtp_io_tls_handshake(SmtpConn *c, char *err, size_t errlen);
extern ssize_t smtp_io_read(SmtpConn *c, char *buf, size_t len, bool *eof,
							char *err, size_t errlen);
extern void smtp_io_push(SmtpConn *c, const char *data, size_t len, char *owned);
extern void smtp_io_push_stuffed(SmtpConn *c, const char *data, size_t len);
extern void smtp_io_flush(SmtpConn *c);
extern void smtp_io_update_events(SmtpConn *c);
extern void smtp_io_close(SmtpConn *c);
extern void smtp_io_progress(SmtpConn *c);
extern void smtp_io_set_deadline(SmtpConn *c, TimestampTz now, int ms);
extern void smtp_io_settle_timer(SmtpConn *c, TimestampTz now);
extern bool smtp_io_peer_loopback(SmtpConn *c);
extern char *smtp_io_local_literal(SmtpConn *c);

#endif							/* SMTP_IO_H */
