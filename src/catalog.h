/*-------------------------------------------------------------------------
 *
 * catalog.h
 *		What the rest of gatekeeper uses of catalog.c: the extension's
 *		tables' OIDs, kept plans, statements run by key, dump detection,
 *		arrays for SPI arguments and the ids a statement returned.  (The
 *		version check is in gatekeeper.h.)
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_CATALOG_H
#define GATEKEEPER_CATALOG_H

#include "access/attnum.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/relcache.h"
#include "utils/reltrigger.h"

/* the extension's tables (and indexes) whose OIDs are kept */
typedef enum GatekeeperRel
{
	GATEKEEPER_REL_QUEUE,
	GATEKEEPER_REL_GATE,
	GATEKEEPER_REL_SEGMENT,
	GATEKEEPER_REL_MAIL_LIVE,
	GATEKEEPER_REL_MAIL_DUE,	/* mail_live's index by queue and due time */
	GATEKEEPER_REL_MAIL_LIVE_COUNT,
	GATEKEEPER_REL_GATE_SPACE,
	GATEKEEPER_REL_MAIL_CLAIM,
	GATEKEEPER_REL_MAIL_CLAIM_IDS,	/* mail_claim's index by id range */
	GATEKEEPER_REL_MAIL_KEY,
	GATEKEEPER_REL_MAIL_RUN,
	GATEKEEPER_REL_MAIL_RUN_DUE,	/* mail_run's index by queue and due time */
	GATEKEEPER_REL_MAIL,		/* the partitioned table of mail content */
	GATEKEEPER_REL_MAIL_DONE,	/* the partitioned table of outcomes */
	/* the retention segments' partitions, by segment (GATEKEEPER_SEGMENTS) */
	GATEKEEPER_REL_MAIL_0,
	GATEKEEPER_REL_MAIL_1,
	GATEKEEPER_REL_MAIL_2,
	GATEKEEPER_REL_MAIL_3,
	GATEKEEPER_REL_MAIL_DONE_0,
	GATEKEEPER_REL_MAIL_DONE_1,
	GATEKEEPER_REL_MAIL_DONE_2,
	GATEKEEPER_REL_MAIL_DONE_3,
	GATEKEEPER_NUM_RELS
} GatekeeperRel;

/* retention segments: gatekeeper.mail_0 .. mail_3, mail_done_0 .. mail_done_3 */
#define GATEKEEPER_SEGMENTS			4

/* segment's partition of gatekeeper.mail, and of gatekeeper.mail_done */
#define GATEKEEPER_REL_MAIL_PART(segment) \
	((GatekeeperRel) (GATEKEEPER_REL_MAIL_0 + (segment)))
#define GATEKEEPER_REL_MAIL_DONE_PART(segment) \
	((GatekeeperRel) (GATEKEEPER_REL_MAIL_DONE_0 + (segment)))

/* the columns whose presence the library asks about */
typedef enum GatekeeperColumn
{
	GATEKEEPER_COL_LIVE_COUNT_RETRYING, /* mail_live_count.retrying (0.3.0) */
	GATEKEEPER_NUM_COLUMNS
} GatekeeperColumn;

extern Oid	gatekeeper_relid(GatekeeperRel rel, bool missing_ok);
extern uint32 gatekeeper_relid_generation(GatekeeperRel rel);
extern AttrNumber gatekeeper_attnum(GatekeeperColumn column);

extern SPIPlanPtr gatekeeper_plan(SPIPlanPtr *plan, const char *sql, int nargs, Oid *argtypes);
extern int	gatekeeper_execute_by_key(SPIPlanPtr plan, Datum *values, const char *nulls,
									  bool read_only, long count);
extern int	gatekeeper_execute_kept(SPIPlanPtr *plan, const char *sql, int nargs, Oid *types,
									Datum *args, const char *nulls, bool read_only);
extern int	gatekeeper_execute_by_key_into(SPIPlanPtr plan, Datum *values, const char *nulls,
										   bool read_only, long count, DestReceiver *dest);
extern void gatekeeper_planner_init(void);
extern void gatekeeper_own_session(void);

/* who writes the statement running now (gatekeeper_writer) */
typedef enum GatekeeperWriter
{
	GATEKEEPER_WRITER_APPLICATION,	/* an application, or the owner by hand */
	GATEKEEPER_WRITER_OWN,		/* gatekeeper's own code */
	GATEKEEPER_WRITER_DUMP		/* a dump being loaded */
} GatekeeperWriter;
extern GatekeeperWriter gatekeeper_writer(void);
extern Datum gatekeeper_array(Datum *elems, bool *nulls, int n, Oid elemtype);
extern int64 *gatekeeper_spi_ids(MemoryContext cxt, int *n);
extern bool gatekeeper_triggers_only(Relation rel, int event, const char *const *names,
									 int nnames, uint32 *found);
extern const Trigger *gatekeeper_trigger_firing(Relation rel, const char *name);

/* what gatekeeper_run_as replaced, for gatekeeper_run_as_end */
typedef struct GatekeeperRunAs
{
	Oid			save_userid;
	int			save_sec_context;
	int			nestlevel;		/* -1: no settings of its own */
} GatekeeperRunAs;

extern void gatekeeper_run_as(GatekeeperRunAs *r, Oid userid, int sec_flags,
							  ArrayType *config);
extern void gatekeeper_run_as_end(GatekeeperRunAs *r);

#endif							/* GATEKEEPER_CATALOG_H */
