/* gatekeeper 0.1.0 -> 0.2.0 (ALTER EXTENSION gatekeeper UPDATE TO '0.2.0') */
\echo Use "ALTER EXTENSION gatekeeper UPDATE TO '0.2.0'" to load this file. \quit

/*
 * Every change here is also in gatekeeper--0.2.0.sql; t/030_upgrade.pl
 * checks that an updated 0.1.0 and a fresh 0.2.0 have the same objects.
 */

/*
 * nack's backoff reads gatekeeper.retry_delay in C (issue 9, defect 11):
 * current_setting(...)::interval read a placeholder's bare '30000' as
 * 30000 seconds.
 */
-- gatekeeper.retry_delay as the setting means it (a bare number is milliseconds)
CREATE FUNCTION gatekeeper._retry_delay()
RETURNS interval
LANGUAGE c STABLE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_retry_delay_interval';

REVOKE ALL ON FUNCTION gatekeeper._retry_delay() FROM PUBLIC;

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
		IF cardinality(q.gates) > 0 THEN
			PERFORM gatekeeper._release_mail(m.recipient, m.id);
		END IF;
		RETURN 'failed';
	END IF;

	-- exponential backoff with equal jitter: [d/2, d], d = base * 2^(tries-1), at most 6 hours
	base := gatekeeper._retry_delay();
	delay := least(base * power(2, least(tries - 1, 30)), interval '6 hours');
	delay := delay / 2 + delay / 2 * random();
	UPDATE gatekeeper.mail
	   SET state = 'scheduled', send_at = now() + delay, lease_until = NULL, last_error = error
	 WHERE mail.id = m.id;
	RETURN 'scheduled';
END
$$;
