/*-------------------------------------------------------------------------
 *
 * delivery_check.h
 *		Whether the background worker will send this database's mail, said
 *		where a user looks (src/delivery_check.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_DELIVERY_CHECK_H
#define GATEKEEPER_DELIVERY_CHECK_H

extern bool gatekeeper_delivery_check(void);
extern void gatekeeper_delivery_check_once(void);

#endif							/* GATEKEEPER_DELIVERY_CHECK_H */
