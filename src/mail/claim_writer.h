/*-------------------------------------------------------------------------
 *
 * claim_writer.h
 *		A claim's batch rows written into mail_claim past the executor
 *		(src/claim_writer.c), for src/claim.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_CLAIM_WRITER_H
#define GATEKEEPER_CLAIM_WRITER_H

#include "utils/timestamp.h"

extern bool gatekeeper_claim_write(Datum queue, text *worker, Oid owner,
								   TimestampTz lease_until,
								   int nrows, const int64 *lo, const int64 *hi,
								   const int *start, Datum *records,
								   Oid record_type, Oid records_type);

#endif							/* GATEKEEPER_CLAIM_WRITER_H */
