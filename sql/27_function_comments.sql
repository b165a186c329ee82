-- Every function of schema gatekeeper that a user may call has a COMMENT
-- (issue 26, item 6): each function without a leading underscore, and each
-- internal one that grant() gives a role (or that any other role but a
-- superuser may run).  The last query lists those that lack one: none.
SET client_min_messages = warning;
\set VERBOSITY terse

CREATE ROLE regress_c_enqueue NOLOGIN;
CREATE ROLE regress_c_worker NOLOGIN;
CREATE ROLE regress_c_monitor NOLOGIN;
SELECT gatekeeper.grant('regress_c_enqueue', 'enqueue');
SELECT gatekeeper.grant('regress_c_worker', 'worker');
SELECT gatekeeper.grant('regress_c_monitor', 'monitor');

-- the internal functions the uses give a role: the check below sees them
SELECT DISTINCT p.proname AS granted_internal
  FROM pg_proc p, pg_roles r
 WHERE p.pronamespace = 'gatekeeper'::regnamespace AND p.proname ~ '^_'
   AND NOT r.rolsuper AND has_function_privilege(r.oid, p.oid, 'EXECUTE')
 ORDER BY 1;

-- a comment is a sentence, not an empty string
SELECT p.oid::regprocedure::text AS uncommented
  FROM pg_proc p
 WHERE p.pronamespace = 'gatekeeper'::regnamespace
   AND (p.proname !~ '^_'
		OR EXISTS (SELECT FROM pg_roles r
					WHERE NOT r.rolsuper AND has_function_privilege(r.oid, p.oid, 'EXECUTE')))
   AND coalesce(obj_description(p.oid, 'pg_proc'), '') !~ '\w'
 ORDER BY 1;

-- clean up
DROP OWNED BY regress_c_enqueue, regress_c_worker, regress_c_monitor;
DROP ROLE regress_c_enqueue, regress_c_worker, regress_c_monitor;
DELETE FROM gatekeeper.role_grant;
