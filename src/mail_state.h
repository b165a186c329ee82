/*-------------------------------------------------------------------------
 *
 * mail_state.h
 *		The changes of a mail's state (issue 26, item 1): the column lists
 *		of the state tables, and what the worker may call of the module
 *		(mail_state_sweep.c: reap, cancel, sync, rotate, purge).
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_MAIL_STATE_H
#define GATEKEEPER_MAIL_STATE_H

#include "postgres.h"

#include "utils/array.h"

/* gatekeeper.mail_live's columns, in the table's order */
#define MAIL_LIVE_COLUMNS \
	"id, queue, priority, send_at, state, attempt, uncharged, worker, " \
	"message_id, last_error, dedupe_key, segment"

/* gatekeeper.mail_done's columns, in the table's order */
#define MAIL_DONE_COLUMNS \
	"id, queue, state, attempt, uncharged, send_at, worker, " \
	"message_id, last_error, dedupe_key, finished_at, segment"

/* src/claim.c: take claims out of their batches, recording nothing */
extern int	gatekeeper_mail_take_claimed(ArrayType *ids, ArrayType *attempts);

/* src/mail_state_sweep.c; each runs with SPI connected */
extern int32 gatekeeper_mail_reap(void);
extern int64 gatekeeper_mail_purge(int32 batch);

#endif							/* GATEKEEPER_MAIL_STATE_H */
