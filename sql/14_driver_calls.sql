-- Calls as a driver makes them (issue 13): node-postgres and psycopg send
-- parameters untyped, so every public function must resolve without casts;
-- the batch calls (ack_batch, nack_batch, gate_pass_batch) replace 0.1.0's
-- array overloads; gate calls validate their recipient like a mail's;
-- cancel(queue, dedupe_key) cancels by the application's own key.
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of.inc

--
-- (a) no two functions of the schema can be called with the same number of
-- arguments (arguments with defaults counted both ways): none
--
SELECT a.oid::regprocedure AS function, b.oid::regprocedure AS overloaded_by
  FROM pg_proc a
  JOIN pg_proc b ON b.pronamespace = a.pronamespace AND b.proname = a.proname AND b.oid > a.oid
 WHERE a.pronamespace = 'gatekeeper'::regnamespace
   AND int4range(a.pronargs - a.pronargdefaults, a.pronargs, '[]')
	   && int4range(b.pronargs - b.pronargdefaults, b.pronargs, '[]')
 ORDER BY 1, 2;

-- the 0.1.0 array overloads are gone; their batch replacements are there
SELECT to_regprocedure('gatekeeper.ack(bigint[], int[])') AS ack_array,
       to_regprocedure('gatekeeper.gate_pass(text, text[])') AS gate_pass_array;
SELECT to_regprocedure('gatekeeper.ack_batch(bigint[], int[])') IS NOT NULL AS ack_batch,
       to_regprocedure('gatekeeper.nack_batch(bigint[], int[], text[], boolean)') IS NOT NULL AS nack_batch,
       to_regprocedure('gatekeeper.gate_pass_batch(text, text[])') IS NOT NULL AS gate_pass_batch,
       to_regprocedure('gatekeeper.cancel(text, text)') IS NOT NULL AS cancel_by_key;

--
-- (b) every public function, called with untyped parameters ($1, $2, ...)
-- for each number of arguments it takes, is prepared without error
--
CREATE TEMP TABLE unresolved (call text, sqlstate text, message text);
DO $$
DECLARE
	f record;
	n int;
	st text;
	m text;
BEGIN
	FOR f IN
		SELECT p.proname, p.pronargs, p.pronargdefaults
		  FROM pg_proc p
		 WHERE p.pronamespace = 'gatekeeper'::regnamespace AND p.proname !~ '^_'
		   AND p.prokind = 'f' AND p.prorettype <> 'trigger'::regtype
	LOOP
		FOR n IN f.pronargs - f.pronargdefaults .. f.pronargs LOOP
			BEGIN
				EXECUTE format('PREPARE gk_probe AS SELECT * FROM gatekeeper.%I(%s)', f.proname,
							   (SELECT coalesce(string_agg('$' || i, ', '), '') FROM generate_series(1, n) AS i));
				DEALLOCATE gk_probe;
			EXCEPTION WHEN OTHERS THEN
				GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, m = MESSAGE_TEXT;
				INSERT INTO unresolved VALUES (format('%s/%s', f.proname, n), st, m);
			END;
		END LOOP;
	END LOOP;
END
$$;
SELECT * FROM unresolved ORDER BY call;

-- the hot path, as a driver prepares it
SELECT gatekeeper.create_queue('drv', max_attempts => 3);
PREPARE enq AS SELECT gatekeeper.enqueue($1, $2, $3, $4, dedupe_key => $5);
PREPARE enq3 AS SELECT gatekeeper.enqueue($1, $2, $3);
PREPARE clm AS SELECT attempt, recipient FROM gatekeeper.claim($1, $2, $3, $4) ORDER BY id;
PREPARE clm2 AS SELECT count(*) FROM gatekeeper.claim($1, $2);
PREPARE ack1 AS SELECT gatekeeper.ack($1, $2);
PREPARE ackb AS SELECT gatekeeper.ack_batch($1, $2);
PREPARE nack3 AS SELECT gatekeeper.nack($1, $2, $3);
PREPARE nack4 AS SELECT gatekeeper.nack($1, $2, $3, $4);
PREPARE nackb3 AS SELECT gatekeeper.nack_batch($1, $2, $3);
PREPARE nackb4 AS SELECT gatekeeper.nack_batch($1, $2, $3, $4);
PREPARE ext AS SELECT gatekeeper.extend($1, $2, $3);
PREPARE unc AS SELECT gatekeeper.unclaim($1, $2, $3, $4);
PREPARE gp2 AS SELECT gatekeeper.gate_pass($1, $2);
PREPARE gp3 AS SELECT gatekeeper.gate_pass($1, $2, $3);
PREPARE gpb AS SELECT * FROM gatekeeper.gate_pass_batch($1, $2) AS passed;
PREPARE cnl AS SELECT gatekeeper.cancel($1);
PREPARE cnlk AS SELECT gatekeeper.cancel($1, $2);
PREPARE st AS SELECT queue, state, attempt FROM gatekeeper.status($1);
PREPARE fnd AS SELECT gatekeeper.find($1, $2);
PREPARE hist AS SELECT queue, state, subject FROM gatekeeper.history($1, $2);
PREPARE hist1 AS SELECT count(*) FROM gatekeeper.history($1);
PREPARE nxt AS SELECT gatekeeper.next_due($1) IS NOT NULL AS has_due;

-- and runs it, every value a text literal
EXECUTE enq('d1@drivers.example', 'One', 'b', 'drv', 'key-1') \gset d1_
EXECUTE enq('d1@drivers.example', 'One again', 'b', 'drv', 'key-1') \gset again_
SELECT :d1_enqueue = :again_enqueue AS deduplicated;
EXECUTE fnd('drv', 'key-1') \gset found_
SELECT :d1_enqueue = :found_find AS found_by_key;
\set d1 :d1_enqueue
EXECUTE enq('d2@drivers.example', 'Two', 'b', 'drv', 'key-2') \gset
EXECUTE enq('d3@drivers.example', 'Three', 'b', 'drv', NULL) \gset
EXECUTE enq('d4@drivers.example', 'Four', 'b', 'drv', 'key-4') \gset
EXECUTE enq3('d5@drivers.example', 'Five', 'b') \gset
EXECUTE st(:'d1');
EXECUTE hist('d1@drivers.example', '-infinity');
EXECUTE hist1('d1@drivers.example');
EXECUTE nxt('{drv}');
-- cancel by the application's key: true once, then false; cancel by id
EXECUTE cnlk('drv', 'key-4');
EXECUTE cnlk('drv', 'key-4');
EXECUTE cnlk('drv', 'no-such-key');
SELECT state FROM gatekeeper.status(gatekeeper.find('drv', 'key-4'));
EXECUTE cnl(gatekeeper.find('default', 'none'));  -- NULL id: an error
EXECUTE clm('drv-w', '10', '5 minutes', '{drv}');
SELECT '{' || string_agg(id::text, ',' ORDER BY id) || '}' AS ids,
       '{' || string_agg(attempt::text, ',' ORDER BY id) || '}' AS attempts
  FROM gatekeeper.mail_status WHERE queue = 'drv' AND state = 'claimed' \gset
-- empty batches, as every sender loop sends them
EXECUTE ackb('{}', '{}');
EXECUTE nackb3('{}', '{}', '{}');
EXECUTE nackb4('{}', '{}', '{}', 'true');
EXECUTE unc('{}', '{}', 'none', '0');
EXECUTE ext(:'d1', '1', '10 minutes');
EXECUTE nack3(:'d1', '1', '451 later');
EXECUTE ackb(:'ids', :'attempts');
SELECT recipient, state FROM gatekeeper.mail_status WHERE queue = 'drv' ORDER BY id;
EXECUTE ack1(:'d1', '1');  -- stale: nacked already
EXECUTE nack4(:'d1', '1', '550 5.1.1 gone', 'true');
-- gates: the scalar and the batch call, a bad recipient refused
EXECUTE gp2('smart_sending', 'g1@drivers.example');
EXECUTE gp3('smart_sending', 'g1@drivers.example', '7');
EXECUTE gpb('smart_sending', '{g1@drivers.example,g2@drivers.example,g3@drivers.example}');
EXECUTE gpb('smart_sending', '{}');
-- what node-postgres makes of a JavaScript array passed to gate_pass: refused
EXECUTE gp2('smart_sending', '{"g4@drivers.example","g5@drivers.example"}');
SELECT gatekeeper.gate_open('smart_sending', 'g4@drivers.example') AS g4_open,
       gatekeeper.gate_open('smart_sending', 'g5@drivers.example') AS g5_open;

--
-- ack_batch and nack_batch: bad arrays are refused, and nothing is written
--
SELECT count(gatekeeper.enqueue(format('b%s@drivers.example', i), 'Batch', 'b', 'drv')) AS enqueued
  FROM generate_series(1, 6) AS i;
CREATE TEMP TABLE bc AS SELECT id, attempt, recipient FROM gatekeeper.claim('drv-w', 10, queues => '{drv}');
SELECT count(*) AS claimed FROM bc;
SELECT min(id) AS b1, max(id) AS b6 FROM bc \gset
SELECT pg_temp.error_of($$SELECT gatekeeper.ack_batch('{1,2}', '{1}')$$) AS ack_lengths;
SELECT pg_temp.error_of(format('SELECT gatekeeper.ack_batch(%L, %L)', '{' || :b1 || ',NULL}', '{1,1}')) AS ack_null_id;
SELECT pg_temp.error_of(format('SELECT gatekeeper.ack_batch(%L, %L)', '{' || :b1 || '}', '{NULL}')) AS ack_null_attempt;
SELECT pg_temp.error_of($$SELECT gatekeeper.ack_batch(NULL, '{}')$$) AS ack_null_ids;
SELECT pg_temp.error_of($$SELECT gatekeeper.ack_batch('{{1},{2}}', '{{1},{1}}')$$) AS ack_two_dimensions;
SELECT pg_temp.error_of($$SELECT gatekeeper.nack_batch('{1,2}', '{1,1}', '{x}')$$) AS nack_lengths;
SELECT pg_temp.error_of($$SELECT gatekeeper.nack_batch('{1}', '{1,1}', '{x}')$$) AS nack_lengths_2;
SELECT pg_temp.error_of(format('SELECT gatekeeper.nack_batch(%L, %L, %L)', '{' || :b1 || ',NULL}', '{1,1}', '{x,y}')) AS nack_null_id;
SELECT pg_temp.error_of(format('SELECT gatekeeper.nack_batch(%L, %L, %L)', '{' || :b1 || ',' || :b6 || '}', '{1,1}', '{x,NULL}')) AS nack_null_error;
SELECT pg_temp.error_of($$SELECT gatekeeper.nack_batch('{1}', NULL, '{x}')$$) AS nack_null_attempts;
SELECT pg_temp.error_of($$SELECT gatekeeper.nack_batch('{1}', '{1}', NULL)$$) AS nack_null_errors;
SELECT pg_temp.error_of($$SELECT gatekeeper.nack_batch('{1}', '{1}', '{x}', NULL)$$) AS nack_null_permanent;
SELECT pg_temp.error_of($$SELECT gatekeeper.nack_batch('{{1}}', '{{1}}', '{{x}}')$$) AS nack_two_dimensions;
-- unclaim hands claims back as a batch too: no NULL elements either
SELECT pg_temp.error_of(format('SELECT gatekeeper.unclaim(%L, %L, %L, %L)', '{' || :b1 || ',NULL}', '{1,1}', 'x', '0')) AS unclaim_null_id;
SELECT pg_temp.error_of(format('SELECT gatekeeper.unclaim(%L, %L, %L, %L)', '{' || :b1 || '}', '{NULL}', 'x', '0')) AS unclaim_null_attempt;
-- a good element ahead of a bad one was not reported
SELECT state, count(*) FROM gatekeeper.mail_status WHERE id IN (SELECT id FROM bc) GROUP BY state;

-- nack_batch as nack, element by element: a retry backs off, a stale or
-- repeated element counts nothing
SELECT gatekeeper.nack_batch(ARRAY[:b1, :b1, :b1 + 1, :b1 + 1], ARRAY[1, 1, 1, 2],
                             ARRAY['451 a', '451 b', '451 c', '451 stale']) AS nacked;
SELECT id - :b1 AS n, state, attempt, last_error, send_at > now() AS backed_off
  FROM gatekeeper.mail_status WHERE id IN (:b1, :b1 + 1) ORDER BY id;
-- permanent: failed at once; a mailbox that does not exist is suppressed,
-- a policy refusal is not
SELECT gatekeeper.nack_batch(ARRAY[:b1 + 3, :b1 + 2], ARRAY[1, 1],
                             ARRAY['554 5.7.1 policy', '550 5.1.1 no such user'], true) AS failed;
SELECT id - :b1 AS n, state, last_error FROM gatekeeper.mail_status WHERE id IN (:b1 + 2, :b1 + 3) ORDER BY id;
SELECT address, reason, detail, mail_id - :b1 AS n FROM gatekeeper.suppression
 WHERE address LIKE 'b%@drivers.example' ORDER BY address;
SELECT gatekeeper.ack_batch(ARRAY[:b1 + 4, :b1 + 5, :b1 + 4], ARRAY[1, 1, 1]) AS acked;
SELECT state, count(*) FROM gatekeeper.mail_status WHERE id IN (SELECT id FROM bc) GROUP BY state ORDER BY state;

-- attempts spent: failed, and the gate passes the mail held are given back
SELECT gatekeeper.create_queue('drv_gated', gates => '{smart_sending}', max_attempts => 1, retry_for => '0');
SELECT gatekeeper.enqueue('held1@drivers.example', 'Held', 'b', 'drv_gated') AS h1,
       gatekeeper.enqueue('held2@drivers.example', 'Held', 'b', 'drv_gated') AS h2 \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('drv-w', 10, queues => '{drv_gated}');
SELECT gatekeeper.gate_open('smart_sending', 'held1@drivers.example') AS held1_open,
       gatekeeper.gate_open('smart_sending', 'held2@drivers.example') AS held2_open;
SELECT gatekeeper.nack_batch(ARRAY[:h2, :h1], '{1,1}', '{"421 busy","421 busy"}') AS nacked;
SELECT state, count(*) FROM gatekeeper.mail_status WHERE queue = 'drv_gated' GROUP BY state;
SELECT gatekeeper.gate_open('smart_sending', 'held1@drivers.example') AS held1_open,
       gatekeeper.gate_open('smart_sending', 'held2@drivers.example') AS held2_open;

--
-- gate calls take a recipient only if a mail could have it
--
SELECT count(*) AS gate_log_before FROM gatekeeper.gate_log \gset
SELECT pg_temp.error_of($$SELECT gatekeeper.gate_pass('smart_sending', 'not an address at all')$$) AS gate_pass;
SELECT pg_temp.error_of($$SELECT gatekeeper.gate_pass('smart_sending', 'x@y@', 1)$$) AS gate_pass_holder;
SELECT pg_temp.error_of($$SELECT gatekeeper.gate_pass('smart_sending', E'a@b.example\r\nBcc: c@d.example')$$) AS gate_pass_crlf;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.gate_pass_batch('smart_sending', '{ok@drivers.example,not-an-address}')$$) AS gate_pass_batch;
SELECT pg_temp.error_of($$SELECT gatekeeper.gate_open('smart_sending', 'nope')$$) AS gate_open;
SELECT pg_temp.error_of($$SELECT gatekeeper.gate_next_open('smart_sending', 'nope')$$) AS gate_next_open;
SELECT pg_temp.error_of($$SELECT gatekeeper.gate_release('smart_sending', 'nope', 1)$$) AS gate_release;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.explain('nope')$$) AS explain;
SELECT count(*) - :gate_log_before AS gate_log_written FROM gatekeeper.gate_log;
SELECT gatekeeper.gate_open('smart_sending', 'ok@drivers.example') AS ok_still_open;

--
-- cancel(queue, dedupe_key): bad input
--
SELECT pg_temp.error_of($$SELECT gatekeeper.cancel('no_such_queue', 'k')$$) AS unknown_queue;
SELECT pg_temp.error_of($$SELECT gatekeeper.cancel(NULL, 'k')$$) AS null_queue;
SELECT pg_temp.error_of($$SELECT gatekeeper.cancel('drv', NULL)$$) AS null_key;
-- a claimed mail is not cancelled
SELECT gatekeeper.enqueue('c1@drivers.example', 'Claimed', 'b', 'drv', dedupe_key => 'claimed-key') AS c1 \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('drv-w', 10, queues => '{drv}');
SELECT gatekeeper.cancel('drv', 'claimed-key') AS cancelled_claimed;
SELECT gatekeeper.ack(:c1, 1) AS acked;

-- clean up
DEALLOCATE ALL;
SELECT gatekeeper.unsuppress(address) FROM gatekeeper.suppression WHERE address LIKE '%@drivers.example';
SELECT gatekeeper.cancel(id) AS cancelled FROM gatekeeper.mail_status WHERE recipient = 'd5@drivers.example';
