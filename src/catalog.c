/*-------------------------------------------------------------------------
 *
 * catalog.c
 *		SPI and catalog helpers: the OIDs of the extension's tables, cached
 *		behind one relcache invalidation callback; kept plans; statements
 *		run by key; dump detection; arrays for SPI arguments; and the check
 *		of the extension's version against the library's.
 *
 * The OIDs of the extension's tables are looked up by name the first time
 * a backend asks for one and kept until a relcache invalidation names the
 * table (it was dropped, truncated, altered) or names none (the whole
 * cache was reset); a table that is not there is looked up again at every
 * call, so CREATE EXTENSION needs no invalidation to be seen.  Each table's
 * entry counts its invalidations, so that a module that keeps something
 * read from a table (gate_log.c's nonce) knows when to read it again.  The
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
#include "commands/dbcommands.h"
#include "fmgr.h"
#include "miscadmin.h"
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

/* the tables' names, by GatekeeperRel */
static const char *const rel_names[GATEKEEPER_NUM_RELS] = {
	[GATEKEEPER_REL_QUEUE] = "queue",
	[GATEKEEPER_REL_SEGMENT] = "segment",
	[GATEKEEPER_REL_MAIL_LIVE] = "mail_live",
	[GATEKEEPER_REL_MAIL_DUE] = "mail_due",
	[GATEKEEPER_REL_MAIL_LIVE_COUNT] = "mail_live_count",
	[GATEKEEPER_REL_GATE_SPACE] = "gate_space",
};

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
static bool relcache_callback_registered = false;

/* statements of gatekeeper_execute_by_key running now (nested: >1) */
static int	own_statements = 0;

PG_FUNCTION_INFO_V1(gatekeeper_own_statement);

static void relids_invalidate(Datum arg, Oid relid);

/*
 * Forget the cached OIDs of the table relid names (every table's, when it
 * is InvalidOid), and the columns of those tables.
 */
static void
relids_invalidate(Datum arg, Oid relid)
{
	int			i;

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

	if (!relcache_callback_registered)
	{
		CacheRegisterRelcacheCallback(relids_invalidate, (Datum) 0);
		relcache_callback_registered = true;
	}
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

/*
 * gatekeeper_execute_by_key
 *		SPI_execute_plan for a statement that finds its rows by key (the
 *		primary key of gatekeeper.mail or gatekeeper.gate_pass), planned so
 *		that it always does.
 *
 * These statements are planned once, generically, and the first planning
 * happens on a fresh install, when the tables are nearly empty: the
 * planner then rightly prefers a sequential scan or a hash join, and that
 * plan stays cached while the table grows to millions of rows, until an
 * ANALYZE invalidates it.  Sequential scans and hash and merge joins are
 * therefore off while these statements run (and are planned), leaving the
 * key lookups they are written for.
 */
int
gatekeeper_execute_by_key(SPIPlanPtr plan, Datum *values, const char *nulls,
						  bool read_only, long count)
{
	return gatekeeper_execute_by_key_into(plan, values, nulls, read_only, count, NULL);
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
	int			nestlevel = NewGUCNestLevel();
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

	(void) set_config_option("enable_seqscan", "off", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	(void) set_config_option("enable_hashjoin", "off", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	(void) set_config_option("enable_mergejoin", "off", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
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
	AtEOXact_GUC(true, nestlevel);
	return ret;
}

/*
 * gatekeeper_own_statement
 *		_own_statement(): whether the statement running now is one of
 *		gatekeeper's own, run by gatekeeper_execute_by_key.
 *
 * Those statements move a finished mail's live row to mail_done
 * themselves, so mail_done_restore (which removes the live rows of
 * outcomes a restore loads) has nothing to do after them; its WHEN clause
 * asks this, once per statement.  Every ack and every claim that finishes
 * mail is such a statement: the trigger's DELETE, probing mail_live for
 * every outcome, cost about 4% of the drain.  Not settable from SQL.
 */
Datum
gatekeeper_own_statement(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(own_statements > 0);
}

/*
 * gatekeeper_loading_dump
 *		Whether the rows a statement inserts into gatekeeper's tables (rel is
 *		one of them) are a dump being loaded, to be taken as they were.
 *
 * pg_dump --load-via-partition-root loads the mail through
 * gatekeeper.mail, where the insert trigger would validate each row and
 * give it a live row; but the queues' rows load after the mail's, and the
 * mail's own live rows and outcomes after that: every mail of a queue but
 * the default one would be refused, or made live a second time.  A
 * dump's loading is told by check_function_bodies being off (pg_dump's
 * scripts and pg_restore turn it off, for the same reason: what is loaded
 * was checked when it was made, and may refer to what comes later) in a
 * statement run by a role that may insert into mail_live itself (as the
 * role loading a dump of gatekeeper's tables must; an application's role
 * may not, and its rows are checked whatever it sets), as the statement
 * the client sent (COPY, or INSERT for a dump made with --inserts): a
 * call of enqueue() or anything else in a session left so after loading a
 * dump is mail as usual.  The rows then load as a dump into the
 * partitions does: unchecked, uncounted, made live by the dump's own
 * mail_live rows.
 */
bool
gatekeeper_loading_dump(Relation rel)
{
	Oid			live;

	if (check_function_bodies)
		return false;
	if (ActivePortal == NULL ||
		(ActivePortal->commandTag != CMDTAG_COPY &&
		 ActivePortal->commandTag != CMDTAG_INSERT))
		return false;
	live = gatekeeper_relid(GATEKEEPER_REL_MAIL_LIVE, true);
	return OidIsValid(live) &&
		pg_class_aclcheck(live, GetOuterUserId(), ACL_INSERT) == ACLCHECK_OK;
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
 * pg_extension has no system cache, so nothing invalidates a copy: it is
 * kept for the current command of the current transaction, and read again
 * once any invalidation message arrived (another backend's committed
 * ALTER EXTENSION, whose script changes pg_proc and pg_class, sends them).
 * A transaction's own ALTER EXTENSION ends its command.
 */
static struct
{
	LocalTransactionId lxid;
	CommandId	cid;
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
	CommandId	cid = GetCurrentCommandId(false);

	if (schema_seen.lxid != MyProc->lxid || schema_seen.cid != cid ||
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
		schema_seen.cid = cid;
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

