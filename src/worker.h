/*-------------------------------------------------------------------------
 *
 * worker.h
 *		The background worker's entry point (src/worker.c), registered by
 *		name in src/gatekeeper.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_WORKER_H
#define GATEKEEPER_WORKER_H

extern PGDLLEXPORT void gatekeeper_worker_main(Datum main_arg);

#endif							/* GATEKEEPER_WORKER_H */
