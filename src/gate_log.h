/*-------------------------------------------------------------------------
 *
 * gate_log.h
 *		The gates' durable log (gatekeeper.gate_log) and its replay into
 *		the shared-memory store after a restart.  Used by gate.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATE_LOG_H
#define GATE_LOG_H

#include "gatekeeper.h"

#include "utils/timestamp.h"

#include "nodes/pg_list.h"

extern uint32 gate_log_space(TimestampTz now);
extern uint64 gate_log_nonce(void);
extern void gate_log_add(List **groups, int32 gate, bool released, TimestampTz expires,
						 const char *recipient, int64 holder, bool holder_null);
extern void gate_log_write(List *groups);
extern int	gate_log_passes(int32 gate, const char *recipient, TimestampTz now,
							TimestampTz **expires, int64 **holders, bool **holder_null);

#endif							/* GATE_LOG_H */
