/*-------------------------------------------------------------------------
 *
 * live_writer.h
 *		What the insert trigger (src/mail.c) uses of live_writer.c: the
 *		direct writer of a statement's mail_live rows.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_LIVE_WRITER_H
#define GATEKEEPER_LIVE_WRITER_H

#include "access/htup.h"
#include "access/tupdesc.h"

typedef struct LiveWriter LiveWriter;

extern LiveWriter *gatekeeper_live_writer_open(TupleDesc mail_desc, int64 nrows);
extern void gatekeeper_live_writer_add(LiveWriter *w, Datum *mail_values, bool *mail_isnull,
									   int64 row);
extern Oid	gatekeeper_live_writer_relid(LiveWriter *w);
extern void gatekeeper_live_writer_close(LiveWriter *w);

#endif							/* GATEKEEPER_LIVE_WRITER_H */
