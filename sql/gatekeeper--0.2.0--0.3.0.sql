/* gatekeeper 0.2.0 -> 0.3.0 (ALTER EXTENSION gatekeeper UPDATE TO '0.3.0') */
\echo Use "ALTER EXTENSION gatekeeper UPDATE TO '0.3.0'" to load this file. \quit

/*
 * Every change here is also in gatekeeper--0.3.0.sql; t/031_upgrade.pl
 * checks that a 0.2.0 updated to 0.3.0, a 0.1.0 updated through 0.2.0 and
 * a fresh 0.3.0 have the same objects.  Each issue's changes are a section
 * of their own, in the order they landed.
 */

/* ---------------------------------------------------------------------------
 * Issue 27, item 6: DKIM signing and the queue option feedback_id.  Queues
 * gain feedback_id, so create_queue and alter_queue gain it as their last
 * argument (made again: a function's arguments cannot be changed in
 * place); worker_status gains unsigned_total, the messages built without
 * a DKIM signature, so it and _worker_status are made again.  The grants
 * on what is made again are given back at the end of this section.
 * ---------------------------------------------------------------------------
 */
-- the GRANTs to give back (one statement each, apart by chr(31))
SELECT pg_catalog.set_config('gatekeeper_upgrade.grants_27_6',
	coalesce((SELECT pg_catalog.string_agg(s.stmt, pg_catalog.chr(31))
				FROM (SELECT pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s%s', f.fn,
											   a.grantee::pg_catalog.regrole,
											   CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END) AS stmt
						FROM (VALUES ('gatekeeper.create_queue(text, text[], text, text, int, int, int, interval, boolean, text, text, text, boolean, boolean)',
									  'gatekeeper.create_queue(text, text[], text, text, int, int, int, interval, boolean, text, text, text, boolean, boolean, text)'),
									 ('gatekeeper.alter_queue(text, text[], text, text, int, int, int, interval, boolean, text, text, text, boolean, boolean)',
									  'gatekeeper.alter_queue(text, text[], text, text, int, int, int, interval, boolean, text, text, text, boolean, boolean, text)'),
									 ('gatekeeper._worker_status()', 'gatekeeper._worker_status()')) AS f(old, fn),
							 pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) AS a
					   WHERE p.oid = f.old::pg_catalog.regprocedure
						 AND a.privilege_type = 'EXECUTE' AND a.grantee NOT IN (0, p.proowner)
					  UNION ALL
					  SELECT pg_catalog.format('GRANT %s ON TABLE gatekeeper.worker_status TO %s%s', a.privilege_type,
											   a.grantee::pg_catalog.regrole,
											   CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END)
						FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) AS a
					   WHERE c.oid = 'gatekeeper.worker_status'::pg_catalog.regclass
						 AND a.grantee NOT IN (0, c.relowner)) AS s), ''),
	true);

ALTER TABLE gatekeeper.queue ADD COLUMN feedback_id text;

COMMENT ON COLUMN gatekeeper.queue.feedback_id IS 'Feedback-ID header of its mail (Gmail''s feedback loop), NULL: none';

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

DROP FUNCTION gatekeeper.create_queue(text, text[], text, text, int, int, int, interval, boolean, text, text, text, boolean, boolean);
DROP FUNCTION gatekeeper.alter_queue(text, text[], text, text, int, int, int, interval, boolean, text, text, text, boolean, boolean);

CREATE FUNCTION gatekeeper.create_queue(name text, gates text[] DEFAULT '{}',
	on_gate_closed text DEFAULT 'suppress', delivery text DEFAULT 'at_least_once',
	max_attempts int DEFAULT 5, weight int DEFAULT 1, rate_limit int DEFAULT NULL,
	dedupe_window interval DEFAULT NULL, transactional boolean DEFAULT false,
	unsubscribe_url text DEFAULT NULL, send_window text DEFAULT NULL,
	timezone text DEFAULT 'UTC', background boolean DEFAULT true,
	notify boolean DEFAULT false, feedback_id text DEFAULT NULL)
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
	IF create_queue.background IS NULL OR create_queue.notify IS NULL THEN
		RAISE EXCEPTION 'background and notify must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	PERFORM gatekeeper._check_notify(create_queue.name, create_queue.notify);
	PERFORM gatekeeper._check_queue_policy(gates, on_gate_closed, delivery, max_attempts,
										   weight, rate_limit, dedupe_window, false);
	PERFORM gatekeeper._check_window(create_queue.send_window, create_queue.timezone);
	PERFORM gatekeeper._check_unsubscribe_url(create_queue.unsubscribe_url, create_queue.name);
	PERFORM gatekeeper._check_feedback_id(create_queue.feedback_id);
	BEGIN
		INSERT INTO gatekeeper.queue (name, gates, on_gate_closed, delivery, max_attempts,
									  weight, rate_limit, dedupe_window, tokens, transactional,
									  unsubscribe_url, send_window, timezone, background, notify,
									  feedback_id)
		VALUES (create_queue.name, (SELECT coalesce(array_agg(DISTINCT g ORDER BY g), '{}') FROM unnest(gates) g),
				on_gate_closed, delivery, max_attempts, weight, rate_limit,
				gatekeeper._duration(dedupe_window, 'dedupe_window'), coalesce(rate_limit, 0),
				create_queue.transactional, create_queue.unsubscribe_url, create_queue.send_window,
				create_queue.timezone, create_queue.background, create_queue.notify,
				create_queue.feedback_id);
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
	notify boolean DEFAULT NULL, feedback_id text DEFAULT NULL)
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
	PERFORM gatekeeper._check_feedback_id(nullif(alter_queue.feedback_id, ''));
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
		   dedupe_window = CASE WHEN alter_queue.dedupe_window = interval '0' THEN NULL
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
							  ELSE coalesce(alter_queue.feedback_id, q.feedback_id) END
	 WHERE q.name = alter_queue.name;
END
$$;

COMMENT ON FUNCTION gatekeeper.create_queue(text, text[], text, text, int, int, int, interval, boolean,
											text, text, text, boolean, boolean, text) IS
	'make a queue (a campaign, flow or tenant) with its policy';
COMMENT ON FUNCTION gatekeeper.alter_queue(text, text[], text, text, int, int, int, interval, boolean,
										   text, text, text, boolean, boolean, text) IS
	'change a queue''s policy; each argument NULL leaves its setting as it is';

DROP VIEW gatekeeper.worker_status;
DROP FUNCTION gatekeeper._worker_status();

CREATE FUNCTION gatekeeper._worker_status(OUT pid int, OUT started timestamptz, OUT state text,
		OUT in_flight int, OUT connections int, OUT relay text, OUT last_success timestamptz,
		OUT last_error text, OUT last_error_at timestamptz, OUT sent_total bigint,
		OUT unsigned_total bigint)
	RETURNS SETOF record
	LANGUAGE C VOLATILE STRICT
	SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_worker_status';

-- the background workers, from shared memory: what each is doing, the mail
-- it holds, its relay connections, its breaker (closed: delivering; open:
-- backing off after the relay refused the session or every MAIL FROM;
-- half-open: trying again), the relay's last refusal, and the messages
-- built without a DKIM signature (no key for their From domain)
CREATE VIEW gatekeeper.worker_status AS
SELECT w.pid, w.started, w.state, w.in_flight, w.connections, w.relay,
	   w.last_success, w.last_error, w.last_error_at, w.sent_total, w.unsigned_total
  FROM gatekeeper._worker_status() AS w;

COMMENT ON VIEW gatekeeper.worker_status IS
	'one row per gatekeeper background worker: state, mail in flight, relay connections, breaker and last relay error';

REVOKE ALL ON FUNCTION gatekeeper._check_feedback_id(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION gatekeeper.create_queue(text, text[], text, text, int, int, int, interval, boolean,
											   text, text, text, boolean, boolean, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION gatekeeper.alter_queue(text, text[], text, text, int, int, int, interval, boolean,
											  text, text, text, boolean, boolean, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION gatekeeper._worker_status() FROM PUBLIC;
REVOKE ALL ON TABLE gatekeeper.worker_status FROM PUBLIC;

-- the grants recorded at the start of this section, given back
DO $$
DECLARE
	stmt text;
BEGIN
	FOREACH stmt IN ARRAY coalesce(string_to_array(nullif(current_setting('gatekeeper_upgrade.grants_27_6', true), ''),
												   chr(31)), '{}')
	LOOP
		EXECUTE stmt;
	END LOOP;
END
$$;
