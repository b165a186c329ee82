/* gatekeeper 0.2.0 -> 0.3.0 (ALTER EXTENSION gatekeeper UPDATE TO '0.3.0') */
\echo Use "ALTER EXTENSION gatekeeper UPDATE TO '0.3.0'" to load this file. \quit

/*
 * Every change here is also in gatekeeper--0.3.0.sql; t/031_upgrade.pl
 * checks that a 0.2.0 updated to 0.3.0, a 0.1.0 updated through 0.2.0 and
 * a fresh 0.3.0 have the same objects.  Each issue's changes are a section
 * of their own, in the order they landed.
 */

/*
 * Issue 25, item 6: the background workers' claims name the server
 * incarnation that made them ('bgworker:<pid>@<incarnation>'), and reap()
 * takes back at once the claims of any other incarnation's workers (a
 * promoted standby, a restarted server), not after their lease.
 */
-- this server's incarnation (src/gatekeeper.c), which the background
-- workers' claims name; NULL when the library is not preloaded
CREATE FUNCTION gatekeeper._incarnation()
RETURNS text
LANGUAGE c STABLE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'gatekeeper_incarnation_sql';

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
	back_queues text[];
	back_due timestamptz[];
	-- this server's incarnation; NULL when no background worker can run
	here text := gatekeeper._incarnation();
BEGIN
	/*
	 * at_most_once: the mail may have gone, so it is never sent again.
	 * at_least_once: back to scheduled, unless its attempts are spent;
	 * it keeps its gate passes, which its next claim re-passes.  Mail that
	 * failed gives its passes back, all in one sorted release.  Claimed
	 * mail is in batches (gatekeeper.mail_claim): a lapsed batch is
	 * deleted and the mails still open in it are judged; a mail whose
	 * queue is gone goes back to scheduled rather than nowhere.
	 *
	 * A batch a background worker of another server incarnation claimed
	 * (its worker is 'bgworker:<pid>@<incarnation>', or 0.2.0's
	 * 'bgworker:<pid>') is taken back at once, whatever its lease: that
	 * worker is gone (this is a promoted standby, or the server
	 * restarted) and could only ever have recorded its outcomes on the
	 * server it ran on.  Its mails go back uncharged.  External claimers'
	 * claims are never taken back early: they outlive any one server, and
	 * may ack on this one after a failover.
	 */
	WITH lapsed AS (
		DELETE FROM gatekeeper.mail_claim c
		 WHERE c.batch = ANY (ARRAY(
				SELECT l.batch FROM gatekeeper.mail_claim l
				 WHERE l.lease_until < now()
				   FOR UPDATE SKIP LOCKED)
			 || ARRAY(
				SELECT l.batch FROM gatekeeper.mail_claim l
				 WHERE here IS NOT NULL AND l.lease_until >= now()
				   AND l.worker LIKE 'bgworker:%' AND l.worker NOT LIKE '%@' || here
				   FOR UPDATE SKIP LOCKED))
		RETURNING c.gone, c.mails, c.lease_until >= now() AS orphaned
	), judged AS (
		SELECT r.*, r.uncharged + e.orphaned::int AS free,
			   CASE WHEN e.orphaned THEN 'claimed by a server that is gone'
					ELSE 'lease expired' END AS why,
			   CASE WHEN q.delivery = 'at_most_once' THEN 'unknown'
					WHEN r.attempt - r.uncharged - e.orphaned::int >= q.max_attempts THEN 'failed'
					ELSE 'scheduled' END AS outcome
		  FROM lapsed e
		 CROSS JOIN LATERAL unnest(e.mails) r
		  LEFT JOIN gatekeeper.queue q ON q.name = r.queue
		 WHERE NOT r.id = ANY (e.gone)
	), back AS (
		INSERT INTO gatekeeper.mail_live (id, queue, priority, send_at, state, attempt, uncharged,
										  lease_until, worker, message_id, last_error, dedupe_key, segment)
		SELECT j.id, j.queue, j.priority, j.send_at, 'scheduled', j.attempt, j.free,
			   NULL, NULL, j.message_id, j.why, j.dedupe_key, j.segment
		  FROM judged j
		 WHERE j.outcome = 'scheduled'
		RETURNING mail_live.id, mail_live.queue, mail_live.send_at
	), gone AS (
		SELECT j.* FROM judged j WHERE j.outcome <> 'scheduled'
	), done AS (
		INSERT INTO gatekeeper.mail_done (id, queue, state, attempt, uncharged, send_at, worker,
										  message_id, last_error, dedupe_key, finished_at, segment)
		SELECT g.id, g.queue, g.outcome::gatekeeper.state, g.attempt, g.free, g.send_at, NULL,
			   g.message_id, g.why, g.dedupe_key, now(), g.segment
		  FROM gone g
		RETURNING mail_done.id, mail_done.state, mail_done.segment
	)
	SELECT (SELECT count(*) FROM back) + count(d.id),
		   array_agg(m.recipient) FILTER (WHERE d.state = 'failed'),
		   array_agg(d.id) FILTER (WHERE d.state = 'failed'),
		   (SELECT array_agg(b.queue) FROM back b), (SELECT array_agg(b.send_at) FROM back b)
	  INTO n, release_recipients, release_holders, back_queues, back_due
	  FROM done d
	  LEFT JOIN gatekeeper.mail m ON m.id = d.id AND m.segment = d.segment;
	IF release_recipients IS NOT NULL THEN
		PERFORM gatekeeper._release_mails(release_recipients, release_holders);
	END IF;
	-- mail back to scheduled is due again: external senders of a notify queue hear of it
	PERFORM gatekeeper._announce(b.queue, min(b.due))
	   FROM unnest(back_queues, back_due) AS b(queue, due)
	   JOIN gatekeeper.queue q ON q.name = b.queue AND q.notify
	  GROUP BY b.queue;
	RETURN n;
END
$$;

REVOKE ALL ON FUNCTION gatekeeper._incarnation() FROM PUBLIC;
