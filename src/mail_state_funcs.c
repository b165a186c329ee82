/*-------------------------------------------------------------------------
 *
 * mail_state_funcs.c
 *		The SQL functions of a claimed mail's transitions: ack, ack_batch,
 *		nack, nack_batch, unclaim and extend, each checking its arguments
 *		and calling src/mail_state.c, which refuses (42501) a claim of
 *		another role or of a background worker; and _take_claimed, which
 *		0.3.0 no longer has (see gatekeeper_take_claimed).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/timestamp.h"

#include "gatekeeper.h"
#include "mail/mail_store.h"
#include "validate.h"

PG_FUNCTION_INFO_V1(gatekeeper_take_claimed);
PG_FUNCTION_INFO_V1(gatekeeper_ack);
PG_FUNCTION_INFO_V1(gatekeeper_ack_batch);
PG_FUNCTION_INFO_V1(gatekeeper_nack);
PG_FUNCTION_INFO_V1(gatekeeper_nack_batch);
PG_FUNCTION_INFO_V1(gatekeeper_unclaim);
PG_FUNCTION_INFO_V1(gatekeeper_extend);

/*
 * The claims of the arrays ids and attempts, as the SQL functions take
 * them: one-dimensional, of the same length, without nulls.  Returns
 * their number and sets *idsp and *attemptsp.
 */
static int
claim_arrays(ArrayType *ids, ArrayType *attempts, int64 **idsp, int32 **attemptsp)
{
	Datum	   *id_values;
	Datum	   *attempt_values;
	int			n;
	int			i;

	if (ARR_NDIM(ids) > 1 || ARR_NDIM(attempts) > 1 ||
		ArrayGetNItems(ARR_NDIM(ids), ARR_DIMS(ids)) !=
		ArrayGetNItems(ARR_NDIM(attempts), ARR_DIMS(attempts)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ids and attempts must be one-dimensional arrays of the same length")));
	if (array_contains_nulls(ids) || array_contains_nulls(attempts))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("ids and attempts must not contain nulls")));
	deconstruct_array(ids, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE,
					  &id_values, NULL, &n);
	deconstruct_array(attempts, INT4OID, 4, true, TYPALIGN_INT,
					  &attempt_values, NULL, &i);
	*idsp = palloc(Max(n, 1) * sizeof(int64));
	*attemptsp = palloc(Max(n, 1) * sizeof(int32));
	for (i = 0; i < n; i++)
	{
		(*idsp)[i] = DatumGetInt64(id_values[i]);
		(*attemptsp)[i] = DatumGetInt32(attempt_values[i]);
	}
	return n;
}

/*
 * _take_claimed(ids bigint[], attempts int[]) RETURNS SETOF mail_live
 *		0.2.0's, gone (ack, nack, extend and unclaim are C); the symbol stays
 *		for the older scripts (gatekeeper_gone).
 */
Datum
gatekeeper_take_claimed(PG_FUNCTION_ARGS)
{
	gatekeeper_gone("0.2.0", "_take_claimed");
}

/*
 * ack(id bigint, attempt int) RETURNS boolean
 *		Report a claim sent: true when it was still current, false,
 *		changing nothing, when it was not; another owner's is refused.
 */
Datum
gatekeeper_ack(PG_FUNCTION_ARGS)
{
	int64		id;
	int32		attempt;
	int			n;

	gatekeeper_require_schema();
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("id and attempt must not be null")));
	id = PG_GETARG_INT64(0);
	attempt = PG_GETARG_INT32(1);

	SPI_connect();
	n = mail_store_ack(&id, &attempt, 1);
	SPI_finish();

	PG_RETURN_BOOL(n > 0);
}

/*
 * ack_batch(ids bigint[], attempts int[]) RETURNS int
 *		Report a batch of claims sent; returns how many were still current.
 *		One claim of another owner fails the whole call.
 *		An element repeated counts once; a NULL element is refused, as a
 *		NULL is by ack().
 */
Datum
gatekeeper_ack_batch(PG_FUNCTION_ARGS)
{
	int64	   *ids;
	int32	   *attempts;
	int			n;

	gatekeeper_require_schema();
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("ids and attempts must not be null")));
	n = claim_arrays(PG_GETARG_ARRAYTYPE_P(0), PG_GETARG_ARRAYTYPE_P(1), &ids, &attempts);

	SPI_connect();
	n = mail_store_ack(ids, attempts, n);
	SPI_finish();

	PG_RETURN_INT32((int32) n);
}

/*
 * nack(id bigint, attempt int, error text, permanent boolean DEFAULT false)
 *	RETURNS text
 *		Report a claim not sent: the resulting state, NULL when the claim
 *		was not current.
 */
Datum
gatekeeper_nack(PG_FUNCTION_ARGS)
{
	MailNack	nack;

	gatekeeper_require_schema();
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("id, attempt and permanent must not be null")));
	nack.id = PG_GETARG_INT64(0);
	nack.attempt = PG_GETARG_INT32(1);
	nack.error = PG_ARGISNULL(2) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(2));
	nack.reply = NULL;
	nack.permanent = PG_GETARG_BOOL(3);

	SPI_connect();
	(void) mail_store_nack(&nack, 1);
	SPI_finish();

	if (nack.state == NULL)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text(nack.state));
}

/*
 * nack_batch(ids bigint[], attempts int[], errors text[],
 *			  permanent boolean DEFAULT false) RETURNS int
 *		nack() for each (id, attempt, error), with one permanent for all;
 *		returns how many claims were still current.
 */
Datum
gatekeeper_nack_batch(PG_FUNCTION_ARGS)
{
	ArrayType  *ids;
	ArrayType  *attempts;
	ArrayType  *errors;
	Datum	   *id_values;
	Datum	   *attempt_values;
	Datum	   *error_values;
	MailNack   *nacks;
	bool		permanent;
	int			n;
	int			i;

	gatekeeper_require_schema();
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2) || PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("ids, attempts, errors and permanent must not be null")));
	ids = PG_GETARG_ARRAYTYPE_P(0);
	attempts = PG_GETARG_ARRAYTYPE_P(1);
	errors = PG_GETARG_ARRAYTYPE_P(2);
	permanent = PG_GETARG_BOOL(3);
	n = ArrayGetNItems(ARR_NDIM(ids), ARR_DIMS(ids));
	if (ARR_NDIM(ids) > 1 || ARR_NDIM(attempts) > 1 || ARR_NDIM(errors) > 1 ||
		ArrayGetNItems(ARR_NDIM(attempts), ARR_DIMS(attempts)) != n ||
		ArrayGetNItems(ARR_NDIM(errors), ARR_DIMS(errors)) != n)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ids, attempts and errors must be one-dimensional arrays of the same length")));
	if (array_contains_nulls(ids) || array_contains_nulls(attempts) ||
		array_contains_nulls(errors))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("ids, attempts and errors must not contain nulls")));
	deconstruct_array(ids, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE,
					  &id_values, NULL, &n);
	deconstruct_array(attempts, INT4OID, 4, true, TYPALIGN_INT,
					  &attempt_values, NULL, &i);
	deconstruct_array(errors, TEXTOID, -1, false, TYPALIGN_INT,
					  &error_values, NULL, &i);
	nacks = palloc(Max(n, 1) * sizeof(MailNack));
	for (i = 0; i < n; i++)
	{
		nacks[i].id = DatumGetInt64(id_values[i]);
		nacks[i].attempt = DatumGetInt32(attempt_values[i]);
		nacks[i].error = TextDatumGetCString(error_values[i]);
		nacks[i].reply = NULL;
		nacks[i].permanent = permanent;
	}

	SPI_connect();
	n = mail_store_nack(nacks, n);
	SPI_finish();

	PG_RETURN_INT32((int32) n);
}

/*
 * unclaim(ids bigint[], attempts int[], error text, delay interval DEFAULT '0')
 *	RETURNS int
 *		Hand claimed mail back unsent and uncharged, due again after
 *		delay; the number handed back.
 */
Datum
gatekeeper_unclaim(PG_FUNCTION_ARGS)
{
	int64	   *ids;
	int32	   *attempts;
	char	   *error;
	Interval   *delay;
	TimestampTz due;
	int			n;

	gatekeeper_require_schema();
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("ids, attempts and delay must not be null")));
	n = claim_arrays(PG_GETARG_ARRAYTYPE_P(0), PG_GETARG_ARRAYTYPE_P(1), &ids, &attempts);
	error = PG_ARGISNULL(2) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(2));
	delay = gatekeeper_check_duration(PG_GETARG_INTERVAL_P(3), "delay");
	due = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
												  TimestampTzGetDatum(GetCurrentTransactionStartTimestamp()),
												  IntervalPGetDatum(delay)));

	SPI_connect();
	n = mail_store_unclaim(ids, attempts, n, error, due);
	SPI_finish();

	PG_RETURN_INT32((int32) n);
}

/*
 * extend(id bigint, attempt int, lease interval) RETURNS boolean
 *		Extend a claim's lease to lease from now, unless it ends later
 *		already (mail_state_extend_one); false when the claim was not
 *		current.
 */
Datum
gatekeeper_extend(PG_FUNCTION_ARGS)
{
	int64		id;
	int32		attempt;
	Interval   *lease;
	TimestampTz lease_end;
	bool		held;

	gatekeeper_require_schema();
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("id, attempt and lease must not be null")));
	id = PG_GETARG_INT64(0);
	attempt = PG_GETARG_INT32(1);
	lease = gatekeeper_check_duration(PG_GETARG_INTERVAL_P(2), "lease");
	lease_end = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
														TimestampTzGetDatum(GetCurrentTransactionStartTimestamp()),
														IntervalPGetDatum(lease)));

	SPI_connect();
	held = mail_store_extend_one(id, attempt, lease_end);
	SPI_finish();

	PG_RETURN_BOOL(held);
}
