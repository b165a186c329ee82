/*-------------------------------------------------------------------------
 *
 * maintenance.h
 *		Vacuuming gatekeeper.mail_live after a burst of mail.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_MAINTENANCE_H
#define GATEKEEPER_MAINTENANCE_H

extern void gatekeeper_live_maintenance(void);

#endif							/* GATEKEEPER_MAINTENANCE_H */
