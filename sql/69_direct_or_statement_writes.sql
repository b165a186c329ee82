-- Each hot write of the mail tables has a direct writer (src/mail/) and
-- the statement kept beside it for one configuration: a trigger of the
-- user's on the table written, which only the statement fires.  The same
-- work is done twice, into two queues: first with no trigger of the
-- user's (the direct writers), then with a no-op trigger on mail_live's,
-- mail_claim's and mail_done's inserts and on mail_claim's updates and
-- deletes (the statements).  The live rows of new mail (keys, priorities,
-- later send_at, a load re-run with on_duplicate = 'skip'), a claim's
-- batch rows, the claims taken out of them (a batch shrunk by acks, nacks
-- and an unclaim, one acked whole and deleted), and the outcome rows of
-- suppressed, expired, acked and failed mail must leave the same states,
-- rows and counts either way.  A third time, with mail_claim's index by
-- id range renamed, the statements also read and lock the batches an ack
-- takes claims from: the same again.
SET client_min_messages = warning;
\set VERBOSITY terse
CREATE TEMP TABLE fired (tab text, op text);
CREATE FUNCTION pg_temp.noted() RETURNS trigger LANGUAGE plpgsql AS
$$BEGIN INSERT INTO fired VALUES (TG_TABLE_NAME, TG_OP); RETURN NULL; END$$;

-- the work: new mail, a re-run load, a claim and its outcomes, a cancel
CREATE FUNCTION pg_temp.work(q text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
	ids bigint[];
	atts int[];
	whole bigint[];
	whole_atts int[];
BEGIN
	PERFORM gatekeeper.create_queue(q, max_attempts => 2);
	PERFORM gatekeeper.suppress(q || '5@example.com', 'hard_bounce');
	INSERT INTO gatekeeper.mail (queue, recipient, subject, body, priority, send_at, send_by, dedupe_key)
	SELECT q, q || i || '@example.com', 's', 'b', i % 3,
		   CASE WHEN i % 10 = 0 THEN now() + interval '1 day'
				WHEN i = 6 THEN now() - interval '2 hours' ELSE now() END,
		   CASE WHEN i = 6 THEN now() - interval '1 hour' END,
		   CASE WHEN i % 4 = 0 THEN 'k' || i END
	  FROM generate_series(1, 40) i;
	-- keys k4, k8 and k12 are held: those three rows are skipped
	PERFORM set_config('gatekeeper.on_duplicate', 'skip', true);
	INSERT INTO gatekeeper.mail (queue, recipient, subject, body, dedupe_key)
	SELECT q, q || 'again' || i || '@example.com', 's', 'b', 'k' || i
	  FROM generate_series(1, 12) i;
	PERFORM set_config('gatekeeper.on_duplicate', 'error', true);
	SELECT array_agg(c.id ORDER BY c.id), array_agg(c.attempt ORDER BY c.id)
	  INTO ids, atts
	  FROM gatekeeper.claim('w-' || q, 100, queues => ARRAY[q]) c;
	PERFORM gatekeeper.ack_batch(ids[1:20], atts[1:20]);
	-- a batch acked whole: its row goes
	INSERT INTO gatekeeper.mail (queue, recipient, subject, body)
	SELECT q, q || 'whole' || i || '@example.com', 's', 'b' FROM generate_series(1, 3) i;
	SELECT array_agg(c.id ORDER BY c.id), array_agg(c.attempt ORDER BY c.id)
	  INTO whole, whole_atts
	  FROM gatekeeper.claim('w-' || q, 100, queues => ARRAY[q]) c;
	PERFORM gatekeeper.ack_batch(whole, whole_atts);
	PERFORM gatekeeper.nack(ids[21], atts[21], '550 5.1.1 no such user', true);
	PERFORM gatekeeper.nack(ids[22], atts[22], '451 4.3.0 try later');
	PERFORM gatekeeper.unclaim(ids[23:24], atts[23:24], 'no relay', interval '0');
	PERFORM gatekeeper.cancel(min(m.id)) FROM gatekeeper.mail m
	  WHERE m.queue = q AND m.send_at > now();
END
$$;

-- what a user reads of a queue's mail, each mail by its place n in the
-- queue's ids
CREATE FUNCTION pg_temp.summary(q text) RETURNS TABLE (what text, n bigint, v text)
LANGUAGE sql AS $$
	WITH base AS (SELECT min(id) AS a FROM gatekeeper.mail WHERE queue = q)
	SELECT 'state', s.id - base.a, s.state || ' attempt ' || s.attempt
	  FROM gatekeeper.mail_status s, base WHERE s.queue = q
	UNION ALL
	SELECT 'queue_stats', 0, concat_ws(' ', 'scheduled', scheduled, 'due', due,
									   'claimed', claimed, 'sent', sent, 'failed', failed,
									   'suppressed', suppressed, 'expired', expired,
									   'cancelled', cancelled)
	  FROM gatekeeper.queue_stats WHERE queue = q
	UNION ALL
	SELECT 'live row', l.id - base.a,
		   concat_ws(' ', l.state, 'priority', l.priority, 'key', coalesce(l.dedupe_key, '-'), 'attempt', l.attempt)
	  FROM gatekeeper.mail_live l, base WHERE l.queue = q
	UNION ALL
	SELECT 'runs', 0, count(*)::text FROM gatekeeper.mail_run WHERE queue = q
	UNION ALL
	SELECT 'claim batch rows', 0, concat_ws(' ', count(*), 'rows', sum(open), 'open',
											sum(cardinality(gone)), 'gone',
											sum(cardinality(mails)), 'records')
	  FROM gatekeeper.mail_claim WHERE queue = q
	UNION ALL
	SELECT 'outcome row', d.id - base.a,
		   concat_ws(' ', d.state, 'attempt', d.attempt, 'key', coalesce(d.dedupe_key, '-'), 'error', coalesce(d.last_error, '-'),
					 CASE WHEN d.finished_at IS NULL THEN 'unfinished' END)
	  FROM gatekeeper.mail_done d, base WHERE d.queue = q
	UNION ALL
	SELECT 'dedupe keys held', 0, count(*)::text FROM gatekeeper.mail_key WHERE queue = q
$$;

-- 1. the direct writers: no trigger of the user's
SELECT pg_temp.work('d69');
SELECT tab, op, count(*) FROM fired GROUP BY tab, op ORDER BY tab, op;

-- 2. the statements: a no-op trigger of the user's on each table, which
-- each statement fires
CREATE TRIGGER noted_live AFTER INSERT ON gatekeeper.mail_live
	FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.noted();
CREATE TRIGGER noted_claim AFTER INSERT ON gatekeeper.mail_claim
	FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.noted();
CREATE TRIGGER noted_done AFTER INSERT ON gatekeeper.mail_done
	FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.noted();
CREATE TRIGGER noted_take AFTER UPDATE OR DELETE ON gatekeeper.mail_claim
	FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.noted();
SELECT pg_temp.work('s69');
SELECT tab, op, count(*) FROM fired GROUP BY tab, op ORDER BY tab, op;
DROP TRIGGER noted_live ON gatekeeper.mail_live;
DROP TRIGGER noted_claim ON gatekeeper.mail_claim;
DROP TRIGGER noted_done ON gatekeeper.mail_done;
DROP TRIGGER noted_take ON gatekeeper.mail_claim;

-- 3. the batches an ack takes claims from read and locked by the
-- statements: mail_claim's index by id range is not found under its name
ALTER INDEX gatekeeper.mail_claim_ids RENAME TO mail_claim_ids_away;
SELECT pg_temp.work('i69');
ALTER INDEX gatekeeper.mail_claim_ids_away RENAME TO mail_claim_ids;

-- both ways alike: what the direct writers left, then every difference
-- (none)
CREATE TEMP TABLE both_ways AS
SELECT what, n, d.v AS direct, s.v AS statement
  FROM pg_temp.summary('d69') d FULL JOIN pg_temp.summary('s69') s USING (what, n);
SELECT what, count(*) AS items, count(*) FILTER (WHERE direct = statement) AS alike
  FROM both_ways GROUP BY what ORDER BY what;
SELECT what, n, direct FROM both_ways
 WHERE what IN ('queue_stats', 'claim batch rows', 'runs', 'dedupe keys held', 'live row',
				'outcome row')
 ORDER BY what, n;
SELECT * FROM both_ways WHERE direct IS DISTINCT FROM statement ORDER BY what, n;
SELECT what, n, d.v AS direct, i.v AS by_statements
  FROM pg_temp.summary('d69') d FULL JOIN pg_temp.summary('i69') i USING (what, n)
 WHERE d.v IS DISTINCT FROM i.v ORDER BY what, n;
SELECT n, direct FROM both_ways WHERE what = 'state' ORDER BY n;
SELECT gatekeeper.recount_live() = (SELECT sum(scheduled) FROM gatekeeper.queue_stats) AS counts_held;

DELETE FROM gatekeeper.mail WHERE queue IN ('d69', 's69', 'i69');
SELECT gatekeeper.drop_queue('d69'), gatekeeper.drop_queue('s69'), gatekeeper.drop_queue('i69');
SELECT gatekeeper.unsuppress(a, NULL)
  FROM unnest(ARRAY['d695@example.com', 's695@example.com', 'i695@example.com']) a ORDER BY a;
