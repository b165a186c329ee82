/*-------------------------------------------------------------------------
 *
 * due_floor.h
 *		Where a claim's walk of mail_due may start (due_floor.c): the
 *		writers of mail_live lower it, the claims raise it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_DUE_FLOOR_H
#define GATEKEEPER_DUE_FLOOR_H

#include "datatype/timestamp.h"

/* A position in mail_due, within one queue: (priority DESC, send_at, id). */
typedef struct DueKey
{
	int32		priority;
	TimestampTz send_at;
	int64		id;
} DueKey;

/* the floors a queue has: in mail_due (live rows), in mail_run_due (runs) */
typedef enum DueFloorKind
{
	DUE_FLOOR_LIVE,
	DUE_FLOOR_RUN
} DueFloorKind;

#define DUE_FLOOR_KINDS 2

extern Size gatekeeper_due_floor_shmem_size(void);
extern void gatekeeper_due_floor_shmem_init(void);
/*
 * The keys a writer of mail_live or mail_run wrote, gathered so that each
 * run of rows of one queue lowers its floor once, to the least of them:
 * the one way every writer lowers a floor.
 */
typedef struct DueFloorNote
{
	DueFloorKind kind;
	text	   *queue;			/* the rows' queue since the last lowering;
								 * NULL: none */
	DueKey		min;
} DueFloorNote;

extern void gatekeeper_due_floor_note_start(DueFloorNote *note, DueFloorKind kind);
extern void gatekeeper_due_floor_note(DueFloorNote *note, Datum queue, const DueKey *key);
extern void gatekeeper_due_floor_note_end(DueFloorNote *note);
extern void gatekeeper_due_floor_reset(void);
extern bool gatekeeper_due_floor_raise(const char *queue, DueKey *floor);
extern bool gatekeeper_due_floor_raise_run(const char *queue, DueKey *floor);

#endif							/* GATEKEEPER_DUE_FLOOR_H */
