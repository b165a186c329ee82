-- Fairness across queues by weight, order inside a queue, rate limits.
SET client_min_messages = warning;
\set VERBOSITY terse

SELECT gatekeeper.create_queue('f_heavy', weight => 3);
SELECT gatekeeper.create_queue('f_light', weight => 1);
SELECT gatekeeper.create_queue('f_small', weight => 1);
SELECT gatekeeper.create_queue('f_prio');
SELECT gatekeeper.create_queue('f_rate', rate_limit => 10);

INSERT INTO gatekeeper.mail (recipient, subject, body, queue, send_at)
SELECT format('%s%s@example.com', q, i), 'Fair', 'b', q, now() - interval '1 minute'
  FROM unnest(ARRAY['f_heavy', 'f_light']) AS q, generate_series(1, 200) AS i;

--
-- weights 3 and 1, both with plenty of due mail: 75 and 25 of 100
--
CREATE TEMP TABLE got (round int, queue text, id bigint, attempt int);
INSERT INTO got SELECT 1, queue, id, attempt
  FROM gatekeeper.claim('w-fair', 100, queues => ARRAY['f_heavy', 'f_light']);
SELECT queue, count(*) FROM got WHERE round = 1 GROUP BY queue ORDER BY queue;

--
-- a third queue with only 5 due mails: it gets its 5, and what it could
-- not use goes to the others by weight (95 as 3:1, about 71 and 24)
--
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, send_at)
SELECT format('small%s@example.com', i), 'Fair', 'b', 'f_small', now() - interval '1 minute'
  FROM generate_series(1, 5) AS i;
INSERT INTO got SELECT 2, queue, id, attempt
  FROM gatekeeper.claim('w-fair', 100, queues => ARRAY['f_heavy', 'f_light', 'f_small']);
SELECT count(*) AS total,
       count(*) FILTER (WHERE queue = 'f_small') AS small,
       count(*) FILTER (WHERE queue = 'f_heavy') BETWEEN 71 AND 72 AS heavy_71_or_72,
       count(*) FILTER (WHERE queue = 'f_light') BETWEEN 23 AND 24 AS light_23_or_24
  FROM got WHERE round = 2;

-- the unfiltered claim shares the same way among all unpaused queues
INSERT INTO got SELECT 3, queue, id, attempt FROM gatekeeper.claim('w-fair', 40);
SELECT queue, count(*) FROM got WHERE round = 3 GROUP BY queue ORDER BY queue;

-- a paused queue's share goes to the others
SELECT gatekeeper.pause('f_heavy');
INSERT INTO got SELECT 4, queue, id, attempt
  FROM gatekeeper.claim('w-fair', 20, queues => ARRAY['f_heavy', 'f_light']);
SELECT queue, count(*) FROM got WHERE round = 4 GROUP BY queue ORDER BY queue;
SELECT gatekeeper.resume('f_heavy');

-- a batch larger than all due mail takes all of it
INSERT INTO got SELECT 5, queue, id, attempt
  FROM gatekeeper.claim('w-fair', 10000, queues => ARRAY['f_heavy', 'f_light', 'f_small']);
SELECT count(*) AS rest FROM got WHERE round = 5;
SELECT count(*) AS still_due FROM gatekeeper.mail_status
 WHERE queue IN ('f_heavy', 'f_light', 'f_small') AND state = 'scheduled';
SELECT queue, count(*) AS claimed, count(DISTINCT id) AS distinct_mails, max(attempt) AS max_attempt
  FROM got GROUP BY queue ORDER BY queue;
SELECT gatekeeper.ack_batch(array_agg(id), array_agg(attempt)) AS acked FROM got;
DROP TABLE got;

--
-- inside a queue: highest priority first, then the oldest send_at; levels
-- whose mail is not due yet are skipped
--
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, priority, send_at) VALUES
	('p10-new@example.com', 'P', 'b', 'f_prio', 10, now() - interval '1 minute'),
	('p10-old@example.com', 'P', 'b', 'f_prio', 10, now() - interval '1 hour'),
	('p5-old@example.com', 'P', 'b', 'f_prio', 5, now() - interval '2 hours'),
	('p5-new@example.com', 'P', 'b', 'f_prio', 5, now() - interval '1 minute'),
	('p0-oldest@example.com', 'P', 'b', 'f_prio', 0, now() - interval '3 hours'),
	('pneg@example.com', 'P', 'b', 'f_prio', -1, now() - interval '4 hours'),
	('p20-future@example.com', 'P', 'b', 'f_prio', 20, now() + interval '1 hour');
CREATE TEMP TABLE got (round int, recipient text, id bigint, attempt int);
INSERT INTO got SELECT 1, recipient, id, attempt FROM gatekeeper.claim('w-prio', 3, queues => ARRAY['f_prio']);
INSERT INTO got SELECT 2, recipient, id, attempt FROM gatekeeper.claim('w-prio', 2, queues => ARRAY['f_prio']);
INSERT INTO got SELECT 3, recipient, id, attempt FROM gatekeeper.claim('w-prio', 2, queues => ARRAY['f_prio']);
SELECT g.round, g.recipient, m.priority
  FROM got g JOIN gatekeeper.mail m USING (id) ORDER BY g.round, m.priority DESC, m.send_at;
-- equal priority and send_at: the lower id first
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, send_at)
SELECT format('tie%s@example.com', i), 'P', 'b', 'f_prio', '2000-01-01 00:00:00+00'
  FROM generate_series(1, 4) AS i;
INSERT INTO got SELECT 4, recipient, id, attempt FROM gatekeeper.claim('w-prio', 2, queues => ARRAY['f_prio']);
SELECT recipient FROM got WHERE round = 4 ORDER BY recipient;
SELECT gatekeeper.ack_batch(array_agg(id), array_agg(attempt)) AS acked FROM got;
DROP TABLE got;

--
-- rate limit: 10 mails a second
--
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, send_at)
SELECT format('rate%s@example.com', i), 'Rate', 'b', 'f_rate', now() - interval '1 minute'
  FROM generate_series(1, 100) AS i;
CREATE TEMP TABLE got (round int, queue text, id bigint, attempt int);
-- two claims at the same instant (one transaction): the first spends the
-- bucket, the second finds it empty
BEGIN;
INSERT INTO got SELECT 1, queue, id, attempt FROM gatekeeper.claim('w-rate', 100, queues => ARRAY['f_rate']);
INSERT INTO got SELECT 2, queue, id, attempt FROM gatekeeper.claim('w-rate', 100, queues => ARRAY['f_rate']);
COMMIT;
SELECT count(*) FILTER (WHERE round = 1) BETWEEN 1 AND 11 AS first_claim_at_most_11,
       count(*) FILTER (WHERE round = 1) >= 9 AS first_claim_uses_the_budget,
       count(*) FILTER (WHERE round = 2) AS second_claim
  FROM got;
-- right after, far less than a full bucket has come back
INSERT INTO got SELECT 2, queue, id, attempt FROM gatekeeper.claim('w-rate', 100, queues => ARRAY['f_rate']);
SELECT count(*) <= 5 AS immediate_claim_at_most_5 FROM got WHERE round = 2;
-- the bucket refills with time (at least 0.3 s: at least 3 more, never more than 10)
SELECT pg_sleep(0.3);
INSERT INTO got SELECT 3, queue, id, attempt FROM gatekeeper.claim('w-rate', 100, queues => ARRAY['f_rate']);
SELECT count(*) BETWEEN 3 AND 10 AS refilled FROM got WHERE round = 3;
-- a rate-limited queue's unused share goes to the others
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, send_at)
SELECT format('light%s@example.com', i), 'Fair', 'b', 'f_light', now() - interval '1 minute'
  FROM generate_series(201, 300) AS i;
SELECT gatekeeper.alter_queue('f_rate', rate_limit => 10);  -- also refills the bucket
INSERT INTO got SELECT 4, queue, id, attempt FROM gatekeeper.claim('w-rate', 60, queues => ARRAY['f_rate', 'f_light']);
SELECT count(*) AS total,
       count(*) FILTER (WHERE queue = 'f_rate') BETWEEN 1 AND 11 AS rate_within_limit,
       count(*) FILTER (WHERE queue = 'f_light') >= 49 AS light_takes_the_rest
  FROM got WHERE round = 4;
-- rate_limit => 0 removes the limit
SELECT gatekeeper.alter_queue('f_rate', rate_limit => 0);
SELECT rate_limit FROM gatekeeper.queue WHERE name = 'f_rate';
INSERT INTO got SELECT 5, queue, id, attempt FROM gatekeeper.claim('w-rate', 1000, queues => ARRAY['f_rate']);
SELECT (SELECT count(*) FROM got WHERE queue = 'f_rate') AS rate_claimed_in_all,
       (SELECT count(*) FROM gatekeeper.mail_status WHERE queue = 'f_rate' AND state = 'scheduled') AS left_scheduled;
SELECT gatekeeper.ack_batch(array_agg(id), array_agg(attempt)) = count(*) AS all_acked FROM got;
DROP TABLE got;

-- leave no live mail behind
SELECT count(gatekeeper.cancel_queue(name)) AS queues FROM gatekeeper.queue WHERE name LIKE 'f\_%';
SELECT count(*) AS live FROM gatekeeper.mail_status WHERE state IN ('scheduled', 'claimed');
