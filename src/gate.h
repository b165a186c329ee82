/*-------------------------------------------------------------------------
 *
 * gate.h
 *		Gates as their callers use them: the claim (src/claim.c) and the
 *		SQL functions (src/gate_funcs.c) lock one recipient's passes at
 *		one gate, decide, and write the changes back.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATE_H
#define GATE_H

#include "gatekeeper.h"

#include "utils/timestamp.h"

/*
 * One recipient's passes at one gate, as a caller holding its shared entry
 * locked sees them.  Passes that expired are dropped as the entry is read.
 */
typedef struct GatePasses
{
	char	   *recipient;		/* lower-cased, the entry's key with gate */
	int32		gate;			/* gatekeeper.gate.id */
	int			n;				/* live passes */
	int			cap;
	TimestampTz *expires;
	int64	   *holders;
	bool	   *holder_null;
	int		   *slots;			/* where each pass is in the entry; -1 if new */
	uint64		hash;			/* the recipient's keyed hash, once hashed */
	bool		hashed;
	int			room;			/* passes the caller may add (gatekeeper_gate_lock) */
	bool		missing;		/* no entry, and none was made */
	bool		nomem;			/* no room in gate memory: not locked */
	bool		changed;		/* differs from the entry: write it back */
} GatePasses;

/* A gate's definition, as one call uses it. */
typedef struct GateDef
{
	int32		id;
	int32		max_sends;		/* at most GATE_MAX_SENDS */
	TimestampTz expiry;			/* now() + period: when a pass made now expires */
} GateDef;

extern int	gatekeeper_gate_passes_cmp(const void *a, const void *b);
extern void gatekeeper_gate_lock(GatePasses *rows, int n, TimestampTz now, bool create);
extern bool gatekeeper_gate_try(GatePasses *row, int max_sends,
								TimestampTz expiry, int64 holder, bool holder_null);
extern TimestampTz gatekeeper_gate_reopens(const GatePasses *row, int max_sends);
extern void gatekeeper_gate_write(GatePasses *rows, int n, TimestampTz now);
extern int	gatekeeper_gate_release_holder(GatePasses *row, int64 holder);
extern void gatekeeper_gate_peek(GatePasses *row, TimestampTz now);
extern void gatekeeper_gate_pass_rows(GatePasses *rows, int n, const GateDef *def, const int *want,
								 int64 holder, bool holder_null, int *granted, TimestampTz now);
extern int32 *gatekeeper_gate_ids(int *ngates);
extern bool gatekeeper_gate_held(GatePasses *row, int64 holder, TimestampTz now);
extern int	gatekeeper_release_passes(char **recipients, int64 *holders, int n);
extern void gatekeeper_gate_memory_warning(int deferred);

#endif							/* GATE_H */
