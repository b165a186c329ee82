/*-------------------------------------------------------------------------
 *
 * gatekeeper.h
 *		Declarations shared by gatekeeper's source files.
 *
 * gatekeeper keeps scheduled email in PostgreSQL: applications enqueue
 * mail with SQL, claims hand each due mail to exactly one worker, gates
 * enforce per-recipient smart-sending windows and frequency caps, and a
 * background worker delivers claimed mail over SMTP.
 *
 * src/gatekeeper.c		module initialization, settings, shared state,
 *						wake-on-commit
 * src/worker.c			the background worker's loop
 * src/claim.c			claim
 * src/mail_state.c		a claimed mail's transitions: ack, nack, unclaim,
 *						extend
 * src/mail_state_funcs.c	their SQL functions
 * src/gate.c			gate decisions: lock, pass, release, write back
 * src/gate_store.c		the gates' shared-memory store: keys, entries,
 *						visibility, locking, gatekeeper.gate_memory
 * src/gate_log.c		the gates' durable log and its replay
 * src/gate_funcs.c		the gates' SQL-callable functions
 * src/mail.c			the insert trigger that validates every new mail
 * src/validate.c		address and header validation
 * src/address.c		display names: parsing senders, writing From and To
 * src/suppression.c	the suppression list and the claim's lookup in it
 * src/unsubscribe.c	one-click unsubscribe tokens and URLs
 * src/window.c		sending windows in a time zone
 * src/message.c		RFC 5322 message building
 * src/dkim.c			DKIM signing of built messages
 * src/smtp_client.c	the event-driven SMTP client the worker delivers with:
 *						its API and its wait; in layers below it
 * src/smtp_relay.c		a relay's connections: opened, closed, freed here
 * src/smtp_session.c	the SMTP session machine, one per connection
 * src/smtp_io.c		a connection's socket, TLS, bounded buffers, stuffing
 * src/smtp_config.c	relay URL, password file, DNS
 * src/stats.c			the queues' totals in shared memory, for queue_stats
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_H
#define GATEKEEPER_H

#include "postgres.h"

#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "utils/jsonb.h"
#include "utils/rel.h"
#include "utils/timestamp.h"

/*
 * Settings (src/gatekeeper.c).  Times are in milliseconds unless the name
 * says otherwise.
 */
extern char *gatekeeper_database;
extern int	gatekeeper_workers;
extern int	gatekeeper_naptime;
extern int	gatekeeper_batch_size;
extern int	gatekeeper_lease;
extern int	gatekeeper_retry_delay;
extern char *gatekeeper_smtp_url;
extern char *gatekeeper_smtp_user;
extern char *gatekeeper_smtp_password_file;
extern int	gatekeeper_smtp_connections;
extern int	gatekeeper_smtp_timeout;
extern char *gatekeeper_helo_name;
extern char *gatekeeper_smtp_ca_file;
extern int	gatekeeper_max_in_flight;	/* bytes */
extern char *gatekeeper_default_sender;
extern char *gatekeeper_message_id_domain;
extern int	gatekeeper_retention;	/* seconds */
extern int	gatekeeper_soft_bounce_limit;
extern int	gatekeeper_max_message_size;	/* bytes */
extern int	gatekeeper_gate_memory;	/* kB */
extern int	gatekeeper_claim_standbys;
extern char *gatekeeper_dkim_key_table;

/* src/gatekeeper.c */
extern void gatekeeper_define_settings(void);

/*
 * src/gatekeeper.c: this database's extension against the version of the
 * schema the library serves (GATEKEEPER_VERSION, from the control file).
 * gatekeeper_require_schema() raises 0A000 unless they are the same.
 */
typedef enum GatekeeperSchema
{
	GATEKEEPER_SCHEMA_MISSING,	/* no extension in this database */
	GATEKEEPER_SCHEMA_OTHER,	/* another version: ALTER EXTENSION UPDATE */
	GATEKEEPER_SCHEMA_CURRENT	/* the library's version */
} GatekeeperSchema;

extern GatekeeperSchema gatekeeper_schema(const char **version);
extern void gatekeeper_require_schema(void);
extern void gatekeeper_report_schema(int elevel, const char *version);
extern void gatekeeper_wake_at_commit(void);

/*
 * src/gatekeeper.c: wake-ups for external senders.  A notify queue's due
 * mail is announced with NOTIFY on this channel, the queue's name as the
 * payload.
 */
#define GATEKEEPER_CHANNEL "gatekeeper"
extern void gatekeeper_notify_queue(const char *queue);
extern void gatekeeper_announce_later(TimestampTz due);
extern TimestampTz gatekeeper_announce_posted(void);

/* true in the background workers: their claims leave background = false queues alone */
extern bool gatekeeper_background_claim;
extern SPIPlanPtr gatekeeper_plan(SPIPlanPtr *plan, const char *sql, int nargs, Oid *argtypes);
extern Datum gatekeeper_array(Datum *elems, bool *nulls, int n, Oid elemtype);
extern int	gatekeeper_execute_by_key(SPIPlanPtr plan, Datum *values, const char *nulls,
									  bool read_only, long count);
extern bool gatekeeper_loading_dump(Relation rel);
extern int	gatekeeper_execute_by_key_into(SPIPlanPtr plan, Datum *values, const char *nulls,
										   bool read_only, long count, DestReceiver *dest);

/*
 * src/gatekeeper.c: each worker's slot in shared memory, for src/worker.c.
 * slotno is the worker's bgw_main_arg, 0 .. gatekeeper.workers - 1.
 */
extern bool gatekeeper_slot_connecting(int slotno, bool connecting);
extern void gatekeeper_slot_attach(int slotno);
extern bool gatekeeper_slot_woken(int slotno, bool consume);

/* the relays gatekeeper.smtp_url may list */
#define GATEKEEPER_MAX_RELAYS	8

/* What a worker shows in gatekeeper.worker_status of one of its relays. */
typedef struct GatekeeperRelayStatus
{
	char		url[256];		/* as in gatekeeper.smtp_url (no user, no password) */
	int			connections;	/* relay connections open or opening */
	char		breaker[16];	/* closed, open or half-open */
	TimestampTz last_success;	/* last mail the relay took, or 0 */
	char		last_error[256];	/* the relay's last refusal of the session */
	TimestampTz last_error_at;	/* or 0 */
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
} GatekeeperWorkerStatus;

extern void gatekeeper_slot_report(int slotno, const GatekeeperWorkerStatus *status);
extern const char *gatekeeper_incarnation(void);

/* src/worker.c */
extern PGDLLEXPORT void gatekeeper_worker_main(Datum main_arg);

/*
 * src/validate.c: each raises an error with a documented SQLSTATE when its
 * input is malformed.  "what" names the field in the error message.
 */
extern const char *gatekeeper_address_problem(const char *address);
extern void gatekeeper_check_address(const char *address, const char *what);
extern void gatekeeper_check_header_value(const char *value, const char *what);
extern void gatekeeper_check_header_name(const char *name);
extern void gatekeeper_check_headers(Jsonb *headers);
extern bool gatekeeper_header_reserved(const char *name);

/*
 * What src/message.c can always fold into header lines of at most 998
 * octets, and src/validate.c therefore allows: a word written as it is
 * (one in angle brackets) of at most GATEKEEPER_HEADER_WORD_MAX octets,
 * and runs of at most GATEKEEPER_HEADER_SPACE_MAX spaces and tabs.  Any
 * longer word is written as encoded-words, which fold anywhere.
 */
#define GATEKEEPER_HEADER_WORD_MAX	900
#define GATEKEEPER_HEADER_SPACE_MAX	78

/*
 * An interval of a kind ("period", "dedupe_window", "lease", "delay")
 * normalised to microseconds, or 22023 when outside the kind's bounds.
 */
extern Interval *gatekeeper_check_duration(const Interval *value, const char *kind);

/*
 * src/gate_store.c: the gates' shared memory, for src/gatekeeper.c.  The
 * gates' own headers are src/gate.h (what the claim uses), src/gate_log.h
 * and src/gate_store.h.
 */
extern Size gatekeeper_gate_shmem_size(void);
extern void gatekeeper_gate_shmem_init(void);

/* src/gate.c: the key a recipient's passes are kept under */
extern char *gatekeeper_recipient_key(const char *recipient);

/*
 * One claimed mail, as gatekeeper.claim returns it.  Strings are
 * NUL-terminated; sender, html and headers_json may be NULL.
 */
typedef struct GatekeeperMail
{
	int64		id;
	int32		attempt;
	char	   *queue;
	char	   *recipient;
	char	   *recipient_name; /* display name in To, or NULL */
	char	   *sender;
	char	   *subject;
	char	   *body;
	char	   *html;
	char	   *headers_json;	/* a JSON object of header name -> value */
	char	   *message_id;		/* "<...@...>", identical on every attempt */
	TimestampTz due;			/* since when it waits: its send_at, or its
								 * enqueue when that was later; 0 if unknown */
} GatekeeperMail;

/*
 * src/message.c: the RFC 5322 message for one mail, CRLF line endings,
 * appended to buf.  from is the sender to write in From (the mail's sender
 * or the default sender: an address, or a display name and an address).
 */
extern void gatekeeper_build_message(StringInfo buf, const GatekeeperMail *mail,
									 const char *from);

#endif							/* GATEKEEPER_H */
