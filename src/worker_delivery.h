/*-------------------------------------------------------------------------
 *
 * worker_delivery.h
 *		What the worker's loop (worker.c) uses of worker_delivery.c: a
 *		claimed mail made a delivery, and its message built.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_WORKER_DELIVERY_H
#define GATEKEEPER_WORKER_DELIVERY_H

#include "smtp_client.h"

extern GatekeeperDelivery *worker_delivery_new(Datum *values, bool *nulls, TimestampTz due);
extern bool worker_delivery_build(GatekeeperDelivery *d, const char *default_sender,
								  bool *is_unsigned);

#endif							/* GATEKEEPER_WORKER_DELIVERY_H */
