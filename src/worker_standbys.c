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
 * IDENTIFICATION
 *		src/worker_standbys.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "worker_standbys.h"
#include "gatekeeper.h"

#include "lib/ilist.h"
#include "replication/walsender.h"
#include "replication/walsender_private.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "storage/spin.h"
#include "utils/memutils.h"

/*
 * How often held mail looks at the standbys' flush positions: often while
 * enough standbys stream (it waits for a round trip), seldom while they
 * do not (it waits for an operator).
 */
#define STANDBY_POLL_MS				5
#define STANDBY_MISSING_POLL_MS		200

/* the claims whose mail waits for the standbys, oldest first */
typedef struct HeldClaim
{
	dlist_node	node;
	XLogRecPtr	lsn;			/* the end of the claim's commit record */
	int			mails;			/* its mails still on "pending" */
} HeldClaim;

static dlist_head held_claims = DLIST_STATIC_INIT(held_claims);
static char held_why[64];		/* what the held mail waits for */
static bool standbys_missing = false;	/* fewer than claim_standbys stream */

static XLogRecPtr standby_flush(int n, int *streaming);

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
	dlist_push_tail(&held_claims, &h->node);
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
		dlist_delete(&h->node);
		pfree(h);
	}
	if (dlist_is_empty(&held_claims))
		return cleared;

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
 * worker_standbys_poll_ms: how soon the worker looks at the standbys
 * again while mail waits for them (their progress wakes nobody).
 */
int
worker_standbys_poll_ms(void)
{
	return standbys_missing ? STANDBY_MISSING_POLL_MS : STANDBY_POLL_MS;
}
