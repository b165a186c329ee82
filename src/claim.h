/*-------------------------------------------------------------------------
 *
 * claim.h
 *		What the rest of gatekeeper uses of claim.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_CLAIM_H
#define GATEKEEPER_CLAIM_H

#include "datatype/timestamp.h"

/* when row n (mail id) of the background worker's claim became due */
extern TimestampTz gatekeeper_claimed_due(uint64 n, int64 id);

#endif							/* GATEKEEPER_CLAIM_H */
