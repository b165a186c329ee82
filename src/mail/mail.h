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

/*
 * The partition a COPY into gatekeeper.mail is being written into
 * (src/mail_copy.c), InvalidOid when it ends: its insert trigger checks
 * only those rows.
 */
extern void gatekeeper_mail_copying_into(Oid relid);

/* the executor hook that refuses RETURNING from skipping inserts */
extern void gatekeeper_mail_init(void);

#endif							/* GATEKEEPER_MAIL_H */
