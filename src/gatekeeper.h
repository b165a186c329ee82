/*-------------------------------------------------------------------------
 *
 * gatekeeper.h
 *		What every part of gatekeeper shares: the settings and the check of
 *		the extension's version.  Each module declares what others may use
 *		of it in its own header.
 *
 * gatekeeper keeps scheduled email in PostgreSQL: applications enqueue
 * mail with SQL, claims hand each due mail to exactly one worker, gates
 * enforce per-recipient smart-sending windows and frequency caps, and a
 * background worker delivers claimed mail over SMTP.
 *
 * src/gatekeeper.c		module initialization and settings
 * src/settings.c		the settings' variables, below every module
 * src/xact.c			the one transaction callback, calling each
 *						module's hook in order
 * src/catalog.c		SPI and catalog helpers: table OIDs behind one
 *						relcache callback, kept plans, the version check
 * src/worker_slots.c	the workers' slots in shared memory, their status,
 *						gatekeeper.worker_status and delivery_latency
 * src/wake.c			wake-on-commit and notify queues' announcements
 * src/worker.c			the background worker's loop
 * src/claim.c			claim (fair shares, rate limits, gates)
 * src/mail_state.c		a claimed mail's transitions: out of its batch,
 *						ack, nack, unclaim, extend
 * src/mail_state_funcs.c	their SQL functions
 * src/mail_state_sweep.c	reap, cancel, the sync trigger, rotation, purge
 * src/due_floor.c		each queue's earliest due time, in shared memory
 * src/maintenance.c	vacuuming mail_live after a burst
 * src/gate.c			gate decisions: lock, pass, release, write back
 * src/gate_store.c		the gates' shared-memory store: keys, entries,
 *						visibility, locking, gatekeeper.gate_memory
 * src/gate_log.c		the gates' durable log and its replay
 * src/gate_funcs.c		the gates' SQL-callable functions
 * src/mail.c			the insert trigger that validates every new mail,
 *						and the key writer
 * src/mail_copy.c		a COPY into gatekeeper.mail, written straight into
 *						the current segment's partition
 * src/live_writer.c	the insert trigger's direct writer of mail_live
 * src/mail_count.c		counting: every move's changes to the totals and
 *						the live gauges, published at transaction end
 * src/count_totals.c	the queues' totals in shared memory, for queue_stats
 * src/live_count.c		the live gauges' rows of mail_live_count
 * src/enqueue.c		enqueue(): the insert, and a dedupe key's holder
 * src/validate.c		header and duration validation
 * src/address.c		addresses: bare addresses checked, keyed, compared;
 *						display names, writing From and To
 * src/suppression.c	the suppression list: the claim's lookup in it, and
 *						entries added
 * src/unsubscribe.c	one-click unsubscribe tokens and URLs
 * src/window.c			sending windows in a time zone
 * src/message.c		RFC 5322 message building
 * src/template.c		the templates' language: a Mustache subset over
 *						jsonb, compiled once, rendered within bounds
 * src/template_funcs.c	template versions compiled per process, rendered
 *						into a mail's parts; their SQL functions
 * src/dkim.c			DKIM signing of built messages
 * src/report.c			delivery reports and events: ingest_report,
 *						record_event
 * src/report_parse.c	parsing DSNs and ARF reports
 * src/smtp_client.c	the event-driven SMTP client the worker delivers with:
 *						its API and its wait; in layers below it
 * src/smtp_relay.c		a relay's connections: opened, closed, freed here
 * src/smtp_session.c	the SMTP session machine, one per connection
 * src/smtp_txn.c		a ready session's transactions, and their replies
 * src/smtp_io.c		a connection's socket, TLS, bounded buffers, stuffing
 * src/smtp_config.c	relay URL, password file, DNS
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_H
#define GATEKEEPER_H

/*
 * Settings (their variables in src/settings.c, defined as settings with
 * their check hooks in src/gatekeeper.c).  Times are in milliseconds unless the name
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

extern int	gatekeeper_on_duplicate;	/* GatekeeperOnDuplicate */

/* gatekeeper.on_duplicate: what a bulk INSERT or COPY does with a held key */
typedef enum GatekeeperOnDuplicate
{
	GATEKEEPER_ON_DUPLICATE_ERROR,	/* fail the statement: 23505 */
	GATEKEEPER_ON_DUPLICATE_SKIP	/* leave the row out */
} GatekeeperOnDuplicate;

/* the relays gatekeeper.smtp_url may list */
#define GATEKEEPER_MAX_RELAYS	8

/*
 * src/settings.c: true in the background workers: their claims leave
 * background = false queues alone
 */
extern bool gatekeeper_background_claim;

/*
 * src/catalog.c: this database's extension against the version of the
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
extern void gatekeeper_gone(const char *version, const char *name) pg_attribute_noreturn();

#endif							/* GATEKEEPER_H */
