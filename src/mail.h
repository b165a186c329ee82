/*-------------------------------------------------------------------------
 *
 * mail.h
 *		What the rest of gatekeeper uses of mail.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_MAIL_H
#define GATEKEEPER_MAIL_H

/*
 * The retention segment new mail goes to in this transaction; 0 when the
 * extension's table is not there and missing_ok.
 */
extern int16 gatekeeper_current_segment(bool missing_ok);

#endif							/* GATEKEEPER_MAIL_H */
