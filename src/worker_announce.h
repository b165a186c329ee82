/*-------------------------------------------------------------------------
 *
 * worker_announce.h
 *		What the worker's loop (worker.c) uses of worker_announce.c: the
 *		first worker's announcements of the notify queues' due mail.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_WORKER_ANNOUNCE_H
#define GATEKEEPER_WORKER_ANNOUNCE_H

#include "datatype/timestamp.h"

extern void worker_announce(void);
extern TimestampTz worker_announce_next(void);
extern const char *worker_announce_trouble(void);

#endif							/* GATEKEEPER_WORKER_ANNOUNCE_H */
