-- Retry by hand (issue 47, item 5; SPEC "Looking inside"): retry(id)
-- schedules a failed, expired or unknown mail again, due now, with the
-- same Message-ID; its attempt (the fencing token of its claims) only
-- grows, and the attempts before count as uncharged, so the mail has its
-- queue's max_attempts anew; the gates are passed again at its claim, as
-- for any mail.  Sent, cancelled and suppressed mail is refused (55000);
-- a mail whose dedupe key another mail holds now is refused (23505).
-- retry(queue, since) schedules again every failed mail of the queue
-- finished since then.  Both are the owner's: no use of grant() has them.
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of.inc

SELECT gatekeeper.create_gate('rt_gate', '1 hour');
SELECT gatekeeper.create_queue('rt', gates => '{rt_gate}', max_attempts => 2, retry_for => '0');

-- a mail fails (a 5xx): its gate pass is given back
SELECT gatekeeper.enqueue('a@retry.example', 'A', 'b', 'rt') AS a \gset
SELECT id = :a AS claimed_a, attempt FROM gatekeeper.claim('rt-w', 10, queues => '{rt}');
SELECT gatekeeper.gate_open('rt_gate', 'a@retry.example') AS gate_open_while_claimed;
SELECT gatekeeper.nack(:a, 1, '550 5.7.1 refused', permanent => true) AS nack;
SELECT state, attempt, message_id AS failed_message_id FROM gatekeeper.status(:a) \gset
SELECT :'state' AS state, :attempt AS attempt;
SELECT gatekeeper.gate_open('rt_gate', 'a@retry.example') AS gate_open_after_failure;

-- retried: scheduled, due now, the same Message-ID, the attempt kept
SELECT gatekeeper.retry(:a) AS retried;
SELECT state, attempt, last_error, message_id = :'failed_message_id' AS same_message_id,
	   send_at <= now() AS due_now
  FROM gatekeeper.status(:a);
SELECT state, attempt, uncharged FROM gatekeeper.mail_live WHERE id = :a;
-- status() shows the uncharged apart: attempt - uncharged were charged
SELECT state, attempt, uncharged, attempt - uncharged AS charged FROM gatekeeper.status(:a);
SELECT gatekeeper.retry(:a) AS retried_again;   -- scheduled: nothing to do
SELECT queue, scheduled, retrying, failed FROM gatekeeper.queue_stats WHERE queue = 'rt';

-- claimed again: attempt 2, the same Message-ID, the gate passed again
SELECT id = :a AS claimed_a, attempt, message_id = :'failed_message_id' AS same_message_id
  FROM gatekeeper.claim('rt-w', 10, queues => '{rt}');
SELECT gatekeeper.gate_open('rt_gate', 'a@retry.example') AS gate_open_while_claimed_again;
-- a stale claim of the first attempt changes nothing
SELECT gatekeeper.ack(:a, 1) AS stale_ack;
-- a 4xx: with the attempts anew (1 charged of 2) it is retried, not failed
SELECT gatekeeper.nack(:a, 2, '451 4.3.0 try later') AS nack_4xx;
SELECT state, attempt, uncharged, attempt - uncharged AS charged FROM gatekeeper.status(:a);

-- handed back unsent (no relay could be reached): an attempt, uncharged,
-- shown apart by status() as by mail_status
SELECT gatekeeper.create_queue('rt_down', max_attempts => 1);
SELECT gatekeeper.enqueue('down@retry.example', 'Down', 'b', 'rt_down') AS d \gset
SELECT gatekeeper.unclaim(array_agg(c.id), array_agg(c.attempt), 'no relay', '0')
  FROM gatekeeper.claim('rt-w', 10, queues => '{rt_down}') c;
SELECT state, attempt, uncharged, attempt - uncharged AS charged FROM gatekeeper.status(:d);
SELECT s.uncharged = m.uncharged AS as_mail_status
  FROM gatekeeper.status(:d) s, gatekeeper.mail_status m WHERE m.id = :d;

-- refused: sent, cancelled and suppressed mail; NULL; no such mail is false
SELECT gatekeeper.enqueue('s@retry.example', 'S', 'b') AS s \gset
SELECT gatekeeper.ack(c.id, c.attempt) AS acked FROM gatekeeper.claim('rt-w', 10, queues => '{default}') c;
SELECT regexp_replace(pg_temp.error_of(format('SELECT gatekeeper.retry(%s)', :s)), 'mail \d+', 'mail N') AS sent;
SELECT gatekeeper.enqueue('c@retry.example', 'C', 'b') AS c \gset
SELECT gatekeeper.cancel(:c) AS cancelled;
SELECT regexp_replace(pg_temp.error_of(format('SELECT gatekeeper.retry(%s)', :c)), 'mail \d+', 'mail N') AS cancelled;
SELECT gatekeeper.suppress('x@retry.example');
SELECT gatekeeper.enqueue('x@retry.example', 'X', 'b') AS x \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('rt-w', 10, queues => '{default}');
SELECT state FROM gatekeeper.status(:x);
SELECT regexp_replace(pg_temp.error_of(format('SELECT gatekeeper.retry(%s)', :x)), 'mail \d+', 'mail N') AS suppressed;
SELECT pg_temp.error_of('SELECT gatekeeper.retry(NULL::bigint)') AS null_id;
SELECT gatekeeper.retry(-1) AS no_such_mail;

-- expired: scheduled again without the deadline it missed
SELECT gatekeeper.enqueue('e@retry.example', 'E', 'b', send_at => now() - interval '2 hours',
						  send_by => now() - interval '1 hour') AS e \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('rt-w', 10, queues => '{default}');
SELECT state FROM gatekeeper.status(:e);
SELECT gatekeeper.retry(:e) AS retried;
SELECT send_by IS NULL AS deadline_lifted FROM gatekeeper.mail WHERE id = :e;
SELECT id = :e AS claimed_e, attempt FROM gatekeeper.claim('rt-w', 10, queues => '{default}');

-- unknown (an at-most-once mail whose lease ran out): the owner may send
-- it again, knowing it may have gone
SELECT gatekeeper.create_queue('rt_once', delivery => 'at_most_once');
SELECT gatekeeper.enqueue('u@retry.example', 'U', 'b', 'rt_once') AS u \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('rt-w', 10, queues => '{rt_once}');
UPDATE gatekeeper.mail_claim SET lease_until = now() - interval '1 second' WHERE queue = 'rt_once';
SELECT gatekeeper.reap() AS reaped;
SELECT state FROM gatekeeper.status(:u);
SELECT gatekeeper.retry(:u) AS retried;
SELECT id = :u AS claimed_u, attempt FROM gatekeeper.claim('rt-w', 10, queues => '{rt_once}');

-- a dedupe key another mail holds now: refused; once it does not, retried
SELECT gatekeeper.create_queue('rt_key', dedupe_window => '0');
SELECT gatekeeper.enqueue('k@retry.example', 'K1', 'b', 'rt_key', dedupe_key => 'k') AS k1 \gset
SELECT gatekeeper.nack(c.id, c.attempt, '550 no', true) FROM gatekeeper.claim('rt-w', 10, queues => '{rt_key}') c;
SELECT gatekeeper.enqueue('k@retry.example', 'K2', 'b', 'rt_key', dedupe_key => 'k') AS k2 \gset
SELECT :k2 <> :k1 AS new_mail_for_the_key;
SELECT regexp_replace(pg_temp.error_of(format('SELECT gatekeeper.retry(%s)', :k1)), 'mail \d+', 'mail N', 'g') AS key_held;
SELECT state FROM gatekeeper.status(:k1);
SELECT gatekeeper.cancel(:k2) AS cancelled_k2;
SELECT gatekeeper.retry(:k1) AS retried_k1;
SELECT gatekeeper.find('rt_key', 'k') = :k1 AS k1_holds_the_key;
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('k@retry.example', 'K3', 'b', 'rt_key', dedupe_key => 'k')$$) AS enqueue_k3;
SELECT gatekeeper.enqueue('k@retry.example', 'K3', 'b', 'rt_key', dedupe_key => 'k') = :k1 AS k3_returns_k1;

-- a queue's failed mail since a time: the earlier failure stays failed
SELECT gatekeeper.create_queue('rt_bulk', retry_for => '0');
SELECT count(gatekeeper.enqueue('old@retry.example', 'Old', 'b', 'rt_bulk')) AS enqueued;
SELECT count(gatekeeper.nack(c.id, c.attempt, '550 no', true)) AS failed
  FROM gatekeeper.claim('rt-w', 10, queues => '{rt_bulk}') c;
UPDATE gatekeeper.mail_done SET finished_at = finished_at - interval '1 day' WHERE queue = 'rt_bulk';
SELECT count(gatekeeper.enqueue('b' || i || '@retry.example', 'New', 'b', 'rt_bulk')) AS enqueued
  FROM generate_series(1, 3) AS i;
SELECT count(gatekeeper.nack(c.id, c.attempt, '550 no', true)) AS failed
  FROM gatekeeper.claim('rt-w', 10, queues => '{rt_bulk}') c;
SELECT gatekeeper.enqueue('sent@retry.example', 'Sent', 'b', 'rt_bulk') AS bs \gset
SELECT gatekeeper.ack(c.id, c.attempt) AS acked FROM gatekeeper.claim('rt-w', 10, queues => '{rt_bulk}') c;
SELECT gatekeeper.retry('rt_bulk', now() - interval '1 hour') AS retried;
SELECT s.recipient, s.state FROM gatekeeper.mail_status s
 WHERE s.queue = 'rt_bulk' ORDER BY s.recipient;
SELECT gatekeeper.retry('rt_bulk', now() - interval '1 hour') AS retried_again;
SELECT pg_temp.error_of($$SELECT gatekeeper.retry('rt_nope', now())$$) AS no_queue;
SELECT pg_temp.error_of($$SELECT gatekeeper.retry('rt_bulk', NULL)$$) AS null_since;

-- the owner's: no use of grant() gives it
CREATE ROLE regress_rt_worker;
SELECT gatekeeper.grant('regress_rt_worker', 'worker');
SELECT has_function_privilege('regress_rt_worker', 'gatekeeper.retry(bigint)', 'EXECUTE') AS worker_may_retry,
	   has_function_privilege('regress_rt_worker', 'gatekeeper.retry(text, timestamptz)', 'EXECUTE') AS worker_may_retry_queue,
	   has_function_privilege('public', 'gatekeeper.retry(bigint)', 'EXECUTE') AS public_may_retry;
DELETE FROM gatekeeper.role_grant WHERE role = 'regress_rt_worker'::regrole;
DROP OWNED BY regress_rt_worker;
DROP ROLE regress_rt_worker;
