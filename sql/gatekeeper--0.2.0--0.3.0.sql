/* gatekeeper 0.2.0 -> 0.3.0 (ALTER EXTENSION gatekeeper UPDATE TO '0.3.0') */
\echo Use "ALTER EXTENSION gatekeeper UPDATE TO '0.3.0'" to load this file. \quit

/*
 * Makes a 0.2.0 database what gatekeeper--0.3.0.sql makes a new one:
 * t/031_upgrade.pl checks that a 0.2.0 updated to 0.3.0, a 0.1.0 updated
 * through 0.2.0 and a fresh 0.3.0 have the same objects, and that the
 * updated ones keep their data.  In the order a reader needs it: the
 * grants carried over, what goes or is made anew, the tables and their
 * changes, internal helpers, triggers, the rows 0.3.0 reads otherwise than
 * 0.2.0 did, the public API as SPEC groups it, views, comments and
 * privileges.  Every object is defined once.
 */

/*
 * Grants carried over.  A view whose columns change and a function whose
 * arguments or result change can only be dropped and made again, which
 * loses what was granted on it by hand (the roles grant() remembers get
 * theirs from _grant_apply() at the end).  Before anything changes, every
 * privilege on them but PUBLIC's and the owner's is read as the GRANT
 * that gives it on what 0.3.0 makes in its place; the roles that hold one
 * of 0.2.0's README recipes whole (EXECUTE, granted to the role itself, on
 * every function of the recipe; a role granted only part of one is left
 * as it is) as the row of role_grant that remembers that use, so that
 * _grant_apply() gives them what 0.3.0 adds to it; and whoever could read
 * queue_stats (EXECUTE on both of its helpers) as EXECUTE on the helper
 * 0.3.0 adds to it.  The statements are kept in a setting local to this
 * transaction, apart by chr(31), and run once everything is made (see
 * "Privileges", at the end).
 */
SELECT pg_catalog.set_config('gatekeeper_upgrade.carried_grants', coalesce((
SELECT pg_catalog.string_agg(s.stmt, pg_catalog.chr(31) ORDER BY s.step, s.stmt)
  FROM (
	-- functions made again, by their 0.2.0 and 0.3.0 signatures
	SELECT 1 AS step,
		   pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s%s', f.new, a.grantee::pg_catalog.regrole,
							 CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END) AS stmt
	  FROM (VALUES
			('gatekeeper.enqueue(text, text, text, text, timestamptz, text, text, jsonb, text, int, timestamptz, text, jsonb, text)',
			 'gatekeeper.enqueue(text, text, text, text, timestamptz, text, text, jsonb, text, int, timestamptz, text, jsonb, text, text, jsonb)'),
			('gatekeeper.create_queue(text, text[], text, text, int, int, int, interval, boolean, text, text, text, boolean, boolean)',
			 'gatekeeper.create_queue(text, text[], text, text, int, int, int, interval, boolean, text, text, text, boolean, boolean, text, text, interval)'),
			('gatekeeper.alter_queue(text, text[], text, text, int, int, int, interval, boolean, text, text, text, boolean, boolean)',
			 'gatekeeper.alter_queue(text, text[], text, text, int, int, int, interval, boolean, text, text, text, boolean, boolean, text, text, interval)'),
			('gatekeeper.status(bigint)', 'gatekeeper.status(bigint)'),
			('gatekeeper._queue_totals()', 'gatekeeper._queue_totals()'),
			('gatekeeper._live_stats()', 'gatekeeper._live_stats()'),
			('gatekeeper._live_pending()', 'gatekeeper._live_pending()'),
			('gatekeeper._worker_status()', 'gatekeeper._worker_status()'))
		   AS f(old, new),
		   pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) AS a
	 WHERE p.oid = f.old::pg_catalog.regprocedure
	   AND a.privilege_type = 'EXECUTE' AND a.grantee NOT IN (0, p.proowner)
	UNION ALL
	-- views made again
	SELECT 2,
		   pg_catalog.format('GRANT %s ON TABLE %s TO %s%s', a.privilege_type, v.name,
							 a.grantee::pg_catalog.regrole,
							 CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END)
	  FROM (VALUES ('gatekeeper.mail_status'), ('gatekeeper.queue_stats'), ('gatekeeper.worker_status'))
		   AS v(name),
		   pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) AS a
	 WHERE c.oid = v.name::pg_catalog.regclass AND a.grantee NOT IN (0, c.relowner)
	UNION ALL
	-- queue_stats' new helper, for whoever could run both of the others
	SELECT 3,
		   pg_catalog.format('GRANT EXECUTE ON FUNCTION gatekeeper._queue_rates() TO %s',
							 a.grantee::pg_catalog.regrole)
	  FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) AS a
	 WHERE p.oid IN ('gatekeeper._queue_totals()'::pg_catalog.regprocedure,
					 'gatekeeper._live_stats()'::pg_catalog.regprocedure)
	   AND a.privilege_type = 'EXECUTE' AND a.grantee NOT IN (0, p.proowner)
	 GROUP BY a.grantee
	HAVING count(DISTINCT p.oid) = 2
	UNION ALL
	-- the roles that hold a README recipe whole, remembered with its use
	SELECT 4,
		   pg_catalog.format('INSERT INTO gatekeeper.role_grant (role, what) VALUES (%L, %L)',
							 h.grantee::pg_catalog.regrole, r.what)
	  FROM (VALUES
			('enqueue', ARRAY['gatekeeper.enqueue(text, text, text, text, timestamptz, text, text, jsonb, text, int, timestamptz, text, jsonb, text)',
							  'gatekeeper._segment()', 'gatekeeper.status(bigint)', 'gatekeeper.find(text, text)',
							  'gatekeeper.history(text, timestamptz)', 'gatekeeper.cancel(bigint)',
							  'gatekeeper.cancel(text, text)']),
			('worker', ARRAY['gatekeeper.claim(text, int, interval, text[])', 'gatekeeper.ack(bigint, int)',
							 'gatekeeper.ack_batch(bigint[], int[])', 'gatekeeper.nack(bigint, int, text, boolean)',
							 'gatekeeper.nack_batch(bigint[], int[], text[], boolean)',
							 'gatekeeper.extend(bigint, int, interval)', 'gatekeeper.reap()',
							 'gatekeeper.unclaim(bigint[], int[], text, interval)',
							 'gatekeeper._queue_totals()', 'gatekeeper._live_stats()']),
			('monitor', ARRAY['gatekeeper._queue_totals()', 'gatekeeper._live_stats()', 'gatekeeper._gate_memory()',
							  'gatekeeper._worker_status()']))
			AS r(what, funcs),
		   LATERAL (SELECT a.grantee
					  FROM unnest(r.funcs) AS f(sig)
					  JOIN pg_catalog.pg_proc p ON p.oid = f.sig::pg_catalog.regprocedure,
						   pg_catalog.aclexplode(p.proacl) AS a
					 WHERE a.privilege_type = 'EXECUTE'
					 GROUP BY a.grantee
					HAVING count(DISTINCT p.oid) = pg_catalog.cardinality(r.funcs)) h
	 WHERE h.grantee <> 0
	   AND h.grantee <> (SELECT x.extowner FROM pg_catalog.pg_extension x WHERE x.extname = 'gatekeeper')
  ) s), ''), true);

/*
 * What goes, and what is made anew.  The views over what changes
 * (mail_status reads mail_live's lease_until, which goes; queue_stats and
 * worker_status gain columns) and the functions whose arguments or result
 * change (enqueue, create_queue and alter_queue take more; status,
 * _queue_totals, _live_stats, _live_pending and _worker_status return
 * more) are dropped here and made once below, in their 0.3.0 form.  What
 * nothing calls in 0.3.0 goes for good: _gate_restamp and _window_open,
 * which served only the tests (they declare them in their own session:
 * sql/gate_restamp.inc, sql/window_open.inc); _retry_delay, _take_claimed,
 * _release_mail and _release_mails, steps of the claim and its reports
 * that C takes (the library keeps their symbols, which 0.1.0's and
 * 0.2.0's scripts name); and _hard_bounce, a SQL copy of the hard-bounce
 * rule, which src/smtp_trouble.c holds.
 */
DROP VIEW gatekeeper.mail_status;
DROP VIEW gatekeeper.queue_stats;
DROP VIEW gatekeeper.worker_status;
DROP FUNCTION gatekeeper.enqueue(text, text, text, text, timestamptz, text, text, jsonb, text, int, timestamptz, text, jsonb, text);
DROP FUNCTION gatekeeper.create_queue(text, text[], text, text, int, int, int, interval, boolean, text, text, text, boolean, boolean);
DROP FUNCTION gatekeeper.alter_queue(text, text[], text, text, int, int, int, interval, boolean, text, text, text, boolean, boolean);
DROP FUNCTION gatekeeper.status(bigint);
DROP FUNCTION gatekeeper._queue_totals();
DROP FUNCTION gatekeeper._live_stats();
DROP FUNCTION gatekeeper._live_pending();
DROP FUNCTION gatekeeper._worker_status();
DROP FUNCTION gatekeeper._gate_restamp(text, text, timestamptz[]);
DROP FUNCTION gatekeeper._window_open(text, text, timestamptz);
DROP FUNCTION gatekeeper._retry_delay();
DROP FUNCTION gatekeeper._take_claimed(bigint[], int[]);
DROP FUNCTION gatekeeper._release_mail(text, bigint);
DROP FUNCTION gatekeeper._release_mails(text[], bigint[]);
DROP FUNCTION gatekeeper._hard_bounce(text);

/* ---------------------------------------------------------------------------
 * Tables and their changes
 * ---------------------------------------------------------------------------
 */

/*
 * Queues gain a dedupe window for every queue, a Feedback-ID, a VERP
 * return path and a retry budget in time.  A dedupe key is held by a mail
 * that is scheduled or claimed, or that finished (but was not cancelled)
 * within its queue's dedupe_window, 24 hours unless the queue says
 * otherwise; '0' holds it only while the mail is unfinished, which is what
 * a 0.2.0 queue without a window did: such queues get the default.
 */
-- the default queue stays unaltered (pg_dump leaves it out): its window
-- is what a fresh 0.3.0 gives it
ALTER TABLE gatekeeper.queue DISABLE TRIGGER queue_builtin_update;
UPDATE gatekeeper.queue SET dedupe_window = interval '24 hours' WHERE dedupe_window IS NULL;
ALTER TABLE gatekeeper.queue ENABLE TRIGGER queue_builtin_update;
ALTER TABLE gatekeeper.queue
	DROP CONSTRAINT queue_dedupe_window_check,
	ALTER COLUMN dedupe_window SET DEFAULT interval '24 hours',
	ALTER COLUMN dedupe_window SET NOT NULL,
	ADD CONSTRAINT queue_dedupe_window_check
		CHECK (dedupe_window = interval '0'
			   OR dedupe_window BETWEEN interval '1 second' AND interval '87660 hours');
COMMENT ON COLUMN gatekeeper.queue.dedupe_window IS 'how long a finished mail (but a cancelled one) holds its dedupe key; 0: only while it is scheduled or claimed';

ALTER TABLE gatekeeper.queue ADD COLUMN feedback_id text;
COMMENT ON COLUMN gatekeeper.queue.feedback_id IS 'Feedback-ID header of its mail (Gmail''s feedback loop), NULL: none';
ALTER TABLE gatekeeper.queue ADD COLUMN return_path text;
COMMENT ON COLUMN gatekeeper.queue.return_path IS 'the envelope sender of its mail; {token} in the local part is a signed token naming the mail (VERP)';
-- a queue's retry budget in time: a mail that only ever got 4xx replies
-- or timeouts is not failed before retry_for has passed since its first
-- deferral, whatever its attempts (src/mail_state.c)
ALTER TABLE gatekeeper.queue ADD COLUMN retry_for interval NOT NULL DEFAULT interval '1 day'
	CHECK (retry_for BETWEEN interval '0' AND interval '87660 hours');
COMMENT ON COLUMN gatekeeper.queue.retry_for IS 'a mail that only ever got 4xx replies or timeouts is not failed before this has passed since its first deferral, whatever its attempts';

/* The suppression list takes soft bounces (soft_bounce_limit). */
ALTER TABLE gatekeeper.suppression_list DROP CONSTRAINT suppression_list_reason_check;
ALTER TABLE gatekeeper.suppression_list ADD CONSTRAINT suppression_list_reason_check
	CHECK (reason IN ('hard_bounce', 'complaint', 'unsubscribe', 'manual', 'soft_bounce'));

/*
 * The mail may name a template, its version and the data it is rendered
 * over, and then has no subject or body of its own (src/mail.c refuses a
 * mail without either).  Each partition gets the defaults gatekeeper.mail
 * gives by other means, so that a COPY into gatekeeper.mail that leaves
 * segment to its default is written straight into the current segment's
 * partition (src/mail_copy.c), where PostgreSQL batches its rows: a
 * partition has no identity in PostgreSQL 15, its id is nextval() of
 * gatekeeper.mail's.  mail_due keeps no deduplication: its keys end in the
 * mail's id, never equal, so the pass looking for equal keys on every full
 * page only cost inserts (docs/internals.md, "Bulk enqueue").
 */
ALTER TABLE gatekeeper.mail ALTER COLUMN subject DROP NOT NULL,
	ALTER COLUMN body DROP NOT NULL,
	ADD COLUMN template text,
	ADD COLUMN template_version int,
	ADD COLUMN data jsonb;
COMMENT ON COLUMN gatekeeper.mail.template IS 'the template the mail is rendered from when it is claimed (subject, body and html then NULL)';
COMMENT ON COLUMN gatekeeper.mail.template_version IS 'the template''s version: NULL means the latest made at or before created_at';
COMMENT ON COLUMN gatekeeper.mail.data IS 'the JSON object the template is rendered over';
ALTER TABLE gatekeeper.mail_0 ALTER COLUMN id SET DEFAULT pg_catalog.nextval('gatekeeper.mail_id_seq'),
	ALTER COLUMN segment SET DEFAULT 0;
ALTER TABLE gatekeeper.mail_1 ALTER COLUMN id SET DEFAULT pg_catalog.nextval('gatekeeper.mail_id_seq'),
	ALTER COLUMN segment SET DEFAULT 1;
ALTER TABLE gatekeeper.mail_2 ALTER COLUMN id SET DEFAULT pg_catalog.nextval('gatekeeper.mail_id_seq'),
	ALTER COLUMN segment SET DEFAULT 2;
ALTER TABLE gatekeeper.mail_3 ALTER COLUMN id SET DEFAULT pg_catalog.nextval('gatekeeper.mail_id_seq'),
	ALTER COLUMN segment SET DEFAULT 3;
ALTER INDEX gatekeeper.mail_due SET (deduplicate_items = off);

/*
 * mail_live loses lease_until and its index mail_lease: since 0.2.0 no
 * writer sets the column (a claimed mail is a record of a mail_claim
 * batch, whose lease is the batch's), so it was NULL in every row and
 * every record.  worker stays: a claim's records carry the claimer, which
 * the ack writes into mail_done, and deferred mail keeps it in mail_live.
 * mail_live_count counts the retrying mail too (scheduled mail claimed
 * before), for queue_stats; the rows 0.2.0 left are counted below, once
 * the helper that reads what a transaction has noted exists.
 */
DROP INDEX gatekeeper.mail_lease;
ALTER TABLE gatekeeper.mail_live DROP COLUMN lease_until;

ALTER TABLE gatekeeper.mail_live_count ADD COLUMN retrying bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN gatekeeper.mail_live_count.retrying IS
	'of the scheduled mail, that claimed before (attempt > 0): deferred, nacked, handed back or reaped';

/*
 * Runs (src/live_writer.c): the mails of one INSERT or COPY of 256 or
 * more with consecutive ids, one queue, priority, send_at and segment and
 * no dedupe key, as one row of mail_run for up to 128 of them (ids id ..
 * last_id) instead of a row of mail_live each: their index entries were
 * most of a bulk enqueue's cost (docs/internals.md, "Bulk enqueue").  A
 * mail of a run is scheduled as if it had a mail_live row with the
 * columns' defaults (never attempted, no Message-ID, no error).  A claim takes mails from the front of a run (id
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
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.mail_run', '');

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
 *   event_log_deferred	the deferrals of a mail, the earliest of which
 *						starts its retry_for
 *   event_log_report	a report's event is written once: the same DSN,
 *						feedback report, webhook event or unsubscribe click
 *						taken again for a mail (the same event, source,
 *						status and detail) writes nothing (the relay's own
 *						events, the nacks' deferrals, are not indexed)
 *   event_log_counted	a mail counts one complaint and one bounce from
 *						reports: a later one that differs is written as a
 *						repeat, which queue_stats, the soft-bounce count and
 *						the suppression list leave out (src/report.c)
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
CREATE INDEX event_log_deferred ON gatekeeper.event_log (mail_id, at) WHERE event = 'deferred';
CREATE UNIQUE INDEX event_log_report ON gatekeeper.event_log
	(mail_id, event, source, md5(coalesce(status, '') || E'\n' || coalesce(detail, '')), segment)
	WHERE source <> 'relay';
CREATE UNIQUE INDEX event_log_counted ON gatekeeper.event_log (mail_id, event, segment)
	WHERE source <> 'relay' AND NOT repeated AND event IN ('bounced', 'complained');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.event_log_0', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.event_log_1', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.event_log_2', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.event_log_3', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.event_log_id_seq', '');

/*
 * A claim belongs to the role that made it (src/mail_state.c).  The
 * claims this update finds were made before their owner was kept: 0.2.0's
 * background workers' (worker 'bgworker:...') become the background
 * workers' (0: reap() takes them back, their server being gone, and no SQL
 * caller changes them); an external worker's keep a NULL owner, which any
 * caller of ack, nack, extend or unclaim may settle, as before, until
 * their lease runs out.  A batch's mails compress with lz4 where the
 * server was built with it (PostgreSQL's default, pglz, was 3% of a claim
 * at batch 100: docs/internals.md, "The claim's statements"); without lz4
 * they stay with pglz.
 */
ALTER TABLE gatekeeper.mail_claim ADD COLUMN owner oid;
UPDATE gatekeeper.mail_claim SET owner = 0 WHERE worker LIKE 'bgworker:%';
COMMENT ON COLUMN gatekeeper.mail_claim.owner IS 'who may ack, nack, extend or unclaim the batch''s mails: the OID of the role that claimed them (or a superuser); 0, a background worker''s claim, which only that worker settles; NULL, a claim made before 0.3.0 by an external worker, which any caller may settle';
DO $$
BEGIN
	ALTER TABLE gatekeeper.mail_claim ALTER COLUMN mails SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
	NULL;
END
$$;

/*
 * A dedupe key's holder that retention removed while its window lasted
 * keeps its finish time in mail_key.
 */
ALTER TABLE gatekeeper.mail_key ADD COLUMN finished_at timestamptz;
COMMENT ON TABLE gatekeeper.mail_key IS 'the mail that holds each dedupe key: scheduled, claimed, or finished (not cancelled) within its queue''s dedupe_window; a row whose mail no longer holds the key is stale until the key''s next insert or purge()';
COMMENT ON COLUMN gatekeeper.mail_key.finished_at IS 'when the holder finished, written when retention removed it while its dedupe window lasted';

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

/*
 * Templates: a campaign's content stored once, rendered per mail from its
 * data.  A version is never changed once written: alter_template adds the
 * next.  The language is src/template.c's; a version's parts are checked,
 * compiled and rendered by src/template_funcs.c.
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

/*
 * The view the mail's tables are read through, made once the tables are
 * as 0.3.0 has them: a claimed mail's lease is its batch's, a mail of a
 * run is scheduled as its live row with the defaults would say, and the
 * template columns follow the mail's own.
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

/* ---------------------------------------------------------------------------
 * Internal helpers
 * ---------------------------------------------------------------------------
 */

/* Dedupe keys and queue policy */
CREATE OR REPLACE FUNCTION gatekeeper._mail_key_held(id bigint, queue text, dedupe_key text)
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

CREATE OR REPLACE FUNCTION gatekeeper._check_queue_policy(gates text[], on_gate_closed text, delivery text,
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

-- this server's incarnation (src/gatekeeper.c), which the background
-- workers' claims name; NULL when the library is not preloaded
CREATE FUNCTION gatekeeper._incarnation()
RETURNS text
LANGUAGE c STABLE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_incarnation_sql';

/*
 * Runs and the readers of scheduled mail, which read runs too (_first_due
 * and _live_due here, next_due, drop_queue, _live_stats and mail_status)
 */
CREATE OR REPLACE FUNCTION gatekeeper._first_due(queue text, after timestamptz)
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

CREATE OR REPLACE FUNCTION gatekeeper._live_due(queue text, scheduled bigint,
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

/*
 * The mail's changes of state, in C (src/mail_state_sweep.c,
 * src/mail_state_sync.c, src/mail_state_upkeep.c)
 */
-- an application's UPDATE or DELETE of gatekeeper.mail, carried into the
-- state rows (src/mail_state_sync.c)
CREATE OR REPLACE FUNCTION gatekeeper._mail_sync() RETURNS trigger
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_mail_sync';

-- rotate the retention segments; purge() runs it (src/mail_state_sweep.c)
CREATE OR REPLACE FUNCTION gatekeeper._rotate(retention interval)
RETURNS bigint
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_rotate';

CREATE OR REPLACE FUNCTION gatekeeper._mail_live_restore() RETURNS trigger
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_mail_live_restore';

CREATE OR REPLACE FUNCTION gatekeeper._mail_key_restore() RETURNS trigger
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_mail_key_restore';

CREATE OR REPLACE FUNCTION gatekeeper._mail_truncate() RETURNS trigger
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_mail_truncate';

CREATE OR REPLACE FUNCTION gatekeeper._mail_key_prune(batch int)
RETURNS bigint
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_mail_key_prune';

CREATE OR REPLACE FUNCTION gatekeeper._mail_claim_shrink()
RETURNS boolean
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_mail_claim_shrink';

/*
 * Suppression, reports and their classification (src/suppression.c,
 * src/report.c, src/smtp_trouble.c)
 */
-- add a suppression entry for an address key; true when new.  An entry
-- that exists keeps its row, but takes the new reason when that stops more
-- (hard_bounce or manual over soft_bounce, unsubscribe or complaint;
-- soft_bounce over unsubscribe or complaint)
CREATE OR REPLACE FUNCTION gatekeeper._suppress(address_key text, reason text, queue text,
	detail text, mail_id bigint)
RETURNS boolean
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_suppress';

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

CREATE FUNCTION gatekeeper._message_id(id bigint, sender text, domain text, default_sender text)
RETURNS text
LANGUAGE c STABLE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_message_id_sql';

/*
 * Counting and looking inside: shared memory read as rows (src/mail/count_totals.c,
 * src/mail/mail_count.c, src/worker.c)
 */
-- counts the events by queue as they are written: deferrals, bounces and
-- complaints
CREATE FUNCTION gatekeeper._count_events() RETURNS trigger
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_count_events';

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

CREATE FUNCTION gatekeeper._live_pending(OUT queue text, OUT scheduled bigint, OUT retrying bigint)
RETURNS SETOF record
LANGUAGE c
STABLE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_live_pending';

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

CREATE FUNCTION gatekeeper._delivery_latency(OUT worker int, OUT le float8[], OUT buckets bigint[],
		OUT count bigint, OUT sum_seconds float8)
	RETURNS SETOF record
	LANGUAGE C VOLATILE STRICT
	SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_delivery_latency';

COMMENT ON FUNCTION gatekeeper._delivery_latency() IS
	'one row per background worker, from shared memory: a histogram of the time from a mail being due to the relay accepting it; the delivery_latency view reads it';

/* Shards, templates, and the check that someone delivers */
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

-- raise 22004, 22023 (with the position) or 54000 unless these parts can
-- be a template version
CREATE FUNCTION gatekeeper._template_check(name text, subject text, body text, html text, headers jsonb)
RETURNS void
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_template_check';

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
COMMENT ON FUNCTION gatekeeper._delivery_check() IS
	'warn when no background worker sends this database''s mail (not preloaded, another gatekeeper.database, no smtp_url)';

/* Roles: the uses grant() gives, given again by every update */
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

/* ---------------------------------------------------------------------------
 * Triggers: on the new tables, and 0.2.0's made again where what they
 * watch changed.  The restore triggers ask _own_statement() alone
 * (gatekeeper_writer, src/catalog.c: gatekeeper's C code or a trigger, not
 * while a dump is loaded) rather than pg_trigger_depth() as well;
 * mail_check_update watches the template columns too; each partition of
 * gatekeeper.mail validates a COPY written straight into it.
 * ---------------------------------------------------------------------------
 */
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

CREATE TRIGGER event_log_count AFTER INSERT ON gatekeeper.event_log
	REFERENCING NEW TABLE AS new_events
	FOR EACH STATEMENT EXECUTE FUNCTION gatekeeper._count_events();
CREATE TRIGGER shard_position_apply AFTER INSERT OR UPDATE ON gatekeeper.shard_position
	FOR EACH ROW EXECUTE FUNCTION gatekeeper._shard_apply();
DROP TRIGGER mail_live_restore ON gatekeeper.mail_live;
CREATE TRIGGER mail_live_restore BEFORE INSERT ON gatekeeper.mail_live
	FOR EACH ROW WHEN (NOT gatekeeper._own_statement())
	EXECUTE FUNCTION gatekeeper._mail_live_restore();
DROP TRIGGER mail_key_restore ON gatekeeper.mail_key;
CREATE TRIGGER mail_key_restore BEFORE INSERT ON gatekeeper.mail_key
	FOR EACH ROW WHEN (NOT gatekeeper._own_statement())
	EXECUTE FUNCTION gatekeeper._mail_key_restore();
DROP TRIGGER mail_done_restore ON gatekeeper.mail_done;
CREATE TRIGGER mail_done_restore AFTER INSERT ON gatekeeper.mail_done
	REFERENCING NEW TABLE AS new_done
	FOR EACH STATEMENT
	WHEN (NOT gatekeeper._own_statement())
	EXECUTE FUNCTION gatekeeper._mail_live_restore();
CREATE TRIGGER mail_check_insert AFTER INSERT ON gatekeeper.mail_0
	REFERENCING NEW TABLE AS new_mail FOR EACH STATEMENT EXECUTE FUNCTION gatekeeper.mail_check();
CREATE TRIGGER mail_check_insert AFTER INSERT ON gatekeeper.mail_1
	REFERENCING NEW TABLE AS new_mail FOR EACH STATEMENT EXECUTE FUNCTION gatekeeper.mail_check();
CREATE TRIGGER mail_check_insert AFTER INSERT ON gatekeeper.mail_2
	REFERENCING NEW TABLE AS new_mail FOR EACH STATEMENT EXECUTE FUNCTION gatekeeper.mail_check();
CREATE TRIGGER mail_check_insert AFTER INSERT ON gatekeeper.mail_3
	REFERENCING NEW TABLE AS new_mail FOR EACH STATEMENT EXECUTE FUNCTION gatekeeper.mail_check();

DROP TRIGGER mail_check_update ON gatekeeper.mail;
CREATE TRIGGER mail_check_update
	BEFORE UPDATE OF queue, recipient, sender, subject, body, html, headers,
		recipient_name, timezone, template, template_version, data
	ON gatekeeper.mail
	FOR EACH ROW EXECUTE FUNCTION gatekeeper.mail_check();

/* ---------------------------------------------------------------------------
 * The rows 0.2.0 left, as 0.3.0 reads them: the keys of mail that
 * finished within its queue's dedupe window get their mail_key rows back
 * (0.2.0's purge() removed them), and the retrying mail there is is
 * counted, less what this transaction noted and writes as it commits.  No
 * mail_live changes while it is counted.
 * ---------------------------------------------------------------------------
 */
SELECT gatekeeper._mail_key_hold(NULL);

LOCK TABLE gatekeeper.mail_live IN SHARE ROW EXCLUSIVE MODE;
INSERT INTO gatekeeper.mail_live_count AS c (queue, slot, scheduled, retrying)
SELECT coalesce(r.queue, p.queue), 0, 0, coalesce(r.n, 0) - coalesce(p.retrying, 0)
  FROM (SELECT l.queue, count(*) AS n FROM gatekeeper.mail_live l
		 WHERE l.state = 'scheduled' AND l.attempt > 0
		 GROUP BY l.queue) r
  FULL JOIN (SELECT x.queue, sum(x.retrying)::bigint AS retrying FROM gatekeeper._live_pending() x
			  GROUP BY x.queue) p ON p.queue = r.queue
	ON CONFLICT (queue, slot) DO UPDATE SET retrying = c.retrying + excluded.retrying;

/* ---------------------------------------------------------------------------
 * The public API, as SPEC groups it
 * ---------------------------------------------------------------------------
 */

/*
 * Enqueue.  enqueue() takes a template and its data (the mail's subject
 * and body then NULL).
 */
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

/* Templates */
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

/*
 * Claim and report.  The transitions of a claimed mail are entry points
 * into the library (src/mail_state.c), with their signatures, results and
 * errors; the background worker calls the module itself.  The library
 * plans gatekeeper's own statements without JIT (src/catalog.c,
 * gatekeeper_planner), so claim() no longer carries SET jit = off.
 */
ALTER FUNCTION gatekeeper.claim(text, int, interval, text[]) RESET jit;
COMMENT ON FUNCTION gatekeeper.claim(text, int, interval, text[]) IS
	'lease up to batch due mails to one worker, fairly across unpaused queues (or those named) and through their gates and the suppression list; one row per mail to send, with its (id, attempt) and content';

-- the claim's mail_done row is its 'sent' event too (gatekeeper.events)
CREATE OR REPLACE FUNCTION gatekeeper.ack(id bigint, attempt int)
RETURNS boolean
LANGUAGE c SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_ack';

-- retried with exponential backoff and equal jitter ([d/2, d], d =
-- retry_delay * 2^(tries - 1), at most 6 hours), or failed when permanent
-- or out of attempts: its passes given back, a permanent failure a bounce
-- of its address (src/mail_state.c)
CREATE OR REPLACE FUNCTION gatekeeper.nack(id bigint, attempt int, error text, permanent boolean DEFAULT false)
RETURNS text
LANGUAGE c SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_nack';

-- nack for many claims at once, each element as nack() would do it (a
-- claim named twice with the error of its first element); returns how
-- many were still the caller's.  The claims' batches are locked in batch
-- order (as ack_batch locks them), hard bounces suppressed in address
-- order and the passes of the mail that failed given back in one sorted
-- release, so that concurrent batches do not deadlock.
CREATE OR REPLACE FUNCTION gatekeeper.nack_batch(ids bigint[], attempts int[], errors text[],
	permanent boolean DEFAULT false)
RETURNS int
LANGUAGE c SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_nack_batch';

-- the lease is per batch row (up to 128 mails of one claim): see
-- docs/reference.md, "A lease is held by a batch"
CREATE OR REPLACE FUNCTION gatekeeper.extend(id bigint, attempt int, lease interval)
RETURNS boolean
LANGUAGE c SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_extend';

-- hand claimed mail back unsent and uncharged: no relay could be reached
CREATE OR REPLACE FUNCTION gatekeeper.unclaim(ids bigint[], attempts int[], error text, delay interval DEFAULT '0')
RETURNS int
LANGUAGE c SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_unclaim';

COMMENT ON FUNCTION gatekeeper.ack(bigint, int) IS
	'report a claimed mail sent; true when (id, attempt) was still a current claim, false, changing nothing, when it was not; a claim of another role or of a background worker is refused (42501)';
COMMENT ON FUNCTION gatekeeper.ack_batch(bigint[], int[]) IS
	'report many claimed mails sent, as ack() does for each (id, attempt) pair; the number of claims that were still current (one of another role fails the call)';
COMMENT ON FUNCTION gatekeeper.nack(bigint, int, text, boolean) IS
	'report a claimed mail not sent: retried with backoff, or failed when permanent or out of attempts; the resulting state, NULL when the claim was not current (another role''s is refused)';
COMMENT ON FUNCTION gatekeeper.nack_batch(bigint[], int[], text[], boolean) IS
	'report many claimed mails not sent, as nack() does for each (id, attempt, error), with one permanent for all; the number of claims that were still current (one of another role fails the call)';
COMMENT ON FUNCTION gatekeeper.extend(bigint, int, interval) IS
	'extend a claim''s lease, for its whole batch, to lease from now when that ends later (a lease is never shortened); true, or false when the claim was not current (another role''s is refused)';
COMMENT ON FUNCTION gatekeeper.unclaim(bigint[], int[], text, interval) IS
	'hand claimed mails back unsent and uncharged (no relay could be reached), due again after delay; the number handed back (one of another role fails the call)';

-- settle lapsed claims (src/mail_state_sweep.c): scheduled again, unknown
-- or failed; the claims of another server incarnation's background
-- workers at once, whatever their lease
CREATE OR REPLACE FUNCTION gatekeeper.reap()
RETURNS int
LANGUAGE c
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_reap';
COMMENT ON FUNCTION gatekeeper.reap() IS
	'settle the claimed mail whose lease ran out (or whose server is gone): scheduled again, unknown (at-most-once mail) or failed (attempts spent); the number of mails settled';

CREATE OR REPLACE FUNCTION gatekeeper.next_due(queues text[] DEFAULT NULL)
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
 * Queues.  create_queue and alter_queue take return_path, feedback_id and
 * retry_for; drop_queue counts the runs; cancel goes into C
 * (src/mail_state_sweep.c).
 */
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
-- send_window => '' and feedback_id => '' remove them, as rate_limit => 0
-- and dedupe_window => '0' do
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

CREATE OR REPLACE FUNCTION gatekeeper.drop_queue(name text)
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

CREATE OR REPLACE FUNCTION gatekeeper.cancel(id bigint)
RETURNS boolean
LANGUAGE c
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_cancel';

CREATE OR REPLACE FUNCTION gatekeeper.cancel(queue text, dedupe_key text)
RETURNS boolean
LANGUAGE c
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_cancel_key';

CREATE OR REPLACE FUNCTION gatekeeper.cancel_queue(queue text)
RETURNS bigint
LANGUAGE c
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_cancel_queue';

COMMENT ON FUNCTION gatekeeper.cancel(bigint) IS
	'cancel a scheduled mail by id; true when it was cancelled, false when it is not scheduled (claimed, finished, or no such mail)';
COMMENT ON FUNCTION gatekeeper.cancel(text, text) IS
	'cancel the scheduled mail with this dedupe key in this queue; true when one was cancelled, false when no scheduled mail has it';
COMMENT ON FUNCTION gatekeeper.cancel_queue(text) IS
	'cancel every scheduled mail of a queue; the number cancelled';

/* Suppression.  suppress() takes soft_bounce, and a detail. */
CREATE OR REPLACE FUNCTION gatekeeper.suppress(address text, reason text DEFAULT 'manual',
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

/*
 * Looking inside.  status() shows the uncharged attempts apart (its last
 * column, uncharged: attempt - uncharged were charged against
 * max_attempts); history() names a templated mail's template where it has
 * no subject; retry() schedules finished mail again; grant() gives a role
 * one use of gatekeeper, remembered in role_grant.
 */
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

COMMENT ON FUNCTION gatekeeper.status(bigint) IS 'a mail''s state, by id; for roles that cannot read gatekeeper.mail';

CREATE OR REPLACE FUNCTION gatekeeper.history(recipient text, since timestamptz DEFAULT now() - interval '30 days')
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

/* Retention: purge() rotates the segments in C (src/mail_state_sweep.c) */
CREATE OR REPLACE FUNCTION gatekeeper.purge(batch int DEFAULT 10000)
RETURNS bigint
LANGUAGE c
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_purge';
COMMENT ON FUNCTION gatekeeper.purge(int) IS
	'remove finished mail older than gatekeeper.retention by rotating the retention segments, and a batch of expired gate log rows; the rows removed';

/* After the relay said 250: bounces, complaints, events (src/report.c) */
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

/* Beyond one node: mail ids that name their shard */
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

/* ---------------------------------------------------------------------------
 * Views
 * ---------------------------------------------------------------------------
 */

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

-- every event of the retained mail: id, the mail, its queue and
-- recipient, what happened, the status code and detail, who told, when,
-- why, and the template the mail was rendered from.  The rows of
-- event_log, and a 'sent' event for each sent mail, read from its
-- mail_done row (source 'relay', at its finish): a sent event has no id
-- (NULL), being no row of event_log; the mail and its finish name it.
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
 * A COMMENT for every function a user may call (every function without a
 * leading underscore, and the internal ones grant() gives a role), as
 * docs/reference.md describes it: those of 0.2.0's functions that 0.3.0
 * keeps as they are (sql/27_function_comments.sql lists those without one).
 */
COMMENT ON FUNCTION gatekeeper._segment() IS
	'the retention segment new mail goes to, read once per transaction: the default of gatekeeper.mail''s segment column, so a role that inserts mail runs it';
COMMENT ON FUNCTION gatekeeper.mail_check() IS
	'trigger on gatekeeper.mail: validates each new mail of an INSERT or COPY statement and writes its live row and dedupe key, and validates an UPDATE''s changed mail; an error names the bad row';
COMMENT ON FUNCTION gatekeeper.create_gate(text, interval, int) IS
	'make a gate that passes a recipient at most max_sends times within period';
COMMENT ON FUNCTION gatekeeper.alter_gate(text, interval, int) IS
	'change a gate''s period or max_sends for passes made from now on; each argument NULL leaves its setting as it is';
COMMENT ON FUNCTION gatekeeper.drop_gate(text) IS
	'drop a gate that no queue uses, with its passes';
COMMENT ON FUNCTION gatekeeper.gate_pass(text, text, bigint) IS
	'take one pass of a gate for a recipient, held by holder when given; true when it passed, false when the gate is closed';
COMMENT ON FUNCTION gatekeeper.gate_pass_batch(text, text[]) IS
	'take one pass of a gate for each recipient; the recipients that passed';
COMMENT ON FUNCTION gatekeeper.gate_open(text, text) IS
	'whether a gate would pass a recipient now, without taking a pass';
COMMENT ON FUNCTION gatekeeper.gate_next_open(text, text) IS
	'when a gate next opens for a recipient, NULL when it is open';
COMMENT ON FUNCTION gatekeeper.gate_release(text, text, bigint) IS
	'give back the pass of a gate that holder holds for a recipient; true when one was given back';
COMMENT ON FUNCTION gatekeeper.explain(text) IS
	'every gate''s view of one recipient, one row per gate: open or not, its next opening, the passes in its period and max_sends';
COMMENT ON FUNCTION gatekeeper.pause(text) IS
	'stop claims from taking a queue''s mail until resume()';
COMMENT ON FUNCTION gatekeeper.resume(text) IS
	'let claims take a paused queue''s mail again';
COMMENT ON FUNCTION gatekeeper.unsuppress(text, text) IS
	'take an address off the suppression list for one queue, or the entry for every queue when queue is NULL; true when an entry was removed';
COMMENT ON FUNCTION gatekeeper.unsubscribe(text) IS
	'verify a List-Unsubscribe token and suppress its recipient for its queue; true when the entry is new';
COMMENT ON FUNCTION gatekeeper.recount_live() IS
	'count mail_live afresh into the live counts that queue_stats reads, after writes made with its triggers disabled; the live mails counted';
COMMENT ON FUNCTION gatekeeper._gate_memory() IS
	'what the gates hold in the server''s shared memory (bytes used and total, entries, gated mails deferred because it was full), one row; the gate_memory view reads it';

/* ---------------------------------------------------------------------------
 * Privileges: nothing that 0.3.0 makes is PUBLIC's; the grants carried
 * over (see the top) are given; the remembered roles get what their uses
 * need.
 * ---------------------------------------------------------------------------
 */
REVOKE ALL ON TABLE gatekeeper.mail_run, gatekeeper.event_log, gatekeeper.event_log_0,
	gatekeeper.event_log_1, gatekeeper.event_log_2, gatekeeper.event_log_3,
	gatekeeper.shard_position, gatekeeper.role_grant, gatekeeper.template FROM PUBLIC;
REVOKE ALL ON SEQUENCE gatekeeper.event_log_id_seq FROM PUBLIC;
REVOKE ALL ON TABLE gatekeeper.mail_status, gatekeeper.worker_status, gatekeeper.delivery_latency,
	gatekeeper.queue_stats, gatekeeper.report_stats, gatekeeper.events, gatekeeper.templates FROM PUBLIC;
REVOKE ALL ON FUNCTION gatekeeper._mail_key_hold(text), gatekeeper._check_feedback_id(text),
	gatekeeper._check_return_path(text), gatekeeper._verp_token(bigint), gatekeeper._incarnation(),
	gatekeeper._bounce_reason(text, text),
	gatekeeper._message_id(bigint, text, text, text), gatekeeper._count_events(),
	gatekeeper._queue_totals(), gatekeeper._queue_rates(), gatekeeper._live_pending(),
	gatekeeper._live_stats(), gatekeeper._worker_status(), gatekeeper._delivery_latency(),
	gatekeeper._shard_apply(), gatekeeper._template_check(text, text, text, text, jsonb),
	gatekeeper._template_version(text, timestamptz), gatekeeper._delivery_check(),
	gatekeeper._grant_apply(regrole) FROM PUBLIC;
REVOKE ALL ON FUNCTION gatekeeper.enqueue(text, text, text, text, timestamptz, text, text, jsonb, text, int, timestamptz, text, jsonb, text, text, jsonb),
	gatekeeper.create_template(text, text, text, text, jsonb),
	gatekeeper.alter_template(text, text, text, text, jsonb),
	gatekeeper.drop_template(text), gatekeeper.render(text, jsonb, int),
	gatekeeper.create_queue(text, text[], text, text, int, int, int, interval, boolean, text, text, text, boolean, boolean, text, text, interval),
	gatekeeper.alter_queue(text, text[], text, text, int, int, int, interval, boolean, text, text, text, boolean, boolean, text, text, interval),
	gatekeeper.status(bigint), gatekeeper.retry(bigint), gatekeeper.retry(text, timestamptz),
	gatekeeper.grant(regrole, text), gatekeeper.ingest_report(text, text),
	gatekeeper.record_event(text, text, text, text, text), gatekeeper.shard(int, int) FROM PUBLIC;

DO $$
DECLARE
	stmt text;
BEGIN
	FOREACH stmt IN ARRAY coalesce(pg_catalog.string_to_array(
			nullif(pg_catalog.current_setting('gatekeeper_upgrade.carried_grants', true), ''),
			pg_catalog.chr(31)), '{}') LOOP
		EXECUTE stmt;
	END LOOP;
END
$$;

-- say now if no background worker would send this database's mail
SELECT gatekeeper._delivery_check();

/*
 * Last, always: give the remembered roles what their uses need of the
 * functions this update added or replaced.  Keep this the script's end.
 */
SELECT gatekeeper._grant_apply();
