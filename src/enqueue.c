/*-------------------------------------------------------------------------
 *
 * enqueue.c
 *		gatekeeper.enqueue(): the enqueue, with its errors as an
 *		application should see them.
 *
 * The enqueue itself (dedupe keys and all) is PL/pgSQL,
 * gatekeeper._enqueue().  An error raised inside it, a missing queue found
 * by the insert trigger of gatekeeper.mail say, would reach the
 * application with the context gatekeeper's own code adds: the row of the
 * insert, its SQL text, the lines of _enqueue.  enqueue() calls _enqueue
 * directly and raises any error of it again from here, with its SQLSTATE,
 * message, detail, hint and fields, so that the only context it carries is
 * the caller's own (a line of the application's function, say).
 *
 * IDENTIFICATION
 *		src/enqueue.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "gatekeeper.h"

#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "nodes/makefuncs.h"
#include "parser/parse_func.h"
#include "utils/builtins.h"
#include "utils/elog.h"
#include "utils/memutils.h"

PG_FUNCTION_INFO_V1(gatekeeper_enqueue);

/* enqueue's arguments, in order; _enqueue takes the same */
#define ENQUEUE_NARGS 14

static const Oid enqueue_argtypes[ENQUEUE_NARGS] = {
	TEXTOID, TEXTOID, TEXTOID, TEXTOID, TIMESTAMPTZOID, TEXTOID, TEXTOID, JSONBOID,
	TEXTOID, INT4OID, TIMESTAMPTZOID, TEXTOID, JSONBOID, TEXTOID
};

/* _enqueue as this call site last found it, kept in its fn_extra */
typedef struct EnqueueTarget
{
	Oid			fn_oid;
	FmgrInfo	flinfo;
} EnqueueTarget;

static void raise_plainly(ErrorData *edata) pg_attribute_noreturn();

/*
 * Raise edata again as an error of this function: its SQLSTATE, message,
 * detail, hint and fields, without the context gatekeeper's own code gave
 * it (the context of enqueue's caller is added anew).
 */
static void
raise_plainly(ErrorData *edata)
{
	ereport(ERROR,
			(errcode(edata->sqlerrcode),
			 errmsg_internal("%s", edata->message),
			 edata->detail ? errdetail_internal("%s", edata->detail) : 0,
			 edata->hint ? errhint("%s", edata->hint) : 0,
			 edata->schema_name ? err_generic_string(PG_DIAG_SCHEMA_NAME, edata->schema_name) : 0,
			 edata->table_name ? err_generic_string(PG_DIAG_TABLE_NAME, edata->table_name) : 0,
			 edata->column_name ? err_generic_string(PG_DIAG_COLUMN_NAME, edata->column_name) : 0,
			 edata->datatype_name ? err_generic_string(PG_DIAG_DATATYPE_NAME, edata->datatype_name) : 0,
			 edata->constraint_name ? err_generic_string(PG_DIAG_CONSTRAINT_NAME, edata->constraint_name) : 0));
	pg_unreachable();
}

/*
 * gatekeeper_enqueue
 *		gatekeeper.enqueue(recipient, subject, body, queue, send_at, html,
 *		sender, headers, dedupe_key, priority, send_by, recipient_name,
 *		metadata, timezone) RETURNS bigint: the new mail's id, or that of
 *		the mail holding its dedupe key.
 */
Datum
gatekeeper_enqueue(PG_FUNCTION_ARGS)
{
	EnqueueTarget *target = (EnqueueTarget *) fcinfo->flinfo->fn_extra;
	LOCAL_FCINFO(call, ENQUEUE_NARGS);
	MemoryContext caller = CurrentMemoryContext;
	Oid			fn_oid;
	Datum		result = (Datum) 0;
	bool		isnull = true;
	int			i;

	/* _enqueue of the extension there is now: DROP and CREATE change it */
	fn_oid = LookupFuncName(list_make2(makeString("gatekeeper"), makeString("_enqueue")),
							ENQUEUE_NARGS, enqueue_argtypes, false);
	if (target == NULL || target->fn_oid != fn_oid)
	{
		if (target == NULL)
			target = MemoryContextAllocZero(fcinfo->flinfo->fn_mcxt, sizeof(EnqueueTarget));
		fmgr_info_cxt(fn_oid, &target->flinfo, fcinfo->flinfo->fn_mcxt);
		target->fn_oid = fn_oid;
		fcinfo->flinfo->fn_extra = target;
	}

	InitFunctionCallInfoData(*call, &target->flinfo, ENQUEUE_NARGS, fcinfo->fncollation,
							 NULL, NULL);
	for (i = 0; i < ENQUEUE_NARGS; i++)
		call->args[i] = fcinfo->args[i];

	PG_TRY();
	{
		result = FunctionCallInvoke(call);
		isnull = call->isnull;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(caller);
		edata = CopyErrorData();
		FlushErrorState();
		raise_plainly(edata);
	}
	PG_END_TRY();

	if (isnull)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(result);
}
