-- Hardening (issue 9): arguments that used to break the claim for
-- everyone, or that gave SQLSTATEs other than the documented ones.
--   22004 null_value_not_allowed: NULL wherever a value is required
--   22023 invalid_parameter_value: durations outside their bounds, infinite
--         times, over-long worker names, multi-dimensional arrays
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of.inc

-- Every public function, each argument NULL in turn with the others valid.
CREATE TEMP TABLE probe (fn text, arg text, sqlstate text, msg text);
CREATE FUNCTION pg_temp.sample(fn text, arg text, typ regtype) RETURNS text
LANGUAGE sql AS $$
	SELECT CASE
		WHEN arg = 'name' AND fn IN ('create_queue') THEN '''probe_q'''
		WHEN arg = 'name' AND fn IN ('create_gate') THEN '''probe_g'''
		WHEN arg = 'name' AND fn IN ('alter_gate', 'drop_gate') THEN '''smart_sending'''
		WHEN arg = 'name' AND fn IN ('create_template') THEN '''probe_t2'''
		WHEN arg = 'name' AND fn IN ('alter_template', 'drop_template') THEN '''probe_t'''
		WHEN arg = 'template' AND fn IN ('render') THEN '''probe_t'''
		-- a plain mail: with a template it would have no subject or body
		WHEN arg = 'template' AND fn IN ('enqueue') THEN 'NULL'
		WHEN arg = 'name' THEN '''default'''
		WHEN arg IN ('queue') THEN '''default'''
		WHEN arg = 'on_gate_closed' THEN '''defer'''
		WHEN arg = 'delivery' THEN '''at_least_once'''
		WHEN arg = 'sender' THEN '''shop@example.com'''
		WHEN arg = 'address' THEN '''a@example.com'''
		WHEN arg = 'reason' THEN '''manual'''
		WHEN arg = 'send_window' THEN '''09:00-17:00'''
		WHEN arg = 'timezone' THEN '''UTC'''
		WHEN arg = 'unsubscribe_url' THEN '''https://example.com/u/{token}'''
		WHEN arg = 'return_path' THEN '''bounces+{token}@example.com'''
		WHEN arg = 'event' THEN '''bounced'''
		WHEN arg = 'token' THEN quote_literal(gatekeeper._unsubscribe_token('a@example.com', 'default'))
		WHEN arg IN ('gate') THEN '''smart_sending'''
		WHEN arg IN ('recipient') THEN '''a@example.com'''
		WHEN arg IN ('recipients') THEN '''{a@example.com}'''
		WHEN arg IN ('errors') THEN '''{x}'''
		WHEN arg IN ('queues', 'gates') THEN '''{}'''
		WHEN typ = 'text'::regtype THEN '''x'''
		WHEN typ = 'interval'::regtype THEN '''1 minute'''
		WHEN typ IN ('int'::regtype, 'bigint'::regtype) THEN '1'
		WHEN typ IN ('int[]'::regtype, 'bigint[]'::regtype) THEN '''{1}'''
		WHEN typ = 'boolean'::regtype THEN 'false'
		WHEN typ = 'timestamptz'::regtype THEN 'now()'
		WHEN typ = 'jsonb'::regtype THEN '''{}'''
		WHEN typ = 'regrole'::regtype THEN 'current_user'
		ELSE 'DEFAULT' END || '::' || typ::text
$$;
-- a template for the template functions to name (issue 48)
SELECT gatekeeper.create_template('probe_t', 's', 'b');
DO $$
DECLARE
	f record;
	i int;
	call text;
	st text;
	m text;
BEGIN
	FOR f IN
		SELECT p.oid, p.proname, p.pronargs, p.proargnames, p.proargtypes
		  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		 WHERE n.nspname = 'gatekeeper' AND p.proname !~ '^_' AND p.prokind = 'f'
		   AND p.prorettype <> 'trigger'::regtype AND p.pronargs > 0
		 ORDER BY p.oid::regprocedure::text
	LOOP
		FOR i IN 0 .. f.pronargs - 1 LOOP
			SELECT string_agg(format('%I => %s', f.proargnames[o],
							  CASE WHEN o - 1 = i THEN 'NULL::' || t::regtype::text
								   ELSE pg_temp.sample(f.proname, f.proargnames[o], t::regtype) END), ', ' ORDER BY o)
			  INTO call
			  FROM unnest(f.proargtypes::oid[]) WITH ORDINALITY AS u(t, o);
			st := 'ok'; m := NULL;
			BEGIN
				EXECUTE format('SELECT * FROM gatekeeper.%I(%s)', f.proname, call);
				RAISE EXCEPTION 'probe ok' USING ERRCODE = 'P0001';
			EXCEPTION WHEN OTHERS THEN
				GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, m = MESSAGE_TEXT;
				IF st = 'P0001' AND m = 'probe ok' THEN st := 'ok'; m := NULL; END IF;
			END;
			INSERT INTO probe VALUES (f.oid::regprocedure::text, f.proargnames[i + 1], st, m);
		END LOOP;
	END LOOP;
END
$$;
-- every argument that may not be NULL gives 22004; the rest ("ok") mean
-- "not given": a default, "unchanged", "no holder", "every queue", no text
SELECT regexp_replace(fn, '^gatekeeper\.', '') AS function, arg, sqlstate
  FROM probe ORDER BY 1, 2;

-- Gate periods are bounded (1 second .. 10 years) and normalised to the
-- length they stand for: a period the claim cannot add to now() used to
-- stop every claim of a queue using it with 22008.
SELECT pg_temp.error_of($$SELECT gatekeeper.create_gate('g_huge', '300000 years')$$) AS huge_period;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_gate('g_huge', '11 years')$$) AS eleven_years;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_gate('g_tiny', '0.5 seconds')$$) AS half_second;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_gate('g_neg', '-1 day')$$) AS negative;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_gate('g_cap', '1 day', max_sends => 10001)$$) AS cap_10001;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_gate('g_cap', '1 day', max_sends => 0)$$) AS cap_0;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_gate('smart_sending', period => '300000 years')$$) AS alter_huge;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_gate('smart_sending', max_sends => 100000)$$) AS alter_cap;
SELECT count(*) AS gates_written FROM gatekeeper.gate WHERE name LIKE 'g\_%';
SELECT name, period, max_sends FROM gatekeeper.gate WHERE name = 'smart_sending';
-- the table refuses them too, whoever writes it
SELECT pg_temp.error_of($$UPDATE gatekeeper.gate SET max_sends = 100000 WHERE name = 'smart_sending'$$) AS table_cap;
SELECT pg_temp.error_of($$UPDATE gatekeeper.gate SET period = '300000 years' WHERE name = 'smart_sending'$$) AS table_period;

-- the largest accepted values work in a claim
SELECT gatekeeper.create_gate('g_ten_years', '10 years', max_sends => 10000);
SELECT gatekeeper.create_gate('g_month', '1 mon');
SELECT gatekeeper.create_queue('q_long', gates => '{g_ten_years,g_month}', dedupe_window => '10 years');
SELECT gatekeeper.enqueue('long@example.com', 's', 'b', queue => 'q_long', dedupe_key => 'k') > 0 AS enqueued;
SELECT count(*) AS claimed FROM gatekeeper.claim('w', 10, '1 minute', '{q_long}');
SELECT name, period, max_sends FROM gatekeeper.gate WHERE name IN ('g_ten_years', 'g_month') ORDER BY name;

-- '-1 mon +31 days' passed the old "positive" check but was zero long on
-- some days (three passes with max_sends 1 all true); it is one day long
SELECT gatekeeper.create_gate('g_mixed', '-1 mon +31 days');
SELECT period FROM gatekeeper.gate WHERE name = 'g_mixed';
SELECT gatekeeper.gate_pass('g_mixed', 'mixed@example.com') AS first,
	   gatekeeper.gate_pass('g_mixed', 'mixed@example.com') AS second,
	   gatekeeper.gate_pass('g_mixed', 'mixed@example.com') AS third;
SELECT gatekeeper.alter_gate('g_mixed', period => '1 mon -29 days');
SELECT period FROM gatekeeper.gate WHERE name = 'g_mixed';

-- dedupe windows: the same bounds; 10000 years used to break enqueue
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('q_bad', dedupe_window => '10000 years')$$) AS create_huge;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_queue('default', dedupe_window => '10000 years')$$) AS alter_huge;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_queue('default', dedupe_window => '-1 s')$$) AS alter_negative;
SELECT pg_temp.error_of($$UPDATE gatekeeper.queue SET dedupe_window = '10000 years' WHERE name = 'default'$$) AS table_huge;
SELECT gatekeeper.create_queue('q_mixed', dedupe_window => '-1 mon +31 days');
SELECT dedupe_window FROM gatekeeper.queue WHERE name = 'q_mixed';
SELECT gatekeeper.alter_queue('q_mixed', dedupe_window => '0');
SELECT dedupe_window FROM gatekeeper.queue WHERE name = 'q_mixed';

-- leases (claim, extend) and the unclaim delay
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.claim('w', 1, '300000 years')$$) AS claim_huge_lease;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.claim('w', 1, '8 days')$$) AS claim_8_days;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.claim('w', 1, '-1 mon +30 days')$$) AS claim_zero;
SELECT pg_temp.error_of($$SELECT gatekeeper.extend(1, 1, '300000 years')$$) AS extend_huge;
SELECT pg_temp.error_of($$SELECT gatekeeper.unclaim('{1}', '{1}', 'e', '300000 years')$$) AS unclaim_huge;
SELECT pg_temp.error_of($$SELECT gatekeeper.unclaim('{1}', '{1}', 'e', '-1 second')$$) AS unclaim_negative;

-- infinite send_at / send_by: one such mail in a paused queue used to make
-- queue_stats fail for every role with 22008
SELECT gatekeeper.create_queue('q_paused');
SELECT gatekeeper.pause('q_paused');
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('i@example.com', 's', 'b', queue => 'q_paused', send_at => '-infinity')$$) AS enqueue_minus_infinity;
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('i@example.com', 's', 'b', queue => 'q_paused', send_at => 'infinity')$$) AS enqueue_infinity;
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('i@example.com', 's', 'b', queue => 'q_paused', send_by => 'infinity')$$) AS enqueue_send_by;
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (recipient, subject, body, queue, send_at)
						 VALUES ('i@example.com', 's', 'b', 'q_paused', now()), ('j@example.com', 's', 'b', 'q_paused', '-infinity')$$) AS insert_minus_infinity;
SELECT count(*) AS mail_written FROM gatekeeper.mail WHERE queue = 'q_paused';
SELECT queue, scheduled, due FROM gatekeeper.queue_stats WHERE queue = 'q_paused';

-- worker names: at most 200 characters (a 5 MB name used to be written
-- into every claimed mail)
SELECT pg_temp.error_of(format('SELECT * FROM gatekeeper.claim(%L, 1)', repeat('w', 201))) AS worker_201;
SELECT pg_temp.error_of(format('SELECT * FROM gatekeeper.claim(%L, 1)', repeat('w', 5000000))) AS worker_5mb;
SELECT pg_temp.error_of(format('SELECT * FROM gatekeeper.claim(%L, 1)', repeat('w', 200))) AS worker_200;
SELECT pg_temp.error_of(format('SELECT * FROM gatekeeper.claim(%L, 1)', repeat('é', 200))) AS worker_200_multibyte;

-- multi-dimensional arrays are refused as such (a 2-D gates array gave 0A000)
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('q_2d', gates => '{{smart_sending}}')$$) AS create_queue_2d;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_queue('default', gates => '{{smart_sending}}')$$) AS alter_queue_2d;
SELECT pg_temp.error_of($$SELECT gatekeeper.unclaim('{{1}}', '{{1}}', 'e')$$) AS unclaim_2d;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.claim('w', 1, '1 minute', '{{default}}')$$) AS claim_2d;

-- finished mail inserted as such (a pg_dump restore of history, perhaps
-- written under older rules: its outcome in mail_done first, then its
-- content) loads as it is; mail still to go is checked
INSERT INTO gatekeeper.mail_done (id, queue, state, send_at, finished_at, segment)
VALUES (900001, 'default', 'sent', now(), now(), gatekeeper._segment());
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (id, recipient, subject, body, headers)
						 VALUES (900001, 'old@example.com', 's', 'b', '{"Content-ID": "<a@b>"}')$$) AS restore_finished;
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (recipient, subject, body, headers)
						 VALUES ('new@example.com', 's', 'b', '{"Content-ID": "<a@b>"}')$$) AS insert_scheduled;
SELECT recipient, state FROM gatekeeper.mail_status WHERE recipient IN ('old@example.com', 'new@example.com');
