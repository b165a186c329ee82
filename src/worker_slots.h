/*-------------------------------------------------------------------------
 *
 * worker_slots.h
 *		What the rest of gatekeeper uses of worker_slots.c: the background
 *		workers' slots in shared memory, the status each publishes, the
 *		announcement time and the server's incarnation.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_WORKER_SLOTS_H
#define GATEKEEPER_WORKER_SLOTS_H

#include "gatekeeper.h"

#include "datatype/timestamp.h"

/* What a worker shows in gatekeeper.worker_status of one of its relays. */
typedef struct GatekeeperRelayStatus
{
	char		url[256];		/* as in gatekeeper.smtp_url (no user, no password) */
	int			connections;	/* relay connections open or opening */
	char		breaker[16];	/* closed, open, throttled or half-open */
	TimestampTz last_success;	/* last mail the relay took, or 0 */
	char		last_error[256];	/* the relay's last refusal of the session */
	TimestampTz last_error_at;	/* or 0 */
	char		last_reply[256];	/* its last 4xx or 5xx to a transaction */
	TimestampTz last_reply_at;	/* or 0 */
	int64		sent_total;		/* mails sent since the worker started */
	int64		deferred_total; /* mails the relay deferred: 4xx, timeout, drop */
	int64		failed_total;	/* mails the relay refused for good: 5xx */
} GatekeeperRelayStatus;

/*
 * The upper bounds, in seconds, of the buckets of the delivery latency
 * histogram (gatekeeper.delivery_latency): from when a mail was due to the
 * relay's 2xx to its data.  Fixed, so that the series of every server and
 * every version add up.
 */
#define GATEKEEPER_LATENCY_BUCKETS 14
extern const double gatekeeper_latency_bounds[GATEKEEPER_LATENCY_BUCKETS];

/*
 * What a worker shows in gatekeeper.worker_status, a row per relay,
 * published in its slot by gatekeeper_slot_report.
 */
typedef struct GatekeeperWorkerStatus
{
	TimestampTz started;
	char		state[64];		/* what it is doing, and why when it waits */
	int			in_flight;		/* mails claimed and not yet recorded */
	int64		unsigned_total; /* messages built without a DKIM signature */
	int			nrelays;		/* relays in gatekeeper.smtp_url, 0 for none */
	GatekeeperRelayStatus relays[GATEKEEPER_MAX_RELAYS];
	/* delivery latency: from due to the relay's 2xx, by bucket (not cumulative) */
	int64		latency_buckets[GATEKEEPER_LATENCY_BUCKETS + 1];	/* the last: above every bound */
	double		latency_sum;	/* seconds */
	/* claimed mails held for gatekeeper.claim_standbys, since when, or 0 */
	int			held_for_standbys;
	TimestampTz held_since;
} GatekeeperWorkerStatus;

/* src/gatekeeper.c's shared memory hooks */
extern Size gatekeeper_slots_shmem_size(void);
extern void gatekeeper_slots_shmem_init(void);

/*
 * Each worker's slot, for src/worker.c.  slotno is the worker's
 * bgw_main_arg, 0 .. gatekeeper.workers - 1.
 */
extern bool gatekeeper_slot_connecting(int slotno, bool connecting);
extern void gatekeeper_slot_attach(int slotno);
extern bool gatekeeper_slot_woken(int slotno, bool consume);
extern void gatekeeper_slot_report(int slotno, const GatekeeperWorkerStatus *status);
extern const char *gatekeeper_incarnation(void);
extern TimestampTz gatekeeper_announce_posted(void);

/* waking, for src/wake.c */
extern bool gatekeeper_slots_present(void);
extern void gatekeeper_slots_wake_database(void);
extern void gatekeeper_slots_post_announcement(TimestampTz due);

#endif							/* GATEKEEPER_WORKER_SLOTS_H */
