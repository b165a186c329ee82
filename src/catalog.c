/*-------------------------------------------------------------------------
 *
 * catalog.c
 *		SPI and catalog helpers: the OIDs of the extension's tables, cached
 *		behind one relcache invalidation callback; kept plans; statements
 *		run by key and the one planner policy; who writes (a dump, gatekeeper,
 *		an application); arrays for SPI arguments; work run as an owner
 *		with settings of its own; gatekeeper's triggers among a table's;
 *		and the check of the extension's version against the library's.
 *
 * The OIDs of the extension's tables are looked up by name the first time
 * a backend asks for one and kept until a relcache invalidation names the
 * table (it was dropped, truncated, altered) or names none (the whole
 * cache was reset); a table that is not there is looked up again at every
 * call, so CREATE EXTENSION needs no invalidation to be seen.  Each table's
 * entry counts its invalidations, so that a module that keeps something
 * read from a table (gate_log.c's nonce, report.c's indexes and column
 * numbers of the segments' partitions) knows when to read it again; an
 * index created or dropped invalidates its table, so the table's count
 * covers what is derived from its indexes too.  The
 * columns asked about (whether mail_live_count has retrying, in the middle
 * of ALTER EXTENSION UPDATE) are kept the same way.
 *
 * IDENTIFICATION
 *		src/catalog.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog.h"
#include "gatekeeper.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_trigger.h"
#include "commands/trigger.h"
#include "commands/dbcommands.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "optimizer/planner.h"
#include "storage/proc.h"
#include "storage/sinval.h"
#include "tcop/pquery.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/syscache.h"

/* the tables' names, by GatekeeperRel */
static const char *const rel_names[GATEKEEPER_NUM_RELS] = {
	[GATEKEEPER_REL_QUEUE] = "queue",
	[GATEKEEPER_REL_GATE] = "gate",
	[GATEKEEPER_REL_SEGMENT] = "segment",
	[GATEKEEPER_REL_MAIL_LIVE] = "mail_live",
	[GATEKEEPER_REL_MAIL_DUE] = "mail_due",
	[GATEKEEPER_REL_MAIL_LIVE_COUNT] = "mail_live_count",
	[GATEKEEPER_REL_GATE_SPACE] = "gate_space",
	[GATEKEEPER_REL_MAIL_0] = "mail_0",
	[GATEKEEPER_REL_MAIL_1] = "mail_1",
	[GATEKEEPER_REL_MAIL_2] = "mail_2",
	[GATEKEEPER_REL_MAIL_3] = "mail_3",
	[GATEKEEPER_REL_MAIL_DONE_0] = "mail_done_0",
	[GATEKEEPER_REL_MAIL_DONE_1] = "mail_done_1",
	[GATEKEEPER_REL_MAIL_DONE_2] = "mail_done_2",
	[GATEKEEPER_REL_MAIL_DONE_3] = "mail_done_3",
	[GATEKEEPER_REL_MAIL_CLAIM] = "mail_claim",
	[GATEKEEPER_REL_MAIL_CLAIM_IDS] = "mail_claim_ids",
	[GATEKEEPER_REL_MAIL_KEY] = "mail_key",
	[GATEKEEPER_REL_MAIL_RUN] = "mail_run",
	[GATEKEEPER_REL_MAIL_RUN_DUE] = "mail_run_due",
	[GATEKEEPER_REL_MAIL] = "mail",
	[GATEKEEPER_REL_MAIL_DONE] = "mail_done",
};

StaticAssertDecl(GATEKEEPER_REL_MAIL_DONE_0 - GATEKEEPER_REL_MAIL_0 == GATEKEEPER_SEGMENTS,
				 "one GatekeeperRel per segment's partition of gatekeeper.mail");
StaticAssertDecl(GATEKEEPER_NUM_RELS - GATEKEEPER_REL_MAIL_DONE_0 == GATEKEEPER_SEGMENTS,
				 "one GatekeeperRel per segment's partition of gatekeeper.mail_done");

/* the columns asked about, by GatekeeperColumn */
static const struct
{
	GatekeeperRel rel;
	const char *name;
}			column_names[GATEKEEPER_NUM_COLUMNS] = {
	[GATEKEEPER_COL_LIVE_COUNT_RETRYING] = {GATEKEEPER_REL_MAIL_LIVE_COUNT, "retrying"},
};

/* one table's cached OID */
typedef struct RelEntry
{
	Oid			relid;			/* InvalidOid: look it up */
	uint32		generation;		/* invalidations of the entry */
} RelEntry;

/* one column's cached number */
typedef struct ColumnEntry
{
	bool		valid;
	AttrNumber	attnum;			/* InvalidAttrNumber: the table has none */
} ColumnEntry;

static RelEntry rels[GATEKEEPER_NUM_RELS];
static ColumnEntry columns[GATEKEEPER_NUM_COLUMNS];
static bool callbacks_registered = false;

/*
 * Invalidations seen of relations and functions, by this transaction's own
 * commands or others' commits: the extension's version is read again after
 * any (see gatekeeper_schema).
 */
static uint64 catalog_changes = 0;

/* statements of gatekeeper_execute_by_key running now (nested: >1) */
static int	own_statements = 0;

static planner_hook_type prev_planner_hook = NULL;

PG_FUNCTION_INFO_V1(gatekeeper_own_statement);

static void relids_invalidate(Datum arg, Oid relid);
static void procs_invalidate(Datum arg, int cacheid, uint32 hashvalue);
static void register_callbacks(void);
static PlannedStmt *gatekeeper_planner(Query *parse, const char *query_string,
									   int cursorOptions, ParamListInfo boundParams);

/*
 * Forget the cached OIDs of the table relid names (every table's, when it
 * is InvalidOid), and the columns of those tables.
 */
static void
relids_invalidate(Datum arg, Oid relid)
{
	int			i;

	catalog_changes++;

	for (i = 0; i < GATEKEEPER_NUM_RELS; i++)
	{
		if (relid != InvalidOid && rels[i].relid != relid)
			continue;
		rels[i].relid = InvalidOid;
		rels[i].generation++;
	}
	for (i = 0; i < GATEKEEPER_NUM_COLUMNS; i++)
	{
		if (relid == InvalidOid || !OidIsValid(rels[column_names[i].rel].relid))
			columns[i].valid = false;
	}
}

/* Any function created, replaced or dropped: see gatekeeper_schema. */
static void
procs_invalidate(Datum arg, int cacheid, uint32 hashvalue)
{
	catalog_changes++;
}

/* The callbacks are registered at the first need, once per process. */
static void
register_callbacks(void)
{
	if (callbacks_registered)
		return;
	CacheRegisterRelcacheCallback(relids_invalidate, (Datum) 0);
	CacheRegisterSyscacheCallback(PROCOID, procs_invalidate, (Datum) 0);
	callbacks_registered = true;
}

/*
 * gatekeeper_relid
 *		The OID of one of the extension's tables (or indexes) in this
 *		database; InvalidOid when it is not there and missing_ok, else a
 *		can't-happen error.
 */
Oid
gatekeeper_relid(GatekeeperRel rel, bool missing_ok)
{
	RelEntry   *e = &rels[rel];

	register_callbacks();
	if (!OidIsValid(e->relid))
	{
		Oid			nsp = get_namespace_oid("gatekeeper", true);

		e->relid = OidIsValid(nsp) ? get_relname_relid(rel_names[rel], nsp) : InvalidOid;
	}
	if (!OidIsValid(e->relid) && !missing_ok)
		elog(ERROR, "table gatekeeper.%s is missing", rel_names[rel]);
	return e->relid;
}

/*
 * gatekeeper_relid_generation
 *		How many times the cached OID of rel was invalidated: what was read
 *		from the table under another number may be stale.
 */
uint32
gatekeeper_relid_generation(GatekeeperRel rel)
{
	return rels[rel].generation;
}

/*
 * gatekeeper_attnum
 *		The number of a column of one of the extension's tables, or
 *		InvalidAttrNumber when the table (or the column) is not there.
 */
AttrNumber
gatekeeper_attnum(GatekeeperColumn column)
{
	ColumnEntry *c = &columns[column];
	Oid			relid = gatekeeper_relid(column_names[column].rel, true);

	if (!OidIsValid(relid))
		return InvalidAttrNumber;
	if (!c->valid)
	{
		c->attnum = get_attnum(relid, column_names[column].name);
		c->valid = true;
	}
	return c->attnum;
}

/*
 * gatekeeper_plan
 *		The statement kept in *plan, prepared on first use for the life of
 *		the backend, with a generic plan: the statements of the claim and
 *		the gates are written to plan well without knowing their
 *		parameters, and planning them once matters on paths that run
 *		thousands of times a second.  Each is a file-level static named for
 *		its statement, its SQL text a static const char beside it.  A kept
 *		plan outlives DROP EXTENSION: the plan cache re-plans it by name
 *		when the objects it used change.
 */
SPIPlanPtr
gatekeeper_plan(SPIPlanPtr *plan, const char *sql, int nargs, Oid *argtypes)
{
	SPIPlanPtr	p;

	if (*plan != NULL)
		return *plan;
	p = SPI_prepare_cursor(sql, nargs, argtypes, CURSOR_OPT_GENERIC_PLAN);
	if (p == NULL)
		elog(ERROR, "SPI_prepare failed for \"%s\": %s", sql,
			 SPI_result_code_string(SPI_result));
	SPI_keepplan(p);
	*plan = p;
	return p;
}

/* every statement this process plans is gatekeeper's own (the worker) */
static bool own_session = false;

/*
 * gatekeeper_planner
 *		The planner hook, where gatekeeper's one planner policy lives.
 *
 * gatekeeper steers the planner in one way only: at plan time, for its own
 * statements, here.  No planner setting is changed while a statement runs
 * or for a session, and no C function carries a SET clause.  Planning is
 * where the settings act (JIT included: the planner decides whether a plan
 * is compiled), and a kept plan that an invalidation made stale is planned
 * again inside the statement's execution, through this hook, under the
 * same policy; a statement already planned pays nothing for it.
 *
 * - A statement run by key (gatekeeper_execute_by_key: the claim, the
 *   acks, the suppression lookup), with whatever its triggers plan, is
 *   planned with sequential scans, hash and merge joins and index-only
 *   scans off, and without JIT.  These statements are planned once,
 *   generically, and the first planning happens on a fresh install (or
 *   after a table was emptied), when the tables are nearly empty: the
 *   planner then rightly prefers a sequential scan or a hash join, and that
 *   plan would stay cached while the table grows to millions of rows, until
 *   an ANALYZE invalidates it; they are written as key lookups and get
 *   them.  Index-only scans are off because one keeps its leaf page pinned
 *   until the statement ends, which held VACUUM off mail_due's first leaf
 *   page under a few claimers (src/mail/claim.c, claim_fairly).  A statement
 *   touching one batch by index never repays compiling it.
 * - The background worker runs nothing but gatekeeper's statements, each
 *   touching a batch at most: every one it plans is planned without JIT.
 * - SQL-language functions are planned by PostgreSQL's SQL and PL/pgSQL
 *   executors on their own calls: the two that must keep to mail_live's
 *   indexes whatever its statistics say (_live_stats and _live_due, read
 *   by queue_stats) carry the same settings as SET clauses, PostgreSQL's
 *   way of giving a function settings.
 *
 * Nothing else in gatekeeper sets a planner setting; every kept plan is
 * prepared generic by gatekeeper_plan.  The hook is installed by
 * gatekeeper_planner_init, from _PG_init.
 */
static PlannedStmt *
gatekeeper_planner(Query *parse, const char *query_string, int cursorOptions,
				   ParamListInfo boundParams)
{
	PlannedStmt *result;
	int			nestlevel = -1;

	if (own_statements > 0 || own_session)
	{
		nestlevel = NewGUCNestLevel();
		(void) set_config_option("jit", "off", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
	}
	if (own_statements > 0)
	{
		(void) set_config_option("enable_seqscan", "off", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
		(void) set_config_option("enable_hashjoin", "off", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
		(void) set_config_option("enable_mergejoin", "off", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
		(void) set_config_option("enable_indexonlyscan", "off", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
	}

	if (prev_planner_hook)
		result = prev_planner_hook(parse, query_string, cursorOptions, boundParams);
	else
		result = standard_planner(parse, query_string, cursorOptions, boundParams);

	/* an error unwinds the nest level with its (sub)transaction */
	if (nestlevel >= 0)
		AtEOXact_GUC(true, nestlevel);
	return result;
}

/*
 * gatekeeper_planner_init
 *		Install gatekeeper_planner, in every process that loads the library.
 */
void
gatekeeper_planner_init(void)
{
	prev_planner_hook = planner_hook;
	planner_hook = gatekeeper_planner;
}

/*
 * gatekeeper_own_session
 *		Make every statement this process plans from now on gatekeeper's own,
 *		planned without JIT (see gatekeeper_planner): for the background
 *		worker, which runs nothing else.
 */
void
gatekeeper_own_session(void)
{
	own_session = true;
}

/*
 * gatekeeper_execute_by_key
 *		SPI_execute_plan for a statement that finds its rows by key (the
 *		primary key of gatekeeper.mail or gatekeeper.gate_pass), planned so
 *		that it always does (see gatekeeper_planner).
 */
int
gatekeeper_execute_by_key(SPIPlanPtr plan, Datum *values, const char *nulls,
						  bool read_only, long count)
{
	return gatekeeper_execute_by_key_into(plan, values, nulls, read_only, count, NULL);
}

/*
 * gatekeeper_execute_kept
 *		A statement kept in *plan (prepared from sql on first use, as
 *		gatekeeper_plan does), run by key with args (nulls as
 *		SPI_execute_plan takes them); returns SPI's result code.
 */
int
gatekeeper_execute_kept(SPIPlanPtr *plan, const char *sql, int nargs, Oid *types,
						Datum *args, const char *nulls, bool read_only)
{
	gatekeeper_plan(plan, sql, nargs, types);
	return gatekeeper_execute_by_key(*plan, args, nulls, read_only, 0);
}

/*
 * gatekeeper_execute_by_key_into
 *		The same, sending the rows the statement returns to dest (NULL:
 *		to SPI_tuptable, as SPI_execute_plan does).
 *
 * A receiver of its own lets a caller that copies the rows out anyway
 * take them from the executor's slots, without SPI forming each into a
 * tuple first (for a claim, a copy of every mail's content).
 */
int
gatekeeper_execute_by_key_into(SPIPlanPtr plan, Datum *values, const char *nulls,
							   bool read_only, long count, DestReceiver *dest)
{
	int			nargs = SPI_getargcount(plan);
	SPIExecuteOptions options;
	ParamListInfo params = NULL;
	int			ret;
	int			i;

	if (nargs > 0)
	{
		params = makeParamList(nargs);
		for (i = 0; i < nargs; i++)
		{
			ParamExternData *prm = &params->params[i];

			prm->value = values[i];
			prm->isnull = nulls != NULL && nulls[i] == 'n';
			prm->pflags = PARAM_FLAG_CONST;
			prm->ptype = SPI_getargtypeid(plan, i);
		}
	}
	memset(&options, 0, sizeof(options));
	options.params = params;
	options.read_only = read_only;
	options.tcount = count;
	options.dest = dest;

	own_statements++;
	PG_TRY();
	{
		ret = SPI_execute_plan_extended(plan, &options);
	}
	PG_FINALLY();
	{
		own_statements--;
	}
	PG_END_TRY();
	return ret;
}

/*
 * gatekeeper_writer
 *		Who writes the statement running now: gatekeeper's own code, a dump
 *		being loaded, or an application (or the owner, by hand).  The one way
 *		gatekeeper tells them apart, in C and, through _own_statement(), in
 *		its triggers' WHEN clauses.
 *
 * A dump being loaded comes first.  pg_dump --load-via-partition-root
 * loads the mail through gatekeeper.mail, where the insert trigger would
 * validate each row and give it a live row; but the queues' rows load
 * after the mail's, and the mail's own live rows and outcomes after that:
 * every mail of a queue but the default one would be refused, or made
 * live a second time.  A dump's loading is told by check_function_bodies
 * being off (pg_dump's scripts and pg_restore turn it off, for the same
 * reason: what is loaded was checked when it was made, and may refer to
 * what comes later) in a statement run by a role that may insert into
 * mail_live itself (as the role loading a dump of gatekeeper's tables
 * must; an application's role may not, and its rows are checked whatever
 * it sets), as the statement the client sent (COPY, or INSERT for a dump
 * made with --inserts): a call of enqueue() or anything else in a session
 * left so after loading a dump is mail as usual.  Its rows load as a dump
 * into the partitions does: unchecked (src/mail/mail.c), uncounted
 * (src/mail/mail_count.c), made live by the dump's own mail_live rows, which the
 * restore triggers merge with what is there.
 *
 * Otherwise gatekeeper writes when its C code runs the statement
 * (gatekeeper_execute_by_key) or when the statement runs inside a trigger
 * (gatekeeper's tables fire only gatekeeper's triggers: the insert trigger
 * of gatekeeper.mail writing live rows and keys, _mail_sync moving them):
 * those statements keep the live rows, keys and outcomes in step
 * themselves, so the restore triggers (mail_live_restore, mail_key_restore,
 * mail_done_restore) are not for them.  Every ack and every claim that
 * finishes mail is such a statement: mail_done_restore's DELETE, probing
 * mail_live for every outcome, cost about 4% of the drain.  In C a trigger
 * function asks about the statement that fired it only whether it is a
 * dump, which does not depend on the depth it asks from.
 */
GatekeeperWriter
gatekeeper_writer(void)
{
	if (!check_function_bodies && ActivePortal != NULL &&
		(ActivePortal->commandTag == CMDTAG_COPY ||
		 ActivePortal->commandTag == CMDTAG_INSERT))
	{
		Oid			live = gatekeeper_relid(GATEKEEPER_REL_MAIL_LIVE, true);

		if (OidIsValid(live) &&
			pg_class_aclcheck(live, GetOuterUserId(), ACL_INSERT) == ACLCHECK_OK)
			return GATEKEEPER_WRITER_DUMP;
	}
	if (own_statements > 0)
		return GATEKEEPER_WRITER_OWN;
	{
		LOCAL_FCINFO(depth_fcinfo, 0);

		InitFunctionCallInfoData(*depth_fcinfo, NULL, 0, InvalidOid, NULL, NULL);
		if (DatumGetInt32(pg_trigger_depth(depth_fcinfo)) > 0)
			return GATEKEEPER_WRITER_OWN;
	}
	return GATEKEEPER_WRITER_APPLICATION;
}

/*
 * gatekeeper_own_statement
 *		_own_statement(): whether gatekeeper writes the statement running now
 *		(gatekeeper_writer), for the WHEN clauses of the restore triggers,
 *		which ask it at the statement's own trigger depth.  Not settable
 *		from SQL.
 */
Datum
gatekeeper_own_statement(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(gatekeeper_writer() == GATEKEEPER_WRITER_OWN);
}

/*
 * The version of gatekeeper's SQL objects in this database, as the library
 * sees it.  The library serves one version of the schema, its own
 * (GATEKEEPER_VERSION, the control file's default_version, given by the
 * Makefile): in a database whose extension is older, every entry point
 * that reads or writes the extension's tables refuses with 0A000 and the
 * background worker waits, until ALTER EXTENSION gatekeeper UPDATE.  The
 * update scripts, 0.1.0's included, run with this library loaded and call
 * none of those entry points before their objects are the new version's
 * (PostgreSQL sets extversion to the target before it runs a step's
 * script).
 *
 * The version is pg_extension.extversion, read by name through its index.
 * pg_extension has no system cache, so nothing invalidates a copy of it
 * directly.  A copy is kept for the current transaction and read again
 * once any relation or function was invalidated, or any shared
 * invalidation message arrived: an ALTER EXTENSION's script creates or
 * replaces functions and tables, so the invalidations it makes reach this
 * backend at its own next command, or with the commit of another backend.
 * (An update whose script changed no function and no relation would go
 * unseen until the next transaction; such an update changes nothing the
 * library uses.)  Reading it once per command instead cost record_event,
 * whose event INSERT is a command of its own, 8% of each call.
 */
static struct
{
	LocalTransactionId lxid;
	uint64		changes;
	uint64		inval;
	GatekeeperSchema schema;
	char		version[NAMEDATALEN];
}			schema_seen;

/*
 * gatekeeper_schema
 *		Whether this database has the extension, at the library's version or
 *		another.  *version, when asked, is set to the extension's version
 *		("" without the extension); it is valid until the next call.
 */
GatekeeperSchema
gatekeeper_schema(const char **version)
{
	register_callbacks();
	if (schema_seen.lxid != MyProc->lxid || schema_seen.changes != catalog_changes ||
		schema_seen.inval != SharedInvalidMessageCounter)
	{
		Relation	rel;
		ScanKeyData key;
		SysScanDesc scan;
		HeapTuple	tuple;

		rel = table_open(ExtensionRelationId, AccessShareLock);
		ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber,
					F_NAMEEQ, CStringGetDatum("gatekeeper"));
		scan = systable_beginscan(rel, ExtensionNameIndexId, true, NULL, 1, &key);
		tuple = systable_getnext(scan);
		schema_seen.version[0] = '\0';
		schema_seen.schema = GATEKEEPER_SCHEMA_MISSING;
		if (HeapTupleIsValid(tuple))
		{
			bool		isnull;
			Datum		d = heap_getattr(tuple, Anum_pg_extension_extversion,
										 RelationGetDescr(rel), &isnull);

			if (!isnull)
				text_to_cstring_buffer(DatumGetTextPP(d), schema_seen.version,
									   sizeof(schema_seen.version));
			schema_seen.schema = strcmp(schema_seen.version, GATEKEEPER_VERSION) == 0 ?
				GATEKEEPER_SCHEMA_CURRENT : GATEKEEPER_SCHEMA_OTHER;
		}
		systable_endscan(scan);
		table_close(rel, AccessShareLock);
		/* after the lock: the messages it took in are reflected in the read */
		schema_seen.lxid = MyProc->lxid;
		schema_seen.changes = catalog_changes;
		schema_seen.inval = SharedInvalidMessageCounter;
	}
	if (version != NULL)
		*version = schema_seen.version;
	return schema_seen.schema;
}

/*
 * gatekeeper_report_schema
 *		Say at elevel that this database's extension is not the library's
 *		version (the worker's LOG, a function's ERROR: the same message).
 */
void
gatekeeper_report_schema(int elevel, const char *version)
{
	ereport(elevel,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("extension gatekeeper in database \"%s\" is version %s, but its library serves %s",
					get_database_name(MyDatabaseId), version, GATEKEEPER_VERSION),
			 elevel >= ERROR ?
			 errdetail("The library no longer has the code of version %s's functions.", version) :
			 errdetail("The gatekeeper worker delivers no mail in this database until then."),
			 errhint("Run ALTER EXTENSION gatekeeper UPDATE.")));
}

/*
 * gatekeeper_gone
 *		Refuse (0A000) the call of a C function whose SQL function an older
 *		version created and the library's version has no more.  Its symbol
 *		stays, for CREATE FUNCTION of a C function fails when the library
 *		lacks it, so an older version could neither be installed nor
 *		updated; this call is its whole body.
 */
void
gatekeeper_gone(const char *version, const char *name)
{
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("gatekeeper %s's %s is gone; ALTER EXTENSION gatekeeper UPDATE",
					version, name)));
	pg_unreachable();
}

/*
 * gatekeeper_require_schema
 *		Refuse (0A000) unless this database's extension is the library's
 *		version: the first call of every SQL entry point that reads or
 *		writes the extension's tables.
 */
void
gatekeeper_require_schema(void)
{
	const char *version;

	if (gatekeeper_schema(&version) == GATEKEEPER_SCHEMA_OTHER)
		gatekeeper_report_schema(ERROR, version);
}

/*
 * gatekeeper_array
 *		A one-dimensional array of n elements of a built-in type, for an SPI
 *		argument.  nulls may be NULL when no element is null.
 */
Datum
gatekeeper_array(Datum *elems, bool *nulls, int n, Oid elemtype)
{
	int16		typlen;
	bool		typbyval;
	char		typalign;
	int			dims[1];
	int			lbs[1] = {1};

	if (n == 0)
		return PointerGetDatum(construct_empty_array(elemtype));
	get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
	dims[0] = n;
	return PointerGetDatum(construct_md_array(elems, nulls, 1, dims, lbs,
											  elemtype, typlen, typbyval, typalign));
}

/*
 * gatekeeper_spi_ids
 *		The bigint first column of every row the last SPI statement
 *		returned (SPI_tuptable), copied into an array allocated in cxt;
 *		*n their count.  Returns NULL when there are none.
 */
int64 *
gatekeeper_spi_ids(MemoryContext cxt, int *n)
{
	int64	   *ids = NULL;
	uint64		i;

	*n = (int) SPI_processed;
	if (SPI_processed == 0)
		return NULL;
	ids = MemoryContextAlloc(cxt, SPI_processed * sizeof(int64));
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;

		ids[i] = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i],
											 SPI_tuptable->tupdesc, 1, &isnull));
	}
	return ids;
}


/*
 * Whether a trigger fires in this session, as the executor decides it.
 */
static bool
trigger_fires_now(const Trigger *t)
{
	switch (t->tgenabled)
	{
		case TRIGGER_FIRES_ALWAYS:
			return true;
		case TRIGGER_FIRES_ON_ORIGIN:
			return SessionReplicationRole != SESSION_REPLICATION_ROLE_REPLICA;
		case TRIGGER_FIRES_ON_REPLICA:
			return SessionReplicationRole == SESSION_REPLICATION_ROLE_REPLICA;
		default:
			return false;
	}
}

/*
 * gatekeeper_run_as
 *		Run as userid (InvalidOid: the current user), with sec_flags added
 *		to the security context and, when config is not NULL, its settings
 *		(name=value, as pg_proc.proconfig holds them) in a GUC nest level
 *		of their own: fmgr_security_definer's steps, for work done as a
 *		SECURITY DEFINER function or a table's owner would do it.  Until
 *		gatekeeper_run_as_end; an error on the way is undone by the abort.
 */
void
gatekeeper_run_as(GatekeeperRunAs *r, Oid userid, int sec_flags, ArrayType *config)
{
	GetUserIdAndSecContext(&r->save_userid, &r->save_sec_context);
	if (OidIsValid(userid))
		SetUserIdAndSecContext(userid, r->save_sec_context | sec_flags);
	r->nestlevel = -1;
	if (config != NULL)
	{
		r->nestlevel = NewGUCNestLevel();
		ProcessGUCArray(config, superuser() ? PGC_SUSET : PGC_USERSET,
						PGC_S_SESSION, GUC_ACTION_SAVE);
	}
}

/*
 * gatekeeper_run_as_end
 *		Back to what gatekeeper_run_as replaced.
 */
void
gatekeeper_run_as_end(GatekeeperRunAs *r)
{
	if (r->nestlevel >= 0)
		AtEOXact_GUC(true, r->nestlevel);
	SetUserIdAndSecContext(r->save_userid, r->save_sec_context);
}

/*
 * gatekeeper_trigger_firing
 *		rel's trigger named name when it would fire now, else NULL.
 */
const Trigger *
gatekeeper_trigger_firing(Relation rel, const char *name)
{
	TriggerDesc *td = rel->trigdesc;
	int			i;

	for (i = 0; td != NULL && i < td->numtriggers; i++)
		if (strcmp(td->triggers[i].tgname, name) == 0)
			return trigger_fires_now(&td->triggers[i]) ? &td->triggers[i] : NULL;
	return NULL;
}

/*
 * gatekeeper_triggers_only
 *		Whether every trigger of rel that would fire now for event
 *		(TRIGGER_TYPE_INSERT or TRIGGER_TYPE_DELETE) is one of the nnames
 *		named, gatekeeper's own; *found gets bit i set when names[i] is
 *		among them.  A writer that works past the executor (src/mail/live_writer.c,
 *		claim_take.c, done_writer.c) asks this first: it may write only
 *		when the statement it stands for would fire no trigger it does not
 *		do the work of itself.
 */
bool
gatekeeper_triggers_only(Relation rel, int event, const char *const *names, int nnames,
						 uint32 *found)
{
	TriggerDesc *td = rel->trigdesc;
	int			i;
	int			k;

	*found = 0;
	if (td == NULL)
		return true;
	for (i = 0; i < td->numtriggers; i++)
	{
		Trigger    *t = &td->triggers[i];

		if ((t->tgtype & event) == 0 || !trigger_fires_now(t))
			continue;
		for (k = 0; k < nnames; k++)
			if (strcmp(t->tgname, names[k]) == 0)
				break;
		if (k == nnames)
			return false;
		*found |= (uint32) 1 << k;
	}
	return true;
}
