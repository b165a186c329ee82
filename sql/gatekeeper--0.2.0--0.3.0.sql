/* gatekeeper 0.2.0 -> 0.3.0 (ALTER EXTENSION gatekeeper UPDATE TO '0.3.0') */
\echo Use "ALTER EXTENSION gatekeeper UPDATE TO '0.3.0'" to load this file. \quit

/*
 * Every change here is also in gatekeeper--0.3.0.sql; t/031_upgrade.pl
 * checks that a 0.2.0 updated to 0.3.0, a 0.1.0 updated through 0.2.0 and
 * a fresh 0.3.0 have the same objects.  Each issue's changes are a section
 * of their own, in the order they landed.
 */

/*
 * Issue 28: gatekeeper.grant(role, use), remembered in role_grant.
 */
/*
 * Roles given a use of gatekeeper by grant() (issue 28): 'enqueue' (an
 * application that enqueues and looks its mail up), 'worker' (an external
 * sender) or 'monitor' (what postgres_exporter connects as).  Remembered so
 * that every update, which may add or replace functions, gives each role
 * its use's privileges on them again (_grant_apply() ends every update
 * script).  A role dropped since is forgotten at the next grant() or update.
 */
CREATE TABLE gatekeeper.role_grant (
	role		regrole NOT NULL,
	what		text NOT NULL CHECK (what IN ('enqueue', 'worker', 'monitor')),
	granted_at	timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (role, what)
);
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.role_grant', '');

-- gives the remembered roles (or one) the privileges of their uses: USAGE
-- on the schema, EXECUTE on every function of the use (each of its
-- overloads, so a function whose signature an update changed is granted
-- again), and the use's table and view privileges; forgets dropped roles
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
		FOR o IN SELECT v.kind, v.name, v.privilege
				   FROM (VALUES
						('enqueue', 'function', 'enqueue', NULL),
						('enqueue', 'function', '_segment', NULL),
						('enqueue', 'function', 'status', NULL),
						('enqueue', 'function', 'find', NULL),
						('enqueue', 'function', 'history', NULL),
						('enqueue', 'function', 'cancel', NULL),
						('enqueue', 'table', 'mail',
						 'INSERT (recipient, subject, body, queue, send_at, html, sender, headers, dedupe_key, '
						 'priority, send_by, recipient_name, metadata, timezone)'),
						('worker', 'function', 'claim', NULL),
						('worker', 'function', 'ack', NULL),
						('worker', 'function', 'ack_batch', NULL),
						('worker', 'function', 'nack', NULL),
						('worker', 'function', 'nack_batch', NULL),
						('worker', 'function', 'extend', NULL),
						('worker', 'function', 'reap', NULL),
						('worker', 'function', 'unclaim', NULL),
						('worker', 'function', 'next_due', NULL),
						('worker', 'function', '_queue_totals', NULL),
						('worker', 'function', '_live_stats', NULL),
						('worker', 'table', 'queue_stats', 'SELECT'),
						('monitor', 'function', '_queue_totals', NULL),
						('monitor', 'function', '_live_stats', NULL),
						('monitor', 'function', '_gate_memory', NULL),
						('monitor', 'function', '_worker_status', NULL),
						('monitor', 'table', 'queue_stats', 'SELECT'),
						('monitor', 'table', 'gate_memory', 'SELECT'),
						('monitor', 'table', 'worker_status', 'SELECT'))
						AS v(what, kind, name, privilege)
				  WHERE v.what = g.what LOOP
			IF o.kind = 'function' THEN
				FOR f IN SELECT p.oid::pg_catalog.regprocedure FROM pg_catalog.pg_proc p
						  WHERE p.pronamespace = 'gatekeeper'::pg_catalog.regnamespace
							AND p.proname = o.name ORDER BY p.oid LOOP
					EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', f, g.role);
				END LOOP;
			ELSE
				EXECUTE pg_catalog.format('GRANT %s ON gatekeeper.%I TO %s', o.privilege, o.name, g.role);
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
	IF what NOT IN ('enqueue', 'worker', 'monitor') THEN
		RAISE EXCEPTION 'unknown use "%"', what
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'A use is ''enqueue'', ''worker'' or ''monitor''.';
	END IF;
	INSERT INTO gatekeeper.role_grant (role, what) VALUES ($1, $2)
	ON CONFLICT DO NOTHING;
	PERFORM gatekeeper._grant_apply($1);
END
$$;

COMMENT ON FUNCTION gatekeeper.grant(regrole, text) IS
	'give a role what one use of gatekeeper needs (''enqueue'', ''worker'' or ''monitor''), and again after every update';

REVOKE ALL ON TABLE gatekeeper.role_grant FROM PUBLIC;
REVOKE ALL ON FUNCTION gatekeeper._grant_apply(regrole), gatekeeper.grant(regrole, text) FROM PUBLIC;

-- The roles 0.2.0's README recipes made (each holding EXECUTE, granted to
-- it directly, on every function of one recipe) are remembered as having
-- that use, so that _grant_apply() below gives them what 0.3.0 adds to it.
-- A role granted only part of a recipe is left as it is.
INSERT INTO gatekeeper.role_grant (role, what)
SELECT h.grantee::regrole, r.what
  FROM (VALUES
		('enqueue', ARRAY['gatekeeper.enqueue(text, text, text, text, timestamptz, text, text, jsonb, text, int, timestamptz, text, jsonb, text)',
						  'gatekeeper._segment()', 'gatekeeper.status(bigint)', 'gatekeeper.find(text, text)',
						  'gatekeeper.history(text, timestamptz)', 'gatekeeper.cancel(bigint)',
						  'gatekeeper.cancel(text, text)']),
		('worker', ARRAY['gatekeeper.claim(text, int, interval, text[])', 'gatekeeper.ack(bigint, int)',
						 'gatekeeper.ack_batch(bigint[], int[])', 'gatekeeper.nack(bigint, int, text, boolean)',
						 'gatekeeper.nack_batch(bigint[], int[], text[], boolean)',
						 'gatekeeper.extend(bigint, int, interval)', 'gatekeeper.reap()',
						 'gatekeeper.unclaim(bigint[], int[], text, interval)',
						 'gatekeeper._queue_totals()', 'gatekeeper._live_stats()']),
		('monitor', ARRAY['gatekeeper._queue_totals()', 'gatekeeper._live_stats()', 'gatekeeper._gate_memory()',
						  'gatekeeper._worker_status()']))
		AS r(what, funcs),
	   LATERAL (SELECT a.grantee
				  FROM unnest(r.funcs) AS f(sig)
				  JOIN pg_catalog.pg_proc p ON p.oid = f.sig::pg_catalog.regprocedure,
					   pg_catalog.aclexplode(p.proacl) AS a
				 WHERE a.privilege_type = 'EXECUTE'
				 GROUP BY a.grantee
				HAVING count(DISTINCT p.oid) = cardinality(r.funcs)) h
 WHERE h.grantee <> 0
   AND h.grantee <> (SELECT x.extowner FROM pg_catalog.pg_extension x WHERE x.extname = 'gatekeeper');

/*
 * Issue 29, item 2: gatekeeper.shard(n, count), mail ids that name their shard.
 */
/*
 * Shards (issue 29).  Several gatekeepers can share the recipients between
 * them, one shard each, behind the gatekeeper_router extension (PL/Proxy).
 * A mail's id then says which shard holds it: the operator runs
 * gatekeeper.shard(n, count) once on shard n of count, and the mail ids
 * that shard draws are the ones congruent to n modulo count, so no two
 * shards draw the same id and the router sends status(id) and cancel(id)
 * to the shard id & (count - 1).
 *
 * pg_dump keeps a sequence's value but not its increment (the sequence is
 * the extension's, made by CREATE EXTENSION): (n, count) is kept in
 * shard_position, whose restored row gives the restored sequence its
 * increment again.
 */
CREATE TABLE gatekeeper.shard_position (
	single		boolean PRIMARY KEY DEFAULT true CHECK (single),
	n			int NOT NULL,
	count		int NOT NULL,
	set_at		timestamptz NOT NULL DEFAULT now(),
	CHECK (count BETWEEN 1 AND 65536 AND (count & (count - 1)) = 0 AND n BETWEEN 0 AND count - 1)
);
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.shard_position', '');

COMMENT ON TABLE gatekeeper.shard_position IS
	'this database''s place among the shards, set by shard(n, count): it draws the mail ids congruent to n modulo count';

-- gives gatekeeper.mail_id_seq the increment of the shard position being
-- written: by shard(), and by a restore, which loads the row
CREATE FUNCTION gatekeeper._shard_apply() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	EXECUTE pg_catalog.format('ALTER SEQUENCE gatekeeper.mail_id_seq INCREMENT BY %s', NEW.count);
	RETURN NEW;
END
$$;

CREATE TRIGGER shard_position_apply AFTER INSERT OR UPDATE ON gatekeeper.shard_position
	FOR EACH ROW EXECUTE FUNCTION gatekeeper._shard_apply();

/*
 * Makes this database shard n of count: count is a power of two (PL/Proxy
 * maps a hash to a shard by its low bits), n one of 0 .. count - 1.  The
 * next mail id is the first one congruent to n above every id this
 * database has drawn or holds, and every id after it is count more.  May
 * be run again, as when shard n of count becomes shards n and n + count of
 * twice as many.
 */
CREATE FUNCTION gatekeeper.shard(n int, count int)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	above bigint;
	next_id bigint;
BEGIN
	IF shard.n IS NULL OR shard.count IS NULL THEN
		RAISE EXCEPTION 'n and count must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF shard.count NOT BETWEEN 1 AND 65536 OR (shard.count & (shard.count - 1)) <> 0 THEN
		RAISE EXCEPTION 'count must be a power of two between 1 and 65536'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = pg_catalog.format('count was %s.', shard.count);
	END IF;
	IF shard.n NOT BETWEEN 0 AND shard.count - 1 THEN
		RAISE EXCEPTION 'n must be between 0 and count - 1'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = pg_catalog.format('n was %s and count %s.', shard.n, shard.count);
	END IF;
	-- no mail may be enqueued between the look and the restart
	LOCK TABLE gatekeeper.mail IN SHARE MODE;
	SELECT greatest((SELECT s.last_value FROM gatekeeper.mail_id_seq s),
					(SELECT max(m.id) FROM gatekeeper.mail m), 0)
	  INTO above;
	next_id := above + 1 + ((shard.n - (above + 1)) % shard.count + shard.count) % shard.count;
	INSERT INTO gatekeeper.shard_position AS p (n, count) VALUES (shard.n, shard.count)
	ON CONFLICT (single) DO UPDATE SET n = excluded.n, count = excluded.count, set_at = now();
	EXECUTE pg_catalog.format('ALTER SEQUENCE gatekeeper.mail_id_seq RESTART WITH %s', next_id);
END
$$;

COMMENT ON FUNCTION gatekeeper.shard(int, int) IS
	'make this database shard n of count (a power of two): its mail ids are then those congruent to n modulo count';

REVOKE ALL ON TABLE gatekeeper.shard_position FROM PUBLIC;
REVOKE ALL ON FUNCTION gatekeeper._shard_apply(), gatekeeper.shard(int, int) FROM PUBLIC;

/*
 * Last, always: give the remembered roles what their uses need of the
 * functions this update added or replaced.  Keep this the script's end.
 */
SELECT gatekeeper._grant_apply();
