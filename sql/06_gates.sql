-- Gates: the one-way gate, windows, frequency caps, and gates inside claim.
-- (Concurrency is tested by the isolation specs.)
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/gate_restamp.inc

-- what a gate says about a recipient, without timestamps
CREATE FUNCTION pg_temp.gate_view(recipient text)
RETURNS TABLE (gate text, open boolean, closed_until_later boolean, sends_in_period int, max_sends int)
LANGUAGE sql AS $$
	SELECT e.gate, e.open, e.next_open > now(), e.sends_in_period, e.max_sends
	  FROM gatekeeper.explain(recipient) AS e
	 WHERE e.gate LIKE 'g\_%'
	 ORDER BY e.gate
$$;

--
-- create, alter, drop
--
SELECT gatekeeper.create_gate('g_tmp', '2 hours', 2);
SELECT gatekeeper.create_gate('g_win', '1 hour');
SELECT gatekeeper.create_gate('g_cap', '7 days', 3);
SELECT gatekeeper.alter_gate('g_tmp', max_sends => 5);
SELECT name, period, max_sends FROM gatekeeper.gate WHERE name = 'g_tmp';
SELECT gatekeeper.alter_gate('g_tmp', period => '30 minutes');
SELECT name, period, max_sends FROM gatekeeper.gate WHERE name = 'g_tmp';
SELECT gatekeeper.alter_gate('g_tmp');
SELECT name, period, max_sends FROM gatekeeper.gate WHERE name = 'g_tmp';
SELECT gatekeeper.gate_pass('g_tmp', 'tmp@gates.example') AS passed;
SELECT sum(cardinality(l.recipients)) AS tmp_passes FROM gatekeeper.gate_log l JOIN gatekeeper.gate g ON g.id = l.gate
 WHERE g.name = 'g_tmp' AND NOT l.released;
SELECT gatekeeper.drop_gate('g_tmp');
SELECT count(*) AS tmp_gates FROM gatekeeper.gate WHERE name = 'g_tmp';
SELECT count(*) AS passes_of_dropped_gates FROM gatekeeper.gate_log l
 WHERE NOT EXISTS (SELECT FROM gatekeeper.gate g WHERE g.id = l.gate);

--
-- gate_pass, one recipient: true once, then false for anyone else; the
-- same holder passes again without counting twice
--
SELECT gatekeeper.gate_pass('g_win', 'one@gates.example', 101) AS first_holder;
SELECT gatekeeper.gate_pass('g_win', 'one@gates.example', 102) AS other_holder;
SELECT gatekeeper.gate_pass('g_win', 'one@gates.example') AS no_holder;
SELECT gatekeeper.gate_pass('g_win', 'one@gates.example', 101) AS same_holder_again;
SELECT * FROM pg_temp.gate_view('one@gates.example');
-- without a holder every call is a new caller
SELECT gatekeeper.gate_pass('g_win', 'anon@gates.example') AS anon1,
       gatekeeper.gate_pass('g_win', 'anon@gates.example') AS anon2;

-- a frequency cap of 3
SELECT i, gatekeeper.gate_pass('g_cap', 'cap@gates.example') AS passed
  FROM generate_series(1, 5) AS i ORDER BY i;
SELECT * FROM pg_temp.gate_view('cap@gates.example');

-- gate_pass on many recipients: who passed, in order; a recipient named
-- twice is gated twice
SELECT * FROM gatekeeper.gate_pass_batch('g_win',
	ARRAY['b1@gates.example', 'b2@gates.example', 'b1@gates.example',
	      'one@gates.example', 'B3@Gates.Example', 'b3@gates.example'])
	WITH ORDINALITY AS t(passed, nth_passed) ORDER BY nth_passed;
SELECT * FROM gatekeeper.gate_pass_batch('g_cap',
	ARRAY['c1@gates.example', 'c1@gates.example', 'c2@gates.example', 'c1@gates.example',
	      'c1@gates.example', 'cap@gates.example'])
	WITH ORDINALITY AS t(passed, nth_passed) ORDER BY nth_passed;
SELECT * FROM gatekeeper.gate_pass_batch('g_cap', '{}'::text[]);

--
-- gate_open and gate_next_open: NULL when open, the reopening when closed
--
SELECT gatekeeper.gate_open('g_win', 'nobody@gates.example') AS open,
       gatekeeper.gate_next_open('g_win', 'nobody@gates.example') AS next_open;
BEGIN;
SELECT gatekeeper.gate_pass('g_win', 'peek@gates.example', 7) AS passed;
SELECT gatekeeper.gate_open('g_win', 'peek@gates.example') AS open,
       gatekeeper.gate_next_open('g_win', 'peek@gates.example') = now() + interval '1 hour' AS reopens_in_an_hour;
COMMIT;
-- peeking changes nothing
SELECT gatekeeper.gate_open('g_win', 'peek2@gates.example') AS open,
       gatekeeper.gate_open('g_win', 'peek2@gates.example') AS still_open,
       (SELECT count(*) FROM gatekeeper.gate_log WHERE 'peek2@gates.example' = ANY (recipients)) AS rows;
-- a cap reopens when its earliest pass expires
BEGIN;
SELECT pg_temp._gate_restamp('g_cap', 'cap@gates.example',
	ARRAY[now() + interval '3 days', now() + interval '1 day', now() + interval '2 days']);
SELECT gatekeeper.gate_next_open('g_cap', 'cap@gates.example') = now() + interval '1 day' AS earliest_expiry;
ROLLBACK;

-- gate_release frees the holder's pass
SELECT gatekeeper.gate_release('g_win', 'peek@gates.example', 8) AS other_holder;
SELECT gatekeeper.gate_release('g_win', 'peek@gates.example', 7) AS released;
SELECT gatekeeper.gate_open('g_win', 'peek@gates.example') AS open_again;
SELECT gatekeeper.gate_release('g_win', 'peek@gates.example', 7) AS released_twice;
SELECT gatekeeper.gate_release('g_win', 'never@gates.example', 7) AS never_passed;
SELECT gatekeeper.gate_pass('g_win', 'peek@gates.example', 9) AS new_holder_passes;

--
-- window boundaries: a pass is live while expires > now()
--
SELECT gatekeeper.gate_pass('g_win', 'edge@gates.example', 1) AS passed;
BEGIN;
SELECT pg_temp._gate_restamp('g_win', 'edge@gates.example', ARRAY[now() + interval '1 microsecond']);
SELECT gatekeeper.gate_open('g_win', 'edge@gates.example') AS open_1us_before,
       gatekeeper.gate_next_open('g_win', 'edge@gates.example') = now() + interval '1 microsecond' AS next_open_in_1us;
SELECT gatekeeper.gate_pass('g_win', 'edge@gates.example', 2) AS pass_1us_before;
SELECT pg_temp._gate_restamp('g_win', 'edge@gates.example', ARRAY[now()]);
SELECT gatekeeper.gate_open('g_win', 'edge@gates.example') AS open_at_expiry,
       gatekeeper.gate_next_open('g_win', 'edge@gates.example') AS next_open;
SELECT e.open, e.sends_in_period FROM gatekeeper.explain('edge@gates.example') e WHERE e.gate = 'g_win';
SELECT gatekeeper.gate_pass('g_win', 'edge@gates.example', 2) AS pass_at_expiry;
SELECT gatekeeper.gate_pass('g_win', 'edge@gates.example', 3) AS pass_after_that;
COMMIT;
SELECT * FROM pg_temp.gate_view('edge@gates.example');

--
-- subtransactions: a pass made in a savepoint that is rolled back never
-- counted; a release rolled back the same way never happened
--
BEGIN;
SAVEPOINT s;
SELECT gatekeeper.gate_pass('g_win', 'sub@gates.example', 1) AS passed_in_savepoint;
ROLLBACK TO SAVEPOINT s;
SELECT gatekeeper.gate_open('g_win', 'sub@gates.example') AS open_after_rollback_to;
SELECT gatekeeper.gate_pass('g_win', 'sub@gates.example', 2) AS other_holder_passes;
SAVEPOINT t;
SELECT gatekeeper.gate_release('g_win', 'sub@gates.example', 2) AS released_in_savepoint;
SELECT gatekeeper.gate_open('g_win', 'sub@gates.example') AS open_in_savepoint;
ROLLBACK TO SAVEPOINT t;
SELECT gatekeeper.gate_open('g_win', 'sub@gates.example') AS closed_again;
SAVEPOINT u;
SELECT gatekeeper.gate_pass('g_cap', 'sub@gates.example', 3) AS cap_in_savepoint;
RELEASE SAVEPOINT u;
COMMIT;
SELECT * FROM pg_temp.gate_view('sub@gates.example');
SELECT gatekeeper.gate_pass('g_win', 'sub@gates.example', 2) AS holder_2_holds_it;

-- a transaction that passed a gate cannot be prepared (its pass would
-- survive a restart only in an uncommitted log row); it is rolled back
BEGIN;
SELECT gatekeeper.gate_pass('g_win', 'prepared@gates.example', 1) AS passed;
PREPARE TRANSACTION 'gk_gates';
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT gatekeeper.gate_open('g_win', 'prepared@gates.example') AS open_after_refused_prepare;

--
-- a pass keeps the period it was stamped with
--
SELECT gatekeeper.create_gate('g_stamp', '2 hours');
SELECT gatekeeper.gate_pass('g_stamp', 'stamp@gates.example') AS passed;
SELECT gatekeeper.gate_next_open('g_stamp', 'stamp@gates.example') AS before_alter \gset
SELECT gatekeeper.alter_gate('g_stamp', period => '1 hour');
SELECT gatekeeper.gate_next_open('g_stamp', 'stamp@gates.example') = :'before_alter'::timestamptz AS timer_unchanged;
SELECT gatekeeper.alter_gate('g_stamp', period => '5 hours');
SELECT gatekeeper.gate_next_open('g_stamp', 'stamp@gates.example') = :'before_alter'::timestamptz AS timer_still_unchanged;
-- a new pass takes the new period
BEGIN;
SELECT gatekeeper.gate_pass('g_stamp', 'stamp2@gates.example') AS passed;
SELECT gatekeeper.gate_next_open('g_stamp', 'stamp2@gates.example') = now() + interval '5 hours' AS new_period;
COMMIT;
-- raising max_sends opens a closed gate; lowering it closes one
SELECT gatekeeper.alter_gate('g_stamp', max_sends => 2);
SELECT gatekeeper.gate_open('g_stamp', 'stamp@gates.example') AS open_with_2;
SELECT gatekeeper.alter_gate('g_stamp', max_sends => 1);
SELECT gatekeeper.gate_open('g_stamp', 'stamp@gates.example') AS open_with_1;

--
-- recipients are keyed case-insensitively: Alice@X.com and alice@x.com
-- share one window
--
SELECT gatekeeper.gate_pass('g_win', 'Alice@Case.Example', 1) AS mixed_case;
SELECT gatekeeper.gate_pass('g_win', 'alice@case.example', 2) AS lower_case;
SELECT gatekeeper.gate_pass('g_win', 'ALICE@CASE.EXAMPLE', 1) AS same_holder_upper_case;
SELECT * FROM pg_temp.gate_view('aLiCe@case.example');
SELECT DISTINCT r AS recipient FROM gatekeeper.gate_log, unnest(recipients) AS r
 WHERE lower(r) = 'alice@case.example' ORDER BY 1;

--
-- explain: every gate's view of one recipient
--
SELECT gatekeeper.gate_pass('g_win', 'two@gates.example', 1) AS win,
       gatekeeper.gate_pass('g_cap', 'two@gates.example', 1) AS cap1,
       gatekeeper.gate_pass('g_cap', 'two@gates.example', 2) AS cap2;
SELECT * FROM pg_temp.gate_view('two@gates.example');
SELECT gate, open, next_open, sends_in_period, max_sends
  FROM gatekeeper.explain('untouched@gates.example') WHERE gate IN ('g_cap', 'g_win', 'smart_sending') ORDER BY gate;

--
-- gates inside claim
--
SELECT gatekeeper.create_queue('g_sup', gates => ARRAY['g_win']);
SELECT gatekeeper.create_queue('g_def', gates => ARRAY['g_win'], on_gate_closed => 'defer');
SELECT gatekeeper.create_queue('g_both', gates => ARRAY['g_win', 'g_cap']);
SELECT gatekeeper.create_queue('g_capq', gates => ARRAY['g_cap']);
SELECT gatekeeper.create_queue('g_once', gates => ARRAY['g_win'], max_attempts => 1);
SELECT name, gates, on_gate_closed FROM gatekeeper.queue WHERE name LIKE 'g\_%' ORDER BY name;

-- a mail passes: it holds the pass, for the gate's period from its claim
SELECT gatekeeper.enqueue('claim1@gates.example', 'S', 'b', 'g_sup') AS m1 \gset
BEGIN;
SELECT id = :m1 AS claimed FROM gatekeeper.claim('w-gate', 10, queues => ARRAY['g_sup']);
SELECT gatekeeper.gate_next_open('g_win', 'claim1@gates.example') = now() + interval '1 hour' AS window_from_claim;
COMMIT;
SELECT l.holders = ARRAY[:m1]::bigint[] AS held_by_mail FROM gatekeeper.gate_log l
  JOIN gatekeeper.gate g ON g.id = l.gate
 WHERE g.name = 'g_win' AND l.recipients = ARRAY['claim1@gates.example'] AND NOT l.released;
SELECT gatekeeper.ack(:m1, 1) AS acked;

-- suppress: the gate is closed, the mail is suppressed and not returned
SELECT gatekeeper.enqueue('claim1@gates.example', 'S2', 'b', 'g_sup') AS m2 \gset
SELECT count(*) AS returned FROM gatekeeper.claim('w-gate', 10, queues => ARRAY['g_sup']);
SELECT state, attempt, last_error, lease_until IS NULL AS no_lease, finished_at IS NOT NULL AS finished
  FROM gatekeeper.mail_status WHERE id = :m2;

-- defer: the mail waits for the gate's next opening, its attempt restored
SELECT gatekeeper.enqueue('claim1@gates.example', 'D', 'b', 'g_def') AS d1 \gset
SELECT count(*) AS returned FROM gatekeeper.claim('w-gate', 10, queues => ARRAY['g_def']);
SELECT state, attempt, last_error, lease_until IS NULL AS no_lease, finished_at IS NULL AS not_finished,
       send_at = gatekeeper.gate_next_open('g_win', 'claim1@gates.example') AS deferred_to_reopening
  FROM gatekeeper.mail_status WHERE id = :d1;
-- not due again until then
SELECT count(*) AS returned FROM gatekeeper.claim('w-gate', 10, queues => ARRAY['g_def']);
-- at the reopening it goes
SELECT pg_temp._gate_restamp('g_win', 'claim1@gates.example', ARRAY[now() - interval '1 second']);
UPDATE gatekeeper.mail SET send_at = now() WHERE id = :d1;
SELECT id = :d1 AS deferred_mail, attempt FROM gatekeeper.claim('w-gate', 10, queues => ARRAY['g_def']);
SELECT gatekeeper.ack(:d1, 1) AS acked;
-- a retried mail deferred at its next claim gets its attempt count back
SELECT gatekeeper.enqueue('def2@gates.example', 'D3', 'b', 'g_def') AS d3 \gset
SELECT id = :d3 AS claimed, attempt FROM gatekeeper.claim('w-gate', 10, queues => ARRAY['g_def']);
SELECT gatekeeper.nack(:d3, 1, '421 later') AS nack;
-- meanwhile someone else takes the window
SELECT gatekeeper.gate_release('g_win', 'def2@gates.example', :d3) AS released,
       gatekeeper.gate_pass('g_win', 'def2@gates.example', 999) AS taken;
UPDATE gatekeeper.mail SET send_at = now() WHERE id = :d3;
SELECT count(*) AS returned FROM gatekeeper.claim('w-gate', 10, queues => ARRAY['g_def']);
SELECT state, attempt, send_at = gatekeeper.gate_next_open('g_win', 'def2@gates.example') AS deferred_to_reopening
  FROM gatekeeper.mail_status WHERE id = :d3;
-- deferred past send_by: expired
SELECT gatekeeper.enqueue('claim1@gates.example', 'D2', 'b', 'g_def', send_by => now() + interval '10 minutes') AS d2 \gset
SELECT count(*) AS returned FROM gatekeeper.claim('w-gate', 10, queues => ARRAY['g_def']);
SELECT state, attempt, last_error, finished_at IS NOT NULL AS finished FROM gatekeeper.mail_status WHERE id = :d2;

-- two due mails for one recipient in one batch: the first (priority, then
-- send_at) goes, the other is suppressed
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, send_at, priority) VALUES
	('pair@gates.example', 'newer', 'b', 'g_sup', now() - interval '1 minute', 0),
	('PAIR@gates.example', 'older', 'b', 'g_sup', now() - interval '2 minutes', 0),
	('pair@gates.example', 'urgent', 'b', 'g_sup', now(), 5),
	('solo@gates.example', 'solo', 'b', 'g_sup', now(), 0);
SELECT recipient, subject FROM gatekeeper.claim('w-gate', 10, queues => ARRAY['g_sup']) ORDER BY recipient;
SELECT recipient, subject, state, last_error FROM gatekeeper.mail_status
 WHERE lower(recipient) IN ('pair@gates.example', 'solo@gates.example') ORDER BY subject;
-- across queues too: two queues sharing a gate, one claim over both
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, send_at) VALUES
	('cross@gates.example', 'from g_sup', 'b', 'g_sup', now() - interval '2 minutes'),
	('cross@gates.example', 'from g_def', 'b', 'g_def', now() - interval '1 minute');
SELECT queue, subject FROM gatekeeper.claim('w-gate', 10, queues => ARRAY['g_sup', 'g_def']) ORDER BY queue;
SELECT queue, state, last_error, send_at > now() AS deferred FROM gatekeeper.mail_status
 WHERE recipient = 'cross@gates.example' ORDER BY queue;
-- a cap of 3: three of four go
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, send_at)
SELECT 'four@gates.example', format('mail %s', i), 'b', 'g_capq', now() - i * interval '1 minute'
  FROM generate_series(1, 4) AS i;
SELECT subject FROM gatekeeper.claim('w-gate', 10, queues => ARRAY['g_capq']) ORDER BY subject;
SELECT subject, state FROM gatekeeper.mail_status WHERE recipient = 'four@gates.example' ORDER BY subject;
SELECT * FROM pg_temp.gate_view('four@gates.example');

-- two gates (AND): a mail that fails the second gate takes no pass from the first
SELECT gatekeeper.gate_pass('g_win', 'and@gates.example') AS win_taken;
SELECT * FROM pg_temp.gate_view('and@gates.example');
SELECT gatekeeper.enqueue('and@gates.example', 'AND', 'b', 'g_both') AS a1 \gset
SELECT count(*) AS returned FROM gatekeeper.claim('w-gate', 10, queues => ARRAY['g_both']);
SELECT state, last_error FROM gatekeeper.mail_status WHERE id = :a1;
SELECT * FROM pg_temp.gate_view('and@gates.example');
-- and one that passes both holds a pass in each
SELECT gatekeeper.enqueue('and2@gates.example', 'AND', 'b', 'g_both') AS a2 \gset
SELECT id = :a2 AS passed_both FROM gatekeeper.claim('w-gate', 10, queues => ARRAY['g_both']);
SELECT * FROM pg_temp.gate_view('and2@gates.example');

-- a retry re-passes without counting twice
SELECT gatekeeper.nack(:a2, 1, '421 later') AS nack;
SELECT * FROM pg_temp.gate_view('and2@gates.example');
UPDATE gatekeeper.mail SET send_at = now() WHERE id = :a2;
SELECT id = :a2 AS retried, attempt FROM gatekeeper.claim('w-gate', 10, queues => ARRAY['g_both']);
SELECT * FROM pg_temp.gate_view('and2@gates.example');
-- a permanent failure releases the passes it held, in every gate
SELECT gatekeeper.nack(:a2, 2, '554 5.7.1 rejected', permanent => true) AS nack_permanent;
SELECT * FROM pg_temp.gate_view('and2@gates.example');
-- so the next mail for that recipient goes
SELECT gatekeeper.enqueue('and2@gates.example', 'AND next', 'b', 'g_both') AS a3 \gset
SELECT id = :a3 AS next_mail_goes FROM gatekeeper.claim('w-gate', 10, queues => ARRAY['g_both']);
SELECT gatekeeper.ack(:a3, 1) AS acked;

-- a lease that ran out with attempts spent: failed, and the passes released
SELECT gatekeeper.enqueue('reaped@gates.example', 'R', 'b', 'g_once') AS r1 \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('w-gate', 10, queues => ARRAY['g_once']);
UPDATE gatekeeper.mail_claim c SET lease_until = now() - interval '1 second'
 WHERE EXISTS (SELECT FROM unnest(c.mails) r WHERE r.id = :r1);
SELECT gatekeeper.reap() AS reaped;
SELECT state FROM gatekeeper.mail_status WHERE id = :r1;
SELECT * FROM pg_temp.gate_view('reaped@gates.example');
-- a lease that ran out with attempts left: the mail keeps its pass for its retry
SELECT gatekeeper.enqueue('reaped2@gates.example', 'R', 'b', 'g_sup') AS r2 \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('w-gate', 10, queues => ARRAY['g_sup']);
UPDATE gatekeeper.mail_claim c SET lease_until = now() - interval '1 second'
 WHERE EXISTS (SELECT FROM unnest(c.mails) r WHERE r.id = :r2);
SELECT gatekeeper.reap() AS reaped;
SELECT state FROM gatekeeper.mail_status WHERE id = :r2;
SELECT * FROM pg_temp.gate_view('reaped2@gates.example');
SELECT id = :r2 AS reclaimed, attempt FROM gatekeeper.claim('w-gate', 10, queues => ARRAY['g_sup']);
-- and a retry that misses its send_by expires and gives its pass back
SELECT gatekeeper.nack(:r2, 2, '421 later') AS nack;
UPDATE gatekeeper.mail SET send_at = now() - interval '2 hours', send_by = now() - interval '1 hour' WHERE id = :r2;
SELECT count(*) AS returned FROM gatekeeper.claim('w-gate', 10, queues => ARRAY['g_sup']);
SELECT state FROM gatekeeper.mail_status WHERE id = :r2;
SELECT * FROM pg_temp.gate_view('reaped2@gates.example');

-- gate_release by mail id frees a claimed mail's pass (an application's own cleanup)
SELECT gatekeeper.enqueue('rel@gates.example', 'Rel', 'b', 'g_sup') AS rel \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('w-gate', 10, queues => ARRAY['g_sup']);
SELECT gatekeeper.gate_release('g_win', 'REL@gates.example', :rel) AS released;
SELECT gatekeeper.gate_open('g_win', 'rel@gates.example') AS open;
SELECT gatekeeper.ack(:rel, 1) AS acked;

-- an ungated queue never touches the gates
SELECT count(*) AS passes FROM gatekeeper.gate_log \gset
SELECT gatekeeper.enqueue('ungated@gates.example', 'U', 'b') AS u1 \gset
SELECT gatekeeper.enqueue('ungated@gates.example', 'U', 'b') AS u2 \gset
SELECT count(*) AS returned FROM gatekeeper.claim('w-gate', 10, queues => ARRAY['default']);
SELECT gatekeeper.nack(:u1, 1, '554 no', true) AS nack_permanent, gatekeeper.ack(:u2, 1) AS acked;
SELECT count(*) - :passes AS new_pass_rows FROM gatekeeper.gate_log;
SELECT count(*) AS rows_for_ungated FROM gatekeeper.gate_log WHERE 'ungated@gates.example' = ANY (recipients);

-- a failed mail gives back the passes it holds even when its queue no longer
-- has those gates: by what the mail holds, after nack and after reap
SELECT gatekeeper.create_queue('g_moved', gates => '{g_win}', max_attempts => 1);
SELECT gatekeeper.enqueue('moved@gates.example', 'M', 'b', 'g_moved') AS moved \gset
SELECT gatekeeper.enqueue('moved2@gates.example', 'M', 'b', 'g_moved') AS moved2 \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('w-gate', 10, '1 millisecond', ARRAY['g_moved']);
SELECT gatekeeper.alter_queue('g_moved', gates => '{}');
SELECT gatekeeper.gate_open('g_win', 'moved@gates.example') AS open_before,
       gatekeeper.gate_open('g_win', 'moved2@gates.example') AS open_before2;
SELECT gatekeeper.nack(:moved, 1, '554 5.7.1 rejected', true) AS nacked;
SELECT gatekeeper.gate_open('g_win', 'moved@gates.example') AS open_after_nack;
SELECT pg_sleep(0.01);
SELECT gatekeeper.reap() >= 1 AS reaped;
SELECT state FROM gatekeeper.mail_status WHERE id = :moved2;
SELECT gatekeeper.gate_open('g_win', 'moved2@gates.example') AS open_after_reap;

-- dropping a gate removes it from view, with its passes
SELECT gatekeeper.drop_gate('g_stamp');
SELECT count(*) AS passes_of_dropped_gates FROM gatekeeper.gate_log l
 WHERE NOT EXISTS (SELECT FROM gatekeeper.gate g WHERE g.id = l.gate);

SELECT queue, scheduled, claimed, sent, failed, suppressed, expired
  FROM gatekeeper.queue_stats WHERE queue LIKE 'g\_%' ORDER BY queue;

-- leave no live mail behind
SELECT count(gatekeeper.cancel_queue(name)) AS queues FROM gatekeeper.queue WHERE name LIKE 'g\_%';
SELECT count(*) FILTER (WHERE gatekeeper.ack(id, attempt)) AS acked FROM gatekeeper.mail_status WHERE state = 'claimed';
SELECT count(*) AS live FROM gatekeeper.mail_status WHERE state IN ('scheduled', 'claimed');
