/* gatekeeper 0.1.0 -> 0.2.0 (ALTER EXTENSION gatekeeper UPDATE TO '0.2.0') */
\echo Use "ALTER EXTENSION gatekeeper UPDATE TO '0.2.0'" to load this file. \quit

/*
 * Every change here is also in gatekeeper--0.2.0.sql; t/030_upgrade.pl
 * checks that an updated 0.1.0 and a fresh 0.2.0 have the same objects.
 */

/*
 * Issue 9, gates: the shared-memory space's name (gatekeeper.gate_space), the
 * gatekeeper.gate_memory view, and nack and reap releasing a failed mail's
 * passes by what it holds rather than by its queue's gates now.
 */
CREATE TABLE gatekeeper.gate_space (
	id			bigint NOT NULL
);
INSERT INTO gatekeeper.gate_space (id)
VALUES (('x' || left(pg_catalog.gen_random_uuid()::text, 8)
			 || left(pg_catalog.gen_random_uuid()::text, 8))::bit(64)::bigint);

CREATE FUNCTION gatekeeper._gate_memory(OUT bytes_used bigint, OUT bytes_total bigint,
	OUT entries bigint, OUT full_refusals bigint)
RETURNS SETOF record
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_gate_memory_stats';

CREATE VIEW gatekeeper.gate_memory AS
SELECT m.bytes_used, m.bytes_total, m.entries, m.full_refusals
  FROM gatekeeper._gate_memory() AS m;

CREATE OR REPLACE FUNCTION gatekeeper.nack(id bigint, attempt int, error text, permanent boolean DEFAULT false)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	m gatekeeper.mail;
	q gatekeeper.queue;
	tries int;
	delay interval;
	base interval;
BEGIN
	IF nack.id IS NULL OR nack.attempt IS NULL OR permanent IS NULL THEN
		RAISE EXCEPTION 'id, attempt and permanent must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	SELECT * INTO m FROM gatekeeper.mail
	 WHERE mail.id = nack.id AND mail.attempt = nack.attempt AND mail.state = 'claimed'
	   FOR UPDATE;
	IF NOT FOUND THEN
		RETURN NULL;			-- not this claim's to report: it changes nothing
	END IF;
	SELECT * INTO q FROM gatekeeper.queue WHERE name = m.queue;
	tries := m.attempt - m.uncharged;

	IF permanent OR tries >= coalesce(q.max_attempts, 1) THEN
		UPDATE gatekeeper.mail
		   SET state = 'failed', finished_at = now(), lease_until = NULL, last_error = error
		 WHERE mail.id = m.id;
		-- by what the mail holds, whatever its queue's gates are now
		PERFORM gatekeeper._release_mail(m.recipient, m.id);
		RETURN 'failed';
	END IF;

	-- exponential backoff with equal jitter: [d/2, d], d = base * 2^(tries-1), at most 6 hours
	base := coalesce(nullif(current_setting('gatekeeper.retry_delay', true), '')::interval,
					 interval '30 seconds');
	delay := least(base * power(2, least(tries - 1, 30)), interval '6 hours');
	delay := delay / 2 + delay / 2 * random();
	UPDATE gatekeeper.mail
	   SET state = 'scheduled', send_at = now() + delay, lease_until = NULL, last_error = error
	 WHERE mail.id = m.id;
	RETURN 'scheduled';
END
$$;

CREATE OR REPLACE FUNCTION gatekeeper.reap()
RETURNS int
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	n int;
	release_recipients text[];
	release_holders bigint[];
BEGIN
	/*
	 * at_most_once: the mail may have gone, so it is never sent again.
	 * at_least_once: back to scheduled, unless its attempts are spent;
	 * it keeps its gate passes, which its next claim re-passes.  Mail that
	 * failed gives its passes back, all in one sorted release.
	 */
	WITH expired AS (
		SELECT m.id FROM gatekeeper.mail m
		 WHERE m.lease_until < now() AND m.state = 'claimed'
		   FOR UPDATE SKIP LOCKED
	), reaped AS (
		UPDATE gatekeeper.mail m
		   SET state = CASE
						   WHEN q.delivery = 'at_most_once' THEN 'unknown'
						   WHEN m.attempt - m.uncharged >= q.max_attempts THEN 'failed'
						   ELSE 'scheduled' END::gatekeeper.state,
			   finished_at = CASE
								 WHEN q.delivery = 'at_most_once'
								   OR m.attempt - m.uncharged >= q.max_attempts THEN now() END,
			   lease_until = NULL,
			   worker = NULL,
			   last_error = 'lease expired'
		  FROM expired e, gatekeeper.queue q
		 WHERE m.id = e.id AND q.name = m.queue
		RETURNING m.id, m.recipient, m.state
	)
	SELECT count(*),
		   array_agg(r.recipient) FILTER (WHERE r.state = 'failed'),
		   array_agg(r.id) FILTER (WHERE r.state = 'failed')
	  INTO n, release_recipients, release_holders
	  FROM reaped r;
	IF release_recipients IS NOT NULL THEN
		PERFORM gatekeeper._release_mails(release_recipients, release_holders);
	END IF;
	RETURN n;
END
$$;

REVOKE ALL ON TABLE gatekeeper.gate_space FROM PUBLIC;
REVOKE ALL ON FUNCTION gatekeeper._gate_memory() FROM PUBLIC;
REVOKE ALL ON TABLE gatekeeper.gate_memory FROM PUBLIC;
