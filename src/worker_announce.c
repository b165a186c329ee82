/*-------------------------------------------------------------------------
 *
 * worker_announce.c
 *		The first background worker's announcements: NOTIFY gatekeeper,
 *		'<queue>' for the notify queues' mail that comes due after the
 *		commit that wrote it, when it comes due.
 *
 * A commit announces the mail of notify queues that is due by then
 * (src/wake.c); mail it writes due later is the first worker's to
 * announce, and so is mail that nack, unclaim or a claim's deferral makes
 * due later.  The worker looks at the notify queues' scheduled mail at
 * announce_seen: mail then due later, it announces when it comes due, and
 * only that.  A commit of mail due later posts its time and wakes the
 * worker, which looks at once; mail it finds already due had come due
 * between that commit and the look, and is announced then (nack and
 * unclaim post the same way).  The worker also looks every few seconds,
 * for mail a claim defers (a closed gate, a sending window), which posts
 * nothing.
 *
 * An announcement is a step of the worker's loop (src/worker_step.c): a
 * NOTIFY queue that a listener stuck in a transaction has let fill fails
 * its commit, and the worker, which may have mail on the wire, survives
 * that and announces again after a backoff.
 *
 * IDENTIFICATION
 *		src/worker_announce.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "worker_announce.h"
#include "gatekeeper.h"
#include "catalog.h"
#include "worker_slots.h"
#include "worker_step.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

static const char announce_due_sql[] =
"SELECT queue, next_due FROM gatekeeper._announce_due($1::text[], $2::timestamptz, $3::timestamptz)";

static SPIPlanPtr announce_due_plan = NULL;

/* a notify queue, and when its mail seen at announce_seen comes due */
typedef struct AnnounceQueue
{
	char	   *name;
	TimestampTz next_due;		/* of mail seen at announce_seen, or DT_NOEND */
} AnnounceQueue;

static AnnounceQueue *announce_queues = NULL;
static int	nannounce_queues = 0;
static TimestampTz announce_seen = 0;	/* 0: never looked */
static TimestampTz next_announce = 0;
/* the earliest due time posted and not yet announced, or DT_NOEND */
static TimestampTz announce_posted = DT_NOEND;

/* announce's work, run in a subtransaction (announce_step) */
typedef struct AnnounceStep
{
	Datum	   *due;			/* the queues whose mail came due */
	int			ndue;
	bool		every;			/* every notify queue with mail due since */
	TimestampTz since;
	TimestampTz now;
	AnnounceQueue *queues;		/* what is due later (TopMemoryContext) */
	int			nqueues;
} AnnounceStep;

/* how often the first worker looks at notify queues' mail without a post */
#define ANNOUNCE_INTERVAL_MS		5000

static WorkerTrouble announce_trouble = {.what = "announcing due mail"};

static bool announce_step(void *arg);
static void announce_failed(ErrorData *error, void *arg);
static void free_queues(AnnounceQueue *queues, int n);

/*
 * worker_announce: (the first worker only) NOTIFY the notify queues whose
 * mail, seen earlier as due later, is due now; when a commit posted mail
 * due later, or every few seconds, look again at what is due later (see
 * the file's banner).  The first look after the worker starts announces
 * every notify queue with due mail: what came due while no worker ran.
 */
void
worker_announce(void)
{
	TimestampTz now;
	TimestampTz posted;
	AnnounceStep step;
	int			k;

	if (!worker_extension_ready())
		return;
	now = GetCurrentTimestamp();
	/* what was posted is kept until an announcement covering it is committed */
	posted = Min(gatekeeper_announce_posted(), announce_posted);
	announce_posted = posted;
	if ((posted == DT_NOEND && now < next_announce) || now < announce_trouble.retry_at)
		return;

	if (!worker_begin_step("announcing due mail"))
	{
		worker_end_step();
		return;
	}

	/*
	 * Which queues to announce: those whose mail seen due later is due now;
	 * after a post of mail already due, or on the first look, every notify
	 * queue with mail due since then.
	 */
	step.due = palloc(sizeof(Datum) * Max(nannounce_queues, 1));
	step.ndue = 0;
	for (k = 0; k < nannounce_queues; k++)
		if (announce_queues[k].next_due <= now)
			step.due[step.ndue++] = CStringGetTextDatum(announce_queues[k].name);
	step.every = false;
	step.since = announce_seen;
	if (announce_seen == 0)
	{
		step.since = DT_NOBEGIN;
		step.every = true;
	}
	else if (posted <= now)
	{
		step.since = Min(step.since, posted - 1);
		step.every = true;
	}
	step.now = now;
	step.queues = NULL;
	step.nqueues = 0;

	/*
	 * In a subtransaction, and committed with the failure caught: a NOTIFY
	 * queue that is full fails the commit (a listener that stays in a
	 * transaction holds the queue's tail), and a worker that exited then
	 * would send its mail on the wire again.  What is due is announced
	 * again after a backoff.
	 */
	if (!worker_run_step(announce_step, &step, announce_failed, &step))
	{
		free_queues(step.queues, step.nqueues);
		return;
	}
	worker_step_passed(&announce_trouble);

	/* what is due later, as of now */
	free_queues(announce_queues, nannounce_queues);
	announce_queues = step.queues;
	nannounce_queues = step.nqueues;
	next_announce = TimestampTzPlusMilliseconds(now, nannounce_queues > 0 ?
												Min(gatekeeper_naptime, ANNOUNCE_INTERVAL_MS) :
												ANNOUNCE_INTERVAL_MS);
	for (k = 0; k < nannounce_queues; k++)
		next_announce = Min(next_announce, announce_queues[k].next_due);
	announce_seen = now;
	announce_posted = DT_NOEND;
}

/*
 * announce_step: announce's work, for worker_run_step: NOTIFY the
 * queues due, and read what is due later into step->queues
 * (TopMemoryContext, kept past the commit).
 */
static bool
announce_step(void *arg)
{
	AnnounceStep *step = (AnnounceStep *) arg;
	Datum		values[3];
	char		nulls[3] = {' ', ' ', ' '};
	Oid			argtypes[3] = {TEXTARRAYOID, TIMESTAMPTZOID, TIMESTAMPTZOID};
	MemoryContext old;
	uint64		i;

	if (step->every)
	{
		values[0] = (Datum) 0;
		nulls[0] = 'n';
	}
	else
		values[0] = gatekeeper_array(step->due, NULL, step->ndue, TEXTOID);
	values[1] = TimestampTzGetDatum(step->since);
	values[2] = TimestampTzGetDatum(step->now);

	if (SPI_execute_plan(gatekeeper_plan(&announce_due_plan, announce_due_sql, 3, argtypes),
						 values, nulls, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "gatekeeper._announce_due() failed");

	old = MemoryContextSwitchTo(TopMemoryContext);
	step->queues = palloc(sizeof(AnnounceQueue) * Max(SPI_processed, 1));
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		Datum		d;

		step->queues[i].name = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
		d = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2, &isnull);
		step->queues[i].next_due = isnull ? DT_NOEND : DatumGetTimestampTz(d);
		step->nqueues++;
	}
	MemoryContextSwitchTo(old);
	return true;
}

/*
 * The announcement failed, and was rolled back: say what it said, and
 * announce again after a backoff; what was posted meanwhile waits in
 * announce_posted.
 */
static void
announce_failed(ErrorData *error, void *arg)
{
	int64		backoff_ms = worker_step_failed(&announce_trouble, error, 0,
												WORKER_BACKOFF_MAX_MS);

	next_announce = announce_trouble.retry_at;
	worker_log_survived(error, " could not announce due mail",
						psprintf("The worker goes on delivering, and announces again in " INT64_FORMAT " ms.",
								 backoff_ms));
}

/*
 * Free a list of n notify queues (TopMemoryContext), NULL or not.
 */
static void
free_queues(AnnounceQueue *queues, int n)
{
	int			k;

	for (k = 0; k < n; k++)
		pfree(queues[k].name);
	if (queues != NULL)
		pfree(queues);
}

/*
 * worker_announce_next: when the first worker next looks at the notify
 * queues, without a post.
 */
TimestampTz
worker_announce_next(void)
{
	return next_announce;
}

/*
 * worker_announce_trouble: what the last announcement's failure said, for
 * worker_status, or NULL when the last one passed.
 */
const char *
worker_announce_trouble(void)
{
	return announce_trouble.failures > 0 ? announce_trouble.why : NULL;
}
