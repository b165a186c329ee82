/*-------------------------------------------------------------------------
 *
 * worker_standbys.c
 *		gatekeeper.claim_standbys: the worker's claimed mail waits until
 *		that many streaming standbys have flushed its claim.
 *
 * A claim lost in a failover after its mail went out would send the mail
 * again from the new primary.  With gatekeeper.claim_standbys > 0 the
 * worker holds each claim's mail (on its "pending" list, in claim order)
 * until that many streaming physical standbys have flushed the claim's
 * commit record, read from the walsenders' shared memory as
 * pg_stat_replication reads it; the worker's loop asks here how many of
 * its pending mails may go (SPEC "Failover").
 *
 * Like synchronous_standby_names, the setting stops delivery while fewer
 * standbys stream, and a promoted node has none at first.  So the worker
 * says once in the log when it starts waiting for the standbys (at once
 * when too few stream, after STANDBY_WAIT_LOG_MS when they stream but
 * have not flushed the oldest held claim), with how to lower the setting,
 * and once when it stops; worker_status shows how many mails are held and
 * since when, which the shipped alert GatekeeperWaitingForStandbys watches.
 *
 * IDENTIFICATION
 *		src/worker_standbys.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "worker_standbys.h"
#include "gatekeeper.h"
#include "worker_slots.h"

#include "lib/ilist.h"
#include "replication/walsender.h"
#include "replication/walsender_private.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "storage/spin.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

/*
 * How often held mail looks at the standbys' flush positions: often while
 * enough standbys stream (it waits for a round trip), seldom while they
 * do not (it waits for an operator).
 */
#define STANDBY_POLL_MS				5
#define STANDBY_MISSING_POLL_MS		200

/*
 * How long the oldest held claim waits, with enough standbys streaming,
 * before the worker says in the log that it waits for them: a standby that
 * streams but flushes nothing (a host gone without closing its connection,
 * until wal_sender_timeout) or far behind.  A round trip is milliseconds.
 */
#define STANDBY_WAIT_LOG_MS			30000

/* the claims whose mail waits for the standbys, oldest first */
typedef struct HeldClaim
{
	dlist_node	node;
	XLogRecPtr	lsn;			/* the end of the claim's commit record */
	int			mails;			/* its mails still on "pending" */
	TimestampTz held_at;		/* when it was held */
} HeldClaim;

static dlist_head held_claims = DLIST_STATIC_INIT(held_claims);
static int	held_mails = 0;		/* the mails of held_claims */
static char held_why[64];		/* what the held mail waits for */
static bool standbys_missing = false;	/* fewer than claim_standbys stream */
static TimestampTz waiting_since = 0;	/* the log said the worker waits, or 0 */

static XLogRecPtr standby_flush(int n, int *streaming);
static void watch_waiting(int streaming, uint64 behind, const char *ended);

/*
 * worker_standbys_hold: the mails of the claim just committed (the last
 * ones on the worker's "pending"), whose commit record ends at lsn, wait
 * for the standbys.  Returns how many mails may go now, of this claim or
 * of claims held before: with claim_standbys 0 and nothing held before,
 * all of this claim's at once.
 */
int
worker_standbys_hold(int mails, XLogRecPtr lsn)
{
	HeldClaim  *h;

	if (gatekeeper_claim_standbys <= 0 && dlist_is_empty(&held_claims))
		return mails;
	h = MemoryContextAlloc(TopMemoryContext, sizeof(HeldClaim));
	h->lsn = lsn;
	h->mails = mails;
	h->held_at = GetCurrentTimestamp();
	dlist_push_tail(&held_claims, &h->node);
	held_mails += mails;
	return worker_standbys_clear();
}

/*
 * worker_standbys_clear: clear the mail of every held claim that
 * gatekeeper.claim_standbys streaming standbys have flushed (all of it
 * when the setting is 0), and say what the rest waits for.  Returns how
 * many mails were cleared: the next ones on "pending".
 */
int
worker_standbys_clear(void)
{
	XLogRecPtr	flushed;
	int			streaming = 0;
	int			cleared = 0;
	HeldClaim  *h;

	if (dlist_is_empty(&held_claims))
		return 0;
	if (gatekeeper_claim_standbys <= 0)
		flushed = PG_UINT64_MAX;
	else
		flushed = standby_flush(gatekeeper_claim_standbys, &streaming);

	while (!dlist_is_empty(&held_claims))
	{
		h = dlist_container(HeldClaim, node, dlist_head_node(&held_claims));
		if (h->lsn > flushed)
			break;
		cleared += h->mails;
		held_mails -= h->mails;
		dlist_delete(&h->node);
		pfree(h);
	}
	if (dlist_is_empty(&held_claims))
	{
		watch_waiting(streaming, 0, NULL);
		return cleared;
	}

	h = dlist_container(HeldClaim, node, dlist_head_node(&held_claims));
	standbys_missing = streaming < gatekeeper_claim_standbys;
	if (standbys_missing)
		snprintf(held_why, sizeof(held_why), "waiting for %d standby%s: %d streaming",
				 gatekeeper_claim_standbys, gatekeeper_claim_standbys == 1 ? "" : "s",
				 streaming);
	else
		snprintf(held_why, sizeof(held_why), "waiting for %d standby%s: " UINT64_FORMAT " bytes behind",
				 gatekeeper_claim_standbys, gatekeeper_claim_standbys == 1 ? "" : "s",
				 (uint64) (h->lsn - flushed));
	watch_waiting(streaming, standbys_missing ? 0 : (uint64) (h->lsn - flushed), NULL);
	return cleared;
}

/*
 * worker_standbys_forget: forget the held claims: their mail left
 * "pending" (the breaker handed it back).
 */
void
worker_standbys_forget(void)
{
	while (!dlist_is_empty(&held_claims))
	{
		HeldClaim  *h = dlist_container(HeldClaim, node,
										dlist_pop_head_node(&held_claims));

		pfree(h);
	}
	held_mails = 0;
	watch_waiting(0, 0, "The held mail was handed back, uncharged: no relay takes mail.");
}

/*
 * Say once in the log when the worker starts waiting for the standbys, and
 * once when it stops, from what worker_standbys_clear found: streaming
 * standbys, and how far behind the oldest held claim the one that counts
 * is (0 when too few stream).  ended, when given, says why the wait ended
 * whatever the standbys do.
 */
static void
watch_waiting(int streaming, uint64 behind, const char *ended)
{
	TimestampTz now = GetCurrentTimestamp();
	bool		waiting = false;
	HeldClaim  *oldest = NULL;

	if (!dlist_is_empty(&held_claims))
	{
		oldest = dlist_container(HeldClaim, node, dlist_head_node(&held_claims));
		waiting = standbys_missing ||
			TimestampDifferenceExceeds(oldest->held_at, now, STANDBY_WAIT_LOG_MS);
	}

	if (waiting && waiting_since == 0)
	{
		int			n = gatekeeper_claim_standbys;

		waiting_since = oldest->held_at;
		ereport(LOG,
				(standbys_missing ?
				 errmsg_plural("gatekeeper worker waits for %d standby: %d streaming",
							   "gatekeeper worker waits for %d standbys: %d streaming",
							   n, n, streaming) :
				 errmsg_plural("gatekeeper worker waits for %d standby: %d streaming, %llu bytes behind",
							   "gatekeeper worker waits for %d standbys: %d streaming, %llu bytes behind",
							   n, n, streaming, (unsigned long long) behind),
				 errdetail_plural("gatekeeper.claim_standbys is %d: no claimed mail goes on the wire before that many streaming standbys have flushed its claim; %d mail waits.",
								  "gatekeeper.claim_standbys is %d: no claimed mail goes on the wire before that many streaming standbys have flushed its claim; %d mails wait.",
								  held_mails, n, held_mails),
				 errhint("Start or reconnect a standby; on a server that has no standby to wait for (a promoted one), lower the setting: ALTER SYSTEM SET gatekeeper.claim_standbys = 0; SELECT pg_reload_conf();")));
	}
	else if (!waiting && waiting_since != 0)
	{
		long		waited = (long) (TimestampDifferenceMilliseconds(waiting_since, now) / 1000);

		if (ended != NULL)
			ereport(LOG,
					(errmsg("gatekeeper worker no longer waits for standbys"),
					 errdetail("%s It waited %ld s.", ended, waited)));
		else if (gatekeeper_claim_standbys <= 0)
			ereport(LOG,
					(errmsg("gatekeeper worker no longer waits for standbys"),
					 errdetail("gatekeeper.claim_standbys is 0: the held mail goes on the wire after waiting %ld s.",
							   waited)));
		else
			ereport(LOG,
					(errmsg("gatekeeper worker no longer waits for standbys"),
					 errdetail_plural("%d standby streams and has flushed the claims: the held mail goes on the wire after waiting %ld s.",
									  "%d standbys stream and have flushed the claims: the held mail goes on the wire after waiting %ld s.",
									  streaming, streaming, waited)));
		waiting_since = 0;
	}
}

/*
 * The WAL position that n streaming physical standbys have flushed (the
 * n-th highest of their flush positions), or InvalidXLogRecPtr when fewer
 * than n stream; *streaming receives how many do.  Read from the
 * walsenders' shared memory, as pg_stat_replication is; a walsender with a
 * database is a logical one, which no standby stands behind.
 */
static XLogRecPtr
standby_flush(int n, int *streaming)
{
	XLogRecPtr *flush;
	XLogRecPtr	result = InvalidXLogRecPtr;
	int			count = 0;
	int			i;

	*streaming = 0;
	if (WalSndCtl == NULL || max_wal_senders <= 0)
		return InvalidXLogRecPtr;
	flush = palloc(sizeof(XLogRecPtr) * max_wal_senders);
	for (i = 0; i < max_wal_senders; i++)
	{
		WalSnd	   *walsnd = &WalSndCtl->walsnds[i];
		pid_t		pid;
		WalSndState state;
		XLogRecPtr	position;
		PGPROC	   *proc;

		SpinLockAcquire(&walsnd->mutex);
		pid = walsnd->pid;
		state = walsnd->state;
		position = walsnd->flush;
		SpinLockRelease(&walsnd->mutex);

		if (pid == 0 || state != WALSNDSTATE_STREAMING || XLogRecPtrIsInvalid(position))
			continue;
		proc = BackendPidGetProc(pid);
		if (proc == NULL || OidIsValid(proc->databaseId))
			continue;
		flush[count++] = position;
	}
	*streaming = count;
	if (count >= n)
	{
		/* the n-th highest: sort descending */
		int			j;

		for (i = 1; i < count; i++)
		{
			XLogRecPtr	v = flush[i];

			for (j = i; j > 0 && flush[j - 1] < v; j--)
				flush[j] = flush[j - 1];
			flush[j] = v;
		}
		result = flush[n - 1];
	}
	pfree(flush);
	return result;
}

/*
 * worker_standbys_holding: whether mail waits for the standbys.
 */
bool
worker_standbys_holding(void)
{
	return !dlist_is_empty(&held_claims);
}

/*
 * worker_standbys_why: what the held mail waits for, for worker_status.
 */
const char *
worker_standbys_why(void)
{
	return held_why;
}

/*
 * worker_standbys_report: put in status, for worker_status, how many
 * claimed mails are held for the standbys and since when.
 */
void
worker_standbys_report(GatekeeperWorkerStatus *status)
{
	status->held_for_standbys = held_mails;
	status->held_since = dlist_is_empty(&held_claims) ? 0 :
		dlist_container(HeldClaim, node, dlist_head_node(&held_claims))->held_at;
}

/*
 * worker_standbys_poll_ms: how soon the worker looks at the standbys
 * again while mail waits for them (their progress wakes nobody).
 */
int
worker_standbys_poll_ms(void)
{
	return standbys_missing ? STANDBY_MISSING_POLL_MS : STANDBY_POLL_MS;
}
