/*-------------------------------------------------------------------------
 *
 * worker_record.c
 *		The worker's outcomes recorded in the mail's state: sent mail is
 *		acked, retries and failures are nacked (with the relay's reply as
 *		it was read: src/smtp_trouble.h), and mail no relay took is handed
 *		back uncharged, one call of src/mail_state.c per kind.
 *
 * IDENTIFICATION
 *		src/worker_record.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "worker_record.h"
#include "mail/mail_store.h"

#include "access/xact.h"

/*
 * worker_record_step
 *		Record the outcomes of a RecordStep, for gatekeeper_subxact_catch:
 *		one call of src/mail_state.c per kind of outcome.
 */
bool
worker_record_step(void *arg)
{
	RecordStep *step = (RecordStep *) arg;
	GatekeeperDelivery **items = step->items;
	int			n = step->n;
	int64	   *ids;
	int32	   *attempts;
	MailNack   *nacks;
	int			nnacks = 0;
	int			nunreachable = 0;
	const char *unreachable_error = NULL;
	int			i;

	ids = palloc(sizeof(int64) * n);
	attempts = palloc(sizeof(int32) * n);

	/* sent */
	for (i = 0; i < n; i++)
	{
		if (items[i]->outcome != GATEKEEPER_SENT)
			continue;
		ids[step->nsent] = items[i]->mail.id;
		attempts[step->nsent] = items[i]->mail.attempt;
		step->nsent++;
	}
	if (step->nsent > 0)
		step->acked = mail_store_ack(ids, attempts, step->nsent);

	/* retries and failures */
	nacks = palloc(sizeof(MailNack) * n);
	for (i = 0; i < n; i++)
	{
		GatekeeperDelivery *d = items[i];

		if (d->outcome != GATEKEEPER_RETRY && d->outcome != GATEKEEPER_FAIL)
			continue;
		if (d->error[0] == '\0')
			snprintf(d->error, sizeof(d->error), "relay replied %d", d->reply.code);
		nacks[nnacks].id = d->mail.id;
		nacks[nnacks].attempt = d->mail.attempt;
		nacks[nnacks].error = d->error;
		nacks[nnacks].reply = &d->reply;
		nacks[nnacks].permanent = d->outcome == GATEKEEPER_FAIL;
		nnacks++;
	}
	if (nnacks > 0)
		(void) mail_store_nack(nacks, nnacks);

	/* unreachable: hand back, uncharged */
	for (i = 0; i < n; i++)
	{
		if (items[i]->outcome != GATEKEEPER_UNREACHABLE)
			continue;
		ids[nunreachable] = items[i]->mail.id;
		attempts[nunreachable] = items[i]->mail.attempt;
		if (unreachable_error == NULL && items[i]->error[0] != '\0')
			unreachable_error = items[i]->error;
		nunreachable++;
	}
	/* the worker backs off; the mail itself is due again at once */
	if (nunreachable > 0)
		(void) mail_store_unclaim(ids, attempts, nunreachable,
								  unreachable_error ? unreachable_error :
								  "no SMTP relay could be reached",
								  GetCurrentTransactionStartTimestamp());
	return true;
}
