/*-------------------------------------------------------------------------
 *
 * count_totals.c
 *		The queues' totals (enqueued, the outcomes, the events, the
 *		reports), kept in shared memory so that gatekeeper.queue_stats never
 *		counts rows: the store, and the SQL functions that read it.
 *
 * What is counted, and when, is mail_count.c's: it adds a committed
 * transaction's counts here, after the commit.  This file keeps them: a
 * fixed-size shared hash keyed by database, the extension's OID (a new
 * CREATE EXTENSION starts afresh) and a 64-bit hash of the queue's name,
 * the one hashtextextended(name, 0) gives, by which the view joins the
 * totals to gatekeeper.queue in one pass.  Like PostgreSQL's statistics,
 * the postmaster writes the hash to pg_stat/gatekeeper.stat at a clean
 * shutdown and reads it back (and removes the file) at start: after a
 * crash the totals start at zero.  gatekeeper.reset_stats() zeroes the
 * current database's.
 *
 * The hash never holds more than STATS_MAX_QUEUES entries: dynahash would
 * take further ones from the server's spare shared memory, which the lock
 * table and others need, so a queue beyond the bound gets no totals (a LOG
 * line says so, once until entries are freed again).  Entries are freed
 * when the transaction that drops their queue, their extension or their
 * database commits (mail_count.c notes the drops), so nothing of a
 * database that is gone is kept or written at shutdown; and when the hash
 * is full, a backend that has counts to add frees the entries of databases
 * that no longer exist and of its own database's former extensions (left
 * by a server that did not free them).
 *
 * Why totals live here and the live gauges in rows: docs/internals.md,
 * "Counting".
 *
 * IDENTIFICATION
 *		src/mail/count_totals.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "count_totals.h"
#include "mail_store.h"

#include <unistd.h>

#include "access/htup_details.h"
#include "catalog/pg_database.h"
#include "commands/extension.h"
#include "common/hashfn.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "catalog.h"
#include "gatekeeper.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

PG_FUNCTION_INFO_V1(gatekeeper_queue_totals);
PG_FUNCTION_INFO_V1(gatekeeper_queue_rates);
PG_FUNCTION_INFO_V1(gatekeeper_reset_stats);

/* Queues whose totals shared memory holds, server-wide */
#define STATS_MAX_QUEUES	5000

/* Least time between two sweeps of a full hash by one backend */
#define STATS_SWEEP_INTERVAL_MS	10000

#define STATS_FILE			"pg_stat/gatekeeper.stat"
#define STATS_FILE_TMP		STATS_FILE ".tmp"
#define STATS_FILE_MAGIC	0x474B5332	/* "GKS2" */
#define STATS_TRANCHE		"gatekeeper stats"

/*
 * The rate: the mails each queue finished by delivery work
 * (sent, failed, suppressed, expired, unknown: not cancelled), in
 * RATE_SLOTS slots of RATE_SLOT_SECONDS each, the slot of second t being
 * (t / RATE_SLOT_SECONDS) % RATE_SLOTS, stamped with t / RATE_SLOT_SECONDS
 * so that a slot left from an earlier minute counts nothing.
 */
#define RATE_SLOTS			12
#define RATE_SLOT_SECONDS	5

/* What the totals file holds of an entry (its layout, for the file) */
typedef struct StatsSaved
{
	CountKey	key;
	int64		counts[COUNT_KINDS];
} StatsSaved;

typedef struct StatsEntry
{
	CountKey	key;
	int64		counts[COUNT_KINDS];
	int64		recent[RATE_SLOTS]; /* mails finished in each slot */
	int64		recent_tick[RATE_SLOTS];	/* the slot's time, in slots */
} StatsEntry;

typedef struct StatsShared
{
	LWLock	   *lock;			/* protects the hash and its entries */
	bool		full_logged;	/* "totals not kept" was logged (since the
								 * last entries were freed) */
} StatsShared;

/* NULL unless the library was preloaded */
static StatsShared *stats_shared = NULL;
static HTAB *stats_hash = NULL;

static TimestampTz last_sweep = 0;

/* count_totals_extension()'s cache */
static LocalTransactionId extension_lxid = InvalidLocalTransactionId;
static Oid	extension_oid = InvalidOid;

static Size totals_shmem_size(void);
static bool stats_full(void);
static void stats_sweep(Oid extension);
static int	forget_matching(const CountKey *key, CountForget what);
static int64 rate_tick(TimestampTz now);
static void stats_load(void);
static void stats_save(int code, Datum arg);

/*
 * Bytes of shared memory for the totals.
 */
static Size
totals_shmem_size(void)
{
	return add_size(MAXALIGN(sizeof(StatsShared)),
					hash_estimate_size(STATS_MAX_QUEUES, sizeof(StatsEntry)));
}

/*
 * mail_store_totals_shmem_request
 *		shmem_request_hook's part: the space and the lock.
 */
void
mail_store_totals_shmem_request(void)
{
	RequestAddinShmemSpace(totals_shmem_size());
	RequestNamedLWLockTranche(STATS_TRANCHE, 1);
}

/*
 * mail_store_totals_shmem_init
 *		shmem_startup_hook's part, with AddinShmemInitLock held: create or
 *		attach to the totals.  The postmaster loads the file of the last
 *		clean shutdown into a new hash and writes it again when it exits.
 */
void
mail_store_totals_shmem_init(void)
{
	bool		found;
	HASHCTL		info;

	stats_shared = ShmemInitStruct("gatekeeper stats", sizeof(StatsShared), &found);
	if (!found)
	{
		stats_shared->lock = &(GetNamedLWLockTranche(STATS_TRANCHE))->lock;
		stats_shared->full_logged = false;
	}
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(CountKey);
	info.entrysize = sizeof(StatsEntry);
	stats_hash = ShmemInitHash("gatekeeper stats hash",
							   STATS_MAX_QUEUES, STATS_MAX_QUEUES,
							   &info, HASH_ELEM | HASH_BLOBS);
	if (!IsUnderPostmaster)
	{
		on_shmem_exit(stats_save, (Datum) 0);
		if (!found)
			stats_load();
	}
}

/*
 * count_totals_kept
 *		Whether the totals are kept: only when the library was preloaded.
 */
bool
count_totals_kept(void)
{
	return stats_hash != NULL;
}

/*
 * count_totals_key
 *		The key of a queue's totals in the current database, under the
 *		extension of that OID.
 */
CountKey
count_totals_key(Oid extension, const char *name, int len)
{
	CountKey	key;

	memset(&key, 0, sizeof(key));
	key.database = MyDatabaseId;
	key.extension = extension;
	/* what hashtextextended(name, 0) returns for a deterministic collation */
	key.queue = hash_bytes_extended((const unsigned char *) name, len, 0);
	return key;
}

/*
 * count_totals_make_room
 *		Before counts are noted, inside a transaction: when the hash is
 *		full, free what dropped databases and extensions left.
 */
void
count_totals_make_room(Oid extension)
{
	if (stats_full())
		stats_sweep(extension);
}

/*
 * count_totals_extension
 *		gatekeeper's pg_extension OID, which keys the totals: looked up once
 *		per transaction (a report counted per call would otherwise make a
 *		catalog lookup per call).  Within the transaction only this backend
 *		can drop or make the extension (the locks on the tables it counted
 *		or read block anyone else's DROP EXTENSION), and
 *		count_totals_forget_extension, called from the object access hook,
 *		then forgets the OID at once.
 */
Oid
count_totals_extension(void)
{
	if (extension_lxid != MyProc->lxid || !OidIsValid(extension_oid))
	{
		extension_oid = get_extension_oid("gatekeeper", true);
		extension_lxid = MyProc->lxid;
	}
	return extension_oid;
}

/*
 * count_totals_forget_extension
 *		An extension was dropped or made in this transaction: look again.
 */
void
count_totals_forget_extension(void)
{
	extension_oid = InvalidOid;
}

/*
 * gatekeeper_queue_totals
 *		gatekeeper._queue_totals(): the committed totals of the current
 *		database's queues since the server started (or the last reset), one
 *		row per queue that has any, keyed by hashtextextended(name, 0);
 *		no rows when the library was not preloaded.
 */
Datum
gatekeeper_queue_totals(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	HASH_SEQ_STATUS scan;
	StatsEntry *entry;
	StatsEntry *found;
	Oid			extension;
	int			n = 0;
	int			max = 64;
	int			i;

	gatekeeper_require_schema();
	InitMaterializedSRF(fcinfo, 0);
	if (stats_hash == NULL)
		return (Datum) 0;

	/* copy under the lock, build the rows after */
	extension = count_totals_extension();
	found = palloc(max * sizeof(StatsEntry));
	LWLockAcquire(stats_shared->lock, LW_SHARED);
	hash_seq_init(&scan, stats_hash);
	while ((entry = hash_seq_search(&scan)) != NULL)
	{
		if (entry->key.database != MyDatabaseId || entry->key.extension != extension)
			continue;
		if (n == max)
		{
			max *= 2;
			found = repalloc(found, max * sizeof(StatsEntry));
		}
		found[n++] = *entry;
	}
	LWLockRelease(stats_shared->lock);

	for (i = 0; i < n; i++)
	{
		Datum		values[COUNT_KINDS + 1];
		bool		nulls[COUNT_KINDS + 1];
		int			k;

		memset(nulls, 0, sizeof(nulls));
		values[0] = Int64GetDatum((int64) found[i].key.queue);
		for (k = 0; k < COUNT_KINDS; k++)
			values[k + 1] = Int64GetDatum(found[i].counts[k]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/*
 * gatekeeper_reset_stats
 *		gatekeeper.reset_stats(): zero the totals of every queue of the
 *		current database, at once (not at commit, like pg_stat_reset).
 */
Datum
gatekeeper_reset_stats(PG_FUNCTION_ARGS)
{
	HASH_SEQ_STATUS scan;
	StatsEntry *entry;

	gatekeeper_require_schema();
	if (stats_hash == NULL)
		PG_RETURN_VOID();

	LWLockAcquire(stats_shared->lock, LW_EXCLUSIVE);
	hash_seq_init(&scan, stats_hash);
	while ((entry = hash_seq_search(&scan)) != NULL)
	{
		if (entry->key.database == MyDatabaseId)
			hash_search(stats_hash, &entry->key, HASH_REMOVE, NULL);
	}
	LWLockRelease(stats_shared->lock);
	PG_RETURN_VOID();
}

/*
 * The slot number of a time: whole RATE_SLOT_SECONDS since 2000-01-01.
 */
static int64
rate_tick(TimestampTz now)
{
	return now / (RATE_SLOT_SECONDS * USECS_PER_SEC);
}

/*
 * gatekeeper_queue_rates
 *		gatekeeper._queue_rates(): per queue of the current database that
 *		finished mail by delivery work in the last minute, the mails per
 *		second over that minute (its slots of the last 55 to 60 seconds,
 *		the current one partly passed), or over the time since the server
 *		started when that is shorter; keyed as _queue_totals.
 */
Datum
gatekeeper_queue_rates(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	HASH_SEQ_STATUS scan;
	StatsEntry *entry;
	Oid			extension;
	TimestampTz now = GetCurrentTimestamp();
	int64		tick = rate_tick(now);
	double		span;
	double		running;
	uint64	   *queues;
	int64	   *finished;
	int			n = 0;
	int			max = 64;
	int			i;

	gatekeeper_require_schema();
	InitMaterializedSRF(fcinfo, 0);
	if (stats_hash == NULL)
		return (Datum) 0;

	/* the slots' span: from the start of the oldest slot counted to now */
	span = (double) (now - (tick - (RATE_SLOTS - 1)) * RATE_SLOT_SECONDS * USECS_PER_SEC) /
		USECS_PER_SEC;
	running = (double) (now - PgStartTime) / USECS_PER_SEC;
	if (running < span)
		span = Max(running, 1.0);

	extension = count_totals_extension();
	queues = palloc(max * sizeof(uint64));
	finished = palloc(max * sizeof(int64));
	LWLockAcquire(stats_shared->lock, LW_SHARED);
	hash_seq_init(&scan, stats_hash);
	while ((entry = hash_seq_search(&scan)) != NULL)
	{
		int64		sum = 0;
		int			k;

		if (entry->key.database != MyDatabaseId || entry->key.extension != extension)
			continue;
		for (k = 0; k < RATE_SLOTS; k++)
			if (entry->recent_tick[k] > tick - RATE_SLOTS && entry->recent_tick[k] <= tick)
				sum += entry->recent[k];
		if (sum == 0)
			continue;
		if (n == max)
		{
			max *= 2;
			queues = repalloc(queues, max * sizeof(uint64));
			finished = repalloc(finished, max * sizeof(int64));
		}
		queues[n] = entry->key.queue;
		finished[n++] = sum;
	}
	LWLockRelease(stats_shared->lock);

	for (i = 0; i < n; i++)
	{
		Datum		values[2];
		bool		nulls[2] = {false, false};

		values[0] = Int64GetDatum((int64) queues[i]);
		values[1] = Float8GetDatum((double) finished[i] / span);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/*
 * count_totals_commit
 *		Add a committed transaction's changes, as next hands them, in the
 *		order they were noted.  Runs after the commit: must not fail.
 */
void
count_totals_commit(CountTotalsNext next, void *arg)
{
	const CountTotalsChange *p;
	bool		full = false;
	int64		tick;

	if (stats_hash == NULL)
		return;
	tick = rate_tick(GetCurrentTimestamp());
	LWLockAcquire(stats_shared->lock, LW_EXCLUSIVE);
	while ((p = next(arg)) != NULL)
	{
		StatsEntry *entry;
		int			k;
		int64		finished;
		int			slot = (int) (tick % RATE_SLOTS);

		if (p->forget != FORGET_NOTHING)
		{
			if (forget_matching(&p->key, p->forget) > 0)
				stats_shared->full_logged = false;
			continue;
		}
		entry = hash_search(stats_hash, &p->key, HASH_FIND, NULL);
		if (entry == NULL)
		{
			/* never past the bound: further entries would take spare memory */
			if (hash_get_num_entries(stats_hash) < STATS_MAX_QUEUES)
				entry = hash_search(stats_hash, &p->key, HASH_ENTER_NULL, NULL);
			if (entry == NULL)
			{
				full |= !stats_shared->full_logged;
				stats_shared->full_logged = true;
				continue;
			}
			memset(entry->counts, 0, sizeof(entry->counts));
			memset(entry->recent, 0, sizeof(entry->recent));
			memset(entry->recent_tick, 0, sizeof(entry->recent_tick));
		}
		for (k = 0; k < COUNT_KINDS; k++)
			entry->counts[k] += p->counts[k];
		finished = p->counts[COUNT_SENT] + p->counts[COUNT_FAILED] +
			p->counts[COUNT_SUPPRESSED] + p->counts[COUNT_EXPIRED] +
			p->counts[COUNT_UNKNOWN];
		if (finished > 0)
		{
			if (entry->recent_tick[slot] != tick)
			{
				entry->recent_tick[slot] = tick;
				entry->recent[slot] = 0;
			}
			entry->recent[slot] += finished;
		}
	}
	LWLockRelease(stats_shared->lock);
	if (full)
		ereport(LOG,
				(errmsg("gatekeeper keeps the totals of %d queues at most: further queues have none",
						STATS_MAX_QUEUES),
				 errhint("Dropped queues, extensions and databases make room, and so does reset_stats().")));
}

/*
 * Remove the entries a commit forgets: the key's (FORGET_QUEUE), or every
 * entry of its database and extension, or of its database.  Returns how
 * many went.  With the lock held exclusively.
 */
static int
forget_matching(const CountKey *key, CountForget what)
{
	HASH_SEQ_STATUS scan;
	StatsEntry *entry;
	int			n = 0;

	if (what == FORGET_QUEUE)
		return hash_search(stats_hash, key, HASH_REMOVE, NULL) != NULL ? 1 : 0;
	hash_seq_init(&scan, stats_hash);
	while ((entry = hash_seq_search(&scan)) != NULL)
	{
		if (entry->key.database != key->database)
			continue;
		if (what == FORGET_EXTENSION && entry->key.extension != key->extension)
			continue;
		/* removing the element just returned is allowed during a scan */
		hash_search(stats_hash, &entry->key, HASH_REMOVE, NULL);
		n++;
	}
	return n;
}

/*
 * Whether the hash is at its bound (read without the lock: a hint).
 */
static bool
stats_full(void)
{
	return stats_hash != NULL && hash_get_num_entries(stats_hash) >= STATS_MAX_QUEUES;
}

/*
 * A full hash: free the entries of databases that no longer exist, and of
 * the current database's extensions but the current one (a server whose
 * drops did not free them, or a totals file it wrote, may have left them).
 * Inside a transaction, at most once per STATS_SWEEP_INTERVAL_MS in each
 * backend.  The databases are looked up without the lock: a database with
 * entries existed when they were counted, and one dropped meanwhile frees
 * its own at commit.
 */
static void
stats_sweep(Oid extension)
{
	HASH_SEQ_STATUS scan;
	StatsEntry *entry;
	Oid		   *databases;
	bool	   *gone;
	int			ndatabases = 0;
	int			maxdatabases = 16;
	int			freed = 0;
	int			i;
	TimestampTz now = GetCurrentTimestamp();

	if (!IsTransactionState() ||
		!TimestampDifferenceExceeds(last_sweep, now, STATS_SWEEP_INTERVAL_MS))
		return;
	last_sweep = now;

	/* the databases that have entries */
	databases = palloc(maxdatabases * sizeof(Oid));
	LWLockAcquire(stats_shared->lock, LW_SHARED);
	hash_seq_init(&scan, stats_hash);
	while ((entry = hash_seq_search(&scan)) != NULL)
	{
		for (i = 0; i < ndatabases; i++)
			if (databases[i] == entry->key.database)
				break;
		if (i < ndatabases)
			continue;
		if (ndatabases == maxdatabases)
		{
			maxdatabases *= 2;
			databases = repalloc(databases, maxdatabases * sizeof(Oid));
		}
		databases[ndatabases++] = entry->key.database;
	}
	LWLockRelease(stats_shared->lock);

	gone = palloc0(Max(ndatabases, 1) * sizeof(bool));
	for (i = 0; i < ndatabases; i++)
		gone[i] = databases[i] != MyDatabaseId &&
			!SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(databases[i]));

	LWLockAcquire(stats_shared->lock, LW_EXCLUSIVE);
	hash_seq_init(&scan, stats_hash);
	while ((entry = hash_seq_search(&scan)) != NULL)
	{
		bool		dead = false;

		if (entry->key.database == MyDatabaseId)
			dead = entry->key.extension != extension;
		else
		{
			for (i = 0; i < ndatabases; i++)
				if (databases[i] == entry->key.database)
					break;
			dead = i < ndatabases && gone[i];
		}
		if (dead)
		{
			hash_search(stats_hash, &entry->key, HASH_REMOVE, NULL);
			freed++;
		}
	}
	if (freed > 0)
		stats_shared->full_logged = false;
	LWLockRelease(stats_shared->lock);
	pfree(databases);
	pfree(gone);
	if (freed > 0)
		ereport(LOG,
				(errmsg_plural("gatekeeper freed the totals of %d queue of dropped databases or extensions",
							   "gatekeeper freed the totals of %d queues of dropped databases or extensions",
							   freed, freed)));
}

/*
 * In the postmaster at start: read the totals of the last clean shutdown,
 * then remove the file, so that after a crash the totals start at zero.
 */
static void
stats_load(void)
{
	FILE	   *file;
	uint32		header[2];
	StatsSaved	e;
	uint32		n;

	file = AllocateFile(STATS_FILE, PG_BINARY_R);
	if (file == NULL)
	{
		if (errno != ENOENT)
			ereport(LOG,
					(errcode_for_file_access(),
					 errmsg("could not read file \"%s\": %m", STATS_FILE)));
		return;
	}
	if (fread(header, sizeof(header), 1, file) != 1 || header[0] != STATS_FILE_MAGIC)
		ereport(LOG,
				(errmsg("ignoring gatekeeper totals file \"%s\": not one this version wrote",
						STATS_FILE)));
	else
	{
		for (n = 0; n < header[1] && n < STATS_MAX_QUEUES &&
			 fread(&e, sizeof(e), 1, file) == 1; n++)
		{
			StatsEntry *entry = hash_search(stats_hash, &e.key, HASH_ENTER_NULL, NULL);

			if (entry == NULL)
				break;
			memcpy(entry->counts, e.counts, sizeof(e.counts));
			memset(entry->recent, 0, sizeof(entry->recent));
			memset(entry->recent_tick, 0, sizeof(entry->recent_tick));
		}
	}
	FreeFile(file);
	unlink(STATS_FILE);
}

/*
 * on_shmem_exit in the postmaster: at a clean exit write the totals, to a
 * temporary file renamed into place.
 */
static void
stats_save(int code, Datum arg)
{
	FILE	   *file;
	HASH_SEQ_STATUS scan;
	StatsEntry *entry;
	uint32		header[2];

	if (code != 0 || stats_hash == NULL)
		return;
	file = AllocateFile(STATS_FILE_TMP, PG_BINARY_W);
	if (file == NULL)
		goto error;
	header[0] = STATS_FILE_MAGIC;
	header[1] = (uint32) hash_get_num_entries(stats_hash);
	if (fwrite(header, sizeof(header), 1, file) != 1)
		goto error;
	hash_seq_init(&scan, stats_hash);
	while ((entry = hash_seq_search(&scan)) != NULL)
	{
		StatsSaved	saved;

		saved.key = entry->key;
		memcpy(saved.counts, entry->counts, sizeof(saved.counts));
		if (fwrite(&saved, sizeof(saved), 1, file) != 1)
		{
			hash_seq_term(&scan);
			goto error;
		}
	}
	if (FreeFile(file))
	{
		file = NULL;
		goto error;
	}
	(void) durable_rename(STATS_FILE_TMP, STATS_FILE, LOG);
	return;

error:
	ereport(LOG,
			(errcode_for_file_access(),
			 errmsg("could not write file \"%s\": %m", STATS_FILE_TMP)));
	if (file)
		FreeFile(file);
	unlink(STATS_FILE_TMP);
}
