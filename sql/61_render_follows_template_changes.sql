-- render() keeps what it read of a template (the versions once per
-- snapshot, a version compiled once per process), and shows every change
-- as soon as its snapshot sees it (issue 48): a new version, in the next
-- statement and within a transaction, and not once it is rolled back; a
-- name dropped and made again, with its new parts under the old version
-- number; a dropped template, 42704.  (Another session's changes:
-- specs/render_sees_committed_versions.spec.)
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of.inc

SELECT gatekeeper.create_template('news', 'v1 {{name}}', 'body 1');
SELECT r.subject FROM gatekeeper.render('news', '{"name": "Jo"}') r;
-- a new version: the next statement shows it
SELECT gatekeeper.alter_template('news', subject => 'v2 {{name}}') AS version;
SELECT r.subject FROM gatekeeper.render('news', '{"name": "Jo"}') r;
-- within a transaction, and no longer once rolled back
BEGIN;
SELECT r.subject FROM gatekeeper.render('news', '{"name": "Jo"}') r;
SELECT gatekeeper.alter_template('news', subject => 'v3 {{name}}') AS version;
SELECT r.subject FROM gatekeeper.render('news', '{"name": "Jo"}') r;
ROLLBACK;
SELECT r.subject FROM gatekeeper.render('news', '{"name": "Jo"}') r;
SELECT v AS version, r.subject FROM generate_series(1, 2) v,
	   gatekeeper.render('news', '{"name": "Jo"}', v) r ORDER BY v;
-- within one statement: a function that alters, then renders
CREATE FUNCTION pg_temp.alter_then_render() RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
	before text;
BEGIN
	SELECT r.subject INTO before FROM gatekeeper.render('news', '{"name": "Jo"}') r;
	PERFORM gatekeeper.alter_template('news', subject => 'v3 {{name}}');
	RETURN before || ' then ' ||
		(SELECT r.subject FROM gatekeeper.render('news', '{"name": "Jo"}') r);
END
$$;
SELECT pg_temp.alter_then_render() AS one_statement;
-- dropped and made again: version 1 again, with its new parts
SELECT r.subject FROM gatekeeper.render('news', '{"name": "Jo"}', 1) r;
SELECT gatekeeper.drop_template('news');
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.render('news', '{"name": "Jo"}')$$) AS dropped;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.render('news', '{"name": "Jo"}', 1)$$) AS dropped_v1;
SELECT gatekeeper.create_template('news', 'again {{name}}', 'body again');
SELECT r.subject, r.body FROM gatekeeper.render('news', '{"name": "Jo"}', 1) r;
-- dropped and made again in one transaction
BEGIN;
SELECT gatekeeper.drop_template('news');
SELECT gatekeeper.create_template('news', 'third {{name}}', 'body third');
SELECT r.subject, r.body FROM gatekeeper.render('news', '{"name": "Jo"}') r;
COMMIT;
SELECT r.subject, r.body FROM gatekeeper.render('news', '{"name": "Jo"}') r;
SELECT gatekeeper.drop_template('news');
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.render('news', '{}')$$) AS dropped_again;
