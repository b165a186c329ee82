/*-------------------------------------------------------------------------
 *
 * count_totals.h
 *		The queues' totals in shared memory (count_totals.c): the store
 *		mail_count.c adds each committed transaction's counts to.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_COUNT_TOTALS_H
#define GATEKEEPER_COUNT_TOTALS_H

/* What is counted, in the order of queue_stats' columns */
typedef enum CountKind
{
	COUNT_ENQUEUED,
	COUNT_SENT,					/* the outcomes: finished mail by state */
	COUNT_FAILED,
	COUNT_SUPPRESSED,
	COUNT_EXPIRED,
	COUNT_CANCELLED,
	COUNT_UNKNOWN,
	COUNT_DEFERRED,				/* the events, by queue */
	COUNT_BOUNCED,
	COUNT_COMPLAINED,
	COUNT_REPORTS,				/* reports recorded and ignored, under the */
	COUNT_IGNORED,				/* key of the empty name (no queue's) */
	COUNT_KINDS
} CountKind;

/* A queue's entry: its database, gatekeeper's pg_extension OID, its name's hash */
typedef struct CountKey
{
	Oid			database;
	Oid			extension;
	uint64		queue;			/* hashtextextended(name, 0) */
} CountKey;

/* What a change removes from the store instead of adding counts */
typedef enum CountForget
{
	FORGET_NOTHING = 0,			/* it adds counts */
	FORGET_QUEUE,				/* the key's entry: its queue was deleted */
	FORGET_EXTENSION,			/* every entry of the key's database and
								 * extension: DROP EXTENSION */
	FORGET_DATABASE				/* every entry of the key's database: DROP
								 * DATABASE */
} CountForget;

/* One committed change: counts added to the key's entry, or a forget */
typedef struct CountTotalsChange
{
	CountKey	key;
	CountForget forget;
	int64		counts[COUNT_KINDS];
} CountTotalsChange;

/* Hands the changes to count_totals_commit one by one; NULL at the end */
typedef const CountTotalsChange *(*CountTotalsNext) (void *arg);

extern bool count_totals_kept(void);
extern Oid	count_totals_extension(void);
extern void count_totals_forget_extension(void);
extern CountKey count_totals_key(Oid extension, const char *name, int len);
extern void count_totals_make_room(Oid extension);
extern void count_totals_commit(CountTotalsNext next, void *arg);

#endif							/* GATEKEEPER_COUNT_TOTALS_H */
