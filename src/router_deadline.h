/*-------------------------------------------------------------------------
 *
 * router_deadline.h
 *		The deadline of a call the router routes to a shard
 *		(src/router_deadline.c): its hooks for src/xact.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_ROUTER_DEADLINE_H
#define GATEKEEPER_ROUTER_DEADLINE_H

#include "access/xact.h"

/* src/xact.c: a deadline armed by a (sub)transaction that ends is disarmed */
extern void gatekeeper_router_deadline_at_xact_end(XactEvent event);
extern void gatekeeper_router_deadline_at_subxact_end(SubXactEvent event);

#endif							/* GATEKEEPER_ROUTER_DEADLINE_H */
