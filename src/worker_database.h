/*-------------------------------------------------------------------------
 *
 * worker_database.h
 *		What the worker's loop (worker.c) uses of worker_database.c: the
 *		wait of a worker whose database does not exist.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_WORKER_DATABASE_H
#define GATEKEEPER_WORKER_DATABASE_H

extern void worker_wait_for_database(int slot) pg_attribute_noreturn();

#endif							/* GATEKEEPER_WORKER_DATABASE_H */
