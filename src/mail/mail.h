/*-------------------------------------------------------------------------
 *
 * mail.h
 *		What the rest of gatekeeper uses of mail.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_MAIL_H
#define GATEKEEPER_MAIL_H

#include "executor/tuptable.h"
#include "nodes/pg_list.h"
#include "utils/relcache.h"

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

/*
 * A COPY's new mail taken in as it is read (src/mail/mail_copy.c): begin
 * returns NULL when the partition's insert trigger must check the rows.
 */
typedef struct MailIntake MailIntake;

extern MailIntake *gatekeeper_mail_intake_begin(Relation part, List *attnums);
extern void gatekeeper_mail_intake_rows(MailIntake *in, TupleTableSlot **slots, int n);
extern void gatekeeper_mail_intake_end(MailIntake *in);

/* the executor hook that refuses RETURNING from skipping inserts */
extern void gatekeeper_mail_init(void);

#endif							/* GATEKEEPER_MAIL_H */
