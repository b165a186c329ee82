-- A campaign's template is read once per statement, not once a mail
-- (issue 48's performance): render() over many rows reads
-- gatekeeper.template once (it used to read the template's row, and its
-- html from TOAST, at every call), and an INSERT ... SELECT of many
-- templated rows looks each template up once (it used to look it up
-- again for every row).  Counted with pg_stat_xact_user_tables: the scans
-- of gatekeeper.template a statement made, within a transaction (its
-- counts may hold earlier transactions' too, until they are reported).
SET client_min_messages = warning;
\set VERBOSITY terse

SELECT gatekeeper.create_template('camp_a', 'Hi {{name}}', 'Body {{name}}',
	html => '<p>{{name}}</p>{{#items}}<li>{{.}}</li>{{/items}}');
SELECT gatekeeper.create_template('camp_b', 'Hello {{name}}', 'Other body {{name}}');
SELECT gatekeeper.create_queue('camp_q');
SELECT gatekeeper.pause('camp_q');

-- the scans of gatekeeper.template this backend made and has not reported
CREATE FUNCTION pg_temp.template_scans() RETURNS bigint
LANGUAGE sql AS $$
	SELECT seq_scan + idx_scan FROM pg_stat_xact_user_tables
	 WHERE relid = 'gatekeeper.template'::regclass
$$;
-- the scans since :scans, the count before the statement
CREATE FUNCTION pg_temp.scans_since(before bigint) RETURNS text
LANGUAGE sql AS $$
	SELECT CASE WHEN s.n BETWEEN 1 AND 2 THEN 'one or two' ELSE s.n::text END
	  FROM (SELECT pg_temp.template_scans() - before AS n) s
$$;

-- 500 renderings in one statement, each its own
BEGIN;
SELECT pg_temp.template_scans() AS scans \gset
SELECT count(*) AS rendered, count(DISTINCT r.subject) AS subjects,
	   count(*) FILTER (WHERE r.html = '<p>n' || g || '</p><li>' || g || '</li>') AS html_right
  FROM generate_series(1, 500) g,
	   gatekeeper.render('camp_a', jsonb_build_object('name', 'n' || g, 'items', jsonb_build_array(g))) r;
SELECT pg_temp.scans_since(:scans) AS render_scans;
COMMIT;

-- 500 templated rows of two templates (A/B), in one statement
BEGIN;
SELECT pg_temp.template_scans() AS scans \gset
INSERT INTO gatekeeper.mail (recipient, queue, template, data)
SELECT 'c' || g || '@example.com', 'camp_q', CASE WHEN g % 2 = 0 THEN 'camp_a' ELSE 'camp_b' END,
	   jsonb_build_object('name', 'n' || g)
  FROM generate_series(1, 500) g;
SELECT pg_temp.scans_since(:scans) AS enqueue_scans;
COMMIT;
SELECT template, count(*) FROM gatekeeper.mail WHERE queue = 'camp_q' GROUP BY 1 ORDER BY 1;

-- the claim renders each as render() shows it
SELECT gatekeeper.resume('camp_q');
CREATE TEMP TABLE claimed AS
SELECT * FROM gatekeeper.claim('w', 1000, '1 minute', '{camp_q}');
WITH c AS MATERIALIZED (
	SELECT c.*, m.template, m.data FROM claimed c JOIN gatekeeper.mail m ON m.id = c.id)
SELECT count(*) AS claimed,
	   count(*) FILTER (WHERE c.subject = r.subject AND c.body = r.body
						AND c.html IS NOT DISTINCT FROM r.html) AS as_render_shows
  FROM c, gatekeeper.render(c.template, c.data) r;
