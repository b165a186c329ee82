/*-------------------------------------------------------------------------
 *
 * worker_slots.c
 *		The background workers' slots in shared memory: who is connected to
 *		which database, the flag and latch that wake each, the status each
 *		publishes for gatekeeper.worker_status and delivery_latency, the
 *		time the first worker is to announce, and this server's
 *		incarnation.
 *
 * Shared memory holds one slot per worker: the worker's PID, its PGPROC
 * number and database (never a pointer), a flag saying its last attempt to
 * connect did not finish, and an atomic "wake" flag.  It is there only
 * when the library was preloaded; otherwise every function here quietly
 * does nothing (or returns no rows).
 *
 * Shared memory also holds this server's incarnation: a random number
 * drawn whenever it is initialized (at start, and again after a crash),
 * which the background workers' claims carry in their worker name, so
 * that a promoted standby or a restarted server knows the claims of
 * workers that are gone (see gatekeeper.reap in the install script).
 *
 * IDENTIFICATION
 *		src/worker_slots.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "worker_slots.h"
#include "catalog.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "gatekeeper.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

/*
 * The delivery latency buckets, in seconds: from the pipeline's
 * milliseconds after a commit wakes the worker, through a busy relay's
 * seconds, to the hour of a backlog.
 */
const double gatekeeper_latency_bounds[GATEKEEPER_LATENCY_BUCKETS] = {
	0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600
};

/*
 * One background worker's slot.  pid is 0 while no worker is connected
 * through this slot.
 */
typedef struct GatekeeperSlot
{
	pid_t		pid;			/* the worker's PID, or 0 */
	int			pgprocno;		/* its PGPROC, whose latch wakes it */
	Oid			database;		/* the database it is connected to */
	bool		connecting;		/* a connection attempt has not finished */
	pg_atomic_uint32 wake;		/* due mail was committed since it looked */
	GatekeeperWorkerStatus status;	/* protected by the mutex */
} GatekeeperSlot;

typedef struct GatekeeperShared
{
	slock_t		mutex;			/* protects every slot's pid, pgprocno,
								 * database and connecting */
	pg_atomic_uint64 announce_due;	/* earliest due time of notify queues'
									 * mail committed since the first worker
									 * looked, or DT_NOEND */
	uint64		incarnation;	/* drawn when shared memory is initialized;
								 * never changes after */
	int			nslots;
	GatekeeperSlot slots[FLEXIBLE_ARRAY_MEMBER];
} GatekeeperShared;

/* NULL unless the library was preloaded */
static GatekeeperShared *gatekeeper_shared = NULL;

PG_FUNCTION_INFO_V1(gatekeeper_worker_status);
PG_FUNCTION_INFO_V1(gatekeeper_delivery_latency);
PG_FUNCTION_INFO_V1(gatekeeper_incarnation_sql);

static GatekeeperSlot *gatekeeper_slot(int slotno);
static void gatekeeper_slot_detach(int code, Datum arg);

/*
 * Bytes of shared memory: a header and one slot per worker.
 */
Size
gatekeeper_slots_shmem_size(void)
{
	return add_size(offsetof(GatekeeperShared, slots),
					mul_size(sizeof(GatekeeperSlot), gatekeeper_workers));
}

/*
 * gatekeeper_slots_shmem_init
 *		Create or attach to the slots, under AddinShmemInitLock.  They are
 *		created again, empty, whenever the postmaster reinitializes shared
 *		memory after a crash.
 */
void
gatekeeper_slots_shmem_init(void)
{
	bool		found;

	gatekeeper_shared = ShmemInitStruct("gatekeeper",
										gatekeeper_slots_shmem_size(),
										&found);
	if (!found)
	{
		int			i;

		SpinLockInit(&gatekeeper_shared->mutex);
		pg_atomic_init_u64(&gatekeeper_shared->announce_due, (uint64) DT_NOEND);

		/*
		 * Random, not the start time: a crash-restart initializes shared
		 * memory again under the same postmaster start time, and a
		 * primary and its standbys share the system identifier.
		 */
		if (!pg_strong_random(&gatekeeper_shared->incarnation,
							  sizeof(gatekeeper_shared->incarnation)))
			gatekeeper_shared->incarnation = (uint64) GetCurrentTimestamp() ^
				((uint64) MyProcPid << 32);
		gatekeeper_shared->nslots = gatekeeper_workers;
		for (i = 0; i < gatekeeper_workers; i++)
		{
			GatekeeperSlot *slot = &gatekeeper_shared->slots[i];

			slot->pid = 0;
			slot->pgprocno = INVALID_PGPROCNO;
			slot->database = InvalidOid;
			slot->connecting = false;
			memset(&slot->status, 0, sizeof(slot->status));
			pg_atomic_init_u32(&slot->wake, 0);
		}
	}
}

/*
 * gatekeeper_slots_present
 *		Whether the slots are there (the library was preloaded): without
 *		them there is no worker to wake.
 */
bool
gatekeeper_slots_present(void)
{
	return gatekeeper_shared != NULL;
}

/*
 * The slot of worker slotno; a can't-happen error when there is none.
 */
static GatekeeperSlot *
gatekeeper_slot(int slotno)
{
	if (gatekeeper_shared == NULL ||
		slotno < 0 || slotno >= gatekeeper_shared->nslots)
		elog(FATAL, "gatekeeper worker slot %d does not exist", slotno);

	return &gatekeeper_shared->slots[slotno];
}

/*
 * Mark whether worker slotno is trying to connect to its database, and
 * return what the mark was.  A worker that finds it already set knows its
 * predecessor failed to connect (the database does not exist, say).
 */
bool
gatekeeper_slot_connecting(int slotno, bool connecting)
{
	GatekeeperSlot *slot = gatekeeper_slot(slotno);
	bool		was;

	SpinLockAcquire(&gatekeeper_shared->mutex);
	was = slot->connecting;
	slot->connecting = connecting;
	SpinLockRelease(&gatekeeper_shared->mutex);

	return was;
}

/*
 * Publish this connected worker in slot slotno so that commits of due mail
 * wake it; it is withdrawn when the process exits.
 */
void
gatekeeper_slot_attach(int slotno)
{
	GatekeeperSlot *slot = gatekeeper_slot(slotno);

	SpinLockAcquire(&gatekeeper_shared->mutex);
	slot->pid = MyProcPid;
	slot->pgprocno = MyProc->pgprocno;
	slot->database = MyDatabaseId;
	slot->connecting = false;
	memset(&slot->status, 0, sizeof(slot->status));
	SpinLockRelease(&gatekeeper_shared->mutex);

	before_shmem_exit(gatekeeper_slot_detach, Int32GetDatum(slotno));
}

/*
 * before_shmem_exit callback: withdraw this worker from its slot.
 */
static void
gatekeeper_slot_detach(int code, Datum arg)
{
	GatekeeperSlot *slot = gatekeeper_slot(DatumGetInt32(arg));

	(void) code;

	SpinLockAcquire(&gatekeeper_shared->mutex);
	if (slot->pid == MyProcPid)
	{
		slot->pid = 0;
		slot->pgprocno = INVALID_PGPROCNO;
		slot->database = InvalidOid;
	}
	SpinLockRelease(&gatekeeper_shared->mutex);
}

/*
 * Whether due mail was committed for worker slotno since it last consumed
 * the flag; consume clears it.
 */
bool
gatekeeper_slot_woken(int slotno, bool consume)
{
	GatekeeperSlot *slot = gatekeeper_slot(slotno);

	if (consume)
		return pg_atomic_exchange_u32(&slot->wake, 0) != 0;
	return pg_atomic_read_u32(&slot->wake) != 0;
}

/*
 * For the first worker: the earliest due time posted since it last asked,
 * or DT_NOEND; asking consumes it.
 */
TimestampTz
gatekeeper_announce_posted(void)
{
	if (gatekeeper_shared == NULL)
		return DT_NOEND;
	return (TimestampTz) pg_atomic_exchange_u64(&gatekeeper_shared->announce_due,
												(uint64) DT_NOEND);
}

/*
 * gatekeeper_slots_wake_database
 *		Set the wake flag and the latch of every worker connected to this
 * database, except this process.  Runs after the commit is visible, so a
 * worker that wakes sees the mail.  Must not fail.
 */
void
gatekeeper_slots_wake_database(void)
{
	int			i;

	for (i = 0; i < gatekeeper_shared->nslots; i++)
	{
		GatekeeperSlot *slot = &gatekeeper_shared->slots[i];
		pid_t		pid;
		int			pgprocno;
		Oid			database;

		SpinLockAcquire(&gatekeeper_shared->mutex);
		pid = slot->pid;
		pgprocno = slot->pgprocno;
		database = slot->database;
		SpinLockRelease(&gatekeeper_shared->mutex);

		if (pid == 0 || pid == MyProcPid || database != MyDatabaseId)
			continue;

		/*
		 * The worker may exit, and its PGPROC be reused, right after we read
		 * its slot: then another process gets a spurious wakeup, which every
		 * latch user tolerates.
		 */
		pg_atomic_write_u32(&slot->wake, 1);
		SetLatch(&GetPGProcByNumber(pgprocno)->procLatch);
	}
}

/*
 * gatekeeper_slots_post_announcement
 *		Post a due time to announce (the minimum of what is posted wins) and wake
 * the first worker, which announces, when it serves this database (while
 * it is not running, it looks at everything when it starts).  Runs after
 * the commit is visible, so the worker that looks sees the mail.  Must not
 * fail.
 */
void
gatekeeper_slots_post_announcement(TimestampTz due)
{
	GatekeeperSlot *slot;
	uint64		old;
	pid_t		pid;
	int			pgprocno;
	Oid			database;

	if (gatekeeper_shared->nslots == 0)
		return;
	slot = &gatekeeper_shared->slots[0];
	SpinLockAcquire(&gatekeeper_shared->mutex);
	pid = slot->pid;
	pgprocno = slot->pgprocno;
	database = slot->database;
	SpinLockRelease(&gatekeeper_shared->mutex);
	if (pid == 0 || database != MyDatabaseId)
		return;

	old = pg_atomic_read_u64(&gatekeeper_shared->announce_due);
	while ((TimestampTz) old > due &&
		   !pg_atomic_compare_exchange_u64(&gatekeeper_shared->announce_due, &old, (uint64) due))
		;
	SetLatch(&GetPGProcByNumber(pgprocno)->procLatch);
}

/*
 * gatekeeper_slot_report
 *		Publish worker slotno's status for gatekeeper.worker_status.
 */
void
gatekeeper_slot_report(int slotno, const GatekeeperWorkerStatus *status)
{
	GatekeeperSlot *slot = gatekeeper_slot(slotno);

	SpinLockAcquire(&gatekeeper_shared->mutex);
	slot->status = *status;
	SpinLockRelease(&gatekeeper_shared->mutex);
}

/*
 * gatekeeper._worker_status(): one row per connected worker and relay of
 * gatekeeper.smtp_url (one row, relay_url NULL, for a worker without a
 * relay), from shared memory (nothing is read from tables, so it answers
 * at once).  No rows when the library was not preloaded.
 */
Datum
gatekeeper_worker_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	GatekeeperWorkerStatus *st = palloc(sizeof(GatekeeperWorkerStatus));
	int			i;

	gatekeeper_require_schema();
	InitMaterializedSRF(fcinfo, 0);
	if (gatekeeper_shared == NULL)
		return (Datum) 0;

	for (i = 0; i < gatekeeper_shared->nslots; i++)
	{
		GatekeeperSlot *slot = &gatekeeper_shared->slots[i];
		pid_t		pid;
		int			r;

		SpinLockAcquire(&gatekeeper_shared->mutex);
		pid = slot->pid;
		*st = slot->status;
		SpinLockRelease(&gatekeeper_shared->mutex);
		if (pid == 0 || st->started == 0)
			continue;

		for (r = 0; r < Max(st->nrelays, 1); r++)
		{
			static const GatekeeperRelayStatus none = {.breaker = "closed"};
			const GatekeeperRelayStatus *rs = r < st->nrelays ? &st->relays[r] : &none;
			Datum		values[19];
			bool		nulls[19];

			memset(nulls, 0, sizeof(nulls));
			values[0] = Int32GetDatum((int32) pid);
			values[1] = TimestampTzGetDatum(st->started);
			values[2] = CStringGetTextDatum(st->state);
			values[3] = Int32GetDatum(st->in_flight);
			values[4] = Int32GetDatum(rs->connections);
			values[5] = CStringGetTextDatum(rs->breaker);
			values[6] = TimestampTzGetDatum(rs->last_success);
			nulls[6] = rs->last_success == 0;
			values[7] = CStringGetTextDatum(rs->last_error);
			nulls[7] = rs->last_error[0] == '\0';
			values[8] = TimestampTzGetDatum(rs->last_error_at);
			nulls[8] = rs->last_error_at == 0;
			values[9] = Int64GetDatum(rs->sent_total);
			values[10] = Int64GetDatum(st->unsigned_total);
			values[11] = Int64GetDatum(rs->deferred_total);
			values[12] = Int64GetDatum(rs->failed_total);
			values[13] = Int32GetDatum(i + 1);
			values[14] = CStringGetTextDatum(rs->url);
			nulls[14] = r >= st->nrelays;
			values[15] = CStringGetTextDatum(rs->last_reply);
			nulls[15] = rs->last_reply[0] == '\0';
			values[16] = TimestampTzGetDatum(rs->last_reply_at);
			nulls[16] = rs->last_reply_at == 0;
			values[17] = Int32GetDatum(st->held_for_standbys);
			values[18] = TimestampTzGetDatum(st->held_since);
			nulls[18] = st->held_since == 0;
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		}
	}
	pfree(st);
	return (Datum) 0;
}

/*
 * gatekeeper._delivery_latency(): one row per connected worker, from
 * shared memory: the upper bounds of the latency buckets in seconds, the
 * mails the relay accepted within each (cumulative, as Prometheus counts
 * a histogram's buckets), all of them, and the sum of their latencies in
 * seconds.  Since the worker started, like its sent_total.
 */
Datum
gatekeeper_delivery_latency(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum		bounds[GATEKEEPER_LATENCY_BUCKETS];
	int			i;
	int			b;

	InitMaterializedSRF(fcinfo, 0);
	if (gatekeeper_shared == NULL)
		return (Datum) 0;
	for (b = 0; b < GATEKEEPER_LATENCY_BUCKETS; b++)
		bounds[b] = Float8GetDatum(gatekeeper_latency_bounds[b]);

	for (i = 0; i < gatekeeper_shared->nslots; i++)
	{
		GatekeeperSlot *slot = &gatekeeper_shared->slots[i];
		GatekeeperWorkerStatus st;
		pid_t		pid;
		Datum		counts[GATEKEEPER_LATENCY_BUCKETS];
		int64		total = 0;
		Datum		values[5];
		bool		nulls[5] = {false, false, false, false, false};

		SpinLockAcquire(&gatekeeper_shared->mutex);
		pid = slot->pid;
		st = slot->status;
		SpinLockRelease(&gatekeeper_shared->mutex);
		if (pid == 0 || st.started == 0)
			continue;

		for (b = 0; b < GATEKEEPER_LATENCY_BUCKETS; b++)
		{
			total += st.latency_buckets[b];
			counts[b] = Int64GetDatum(total);
		}
		total += st.latency_buckets[GATEKEEPER_LATENCY_BUCKETS];
		values[0] = Int32GetDatum(i + 1);
		values[1] = gatekeeper_array(bounds, NULL, GATEKEEPER_LATENCY_BUCKETS, FLOAT8OID);
		values[2] = gatekeeper_array(counts, NULL, GATEKEEPER_LATENCY_BUCKETS, INT8OID);
		values[3] = Int64GetDatum(total);
		values[4] = Float8GetDatum(st.latency_sum);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/*
 * gatekeeper_incarnation
 *		This server's incarnation as text (16 hex digits), or NULL when the
 *		library was not preloaded (then no background worker claims).
 */
const char *
gatekeeper_incarnation(void)
{
	static char text[17];

	if (gatekeeper_shared == NULL)
		return NULL;
	if (text[0] == '\0')
		snprintf(text, sizeof(text), "%016llx",
				 (unsigned long long) gatekeeper_shared->incarnation);
	return text;
}

/*
 * gatekeeper._incarnation() RETURNS text
 *		gatekeeper_incarnation() for SQL: reap() takes back the claims of
 *		background workers of any other incarnation.
 */
Datum
gatekeeper_incarnation_sql(PG_FUNCTION_ARGS)
{
	const char *incarnation = gatekeeper_incarnation();

	if (incarnation == NULL)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text(incarnation));
}

