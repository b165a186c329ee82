/*-------------------------------------------------------------------------
 *
 * progress.h
 *		What the worker uses of progress.c: a log line when a queue's
 *		backlog starts draining and when it has drained.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_PROGRESS_H
#define GATEKEEPER_PROGRESS_H

extern void gatekeeper_progress_watch(void);

#endif							/* GATEKEEPER_PROGRESS_H */
