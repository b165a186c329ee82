/*-------------------------------------------------------------------------
 *
 * live_count.h
 *		What the rest of gatekeeper uses of live_count.c: a change to the
 *		live mail's counts, noted by a writer of mail_live that the
 *		triggers do not see.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_LIVE_COUNT_H
#define GATEKEEPER_LIVE_COUNT_H

#include "access/xact.h"

extern void gatekeeper_live_count_add(Oid live_relid, Datum queue, int64 scheduled,
									  int64 retrying);

#endif							/* GATEKEEPER_LIVE_COUNT_H */
