-- The extension installs cleanly, with its objects, its default queue and
-- gate, and no privileges for PUBLIC.
SET client_min_messages = warning;
\set VERBOSITY terse

CREATE EXTENSION gatekeeper;

-- the schema and its relations
SELECT c.relname, c.relkind
  FROM pg_class c
 WHERE c.relnamespace = 'gatekeeper'::regnamespace AND c.relkind IN ('r', 'v', 'S')
 ORDER BY c.relname;

SELECT enum_range(NULL::gatekeeper.state);

-- the public API, with its signatures
SELECT p.oid::regprocedure::text AS function, pg_get_function_result(p.oid) AS returns
  FROM pg_proc p
 WHERE p.pronamespace = 'gatekeeper'::regnamespace AND p.proname !~ '^_'
 ORDER BY 1;

-- the default queue exists and has no gates; the smart_sending gate is 16 hours, 1 send
SELECT name, gates, on_gate_closed, delivery, max_attempts, weight, rate_limit,
       dedupe_window, paused
  FROM gatekeeper.queue ORDER BY name;
SELECT name, period, max_sends FROM gatekeeper.gate ORDER BY name;

-- queue_stats has the documented columns, in order
SELECT attnum, attname FROM pg_attribute
 WHERE attrelid = 'gatekeeper.queue_stats'::regclass AND attnum > 0
 ORDER BY attnum;
SELECT * FROM gatekeeper.queue_stats ORDER BY queue;

-- every function pins search_path: none may be missing it
SELECT p.oid::regprocedure::text AS unpinned
  FROM pg_proc p
 WHERE p.pronamespace = 'gatekeeper'::regnamespace
   AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)
 ORDER BY 1;

-- no function is executable by PUBLIC
SELECT p.oid::regprocedure::text AS public_executable
  FROM pg_proc p
 WHERE p.pronamespace = 'gatekeeper'::regnamespace
   AND has_function_privilege('public', p.oid, 'EXECUTE')
 ORDER BY 1;
SELECT p.oid::regprocedure::text AS acl_for_public
  FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
 WHERE p.pronamespace = 'gatekeeper'::regnamespace AND a.grantee = 0
 ORDER BY 1;

-- no table, view or sequence is readable or writable by PUBLIC, nor the schema usable
SELECT c.oid::regclass::text AS public_access, a.privilege_type
  FROM pg_class c, aclexplode(coalesce(c.relacl, acldefault(
           CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END::"char", c.relowner))) a
 WHERE c.relnamespace = 'gatekeeper'::regnamespace AND a.grantee = 0
 ORDER BY 1, 2;
SELECT has_schema_privilege('public', 'gatekeeper', 'USAGE') AS public_schema_usage;
SELECT c.relname, has_table_privilege('public', c.oid, 'SELECT') AS public_select
  FROM pg_class c
 WHERE c.relnamespace = 'gatekeeper'::regnamespace AND c.relkind IN ('r', 'v')
 ORDER BY c.relname;

-- user data survives pg_dump
SELECT unnest(extconfig)::regclass::text AS dumped FROM pg_extension
 WHERE extname = 'gatekeeper' ORDER BY 1;
