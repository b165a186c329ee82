/*-------------------------------------------------------------------------
 *
 * worker_delivery.c
 *		A claimed mail as the worker delivers it: a delivery made from the
 *		claim's row, and its message built (and signed) just before it goes
 *		on the wire.
 *
 * IDENTIFICATION
 *		src/worker_delivery.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "worker_delivery.h"
#include "address.h"
#include "mail/mail_store.h"
#include "dkim.h"
#include "message.h"
#include "report.h"

#include "access/xact.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"

static char *copy_text(Datum *values, bool *nulls, int column, bool json);

/*
 * worker_delivery_new
 *		A claimed mail (the claim's row: values, nulls; due when it was due)
 *		as a new delivery, its content copied once, in a memory context of
 *		its own (freed once its outcome is recorded).
 */
GatekeeperDelivery *
worker_delivery_new(Datum *values, bool *nulls, TimestampTz due)
{
	MemoryContext cxt = AllocSetContextCreate(TopMemoryContext, "gatekeeper mail",
											  ALLOCSET_SMALL_SIZES);
	GatekeeperDelivery *d = MemoryContextAllocZero(cxt, sizeof(GatekeeperDelivery));
	GatekeeperMail *mail = &d->mail;
	MemoryContext old;

	d->cxt = cxt;
	if (nulls[GATEKEEPER_CLAIM_ID] || nulls[GATEKEEPER_CLAIM_ATTEMPT])
		elog(ERROR, "the claim returned a mail without id or attempt");
	mail->id = DatumGetInt64(values[GATEKEEPER_CLAIM_ID]);
	mail->attempt = DatumGetInt32(values[GATEKEEPER_CLAIM_ATTEMPT]);
	mail->due = due;

	old = MemoryContextSwitchTo(cxt);
	mail->queue = copy_text(values, nulls, GATEKEEPER_CLAIM_QUEUE, false);
	mail->recipient = copy_text(values, nulls, GATEKEEPER_CLAIM_RECIPIENT, false);
	mail->recipient_name = copy_text(values, nulls, GATEKEEPER_CLAIM_RECIPIENT_NAME, false);
	mail->sender = copy_text(values, nulls, GATEKEEPER_CLAIM_SENDER, false);
	mail->subject = copy_text(values, nulls, GATEKEEPER_CLAIM_SUBJECT, false);
	mail->body = copy_text(values, nulls, GATEKEEPER_CLAIM_BODY, false);
	mail->html = copy_text(values, nulls, GATEKEEPER_CLAIM_HTML, false);
	mail->headers_json = copy_text(values, nulls, GATEKEEPER_CLAIM_HEADERS, true);
	mail->message_id = copy_text(values, nulls, GATEKEEPER_CLAIM_MESSAGE_ID, false);
	MemoryContextSwitchTo(old);

	d->bytes = sizeof(GatekeeperDelivery) +
		(mail->body ? strlen(mail->body) : 0) +
		(mail->html ? strlen(mail->html) : 0) +
		(mail->subject ? strlen(mail->subject) : 0) +
		(mail->headers_json ? strlen(mail->headers_json) : 0);

	return d;
}

/*
 * A text (or, when json, jsonb) column of a claimed mail as a C string in
 * the current memory context, or NULL.  Detoasts inside the transaction.
 */
static char *
copy_text(Datum *values, bool *nulls, int column, bool json)
{
	if (nulls[column])
		return NULL;
	if (json)
	{
		Jsonb	   *jb = DatumGetJsonbP(values[column]);
		char	   *text = JsonbToCString(NULL, &jb->root, VARSIZE(jb));

		if ((Pointer) jb != DatumGetPointer(values[column]))
			pfree(jb);
		return text;
	}
	return TextDatumGetCString(values[column]);
}

/*
 * Build d's message, in d's memory context, in the caller's transaction.
 * Returns false, with d failed and the error recorded, when it cannot be
 * built: a mail whose message cannot be built fails alone instead of
 * taking the worker (and, at each restart, the worker again) down.  The
 * transaction is then aborted; the caller begins another if it needs one.
 * Cancellation and running out of memory are not the mail's fault: they
 * are rethrown.  The message is DKIM-signed as built (src/dkim.c);
 * *is_unsigned says when no key applied.  Once built, the mail's body is freed:
 * only the message is needed from here on.
 */
bool
worker_delivery_build(GatekeeperDelivery *d, const char *default_sender, bool *is_unsigned)
{
	MemoryContext oldcontext = CurrentMemoryContext;
	volatile bool ok = true;
	volatile int signatures = 0;
	const char *volatile from_address = NULL;

	if (d->mail.sender != NULL && d->mail.sender[0] != '\0')
		d->from_field = d->mail.sender;
	else if (default_sender[0] != '\0')
		d->from_field = MemoryContextStrdup(d->cxt, default_sender);
	if (d->from_field != NULL)
	{
		/* the envelope takes the bare address of "Name <address>" */
		MemoryContext old = MemoryContextSwitchTo(d->cxt);
		char	   *name;
		char	   *address;

		if (gatekeeper_mailbox_problem(d->from_field, &name, &address) == NULL)
			d->from = address;
		else
			d->from = d->from_field;
		from_address = d->from;
		MemoryContextSwitchTo(old);
	}
	else
	{
		d->outcome = GATEKEEPER_FAIL;
		strlcpy(d->error, "mail has no sender and gatekeeper.default_sender is not set",
				sizeof(d->error));
		return false;
	}

	PG_TRY();
	{
		MemoryContextSwitchTo(d->cxt);

		/*
		 * A queue's return_path, with the mail's VERP token, is the envelope
		 * sender instead; the token is the DSN's ENVID either way
		 * (src/report.c).  The queue's return_path and the secret are read
		 * once per claim (claim_mail refreshes them), not per mail; a read
		 * that fails fails the mail here, as a build error does.
		 */
		{
			char	   *token = NULL;
			char	   *return_path = gatekeeper_report_envelope(d->mail.queue,
																 d->mail.id, &token);

			d->envid = token;
			if (return_path != NULL)
				d->from = return_path;
		}
		initStringInfo(&d->message);
		/* room for a 7bit message at once, rather than doubling up to it */
		if (d->bytes > (size_t) d->message.maxlen)
			enlargeStringInfo(&d->message, (int) Min(d->bytes + d->bytes / 16 + 4096,
													 (size_t) MaxAllocSize / 2));
		gatekeeper_build_message(&d->message, &d->mail, d->from_field);
		signatures = gatekeeper_dkim_sign(&d->message, from_address);
		MemoryContextSwitchTo(oldcontext);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(d->cxt);
		edata = CopyErrorData();
		FlushErrorState();
		AbortCurrentTransaction();
		MemoryContextSwitchTo(oldcontext);

		if (edata->sqlerrcode == ERRCODE_QUERY_CANCELED ||
			edata->sqlerrcode == ERRCODE_OUT_OF_MEMORY)
			ReThrowError(edata);

		d->outcome = GATEKEEPER_FAIL;
		snprintf(d->error, sizeof(d->error),
				 "could not build message: %s", edata->message);
		FreeErrorData(edata);
		ok = false;
	}
	PG_END_TRY();

	if (!ok)
		return false;
	*is_unsigned = signatures == 0;

	d->needs_8bit = smtp_client_needs_8bit(d->message.data, d->message.len);
	d->needs_utf8 = !smtp_client_address_ascii(d->from) ||
		!smtp_client_address_ascii(d->mail.recipient);

	/* what is held from here on is the message */
	if (d->mail.body)
		pfree(d->mail.body);
	if (d->mail.html)
		pfree(d->mail.html);
	d->mail.body = d->mail.html = NULL;
	d->bytes = sizeof(GatekeeperDelivery) + d->message.maxlen;
	return true;
}
