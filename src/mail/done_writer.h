/*-------------------------------------------------------------------------
 *
 * done_writer.h
 *		Finished mail's outcomes written into mail_done past the executor
 *		(src/mail/done_writer.c), for src/mail/mail_state.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_DONE_WRITER_H
#define GATEKEEPER_DONE_WRITER_H

#include "live_record.h"

extern bool gatekeeper_done_write(LiveRecord *lr, Datum *records, int n);

#endif							/* GATEKEEPER_DONE_WRITER_H */
