/*-------------------------------------------------------------------------
 *
 * progress.c
 *		A word in the log when a queue's backlog starts draining and when it
 *		has drained (issue 47).
 *
 * A campaign of 100,000 mails going out at a rate limit is a long while
 * of nothing in the log, which looks like being stuck.  So the first
 * delivery worker looks at gatekeeper.queue_stats every PROGRESS_LOOK_MS
 * (at its housekeeping, in that transaction) and says, once each:
 *
 *	- that a queue is draining a backlog: at least PROGRESS_BACKLOG_MIN
 *	  mails due, and mail of the queue finished in the last minute (its
 *	  rate), with the rate and eta queue_stats gives;
 *	- that it has drained: no mail due any more, with how many mails the
 *	  queue finished since the first line, and in how long.
 *
 * A queue whose few due mails go at once (a password reset) says nothing;
 * a paused queue, or one whose relay is down, has a backlog that does not
 * drain, which worker_status and the alerts say.  The state is this
 * process's: a worker that restarts sees a backlog that is still draining
 * as new and says so again.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "progress.h"

#include "catalog.h"

#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

/* Least time between two looks */
#define PROGRESS_LOOK_MS		5000

/* Due mails that make a backlog worth a line */
#define PROGRESS_BACKLOG_MIN	100

/* The longest queue name told apart (longer ones by their first bytes) */
#define PROGRESS_NAME_MAX		256

/* One queue as the last look saw it */
typedef struct QueueProgress
{
	char		name[PROGRESS_NAME_MAX];	/* the hash key */
	uint64		look;			/* the look that last saw it */
	bool		draining;		/* its backlog was said to be draining */
	int64		finished_at_start;	/* mails finished by delivery work when
									 * it was said to be draining */
	TimestampTz started_at;
} QueueProgress;

static const char progress_sql[] =
	"SELECT s.queue, s.due, s.sent + s.failed + s.suppressed + s.expired + s.unknown,"
	" s.rate, s.eta::text FROM gatekeeper.queue_stats s";

static SPIPlanPtr progress_plan = NULL;
static HTAB *progress_queues = NULL;
static uint64 looks = 0;
static TimestampTz next_look = 0;

static void progress_note(const char *name, int64 due, int64 finished, double rate,
						  const char *eta, TimestampTz now);

/*
 * gatekeeper_progress_watch
 *		Look at every queue's progress, at most every PROGRESS_LOOK_MS, and
 *		log what started draining or has drained.  Called in a transaction,
 *		SPI connected (the first worker's housekeeping).
 */
void
gatekeeper_progress_watch(void)
{
	TimestampTz now = GetCurrentTimestamp();
	HASH_SEQ_STATUS scan;
	QueueProgress *q;
	uint64		i;

	if (now < next_look)
		return;
	next_look = TimestampTzPlusMilliseconds(now, PROGRESS_LOOK_MS);

	if (progress_queues == NULL)
	{
		HASHCTL		info;

		memset(&info, 0, sizeof(info));
		info.keysize = PROGRESS_NAME_MAX;
		info.entrysize = sizeof(QueueProgress);
		info.hcxt = TopMemoryContext;
		progress_queues = hash_create("gatekeeper queue progress", 64, &info,
									  HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}

	if (SPI_execute_plan(gatekeeper_plan(&progress_plan, progress_sql, 0, NULL),
						 NULL, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read gatekeeper.queue_stats");
	looks++;
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		char	   *name = SPI_getvalue(tuple, desc, 1);
		int64		due = DatumGetInt64(SPI_getbinval(tuple, desc, 2, &isnull));
		int64		finished = DatumGetInt64(SPI_getbinval(tuple, desc, 3, &isnull));
		double		rate = DatumGetFloat8(SPI_getbinval(tuple, desc, 4, &isnull));
		char	   *eta = SPI_getvalue(tuple, desc, 5);

		progress_note(name, due, finished, rate, eta, now);
	}

	/* forget the queues that are gone */
	hash_seq_init(&scan, progress_queues);
	while ((q = hash_seq_search(&scan)) != NULL)
	{
		if (q->look != looks)
			hash_search(progress_queues, q->name, HASH_REMOVE, NULL);
	}
}

/*
 * One queue's row of this look: log when its backlog started draining or
 * has drained, and remember what was seen.
 */
static void
progress_note(const char *name, int64 due, int64 finished, double rate,
			  const char *eta, TimestampTz now)
{
	char		key[PROGRESS_NAME_MAX];
	QueueProgress *q;
	bool		found;

	strlcpy(key, name, sizeof(key));
	q = hash_search(progress_queues, key, HASH_ENTER, &found);
	if (!found)
		q->draining = false;
	q->look = looks;

	if (!q->draining && due >= PROGRESS_BACKLOG_MIN && rate > 0)
	{
		q->draining = true;
		q->finished_at_start = finished;
		q->started_at = now;
		ereport(LOG,
				(errmsg("gatekeeper queue \"%s\" is draining a backlog: " INT64_FORMAT " mails due, %.1f mails/s, done in about %s",
						name, due, rate, eta ? eta : "(unknown)")));
	}
	else if (q->draining && due == 0)
	{
		q->draining = false;
		ereport(LOG,
				(errmsg("gatekeeper queue \"%s\" has drained its backlog: " INT64_FORMAT " mails finished in %.0f s",
						name, finished - q->finished_at_start,
						(double) (now - q->started_at) / USECS_PER_SEC)));
	}
}
