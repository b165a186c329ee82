/*-------------------------------------------------------------------------
 *
 * wake.h
 *		What the rest of gatekeeper uses of wake.c: waking the workers when
 *		due mail commits, and announcing notify queues' mail.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_WAKE_H
#define GATEKEEPER_WAKE_H

#include "access/xact.h"
#include "datatype/timestamp.h"

/*
 * A notify queue's due mail is announced with NOTIFY on this channel, the
 * queue's name as the payload.
 */
#define GATEKEEPER_CHANNEL "gatekeeper"

extern void gatekeeper_wake_at_commit(void);
extern void gatekeeper_notify_queue(const char *queue);
extern void gatekeeper_announce_later(TimestampTz due);
extern void gatekeeper_announce_due(const char *queue, TimestampTz due);

/* src/xact.c's hook */
extern void gatekeeper_wake_at_xact_end(XactEvent event);

#endif							/* GATEKEEPER_WAKE_H */
