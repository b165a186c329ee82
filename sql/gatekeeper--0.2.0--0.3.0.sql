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
 * Last, always: give the remembered roles what their uses need of the
 * functions this update added or replaced.  Keep this the script's end.
 */
SELECT gatekeeper._grant_apply();
