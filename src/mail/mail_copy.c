/*-------------------------------------------------------------------------
 *
 * mail_copy.c
 *		COPY FROM into gatekeeper.mail, written straight into the current
 *		retention segment's partition.
 *
 * PostgreSQL 15 does not batch the rows of a COPY into a partitioned table
 * whose insert trigger has a transition table (copyfrom.c takes
 * CIM_SINGLE: "for partitioned tables we can't support multi-inserts when
 * there are any statement level insert triggers"), and gatekeeper.mail is
 * such a table: every row was routed to its partition and written by a
 * heap_insert of its own, with its own WAL record, and its segment was its
 * column default, evaluated row by row.  Yet every row of a COPY that
 * leaves segment to its default goes to one partition: the default is the
 * segment this transaction reads (gatekeeper_current_segment), the same
 * for each row.  Each partition has the parent's insert trigger
 * (mail_check_insert, with its transition table) and the parent's
 * defaults, its own segment's constant among them, so a COPY into the
 * partition does what the COPY into gatekeeper.mail would, with
 * PostgreSQL's own CopyFrom batching the rows (docs/internals.md, "Bulk enqueue").
 *
 * The ProcessUtility hook takes a COPY FROM naming gatekeeper.mail only
 * when nothing it would run differs: no column list naming segment, no
 * WHERE clause, no FREEZE, no trigger on either table but gatekeeper's,
 * no row-level security, and the checks PostgreSQL's DoCopy makes, made
 * on gatekeeper.mail, would pass (the role's privileges on the table and
 * on the sequence the partition's id default draws from, the role needed
 * to read a server file or run a program, a transaction that may write).
 * It then does what DoCopy does for COPY FROM, on the partition, with
 * gatekeeper.mail's name in the error context.  Anything else is left to
 * PostgreSQL, which refuses what it refuses with its own errors.  When
 * another library's ProcessUtility hook was installed before this one (it
 * would run after it), every COPY is left to that hook, so that no other
 * library's work on the statement (auditing, statistics) is passed over.
 *
 * Rows taken in as they are read.  The partition's insert trigger sees
 * the statement's rows in a transition table: every row written to a
 * tuplestore that spills past work_mem to a temporary file as large as
 * the COPY, and read back after it (a tenth of a bulk COPY's time:
 * docs/internals.md, "Bulk enqueue").  So when the rows need none of the
 * trigger's statements over that table (no dedupe keys, no ids given:
 * gatekeeper_mail_intake_begin says), this file runs CopyFrom's loop
 * itself (copy_rows): each row parsed and its constraints checked, and
 * every batch checked as the trigger checks its rows, as the trigger's
 * function runs (its owner, its settings), before it is written with
 * table_multi_insert() and its index entries, the recipient's hash index
 * entries held back and inserted in bucket order (mail_exec_hold_hash).
 * The trigger does not fire.
 * Anything else goes through CopyFrom and the trigger.
 *
 * IDENTIFICATION
 *		src/mail_copy.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "mail_copy.h"
#include "gatekeeper.h"
#include "catalog.h"
#include "mail.h"

#include "mail_exec.h"

#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_trigger.h"
#include "commands/copy.h"
#include "commands/copyfrom_internal.h"
#include "commands/progress.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "parser/parse_node.h"
#include "parser/parse_relation.h"
#include "pgstat.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/syscache.h"

/* CopyFrom's batch: at most so many rows, or so many bytes of input */
#define COPY_BATCH_ROWS		1000
#define COPY_BATCH_BYTES	65535

/* the rows of a COPY read and not written yet, and where they go */
typedef struct CopyBatch
{
	MailExec	x;				/* the partition */
	BulkInsertState bistate;
	TupleTableSlot *slots[COPY_BATCH_ROWS];
	uint64		linenos[COPY_BATCH_ROWS];	/* each row's line of input */
	int			n;				/* rows in slots */
	int			nmade;			/* slots made */
} CopyBatch;

/*
 * How the partition's insert trigger function runs, and what it replaced
 * while this file runs its work: its owner when it is SECURITY DEFINER,
 * its SET clauses.
 */
typedef struct AsTrigger
{
	Oid			userid;			/* InvalidOid: the caller's */
	ArrayType  *config;			/* NULL: none */
	GatekeeperRunAs run;
} AsTrigger;

static ProcessUtility_hook_type prev_process_utility = NULL;

static void gatekeeper_process_utility(PlannedStmt *pstmt, const char *queryString,
									   bool readOnlyTree, ProcessUtilityContext context,
									   ParamListInfo params, QueryEnvironment *queryEnv,
									   DestReceiver *dest, QueryCompletion *qc);
static bool copy_target(CopyStmt *stmt, Relation *mail, Relation *part);
static bool may_copy_into(Relation mail, CopyStmt *stmt, Relation part);
static uint64 copy_into(Relation mail, Relation part, CopyStmt *stmt,
						const char *queryString, QueryEnvironment *queryEnv);
static uint64 copy_by_trigger(CopyFromState cstate, Relation part);
static bool trigger_fires_as(Relation part, AsTrigger *t);
static void as_trigger_enter(AsTrigger *t);
static void as_trigger_leave(AsTrigger *t);
static uint64 copy_rows(CopyFromState cstate, Relation part, MailIntake *intake,
						AsTrigger *t);
static uint64 copy_flush(CopyFromState cstate, CopyBatch *batch, MailIntake *intake,
						 AsTrigger *t);

/* the insert trigger, on gatekeeper.mail and on each of its partitions */
static const char *const mail_insert_trigger[] = {"mail_check_insert"};

/*
 * gatekeeper_mail_copy_init
 *		Install the hook, in every process that loads the library.
 */
void
gatekeeper_mail_copy_init(void)
{
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = gatekeeper_process_utility;
}

/*
 * A COPY FROM into gatekeeper.mail that copy_target lets through is run
 * into its partition; every other statement goes on as it came.
 */
static void
gatekeeper_process_utility(PlannedStmt *pstmt, const char *queryString,
						   bool readOnlyTree, ProcessUtilityContext context,
						   ParamListInfo params, QueryEnvironment *queryEnv,
						   DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *parsetree = pstmt->utilityStmt;

	if (prev_process_utility == NULL && IsA(parsetree, CopyStmt))
	{
		CopyStmt   *stmt = (CopyStmt *) parsetree;
		Relation	mail;
		Relation	part;

		if (copy_target(stmt, &mail, &part))
		{
			uint64		processed = copy_into(mail, part, stmt, queryString, queryEnv);

			table_close(part, NoLock);
			table_close(mail, NoLock);
			if (qc)
				SetQueryCompletion(qc, CMDTAG_COPY, processed);
			return;
		}
	}

	if (prev_process_utility)
		prev_process_utility(pstmt, queryString, readOnlyTree, context,
							 params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);
}

/*
 * Whether a COPY FROM is one into gatekeeper.mail to be written into the
 * current segment's partition; if so, *mail and *part are the two tables,
 * opened and locked as the COPY locks them.  A table the statement names
 * stays locked either way, as DoCopy would have locked it.
 */
static bool
copy_target(CopyStmt *stmt, Relation *mail, Relation *part)
{
	Oid			mail_relid;
	Oid			part_relid;

	if (!stmt->is_from || stmt->relation == NULL || stmt->whereClause != NULL ||
		strcmp(stmt->relation->relname, "mail") != 0 ||
		IsBinaryUpgrade || RecoveryInProgress() || XactReadOnly || IsInParallelMode())
		return false;
	mail_relid = gatekeeper_relid(GATEKEEPER_REL_MAIL, true);
	if (!OidIsValid(mail_relid) ||
		gatekeeper_schema(NULL) != GATEKEEPER_SCHEMA_CURRENT ||
		RangeVarGetRelid(stmt->relation, RowExclusiveLock, true) != mail_relid)
		return false;
	part_relid = gatekeeper_relid(GATEKEEPER_REL_MAIL_PART(gatekeeper_current_segment(false)),
								  true);
	if (!OidIsValid(part_relid))
		return false;

	*mail = table_open(mail_relid, NoLock);
	*part = table_open(part_relid, RowExclusiveLock);
	if (may_copy_into(*mail, stmt, *part))
		return true;
	table_close(*part, NoLock);
	table_close(*mail, NoLock);
	return false;
}

/*
 * Whether the COPY into gatekeeper.mail (mail) may be run into part: it
 * would do the same there, and DoCopy's checks of it would pass.
 */
static bool
may_copy_into(Relation mail, CopyStmt *stmt, Relation part)
{
	TupleDesc	desc = RelationGetDescr(mail);
	AttrNumber	segment_att = get_attnum(RelationGetRelid(mail), "segment");
	AttrNumber	id_att = get_attnum(RelationGetRelid(mail), "id");
	RangeTblEntry *rte;
	List	   *attnums;
	ListCell   *lc;
	uint32		found;
	bool		given_id = false;
	Oid			seq;

	/*
	 * The partition has the defaults of its own that rows routed through
	 * mail take from mail's: id and segment.
	 */
	if (segment_att <= 0 || id_att <= 0 ||
		get_attnum(RelationGetRelid(part), "segment") != segment_att ||
		get_attnum(RelationGetRelid(part), "id") != id_att ||
		!TupleDescAttr(RelationGetDescr(part), segment_att - 1)->atthasdef ||
		!TupleDescAttr(RelationGetDescr(part), id_att - 1)->atthasdef)
		return false;

	/* no trigger but gatekeeper's: the partition's insert trigger is there */
	if (!gatekeeper_triggers_only(mail, TRIGGER_TYPE_INSERT, mail_insert_trigger,
								  lengthof(mail_insert_trigger), &found) ||
		!gatekeeper_triggers_only(part, TRIGGER_TYPE_INSERT, mail_insert_trigger,
								  lengthof(mail_insert_trigger), &found) ||
		found == 0)
		return false;

	/*
	 * FREEZE: refused for a partitioned table, but not for a partition
	 * made in this transaction.
	 */
	foreach(lc, stmt->options)
	{
		DefElem    *option = lfirst_node(DefElem, lc);

		if (strcmp(option->defname, "freeze") == 0)
			return false;
	}

	/* the reading of a server file or program: DoCopy's roles */
	if (stmt->filename != NULL &&
		!has_privs_of_role(GetUserId(), stmt->is_program ?
						   ROLE_PG_EXECUTE_SERVER_PROGRAM : ROLE_PG_READ_SERVER_FILES))
		return false;

	/* the columns given (an unknown one is an error, as in DoCopy) */
	rte = makeNode(RangeTblEntry);
	rte->rtekind = RTE_RELATION;
	rte->relid = RelationGetRelid(mail);
	rte->relkind = mail->rd_rel->relkind;
	rte->rellockmode = RowExclusiveLock;
	rte->requiredPerms = ACL_INSERT;
	attnums = CopyGetAttnums(desc, mail, stmt->attlist);
	foreach(lc, attnums)
	{
		AttrNumber	attnum = lfirst_int(lc);

		if (attnum == segment_att)
			return false;
		if (attnum == id_att)
			given_id = true;
		rte->insertedCols = bms_add_member(rte->insertedCols,
										   attnum - FirstLowInvalidHeapAttributeNumber);
	}

	/* the role's privileges on gatekeeper.mail, and no row security */
	if (!ExecCheckRTPerms(list_make1(rte), false) ||
		check_enable_rls(RelationGetRelid(mail), InvalidOid, true) == RLS_ENABLED ||
		check_enable_rls(RelationGetRelid(part), InvalidOid, true) == RLS_ENABLED)
		return false;

	/*
	 * The partition's id default is nextval() of gatekeeper.mail's
	 * sequence (a partition has no identity in PostgreSQL 15), which
	 * checks the role's privilege on it; the identity does not.
	 */
	if (!given_id)
	{
		seq = getIdentitySequence(RelationGetRelid(mail), id_att, true);
		if (!OidIsValid(seq) ||
			pg_class_aclcheck(seq, GetUserId(), ACL_USAGE | ACL_UPDATE) != ACLCHECK_OK)
			return false;
	}
	return true;
}

/*
 * DoCopy's COPY FROM a table, into part, the privileges already checked
 * on mail: the number of rows copied.
 */
static uint64
copy_into(Relation mail, Relation part, CopyStmt *stmt, const char *queryString,
		  QueryEnvironment *queryEnv)
{
	ParseState *pstate = make_parsestate(NULL);
	ParseNamespaceItem *nsitem;
	CopyFromState cstate;
	uint64		processed;
	AsTrigger	as_trigger;
	MailIntake *intake = NULL;

	pstate->p_sourcetext = queryString;
	pstate->p_queryEnv = queryEnv;
	nsitem = addRangeTableEntryForRelation(pstate, part, RowExclusiveLock,
										   NULL, false, false);
	nsitem->p_rte->requiredPerms = ACL_INSERT;

	cstate = BeginCopyFrom(pstate, part, NULL, stmt->filename, stmt->is_program,
						   NULL, stmt->attlist, stmt->options);
	/* the error context names the table the statement named */
	cstate->cur_relname = RelationGetRelationName(mail);

	/*
	 * The rows taken in as they are read, unless CopyFrom would write them
	 * one by one (a volatile default) or compute columns, or the trigger's
	 * statements must see them.
	 */
	if (!cstate->volatile_defexprs &&
		!(RelationGetDescr(part)->constr != NULL &&
		  RelationGetDescr(part)->constr->has_generated_stored) &&
		trigger_fires_as(part, &as_trigger))
	{
		as_trigger_enter(&as_trigger);
		intake = gatekeeper_mail_intake_begin(part, cstate->attnumlist);
		as_trigger_leave(&as_trigger);
	}
	if (intake != NULL)
		processed = copy_rows(cstate, part, intake, &as_trigger);
	else
		processed = copy_by_trigger(cstate, part);
	EndCopyFrom(cstate);
	free_parsestate(pstate);
	return processed;
}

/*
 * CopyFrom into the partition, whose insert trigger checks the rows it
 * writes (gatekeeper_mail_copying_into).
 */
static uint64
copy_by_trigger(CopyFromState cstate, Relation part)
{
	volatile uint64 processed = 0;

	gatekeeper_mail_copying_into(RelationGetRelid(part));
	PG_TRY();
	{
		processed = CopyFrom(cstate);
	}
	PG_FINALLY();
	{
		gatekeeper_mail_copying_into(InvalidOid);
	}
	PG_END_TRY();
	return processed;
}

/*
 * Whether the partition's insert trigger fires for this session (it is
 * enabled for its session_replication_role, as TriggerEnabled decides);
 * if so, *t says how its function runs.
 */
static bool
trigger_fires_as(Relation part, AsTrigger *t)
{
	const Trigger *trigger = gatekeeper_trigger_firing(part, mail_insert_trigger[0]);
	HeapTuple	tuple;
	Form_pg_proc proc;
	Datum		config;
	bool		isnull;

	if (trigger == NULL)
		return false;
	tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(trigger->tgfoid));
	if (!HeapTupleIsValid(tuple))
		return false;
	proc = (Form_pg_proc) GETSTRUCT(tuple);
	t->userid = proc->prosecdef ? proc->proowner : InvalidOid;
	config = SysCacheGetAttr(PROCOID, tuple, Anum_pg_proc_proconfig, &isnull);
	t->config = isnull ? NULL : DatumGetArrayTypePCopy(config);
	ReleaseSysCache(tuple);
	return true;
}

/* become what the trigger's function runs as, and back */
static void
as_trigger_enter(AsTrigger *t)
{
	gatekeeper_run_as(&t->run, t->userid, SECURITY_LOCAL_USERID_CHANGE, t->config);
}

static void
as_trigger_leave(AsTrigger *t)
{
	gatekeeper_run_as_end(&t->run);
}

/*
 * CopyFrom's loop for rows taken in as they are read: each row parsed,
 * given its defaults and checked against the partition's constraints in
 * the COPY's error context (its line); every batch then handed to
 * copy_flush.  Returns the number of rows.
 */
static uint64
copy_rows(CopyFromState cstate, Relation part, MailIntake *intake, AsTrigger *t)
{
	EState	   *estate = mail_exec_estate(GetCurrentCommandId(true));
	ExprContext *econtext = GetPerTupleExprContext(estate);
	CopyBatch  *batch = palloc0(sizeof(CopyBatch));
	ErrorContextCallback errcallback;
	uint64		processed = 0;
	int			bytes = 0;
	int			i;

	mail_exec_open_in(&batch->x, part, estate);
	/* the recipient's hash entries go in by bucket, work_mem at a time */
	mail_exec_hold_hash(&batch->x, (Size) work_mem * 1024);
	batch->bistate = GetBulkInsertState();
	errcallback.callback = CopyFromErrorCallback;
	errcallback.arg = cstate;
	errcallback.previous = error_context_stack;
	error_context_stack = &errcallback;
	for (;;)
	{
		TupleTableSlot *slot;
		MemoryContext old;
		bool		more;

		CHECK_FOR_INTERRUPTS();
		ResetPerTupleExprContext(estate);
		if (batch->n == batch->nmade)
			batch->slots[batch->nmade++] = table_slot_create(part, NULL);
		slot = batch->slots[batch->n];
		ExecClearTuple(slot);
		old = MemoryContextSwitchTo(GetPerTupleMemoryContext(estate));
		more = NextCopyFrom(cstate, econtext, slot->tts_values, slot->tts_isnull);
		MemoryContextSwitchTo(old);
		if (!more)
			break;
		ExecStoreVirtualTuple(slot);
		slot->tts_tableOid = RelationGetRelid(part);
		mail_exec_check(&batch->x, slot);
		(void) ExecPartitionCheck(batch->x.rri, slot, estate, true);
		/* kept past the per-row memory its values were read into */
		ExecMaterializeSlot(slot);
		batch->linenos[batch->n] = cstate->cur_lineno;
		bytes += cstate->line_buf.len;
		if (++batch->n == COPY_BATCH_ROWS || bytes >= COPY_BATCH_BYTES)
		{
			processed += copy_flush(cstate, batch, intake, t);
			pgstat_progress_update_param(PROGRESS_COPY_TUPLES_PROCESSED, processed);
			bytes = 0;
		}
	}
	processed += copy_flush(cstate, batch, intake, t);
	mail_exec_index_held(&batch->x);
	pgstat_progress_update_param(PROGRESS_COPY_TUPLES_PROCESSED, processed);
	error_context_stack = errcallback.previous;

	as_trigger_enter(t);
	gatekeeper_mail_intake_end(intake);
	as_trigger_leave(t);

	for (i = 0; i < batch->nmade; i++)
		ExecDropSingleTupleTableSlot(batch->slots[i]);
	FreeBulkInsertState(batch->bistate);
	table_finish_bulk_insert(part, 0);
	mail_exec_close(&batch->x);
	FreeExecutorState(estate);
	pfree(batch);
	return processed;
}

/*
 * A batch of the COPY's rows: checked as the trigger checks its rows, as
 * its function runs and in its error context (the row of the statement,
 * not a line), and their live rows written; then inserted at once, with
 * their index entries, as CopyFrom's flush inserts them (an index entry's
 * error names its row's line).  Returns how many rows there were.
 */
static uint64
copy_flush(CopyFromState cstate, CopyBatch *batch, MailIntake *intake, AsTrigger *t)
{
	ErrorContextCallback *copy_context = error_context_stack;
	bool		line_buf_valid = cstate->line_buf_valid;
	uint64		lineno = cstate->cur_lineno;
	int			n = batch->n;
	MemoryContext old;
	int			i;

	if (n == 0)
		return 0;
	error_context_stack = copy_context->previous;
	as_trigger_enter(t);
	gatekeeper_mail_intake_rows(intake, batch->slots, n);
	as_trigger_leave(t);
	error_context_stack = copy_context;

	cstate->line_buf_valid = false;
	old = MemoryContextSwitchTo(GetPerTupleMemoryContext(batch->x.estate));
	mail_exec_insert_heap(&batch->x, batch->slots, n, batch->bistate);
	MemoryContextSwitchTo(old);
	for (i = 0; i < n; i++)
	{
		cstate->cur_lineno = batch->linenos[i];
		mail_exec_index(&batch->x, batch->slots[i], false);
		ExecClearTuple(batch->slots[i]);
	}
	cstate->line_buf_valid = line_buf_valid;
	cstate->cur_lineno = lineno;
	batch->n = 0;
	return n;
}
