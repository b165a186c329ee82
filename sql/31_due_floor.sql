-- The due floor (src/due_floor.c): a claim starts its walk of mail_due at
-- its queue's floor, past the dead entries of mail claimed before, and the
-- writers of mail_live lower the floor.  Mail that arrives below a raised
-- floor is claimed by the next claim: new mail due earlier (the insert
-- trigger's direct writer), mail of a higher priority, a scheduled mail
-- moved earlier (an UPDATE of mail_live, through the live counts' trigger).
SET client_min_messages = warning;
\set VERBOSITY terse
SELECT gatekeeper.create_queue('df');

-- 300 due mails and one due tomorrow, where the floor will stop
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
SELECT 'df', 'df' || i || '@example.com', 'S' || i, 'b', now() - interval '1 minute'
  FROM generate_series(1, 300) i;
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
VALUES ('df', 'ahead@example.com', 'ahead', 'b', now() + interval '1 day')
RETURNING id AS ahead \gset

-- claimed and acked in three claims, each its own transaction
CREATE TEMP TABLE got (id bigint, attempt int);
INSERT INTO got SELECT id, attempt FROM gatekeeper.claim('w', 100, queues => ARRAY['df']);
INSERT INTO got SELECT id, attempt FROM gatekeeper.claim('w', 100, queues => ARRAY['df']);
INSERT INTO got SELECT id, attempt FROM gatekeeper.claim('w', 100, queues => ARRAY['df']);
SELECT count(*) AS claimed, count(DISTINCT id) AS distinct_mails FROM got;
SELECT gatekeeper.ack_batch(array_agg(id), array_agg(attempt)) AS acked FROM got;
-- nothing due: these claims walk past the dead entries and raise the floor
SELECT count(*) AS nothing_due FROM gatekeeper.claim('w', 10, queues => ARRAY['df']);
SELECT count(*) AS nothing_due FROM gatekeeper.claim('w', 10, queues => ARRAY['df']);

-- new mail due an hour ago, below the floor: the next claim takes it
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
VALUES ('df', 'early@example.com', 'early', 'b', now() - interval '1 hour')
RETURNING id AS early \gset
SELECT id = :early AS early_claimed, count(*) OVER () AS claimed
  FROM gatekeeper.claim('w', 10, queues => ARRAY['df']);
SELECT count(*) AS nothing_due FROM gatekeeper.claim('w', 10, queues => ARRAY['df']);

-- new mail of a higher priority, due now
SELECT gatekeeper.enqueue('urgent@example.com', 'urgent', 'b', 'df', priority => 5) AS urgent \gset
SELECT id = :urgent AS urgent_claimed, count(*) OVER () AS claimed
  FROM gatekeeper.claim('w', 10, queues => ARRAY['df']);
SELECT count(*) AS nothing_due FROM gatekeeper.claim('w', 10, queues => ARRAY['df']);

-- the mail due tomorrow, where the floor stands, moved two hours back
UPDATE gatekeeper.mail SET send_at = now() - interval '2 hours' WHERE id = :ahead;
SELECT id = :ahead AS ahead_claimed, count(*) OVER () AS claimed
  FROM gatekeeper.claim('w', 10, queues => ARRAY['df']);
SELECT count(*) AS left_live FROM gatekeeper.mail_live WHERE queue = 'df';

-- a claim that rolls back: the rows its transaction deleted come back, so
-- a later claim in the same transaction must not walk the floor past them
SELECT gatekeeper.create_queue('dfr');
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
SELECT 'dfr', 'dfr' || i || '@example.com', 'S' || i, 'b', now() - interval '1 minute'
  FROM generate_series(1, 5) i;
BEGIN;
SELECT count(*) AS claimed FROM gatekeeper.claim('w', 3, queues => ARRAY['dfr']);
SELECT count(*) AS claimed FROM gatekeeper.claim('w', 10, queues => ARRAY['dfr']);
SELECT count(*) AS nothing_due FROM gatekeeper.claim('w', 10, queues => ARRAY['dfr']);
ROLLBACK;
SELECT count(*) AS claimed_after_rollback FROM gatekeeper.claim('w', 10, queues => ARRAY['dfr']);
