/* gatekeeper--0.3.0.sql */

\echo Use "CREATE EXTENSION gatekeeper" to load this file. \quit

/*
 * gatekeeper 0.3.0, a fresh install (an update from 0.2.0 is
 * gatekeeper--0.2.0--0.3.0.sql).  How the mail is stored and moves between
 * its tables, with a picture, is docs/storage.md.  The tables, by role:
 *
 *   the mail		mail (the content, written once), mail_live (one narrow
 *					row per scheduled mail), mail_claim (claimed mail, in
 *					batch rows of up to 128 with one lease each), mail_done
 *					(one outcome row per finished mail), event_log (what
 *					became of a mail after its claim); mail, mail_done and
 *					event_log are partitioned into four retention segments,
 *					and segment names the current one
 *   dedupe keys	mail_key: the mail that holds each queue's key
 *   policy			queue, gate
 *   the gates		gate_log (every change to the live passes, which are
 *					kept in shared memory), gate_space (this extension's
 *					space in that memory)
 *   suppression	suppression_list; unsubscribe_secret, which signs the
 *					unsubscribe and VERP tokens
 *   bookkeeping	mail_live_count (scheduled mail by queue and writing
 *					backend, for queue_stats), role_grant (the roles grant()
 *					gave a use), shard_position (a shard's number and count)
 *
 * queue_stats' totals are kept in shared memory (src/mail/count_totals.c), in no table.
 */

/*
 * States of a mail.  scheduled and claimed are live; the rest are terminal.
 */
CREATE TYPE gatekeeper.state AS ENUM (
	'scheduled', 'claimed', 'sent', 'failed', 'suppressed', 'expired',
	'cancelled', 'unknown'
);

/*
 * Gates: at most max_sends passes per recipient within period.
 */
CREATE TABLE gatekeeper.gate (
	name		text PRIMARY KEY CHECK (name <> ''),
	id			int GENERATED ALWAYS AS IDENTITY UNIQUE,
	period		interval NOT NULL
		CHECK (period BETWEEN interval '1 second' AND interval '87660 hours'),
	max_sends	int NOT NULL DEFAULT 1 CHECK (max_sends BETWEEN 1 AND 10000),
	created_at	timestamptz NOT NULL DEFAULT now(),
	altered		boolean NOT NULL DEFAULT false
);

/*
 * The gate log.  Live passes are kept in shared memory (see src/gate.c);
 * every change to them is also logged here, in the same transaction: one
 * row per call and gate for the passes made (the recipients' keys, the
 * holders, NULL when no pass had one, and the expiry, stamped with the
 * period in force), one per call and gate for the passes given back
 * (released, with the latest expiry of those passes).  After a restart the
 * first use of the gates replays the unexpired rows in id order.  purge()
 * deletes expired rows.
 */
CREATE TABLE gatekeeper.gate_log (
	id			bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	gate		int NOT NULL,
	released	boolean NOT NULL,
	expires		timestamptz NOT NULL,
	recipients	text[] NOT NULL,
	holders		bigint[]
);

-- a row can hold thousands of recipients: compress it with lz4 where the
-- server has it, which costs a fraction of pglz's time
DO $$
BEGIN
	IF EXISTS (SELECT FROM pg_catalog.pg_settings
				WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
		ALTER TABLE gatekeeper.gate_log ALTER COLUMN recipients SET COMPRESSION lz4;
	END IF;
END
$$;

/*
 * The name of this extension's space in the gates' shared memory: a random
 * number drawn when the extension is created, so that a dropped and
 * re-created extension never meets its predecessor's passes (see
 * src/gate_log.c).  Not dumped: a restored database draws its own.
 */
CREATE TABLE gatekeeper.gate_space (
	id			bigint NOT NULL
);
INSERT INTO gatekeeper.gate_space (id)
VALUES (('x' || left(pg_catalog.gen_random_uuid()::text, 8)
			 || left(pg_catalog.gen_random_uuid()::text, 8))::bit(64)::bigint);

/*
 * Queues: a campaign, flow or tenant, and its policy.  tokens and
 * refilled_at are the rate limit's token bucket.
 */
CREATE TABLE gatekeeper.queue (
	name		text PRIMARY KEY CHECK (name <> ''),
	gates		text[] NOT NULL DEFAULT '{}',
	on_gate_closed text NOT NULL DEFAULT 'suppress'
		CHECK (on_gate_closed IN ('suppress', 'defer')),
	delivery	text NOT NULL DEFAULT 'at_least_once'
		CHECK (delivery IN ('at_least_once', 'at_most_once')),
	max_attempts int NOT NULL DEFAULT 5 CHECK (max_attempts >= 1),
	weight		int NOT NULL DEFAULT 1 CHECK (weight >= 1),
	rate_limit	int CHECK (rate_limit >= 1),
	dedupe_window interval NOT NULL DEFAULT interval '24 hours'
		CHECK (dedupe_window = interval '0'
			   OR dedupe_window BETWEEN interval '1 second' AND interval '87660 hours'),
	paused		boolean NOT NULL DEFAULT false,
	tokens		float8 NOT NULL DEFAULT 0,
	refilled_at timestamptz,
	created_at	timestamptz NOT NULL DEFAULT now(),
	altered		boolean NOT NULL DEFAULT false,
	transactional boolean NOT NULL DEFAULT false,
	unsubscribe_url text,
	send_window text,
	timezone	text NOT NULL DEFAULT 'UTC',
	background	boolean NOT NULL DEFAULT true,
	notify		boolean NOT NULL DEFAULT false,
	feedback_id text,
	return_path text,
	retry_for	interval NOT NULL DEFAULT interval '1 day'
		CHECK (retry_for BETWEEN interval '0' AND interval '87660 hours')
);

COMMENT ON COLUMN gatekeeper.queue.dedupe_window IS 'how long a finished mail (but a cancelled one) holds its dedupe key; 0: only while it is scheduled or claimed';
COMMENT ON COLUMN gatekeeper.queue.background IS 'the background workers claim its mail; false: only external claimers do';
COMMENT ON COLUMN gatekeeper.queue.notify IS 'NOTIFY gatekeeper, ''<queue>'' when its mail is due (at the commit that makes it due, or when it comes due)';
COMMENT ON COLUMN gatekeeper.queue.feedback_id IS 'Feedback-ID header of its mail (Gmail''s feedback loop), NULL: none';
COMMENT ON COLUMN gatekeeper.queue.retry_for IS 'a mail that only ever got 4xx replies or timeouts is not failed before this has passed since its first deferral, whatever its attempts';
COMMENT ON COLUMN gatekeeper.queue.return_path IS 'the envelope sender of its mail; {token} in the local part is a signed token naming the mail (VERP)';

INSERT INTO gatekeeper.queue (name) VALUES ('default');
INSERT INTO gatekeeper.gate (name, period, max_sends) VALUES ('smart_sending', interval '16 hours', 1);

/*
 * The suppression list: addresses that must not be mailed (src/suppression.c).
 * address is the key the gates use (ASCII letters lower-cased); queue NULL
 * means every queue.  One row per address and scope; the unique index is
 * the one the claim probes, once per distinct recipient of a batch.
 */
CREATE TABLE gatekeeper.suppression_list (
	address		text NOT NULL CHECK (address <> ''),
	queue		text CHECK (queue <> ''),
	reason		text NOT NULL
		CHECK (reason IN ('hard_bounce', 'complaint', 'unsubscribe', 'manual', 'soft_bounce')),
	detail		text,
	mail_id		bigint,
	created_at	timestamptz NOT NULL DEFAULT now(),
	CONSTRAINT suppression_list_address_queue UNIQUE NULLS NOT DISTINCT (address, queue)
);

/*
 * The secret that signs unsubscribe tokens (src/unsubscribe.c): 32 random
 * bytes drawn at CREATE EXTENSION.  No role but the extension's owner reads
 * it.  pg_dump keeps it, so that tokens in mail already sent still work in
 * a restored database; a row inserted (a restore) replaces the one CREATE
 * EXTENSION made.
 */
CREATE TABLE gatekeeper.unsubscribe_secret (
	secret		bytea NOT NULL CHECK (length(secret) BETWEEN 32 AND 64)
);

CREATE FUNCTION gatekeeper._new_secret()
RETURNS bytea
LANGUAGE c VOLATILE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_new_secret';

CREATE FUNCTION gatekeeper._secret_insert() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	DELETE FROM gatekeeper.unsubscribe_secret;
	RETURN NEW;
END
$$;

CREATE TRIGGER unsubscribe_secret_insert BEFORE INSERT ON gatekeeper.unsubscribe_secret
	FOR EACH ROW EXECUTE FUNCTION gatekeeper._secret_insert();

INSERT INTO gatekeeper.unsubscribe_secret (secret) VALUES (gatekeeper._new_secret());

/*
 * The mail lives in five tables (docs/storage.md):
 *
 *   mail		what the application enqueued (by enqueue, INSERT or COPY):
 *				written once, never rewritten by gatekeeper
 *   mail_live	one narrow row per scheduled mail: its state, due time,
 *				attempt, Message-ID and last error
 *   mail_run	a bulk enqueue's scheduled mail, one row per run of up
 *				to 128 mails with consecutive ids (below)
 *   mail_claim	claimed mail, in batch rows (below)
 *   mail_done	one narrow row per finished mail: its outcome
 *
 * The statement-level trigger on mail validates the statement's rows and
 * writes their mail_live rows, in the same statement.  A claim takes its
 * mails out of mail_live (DELETE ... USING mail, src/claim.c) into
 * mail_claim; a nack that retries, a reap, an unclaim or a deferral puts a
 * mail back into mail_live, and a mail that finishes leaves mail_live or
 * its batch and gains its mail_done row, so claims walk only scheduled
 * mail however much is claimed or retained, and nothing rewrites the
 * content.  gatekeeper.mail_status joins them for the owner's queries.
 *
 * Retention.  mail and mail_done are partitioned into four segments,
 * mail_0 .. mail_3 and mail_done_0 .. mail_done_3; new mail goes to the
 * current segment (gatekeeper.segment).  Once the current segment is
 * half of gatekeeper.retention old, purge() rotates: the next segment,
 * the oldest, is emptied by TRUNCATE when all of its finished mail
 * finished longer than gatekeeper.retention ago, after its unfinished mail
 * (scheduled far ahead, retried, or claimed) has been moved to the current
 * one; then it becomes the current segment.  event_log is segmented the
 * same way and rotates with them.  Finished mail is kept at least
 * gatekeeper.retention and about twice that at most, and no mail is ever
 * deleted row by row.
 *
 *   mail_due		scheduled mail by queue, priority, due time
 *   mail_dedupe	at most one live mail per queue and dedupe key
 *   mail_done_key	finished mail by dedupe key, for the dedupe window and find()
 *   mail_finished	finished mail by finish time, for rotation (BRIN)
 *   mail_recipient	mail by recipient, for history() (hash)
 */
CREATE TABLE gatekeeper.segment (
	current		smallint NOT NULL CHECK (current BETWEEN 0 AND 3),
	rotated_at	timestamptz NOT NULL
);
INSERT INTO gatekeeper.segment (current, rotated_at) VALUES (0, now());

-- the segment new mail goes to: gatekeeper.segment's, read once per
-- transaction (src/mail.c)
CREATE FUNCTION gatekeeper._segment()
RETURNS smallint
LANGUAGE c STABLE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_segment';

COMMENT ON FUNCTION gatekeeper._segment() IS
	'the retention segment new mail goes to, read once per transaction: the default of gatekeeper.mail''s segment column, so a role that inserts mail runs it';

CREATE TABLE gatekeeper.mail (
	id			bigint GENERATED BY DEFAULT AS IDENTITY (CACHE 100),
	queue		text NOT NULL DEFAULT 'default',
	recipient	text NOT NULL,
	sender		text,
	subject		text,			-- NULL only with template (src/mail.c)
	body		text,
	html		text,
	headers		jsonb,
	dedupe_key	text,
	priority	int NOT NULL DEFAULT 0,
	send_at		timestamptz NOT NULL DEFAULT now(),
	send_by		timestamptz,
	created_at	timestamptz NOT NULL DEFAULT now(),
	-- the setting when the library is loaded, else the function (src/mail.c)
	segment		smallint NOT NULL DEFAULT coalesce(
		nullif(pg_catalog.current_setting('gatekeeper.current_segment', true), '')::smallint,
		gatekeeper._segment()),
	recipient_name text,
	metadata	jsonb,
	timezone	text,
	template	text,
	template_version int,
	data		jsonb,
	PRIMARY KEY (id, segment)
) PARTITION BY LIST (segment);

/*
 * Each partition has its own defaults for the two columns whose default
 * gatekeeper.mail gives by other means: a COPY into gatekeeper.mail that
 * leaves segment to its default is written straight into the current
 * segment's partition (src/mail_copy.c), where PostgreSQL batches its
 * rows; into gatekeeper.mail, whose trigger has a transition table, it
 * writes them one by one.  A partition has no identity in PostgreSQL 15:
 * its id is nextval() of gatekeeper.mail's.
 */
CREATE TABLE gatekeeper.mail_0 PARTITION OF gatekeeper.mail (
	id DEFAULT pg_catalog.nextval('gatekeeper.mail_id_seq'),
	segment DEFAULT 0
) FOR VALUES IN (0);
CREATE TABLE gatekeeper.mail_1 PARTITION OF gatekeeper.mail (
	id DEFAULT pg_catalog.nextval('gatekeeper.mail_id_seq'),
	segment DEFAULT 1
) FOR VALUES IN (1);
CREATE TABLE gatekeeper.mail_2 PARTITION OF gatekeeper.mail (
	id DEFAULT pg_catalog.nextval('gatekeeper.mail_id_seq'),
	segment DEFAULT 2
) FOR VALUES IN (2);
CREATE TABLE gatekeeper.mail_3 PARTITION OF gatekeeper.mail (
	id DEFAULT pg_catalog.nextval('gatekeeper.mail_id_seq'),
	segment DEFAULT 3
) FOR VALUES IN (3);

/*
 * Every mail a claim takes leaves a dead narrow row in mail_live (the
 * claim deletes it), and dead entries in mail_due are what every claim
 * walks past: vacuum it after 1% and unthrottled.  It stays as small as
 * the scheduled mail.
 */
CREATE TABLE gatekeeper.mail_live (
	id			bigint PRIMARY KEY,
	queue		text NOT NULL,
	priority	int NOT NULL DEFAULT 0,
	send_at		timestamptz NOT NULL,
	state		gatekeeper.state NOT NULL DEFAULT 'scheduled',
	attempt		int NOT NULL DEFAULT 0,
	uncharged	int NOT NULL DEFAULT 0,
	worker		text,
	message_id	text,
	last_error	text,
	dedupe_key	text,
	segment		smallint NOT NULL
) WITH (
	autovacuum_vacuum_scale_factor = 0.01,
	autovacuum_vacuum_threshold = 1000,
	autovacuum_analyze_scale_factor = 0.02,
	autovacuum_vacuum_cost_delay = 0
);

CREATE TABLE gatekeeper.mail_done (
	id			bigint NOT NULL,
	queue		text NOT NULL,
	state		gatekeeper.state NOT NULL,
	attempt		int NOT NULL DEFAULT 0,
	uncharged	int NOT NULL DEFAULT 0,
	send_at		timestamptz NOT NULL,
	worker		text,
	message_id	text,
	last_error	text,
	dedupe_key	text,
	finished_at timestamptz NOT NULL,
	segment		smallint NOT NULL,
	PRIMARY KEY (id, segment)
) PARTITION BY LIST (segment);
CREATE TABLE gatekeeper.mail_done_0 PARTITION OF gatekeeper.mail_done FOR VALUES IN (0);
CREATE TABLE gatekeeper.mail_done_1 PARTITION OF gatekeeper.mail_done FOR VALUES IN (1);
CREATE TABLE gatekeeper.mail_done_2 PARTITION OF gatekeeper.mail_done FOR VALUES IN (2);
CREATE TABLE gatekeeper.mail_done_3 PARTITION OF gatekeeper.mail_done FOR VALUES IN (3);

COMMENT ON COLUMN gatekeeper.mail.metadata IS 'the application''s own (campaign ids, tags): returned by claim, never sent';
COMMENT ON COLUMN gatekeeper.mail.segment IS 'the retention segment (partition) holding the mail: the current one when it was enqueued';
COMMENT ON COLUMN gatekeeper.mail.template IS 'the template the mail is rendered from when it is claimed (subject, body and html then NULL)';
COMMENT ON COLUMN gatekeeper.mail.template_version IS 'the template''s version: NULL means the latest made at or before created_at';
COMMENT ON COLUMN gatekeeper.mail.data IS 'the JSON object the template is rendered over';
COMMENT ON COLUMN gatekeeper.mail_live.attempt IS 'claims so far; (id, attempt) names one claim';
COMMENT ON COLUMN gatekeeper.mail_live.uncharged IS 'claims handed back unsent because no relay was reachable; not counted against max_attempts';
COMMENT ON COLUMN gatekeeper.mail_live.send_at IS 'when the mail is due: the enqueued send_at, moved by retries and deferrals';

-- no deduplication: every key ends in the mail's id, so no two are equal,
-- and the pass that looks for equal keys on every full page was about 2%
-- of a bulk insert's work for nothing (docs/internals.md, "Bulk enqueue")
CREATE INDEX mail_due ON gatekeeper.mail_live (queue, priority DESC, send_at, id)
	WITH (deduplicate_items = off)
	WHERE state = 'scheduled';
CREATE UNIQUE INDEX mail_dedupe ON gatekeeper.mail_live (queue, dedupe_key)
	WHERE dedupe_key IS NOT NULL;

/*
 * Runs (src/live_writer.c): the mails of one INSERT or COPY of 256 or
 * more with consecutive ids, one queue, priority, send_at and segment and
 * no dedupe key, as one row of mail_run for up to 128 of them (ids id ..
 * last_id)
 * instead of a row of mail_live each: their index entries were most of a
 * bulk enqueue's cost (docs/internals.md, "Bulk enqueue").  A mail of a
 * run is scheduled as if it had a
 * mail_live row with the columns' defaults (never attempted, no
 * Message-ID, no error).  A claim takes mails from the front of a run (id
 * moves on; the last one deletes it), in the order of mail_due; whatever
 * changes one mail of a run (cancel, an update or delete of the mail,
 * rotation) first moves its run into mail_live (src/mail/mail_runs.c); readers
 * of scheduled mail (mail_status, queue_stats, next_due) read runs too.  A
 * claim holds the rest of a run it took part of until it commits: another
 * claimer skips it (at most 127 mails) and takes the next.
 *
 *   mail_run_due	runs by queue, priority, due time, as mail_due
 */
CREATE TABLE gatekeeper.mail_run (
	id			bigint PRIMARY KEY,
	last_id		bigint NOT NULL,
	queue		text NOT NULL,
	priority	int NOT NULL,
	send_at		timestamptz NOT NULL,
	segment		smallint NOT NULL,
	CHECK (last_id >= id)
) WITH (
	autovacuum_vacuum_scale_factor = 0.01,
	autovacuum_vacuum_threshold = 1000,
	autovacuum_analyze_scale_factor = 0.02,
	autovacuum_vacuum_cost_delay = 0
);
COMMENT ON TABLE gatekeeper.mail_run IS
	'scheduled mail enqueued together and untouched since: one row for the mails id .. last_id, each as a mail_live row with its defaults would be';
CREATE INDEX mail_run_due ON gatekeeper.mail_run (queue, priority DESC, send_at, id)
	WITH (deduplicate_items = off);

CREATE INDEX mail_done_key ON gatekeeper.mail_done (queue, dedupe_key, finished_at)
	WHERE dedupe_key IS NOT NULL;
-- BRIN: outcomes arrive in finish order, and only rotation asks; a btree
-- entry per ack cost the drain more than rotation's look ever saves
CREATE INDEX mail_finished ON gatekeeper.mail_done USING brin (finished_at);
-- hash: history() asks by equality; a hash entry is a third of a btree
-- entry of an address and costs COPY less to insert (no collated compares)
CREATE INDEX mail_recipient ON gatekeeper.mail USING hash (recipient);

/*
 * Events: what became of a mail once it was claimed, one row
 * per event: deferred (a 4xx, a timeout, a DSN saying delayed), bounced
 * (a 5xx, a DSN saying failed, an ESP's bounce), delivered, complained (a
 * feedback report, an ESP's complaint), unsubscribed.  source says who
 * told: the relay (the worker or an external claimer's nack), a DSN, an
 * ARF report, a webhook (record_event) or a token.  The 'sent' event (the
 * relay said 250, or an external claimer acked) is not kept here: it would
 * hold nothing the mail's mail_done row does not (mail, queue, time,
 * segment, source), and writing it doubled the cost of every ack; the
 * view gatekeeper.events reads it from mail_done.  Partitioned by
 * retention segment like mail_done: an event lives in its mail's segment
 * and goes with it, by the same TRUNCATE (_rotate), never row by row.
 * recipient is NULL where it is the mail's (deferred, which the nack
 * paths write without reading the mail); the view fills it in.  No
 * primary key: nothing looks an event up by id.  No CHECK on event and
 * source either: only gatekeeper's own functions write here, each with
 * its own words, and a relation's CHECK is parsed and planned again by
 * every INSERT statement (a sixth of what a record_event() call cost;
 * docs/internals.md, "Reports").
 *
 *   event_log_bounced	bounces by address, for soft_bounce_limit
 */
CREATE TABLE gatekeeper.event_log (
	id			bigint GENERATED BY DEFAULT AS IDENTITY (CACHE 100),
	mail_id		bigint NOT NULL,
	queue		text NOT NULL,
	recipient	text,
	event		text NOT NULL,
	status		text,
	detail		text,
	source		text NOT NULL,
	at			timestamptz NOT NULL DEFAULT now(),
	segment		smallint NOT NULL,
	-- a report's complaint or bounce of a mail that has one: kept, not
	-- counted
	repeated	boolean NOT NULL DEFAULT false,
	-- why a bounced or deferred mail failed, as src/smtp_trouble.c reads
	-- its status and detail (gatekeeper._bounce_reason)
	reason		text
) PARTITION BY LIST (segment);
CREATE TABLE gatekeeper.event_log_0 PARTITION OF gatekeeper.event_log FOR VALUES IN (0);
CREATE TABLE gatekeeper.event_log_1 PARTITION OF gatekeeper.event_log FOR VALUES IN (1);
CREATE TABLE gatekeeper.event_log_2 PARTITION OF gatekeeper.event_log FOR VALUES IN (2);
CREATE TABLE gatekeeper.event_log_3 PARTITION OF gatekeeper.event_log FOR VALUES IN (3);
CREATE INDEX event_log_bounced ON gatekeeper.event_log
	(translate(recipient, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz'), at)
	WHERE event = 'bounced';
-- a report's event is written once: the same DSN, feedback report, webhook
-- event or unsubscribe click taken again for a mail (the same event,
-- source, status and detail) writes nothing (the relay's own events, the
-- nacks' deferrals, are not indexed)
-- the deferrals of a mail, the earliest of which starts its retry_for
CREATE INDEX event_log_deferred ON gatekeeper.event_log (mail_id, at) WHERE event = 'deferred';
CREATE UNIQUE INDEX event_log_report ON gatekeeper.event_log
	(mail_id, event, source, md5(coalesce(status, '') || E'\n' || coalesce(detail, '')), segment)
	WHERE source <> 'relay';
-- a mail counts one complaint and one bounce from reports: a
-- later one that differs is written as a repeat, which queue_stats, the
-- soft-bounce count and the suppression list leave out (src/report.c)
CREATE UNIQUE INDEX event_log_counted ON gatekeeper.event_log (mail_id, event, segment)
	WHERE source <> 'relay' AND NOT repeated AND event IN ('bounced', 'complained');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.event_log_0', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.event_log_1', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.event_log_2', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.event_log_3', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.event_log_id_seq', '');

/*
 * Claimed mail, in batch rows of up to 128 mails of consecutive ids of
 * one queue's share of a claim (CLAIM_BATCH_MAILS in src/claim.c, which
 * bounds what an ack of one mail reads and rewrites): a claim moves the mails it takes out of mail_live into the
 * records of mails, so that neither the claim nor the ack writes a new
 * version of a live row per mail (docs/internals.md, "Claimed mail in
 * batches").  mails is not rewritten once inserted (but by _rotate,
 * which moves claimed mail's content to a new segment too, under a lock
 * no ack passes): a mail that leaves the batch alone (a single ack) is
 * added to gone and open falls; the batch is deleted when its last open
 * mail leaves.  The records carry
 * each mail's claim state as mail_live would (state claimed, attempt,
 * worker, message id, segment); the lease is the batch's, and so is the
 * owner: the role whose claim made it, the only one but a
 * superuser whose ack, nack, extend or unclaim may change it (42501
 * otherwise, src/mail_state.c), one comparison with the batch row the
 * ack reads anyway.  A background worker's claim has owner 0, which no
 * SQL caller is: only that worker's own calls change it.
 *
 *   mail_claim_ids		batches by the range lo .. hi their ids lie in, the
 *						ack's first test (GiST: a btree on lo would walk
 *						every batch below the id, however far)
 *   mail_claim_lease	batches by lease expiry, for reaping
 */
CREATE TABLE gatekeeper.mail_claim (
	batch		bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	queue		text NOT NULL,
	worker		text,
	lease_until timestamptz NOT NULL,
	lo			bigint NOT NULL,
	hi			bigint NOT NULL,
	open		int NOT NULL,
	gone		bigint[] NOT NULL DEFAULT '{}',
	mails		gatekeeper.mail_live[] NOT NULL,
	owner		oid
);
CREATE INDEX mail_claim_ids ON gatekeeper.mail_claim USING gist (int8range(lo, hi, '[]'));
CREATE INDEX mail_claim_lease ON gatekeeper.mail_claim (lease_until);

COMMENT ON COLUMN gatekeeper.mail_claim.open IS 'mails of the batch still claimed: those of mails not in gone';
COMMENT ON COLUMN gatekeeper.mail_claim.gone IS 'ids of the mails that left the batch one by one (acked, handed back); mails is not rewritten (but for a segment rotation)';
COMMENT ON COLUMN gatekeeper.mail_claim.owner IS 'who may ack, nack, extend or unclaim the batch''s mails: the OID of the role that claimed them (or a superuser); 0, a background worker''s claim, which only that worker settles; NULL, a claim made before 0.3.0 by an external worker, which any caller may settle';

-- a claimed batch's mails compress with lz4 where the server was built with
-- it (PostgreSQL's default, pglz, was 3% of a claim at batch 100:
-- docs/internals.md, "The claim's statements");
-- without lz4 they stay with pglz
DO $$
BEGIN
	ALTER TABLE gatekeeper.mail_claim ALTER COLUMN mails SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
	NULL;
END
$$;

/*
 * The holders of dedupe keys: one row per queue and key, naming the mail
 * that holds the key: one that is scheduled (in mail_live) or claimed
 * (open in a mail_claim batch), so a claimed mail keeps its key although
 * its live row is gone; or one that finished, but was not cancelled,
 * within its queue's dedupe_window.  The insert
 * trigger of gatekeeper.mail writes the rows of the statement's keyed
 * mails (src/mail.c); a second mail with a held key fails there with
 * 23505 on mail_key_pkey, or is skipped (gatekeeper.on_duplicate).
 *
 * Nothing writes a row when its mail finishes: that would put a write
 * into every ack and every other way out, and the ack is the drain's hot
 * path.  A row whose mail no longer holds the key (_mail_key_held) is
 * stale instead: the next insert of the key takes it over, and purge()
 * deletes the rest.  Both lock the row first and only then test it in a
 * later statement, whose snapshot sees the holder as the row's last
 * writer left it: a holder moves between mail_live, mail_claim and
 * mail_done in single transactions and never comes back from mail_done
 * but by retry(), which locks the key's row first as an insert does,
 * and a finished holder stays in mail_done until retention removes it,
 * so a holder seen not holding no longer holds.  Retention may remove a
 * finished holder while its window lasts (a window longer than
 * gatekeeper.retention): rotation first writes its finish time into the
 * key's row (finished_at), under the row's lock, and the row holds the key
 * until the window has passed.
 *
 * mail_dedupe stays on mail_live: find() looks scheduled mail up by it,
 * and it still refuses two scheduled mails with one key wherever rows
 * enter mail_live (an update of a mail's key, a hand-back, a restore).
 */
CREATE TABLE gatekeeper.mail_key (
	queue		text NOT NULL,
	dedupe_key	text NOT NULL,
	id			bigint NOT NULL,
	finished_at timestamptz,
	PRIMARY KEY (queue, dedupe_key)
);

COMMENT ON TABLE gatekeeper.mail_key IS 'the mail that holds each dedupe key: scheduled, claimed, or finished (not cancelled) within its queue''s dedupe_window; a row whose mail no longer holds the key is stale until the key''s next insert or purge()';
COMMENT ON COLUMN gatekeeper.mail_key.finished_at IS 'when the holder finished, written when retention removed it while its dedupe window lasted';

-- whether mail id holds this queue's key: a scheduled live row, an open
-- record of a claimed batch, or an outcome other than cancelled within
-- the queue's dedupe_window (kept in the key's row once retention removed
-- the outcome)
CREATE FUNCTION gatekeeper._mail_key_held(id bigint, queue text, dedupe_key text)
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
SELECT EXISTS (SELECT FROM gatekeeper.mail_live l
				WHERE l.id = $1 AND l.queue = $2 AND l.dedupe_key = $3)
	OR EXISTS (SELECT FROM gatekeeper.mail_claim c, unnest(c.mails) r
				WHERE int8range(c.lo, c.hi, '[]') @> $1 AND c.queue = $2
				  AND r.id = $1 AND r.dedupe_key = $3 AND NOT r.id = ANY (c.gone))
	OR EXISTS (SELECT FROM gatekeeper.queue q
				WHERE q.name = $2 AND q.dedupe_window > interval '0'
				  AND (EXISTS (SELECT FROM gatekeeper.mail_done d
								WHERE d.id = $1 AND d.queue = $2 AND d.dedupe_key = $3
								  AND d.state <> 'cancelled'
								  AND d.finished_at > now() - q.dedupe_window)
					   OR EXISTS (SELECT FROM gatekeeper.mail_key k
								   WHERE k.queue = $2 AND k.dedupe_key = $3 AND k.id = $1
									 AND k.finished_at > now() - q.dedupe_window)))
$$;

/*
 * Give the keys of mail that finished within the queue's dedupe_window
 * (queue NULL: every queue's) a row of mail_key when they have none: a
 * window that was '0' or shorter, under which purge() removed the rows
 * (alter_queue), or 0.2.0, which kept none (the update).  The latest
 * holder of a key wins; a key that has a row keeps it.
 */
CREATE FUNCTION gatekeeper._mail_key_hold(queue text)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
INSERT INTO gatekeeper.mail_key (queue, dedupe_key, id)
SELECT DISTINCT ON (d.queue, d.dedupe_key) d.queue, d.dedupe_key, d.id
  FROM gatekeeper.mail_done d
  JOIN gatekeeper.queue q ON q.name = d.queue
 WHERE ($1 IS NULL OR d.queue = $1) AND d.dedupe_key IS NOT NULL
   AND d.state <> 'cancelled' AND q.dedupe_window > interval '0'
   AND d.finished_at > now() - q.dedupe_window
   AND NOT EXISTS (SELECT FROM gatekeeper.mail_key k
					WHERE k.queue = d.queue AND k.dedupe_key = d.dedupe_key)
 ORDER BY d.queue, d.dedupe_key, d.finished_at DESC, d.id DESC
ON CONFLICT DO NOTHING
$$;

CREATE FUNCTION gatekeeper.mail_check() RETURNS trigger
	LANGUAGE c SECURITY DEFINER SET search_path = pg_catalog, pg_temp
	AS 'MODULE_PATHNAME', 'gatekeeper_mail_check';

COMMENT ON FUNCTION gatekeeper.mail_check() IS
	'trigger on gatekeeper.mail: validates each new mail of an INSERT or COPY statement and writes its live row and dedupe key, and validates an UPDATE''s changed mail; an error names the bad row';

-- one call per INSERT or COPY statement, over all its rows (see src/mail.c)
CREATE TRIGGER mail_check_insert
	AFTER INSERT ON gatekeeper.mail
	REFERENCING NEW TABLE AS new_mail
	FOR EACH STATEMENT EXECUTE FUNCTION gatekeeper.mail_check();

/*
 * The same trigger on each partition: a COPY that leaves segment to its
 * default is written straight into the current segment's partition
 * (src/mail_copy.c), past gatekeeper.mail's own trigger.
 */
CREATE TRIGGER mail_check_insert AFTER INSERT ON gatekeeper.mail_0
	REFERENCING NEW TABLE AS new_mail FOR EACH STATEMENT EXECUTE FUNCTION gatekeeper.mail_check();
CREATE TRIGGER mail_check_insert AFTER INSERT ON gatekeeper.mail_1
	REFERENCING NEW TABLE AS new_mail FOR EACH STATEMENT EXECUTE FUNCTION gatekeeper.mail_check();
CREATE TRIGGER mail_check_insert AFTER INSERT ON gatekeeper.mail_2
	REFERENCING NEW TABLE AS new_mail FOR EACH STATEMENT EXECUTE FUNCTION gatekeeper.mail_check();
CREATE TRIGGER mail_check_insert AFTER INSERT ON gatekeeper.mail_3
	REFERENCING NEW TABLE AS new_mail FOR EACH STATEMENT EXECUTE FUNCTION gatekeeper.mail_check();

CREATE TRIGGER mail_check_update
	BEFORE UPDATE OF queue, recipient, sender, subject, body, html, headers,
		recipient_name, timezone, template, template_version, data
	ON gatekeeper.mail
	FOR EACH ROW EXECUTE FUNCTION gatekeeper.mail_check();

/*
 * pg_dump and pg_restore.  pg_dump dumps the rows of gatekeeper's tables
 * (config tables: the extension's objects themselves are not dumped) and
 * the values of its identity sequences; pg_restore runs CREATE EXTENSION,
 * then loads them.  Two things make a restored database whole:
 *
 * Sequences.  Ids go on after the restored rows' instead of colliding
 * with them (enqueue, gate_pass and create_gate would fail with 23505).
 *
 * Built-in rows.  CREATE EXTENSION makes the queue default and the gate
 * smart_sending; pg_dump skips them while they are as it made them.  Once
 * such a row changes, or is made again after a drop, altered is set and
 * pg_dump dumps it; a row inserted with altered set (a restore) replaces
 * the unaltered one that CREATE EXTENSION made in the new database.
 *
 * The mail loads into its partitions, past the validation trigger (it was
 * valid when it was enqueued); see below for a load through the
 * partitioned tables.
 */
COMMENT ON COLUMN gatekeeper.queue.altered IS 'the default queue was changed since CREATE EXTENSION made it: pg_dump dumps it';
COMMENT ON COLUMN gatekeeper.gate.altered IS 'the smart_sending gate was changed since CREATE EXTENSION made it: pg_dump dumps it';

-- a built-in row inserted with altered set replaces the unaltered one
CREATE FUNCTION gatekeeper._queue_builtin_insert() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF NEW.altered THEN
		DELETE FROM gatekeeper.queue q WHERE q.name = NEW.name AND NOT q.altered;
	END IF;
	NEW.altered := true;
	RETURN NEW;
END
$$;

CREATE FUNCTION gatekeeper._gate_builtin_insert() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	replaced int;
BEGIN
	IF NEW.altered THEN
		DELETE FROM gatekeeper.gate g WHERE g.name = NEW.name AND NOT g.altered
		RETURNING g.id INTO replaced;
		IF replaced <> NEW.id THEN
			DELETE FROM gatekeeper.gate_log l WHERE l.gate = replaced;
		END IF;
	END IF;
	NEW.altered := true;
	RETURN NEW;
END
$$;

-- a built-in row that changes is altered
CREATE FUNCTION gatekeeper._builtin_update() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	NEW.altered := true;
	RETURN NEW;
END
$$;

CREATE TRIGGER queue_builtin_insert BEFORE INSERT ON gatekeeper.queue
	FOR EACH ROW WHEN (NEW.name = 'default')
	EXECUTE FUNCTION gatekeeper._queue_builtin_insert();
CREATE TRIGGER queue_builtin_update BEFORE UPDATE ON gatekeeper.queue
	FOR EACH ROW WHEN (OLD.name = 'default' AND NOT OLD.altered)
	EXECUTE FUNCTION gatekeeper._builtin_update();
CREATE TRIGGER gate_builtin_insert BEFORE INSERT ON gatekeeper.gate
	FOR EACH ROW WHEN (NEW.name = 'smart_sending')
	EXECUTE FUNCTION gatekeeper._gate_builtin_insert();
CREATE TRIGGER gate_builtin_update BEFORE UPDATE ON gatekeeper.gate
	FOR EACH ROW WHEN (OLD.name = 'smart_sending' AND NOT OLD.altered)
	EXECUTE FUNCTION gatekeeper._builtin_update();

SELECT pg_catalog.pg_extension_config_dump('gatekeeper.queue', 'WHERE name <> ''default'' OR altered');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.gate', 'WHERE name <> ''smart_sending'' OR altered');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.gate_log', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.gate_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.gate_log_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.suppression_list', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.unsubscribe_secret', '');

-- whether gatekeeper writes the statement running now: its C code, or a
-- trigger (src/catalog.c, gatekeeper_writer, the one way gatekeeper
-- tells who writes); not while a dump is loaded
CREATE FUNCTION gatekeeper._own_statement() RETURNS boolean
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_own_statement';

/*
 * pg_dump dumps the data of mail and mail_done into their partitions
 * (mail_0, mail_done_0, ...), where the statement trigger of
 * gatekeeper.mail does not fire, and mail_live's rows as they were.  A
 * dump loaded through the partitioned tables instead
 * (--load-via-partition-root) passes the trigger, which sees a dump being
 * loaded (src/catalog.c, gatekeeper_writer) and makes no live
 * rows either.  Rows loaded through them otherwise (check_function_bodies
 * on) get fresh live rows: a restored live row replaces the fresh one,
 * and a restored outcome removes the live row of its mail.  These
 * restore triggers are C (src/mail_state_upkeep.c).
 */
CREATE FUNCTION gatekeeper._mail_live_restore() RETURNS trigger
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_mail_live_restore';

CREATE TRIGGER mail_live_restore BEFORE INSERT ON gatekeeper.mail_live
	FOR EACH ROW WHEN (NOT gatekeeper._own_statement())
	EXECUTE FUNCTION gatekeeper._mail_live_restore();

/*
 * mail_key is dumped with the rest: its rows load as they were, stale ones
 * included (they stay stale).  A dump loaded through gatekeeper.mail with
 * the trigger on has already written the keys of the mails it made live;
 * a dumped row then replaces the key's row instead of failing.
 */
CREATE FUNCTION gatekeeper._mail_key_restore() RETURNS trigger
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_mail_key_restore';

-- gatekeeper's own inserts run inside the trigger of gatekeeper.mail
CREATE TRIGGER mail_key_restore BEFORE INSERT ON gatekeeper.mail_key
	FOR EACH ROW WHEN (NOT gatekeeper._own_statement())
	EXECUTE FUNCTION gatekeeper._mail_key_restore();

-- per statement, not per row: gatekeeper's own functions write outcomes
-- at trigger depth 0 too (every ack), and a row trigger there cost a
-- sixth of the drain; and not after the statements of gatekeeper's C code
-- (every ack and claim), which move the live rows themselves
CREATE TRIGGER mail_done_restore AFTER INSERT ON gatekeeper.mail_done
	REFERENCING NEW TABLE AS new_done
	FOR EACH STATEMENT
	WHEN (NOT gatekeeper._own_statement())
	EXECUTE FUNCTION gatekeeper._mail_live_restore();

-- an update of a mail's queue, priority, send_at or dedupe key (by its
-- owner) reaches its state rows: its live row, the record of the batch it
-- is claimed in (src/claim.c), or its outcome; a deleted mail takes them
-- along, and a claimed one leaves its batch as an ack takes it (the
-- claimer's ack of it then returns false).  A claimed mail's record is
-- rewritten in its batch under the batch's lock; one moved to another
-- queue leaves its batch for a batch of its own in the new queue, with
-- the same lease and worker (unless it is the batch's one open mail: the
-- batch moves), so that the batches' queues stay the ones queue_stats and
-- drop_queue count.  A claimed mail's new dedupe key is
-- written into mail_key (23505 if an unfinished mail holds it), as a
-- scheduled mail's is held by mail_dedupe.
CREATE FUNCTION gatekeeper._mail_sync() RETURNS trigger
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_mail_sync';

CREATE TRIGGER mail_sync_update AFTER UPDATE OF queue, priority, send_at, dedupe_key
	ON gatekeeper.mail
	FOR EACH ROW EXECUTE FUNCTION gatekeeper._mail_sync();
CREATE TRIGGER mail_sync_delete AFTER DELETE ON gatekeeper.mail
	REFERENCING OLD TABLE AS old_mail
	FOR EACH STATEMENT EXECUTE FUNCTION gatekeeper._mail_sync();

-- a TRUNCATE of gatekeeper.mail takes the mails' state rows along, as a
-- DELETE does (_mail_sync): live rows, claimed batches, dedupe keys and
-- outcomes, which would otherwise name contentless mail and, after
-- RESTART IDENTITY, the ids of new mail.  A table the same TRUNCATE names
-- is empty by now and left alone (truncating it again here would fail:
-- the statement still holds it open).  Rotation truncates the partitions
-- themselves, which does not fire this.  (src/mail_state_upkeep.c)
CREATE FUNCTION gatekeeper._mail_truncate() RETURNS trigger
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_mail_truncate';

CREATE TRIGGER mail_truncate AFTER TRUNCATE ON gatekeeper.mail
	FOR EACH STATEMENT EXECUTE FUNCTION gatekeeper._mail_truncate();

SELECT pg_catalog.pg_extension_config_dump('gatekeeper.mail_0', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.mail_1', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.mail_2', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.mail_3', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.mail_done_0', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.mail_done_1', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.mail_done_2', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.mail_done_3', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.mail_live', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.mail_run', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.mail_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.mail_claim', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.mail_claim_batch_seq', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.mail_key', '');

/*
 * Shards.  Several gatekeepers can share the recipients between
 * them, one shard each, behind the gatekeeper_router extension (PL/Proxy).
 * A mail's id then says which shard holds it: the operator runs
 * gatekeeper.shard(n, count) once on shard n of count, and the mail ids
 * that shard draws are the ones congruent to n modulo count, so no two
 * shards draw the same id and the router sends status(id) and cancel(id)
 * to the shard id & (count - 1).
 *
 * pg_dump keeps a sequence's value but not its increment (the sequence is
 * the extension's, made by CREATE EXTENSION): (n, count) is kept in
 * shard_position, whose restored row gives the restored sequence its
 * increment again.
 */
CREATE TABLE gatekeeper.shard_position (
	single		boolean PRIMARY KEY DEFAULT true CHECK (single),
	n			int NOT NULL,
	count		int NOT NULL,
	set_at		timestamptz NOT NULL DEFAULT now(),
	CHECK (count BETWEEN 1 AND 65536 AND (count & (count - 1)) = 0 AND n BETWEEN 0 AND count - 1)
);
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.shard_position', '');

COMMENT ON TABLE gatekeeper.shard_position IS
	'this database''s place among the shards, set by shard(n, count): it draws the mail ids congruent to n modulo count';

-- gives gatekeeper.mail_id_seq the increment of the shard position being
-- written: by shard(), and by a restore, which loads the row
CREATE FUNCTION gatekeeper._shard_apply() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	EXECUTE pg_catalog.format('ALTER SEQUENCE gatekeeper.mail_id_seq INCREMENT BY %s', NEW.count);
	RETURN NEW;
END
$$;

CREATE TRIGGER shard_position_apply AFTER INSERT OR UPDATE ON gatekeeper.shard_position
	FOR EACH ROW EXECUTE FUNCTION gatekeeper._shard_apply();

/*
 * Makes this database shard n of count: count is a power of two (PL/Proxy
 * maps a hash to a shard by its low bits), n one of 0 .. count - 1.  The
 * next mail id is the first one congruent to n above every id this
 * database has drawn or holds, and every id after it is count more.  May
 * be run again, as when shard n of count becomes shards n and n + count of
 * twice as many.
 */
CREATE FUNCTION gatekeeper.shard(n int, count int)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	above bigint;
	next_id bigint;
BEGIN
	IF shard.n IS NULL OR shard.count IS NULL THEN
		RAISE EXCEPTION 'n and count must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF shard.count NOT BETWEEN 1 AND 65536 OR (shard.count & (shard.count - 1)) <> 0 THEN
		RAISE EXCEPTION 'count must be a power of two between 1 and 65536'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = pg_catalog.format('count was %s.', shard.count);
	END IF;
	IF shard.n NOT BETWEEN 0 AND shard.count - 1 THEN
		RAISE EXCEPTION 'n must be between 0 and count - 1'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = pg_catalog.format('n was %s and count %s.', shard.n, shard.count);
	END IF;
	-- no mail may be enqueued between the look and the restart
	LOCK TABLE gatekeeper.mail IN SHARE MODE;
	SELECT greatest((SELECT s.last_value FROM gatekeeper.mail_id_seq s),
					(SELECT max(m.id) FROM gatekeeper.mail m), 0)
	  INTO above;
	next_id := above + 1 + ((shard.n - (above + 1)) % shard.count + shard.count) % shard.count;
	INSERT INTO gatekeeper.shard_position AS p (n, count) VALUES (shard.n, shard.count)
	ON CONFLICT (single) DO UPDATE SET n = excluded.n, count = excluded.count, set_at = now();
	EXECUTE pg_catalog.format('ALTER SEQUENCE gatekeeper.mail_id_seq RESTART WITH %s', next_id);
END
$$;

COMMENT ON FUNCTION gatekeeper.shard(int, int) IS
	'make this database shard n of count (a power of two): its mail ids are then those congruent to n modulo count';

/*
 * Every column the mail had in 0.1.0, then those 0.2.0 added to it, for
 * the owner's queries: the content, and the state from whichever of
 * mail_live, mail_claim's batches and mail_done holds the mail.
 */
CREATE VIEW gatekeeper.mail_status AS
SELECT m.id, m.queue, m.recipient, m.sender, m.subject, m.body, m.html, m.headers,
	   m.dedupe_key, m.priority,
	   CASE WHEN l.id IS NOT NULL THEN l.send_at ELSE coalesce(d.send_at, m.send_at) END AS send_at,
	   m.send_by,
	   CASE WHEN l.id IS NOT NULL THEN l.state ELSE d.state END AS state,
	   CASE WHEN l.id IS NOT NULL THEN l.attempt ELSE coalesce(d.attempt, 0) END AS attempt,
	   CASE WHEN l.id IS NOT NULL THEN l.uncharged ELSE coalesce(d.uncharged, 0) END AS uncharged,
	   l.lease_until,
	   CASE WHEN l.id IS NOT NULL THEN l.worker ELSE d.worker END AS worker,
	   CASE WHEN l.id IS NOT NULL THEN l.message_id ELSE d.message_id END AS message_id,
	   CASE WHEN l.id IS NOT NULL THEN l.last_error ELSE d.last_error END AS last_error,
	   m.created_at,
	   d.finished_at,
	   m.recipient_name,
	   m.metadata,
	   m.timezone,
	   m.template,
	   m.template_version,
	   m.data
  FROM gatekeeper.mail m
  -- the live row, or the record of the batch the mail is claimed in
  -- (with the batch's lease)
  LEFT JOIN LATERAL (
	SELECT l.id, l.send_at, l.state, l.attempt, l.uncharged, NULL::timestamptz AS lease_until,
		   l.worker, l.message_id, l.last_error
	  FROM gatekeeper.mail_live l
	 WHERE l.id = m.id
	UNION ALL
	SELECT r.id, r.send_at, r.state, r.attempt, r.uncharged, c.lease_until, r.worker,
		   r.message_id, r.last_error
	  FROM gatekeeper.mail_claim c
	 CROSS JOIN LATERAL unnest(c.mails) r
	 WHERE int8range(c.lo, c.hi, '[]') @> m.id AND r.id = m.id AND NOT m.id = ANY (c.gone)
	UNION ALL
	-- a mail of a run: scheduled, as its live row with the defaults would say
	SELECT m.id, r.send_at, 'scheduled'::gatekeeper.state, 0, 0, NULL::timestamptz,
		   NULL::text, NULL::text, NULL::text
	  FROM (SELECT x.last_id, x.send_at, x.segment FROM gatekeeper.mail_run x
			 WHERE x.id <= m.id ORDER BY x.id DESC LIMIT 1) r
	 WHERE r.last_id >= m.id AND r.segment = m.segment
	 LIMIT 1) l ON true
  LEFT JOIN gatekeeper.mail_done d ON d.id = m.id AND d.segment = m.segment;

/*
 * Internal helpers.
 */

-- an interval of a kind (period, dedupe_window, lease, delay) normalised to
-- its length in microseconds, or 22023 outside the kind's bounds (src/validate.c)
CREATE FUNCTION gatekeeper._duration(value interval, kind text)
RETURNS interval
LANGUAGE c IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_duration';

-- raise 42704 unless the queue exists; returns its row, locked when asked
CREATE FUNCTION gatekeeper._queue(queue_name text, lock boolean DEFAULT false)
RETURNS gatekeeper.queue
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	q gatekeeper.queue;
BEGIN
	IF queue_name IS NULL THEN
		RAISE EXCEPTION 'queue must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF lock THEN
		SELECT * INTO q FROM gatekeeper.queue WHERE name = queue_name FOR UPDATE;
	ELSE
		SELECT * INTO q FROM gatekeeper.queue WHERE name = queue_name;
	END IF;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'queue "%" does not exist', queue_name
			USING ERRCODE = 'undefined_object',
				  HINT = 'Create it with gatekeeper.create_queue().';
	END IF;
	RETURN q;
END
$$;

-- validate queue policy arguments; NULL means "not given"
CREATE FUNCTION gatekeeper._check_queue_policy(gates text[], on_gate_closed text, delivery text,
	max_attempts int, weight int, rate_limit int, dedupe_window interval, altering boolean)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	missing text;
BEGIN
	IF gates IS NOT NULL THEN
		IF array_ndims(gates) > 1 THEN
			RAISE EXCEPTION 'gates must be a one-dimensional array' USING ERRCODE = 'invalid_parameter_value';
		END IF;
		IF array_position(gates, NULL) IS NOT NULL THEN
			RAISE EXCEPTION 'gate names must not be null' USING ERRCODE = 'null_value_not_allowed';
		END IF;
		SELECT g INTO missing FROM unnest(gates) AS g
		 WHERE NOT EXISTS (SELECT FROM gatekeeper.gate WHERE name = g) LIMIT 1;
		IF FOUND THEN
			RAISE EXCEPTION 'gate "%" does not exist', missing
				USING ERRCODE = 'undefined_object',
					  HINT = 'Create it with gatekeeper.create_gate().';
		END IF;
	END IF;
	IF on_gate_closed IS NOT NULL AND on_gate_closed NOT IN ('suppress', 'defer') THEN
		RAISE EXCEPTION 'invalid on_gate_closed policy "%"', on_gate_closed
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'on_gate_closed must be suppress or defer.';
	END IF;
	IF delivery IS NOT NULL AND delivery NOT IN ('at_least_once', 'at_most_once') THEN
		RAISE EXCEPTION 'invalid delivery guarantee "%"', delivery
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'delivery must be at_least_once or at_most_once.';
	END IF;
	IF max_attempts < 1 THEN
		RAISE EXCEPTION 'max_attempts must be at least 1'
			USING ERRCODE = 'invalid_parameter_value', DETAIL = format('max_attempts was %s.', max_attempts);
	END IF;
	IF weight < 1 THEN
		RAISE EXCEPTION 'weight must be at least 1'
			USING ERRCODE = 'invalid_parameter_value', DETAIL = format('weight was %s.', weight);
	END IF;
	IF rate_limit < 0 OR (NOT altering AND rate_limit = 0) THEN
		RAISE EXCEPTION 'rate_limit must be positive'
			USING ERRCODE = 'invalid_parameter_value', DETAIL = format('rate_limit was %s.', rate_limit),
				  HINT = 'alter_queue(name, rate_limit => 0) removes a limit.';
	END IF;
	-- '0': the key is held only while its mail is unfinished
	IF dedupe_window <> interval '0' THEN
		PERFORM gatekeeper._duration(dedupe_window, 'dedupe_window');
	END IF;
END
$$;

-- raise 54000 when notify is asked for a queue whose name cannot be a
-- notification's payload (PostgreSQL takes less than 8000 bytes)
CREATE FUNCTION gatekeeper._check_notify(queue text, notify boolean)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF notify AND octet_length(queue) >= 8000 THEN
		RAISE EXCEPTION 'queue name is too long for notify'
			USING ERRCODE = 'program_limit_exceeded',
				  DETAIL = format('The name has %s bytes; a NOTIFY payload must be shorter than 8000 bytes.',
								  octet_length(queue));
	END IF;
END
$$;

/*
 * Queues
 */

-- raise 22023 unless value can be a queue's feedback_id: one to four
-- fields of printable ASCII but ':' (no spaces), separated by ':', as
-- Gmail's Feedback-ID is, at most 200 octets
CREATE FUNCTION gatekeeper._check_feedback_id(value text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF value IS NOT NULL
	   AND (octet_length(value) > 200 OR value !~ '^[!-9;-~]+(:[!-9;-~]+){0,3}$') THEN
		RAISE EXCEPTION 'invalid feedback_id'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'A feedback_id is one to four fields of printable ASCII without spaces, separated by '':'', at most 200 octets.',
				  HINT = 'For example: ''campaign42:customer7:newsletter:shop''.';
	END IF;
END
$$;

CREATE FUNCTION gatekeeper.create_queue(name text, gates text[] DEFAULT '{}',
	on_gate_closed text DEFAULT 'suppress', delivery text DEFAULT 'at_least_once',
	max_attempts int DEFAULT 5, weight int DEFAULT 1, rate_limit int DEFAULT NULL,
	dedupe_window interval DEFAULT NULL, transactional boolean DEFAULT false,
	unsubscribe_url text DEFAULT NULL, send_window text DEFAULT NULL,
	timezone text DEFAULT 'UTC', background boolean DEFAULT true,
	notify boolean DEFAULT false, return_path text DEFAULT NULL,
	feedback_id text DEFAULT NULL, retry_for interval DEFAULT '1 day')
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF create_queue.name IS NULL THEN
		RAISE EXCEPTION 'queue name must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF create_queue.name = '' THEN
		RAISE EXCEPTION 'queue name must not be empty' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF gates IS NULL OR on_gate_closed IS NULL OR delivery IS NULL OR max_attempts IS NULL OR weight IS NULL
	   OR create_queue.transactional IS NULL OR create_queue.timezone IS NULL THEN
		RAISE EXCEPTION 'gates, on_gate_closed, delivery, max_attempts, weight, transactional and timezone must not be null'
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF create_queue.background IS NULL OR create_queue.notify IS NULL OR create_queue.retry_for IS NULL THEN
		RAISE EXCEPTION 'background, notify and retry_for must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	PERFORM gatekeeper._check_notify(create_queue.name, create_queue.notify);
	PERFORM gatekeeper._check_queue_policy(gates, on_gate_closed, delivery, max_attempts,
										   weight, rate_limit, dedupe_window, false);
	PERFORM gatekeeper._check_window(create_queue.send_window, create_queue.timezone);
	PERFORM gatekeeper._check_unsubscribe_url(create_queue.unsubscribe_url, create_queue.name);
	PERFORM gatekeeper._check_return_path(create_queue.return_path);
	PERFORM gatekeeper._check_feedback_id(create_queue.feedback_id);
	PERFORM gatekeeper._duration(create_queue.retry_for, 'retry_for');
	BEGIN
		INSERT INTO gatekeeper.queue (name, gates, on_gate_closed, delivery, max_attempts,
									  weight, rate_limit, dedupe_window, tokens, transactional,
									  unsubscribe_url, send_window, timezone, background, notify,
									  feedback_id, return_path, retry_for)
		VALUES (create_queue.name, (SELECT coalesce(array_agg(DISTINCT g ORDER BY g), '{}') FROM unnest(gates) g),
				on_gate_closed, delivery, max_attempts, weight, rate_limit,
				CASE WHEN dedupe_window = interval '0' THEN interval '0'
					 ELSE coalesce(gatekeeper._duration(dedupe_window, 'dedupe_window'),
								   interval '24 hours') END,
				coalesce(rate_limit, 0),
				create_queue.transactional, create_queue.unsubscribe_url, create_queue.send_window,
				create_queue.timezone, create_queue.background, create_queue.notify,
				create_queue.feedback_id, create_queue.return_path,
				gatekeeper._duration(create_queue.retry_for, 'retry_for'));
	EXCEPTION WHEN unique_violation THEN
		RAISE EXCEPTION 'queue "%" already exists', create_queue.name USING ERRCODE = 'duplicate_object';
	END;
END
$$;

-- each argument NULL leaves its setting unchanged; unsubscribe_url => '',
-- send_window => '', return_path => '' and feedback_id => '' remove them, as
-- rate_limit => 0 does; dedupe_window => '0' holds keys only while their
-- mail is unfinished, as in create_queue
CREATE FUNCTION gatekeeper.alter_queue(name text, gates text[] DEFAULT NULL,
	on_gate_closed text DEFAULT NULL, delivery text DEFAULT NULL,
	max_attempts int DEFAULT NULL, weight int DEFAULT NULL, rate_limit int DEFAULT NULL,
	dedupe_window interval DEFAULT NULL, transactional boolean DEFAULT NULL,
	unsubscribe_url text DEFAULT NULL, send_window text DEFAULT NULL,
	timezone text DEFAULT NULL, background boolean DEFAULT NULL,
	notify boolean DEFAULT NULL, return_path text DEFAULT NULL,
	feedback_id text DEFAULT NULL, retry_for interval DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	/*
	 * Taking a queue from the background workers waits for the claims in
	 * progress (each worker's claim holds ROW SHARE on gatekeeper.queue
	 * from before it reads the queues): once this commits, no worker claim
	 * that read the queue as its own is still running.
	 */
	IF alter_queue.background = false THEN
		LOCK TABLE gatekeeper.queue IN EXCLUSIVE MODE;
	END IF;
	PERFORM gatekeeper._queue(alter_queue.name, true);
	PERFORM gatekeeper._check_queue_policy(gates, on_gate_closed, delivery, max_attempts,
										   weight, rate_limit, dedupe_window, true);
	PERFORM gatekeeper._check_notify(alter_queue.name, alter_queue.notify);
	PERFORM gatekeeper._check_window(nullif(alter_queue.send_window, ''), alter_queue.timezone);
	PERFORM gatekeeper._check_unsubscribe_url(nullif(alter_queue.unsubscribe_url, ''), alter_queue.name);
	PERFORM gatekeeper._check_return_path(nullif(alter_queue.return_path, ''));
	PERFORM gatekeeper._check_feedback_id(nullif(alter_queue.feedback_id, ''));
	PERFORM gatekeeper._duration(alter_queue.retry_for, 'retry_for');
	UPDATE gatekeeper.queue q
	   SET gates = coalesce((SELECT array_agg(DISTINCT g ORDER BY g) FROM unnest(alter_queue.gates) g),
							CASE WHEN alter_queue.gates IS NOT NULL THEN '{}'::text[] END, q.gates),
		   on_gate_closed = coalesce(alter_queue.on_gate_closed, q.on_gate_closed),
		   delivery = coalesce(alter_queue.delivery, q.delivery),
		   max_attempts = coalesce(alter_queue.max_attempts, q.max_attempts),
		   weight = coalesce(alter_queue.weight, q.weight),
		   rate_limit = CASE WHEN alter_queue.rate_limit = 0 THEN NULL
							 ELSE coalesce(alter_queue.rate_limit, q.rate_limit) END,
		   tokens = CASE WHEN alter_queue.rate_limit IS NOT NULL THEN alter_queue.rate_limit ELSE q.tokens END,
		   dedupe_window = CASE WHEN alter_queue.dedupe_window = interval '0' THEN interval '0'
								ELSE coalesce(gatekeeper._duration(alter_queue.dedupe_window, 'dedupe_window'),
											  q.dedupe_window) END,
		   transactional = coalesce(alter_queue.transactional, q.transactional),
		   unsubscribe_url = CASE WHEN alter_queue.unsubscribe_url = '' THEN NULL
								  ELSE coalesce(alter_queue.unsubscribe_url, q.unsubscribe_url) END,
		   send_window = CASE WHEN alter_queue.send_window = '' THEN NULL
							  ELSE coalesce(alter_queue.send_window, q.send_window) END,
		   timezone = coalesce(alter_queue.timezone, q.timezone),
		   background = coalesce(alter_queue.background, q.background),
		   notify = coalesce(alter_queue.notify, q.notify),
		   feedback_id = CASE WHEN alter_queue.feedback_id = '' THEN NULL
							  ELSE coalesce(alter_queue.feedback_id, q.feedback_id) END,
		   return_path = CASE WHEN alter_queue.return_path = '' THEN NULL
							  ELSE coalesce(alter_queue.return_path, q.return_path) END,
		   retry_for = coalesce(gatekeeper._duration(alter_queue.retry_for, 'retry_for'), q.retry_for)
	 WHERE q.name = alter_queue.name;
	-- a longer window holds again the keys purge() freed under the shorter one
	IF alter_queue.dedupe_window > interval '0' THEN
		PERFORM gatekeeper._mail_key_hold(alter_queue.name);
	END IF;
END
$$;

COMMENT ON FUNCTION gatekeeper.create_queue(text, text[], text, text, int, int, int, interval, boolean,
											text, text, text, boolean, boolean, text, text, interval) IS
	'make a queue (a campaign, flow or tenant) with its policy';
COMMENT ON FUNCTION gatekeeper.alter_queue(text, text[], text, text, int, int, int, interval, boolean,
										   text, text, text, boolean, boolean, text, text, interval) IS
	'change a queue''s policy; each argument NULL leaves its setting as it is';

-- drop_queue's end of the live counts: the queue's rows deleted, this
-- transaction's changes to them set aside (src/mail/mail_count.c)
CREATE FUNCTION gatekeeper._forget_live(queue text)
RETURNS void
LANGUAGE c
STRICT
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_forget_live';

CREATE FUNCTION gatekeeper.drop_queue(name text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	live bigint;
BEGIN
	IF drop_queue.name = 'default' THEN
		RAISE EXCEPTION 'the default queue cannot be dropped' USING ERRCODE = 'reserved_name';
	END IF;
	PERFORM gatekeeper._queue(drop_queue.name, true);
	-- wait out writers that may be adding mail to this queue, and hold off new ones
	LOCK TABLE gatekeeper.mail IN SHARE MODE;
	-- scheduled mail, and claimed mail still open in its batches, under one
	-- snapshot: a claim or a hand-back moves mail between them in one commit
	SELECT (SELECT count(*) FROM gatekeeper.mail_live l WHERE l.queue = drop_queue.name)
		   + (SELECT coalesce(sum(r.last_id - r.id + 1), 0) FROM gatekeeper.mail_run r
			   WHERE r.queue = drop_queue.name)
		   + (SELECT coalesce(sum(c.open), 0) FROM gatekeeper.mail_claim c
			   WHERE c.queue = drop_queue.name)
	  INTO live;
	IF live > 0 THEN
		RAISE EXCEPTION 'queue "%" still holds % live mail', drop_queue.name, live
			USING ERRCODE = 'object_in_use',
				  HINT = 'Cancel it with gatekeeper.cancel_queue() and wait for claimed mail to finish.';
	END IF;
	DELETE FROM gatekeeper.queue WHERE queue.name = drop_queue.name;
	-- its finished mail holds no key: a new queue of the name starts free
	DELETE FROM gatekeeper.mail_key k WHERE k.queue = drop_queue.name;
	PERFORM gatekeeper._forget_live(drop_queue.name);
END
$$;

COMMENT ON FUNCTION gatekeeper.drop_queue(text) IS
	'drop a queue that holds no scheduled or claimed mail, freeing its dedupe keys';

CREATE FUNCTION gatekeeper.pause(queue text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM gatekeeper._queue(pause.queue, true);
	UPDATE gatekeeper.queue SET paused = true WHERE name = pause.queue;
END
$$;

COMMENT ON FUNCTION gatekeeper.pause(text) IS
	'stop claims from taking a queue''s mail until resume()';

CREATE FUNCTION gatekeeper.resume(queue text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM gatekeeper._queue(resume.queue, true);
	UPDATE gatekeeper.queue SET paused = false WHERE name = resume.queue;
	PERFORM gatekeeper._wake();
	-- its due mail may be claimed again: external senders of a notify queue hear of it
	PERFORM gatekeeper._announce(q.name, now())
	   FROM gatekeeper.queue q
	  WHERE q.name = resume.queue AND q.notify
		AND gatekeeper._first_due(q.name, '-infinity') <= now();
END
$$;

COMMENT ON FUNCTION gatekeeper.resume(text) IS
	'let claims take a paused queue''s mail again';

-- src/mail_state_sweep.c
CREATE FUNCTION gatekeeper.cancel(id bigint)
RETURNS boolean
LANGUAGE c
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_cancel';

COMMENT ON FUNCTION gatekeeper.cancel(bigint) IS
	'cancel a scheduled mail by id; true when it was cancelled, false when it is not scheduled (claimed, finished, or no such mail)';

-- cancel the scheduled mail of a queue that has this dedupe key (the
-- application's own key for it); false when there is none
CREATE FUNCTION gatekeeper.cancel(queue text, dedupe_key text)
RETURNS boolean
LANGUAGE c
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_cancel_key';

COMMENT ON FUNCTION gatekeeper.cancel(text, text) IS
	'cancel the scheduled mail with this dedupe key in this queue; true when one was cancelled, false when no scheduled mail has it';

CREATE FUNCTION gatekeeper.cancel_queue(queue text)
RETURNS bigint
LANGUAGE c
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_cancel_queue';

COMMENT ON FUNCTION gatekeeper.cancel_queue(text) IS
	'cancel every scheduled mail of a queue; the number cancelled';

-- schedule a failed, expired or unknown mail again, with its Message-ID
-- (src/mail_state_sweep.c); the owner's, as cancel_queue
CREATE FUNCTION gatekeeper.retry(id bigint)
RETURNS boolean
LANGUAGE c
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_retry';

COMMENT ON FUNCTION gatekeeper.retry(bigint) IS
	'schedule a failed, expired or unknown mail again, due now, with the same Message-ID and its queue''s attempts anew; false when it is not finished (or no such mail); sent, cancelled and suppressed mail is refused';

CREATE FUNCTION gatekeeper.retry(queue text, since timestamptz)
RETURNS bigint
LANGUAGE c
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_retry_queue';

COMMENT ON FUNCTION gatekeeper.retry(text, timestamptz) IS
	'schedule again every failed mail of a queue that finished since then (not one whose dedupe key another mail holds now); the number scheduled';

/*
 * Gates
 */

-- validate gate arguments; NULL means "not given"
CREATE FUNCTION gatekeeper._check_gate_policy(period interval, max_sends int)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM gatekeeper._duration(period, 'period');
	IF max_sends NOT BETWEEN 1 AND 10000 THEN
		RAISE EXCEPTION 'max_sends must be between 1 and 10000'
			USING ERRCODE = 'invalid_parameter_value', DETAIL = format('max_sends was %s.', max_sends);
	END IF;
END
$$;

CREATE FUNCTION gatekeeper.create_gate(name text, period interval, max_sends int DEFAULT 1)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF create_gate.name IS NULL THEN
		RAISE EXCEPTION 'gate name must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF create_gate.name = '' THEN
		RAISE EXCEPTION 'gate name must not be empty' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF period IS NULL OR max_sends IS NULL THEN
		RAISE EXCEPTION 'period and max_sends must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	PERFORM gatekeeper._check_gate_policy(period, max_sends);
	BEGIN
		INSERT INTO gatekeeper.gate (name, period, max_sends)
		VALUES (create_gate.name, gatekeeper._duration(period, 'period'), max_sends);
	EXCEPTION WHEN unique_violation THEN
		RAISE EXCEPTION 'gate "%" already exists', create_gate.name USING ERRCODE = 'duplicate_object';
	END;
END
$$;

COMMENT ON FUNCTION gatekeeper.create_gate(text, interval, int) IS
	'make a gate that passes a recipient at most max_sends times within period';

CREATE FUNCTION gatekeeper.alter_gate(name text, period interval DEFAULT NULL, max_sends int DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF alter_gate.name IS NULL THEN
		RAISE EXCEPTION 'gate name must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	PERFORM gatekeeper._check_gate_policy(period, max_sends);
	-- running timers keep the period they were stamped with
	UPDATE gatekeeper.gate g
	   SET period = coalesce(gatekeeper._duration(alter_gate.period, 'period'), g.period),
		   max_sends = coalesce(alter_gate.max_sends, g.max_sends)
	 WHERE g.name = alter_gate.name;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'gate "%" does not exist', alter_gate.name USING ERRCODE = 'undefined_object';
	END IF;
END
$$;

COMMENT ON FUNCTION gatekeeper.alter_gate(text, interval, int) IS
	'change a gate''s period or max_sends for passes made from now on; each argument NULL leaves its setting as it is';

CREATE FUNCTION gatekeeper.drop_gate(name text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	g gatekeeper.gate;
	user_queue text;
BEGIN
	IF drop_gate.name IS NULL THEN
		RAISE EXCEPTION 'gate name must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	SELECT * INTO g FROM gatekeeper.gate WHERE gate.name = drop_gate.name FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'gate "%" does not exist', drop_gate.name USING ERRCODE = 'undefined_object';
	END IF;
	SELECT q.name INTO user_queue FROM gatekeeper.queue q
	 WHERE drop_gate.name = ANY (q.gates) ORDER BY q.name LIMIT 1;
	IF FOUND THEN
		RAISE EXCEPTION 'gate "%" is used by queue "%"', drop_gate.name, user_queue
			USING ERRCODE = 'object_in_use',
				  HINT = 'Remove it from the queue with gatekeeper.alter_queue(..., gates => ...) first.';
	END IF;
	DELETE FROM gatekeeper.gate_log WHERE gate = g.id;
	DELETE FROM gatekeeper.gate WHERE id = g.id;
END
$$;

COMMENT ON FUNCTION gatekeeper.drop_gate(text) IS
	'drop a gate that no queue uses, with its passes';

CREATE FUNCTION gatekeeper.gate_pass(gate text, recipient text, holder bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE c SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_gate_pass';

COMMENT ON FUNCTION gatekeeper.gate_pass(text, text, bigint) IS
	'take one pass of a gate for a recipient, held by holder when given; true when it passed, false when the gate is closed';

CREATE FUNCTION gatekeeper.gate_pass_batch(gate text, recipients text[])
RETURNS SETOF text
LANGUAGE c SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_gate_pass_batch';

COMMENT ON FUNCTION gatekeeper.gate_pass_batch(text, text[]) IS
	'take one pass of a gate for each recipient; the recipients that passed';

CREATE FUNCTION gatekeeper.gate_open(gate text, recipient text)
RETURNS boolean
LANGUAGE c STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_gate_open';

COMMENT ON FUNCTION gatekeeper.gate_open(text, text) IS
	'whether a gate would pass a recipient now, without taking a pass';

CREATE FUNCTION gatekeeper.gate_next_open(gate text, recipient text)
RETURNS timestamptz
LANGUAGE c STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_gate_next_open';

COMMENT ON FUNCTION gatekeeper.gate_next_open(text, text) IS
	'when a gate next opens for a recipient, NULL when it is open';

CREATE FUNCTION gatekeeper.gate_release(gate text, recipient text, holder bigint)
RETURNS boolean
LANGUAGE c SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_gate_release';

COMMENT ON FUNCTION gatekeeper.gate_release(text, text, bigint) IS
	'give back the pass of a gate that holder holds for a recipient; true when one was given back';

CREATE FUNCTION gatekeeper.explain(recipient text)
RETURNS TABLE (gate text, open boolean, next_open timestamptz, sends_in_period int, max_sends int)
LANGUAGE c STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_explain';

COMMENT ON FUNCTION gatekeeper.explain(text) IS
	'every gate''s view of one recipient, one row per gate: open or not, its next opening, the passes in its period and max_sends';

-- drop expired passes from shared memory (purge calls it)
CREATE FUNCTION gatekeeper._gate_sweep()
RETURNS bigint
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_gate_sweep';

-- what the gates hold in shared memory, for the gatekeeper.gate_memory view
CREATE FUNCTION gatekeeper._gate_memory(OUT bytes_used bigint, OUT bytes_total bigint,
	OUT entries bigint, OUT full_refusals bigint)
RETURNS SETOF record
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_gate_memory_stats';

COMMENT ON FUNCTION gatekeeper._gate_memory() IS
	'what the gates hold in the server''s shared memory (bytes used and total, entries, gated mails deferred because it was full), one row; the gate_memory view reads it';

-- the key an address is kept under in the suppression list, or 22023
CREATE FUNCTION gatekeeper._address_key(address text)
RETURNS text
LANGUAGE c IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_address_key';

-- raise 22023 unless each of a sending window and a time zone not NULL is valid
CREATE FUNCTION gatekeeper._check_window(send_window text, timezone text)
RETURNS void
LANGUAGE c STABLE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_check_window';

-- raise 22023 (54000 when too long) unless url can be queue's unsubscribe_url
CREATE FUNCTION gatekeeper._check_unsubscribe_url(url text, queue text)
RETURNS void
LANGUAGE c STABLE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_check_unsubscribe_url_sql';

-- the signed token for a recipient and a queue, as the claim puts it in the URL
CREATE FUNCTION gatekeeper._unsubscribe_token(recipient text, queue text)
RETURNS text
LANGUAGE c STABLE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_unsubscribe_token';

-- a sender parsed (bare address, display name) and the From field written for it;
-- name, when given, is the display name instead (a recipient_name)
CREATE FUNCTION gatekeeper._mailbox(value text, name text DEFAULT NULL,
	OUT address text, OUT display_name text, OUT field text)
RETURNS record
LANGUAGE c IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_mailbox';

-- add a suppression entry for an address key; true when new.  An entry
-- that exists keeps its row, but takes the new reason when that stops more
-- (hard_bounce or manual over soft_bounce, unsubscribe or complaint;
-- soft_bounce over unsubscribe or complaint): gatekeeper_suppression_add
-- (src/suppression.c), which the reports, the nacks and unsubscribe() call
-- directly
CREATE FUNCTION gatekeeper._suppress(address_key text, reason text, queue text,
	detail text, mail_id bigint)
RETURNS boolean
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_suppress';

-- which of these mails (recipient i to queue i) the claim would suppress, and why
CREATE FUNCTION gatekeeper._suppressed(recipients text[], queues text[])
RETURNS TABLE (recipient text, queue text, reason text)
LANGUAGE c STABLE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_suppressed';

/*
 * Enqueue
 */
-- enqueue itself (src/enqueue.c): the insert into gatekeeper.mail, whose
-- trigger validates the mail; with a dedupe key, the holder's id if the
-- key is held (scheduled, claimed, or finished within the queue's
-- dedupe_window), else the insert, retried when a concurrent enqueue of
-- the key won.  Its errors reach the application without the context of
-- gatekeeper's own statements
CREATE FUNCTION gatekeeper.enqueue(recipient text, subject text, body text,
	queue text DEFAULT 'default', send_at timestamptz DEFAULT now(),
	html text DEFAULT NULL, sender text DEFAULT NULL, headers jsonb DEFAULT NULL,
	dedupe_key text DEFAULT NULL, priority int DEFAULT 0,
	send_by timestamptz DEFAULT NULL, recipient_name text DEFAULT NULL,
	metadata jsonb DEFAULT NULL, timezone text DEFAULT NULL,
	template text DEFAULT NULL, data jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE c
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_enqueue';

COMMENT ON FUNCTION gatekeeper.enqueue(text, text, text, text, timestamptz, text, text, jsonb, text, int, timestamptz, text, jsonb, text, text, jsonb) IS
	'enqueue one mail, validated like a bulk insert, and return its id; with a dedupe key its queue holds, the holder''s id, writing nothing';

/*
 * Claim and report
 */
CREATE FUNCTION gatekeeper.claim(worker text, batch int DEFAULT 100,
	lease interval DEFAULT '5 minutes', queues text[] DEFAULT NULL)
RETURNS TABLE (id bigint, attempt int, queue text, recipient text, recipient_name text,
			   sender text, subject text, body text, html text, headers jsonb,
			   message_id text, metadata jsonb)
LANGUAGE c SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- no SET jit: its statements are planned without JIT by the library's one
-- planner policy (src/catalog.c, gatekeeper_planner)
AS 'MODULE_PATHNAME', 'gatekeeper_claim';

COMMENT ON FUNCTION gatekeeper.claim(text, int, interval, text[]) IS
	'lease up to batch due mails to one worker, fairly across unpaused queues (or those named) and through their gates and the suppression list; one row per mail to send, with its (id, attempt) and content';

-- the claim's mail_done row is its 'sent' event too (gatekeeper.events)
CREATE FUNCTION gatekeeper.ack(id bigint, attempt int)
RETURNS boolean
LANGUAGE c SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_ack';

COMMENT ON FUNCTION gatekeeper.ack(bigint, int) IS
	'report a claimed mail sent; true when (id, attempt) was still a current claim, false, changing nothing, when it was not; a claim of another role or of a background worker is refused (42501)';

-- ack for many claims at once: how many were still the caller's
CREATE FUNCTION gatekeeper.ack_batch(ids bigint[], attempts int[])
RETURNS int
LANGUAGE c SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_ack_batch';

COMMENT ON FUNCTION gatekeeper.ack_batch(bigint[], int[]) IS
	'report many claimed mails sent, as ack() does for each (id, attempt) pair; the number of claims that were still current (one of another role fails the call)';

-- retried with exponential backoff and equal jitter ([d/2, d], d =
-- retry_delay * 2^(tries - 1), at most 6 hours), or failed when permanent
-- or out of attempts: its passes given back, a permanent failure a bounce
-- of its address (src/mail_state.c)
CREATE FUNCTION gatekeeper.nack(id bigint, attempt int, error text, permanent boolean DEFAULT false)
RETURNS text
LANGUAGE c SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_nack';

COMMENT ON FUNCTION gatekeeper.nack(bigint, int, text, boolean) IS
	'report a claimed mail not sent: retried with backoff, or failed when permanent or out of attempts; the resulting state, NULL when the claim was not current (another role''s is refused)';

-- nack for many claims at once, each element as nack() would do it (a
-- claim named twice with the error of its first element); returns how
-- many were still the caller's.  The claims' batches are locked in batch
-- order (as ack_batch locks them), hard bounces suppressed in address
-- order and the passes of the mail that failed given back in one sorted
-- release, so that concurrent batches do not deadlock.
CREATE FUNCTION gatekeeper.nack_batch(ids bigint[], attempts int[], errors text[],
	permanent boolean DEFAULT false)
RETURNS int
LANGUAGE c SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_nack_batch';

COMMENT ON FUNCTION gatekeeper.nack_batch(bigint[], int[], text[], boolean) IS
	'report many claimed mails not sent, as nack() does for each (id, attempt, error), with one permanent for all; the number of claims that were still current (one of another role fails the call)';

-- the lease is per batch row (up to 128 mails of one claim): see
-- docs/reference.md, "A lease is held by a batch"
CREATE FUNCTION gatekeeper.extend(id bigint, attempt int, lease interval)
RETURNS boolean
LANGUAGE c SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_extend';

COMMENT ON FUNCTION gatekeeper.extend(bigint, int, interval) IS
	'extend a claim''s lease, for its whole batch, to lease from now when that ends later (a lease is never shortened); true, or false when the claim was not current (another role''s is refused)';

-- hand claimed mail back unsent and uncharged: no relay could be reached
CREATE FUNCTION gatekeeper.unclaim(ids bigint[], attempts int[], error text, delay interval DEFAULT '0')
RETURNS int
LANGUAGE c SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_unclaim';

COMMENT ON FUNCTION gatekeeper.unclaim(bigint[], int[], text, interval) IS
	'hand claimed mails back unsent and uncharged (no relay could be reached), due again after delay; the number handed back (one of another role fails the call)';

-- this server's incarnation (src/gatekeeper.c), which the background
-- workers' claims name; NULL when the library is not preloaded
CREATE FUNCTION gatekeeper._incarnation()
RETURNS text
LANGUAGE c STABLE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_incarnation_sql';

-- settle lapsed claims (src/mail_state_sweep.c): scheduled again, unknown
-- or failed; the claims of another server incarnation's background
-- workers at once, whatever their lease
CREATE FUNCTION gatekeeper.reap()
RETURNS int
LANGUAGE c
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_reap';

COMMENT ON FUNCTION gatekeeper.reap() IS
	'settle the claimed mail whose lease ran out (or whose server is gone): scheduled again, unknown (at-most-once mail) or failed (attempts spent); the number of mails settled';

-- the earliest send_at of scheduled mail in unpaused queues (only "queues",
-- if given): when an external sender should claim next; the background
-- worker asks it for the queues it serves
CREATE FUNCTION gatekeeper.next_due(queues text[] DEFAULT NULL)
RETURNS timestamptz
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT least((
	WITH RECURSIVE lv(queue, p) AS (
		SELECT q.name,
			   (SELECT m.priority FROM gatekeeper.mail_live m
				 WHERE m.queue = q.name AND m.state = 'scheduled'
				 ORDER BY m.priority DESC LIMIT 1)
		  FROM gatekeeper.queue q
		 WHERE NOT q.paused AND (next_due.queues IS NULL OR q.name = ANY (next_due.queues))
		UNION ALL
		SELECT lv.queue,
			   (SELECT m.priority FROM gatekeeper.mail_live m
				 WHERE m.queue = lv.queue AND m.state = 'scheduled' AND m.priority < lv.p
				 ORDER BY m.priority DESC LIMIT 1)
		  FROM lv WHERE lv.p IS NOT NULL
	)
	SELECT min((SELECT m.send_at FROM gatekeeper.mail_live m
				 WHERE m.queue = lv.queue AND m.state = 'scheduled' AND m.priority = lv.p
				 ORDER BY m.send_at LIMIT 1))
	  FROM lv WHERE lv.p IS NOT NULL
	), (
	WITH RECURSIVE lv(queue, p) AS (
		SELECT q.name,
			   (SELECT m.priority FROM gatekeeper.mail_run m
				 WHERE m.queue = q.name
				 ORDER BY m.priority DESC LIMIT 1)
		  FROM gatekeeper.queue q
		 WHERE NOT q.paused AND (next_due.queues IS NULL OR q.name = ANY (next_due.queues))
		UNION ALL
		SELECT lv.queue,
			   (SELECT m.priority FROM gatekeeper.mail_run m
				 WHERE m.queue = lv.queue AND m.priority < lv.p
				 ORDER BY m.priority DESC LIMIT 1)
		  FROM lv WHERE lv.p IS NOT NULL
	)
	SELECT min((SELECT m.send_at FROM gatekeeper.mail_run m
				 WHERE m.queue = lv.queue AND m.priority = lv.p
				 ORDER BY m.send_at LIMIT 1))
	  FROM lv WHERE lv.p IS NOT NULL
	))
$$;

COMMENT ON FUNCTION gatekeeper.next_due(text[]) IS
	'the earliest send_at of scheduled mail in unpaused queues (only those named, when given): when to claim next; NULL when there is none';

/*
 * Wake-ups for external senders (src/mail.c, src/worker.c): a queue with
 * notify sends NOTIFY gatekeeper, '<queue>' when due mail for it commits,
 * and the first background worker announces mail that comes due later,
 * when it comes due.
 */

-- the earliest send_at after "after" of the queue's scheduled mail, one
-- index probe per priority level
CREATE FUNCTION gatekeeper._first_due(queue text, after timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT least((
	WITH RECURSIVE lv(p) AS (
		(SELECT m.priority FROM gatekeeper.mail_live m
		  WHERE m.queue = $1 AND m.state = 'scheduled'
		  ORDER BY m.priority DESC LIMIT 1)
		UNION ALL
		SELECT (SELECT m.priority FROM gatekeeper.mail_live m
				 WHERE m.queue = $1 AND m.state = 'scheduled' AND m.priority < lv.p
				 ORDER BY m.priority DESC LIMIT 1)
		  FROM lv WHERE lv.p IS NOT NULL
	)
	SELECT min((SELECT m.send_at FROM gatekeeper.mail_live m
				 WHERE m.queue = $1 AND m.state = 'scheduled' AND m.priority = lv.p
				   AND m.send_at > $2
				 ORDER BY m.send_at LIMIT 1))
	  FROM lv WHERE lv.p IS NOT NULL
	), (
	WITH RECURSIVE lv(p) AS (
		(SELECT m.priority FROM gatekeeper.mail_run m
		  WHERE m.queue = $1
		  ORDER BY m.priority DESC LIMIT 1)
		UNION ALL
		SELECT (SELECT m.priority FROM gatekeeper.mail_run m
				 WHERE m.queue = $1 AND m.priority < lv.p
				 ORDER BY m.priority DESC LIMIT 1)
		  FROM lv WHERE lv.p IS NOT NULL
	)
	SELECT min((SELECT m.send_at FROM gatekeeper.mail_run m
				 WHERE m.queue = $1 AND m.priority = lv.p
				   AND m.send_at > $2
				 ORDER BY m.send_at LIMIT 1))
	  FROM lv WHERE lv.p IS NOT NULL
	))
$$;

-- announce a notify queue's mail made due again (unclaim, reap): at commit
-- when it is due by now, else by the worker when it comes due
CREATE FUNCTION gatekeeper._announce(queue text, due timestamptz)
RETURNS void
LANGUAGE c STRICT
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_announce';

-- for the first background worker: NOTIFY each notify queue among
-- candidates (NULL: all of them) holding scheduled mail due in
-- (since, upto]; then, for every notify queue, its earliest scheduled
-- mail due after upto (NULL when none)
CREATE FUNCTION gatekeeper._announce_due(candidates text[], since timestamptz, upto timestamptz)
RETURNS TABLE (queue text, next_due timestamptz)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM pg_catalog.pg_notify('gatekeeper', q.name)
	   FROM gatekeeper.queue q
	  WHERE q.notify AND NOT q.paused AND (candidates IS NULL OR q.name = ANY (candidates))
		AND gatekeeper._first_due(q.name, since) <= upto;
	RETURN QUERY
		SELECT q.name, gatekeeper._first_due(q.name, upto)
		  FROM gatekeeper.queue q WHERE q.notify
		 ORDER BY q.name;
END
$$;

/*
 * Rotate the retention segments (see gatekeeper.mail): when the current
 * segment is half of retention old and the next one holds no mail that
 * finished within retention, move the next one's live mail to the current
 * segment, empty it by TRUNCATE and make it current.  Gives up, to try
 * again on a later purge, when the next segment's mail is too recent or
 * its tables stay locked by others for a second.  Returns the finished
 * mails removed.  In C, as purge is: src/mail_state_sweep.c.
 */
CREATE FUNCTION gatekeeper._rotate(retention interval)
RETURNS bigint
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_rotate';

-- delete the stale rows of mail_key in a window of batch / 100 of its
-- pages chosen at random, so the table stays about as large as the keyed
-- unfinished mail; the rows deleted (purge() runs it: src/
-- mail_state_upkeep.c)
CREATE FUNCTION gatekeeper._mail_key_prune(batch int)
RETURNS bigint
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_mail_key_prune';

-- give a drained mail_claim's space back by TRUNCATE, under READ
-- COMMITTED and only if no one holds the table; whether it truncated
-- (purge() runs it: src/mail_state_upkeep.c)
CREATE FUNCTION gatekeeper._mail_claim_shrink()
RETURNS boolean
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_mail_claim_shrink';

-- remove finished mail older than gatekeeper.retention, by rotating the
-- retention segments, and a batch of expired gate log rows; sweep expired
-- passes out of shared memory
CREATE FUNCTION gatekeeper.purge(batch int DEFAULT 10000)
RETURNS bigint
LANGUAGE c
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_purge';

COMMENT ON FUNCTION gatekeeper.purge(int) IS
	'remove finished mail older than gatekeeper.retention by rotating the retention segments, and a batch of expired gate log rows; the rows removed';

CREATE FUNCTION gatekeeper._wake()
RETURNS void
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_wake';

/*
 * Suppression and unsubscribe
 */
CREATE FUNCTION gatekeeper.suppress(address text, reason text DEFAULT 'manual',
	queue text DEFAULT NULL, detail text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF address IS NULL OR reason IS NULL THEN
		RAISE EXCEPTION 'address and reason must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF reason NOT IN ('hard_bounce', 'complaint', 'unsubscribe', 'manual', 'soft_bounce') THEN
		RAISE EXCEPTION 'invalid suppression reason "%"', reason
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'reason must be hard_bounce, soft_bounce, complaint, unsubscribe or manual.';
	END IF;
	IF suppress.queue IS NOT NULL THEN
		PERFORM gatekeeper._queue(suppress.queue);
	END IF;
	RETURN gatekeeper._suppress(gatekeeper._address_key(address), reason, suppress.queue,
								detail, NULL);
END
$$;

COMMENT ON FUNCTION gatekeeper.suppress(text, text, text, text) IS
	'put an address on the suppression list, for every queue or one, with a reason; true when the entry is new';

CREATE FUNCTION gatekeeper.unsuppress(address text, queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF address IS NULL THEN
		RAISE EXCEPTION 'address must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	DELETE FROM gatekeeper.suppression_list s
	 WHERE s.address = gatekeeper._address_key(unsuppress.address)
	   AND s.queue IS NOT DISTINCT FROM unsuppress.queue;
	RETURN FOUND;
END
$$;

COMMENT ON FUNCTION gatekeeper.unsuppress(text, text) IS
	'take an address off the suppression list for one queue, or the entry for every queue when queue is NULL; true when an entry was removed';

CREATE FUNCTION gatekeeper.unsubscribe(token text)
RETURNS boolean
LANGUAGE c SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_unsubscribe';

COMMENT ON FUNCTION gatekeeper.unsubscribe(text) IS
	'verify a List-Unsubscribe token and suppress its recipient for its queue; true when the entry is new';

/*
 * Bounces, complaints, events (src/report.c)
 */

-- raise 22023 (54000 when too long) unless value can be a queue's
-- return_path: an address whose local part holds {token} at most once,
-- set apart by + - = . _ or the part's ends
CREATE FUNCTION gatekeeper._check_return_path(value text)
RETURNS void
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_check_return_path';

-- the VERP token naming a mail, as the worker puts it in the envelope
-- sender and ENVID
CREATE FUNCTION gatekeeper._verp_token(mail_id bigint)
RETURNS text
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_verp_token';

-- the Message-ID a mail gets at its first claim, <id.mac@domain> (issue
-- 44; src/message_id.c): the claim statement's, when the claim runs it;
-- domain and default_sender are the settings, '' when unset
CREATE FUNCTION gatekeeper._message_id(id bigint, sender text, domain text, default_sender text)
RETURNS text
LANGUAGE c STABLE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_message_id_sql';

-- why a mail failed, from a status (an RFC 3463 code, a reply, or a nack's
-- error) and the diagnostic together: user_unknown, host_unknown (the hard
-- bounces), mailbox_full, message_too_large, policy_blocked,
-- spam_filtered, auth_failure, expired, rate_limited, system_error or
-- other (src/smtp_trouble.c, the one classifier the relay's refusals and
-- the reports use)
CREATE FUNCTION gatekeeper._bounce_reason(status text, detail text)
RETURNS text
LANGUAGE c IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_bounce_reason';

CREATE FUNCTION gatekeeper.ingest_report(message text, envelope_to text DEFAULT NULL)
RETURNS TABLE (mail_id bigint, recipient text, event text, status text, detail text)
LANGUAGE c SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_ingest_report';

COMMENT ON FUNCTION gatekeeper.ingest_report(text, text) IS
	'read a DSN (RFC 3464) or an ARF report (RFC 5965) as the bounce mailbox received it; one row per recipient of a mail gatekeeper sent that it recorded';

CREATE FUNCTION gatekeeper.record_event(message_id text, event text, status text DEFAULT NULL,
	detail text DEFAULT NULL, recipient text DEFAULT NULL)
RETURNS bigint
LANGUAGE c SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_record_event';

COMMENT ON FUNCTION gatekeeper.record_event(text, text, text, text, text) IS
	'record an ESP webhook''s event (bounced, deferred, delivered, complained) for the mail with this Message-ID; its id, NULL when no sent mail matches';

/*
 * Looking inside
 */
/*
 * Queue totals (src/mail/count_totals.c): mails enqueued and finished, per queue, kept
 * in shared memory for queue_stats, so that a scrape never counts rows and
 * purging never lowers them.  Every mail enters through the statement
 * trigger of gatekeeper.mail (which counts it), and every way a mail
 * finishes inserts its outcome into gatekeeper.mail_done, whose statement
 * trigger counts the outcomes by queue and state; only committed work
 * counts.  A deleted queue's totals go, so a new queue of that name starts
 * at zero.
 */
CREATE FUNCTION gatekeeper._count_done() RETURNS trigger
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_count_done';

CREATE TRIGGER mail_done_count AFTER INSERT ON gatekeeper.mail_done
	REFERENCING NEW TABLE AS new_done
	FOR EACH STATEMENT EXECUTE FUNCTION gatekeeper._count_done();

-- the same for events: deferrals, bounces and complaints by queue
CREATE FUNCTION gatekeeper._count_events() RETURNS trigger
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_count_events';

CREATE TRIGGER event_log_count AFTER INSERT ON gatekeeper.event_log
	REFERENCING NEW TABLE AS new_events
	FOR EACH STATEMENT EXECUTE FUNCTION gatekeeper._count_events();

CREATE FUNCTION gatekeeper._forget_queue() RETURNS trigger
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_forget_queue';

CREATE TRIGGER queue_forget AFTER DELETE ON gatekeeper.queue
	FOR EACH ROW EXECUTE FUNCTION gatekeeper._forget_queue();

-- the totals of this database's queues since the server started or
-- reset_stats(), by hashtextextended(name, 0) of the queue's name: no row
-- for a queue that has counted nothing, none at all when the library was
-- not preloaded (nothing is counted then)
CREATE FUNCTION gatekeeper._queue_totals(OUT queue_hash bigint, OUT enqueued bigint,
		OUT sent bigint, OUT failed bigint, OUT suppressed bigint, OUT expired bigint,
		OUT cancelled bigint, OUT unknown bigint, OUT deferred bigint, OUT bounced bigint,
		OUT complained bigint, OUT reports bigint, OUT ignored bigint)
RETURNS SETOF record
LANGUAGE c VOLATILE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_queue_totals';

COMMENT ON FUNCTION gatekeeper._queue_totals() IS
	'the totals of every queue of this database from shared memory (enqueued, sent, failed and the other outcomes, events and reports), by a hash of the queue''s name; queue_stats reads them';

CREATE FUNCTION gatekeeper.reset_stats()
RETURNS void
LANGUAGE c VOLATILE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_reset_stats';

COMMENT ON FUNCTION gatekeeper.reset_stats() IS 'zero the totals of queue_stats for every queue of this database';

/*
 * Live counts (src/mail/mail_count.c): how many of each queue's mails are
 * scheduled, kept as mail_live changes, so that queue_stats never counts
 * mail_live (claimed mail is no row of mail_live: queue_stats counts it
 * from the open counts of mail_claim's batches).  The statement triggers of mail_live net each
 * statement's rows by queue and add them, in the same transaction, to the
 * rows of the backend that wrote them (slot: its backend id), so sessions
 * never wait for each other here; a queue's counts are the sum of its
 * rows.  The insert trigger of gatekeeper.mail counts the live rows it
 * writes itself.  A transaction's changes are written once, as it
 * commits.  ENABLE ALWAYS: the counts hold under session_replication_role
 * = replica too.  drop_queue deletes the queue's rows (_forget_live), so
 * a new queue of its name starts at zero.  A prepared transaction writes
 * a row of its own (slot below zero); recount_live() folds those.
 */
CREATE TABLE gatekeeper.mail_live_count (
	queue		text NOT NULL,
	slot		int NOT NULL,
	scheduled	bigint NOT NULL DEFAULT 0,
	retrying	bigint NOT NULL DEFAULT 0,
	PRIMARY KEY (queue, slot)
) WITH (fillfactor = 50);

COMMENT ON TABLE gatekeeper.mail_live_count IS
	'scheduled mail by queue, one row per queue and writing backend: a queue''s scheduled mail is the sum of its rows';
COMMENT ON COLUMN gatekeeper.mail_live_count.retrying IS
	'of the scheduled mail, that claimed before (attempt > 0): deferred, nacked, handed back or reaped';

CREATE FUNCTION gatekeeper._count_live() RETURNS trigger
LANGUAGE c
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_count_live';

CREATE TRIGGER mail_live_count_insert AFTER INSERT ON gatekeeper.mail_live
	REFERENCING NEW TABLE AS new_live
	FOR EACH STATEMENT EXECUTE FUNCTION gatekeeper._count_live();
CREATE TRIGGER mail_live_count_update AFTER UPDATE ON gatekeeper.mail_live
	REFERENCING OLD TABLE AS old_live NEW TABLE AS new_live
	FOR EACH STATEMENT EXECUTE FUNCTION gatekeeper._count_live();
CREATE TRIGGER mail_live_count_delete AFTER DELETE ON gatekeeper.mail_live
	REFERENCING OLD TABLE AS old_live
	FOR EACH STATEMENT EXECUTE FUNCTION gatekeeper._count_live();
CREATE TRIGGER mail_live_count_truncate AFTER TRUNCATE ON gatekeeper.mail_live
	FOR EACH STATEMENT EXECUTE FUNCTION gatekeeper._count_live();
ALTER TABLE gatekeeper.mail_live ENABLE ALWAYS TRIGGER mail_live_count_insert;
ALTER TABLE gatekeeper.mail_live ENABLE ALWAYS TRIGGER mail_live_count_update;
ALTER TABLE gatekeeper.mail_live ENABLE ALWAYS TRIGGER mail_live_count_delete;
ALTER TABLE gatekeeper.mail_live ENABLE ALWAYS TRIGGER mail_live_count_truncate;

-- a run counts as its mails (last_id - id + 1), never retrying
CREATE TRIGGER mail_run_count_insert AFTER INSERT ON gatekeeper.mail_run
	REFERENCING NEW TABLE AS new_run
	FOR EACH STATEMENT EXECUTE FUNCTION gatekeeper._count_live();
CREATE TRIGGER mail_run_count_update AFTER UPDATE ON gatekeeper.mail_run
	REFERENCING OLD TABLE AS old_run NEW TABLE AS new_run
	FOR EACH STATEMENT EXECUTE FUNCTION gatekeeper._count_live();
CREATE TRIGGER mail_run_count_delete AFTER DELETE ON gatekeeper.mail_run
	REFERENCING OLD TABLE AS old_run
	FOR EACH STATEMENT EXECUTE FUNCTION gatekeeper._count_live();
CREATE TRIGGER mail_run_count_truncate AFTER TRUNCATE ON gatekeeper.mail_run
	FOR EACH STATEMENT EXECUTE FUNCTION gatekeeper._count_live();
ALTER TABLE gatekeeper.mail_run ENABLE ALWAYS TRIGGER mail_run_count_insert;
ALTER TABLE gatekeeper.mail_run ENABLE ALWAYS TRIGGER mail_run_count_update;
ALTER TABLE gatekeeper.mail_run ENABLE ALWAYS TRIGGER mail_run_count_delete;
ALTER TABLE gatekeeper.mail_run ENABLE ALWAYS TRIGGER mail_run_count_truncate;

/*
 * Count mail_live afresh into mail_live_count, for counts that missed
 * writes made with mail_live's triggers disabled (pg_restore
 * --disable-triggers): waits for the transactions writing mail_live,
 * keeps new ones waiting until it ends, and returns the live mails
 * counted.  READ COMMITTED only.
 */
CREATE FUNCTION gatekeeper.recount_live() RETURNS bigint
LANGUAGE c
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_recount_live';

COMMENT ON FUNCTION gatekeeper.recount_live() IS
	'count mail_live afresh into the live counts that queue_stats reads, after writes made with its triggers disabled; the live mails counted';

/*
 * The due mail of a queue and the oldest of it (scheduled: the queue's
 * scheduled mail, from mail_live_count), read from mail_due alone: each
 * priority's due mail is the start of its range, found by a skip scan
 * over the priorities as the claim does, its oldest in the same pass.
 * due is counted on whichever side of now() holds fewer entries (the
 * other is scheduled, less it, under the same snapshot): up to lim
 * entries of each priority on each side in one pass, then eight times as
 * many, so that the cost follows the smaller side, not the backlog.
 */
CREATE FUNCTION gatekeeper._live_due(queue text, scheduled bigint,
	OUT due bigint, OUT oldest_due timestamptz)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
	lim bigint := 1000;
	counted bigint;
	cut_off boolean;
	later bigint;
	later_cut_off boolean;
	run_due bigint;
	run_oldest timestamptz;
	run_cut_off boolean;
	run_later bigint;
	run_later_cut_off boolean;
	t timestamptz := now();
BEGIN
	LOOP
		-- the same over the runs (mail_run), each counting as its mails
		WITH RECURSIVE lv(p) AS (
			(SELECT d.priority FROM gatekeeper.mail_run d
			  WHERE d.queue = _live_due.queue
			  ORDER BY d.priority DESC LIMIT 1)
			UNION ALL
			SELECT (SELECT d.priority FROM gatekeeper.mail_run d
					 WHERE d.queue = _live_due.queue AND d.priority < lv.p
					 ORDER BY d.priority DESC LIMIT 1)
			  FROM lv WHERE lv.p IS NOT NULL)
		SELECT min(a.first), coalesce(sum(a.n), 0), coalesce(bool_or(a.runs >= lim), false),
			   coalesce(sum(b.n), 0), coalesce(bool_or(b.runs >= lim), false)
		  INTO run_oldest, run_due, run_cut_off, run_later, run_later_cut_off
		  FROM lv,
			   LATERAL (
				SELECT min(x.send_at) AS first, sum(x.n) AS n, count(*) AS runs
				  FROM (SELECT d.send_at, d.last_id - d.id + 1 AS n FROM gatekeeper.mail_run d
						 WHERE d.queue = _live_due.queue
						   AND d.priority = lv.p AND d.send_at <= t
						 ORDER BY d.send_at LIMIT lim) x) a,
			   LATERAL (
				SELECT sum(x.n) AS n, count(*) AS runs
				  FROM (SELECT d.last_id - d.id + 1 AS n FROM gatekeeper.mail_run d
						 WHERE d.queue = _live_due.queue
						   AND d.priority = lv.p AND d.send_at > t
						 LIMIT lim) x) b
		 WHERE lv.p IS NOT NULL;
		-- each priority's first lim entries due and first lim not yet due
		WITH RECURSIVE lv(p) AS (
			(SELECT d.priority FROM gatekeeper.mail_live d
			  WHERE d.queue = _live_due.queue AND d.state = 'scheduled'
			  ORDER BY d.priority DESC LIMIT 1)
			UNION ALL
			SELECT (SELECT d.priority FROM gatekeeper.mail_live d
					 WHERE d.queue = _live_due.queue AND d.state = 'scheduled' AND d.priority < lv.p
					 ORDER BY d.priority DESC LIMIT 1)
			  FROM lv WHERE lv.p IS NOT NULL)
		SELECT min(a.first), coalesce(sum(a.n), 0), coalesce(bool_or(a.n >= lim), false),
			   coalesce(sum(b.n), 0), coalesce(bool_or(b.n >= lim), false)
		  INTO oldest_due, counted, cut_off, later, later_cut_off
		  FROM lv,
			   LATERAL (
				SELECT min(x.send_at) AS first, count(*) AS n
				  FROM (SELECT d.send_at FROM gatekeeper.mail_live d
						 WHERE d.queue = _live_due.queue AND d.state = 'scheduled'
						   AND d.priority = lv.p AND d.send_at <= t
						 ORDER BY d.send_at LIMIT lim) x) a,
			   LATERAL (
				SELECT count(*) AS n
				  FROM (SELECT FROM gatekeeper.mail_live d
						 WHERE d.queue = _live_due.queue AND d.state = 'scheduled'
						   AND d.priority = lv.p AND d.send_at > t
						 LIMIT lim) x) b
		 WHERE lv.p IS NOT NULL;
		oldest_due := least(oldest_due, run_oldest);
		IF NOT cut_off AND NOT run_cut_off THEN
			due := counted + run_due;
			RETURN;
		END IF;
		IF NOT later_cut_off AND NOT run_later_cut_off THEN
			due := _live_due.scheduled - later - run_later;
			RETURN;
		END IF;
		lim := lim * 8;
	END LOOP;
END
$$;

-- this transaction's changes to the live counts, not yet written (they
-- are as it commits): queue_stats adds them, so that inside a transaction
-- that changed live mail the counts agree with the mail_live it sees
CREATE FUNCTION gatekeeper._live_pending(OUT queue text, OUT scheduled bigint, OUT retrying bigint)
RETURNS SETOF record
LANGUAGE c
STABLE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_live_pending';

/*
 * The live mail of every queue that has some, for queue_stats, without a
 * scan of mail_live: scheduled from mail_live_count; due and
 * the oldest due mail of the queues with at most 1,000 scheduled mails in
 * one pass over their entries in mail_due, of larger queues by _live_due
 * (planned for each, which costs what reading a few hundred entries
 * does); claimed and the lapsed leases from the batches of mail_claim,
 * their open counts (one row per claim in flight; claimed mail is no row
 * of mail_live, so the counts have none).  SECURITY DEFINER: a role
 * granted queue_stats reads these counts, not mail_live.  No JIT: the
 * estimates of the index passes cross jit_above_cost, and compiling took
 * 20-30 ms of a 50 ms call.
 */
CREATE FUNCTION gatekeeper._live_stats(OUT queue text, OUT scheduled bigint,
	OUT claimed bigint, OUT due bigint, OUT oldest_due timestamptz, OUT lease_expired bigint,
	OUT retrying bigint)
RETURNS SETOF record
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
	WITH c AS MATERIALIZED (
		SELECT n.queue, sum(n.scheduled)::bigint AS scheduled, sum(n.retrying)::bigint AS retrying
		  FROM (SELECT w.queue, w.scheduled, w.retrying FROM gatekeeper.mail_live_count w
				UNION ALL
				SELECT p.queue, p.scheduled, p.retrying FROM gatekeeper._live_pending() p) n
		 GROUP BY n.queue)
	SELECT u.queue, sum(u.scheduled)::bigint, sum(u.claimed)::bigint, sum(u.due)::bigint,
		   min(u.oldest_due), sum(u.lapsed)::bigint, sum(u.retrying)::bigint
	  FROM (
		SELECT c.queue, c.scheduled, 0::bigint AS claimed, 0::bigint AS due,
			   NULL::timestamptz AS oldest_due, 0::bigint AS lapsed, c.retrying
		  FROM c
		UNION ALL
		SELECT d.queue, 0, 0, 1, d.send_at, 0, 0
		  FROM gatekeeper.mail_live d
		 WHERE d.queue = ANY (ARRAY(SELECT c.queue FROM c WHERE c.scheduled BETWEEN 1 AND 1000))
		   AND d.state = 'scheduled' AND d.send_at <= now()
		UNION ALL
		SELECT r.queue, 0, 0, r.last_id - r.id + 1, r.send_at, 0, 0
		  FROM gatekeeper.mail_run r
		 WHERE r.queue = ANY (ARRAY(SELECT c.queue FROM c WHERE c.scheduled BETWEEN 1 AND 1000))
		   AND r.send_at <= now()
		UNION ALL
		SELECT c.queue, 0, 0, b.due, b.oldest_due, 0, 0
		  FROM c, LATERAL gatekeeper._live_due(c.queue, c.scheduled) b
		 WHERE c.scheduled > 1000
		UNION ALL
		-- claimed mail: the open mails of the batches in flight, and of
		-- those whose lease ran out
		SELECT k.queue, 0, k.open, 0, NULL, CASE WHEN k.lease_until < now() THEN k.open ELSE 0 END, 0
		  FROM gatekeeper.mail_claim k) u
	 GROUP BY u.queue
	HAVING sum(u.scheduled) + sum(u.claimed) > 0
$$;

COMMENT ON FUNCTION gatekeeper._live_stats() IS
	'the live mail of each queue (scheduled, claimed, due, the oldest due time, claims whose lease ran out, scheduled mail claimed before); queue_stats reads them';

-- per queue, the mails it finished by delivery work (sent, failed,
-- suppressed, expired, unknown: not cancelled) per second over the last
-- minute, from shared memory (src/mail/count_totals.c); no row for a queue that
-- finished none in that minute
CREATE FUNCTION gatekeeper._queue_rates(OUT queue_hash bigint, OUT rate double precision)
RETURNS SETOF record
LANGUAGE c VOLATILE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_queue_rates';

COMMENT ON FUNCTION gatekeeper._queue_rates() IS
	'per queue, the mails finished by delivery work per second over the last minute, by a hash of the queue''s name; queue_stats reads them';

-- the live mail (never the finished) from _live_stats(), totals and rates
-- from shared memory
CREATE VIEW gatekeeper.queue_stats AS
SELECT q.name AS queue,
	   q.paused,
	   coalesce(l.scheduled, 0) AS scheduled,
	   coalesce(l.due, 0) AS due,
	   coalesce(l.claimed, 0) AS claimed,
	   now() - l.oldest_due AS oldest_due_age,
	   coalesce(t.enqueued, 0) AS enqueued,
	   coalesce(t.sent, 0) AS sent,
	   coalesce(t.failed, 0) AS failed,
	   coalesce(t.suppressed, 0) AS suppressed,
	   coalesce(t.expired, 0) AS expired,
	   coalesce(t.cancelled, 0) AS cancelled,
	   coalesce(t.unknown, 0) AS unknown,
	   coalesce(l.lease_expired, 0) AS lease_expired,
	   coalesce(t.deferred, 0) AS deferred,
	   coalesce(t.bounced, 0) AS bounced,
	   coalesce(t.complained, 0) AS complained,
	   coalesce(l.retrying, 0) AS retrying,
	   coalesce(r.rate, 0) AS rate,
	   CASE WHEN r.rate > 0
			THEN pg_catalog.make_interval(secs => pg_catalog.ceil(coalesce(l.due, 0) / r.rate))
	   END AS eta
  FROM gatekeeper.queue q
  LEFT JOIN gatekeeper._live_stats() l ON l.queue = q.name
  LEFT JOIN gatekeeper._queue_totals() t ON t.queue_hash = pg_catalog.hashtextextended(q.name, 0)
  LEFT JOIN gatekeeper._queue_rates() r ON r.queue_hash = pg_catalog.hashtextextended(q.name, 0);

COMMENT ON VIEW gatekeeper.queue_stats IS
	'per queue: live mail (scheduled, due, claimed, oldest due age, retrying), totals that never go down (enqueued, each outcome, deferrals, bounces and complaints), claims whose lease ran out, and progress: rate (mails finished per second over the last minute) and eta (the due mail at that rate)';

-- every event of the retained mail: id, the mail, its queue and
-- recipient, what happened, the status code and detail, who told, when:
-- the rows of event_log, and a 'sent' event for each sent mail, read from
-- its mail_done row (source 'relay', at its finish).  A sent event has no
-- id (NULL): it is no row of event_log; the mail and its finish name it.
CREATE VIEW gatekeeper.events AS
SELECT e.id, e.mail_id, e.queue, coalesce(e.recipient, m.recipient) AS recipient,
	   e.event, e.status, e.detail, e.source, e.at, e.reason, m.template
  FROM gatekeeper.event_log e
  LEFT JOIN gatekeeper.mail m ON m.id = e.mail_id AND m.segment = e.segment
UNION ALL
SELECT NULL::bigint, d.id, d.queue, m.recipient, 'sent', NULL::text, NULL::text, 'relay',
	   d.finished_at, NULL::text, m.template
  FROM gatekeeper.mail_done d
  LEFT JOIN gatekeeper.mail m ON m.id = d.id AND m.segment = d.segment
 WHERE d.state = 'sent';

COMMENT ON VIEW gatekeeper.events IS
	'what became of each mail after its claim: sent, deferred, bounced, delivered, complained, unsubscribed, feedback; from the relay, DSNs, ARF reports and webhooks (id is NULL for sent events, which are read from mail_done); reason says why a bounced or deferred mail failed; template is the template the mail was rendered from (NULL for a mail enqueued with its own subject and body), to group a campaign''s outcomes by template';

-- the reports ingest_report and record_event took since the server started
-- (or reset_stats()): recorded (at least one row written) and ignored
-- (nothing written: not understood, or naming no mail gatekeeper sent to
-- that recipient)
CREATE VIEW gatekeeper.report_stats AS
SELECT coalesce(sum(t.reports), 0)::bigint AS recorded,
	   coalesce(sum(t.ignored), 0)::bigint AS ignored
  FROM gatekeeper._queue_totals() t
 WHERE t.queue_hash = pg_catalog.hashtextextended('', 0);

COMMENT ON VIEW gatekeeper.report_stats IS
	'reports (DSNs, ARF reports, webhook events) recorded and ignored since the server started';

-- value, or 22004 naming what when it is NULL
CREATE FUNCTION gatekeeper._not_null(value anyelement, what text)
RETURNS anyelement
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF value IS NULL THEN
		RAISE EXCEPTION '% must not be null', what USING ERRCODE = 'null_value_not_allowed';
	END IF;
	RETURN value;
END
$$;

CREATE FUNCTION gatekeeper.status(id bigint)
RETURNS TABLE (id bigint, queue text, state gatekeeper.state, attempt int, send_at timestamptz,
			   last_error text, message_id text, finished_at timestamptz, metadata jsonb,
			   uncharged int)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT s.id, s.queue, s.state, s.attempt, s.send_at, s.last_error, s.message_id,
		   s.finished_at, s.metadata, s.uncharged
	  FROM gatekeeper.mail_status s
	 WHERE s.id = gatekeeper._not_null($1, 'id')
$$;

CREATE FUNCTION gatekeeper.find(queue text, dedupe_key text)
RETURNS bigint
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
	found_id bigint;
BEGIN
	IF find.queue IS NULL OR find.dedupe_key IS NULL THEN
		RAISE EXCEPTION 'queue and dedupe_key must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	SELECT l.id INTO found_id FROM gatekeeper.mail_live l
	 WHERE l.queue = find.queue AND l.dedupe_key = find.dedupe_key;
	IF NOT FOUND THEN
		-- a claimed mail: its key row, if the mail still holds it
		SELECT k.id INTO found_id FROM gatekeeper.mail_key k
		 WHERE k.queue = find.queue AND k.dedupe_key = find.dedupe_key
		   AND gatekeeper._mail_key_held(k.id, k.queue, k.dedupe_key);
	END IF;
	IF NOT FOUND THEN
		SELECT d.id INTO found_id FROM gatekeeper.mail_done d
		 WHERE d.queue = find.queue AND d.dedupe_key = find.dedupe_key
		 ORDER BY d.finished_at DESC, d.id DESC LIMIT 1;
	END IF;
	RETURN found_id;
END
$$;

CREATE FUNCTION gatekeeper.history(recipient text, since timestamptz DEFAULT now() - interval '30 days')
RETURNS TABLE (id bigint, queue text, state gatekeeper.state, send_at timestamptz,
			   finished_at timestamptz, subject text, last_error text)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
	IF history.recipient IS NULL OR history.since IS NULL THEN
		RAISE EXCEPTION 'recipient and since must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	RETURN QUERY
	SELECT s.id, s.queue, s.state, s.send_at, s.finished_at, coalesce(s.subject, s.template),
		   s.last_error
	  FROM gatekeeper.mail_status s
	 WHERE s.recipient = history.recipient AND s.created_at >= history.since
	 ORDER BY s.created_at, s.id;
END
$$;

COMMENT ON FUNCTION gatekeeper.status(bigint) IS 'a mail''s state, by id; for roles that cannot read gatekeeper.mail';
COMMENT ON FUNCTION gatekeeper.find(text, text) IS 'the live, else the latest finished, mail with this dedupe key in this queue';
COMMENT ON FUNCTION gatekeeper.history(text, timestamptz) IS 'the mail to one recipient enqueued since a time, oldest first';

-- the gates' shared memory, the whole server's: bytes charged against
-- gatekeeper.gate_memory, its size, entries, and gated mails claims deferred
-- because it was full
CREATE VIEW gatekeeper.gate_memory AS
SELECT m.bytes_used, m.bytes_total, m.entries, m.full_refusals
  FROM gatekeeper._gate_memory() AS m;

-- the suppression list: address (lower-cased), queue (NULL: every queue),
-- reason, detail (a bounce's reply), the mail that bounced, when
CREATE VIEW gatekeeper.suppression AS
SELECT s.address, s.queue, s.reason, s.detail, s.mail_id, s.created_at
  FROM gatekeeper.suppression_list s;

CREATE FUNCTION gatekeeper._worker_status(OUT pid int, OUT started timestamptz, OUT state text,
		OUT in_flight int, OUT connections int, OUT relay text, OUT last_success timestamptz,
		OUT last_error text, OUT last_error_at timestamptz, OUT sent_total bigint,
		OUT unsigned_total bigint, OUT deferred_total bigint, OUT failed_total bigint,
		OUT worker int, OUT relay_url text, OUT last_reply text, OUT last_reply_at timestamptz,
		OUT held_for_standbys int, OUT held_since timestamptz)
	RETURNS SETOF record
	LANGUAGE C VOLATILE STRICT
	SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_worker_status';

COMMENT ON FUNCTION gatekeeper._worker_status() IS
	'one row per background worker and relay, from shared memory: state, mail in flight, relay connections, breaker, last relay error, totals and mail held for the standbys; the worker_status view reads it';

-- the background workers, from shared memory, a row per worker and relay
-- of gatekeeper.smtp_url (relay_url, as set; one row with relay_url NULL
-- for a worker without a relay): what the worker is doing, the mail it
-- holds, its connections to that relay, the relay's breaker (closed:
-- delivering; open: backing off after the relay refused the session or
-- every MAIL FROM; throttled: backing off after the relay deferred every
-- transaction with a 4xx; half-open: trying again), the relay's last
-- refusal of the session, its last 4xx or 5xx to a transaction, the
-- messages the worker built without a DKIM signature (no key for their From
-- domain), the mails the relay took, deferred (4xx, a timeout, a dropped
-- connection) and failed (5xx), the worker's number (1 ..
-- gatekeeper.workers, the same after a restart, unlike its pid), and the
-- claimed mails it holds for gatekeeper.claim_standbys, with when the
-- oldest of them began to wait (NULL: none)
CREATE VIEW gatekeeper.worker_status AS
SELECT w.pid, w.started, w.state, w.in_flight, w.connections, w.relay,
	   w.last_success, w.last_error, w.last_error_at, w.sent_total, w.unsigned_total,
	   w.deferred_total, w.failed_total, w.worker, w.relay_url, w.last_reply, w.last_reply_at,
	   w.held_for_standbys, w.held_since
  FROM gatekeeper._worker_status() AS w;

COMMENT ON VIEW gatekeeper.worker_status IS
	'one row per gatekeeper background worker and relay: state, mail in flight, relay connections, breaker and last relay error';

CREATE FUNCTION gatekeeper._delivery_latency(OUT worker int, OUT le float8[], OUT buckets bigint[],
		OUT count bigint, OUT sum_seconds float8)
	RETURNS SETOF record
	LANGUAGE C VOLATILE STRICT
	SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_delivery_latency';

COMMENT ON FUNCTION gatekeeper._delivery_latency() IS
	'one row per background worker, from shared memory: a histogram of the time from a mail being due to the relay accepting it; the delivery_latency view reads it';

-- each background worker's delivery latency since it started, a
-- histogram from shared memory: from when a mail was due (its send_at, or
-- its enqueue when send_at had passed by then; after a retry, the retry's
-- time) to the relay's 2xx to its data.  le: the buckets' upper bounds in
-- seconds; buckets: the mails accepted within each (cumulative); count:
-- every mail accepted; sum_seconds: their latencies added up
CREATE VIEW gatekeeper.delivery_latency AS
SELECT d.worker, d.le, d.buckets, d.count, d.sum_seconds
  FROM gatekeeper._delivery_latency() AS d;

COMMENT ON VIEW gatekeeper.delivery_latency IS
	'per background worker, a histogram of the time from a mail being due to the relay accepting it';

/*
 * Roles given a use of gatekeeper by grant(): 'enqueue' (an
 * application that enqueues and looks its mail up), 'worker' (an external
 * sender) or 'monitor' (what postgres_exporter connects as).  Remembered so
 * that every update, which may add or replace functions, gives each role
 * its use's privileges on them again (_grant_apply() ends every update
 * script).  A role dropped since is forgotten at the next grant() or update.
 */
CREATE TABLE gatekeeper.role_grant (
	role		regrole NOT NULL,
	what		text NOT NULL CHECK (what IN ('enqueue', 'worker', 'monitor')),
	granted_at	timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (role, what)
);
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.role_grant', '');

-- gives the remembered roles (or one) the privileges of their uses: USAGE
-- on the schema, EXECUTE on every function of the use (each of its
-- overloads, so a function whose signature an update changed is granted
-- again), and the use's table and view privileges; forgets dropped roles
CREATE FUNCTION gatekeeper._grant_apply(only_role regrole DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	g record;
	o record;
	f regprocedure;
BEGIN
	DELETE FROM gatekeeper.role_grant r
	 WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_roles a WHERE a.oid = r.role::oid);
	FOR g IN SELECT r.role, r.what FROM gatekeeper.role_grant r
			  WHERE only_role IS NULL OR r.role = only_role ORDER BY r.role::oid, r.what LOOP
		EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA gatekeeper TO %s', g.role);
		FOR o IN SELECT v.kind, v.name, v.privilege
				   FROM (VALUES
						('enqueue', 'function', 'enqueue', NULL),
						('enqueue', 'function', '_segment', NULL),
						('enqueue', 'function', 'status', NULL),
						('enqueue', 'function', 'find', NULL),
						('enqueue', 'function', 'history', NULL),
						('enqueue', 'function', 'cancel', NULL),
						('enqueue', 'function', 'unsubscribe', NULL),
						('enqueue', 'function', 'suppress', NULL),
						('enqueue', 'table', 'mail', 'SELECT (id)'),
						('enqueue', 'table', 'mail',
						 'INSERT (recipient, subject, body, queue, send_at, html, sender, headers, dedupe_key, '
						 'priority, send_by, recipient_name, metadata, timezone, template, template_version, data)'),
						('enqueue', 'sequence', 'mail_id_seq', 'USAGE'),
						('worker', 'function', 'claim', NULL),
						('worker', 'function', 'ack', NULL),
						('worker', 'function', 'ack_batch', NULL),
						('worker', 'function', 'nack', NULL),
						('worker', 'function', 'nack_batch', NULL),
						('worker', 'function', 'extend', NULL),
						('worker', 'function', 'reap', NULL),
						('worker', 'function', 'unclaim', NULL),
						('worker', 'function', 'next_due', NULL),
						('worker', 'function', '_queue_totals', NULL),
						('worker', 'function', '_live_stats', NULL),
						('worker', 'function', '_queue_rates', NULL),
						('worker', 'table', 'queue_stats', 'SELECT'),
						('monitor', 'function', '_queue_totals', NULL),
						('monitor', 'function', '_live_stats', NULL),
						('monitor', 'function', '_queue_rates', NULL),
						('monitor', 'function', '_gate_memory', NULL),
						('monitor', 'function', '_worker_status', NULL),
						('monitor', 'table', 'queue_stats', 'SELECT'),
						('monitor', 'table', 'gate_memory', 'SELECT'),
						('monitor', 'table', 'worker_status', 'SELECT'),
						('monitor', 'function', '_delivery_latency', NULL),
						('monitor', 'table', 'delivery_latency', 'SELECT'))
						AS v(what, kind, name, privilege)
				  WHERE v.what = g.what LOOP
			IF o.kind = 'function' THEN
				FOR f IN SELECT p.oid::pg_catalog.regprocedure FROM pg_catalog.pg_proc p
						  WHERE p.pronamespace = 'gatekeeper'::pg_catalog.regnamespace
							AND p.proname = o.name ORDER BY p.oid LOOP
					EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', f, g.role);
				END LOOP;
			ELSIF o.kind = 'sequence' THEN
				EXECUTE pg_catalog.format('GRANT %s ON SEQUENCE gatekeeper.%I TO %s', o.privilege, o.name, g.role);
			ELSE
				EXECUTE pg_catalog.format('GRANT %s ON gatekeeper.%I TO %s', o.privilege, o.name, g.role);
			END IF;
		END LOOP;
	END LOOP;
END
$$;

CREATE FUNCTION gatekeeper.grant(role regrole, what text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF role IS NULL OR what IS NULL THEN
		RAISE EXCEPTION 'role and what must not be null'
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF what NOT IN ('enqueue', 'worker', 'monitor') THEN
		RAISE EXCEPTION 'unknown use "%"', what
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'A use is ''enqueue'', ''worker'' or ''monitor''.';
	END IF;
	INSERT INTO gatekeeper.role_grant (role, what) VALUES ($1, $2)
	ON CONFLICT DO NOTHING;
	PERFORM gatekeeper._grant_apply($1);
END
$$;

COMMENT ON FUNCTION gatekeeper.grant(regrole, text) IS
	'give a role what one use of gatekeeper needs (''enqueue'', ''worker'' or ''monitor''), and again after every update';

/*
 * Templates: a campaign's content stored once, rendered per
 * mail from its data.  A version is never changed once written:
 * alter_template adds the next.  The language is src/template.c's, a
 * version's parts are checked, compiled and rendered by
 * src/template_funcs.c.
 */
CREATE TABLE gatekeeper.template (
	name		text NOT NULL,
	version		int NOT NULL CHECK (version >= 1),
	subject		text NOT NULL,
	body		text NOT NULL,
	html		text,
	headers		jsonb,
	created_at	timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (name, version)
);
COMMENT ON TABLE gatekeeper.template IS
	'templates, a row per version: subject, body, html and header values in a Mustache subset, rendered over each mail''s data';
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.template', '');

-- raise 22004, 22023 (with the position) or 54000 unless these parts can
-- be a template version
CREATE FUNCTION gatekeeper._template_check(name text, subject text, body text, html text, headers jsonb)
RETURNS void
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_template_check';

-- html => '' and headers => '{}' mean none
CREATE FUNCTION gatekeeper.create_template(name text, subject text, body text,
	html text DEFAULT NULL, headers jsonb DEFAULT NULL)
RETURNS int
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM gatekeeper._template_check(create_template.name, create_template.subject,
									   create_template.body, nullif(create_template.html, ''),
									   nullif(create_template.headers, '{}'));
	BEGIN
		INSERT INTO gatekeeper.template (name, version, subject, body, html, headers)
		VALUES (create_template.name, 1, create_template.subject, create_template.body,
				nullif(create_template.html, ''), nullif(create_template.headers, '{}'));
	EXCEPTION WHEN unique_violation THEN
		RAISE EXCEPTION 'template "%" already exists', create_template.name
			USING ERRCODE = 'duplicate_object',
				  HINT = 'alter_template() makes a new version of it.';
	END;
	RETURN 1;
END
$$;

-- a new version: each part NULL is the latest version's; html => '' and
-- headers => '{}' remove them
CREATE FUNCTION gatekeeper.alter_template(name text, subject text DEFAULT NULL, body text DEFAULT NULL,
	html text DEFAULT NULL, headers jsonb DEFAULT NULL)
RETURNS int
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	latest gatekeeper.template;
BEGIN
	IF alter_template.name IS NULL THEN
		RAISE EXCEPTION 'template name must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	-- one new version of a name at a time: a concurrent alter_template
	-- waits here, then reads the version this one made
	PERFORM 1 FROM gatekeeper.template t WHERE t.name = alter_template.name FOR UPDATE;
	SELECT * INTO latest FROM gatekeeper.template t
	 WHERE t.name = alter_template.name ORDER BY t.version DESC LIMIT 1;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'template "%" does not exist', alter_template.name
			USING ERRCODE = 'undefined_object';
	END IF;
	latest.version := latest.version + 1;
	latest.subject := coalesce(alter_template.subject, latest.subject);
	latest.body := coalesce(alter_template.body, latest.body);
	latest.html := CASE WHEN alter_template.html = '' THEN NULL
						ELSE coalesce(alter_template.html, latest.html) END;
	latest.headers := CASE WHEN alter_template.headers = '{}' THEN NULL
						   ELSE coalesce(alter_template.headers, latest.headers) END;
	PERFORM gatekeeper._template_check(latest.name, latest.subject, latest.body, latest.html,
									   latest.headers);
	INSERT INTO gatekeeper.template (name, version, subject, body, html, headers)
	VALUES (latest.name, latest.version, latest.subject, latest.body, latest.html, latest.headers);
	RETURN latest.version;
END
$$;

-- every version of a template, unless unfinished mail uses it (55006)
CREATE FUNCTION gatekeeper.drop_template(name text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	unfinished bigint;
BEGIN
	IF drop_template.name IS NULL THEN
		RAISE EXCEPTION 'template name must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	-- an alter_template in progress is waited for, and the version it
	-- made is dropped too: the DELETE reads after the lock.  So is a
	-- statement enqueueing mail of the template (src/mail.c locks the
	-- template's rows FOR KEY SHARE), whose mail the count then sees.
	PERFORM 1 FROM gatekeeper.template t WHERE t.name = drop_template.name FOR UPDATE;
	SELECT count(*) INTO unfinished
	  FROM gatekeeper.mail m
	 WHERE m.template = drop_template.name
	   AND NOT EXISTS (SELECT FROM gatekeeper.mail_done d
					    WHERE d.id = m.id AND d.segment = m.segment);
	IF unfinished > 0 THEN
		RAISE EXCEPTION 'template "%" is in use', drop_template.name
			USING ERRCODE = 'object_in_use',
				  DETAIL = pg_catalog.format('%s unfinished mails use it.', unfinished),
				  HINT = 'Drop it once they are sent, or cancel them.';
	END IF;
	DELETE FROM gatekeeper.template t WHERE t.name = drop_template.name;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'template "%" does not exist', drop_template.name
			USING ERRCODE = 'undefined_object';
	END IF;
END
$$;

-- a template's latest version (or the one named) rendered over data, as
-- the mail would carry it: src/template_funcs.c, which the claim renders
-- with, reading the template once per snapshot
CREATE FUNCTION gatekeeper.render(template text, data jsonb, version int DEFAULT NULL)
RETURNS TABLE (subject text, body text, html text, headers jsonb)
LANGUAGE c STABLE
SECURITY DEFINER
ROWS 1
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_render';

COMMENT ON FUNCTION gatekeeper.create_template(text, text, text, text, jsonb) IS
	'make a template (version 1) of a subject, a body, an html part and header values in a Mustache subset';
COMMENT ON FUNCTION gatekeeper.alter_template(text, text, text, text, jsonb) IS
	'make a template''s next version; each part NULL is the latest version''s';
COMMENT ON FUNCTION gatekeeper.drop_template(text) IS
	'drop every version of a template';
COMMENT ON FUNCTION gatekeeper.render(text, jsonb, int) IS
	'a template''s latest version (or the one given) rendered over data: the subject, body, html and headers a mail would carry';

-- the version of a template a mail that names none keeps (an INSERT or
-- COPY may leave template_version out): the latest made at or before
-- the mail's created_at, else the first; the claim renders it, the view
-- below counts it
CREATE FUNCTION gatekeeper._template_version(name text, created_at timestamptz)
RETURNS int
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT coalesce(max(t.version) FILTER (WHERE t.created_at <= $2), min(t.version))
	  FROM gatekeeper.template t
	 WHERE t.name = $1
$$;

-- every template version; in_use: the unfinished mail (not yet in
-- mail_done) that uses it
CREATE VIEW gatekeeper.templates AS
SELECT t.name, t.version, t.created_at, coalesce(u.in_use, 0) AS in_use
  FROM gatekeeper.template t
  LEFT JOIN (SELECT m.template,
					coalesce(m.template_version,
							 gatekeeper._template_version(m.template, m.created_at)) AS version,
					count(*) AS in_use
			   FROM gatekeeper.mail m
			  WHERE m.template IS NOT NULL
				AND NOT EXISTS (SELECT FROM gatekeeper.mail_done d
								 WHERE d.id = m.id AND d.segment = m.segment)
			  GROUP BY 1, 2) u ON u.template = t.name AND u.version = t.version;

/*
 * CREATE EXTENSION (and this update) and a session's
 * first enqueue say with a WARNING why no background worker would send
 * this database's mail, when a setting keeps it from doing so
 * (src/delivery_check.c).
 */
CREATE FUNCTION gatekeeper._delivery_check() RETURNS boolean
LANGUAGE c VOLATILE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_delivery_check_sql';
REVOKE ALL ON FUNCTION gatekeeper._delivery_check() FROM PUBLIC;
COMMENT ON FUNCTION gatekeeper._delivery_check() IS
	'warn when no background worker sends this database''s mail (not preloaded, another gatekeeper.database, no smtp_url)';

/*
 * Privileges: nothing for PUBLIC.  grant() gives a role one use (an
 * application that enqueues, an external sender, a monitor); see
 * docs/operations.md, "Security".
 */
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA gatekeeper FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA gatekeeper FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA gatekeeper FROM PUBLIC;
REVOKE ALL ON TYPE gatekeeper.state FROM PUBLIC;
REVOKE ALL ON SCHEMA gatekeeper FROM PUBLIC;

-- workers waiting for CREATE EXTENSION start at once rather than after a nap
SELECT gatekeeper._wake();

-- say now if no background worker would send this database's mail
SELECT gatekeeper._delivery_check();
