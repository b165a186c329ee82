/*-------------------------------------------------------------------------
 *
 * mail.h
 *		What the rest of gatekeeper uses of mail.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_MAIL_H
#define GATEKEEPER_MAIL_H

#include "gatekeeper.h"

extern Oid	gatekeeper_live_relid(void);
extern void gatekeeper_define_segment_setting(void);
extern void gatekeeper_define_on_duplicate_setting(void);

#endif							/* GATEKEEPER_MAIL_H */
