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

#include "access/table.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/namespace.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_authid.h"
#include "commands/copy.h"
#include "commands/copyfrom_internal.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "parser/parse_node.h"
#include "parser/parse_relation.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/rls.h"

static ProcessUtility_hook_type prev_process_utility = NULL;

static void gatekeeper_process_utility(PlannedStmt *pstmt, const char *queryString,
									   bool readOnlyTree, ProcessUtilityContext context,
									   ParamListInfo params, QueryEnvironment *queryEnv,
									   DestReceiver *dest, QueryCompletion *qc);
static bool copy_target(CopyStmt *stmt, Relation *mail, Relation *part);
static bool may_copy_into(Relation mail, CopyStmt *stmt, Relation part);
static uint64 copy_into(Relation mail, Relation part, CopyStmt *stmt,
						const char *queryString, QueryEnvironment *queryEnv);

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
	volatile uint64 processed = 0;

	pstate->p_sourcetext = queryString;
	pstate->p_queryEnv = queryEnv;
	nsitem = addRangeTableEntryForRelation(pstate, part, RowExclusiveLock,
										   NULL, false, false);
	nsitem->p_rte->requiredPerms = ACL_INSERT;

	cstate = BeginCopyFrom(pstate, part, NULL, stmt->filename, stmt->is_program,
						   NULL, stmt->attlist, stmt->options);
	/* the error context names the table the statement named */
	cstate->cur_relname = RelationGetRelationName(mail);
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
	EndCopyFrom(cstate);
	free_parsestate(pstate);
	return processed;
}
