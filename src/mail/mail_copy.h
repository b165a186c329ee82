/*-------------------------------------------------------------------------
 *
 * mail_copy.h
 *		What _PG_init uses of mail_copy.c: the hook that writes a COPY into
 *		gatekeeper.mail straight into the current segment's partition.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_MAIL_COPY_H
#define GATEKEEPER_MAIL_COPY_H

extern void gatekeeper_mail_copy_init(void);

#endif							/* GATEKEEPER_MAIL_COPY_H */
