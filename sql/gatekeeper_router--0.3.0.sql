/* gatekeeper_router 0.3.0: gatekeeper's application API over shards, on PL/Proxy */
\echo Use "CREATE EXTENSION gatekeeper_router" to load this file. \quit

/*
 * The router is installed in a database of its own, next to plproxy.  It
 * holds no mail: every call goes to the gatekeeper shards, found the
 * PL/Proxy way, in the foreign server "gatekeeper" of the plproxy foreign
 * data wrapper (one option pN per shard, N from 0, a power of two of
 * them, and a user mapping):
 *
 *		CREATE SERVER gatekeeper FOREIGN DATA WRAPPER plproxy
 *			OPTIONS (p0 'host=db0 dbname=shop', p1 'host=db1 dbname=shop');
 *		CREATE USER MAPPING FOR PUBLIC SERVER gatekeeper OPTIONS (user 'app');
 *
 * Shard n of count has run gatekeeper.shard(n, count) once: its mail ids
 * are then n modulo count, and a mail's id says which shard holds it.
 *
 * Routing (docs/sharding.md):
 *   by recipient, hashtext(lower(recipient)): enqueue, history, suppress,
 *		unsuppress, and find and cancel by key given the recipient
 *   by id (id & (count - 1)): status, cancel; an id the shard it names
 *		does not hold (a mail from before the shards were split) is looked
 *		for on the others
 *   every shard: queue and gate administration, find and cancel by key
 *		alone, queue_stats (summed)
 *   unsubscribe: the shard of the recipient the token names, else the
 *		shard whose secret verifies it
 *
 * PL/Proxy commits each shard's call on its own.  Administration must not
 * leave the shards disagreeing, so it runs twice: first on every shard as
 * a dry run (the call, then an error that rolls it back: nothing is
 * written), and only when every shard took it, for real.  A shard that
 * refuses, or cannot be reached, fails the call with its name; one that
 * fails between the two rounds (it went down) is named together with
 * those that did apply it.  (PL/Proxy reopens a connection whose call
 * failed, with a NOTICE: the administration functions, whose dry runs
 * always fail, run with client_min_messages = warning.)
 *
 * The public functions here are PL/pgSQL or SQL: each calls an internal
 * PL/Proxy function (_name) whose first argument is the hash or number of
 * the shard to run on, within the deadline gatekeeper_router.timeout
 * (_deadline), and turns PL/Proxy's errors into ones that name the shard
 * (_failed).  A few are the router's own: enqueue_batch, find
 * and cancel by key and recipient, shard_queue_stats.
 */

CREATE TYPE gatekeeper.state AS ENUM (
	'scheduled', 'claimed', 'sent', 'failed', 'suppressed', 'expired',
	'cancelled', 'unknown'
);

/*
 * The shards
 */

-- the number of shards: the pN options of the foreign server gatekeeper
CREATE FUNCTION gatekeeper._shard_count()
RETURNS int
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	n int;
BEGIN
	SELECT count(*) INTO n
	  FROM pg_catalog.pg_foreign_server s
	  JOIN pg_catalog.pg_foreign_data_wrapper w ON w.oid = s.srvfdw,
		   pg_catalog.unnest(s.srvoptions) AS o
	 WHERE s.srvname = 'gatekeeper' AND w.fdwname = 'plproxy' AND o ~ '^p[0-9]+=';
	IF n = 0 THEN
		RAISE EXCEPTION 'no gatekeeper shards are configured'
			USING ERRCODE = 'undefined_object',
				  DETAIL = 'The router finds its shards in the options p0, p1, ... of the foreign server "gatekeeper" of the plproxy foreign data wrapper.',
				  HINT = 'CREATE SERVER gatekeeper FOREIGN DATA WRAPPER plproxy OPTIONS (p0 ''...'', ...) and a user mapping.';
	END IF;
	RETURN n;
END
$$;

-- shard number part, for messages: "p2 (host=... port=... dbname=...)";
-- only those keys of its connection string, never a password
CREATE FUNCTION gatekeeper._shard_name(part int)
RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
SELECT 'p' || $1 || coalesce(' (' || (
		SELECT pg_catalog.string_agg(m[1], ' ')
		  FROM pg_catalog.pg_foreign_server s,
			   pg_catalog.unnest(s.srvoptions) AS o,
			   pg_catalog.regexp_matches(pg_catalog.substr(o, pg_catalog.length('p' || $1 || '=') + 1),
										 '(?:^|\s)((?:host|hostaddr|port|dbname|service)=\S+)', 'g') AS m
		 WHERE s.srvname = 'gatekeeper' AND o LIKE 'p' || $1 || '=%') || ')', '')
$$;

-- the hash a recipient is routed by (NULL goes to a shard, which refuses
-- it as a single gatekeeper would)
CREATE FUNCTION gatekeeper._hash(recipient text)
RETURNS int
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
SELECT coalesce(pg_catalog.hashtext(pg_catalog.lower($1)), 0)
$$;

/*
 * The deadline of every routed call: gatekeeper_router.timeout
 */

-- gatekeeper_router.timeout in seconds: a time such as '10s', '500ms' or
-- '1min', a number alone is seconds, 0 none; unset, 10 seconds
CREATE FUNCTION gatekeeper._timeout()
RETURNS double precision
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	setting text := coalesce(nullif(pg_catalog.current_setting('gatekeeper_router.timeout', true), ''), '10s');
	m text[] := pg_catalog.regexp_match(setting, '^\s*(\d+(?:\.\d+)?)\s*(ms|s|min|h|d)?\s*$');
BEGIN
	IF m IS NULL THEN
		RAISE EXCEPTION 'invalid value for gatekeeper_router.timeout: "%"', setting
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'A time such as 10s, 500ms or 1min (a number alone is seconds), or 0 for no limit.';
	END IF;
	RETURN m[1]::double precision * CASE m[2] WHEN 'ms' THEN 0.001 WHEN 'min' THEN 60
											 WHEN 'h' THEN 3600 WHEN 'd' THEN 86400 ELSE 1 END;
END
$$;

-- arm the deadline of the routed call about to run, seconds from now (0:
-- none); NULL disarms it once the call returned (src/router_deadline.c
-- says why it is PostgreSQL's lock timeout)
CREATE FUNCTION gatekeeper._deadline(seconds double precision)
RETURNS void
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS '$libdir/gatekeeper', 'gatekeeper_router_deadline';

-- whether the deadline armed last had passed when it was disarmed: the
-- call that failed ran out of time, whatever its error says
CREATE FUNCTION gatekeeper._deadline_passed()
RETURNS boolean
LANGUAGE c
SET search_path = pg_catalog, pg_temp
AS '$libdir/gatekeeper', 'gatekeeper_router_deadline_passed';

/*
 * Raises the error of a call that failed on the shard hash selects (hash &
 * (count - 1)), naming it.  what: the administration call that failed
 * (NULL for a routed call), applied: the shards that had already applied
 * it (NULL in the dry run).  The shard's own refusal keeps its SQLSTATE
 * and message.  A shard PL/Proxy could not reach is 08006, and so is one
 * that did not answer within gatekeeper_router.timeout, or whose
 * connection broke during the call (the shard shutting down, its backend
 * terminated: 57P01 and the like); the outcome of those two is unknown:
 * the call may have been carried out on the shard.
 */
CREATE FUNCTION gatekeeper._failed(hash bigint, what text, applied int[],
	sqlstate text, message text, detail text, hint text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	part int := (hash & (gatekeeper._shard_count() - 1))::int;
	shard text := gatekeeper._shard_name(part);
	remote text[];
	kind text;
	done text;
	applied_on text := (SELECT pg_catalog.string_agg('p' || a, ', ' ORDER BY a) FROM pg_catalog.unnest(applied) AS a);
BEGIN
	detail := nullif(detail, '');
	hint := nullif(hint, '');
	remote := pg_catalog.regexp_match(message, '^\S+\(\d+\): \[[^]]*\] REMOTE ([A-Z]+): (.*)$');
	kind := CASE
		-- the shard's own error, passed through by PL/Proxy
		WHEN remote IS NOT NULL AND remote[1] NOT IN ('FATAL', 'PANIC') THEN 'refused'
		-- the shard ended the session during the call (it shuts down)
		WHEN remote IS NOT NULL THEN 'broke'
		-- the deadline (gatekeeper._deadline): the lock timeout, raised
		-- here, not on the shard, or the write it cut off
		WHEN sqlstate = '55P03' OR gatekeeper._deadline_passed() THEN 'timeout'
		-- PL/Proxy's own: the shard could not be reached, or the connection broke
		WHEN message ~ '^PL/Proxy function ' AND message ~ '(PQconnectPoll|PQconnectStart|connect timeout)' THEN 'unreachable'
		WHEN message ~ '^PL/Proxy function ' AND message ~ '(PQconsumeInput|PQsendQuery|PQflush|query timeout)' THEN 'broke'
		ELSE 'other' END;
	IF what IS NOT NULL THEN
		done := CASE
			WHEN applied IS NULL THEN 'No shard was changed.'
			WHEN kind IN ('timeout', 'broke') AND applied_on IS NOT NULL THEN
				pg_catalog.format('It was applied on %s already, perhaps on p%s, and on no other shard.', applied_on, part)
			WHEN kind IN ('timeout', 'broke') THEN
				pg_catalog.format('It may have been applied on p%s, and on no other shard.', part)
			WHEN applied_on IS NOT NULL THEN
				pg_catalog.format('It was applied on %s already, and on no other shard.', applied_on)
			ELSE 'No shard was changed.' END;
	END IF;
	IF kind = 'refused' THEN
		message := CASE WHEN what IS NULL THEN remote[2]
						ELSE pg_catalog.format('%s was refused by gatekeeper shard %s: %s', what, shard, remote[2]) END;
		detail := pg_catalog.concat_ws(' ', pg_catalog.regexp_replace(detail, '^Remote detail: ', ''),
			CASE WHEN what IS NULL THEN 'Raised by gatekeeper shard ' || shard || '.' END, done);
		hint := pg_catalog.regexp_replace(hint, '^Remote hint: ', '');
	ELSIF kind = 'other' THEN
		message := pg_catalog.format('gatekeeper shard %s: %s', shard, message);
		detail := pg_catalog.concat_ws(' ', detail, done);
	ELSE
		-- 08006: not sent, or sent with an unknown outcome (for
		-- administration done says it: a dry run changes nothing)
		detail := pg_catalog.concat_ws(' ',
			CASE WHEN kind <> 'unreachable' AND what IS NULL THEN 'The call may have been carried out on the shard.' END,
			CASE WHEN kind <> 'broke' THEN NULL
				 WHEN remote IS NOT NULL THEN pg_catalog.format('The shard said: %s (%s).', remote[2], sqlstate) END,
			CASE WHEN kind = 'unreachable' OR (kind = 'broke' AND remote IS NULL) THEN message END,
			done);
		message := CASE kind
			WHEN 'unreachable' THEN pg_catalog.format('gatekeeper shard %s is unreachable', shard)
			WHEN 'timeout' THEN pg_catalog.format('gatekeeper shard %s did not answer within %s s (gatekeeper_router.timeout)',
				shard, gatekeeper._timeout())
			ELSE pg_catalog.format('the connection to gatekeeper shard %s broke during the call', shard) END;
		sqlstate := '08006';
		hint := CASE
			WHEN what IS NOT NULL THEN
				pg_catalog.format('%s runs on every shard: run it again when %s is back.', what, shard)
			WHEN kind = 'unreachable' THEN 'Calls routed to the other shards go on.'
			ELSE 'Calls routed to the other shards go on. Run the call again when the shard answers: an enqueue with the same dedupe_key then makes no second mail.' END;
	END IF;
	detail := nullif(detail, '');
	hint := nullif(hint, '');
	IF detail IS NULL AND hint IS NULL THEN
		RAISE EXCEPTION USING ERRCODE = sqlstate, MESSAGE = message;
	ELSIF hint IS NULL THEN
		RAISE EXCEPTION USING ERRCODE = sqlstate, MESSAGE = message, DETAIL = detail;
	ELSIF detail IS NULL THEN
		RAISE EXCEPTION USING ERRCODE = sqlstate, MESSAGE = message, HINT = hint;
	END IF;
	RAISE EXCEPTION USING ERRCODE = sqlstate, MESSAGE = message, DETAIL = detail, HINT = hint;
END
$$;

/*
 * Runs one administration call on every shard: first a dry run on each
 * (call_name's PL/Proxy function with dry => true, which always ends in
 * the division by zero that rolls the shard's transaction back when the
 * call itself succeeded), then for real on each.  call is the SQL that
 * runs the PL/Proxy function, with $1 the shard number and $2 dry, and
 * the call's arguments as $3 (args: a value, or a row of _queue_args or
 * _gate_args).
 * Returns the sum of the shards' results (NULL for void calls).
 */
CREATE FUNCTION gatekeeper._on_every_shard(what text, call text, args anyelement)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	count int := gatekeeper._shard_count();
	timeout double precision := gatekeeper._timeout();
	part int;
	dry boolean;
	result text;
	total bigint;
	applied int[] := '{}';
	st text;
	msg text;
	det text;
	hnt text;
BEGIN
	FOREACH dry IN ARRAY ARRAY[true, false] LOOP
		FOR part IN 0 .. count - 1 LOOP
			BEGIN
				PERFORM gatekeeper._deadline(timeout);
				EXECUTE call INTO result USING part, dry, args;
				PERFORM gatekeeper._deadline(NULL);
				IF NOT dry THEN
					applied := applied || part;
					total := coalesce(total, 0) + nullif(result, '')::bigint;
				END IF;
			EXCEPTION WHEN OTHERS THEN
				GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
										det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
				-- the dry run's own end: the shard took the call
				CONTINUE WHEN dry AND st = '22012' AND msg ~ 'REMOTE ERROR: division by zero$';
				PERFORM gatekeeper._failed(part, what, CASE WHEN NOT dry THEN applied END, st, msg, det, hnt);
			END;
		END LOOP;
	END LOOP;
	RETURN total;
END
$$;

-- the arguments of create_queue and alter_queue, and of create_gate and
-- alter_gate, as _on_every_shard passes them on
CREATE TYPE gatekeeper._queue_args AS (name text, gates text[], on_gate_closed text, delivery text,
	max_attempts int, weight int, rate_limit int, dedupe_window interval, transactional boolean,
	unsubscribe_url text, send_window text, timezone text, background boolean, notify boolean,
	return_path text, feedback_id text, retry_for interval);
CREATE TYPE gatekeeper._gate_args AS (name text, period interval, max_sends int);

/*
 * Enqueue: to the recipient's shard
 */
CREATE FUNCTION gatekeeper._enqueue(hash int, recipient text, subject text, body text,
	queue text, send_at timestamptz, html text, sender text, headers jsonb,
	dedupe_key text, priority int, send_by timestamptz, recipient_name text,
	metadata jsonb, timezone text, template text, data jsonb)
RETURNS bigint
LANGUAGE plproxy
SET search_path = pg_catalog, pg_temp
AS $$
	CLUSTER 'gatekeeper';
	RUN ON hash;
	SELECT gatekeeper.enqueue(recipient, subject, body, queue, send_at, html, sender, headers,
							  dedupe_key, priority, send_by, recipient_name, metadata, timezone,
							  template, data)
		   AS _enqueue;
$$;

CREATE FUNCTION gatekeeper.enqueue(recipient text, subject text, body text,
	queue text DEFAULT 'default', send_at timestamptz DEFAULT now(),
	html text DEFAULT NULL, sender text DEFAULT NULL, headers jsonb DEFAULT NULL,
	dedupe_key text DEFAULT NULL, priority int DEFAULT 0,
	send_by timestamptz DEFAULT NULL, recipient_name text DEFAULT NULL,
	metadata jsonb DEFAULT NULL, timezone text DEFAULT NULL,
	template text DEFAULT NULL, data jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	h int := gatekeeper._hash(recipient);
	timeout double precision := gatekeeper._timeout();
	id bigint;
	st text;
	msg text;
	det text;
	hnt text;
BEGIN
	PERFORM gatekeeper._deadline(timeout);
	id := gatekeeper._enqueue(h, recipient, subject, body, queue, send_at, html, sender, headers,
							  dedupe_key, priority, send_by, recipient_name, metadata, timezone,
							  template, data);
	PERFORM gatekeeper._deadline(NULL);
	RETURN id;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
							det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
	PERFORM gatekeeper._failed(h, NULL, NULL, st, msg, det, hnt);
	RETURN NULL;
END
$$;

COMMENT ON FUNCTION gatekeeper.enqueue(text, text, text, text, timestamptz, text, text, jsonb, text, int,
	timestamptz, text, jsonb, text, text, jsonb) IS
	'enqueue one mail on the shard of its recipient (committed there at once, whatever this transaction does); returns its id';

/*
 * Bulk enqueue (router only): rows given as arrays, split by shard, one
 * call per shard that enqueues all of that shard's rows in one
 * transaction there.  Returns the ids in the order of the rows.  Each
 * shard's rows commit on their own: a shard that refuses a row fails the
 * call naming the shard and the shards whose rows were enqueued already;
 * with dedupe keys the call can be run again as a whole.
 */
CREATE FUNCTION gatekeeper._enqueue_rows(part int, ords int[], recipients text[], subjects text[],
	bodies text[], queue text, send_at timestamptz, dedupe_keys text[], metadata jsonb[])
RETURNS TABLE (ord int, id bigint)
LANGUAGE plproxy
SET search_path = pg_catalog, pg_temp
AS $$
	CLUSTER 'gatekeeper';
	RUN ON part;
	SELECT u.o AS ord,
		   gatekeeper.enqueue(u.r, u.s, u.b, queue, send_at, NULL, NULL, NULL, u.k, 0, NULL, NULL, u.m, NULL) AS id
	  FROM unnest(ords, recipients, subjects, bodies, dedupe_keys, metadata) AS u(o, r, s, b, k, m);
$$;

CREATE FUNCTION gatekeeper.enqueue_batch(recipients text[], subjects text[], bodies text[],
	queue text DEFAULT 'default', send_at timestamptz DEFAULT now(),
	dedupe_keys text[] DEFAULT NULL, metadata jsonb[] DEFAULT NULL)
RETURNS bigint[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	count int := gatekeeper._shard_count();
	timeout double precision := gatekeeper._timeout();
	n int := pg_catalog.cardinality(recipients);
	ids bigint[];
	part int;
	applied int[] := '{}';
	s record;
	r record;
	st text;
	msg text;
	det text;
	hnt text;
BEGIN
	IF recipients IS NULL OR subjects IS NULL OR bodies IS NULL THEN
		RAISE EXCEPTION 'recipients, subjects and bodies must not be null'
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF pg_catalog.array_ndims(recipients) > 1 OR pg_catalog.array_ndims(subjects) > 1
	   OR pg_catalog.array_ndims(bodies) > 1 OR pg_catalog.array_ndims(dedupe_keys) > 1
	   OR pg_catalog.array_ndims(metadata) > 1 THEN
		RAISE EXCEPTION 'multi-dimensional arrays are not supported'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF pg_catalog.cardinality(subjects) <> n OR pg_catalog.cardinality(bodies) <> n
	   OR pg_catalog.cardinality(dedupe_keys) <> n OR pg_catalog.cardinality(metadata) <> n THEN
		RAISE EXCEPTION 'arrays must have the same length'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = pg_catalog.format('recipients has %s elements.', n);
	END IF;
	ids := pg_catalog.array_fill(NULL::bigint, ARRAY[n]);
	FOR s IN
		SELECT gatekeeper._hash(recipients[o]) & (count - 1) AS part,
			   pg_catalog.array_agg(o ORDER BY o) AS ords,
			   pg_catalog.array_agg(recipients[o] ORDER BY o) AS recipients,
			   pg_catalog.array_agg(subjects[o] ORDER BY o) AS subjects,
			   pg_catalog.array_agg(bodies[o] ORDER BY o) AS bodies,
			   pg_catalog.array_agg(dedupe_keys[o] ORDER BY o) AS dedupe_keys,
			   pg_catalog.array_agg(metadata[o] ORDER BY o) AS metadata
		  FROM pg_catalog.generate_series(1, n) AS o
		 GROUP BY 1 ORDER BY 1
	LOOP
		part := s.part;
		BEGIN
			PERFORM gatekeeper._deadline(timeout);
			FOR r IN SELECT * FROM gatekeeper._enqueue_rows(s.part, s.ords, s.recipients, s.subjects,
				s.bodies, queue, send_at, s.dedupe_keys, s.metadata)
			LOOP
				ids[r.ord] := r.id;
			END LOOP;
			PERFORM gatekeeper._deadline(NULL);
		EXCEPTION WHEN OTHERS THEN
			GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
									det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
			PERFORM gatekeeper._failed(part, 'enqueue_batch', applied, st, msg, det, hnt);
		END;
		applied := applied || part;
	END LOOP;
	RETURN ids;
END
$$;

COMMENT ON FUNCTION gatekeeper.enqueue_batch(text[], text[], text[], text, timestamptz, text[], jsonb[]) IS
	'router only: enqueue rows given as arrays, one call per shard for all its rows; returns their ids in order';

/*
 * Queues and gates: on every shard
 */
CREATE FUNCTION gatekeeper._create_queue(part int, dry boolean, name text, gates text[],
	on_gate_closed text, delivery text, max_attempts int, weight int, rate_limit int,
	dedupe_window interval, transactional boolean, unsubscribe_url text, send_window text,
	timezone text, background boolean, notify boolean, return_path text, feedback_id text,
	retry_for interval)
RETURNS text
LANGUAGE plproxy
SET search_path = pg_catalog, pg_temp
AS $$
	CLUSTER 'gatekeeper';
	RUN ON part;
	SELECT CASE WHEN dry THEN pg_catalog.int4div(1, pg_catalog.length(s.r::text) * 0)::text
				ELSE s.r::text END AS _create_queue
	  FROM (SELECT gatekeeper.create_queue(name, gates, on_gate_closed, delivery, max_attempts,
			weight, rate_limit, dedupe_window, transactional, unsubscribe_url, send_window,
			timezone, background, notify, return_path, feedback_id, retry_for) AS r) s;
$$;

CREATE FUNCTION gatekeeper.create_queue(name text, gates text[] DEFAULT '{}',
	on_gate_closed text DEFAULT 'suppress', delivery text DEFAULT 'at_least_once',
	max_attempts int DEFAULT 5, weight int DEFAULT 1, rate_limit int DEFAULT NULL,
	dedupe_window interval DEFAULT NULL, transactional boolean DEFAULT false,
	unsubscribe_url text DEFAULT NULL, send_window text DEFAULT NULL,
	timezone text DEFAULT 'UTC', background boolean DEFAULT true,
	notify boolean DEFAULT false, return_path text DEFAULT NULL,
	feedback_id text DEFAULT NULL, retry_for interval DEFAULT '1 day')
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET client_min_messages = warning
AS $$
BEGIN
	PERFORM gatekeeper._on_every_shard('create_queue',
		'SELECT gatekeeper._create_queue($1, $2, ($3).name, ($3).gates, ($3).on_gate_closed, ($3).delivery,'
		' ($3).max_attempts, ($3).weight, ($3).rate_limit, ($3).dedupe_window, ($3).transactional,'
		' ($3).unsubscribe_url, ($3).send_window, ($3).timezone, ($3).background, ($3).notify,'
		' ($3).return_path, ($3).feedback_id, ($3).retry_for)',
		ROW(name, gates, on_gate_closed, delivery, max_attempts, weight, rate_limit, dedupe_window,
			transactional, unsubscribe_url, send_window, timezone, background,
			notify, return_path, feedback_id, retry_for)::gatekeeper._queue_args);
END
$$;

CREATE FUNCTION gatekeeper._alter_queue(part int, dry boolean, name text, gates text[],
	on_gate_closed text, delivery text, max_attempts int, weight int, rate_limit int,
	dedupe_window interval, transactional boolean, unsubscribe_url text, send_window text,
	timezone text, background boolean, notify boolean, return_path text, feedback_id text,
	retry_for interval)
RETURNS text
LANGUAGE plproxy
SET search_path = pg_catalog, pg_temp
AS $$
	CLUSTER 'gatekeeper';
	RUN ON part;
	SELECT CASE WHEN dry THEN pg_catalog.int4div(1, pg_catalog.length(s.r::text) * 0)::text
				ELSE s.r::text END AS _alter_queue
	  FROM (SELECT gatekeeper.alter_queue(name, gates, on_gate_closed, delivery, max_attempts,
			weight, rate_limit, dedupe_window, transactional, unsubscribe_url, send_window,
			timezone, background, notify, return_path, feedback_id, retry_for) AS r) s;
$$;

CREATE FUNCTION gatekeeper.alter_queue(name text, gates text[] DEFAULT NULL,
	on_gate_closed text DEFAULT NULL, delivery text DEFAULT NULL,
	max_attempts int DEFAULT NULL, weight int DEFAULT NULL, rate_limit int DEFAULT NULL,
	dedupe_window interval DEFAULT NULL, transactional boolean DEFAULT NULL,
	unsubscribe_url text DEFAULT NULL, send_window text DEFAULT NULL,
	timezone text DEFAULT NULL, background boolean DEFAULT NULL,
	notify boolean DEFAULT NULL, return_path text DEFAULT NULL,
	feedback_id text DEFAULT NULL, retry_for interval DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET client_min_messages = warning
AS $$
BEGIN
	PERFORM gatekeeper._on_every_shard('alter_queue',
		'SELECT gatekeeper._alter_queue($1, $2, ($3).name, ($3).gates, ($3).on_gate_closed, ($3).delivery,'
		' ($3).max_attempts, ($3).weight, ($3).rate_limit, ($3).dedupe_window, ($3).transactional,'
		' ($3).unsubscribe_url, ($3).send_window, ($3).timezone, ($3).background, ($3).notify,'
		' ($3).return_path, ($3).feedback_id, ($3).retry_for)',
		ROW(name, gates, on_gate_closed, delivery, max_attempts, weight, rate_limit, dedupe_window,
			transactional, unsubscribe_url, send_window, timezone, background,
			notify, return_path, feedback_id, retry_for)::gatekeeper._queue_args);
END
$$;

-- drop_queue, pause, resume, cancel_queue, drop_gate: one text argument
CREATE FUNCTION gatekeeper._queue_call(part int, dry boolean, call text, name text)
RETURNS text
LANGUAGE plproxy
SET search_path = pg_catalog, pg_temp
AS $$
	CLUSTER 'gatekeeper';
	RUN ON part;
	SELECT CASE WHEN dry THEN pg_catalog.int4div(1, pg_catalog.length(s.r) * 0)::text
				ELSE s.r END AS _queue_call
	  FROM (SELECT CASE call
				   WHEN 'drop_queue' THEN gatekeeper.drop_queue(name)::text
				   WHEN 'pause' THEN gatekeeper.pause(name)::text
				   WHEN 'resume' THEN gatekeeper.resume(name)::text
				   WHEN 'cancel_queue' THEN gatekeeper.cancel_queue(name)::text
				   WHEN 'drop_gate' THEN gatekeeper.drop_gate(name)::text
				   END AS r) s;
$$;

CREATE FUNCTION gatekeeper.drop_queue(name text)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
SET client_min_messages = warning
AS $$
SELECT gatekeeper._on_every_shard('drop_queue',
	'SELECT gatekeeper._queue_call($1, $2, ''drop_queue'', $3)', $1);
$$;

CREATE FUNCTION gatekeeper.pause(queue text)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
SET client_min_messages = warning
AS $$
SELECT gatekeeper._on_every_shard('pause',
	'SELECT gatekeeper._queue_call($1, $2, ''pause'', $3)', $1);
$$;

CREATE FUNCTION gatekeeper.resume(queue text)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
SET client_min_messages = warning
AS $$
SELECT gatekeeper._on_every_shard('resume',
	'SELECT gatekeeper._queue_call($1, $2, ''resume'', $3)', $1);
$$;

CREATE FUNCTION gatekeeper.cancel_queue(queue text)
RETURNS bigint
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
SET client_min_messages = warning
AS $$
SELECT gatekeeper._on_every_shard('cancel_queue',
	'SELECT gatekeeper._queue_call($1, $2, ''cancel_queue'', $3)', $1);
$$;

CREATE FUNCTION gatekeeper.drop_gate(name text)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
SET client_min_messages = warning
AS $$
SELECT gatekeeper._on_every_shard('drop_gate',
	'SELECT gatekeeper._queue_call($1, $2, ''drop_gate'', $3)', $1);
$$;

CREATE FUNCTION gatekeeper._gate_call(part int, dry boolean, creating boolean, name text,
	period interval, max_sends int)
RETURNS text
LANGUAGE plproxy
SET search_path = pg_catalog, pg_temp
AS $$
	CLUSTER 'gatekeeper';
	RUN ON part;
	SELECT CASE WHEN dry THEN pg_catalog.int4div(1, pg_catalog.length(s.r) * 0)::text
				ELSE s.r END AS _gate_call
	  FROM (SELECT CASE WHEN creating THEN gatekeeper.create_gate(name, period, max_sends)::text
						ELSE gatekeeper.alter_gate(name, period, max_sends)::text END AS r) s;
$$;

CREATE FUNCTION gatekeeper.create_gate(name text, period interval, max_sends int DEFAULT 1)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
SET client_min_messages = warning
AS $$
SELECT gatekeeper._on_every_shard('create_gate',
	'SELECT gatekeeper._gate_call($1, $2, true, ($3).name, ($3).period, ($3).max_sends)',
	ROW($1, $2, $3)::gatekeeper._gate_args);
$$;

CREATE FUNCTION gatekeeper.alter_gate(name text, period interval DEFAULT NULL, max_sends int DEFAULT NULL)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
SET client_min_messages = warning
AS $$
SELECT gatekeeper._on_every_shard('alter_gate',
	'SELECT gatekeeper._gate_call($1, $2, false, ($3).name, ($3).period, ($3).max_sends)',
	ROW($1, $2, $3)::gatekeeper._gate_args);
$$;

COMMENT ON FUNCTION gatekeeper.create_queue(text, text[], text, text, int, int, int, interval, boolean,
	text, text, text, boolean, boolean, text, text, interval) IS 'create a queue on every shard (or on none)';
COMMENT ON FUNCTION gatekeeper.alter_queue(text, text[], text, text, int, int, int, interval, boolean,
	text, text, text, boolean, boolean, text, text, interval) IS 'change a queue on every shard (or on none)';
COMMENT ON FUNCTION gatekeeper.drop_queue(text) IS 'drop a queue on every shard (or on none)';
COMMENT ON FUNCTION gatekeeper.pause(text) IS 'pause a queue on every shard';
COMMENT ON FUNCTION gatekeeper.resume(text) IS 'resume a queue on every shard';
COMMENT ON FUNCTION gatekeeper.cancel_queue(text) IS 'cancel the scheduled mail of a queue on every shard; returns how many';
COMMENT ON FUNCTION gatekeeper.create_gate(text, interval, int) IS 'create a gate on every shard (or on none)';
COMMENT ON FUNCTION gatekeeper.alter_gate(text, interval, int) IS 'change a gate on every shard (or on none)';
COMMENT ON FUNCTION gatekeeper.drop_gate(text) IS 'drop a gate on every shard (or on none)';

/*
 * A mail by its id: the shard the id names, then the others
 */
CREATE TYPE gatekeeper._status_row AS (id bigint, queue text, state gatekeeper.state, attempt int,
	send_at timestamptz, last_error text, message_id text, finished_at timestamptz, metadata jsonb,
	uncharged int);

CREATE FUNCTION gatekeeper._status(hash bigint, mail_id bigint)
RETURNS SETOF gatekeeper._status_row
LANGUAGE plproxy
SET search_path = pg_catalog, pg_temp
AS $$
	CLUSTER 'gatekeeper';
	RUN ON hash;
	SELECT s.id, s.queue, s.state::text AS state, s.attempt, s.send_at, s.last_error, s.message_id,
		   s.finished_at, s.metadata, s.uncharged
	  FROM gatekeeper.status(mail_id) s;
$$;

-- the shards to ask for mail id, the one its id names first
CREATE FUNCTION gatekeeper._id_shards(id bigint)
RETURNS SETOF int
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
SELECT p FROM (SELECT gatekeeper._shard_count() AS n) c,
			  pg_catalog.generate_series(0, c.n - 1) AS p
 ORDER BY p <> (coalesce($1, 0) & (c.n - 1))::int, p
$$;

-- the mail's row from the first shard of _id_shards() that holds it
CREATE FUNCTION gatekeeper._status_any(mail_id bigint)
RETURNS SETOF gatekeeper._status_row
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	timeout double precision := gatekeeper._timeout();
	part int;
	held boolean;
	st text;
	msg text;
	det text;
	hnt text;
BEGIN
	FOR part IN SELECT * FROM gatekeeper._id_shards(mail_id) LOOP
		BEGIN
			PERFORM gatekeeper._deadline(timeout);
			RETURN QUERY SELECT * FROM gatekeeper._status(part, mail_id);
			held := FOUND;
			PERFORM gatekeeper._deadline(NULL);
		EXCEPTION WHEN OTHERS THEN
			GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
									det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
			PERFORM gatekeeper._failed(part, NULL, NULL, st, msg, det, hnt);
		END;
		EXIT WHEN held;
	END LOOP;
END
$$;

CREATE FUNCTION gatekeeper.status(id bigint)
RETURNS TABLE (id bigint, queue text, state gatekeeper.state, attempt int, send_at timestamptz,
			   last_error text, message_id text, finished_at timestamptz, metadata jsonb,
			   uncharged int)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
SELECT * FROM gatekeeper._status_any($1)
$$;

CREATE FUNCTION gatekeeper._cancel(hash bigint, mail_id bigint)
RETURNS TABLE (held boolean, cancelled boolean)
LANGUAGE plproxy
SET search_path = pg_catalog, pg_temp
AS $$
	CLUSTER 'gatekeeper';
	RUN ON hash;
	SELECT c.cancelled OR EXISTS (SELECT FROM gatekeeper.status(mail_id)) AS held, c.cancelled
	  FROM (SELECT gatekeeper.cancel(mail_id) AS cancelled) c;
$$;

CREATE FUNCTION gatekeeper.cancel(id bigint)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	mail_id bigint := $1;
	timeout double precision := gatekeeper._timeout();
	part int;
	r record;
	st text;
	msg text;
	det text;
	hnt text;
BEGIN
	FOR part IN SELECT * FROM gatekeeper._id_shards(mail_id) LOOP
		BEGIN
			PERFORM gatekeeper._deadline(timeout);
			SELECT * INTO r FROM gatekeeper._cancel(part, mail_id);
			PERFORM gatekeeper._deadline(NULL);
		EXCEPTION WHEN OTHERS THEN
			GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
									det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
			PERFORM gatekeeper._failed(part, NULL, NULL, st, msg, det, hnt);
		END;
		IF r.held THEN
			RETURN r.cancelled;
		END IF;
	END LOOP;
	RETURN false;
END
$$;

COMMENT ON FUNCTION gatekeeper.status(bigint) IS 'a mail''s state, by id, from the shard that holds it';
COMMENT ON FUNCTION gatekeeper.cancel(bigint) IS 'cancel a scheduled mail, by id, on the shard that holds it';

/*
 * A mail by its dedupe key: on the recipient's shard when the recipient is
 * given, else on every shard
 */
CREATE FUNCTION gatekeeper._find(hash bigint, queue text, dedupe_key text)
RETURNS TABLE (id bigint, live boolean, finished_at timestamptz)
LANGUAGE plproxy
SET search_path = pg_catalog, pg_temp
AS $$
	CLUSTER 'gatekeeper';
	RUN ON hash;
	SELECT f.id, s.state IN ('scheduled', 'claimed') AS live, s.finished_at
	  FROM (SELECT gatekeeper.find(queue, dedupe_key) AS id) f
	  LEFT JOIN LATERAL gatekeeper.status(coalesce(f.id, 0)) s ON true
	 WHERE f.id IS NOT NULL;
$$;

CREATE FUNCTION gatekeeper._cancel_key(hash bigint, queue text, dedupe_key text)
RETURNS boolean
LANGUAGE plproxy
SET search_path = pg_catalog, pg_temp
AS $$
	CLUSTER 'gatekeeper';
	RUN ON hash;
	SELECT gatekeeper.cancel(queue, dedupe_key) AS _cancel_key;
$$;

-- find or cancel by key on the given shards; the live mail first, else the
-- latest finished
CREATE FUNCTION gatekeeper._by_key(cancelling boolean, queue text, dedupe_key text, parts int[])
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	timeout double precision := gatekeeper._timeout();
	part int;
	best_id bigint;
	best_live boolean;
	best_finished timestamptz;
	r record;
	any_cancelled boolean := false;
	c boolean;
	st text;
	msg text;
	det text;
	hnt text;
BEGIN
	FOREACH part IN ARRAY parts LOOP
		BEGIN
			PERFORM gatekeeper._deadline(timeout);
			IF cancelling THEN
				c := gatekeeper._cancel_key(part, queue, dedupe_key);
				any_cancelled := any_cancelled OR c;
			ELSE
				FOR r IN SELECT * FROM gatekeeper._find(part, queue, dedupe_key) LOOP
					IF best_id IS NULL OR (r.live AND NOT best_live)
					   OR (r.live = best_live AND r.finished_at > best_finished) THEN
						best_id := r.id;
						best_live := r.live;
						best_finished := r.finished_at;
					END IF;
				END LOOP;
			END IF;
			PERFORM gatekeeper._deadline(NULL);
		EXCEPTION WHEN OTHERS THEN
			GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
									det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
			PERFORM gatekeeper._failed(part, NULL, NULL, st, msg, det, hnt);
		END;
	END LOOP;
	IF cancelling THEN
		RETURN any_cancelled::int;
	END IF;
	RETURN best_id;
END
$$;

CREATE FUNCTION gatekeeper.find(queue text, dedupe_key text)
RETURNS bigint
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
SELECT gatekeeper._by_key(false, $1, $2,
	ARRAY(SELECT pg_catalog.generate_series(0, gatekeeper._shard_count() - 1)));
$$;

CREATE FUNCTION gatekeeper.find(queue text, dedupe_key text, recipient text)
RETURNS bigint
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
SELECT gatekeeper._by_key(false, $1, $2,
	ARRAY[(gatekeeper._hash($3) & (gatekeeper._shard_count() - 1))]);
$$;

CREATE FUNCTION gatekeeper.cancel(queue text, dedupe_key text)
RETURNS boolean
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
SELECT gatekeeper._by_key(true, $1, $2,
	ARRAY(SELECT pg_catalog.generate_series(0, gatekeeper._shard_count() - 1))) = 1;
$$;

CREATE FUNCTION gatekeeper.cancel(queue text, dedupe_key text, recipient text)
RETURNS boolean
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
SELECT gatekeeper._by_key(true, $1, $2,
	ARRAY[(gatekeeper._hash($3) & (gatekeeper._shard_count() - 1))]) = 1;
$$;

COMMENT ON FUNCTION gatekeeper.find(text, text) IS
	'the live, else the latest finished, mail with this dedupe key in this queue, asked of every shard';
COMMENT ON FUNCTION gatekeeper.find(text, text, text) IS
	'find(queue, dedupe_key) asked of the recipient''s shard only: the key of a mail to that recipient';
COMMENT ON FUNCTION gatekeeper.cancel(text, text) IS
	'cancel the scheduled mail with this dedupe key in this queue, on every shard';
COMMENT ON FUNCTION gatekeeper.cancel(text, text, text) IS
	'cancel(queue, dedupe_key) on the recipient''s shard only: the key of a mail to that recipient';

/*
 * By recipient: history, suppression
 */
CREATE FUNCTION gatekeeper._history(hash int, recipient text, since timestamptz)
RETURNS TABLE (id bigint, queue text, state gatekeeper.state, send_at timestamptz,
			   finished_at timestamptz, subject text, last_error text)
LANGUAGE plproxy
SET search_path = pg_catalog, pg_temp
AS $$
	CLUSTER 'gatekeeper';
	RUN ON hash;
	SELECT h.id, h.queue, h.state::text AS state, h.send_at, h.finished_at, h.subject, h.last_error
	  FROM gatekeeper.history(recipient, since) h;
$$;

CREATE FUNCTION gatekeeper.history(recipient text, since timestamptz DEFAULT now() - interval '30 days')
RETURNS TABLE (id bigint, queue text, state gatekeeper.state, send_at timestamptz,
			   finished_at timestamptz, subject text, last_error text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	h int := gatekeeper._hash($1);
	timeout double precision := gatekeeper._timeout();
	st text;
	msg text;
	det text;
	hnt text;
BEGIN
	PERFORM gatekeeper._deadline(timeout);
	RETURN QUERY SELECT * FROM gatekeeper._history(h, $1, $2);
	PERFORM gatekeeper._deadline(NULL);
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
							det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
	PERFORM gatekeeper._failed(h, NULL, NULL, st, msg, det, hnt);
END
$$;

CREATE FUNCTION gatekeeper._suppress(hash int, suppressing boolean, address text, reason text,
	queue text, detail text)
RETURNS boolean
LANGUAGE plproxy
SET search_path = pg_catalog, pg_temp
AS $$
	CLUSTER 'gatekeeper';
	RUN ON hash;
	SELECT CASE WHEN suppressing THEN gatekeeper.suppress(address, reason, queue, detail)
				ELSE gatekeeper.unsuppress(address, queue) END AS _suppress;
$$;

CREATE FUNCTION gatekeeper.suppress(address text, reason text DEFAULT 'manual',
	queue text DEFAULT NULL, detail text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	h int := gatekeeper._hash(address);
	timeout double precision := gatekeeper._timeout();
	result boolean;
	st text;
	msg text;
	det text;
	hnt text;
BEGIN
	PERFORM gatekeeper._deadline(timeout);
	result := gatekeeper._suppress(h, true, address, reason, queue, detail);
	PERFORM gatekeeper._deadline(NULL);
	RETURN result;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
							det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
	PERFORM gatekeeper._failed(h, NULL, NULL, st, msg, det, hnt);
	RETURN NULL;
END
$$;

CREATE FUNCTION gatekeeper.unsuppress(address text, queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	h int := gatekeeper._hash(address);
	timeout double precision := gatekeeper._timeout();
	result boolean;
	st text;
	msg text;
	det text;
	hnt text;
BEGIN
	PERFORM gatekeeper._deadline(timeout);
	result := gatekeeper._suppress(h, false, address, NULL, queue, NULL);
	PERFORM gatekeeper._deadline(NULL);
	RETURN result;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
							det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
	PERFORM gatekeeper._failed(h, NULL, NULL, st, msg, det, hnt);
	RETURN NULL;
END
$$;

COMMENT ON FUNCTION gatekeeper.history(text, timestamptz) IS
	'the mail to one recipient enqueued since a time, oldest first, from the recipient''s shard';
COMMENT ON FUNCTION gatekeeper.suppress(text, text, text, text) IS
	'add an address to the suppression list of its shard';
COMMENT ON FUNCTION gatekeeper.unsuppress(text, text) IS
	'remove an address from the suppression list of its shard';

/*
 * Unsubscribe.  A token names its recipient (src/unsubscribe.c: version,
 * the recipient's length and octets, the queue, the HMAC; URL-safe base64),
 * so it goes to the recipient's shard, which verifies it.  A token that
 * shard's secret does not verify (it was signed by another shard, before
 * the recipient moved) is offered to the others; the one whose secret
 * verifies records it, and the recipient's shard then suppresses the
 * recipient for that queue too, since that is where its mail is claimed.
 */
CREATE FUNCTION gatekeeper._token_names(token text, OUT recipient text, OUT queue text)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	raw bytea;
	b64 text;
	len int;
BEGIN
	b64 := pg_catalog.translate(token, '-_', '+/');
	b64 := b64 || pg_catalog.repeat('=', (4 - pg_catalog.length(b64) % 4) % 4);
	raw := pg_catalog.decode(b64, 'base64');
	len := pg_catalog.get_byte(raw, 1);
	IF pg_catalog.get_byte(raw, 0) <> 1 OR pg_catalog.length(raw) < 2 + len + 32 THEN
		RETURN;
	END IF;
	recipient := pg_catalog.convert_from(pg_catalog.substr(raw, 3, len), 'UTF8');
	queue := pg_catalog.convert_from(pg_catalog.substr(raw, 3 + len, pg_catalog.length(raw) - 2 - len - 32), 'UTF8');
EXCEPTION WHEN OTHERS THEN
	-- not a token: the shard that gets it says so
	recipient := NULL;
	queue := NULL;
END
$$;

CREATE FUNCTION gatekeeper._unsubscribe(hash bigint, token text)
RETURNS boolean
LANGUAGE plproxy
SET search_path = pg_catalog, pg_temp
AS $$
	CLUSTER 'gatekeeper';
	RUN ON hash;
	SELECT gatekeeper.unsubscribe(token) AS _unsubscribe;
$$;

CREATE FUNCTION gatekeeper.unsubscribe(token text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	names record := gatekeeper._token_names(token);
	count int := gatekeeper._shard_count();
	home int := gatekeeper._hash(names.recipient) & (count - 1);
	timeout double precision := gatekeeper._timeout();
	part int;
	result boolean;
	st text;
	msg text;
	det text;
	hnt text;
	refusal record;
BEGIN
	FOR part IN SELECT p FROM pg_catalog.generate_series(0, count - 1) AS p
				 ORDER BY p <> home, p LOOP
		BEGIN
			PERFORM gatekeeper._deadline(timeout);
			result := gatekeeper._unsubscribe(part, token);
			IF part <> home THEN
				-- signed elsewhere: the recipient's own shard suppresses too
				PERFORM gatekeeper._deadline(timeout);
				PERFORM gatekeeper._suppress(home, true, names.recipient, 'unsubscribe', names.queue,
					'unsubscribe token verified by shard p' || part);
			END IF;
			PERFORM gatekeeper._deadline(NULL);
			RETURN result;
		EXCEPTION WHEN OTHERS THEN
			GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
									det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
			-- not genuine here: ask the next shard; the first refusal is the answer
			IF st = '22023' AND msg ~ 'REMOTE ERROR: invalid unsubscribe token' THEN
				IF refusal IS NULL THEN
					SELECT part, st, msg, det, hnt INTO refusal;
				END IF;
				CONTINUE;
			END IF;
			PERFORM gatekeeper._failed(part, NULL, NULL, st, msg, det, hnt);
		END;
	END LOOP;
	PERFORM gatekeeper._failed(refusal.part, NULL, NULL, refusal.st, refusal.msg, refusal.det, refusal.hnt);
	RETURN NULL;
END
$$;

COMMENT ON FUNCTION gatekeeper.unsubscribe(text) IS
	'unsubscribe by a List-Unsubscribe token, on the shard that holds its recipient';

/*
 * queue_stats: every shard's, summed
 */
CREATE FUNCTION gatekeeper._queue_stats(part int)
RETURNS TABLE (queue text, paused boolean, scheduled bigint, due bigint, claimed bigint,
			   oldest_due_age interval, enqueued bigint, sent bigint, failed bigint,
			   suppressed bigint, expired bigint, cancelled bigint, unknown bigint,
			   lease_expired bigint, deferred bigint, bounced bigint, complained bigint,
			   retrying bigint, rate double precision, eta interval)
LANGUAGE plproxy
SET search_path = pg_catalog, pg_temp
AS $$
	CLUSTER 'gatekeeper';
	RUN ON part;
	SELECT s.queue, s.paused, s.scheduled, s.due, s.claimed, s.oldest_due_age, s.enqueued, s.sent,
		   s.failed, s.suppressed, s.expired, s.cancelled, s.unknown, s.lease_expired,
		   s.deferred, s.bounced, s.complained, s.retrying, s.rate, s.eta
	  FROM gatekeeper.queue_stats s;
$$;

-- every shard's queue_stats rows, with the shard's number
CREATE FUNCTION gatekeeper.shard_queue_stats()
RETURNS TABLE (shard int, queue text, paused boolean, scheduled bigint, due bigint, claimed bigint,
			   oldest_due_age interval, enqueued bigint, sent bigint, failed bigint,
			   suppressed bigint, expired bigint, cancelled bigint, unknown bigint,
			   lease_expired bigint, deferred bigint, bounced bigint, complained bigint,
			   retrying bigint, rate double precision, eta interval)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	timeout double precision := gatekeeper._timeout();
	part int;
	st text;
	msg text;
	det text;
	hnt text;
BEGIN
	FOR part IN 0 .. gatekeeper._shard_count() - 1 LOOP
		BEGIN
			PERFORM gatekeeper._deadline(timeout);
			RETURN QUERY SELECT part, s.* FROM gatekeeper._queue_stats(part) s;
			PERFORM gatekeeper._deadline(NULL);
		EXCEPTION WHEN OTHERS THEN
			GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
									det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
			PERFORM gatekeeper._failed(part, NULL, NULL, st, msg, det, hnt);
		END;
	END LOOP;
END
$$;

COMMENT ON FUNCTION gatekeeper.shard_queue_stats() IS
	'every shard''s queue_stats, one row per shard and queue';

CREATE VIEW gatekeeper.queue_stats AS
SELECT s.queue,
	   pg_catalog.bool_or(s.paused) AS paused,
	   pg_catalog.sum(s.scheduled)::bigint AS scheduled,
	   pg_catalog.sum(s.due)::bigint AS due,
	   pg_catalog.sum(s.claimed)::bigint AS claimed,
	   pg_catalog.max(s.oldest_due_age) AS oldest_due_age,
	   pg_catalog.sum(s.enqueued)::bigint AS enqueued,
	   pg_catalog.sum(s.sent)::bigint AS sent,
	   pg_catalog.sum(s.failed)::bigint AS failed,
	   pg_catalog.sum(s.suppressed)::bigint AS suppressed,
	   pg_catalog.sum(s.expired)::bigint AS expired,
	   pg_catalog.sum(s.cancelled)::bigint AS cancelled,
	   pg_catalog.sum(s.unknown)::bigint AS unknown,
	   pg_catalog.sum(s.lease_expired)::bigint AS lease_expired,
	   pg_catalog.sum(s.deferred)::bigint AS deferred,
	   pg_catalog.sum(s.bounced)::bigint AS bounced,
	   pg_catalog.sum(s.complained)::bigint AS complained,
	   pg_catalog.sum(s.retrying)::bigint AS retrying,
	   pg_catalog.sum(s.rate) AS rate,
	   pg_catalog.max(s.eta) AS eta
  FROM gatekeeper.shard_queue_stats() s
 GROUP BY s.queue;

COMMENT ON VIEW gatekeeper.queue_stats IS
	'per queue, over every shard: live mail, totals and rates summed, the oldest due age and the eta the largest, paused when any shard has it paused';

/*
 * Roles given a use of the router by grant(), as on a shard: 'enqueue' (an
 * application: enqueue, enqueue_batch, status, find, cancel, history,
 * suppress, unsubscribe, with the internal functions they call) or
 * 'monitor' (queue_stats, shard_queue_stats).  Claiming is not routed, so
 * there is no 'worker' here; administration (queues, gates, unsuppress)
 * stays the owner's.  Each use also needs USAGE on the foreign server
 * gatekeeper (given when it exists) and, on every shard, its user
 * mapping's role given the same use there (docs/sharding.md).
 */
CREATE TABLE gatekeeper.role_grant (
	role		regrole NOT NULL,
	what		text NOT NULL CHECK (what IN ('enqueue', 'monitor')),
	granted_at	timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (role, what)
);
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.role_grant', '');

-- gives the remembered roles (or one) the privileges of their uses: USAGE
-- on the schema and on the foreign server gatekeeper, EXECUTE on every
-- overload of each function of the use, SELECT on its views; forgets
-- dropped roles
CREATE FUNCTION gatekeeper._grant_apply(only_role regrole DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	g record;
	o record;
	f regprocedure;
BEGIN
	DELETE FROM gatekeeper.role_grant r
	 WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_roles a WHERE a.oid = r.role::oid);
	FOR g IN SELECT r.role, r.what FROM gatekeeper.role_grant r
			  WHERE only_role IS NULL OR r.role = only_role ORDER BY r.role::oid, r.what LOOP
		EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA gatekeeper TO %s', g.role);
		IF EXISTS (SELECT FROM pg_catalog.pg_foreign_server s WHERE s.srvname = 'gatekeeper') THEN
			EXECUTE pg_catalog.format('GRANT USAGE ON FOREIGN SERVER gatekeeper TO %s', g.role);
		END IF;
		FOR o IN SELECT v.kind, v.name
				   FROM (VALUES
						('enqueue', 'function', 'enqueue'),
						('enqueue', 'function', '_enqueue'),
						('enqueue', 'function', 'enqueue_batch'),
						('enqueue', 'function', '_enqueue_rows'),
						('enqueue', 'function', 'status'),
						('enqueue', 'function', '_status_any'),
						('enqueue', 'function', '_status'),
						('enqueue', 'function', '_id_shards'),
						('enqueue', 'function', 'cancel'),
						('enqueue', 'function', '_cancel'),
						('enqueue', 'function', 'find'),
						('enqueue', 'function', '_by_key'),
						('enqueue', 'function', '_find'),
						('enqueue', 'function', '_cancel_key'),
						('enqueue', 'function', 'history'),
						('enqueue', 'function', '_history'),
						('enqueue', 'function', 'suppress'),
						('enqueue', 'function', '_suppress'),
						('enqueue', 'function', 'unsubscribe'),
						('enqueue', 'function', '_unsubscribe'),
						('enqueue', 'function', '_token_names'),
						('monitor', 'function', 'shard_queue_stats'),
						('monitor', 'function', '_queue_stats'),
						('monitor', 'view', 'queue_stats'),
						('enqueue', 'function', '_shard_count'),
						('enqueue', 'function', '_shard_name'),
						('enqueue', 'function', '_hash'),
						('enqueue', 'function', '_timeout'),
						('enqueue', 'function', '_deadline'),
						('enqueue', 'function', '_deadline_passed'),
						('enqueue', 'function', '_failed'),
						('monitor', 'function', '_shard_count'),
						('monitor', 'function', '_shard_name'),
						('monitor', 'function', '_timeout'),
						('monitor', 'function', '_deadline'),
						('monitor', 'function', '_deadline_passed'),
						('monitor', 'function', '_failed'))
						AS v(what, kind, name)
				  WHERE v.what = g.what LOOP
			IF o.kind = 'function' THEN
				FOR f IN SELECT p.oid::pg_catalog.regprocedure FROM pg_catalog.pg_proc p
						  WHERE p.pronamespace = 'gatekeeper'::pg_catalog.regnamespace
							AND p.proname = o.name ORDER BY p.oid LOOP
					EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', f, g.role);
				END LOOP;
			ELSE
				EXECUTE pg_catalog.format('GRANT SELECT ON gatekeeper.%I TO %s', o.name, g.role);
			END IF;
		END LOOP;
	END LOOP;
END
$$;

CREATE FUNCTION gatekeeper.grant(role regrole, what text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF role IS NULL OR what IS NULL THEN
		RAISE EXCEPTION 'role and what must not be null'
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF what = 'worker' THEN
		RAISE EXCEPTION 'the router has no use "worker"'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'Claiming is not routed: an external sender claims on a shard.',
				  HINT = 'Run gatekeeper.grant(role, ''worker'') on each shard the sender claims from.';
	END IF;
	IF what NOT IN ('enqueue', 'monitor') THEN
		RAISE EXCEPTION 'unknown use "%"', what
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'A use of the router is ''enqueue'' or ''monitor''.';
	END IF;
	INSERT INTO gatekeeper.role_grant (role, what) VALUES ($1, $2)
	ON CONFLICT DO NOTHING;
	PERFORM gatekeeper._grant_apply($1);
END
$$;

COMMENT ON FUNCTION gatekeeper.grant(regrole, text) IS
	'give a router role what one use needs (''enqueue'' or ''monitor''); its user mapping''s role needs the same use on every shard';

/*
 * Privileges: nothing for PUBLIC.  A role needs EXECUTE on the functions
 * it calls, USAGE on the schema and on the foreign server gatekeeper, and
 * a user mapping (docs/sharding.md): grant() gives the first three.
 */
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA gatekeeper FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA gatekeeper FROM PUBLIC;
REVOKE ALL ON TYPE gatekeeper.state FROM PUBLIC;
REVOKE ALL ON SCHEMA gatekeeper FROM PUBLIC;
