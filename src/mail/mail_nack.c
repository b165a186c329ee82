/*-------------------------------------------------------------------------
 *
 * mail_nack.c
 *		A nack: each claimed mail the relay did not take retried after a
 *		backoff, or failed, with its event; a failed mail's bounce, and its
 *		gate passes given back.
 *
 * The claims are taken out of their batches as every transition of a
 * claimed mail takes them (mail_state.c, the caller's own only), then
 * each is decided by its queue's policy: retried, due again after an
 * exponential backoff with jitter, while it has attempts left and its
 * first deferral is within the queue's retry_for; failed otherwise, or at
 * once for a permanent failure (a 5xx).  A retried mail goes back to
 * mail_live, a failed one to mail_done, each with a 'deferred' or
 * 'bounced' event; a permanent failure is a bounce of its address
 * (report_bounce: a hard one suppresses it).
 *
 * IDENTIFICATION
 *		src/mail/mail_nack.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "catalog/pg_type.h"
#include "common/pg_prng.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "address.h"
#include "catalog.h"
#include "gatekeeper.h"
#include "gate.h"
#include "keep_freed.h"
#include "mail_state.h"
#include "report.h"
#include "wake.h"

/*
 * The longest backoff of a retry: a mail deferred for a day (its queue's
 * retry_for) is tried every 5 to 10 minutes once its backoff has grown,
 * so that it goes within minutes of the trouble ending, not hours.
 */
#define MAX_RETRY_DELAY_USECS	(INT64CONST(10) * USECS_PER_MINUTE)

/*
 * The first deferral of each mail, by (id, segment): i is its place.  A
 * mail's deferrals are its events, kept with it in its segment.
 */
static const char first_deferral_sql[] =
"SELECT u.i, min(e.at) "
"  FROM unnest($1::bigint[], $2::smallint[]) WITH ORDINALITY AS u(id, segment, i) "
"  JOIN gatekeeper.event_log e ON e.mail_id = u.id AND e.segment = u.segment "
"                              AND e.event = 'deferred' "
" GROUP BY u.i";

/* the recipients of failed mail, by (id, segment): i is their place */
static const char recipients_sql[] =
"SELECT u.i, m.recipient "
"  FROM unnest($1::bigint[], $2::smallint[]) WITH ORDINALITY AS u(id, segment, i) "
"  JOIN gatekeeper.mail m ON m.id = u.id AND m.segment = u.segment";

/* a nack's events, in mail order */
static const char nack_events_sql[] =
"INSERT INTO gatekeeper.event_log (mail_id, queue, recipient, event, status, detail, source, segment, reason) "
"SELECT u.mail_id, u.queue, u.recipient, u.event, u.status, "
"       u.detail, 'relay', u.segment, u.reason "
"  FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::smallint[], "
"              $7::text[], $8::text[]) "
"       AS u(mail_id, queue, recipient, event, detail, segment, status, reason)";

static SPIPlanPtr first_deferral_plan = NULL;
static SPIPlanPtr recipients_plan = NULL;
static SPIPlanPtr nack_events_plan = NULL;

/* A claimed mail taken for a nack, with what the nack says of it. */
typedef struct NackTaken
{
	int64		id;
	Datum		record;
	MailNack   *nack;
	bool		failed;
	char	   *recipient;		/* failed mail's, NULL if its content is gone */
	char	   *key;			/* its suppression key, for a bounce */
	TroubleReason reason;		/* why it failed (src/smtp_trouble.c) */
} NackTaken;

static int64 retry_delay_usecs(int32 tries);
static MailNack **nack_claims(MailNack *nacks, int n, int *nclaims);
static NackTaken *nack_match(MailNack **order, int nclaims, LiveRecord *lr,
							 Datum *taken, int ntaken);
static int32 charged_tries(LiveRecord *lr, Datum record);
static void first_deferrals(NackTaken **of, int n, LiveRecord *lr, TimestampTz *first);
static int	nack_decide(NackTaken *mails, int ntaken, LiveRecord *lr,
						QueuePolicy *policies, int npolicies, TimestampTz now);
static void nack_read_recipients(NackTaken *mails, int ntaken, int nfailed, LiveRecord *lr);
static void nack_write(NackTaken *mails, int ntaken, LiveRecord *lr,
					   QueuePolicy *policies, int npolicies, TimestampTz now);
static void nack_bounce_and_release(NackTaken *mails, int ntaken, int nfailed);

/* nacks in (id, attempt) order, the first given first */
static int
nack_ptr_cmp(const void *a, const void *b)
{
	const MailNack *x = *(MailNack *const *) a;
	const MailNack *y = *(MailNack *const *) b;
	int			c = mail_state_claim_cmp(x->id, x->attempt, y->id, y->attempt);

	if (c != 0)
		return c;
	return (x > y) - (x < y);
}

/* nacks in (id, attempt) order */
static int
nack_claim_cmp(const void *a, const void *b)
{
	const MailNack *x = *(MailNack *const *) a;
	const MailNack *y = *(MailNack *const *) b;

	return mail_state_claim_cmp(x->id, x->attempt, y->id, y->attempt);
}

/* taken mails by id */
static int
nack_taken_cmp(const void *a, const void *b)
{
	return mail_state_id_cmp(&((const NackTaken *) a)->id, &((const NackTaken *) b)->id);
}

/* bounces in the order of their suppression keys, then mail ids */
static int
bounce_cmp(const void *a, const void *b)
{
	const NackTaken *x = *(NackTaken *const *) a;
	const NackTaken *y = *(NackTaken *const *) b;
	int			c = strcmp(x->key, y->key);

	if (c != 0)
		return c;
	return mail_state_id_cmp(&x->id, &y->id);
}

/*
 * The backoff of a retry after tries charged attempts: exponential with
 * equal jitter, in [d/2, d] for d = retry_delay * 2^(tries - 1), at most
 * ten minutes (or retry_delay, when that is longer).
 */
static int64
retry_delay_usecs(int32 tries)
{
	double		d = (double) gatekeeper_retry_delay * 1000.0 *
		pow(2.0, (double) Min(tries - 1, 30));

	d = Min(d, Max((double) MAX_RETRY_DELAY_USECS, (double) gatekeeper_retry_delay * 1000.0));
	return (int64) rint(d / 2 + d / 2 * pg_prng_double(&pg_global_prng_state));
}

/*
 * The claims nacks[0 .. n - 1] name, each once, pointing at its first
 * nack (the sort keeps the given order), in claim order; *nclaims is how
 * many.
 */
static MailNack **
nack_claims(MailNack *nacks, int n, int *nclaims)
{
	MailNack  **order = palloc(n * sizeof(MailNack *));
	int			i;
	int			j;

	for (i = 0; i < n; i++)
		order[i] = &nacks[i];
	qsort(order, n, sizeof(MailNack *), nack_ptr_cmp);
	for (i = 1, j = 1; i < n; i++)
		if (mail_state_claim_cmp(order[i]->id, order[i]->attempt,
					  order[j - 1]->id, order[j - 1]->attempt) != 0)
			order[j++] = order[i];
	*nclaims = j;
	return order;
}

/*
 * Each of the ntaken records taken with the nack (of the nclaims in
 * order) that names its claim, in id order.
 */
static NackTaken *
nack_match(MailNack **order, int nclaims, LiveRecord *lr, Datum *taken, int ntaken)
{
	NackTaken  *mails = palloc0(ntaken * sizeof(NackTaken));
	int			i;

	for (i = 0; i < ntaken; i++)
	{
		MailNack	key;
		MailNack   *keyp = &key;
		MailNack  **hit;

		key.id = DatumGetInt64(mail_state_record_get(lr, taken[i], lr->id));
		key.attempt = DatumGetInt32(mail_state_record_get(lr, taken[i], lr->attempt));
		hit = bsearch(&keyp, order, nclaims, sizeof(MailNack *), nack_claim_cmp);
		if (hit == NULL)
			elog(ERROR, "took claimed mail %lld not asked for", (long long) key.id);
		mails[i].id = key.id;
		mails[i].record = taken[i];
		mails[i].nack = *hit;
	}
	qsort(mails, ntaken, sizeof(NackTaken), nack_taken_cmp);
	return mails;
}

/* The attempts a claimed mail's record has been charged. */
static int32
charged_tries(LiveRecord *lr, Datum record)
{
	return DatumGetInt32(mail_state_record_get(lr, record, lr->attempt)) -
		DatumGetInt32(mail_state_record_get(lr, record, lr->uncharged));
}

/*
 * first[k] receives when of[k]'s mail was first deferred, or 0 when it
 * never was before this nack.
 */
static void
first_deferrals(NackTaken **of, int n, LiveRecord *lr, TimestampTz *first)
{
	Datum	   *ids = palloc(n * sizeof(Datum));
	Datum	   *segments = palloc(n * sizeof(Datum));
	Oid			types[2] = {INT8ARRAYOID, INT2ARRAYOID};
	Datum		args[2];
	uint64		row;
	int			k;

	for (k = 0; k < n; k++)
	{
		ids[k] = Int64GetDatum(of[k]->id);
		segments[k] = mail_state_record_get(lr, of[k]->record, lr->segment);
		first[k] = 0;
	}
	gatekeeper_plan(&first_deferral_plan, first_deferral_sql, 2, types);
	args[0] = gatekeeper_array(ids, NULL, n, INT8OID);
	args[1] = gatekeeper_array(segments, NULL, n, INT2OID);
	if (gatekeeper_execute_by_key(first_deferral_plan, args, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read the first deferrals of nacked mail");
	for (row = 0; row < SPI_processed; row++)
	{
		bool		isnull;
		int64		place = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[row],
														SPI_tuptable->tupdesc, 1, &isnull));
		Datum		at = SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, 2, &isnull);

		if (place < 1 || place > n)
			elog(ERROR, "first deferral of nacked mail out of place");
		if (!isnull)
			first[place - 1] = DatumGetTimestampTz(at);
	}
	SPI_freetuptable(SPI_tuptable);
}

/*
 * Mark the nacked mails that fail: permanent, or out of their queue's
 * attempts and of its retry_for, counted from the mail's first deferral
 * (this one, if it had none), however many attempts that took (the rest
 * are retried).  Returns how many fail.  Only a mail that has used its
 * attempts has its deferrals looked up.
 */
static int
nack_decide(NackTaken *mails, int ntaken, LiveRecord *lr,
			QueuePolicy *policies, int npolicies, TimestampTz now)
{
	NackTaken **spent = palloc(Max(ntaken, 1) * sizeof(NackTaken *));
	int64	   *budget = palloc(Max(ntaken, 1) * sizeof(int64));
	int			nspent = 0;
	int			nfailed = 0;
	int			i;

	for (i = 0; i < ntaken; i++)
	{
		NackTaken  *m = &mails[i];
		QueuePolicy *q = mail_state_find_policy(policies, npolicies,
									 TextDatumGetCString(mail_state_record_get(lr, m->record, lr->queue)));
		int32		tries = charged_tries(lr, m->record);

		m->failed = m->nack->permanent;
		if (!m->failed && tries >= (q ? q->max_attempts : 1))
		{
			if (q == NULL || q->retry_for <= 0)
				m->failed = true;
			else
			{
				budget[nspent] = q->retry_for;
				spent[nspent++] = m;
			}
		}
	}
	if (nspent > 0)
	{
		TimestampTz *first = palloc(nspent * sizeof(TimestampTz));

		first_deferrals(spent, nspent, lr, first);
		for (i = 0; i < nspent; i++)
			spent[i]->failed = first[i] != 0 && now - first[i] >= budget[i];
	}
	for (i = 0; i < ntaken; i++)
		if (mails[i].failed)
			nfailed++;
	return nfailed;
}

/*
 * Read the recipients of the nfailed failed mails, for their events,
 * bounces and passes (NULL where the mail's content is gone).
 */
static void
nack_read_recipients(NackTaken *mails, int ntaken, int nfailed, LiveRecord *lr)
{
	Datum	   *fids = palloc(nfailed * sizeof(Datum));
	Datum	   *fsegments = palloc(nfailed * sizeof(Datum));
	NackTaken **of = palloc(nfailed * sizeof(NackTaken *));
	Oid			types[2] = {INT8ARRAYOID, INT2ARRAYOID};
	Datum		args[2];
	uint64		row;
	int			k = 0;
	int			i;

	for (i = 0; i < ntaken; i++)
	{
		if (!mails[i].failed)
			continue;
		fids[k] = Int64GetDatum(mails[i].id);
		fsegments[k] = mail_state_record_get(lr, mails[i].record, lr->segment);
		of[k++] = &mails[i];
	}
	gatekeeper_plan(&recipients_plan, recipients_sql, 2, types);
	args[0] = gatekeeper_array(fids, NULL, nfailed, INT8OID);
	args[1] = gatekeeper_array(fsegments, NULL, nfailed, INT2OID);
	if (gatekeeper_execute_by_key(recipients_plan, args, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read the recipients of failed mail");
	for (row = 0; row < SPI_processed; row++)
	{
		bool		isnull;
		int64		place = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[row],
														SPI_tuptable->tupdesc, 1, &isnull));

		if (place < 1 || place > nfailed)
			elog(ERROR, "recipient of failed mail out of place");
		of[place - 1]->recipient = SPI_getvalue(SPI_tuptable->vals[row],
												SPI_tuptable->tupdesc, 2);
	}
	SPI_freetuptable(SPI_tuptable);
}

/*
 * Write the nacked mails where they now belong (failed into mail_done;
 * retried into mail_live, due after a backoff from now, heard of by the
 * listeners of a notify queue), setting each nack's state, and their
 * events, in id order.
 */
static void
nack_write(NackTaken *mails, int ntaken, LiveRecord *lr,
		   QueuePolicy *policies, int npolicies, TimestampTz now)
{
	Datum	   *live = palloc(ntaken * sizeof(Datum));
	Datum	   *done = palloc(ntaken * sizeof(Datum));
	int			nlive = 0;
	int			ndone = 0;
	Datum	   *e_ids = palloc(ntaken * sizeof(Datum));
	Datum	   *e_queues = palloc(ntaken * sizeof(Datum));
	Datum	   *e_recipients = palloc(ntaken * sizeof(Datum));
	bool	   *e_recipients_null = palloc(ntaken * sizeof(bool));
	Datum	   *e_events = palloc(ntaken * sizeof(Datum));
	Datum	   *e_details = palloc(ntaken * sizeof(Datum));
	bool	   *e_details_null = palloc(ntaken * sizeof(bool));
	Datum	   *e_segments = palloc(ntaken * sizeof(Datum));
	Datum	   *e_statuses = palloc(ntaken * sizeof(Datum));
	bool	   *e_statuses_null = palloc(ntaken * sizeof(bool));
	Datum	   *e_reasons = palloc(ntaken * sizeof(Datum));
	Oid			types[8] = {INT8ARRAYOID, TEXTARRAYOID, TEXTARRAYOID, TEXTARRAYOID,
	TEXTARRAYOID, INT2ARRAYOID, TEXTARRAYOID, TEXTARRAYOID};
	Datum		args[8];
	int			i;

	for (i = 0; i < ntaken; i++)
	{
		NackTaken  *m = &mails[i];
		const char *error = m->nack->error;
		char		status[16];

		/* the reply as it was read: its status and reason, never re-read */
		m->reason = smtp_trouble_of_failure(m->nack->reply, error, status, sizeof(status));
		e_statuses[i] = status[0] ? CStringGetTextDatum(status) : (Datum) 0;
		e_statuses_null[i] = status[0] == '\0';
		e_reasons[i] = CStringGetTextDatum(smtp_trouble_name(m->reason));
		e_ids[i] = Int64GetDatum(m->id);
		e_queues[i] = mail_state_record_get(lr, m->record, lr->queue);
		e_segments[i] = mail_state_record_get(lr, m->record, lr->segment);
		e_details[i] = error ? CStringGetTextDatum(error) : (Datum) 0;
		e_details_null[i] = error == NULL;
		e_recipients_null[i] = true;
		e_recipients[i] = (Datum) 0;
		if (m->failed)
		{
			m->nack->state = "failed";
			done[ndone++] = mail_state_record_moved(lr, m->record, lr->failed, true, error, 0, false);
			e_events[i] = CStringGetTextDatum(m->nack->permanent ? "bounced" : "deferred");
			if (m->recipient != NULL)
			{
				e_recipients[i] = CStringGetTextDatum(m->recipient);
				e_recipients_null[i] = false;
			}
		}
		else
		{
			QueuePolicy *q = mail_state_find_policy(policies, npolicies,
										 TextDatumGetCString(e_queues[i]));
			TimestampTz due = now + retry_delay_usecs(charged_tries(lr, m->record));

			m->nack->state = "scheduled";
			live[nlive++] = mail_state_record_moved(lr, m->record, lr->scheduled, true, error, due, false);
			e_events[i] = CStringGetTextDatum("deferred");
			if (q != NULL && q->notify)
				gatekeeper_announce_due(q->name, due);
		}
	}
	mail_state_insert_done(lr, done, ndone);
	mail_state_insert_live(lr, live, nlive);

	gatekeeper_plan(&nack_events_plan, nack_events_sql, 8, types);
	args[0] = gatekeeper_array(e_ids, NULL, ntaken, INT8OID);
	args[1] = gatekeeper_array(e_queues, NULL, ntaken, TEXTOID);
	args[2] = gatekeeper_array(e_recipients, e_recipients_null, ntaken, TEXTOID);
	args[3] = gatekeeper_array(e_events, NULL, ntaken, TEXTOID);
	args[4] = gatekeeper_array(e_details, e_details_null, ntaken, TEXTOID);
	args[5] = gatekeeper_array(e_segments, NULL, ntaken, INT2OID);
	args[6] = gatekeeper_array(e_statuses, e_statuses_null, ntaken, TEXTOID);
	args[7] = gatekeeper_array(e_reasons, NULL, ntaken, TEXTOID);
	if (SPI_execute_plan(nack_events_plan, args, NULL, false, 0) != SPI_OK_INSERT ||
		SPI_processed != (uint64) ntaken)
		elog(ERROR, "could not record the events of nacked mail");
}

/*
 * What the nfailed failed mails do to their addresses, after their
 * events (which the count of soft bounces reads): a permanent failure
 * is a bounce (report_bounce: the relay said the mailbox does not exist,
 * never mail it again; a bounce of another kind counts toward
 * soft_bounce_limit), taken in address order; and their gate passes are
 * given back in one sorted release, by what the mail holds, whatever its
 * queue's gates are now.
 */
static void
nack_bounce_and_release(NackTaken *mails, int ntaken, int nfailed)
{
	NackTaken **bounces = palloc(Max(nfailed, 1) * sizeof(NackTaken *));
	char	  **release_recipients = palloc(Max(nfailed, 1) * sizeof(char *));
	int64	   *release_holders = palloc(Max(nfailed, 1) * sizeof(int64));
	int			nbounces = 0;
	int			nrelease = 0;
	int			i;

	for (i = 0; i < ntaken; i++)
	{
		NackTaken  *m = &mails[i];

		if (!m->failed || m->recipient == NULL)
			continue;
		if (m->nack->permanent)
		{
			m->key = gatekeeper_recipient_key(m->recipient);
			bounces[nbounces++] = m;
		}
		release_recipients[nrelease] = m->recipient;
		release_holders[nrelease] = m->id;
		nrelease++;
	}
	qsort(bounces, nbounces, sizeof(NackTaken *), bounce_cmp);
	for (i = 0; i < nbounces; i++)
		report_bounce(bounces[i]->key, smtp_trouble_hard(bounces[i]->reason),
					  bounces[i]->nack->error, bounces[i]->id);

	if (nrelease > 0)
		(void) gatekeeper_release_passes(release_recipients, release_holders, nrelease);
}

/*
 * mail_state_nack
 *		Report the claims nacks[i] not sent: each still open is retried
 *		after a backoff (back into mail_live, scheduled, charged), or fails
 *		(into mail_done) when permanent or out of its queue's attempts.
 *		Sets each nack's state ("failed", "scheduled", or NULL when the
 *		claim was not current; a claim named twice takes the first
 *		one's error, and the second gets NULL); returns how many were
 *		still open.
 *
 * Each writes a 'deferred' event, or for a permanent failure a 'bounced'
 * one; a permanent failure is a bounce of its address (report_bounce:
 * a hard one suppresses it), taken in the order of the addresses; the
 * failed mails' gate passes are given back in one sorted release, so
 * that concurrent nacks do not deadlock.
 */
int
mail_state_nack(MailNack *nacks, int n)
{
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	MailNack  **order;
	int			nclaims;
	int64	   *ids;
	int32	   *attempts;
	LiveRecord	lr;
	Datum	   *taken;
	int			ntaken;
	NackTaken  *mails;
	QueuePolicy *policies;
	int			npolicies;
	int			nfailed;
	int			i;

	for (i = 0; i < n; i++)
		nacks[i].state = NULL;
	if (n == 0)
		return 0;
	gatekeeper_keep_freed_memory();

	order = nack_claims(nacks, n, &nclaims);
	ids = palloc(nclaims * sizeof(int64));
	attempts = palloc(nclaims * sizeof(int32));
	for (i = 0; i < nclaims; i++)
	{
		ids[i] = order[i]->id;
		attempts[i] = order[i]->attempt;
	}
	taken = mail_state_take_own(ids, attempts, nclaims, &ntaken, &lr, CurrentMemoryContext);
	if (ntaken == 0)
		return 0;

	mails = nack_match(order, nclaims, &lr, taken, ntaken);
	policies = mail_state_load_policies(&lr, taken, ntaken, &npolicies);
	nfailed = nack_decide(mails, ntaken, &lr, policies, npolicies, now);
	if (nfailed > 0)
		nack_read_recipients(mails, ntaken, nfailed, &lr);
	nack_write(mails, ntaken, &lr, policies, npolicies, now);
	nack_bounce_and_release(mails, ntaken, nfailed);
	return ntaken;
}
