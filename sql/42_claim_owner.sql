-- A claim belongs to the role that made it (issue 44, item 4).  Two worker
-- roles made as the README says (gatekeeper.grant(role, 'worker')): the
-- other role's ack, ack_batch, nack, nack_batch, extend and unclaim of a
-- current claim are refused with 42501 and write nothing (one claim of
-- another role fails a batch call whole); a stale claim is still only a
-- stale fencing token (false); a superuser may act on a role's claim, no
-- SQL caller on a background worker's (owner 0); a claim made before
-- owners were kept (NULL, after an update) is anyone's.  extend never
-- shortens a lease, even of the one open mail of its batch.
SET client_min_messages = warning;
\set VERBOSITY terse
\i sql/error_of_detail.inc

-- the error of sql, the mail's id in its message left out
CREATE FUNCTION pg_temp.refused(sql text) RETURNS text
LANGUAGE sql AS $$
	SELECT regexp_replace(pg_temp.error_of(sql), 'mail [0-9]+', 'mail N')
$$;

-- each claim of the queue as its mail stands: its state, attempt, and
-- whether its lease is the one the claim gave it ($1)
CREATE FUNCTION pg_temp.claims(lease timestamptz) RETURNS TABLE (n bigint, state gatekeeper.state,
	attempt int, claims_lease boolean)
LANGUAGE sql AS $$
	SELECT row_number() OVER (ORDER BY s.id), s.state, s.attempt, s.lease_until = lease
	  FROM gatekeeper.mail_status s WHERE s.queue = 'own_q' ORDER BY s.id
$$;

CREATE ROLE regress_owner_a NOLOGIN;
CREATE ROLE regress_owner_b NOLOGIN;
SELECT gatekeeper.grant('regress_owner_a', 'worker');
SELECT gatekeeper.grant('regress_owner_b', 'worker');
SELECT gatekeeper.create_queue('own_q', background => false);
SELECT count(gatekeeper.enqueue('own' || i || '@example.com', 'O' || i, 'b', 'own_q')) AS enqueued
  FROM generate_series(1, 6) i;

-- A claims three, B the other three; each claim is one batch row, owned
SET ROLE regress_owner_a;
CREATE TEMP TABLE own_a AS
SELECT id, attempt FROM gatekeeper.claim('worker-a', 3, lease => '10 minutes', queues => '{own_q}');
GRANT SELECT ON own_a TO PUBLIC;
RESET ROLE;
SET ROLE regress_owner_b;
CREATE TEMP TABLE own_b AS
SELECT id, attempt FROM gatekeeper.claim('worker-b', 3, lease => '10 minutes', queues => '{own_q}');
GRANT SELECT ON own_b TO PUBLIC;
RESET ROLE;
SELECT (SELECT count(*) FROM own_a) AS a_claimed, (SELECT count(*) FROM own_b) AS b_claimed;
SELECT min(id) AS a1 FROM own_a \gset
SELECT id AS a2 FROM own_a ORDER BY id OFFSET 1 LIMIT 1 \gset
SELECT max(id) AS a3 FROM own_a \gset
SELECT min(id) AS b1 FROM own_b \gset
SELECT id AS b2 FROM own_b ORDER BY id OFFSET 1 LIMIT 1 \gset
SELECT max(id) AS b3 FROM own_b \gset
SELECT c.worker, c.owner::regrole AS owner, c.open
  FROM gatekeeper.mail_claim c WHERE c.queue = 'own_q' ORDER BY c.lo;
SELECT lease_until AS lease FROM gatekeeper.mail_status WHERE id = :a1 \gset
SELECT md5(string_agg(c::text, ',' ORDER BY c.batch)) AS claims_before
  FROM gatekeeper.mail_claim c WHERE c.queue = 'own_q' \gset

--
-- B on A's claims: refused, whole calls with them, nothing written
--
SET ROLE regress_owner_b;
SELECT pg_temp.refused(format('SELECT gatekeeper.ack(%s, 1)', :a1)) AS ack;
SELECT pg_temp.refused(format('SELECT gatekeeper.ack_batch(ARRAY[%s, %s], ARRAY[1, 1])', :b1, :a1)) AS ack_batch_mixed;
SELECT pg_temp.refused(format('SELECT gatekeeper.nack(%s, 1, %L)', :a1, '451 later')) AS nack;
SELECT pg_temp.refused(format('SELECT gatekeeper.nack(%s, 1, %L, true)', :a2, '550 no')) AS nack_permanent;
SELECT pg_temp.refused(format('SELECT gatekeeper.nack_batch(ARRAY[%s, %s], ARRAY[1, 1], ARRAY[%L, %L])',
						  :b1, :a2, '451 a', '451 b')) AS nack_batch_mixed;
SELECT pg_temp.refused(format('SELECT gatekeeper.extend(%s, 1, %L)', :a1, '1 hour')) AS extend_longer;
SELECT pg_temp.refused(format('SELECT gatekeeper.extend(%s, 1, %L)', :a1, '1 second')) AS extend_shorter;
SELECT pg_temp.refused(format('SELECT gatekeeper.unclaim(ARRAY[%s], ARRAY[1], %L, %L)', :a3, 'x', '0')) AS unclaim;
SELECT pg_temp.refused(format('SELECT gatekeeper.unclaim(ARRAY[%s, %s], ARRAY[1, 1], %L, %L)', :b1, :a3, 'x', '0')) AS unclaim_mixed;
-- a claim that is not current is a stale token, whoever names it
SELECT gatekeeper.ack(:a1, 2) AS stale_ack, gatekeeper.extend(:a1, 0, '1 hour') AS stale_extend,
	   gatekeeper.nack(:a1, 2, 'x') AS stale_nack,
	   gatekeeper.unclaim(ARRAY[:a1]::bigint[], ARRAY[2], 'x', '0') AS stale_unclaim;
RESET ROLE;
SELECT md5(string_agg(c::text, ',' ORDER BY c.batch)) = :'claims_before' AS claims_untouched
  FROM gatekeeper.mail_claim c WHERE c.queue = 'own_q';
SELECT count(*) AS outcomes FROM gatekeeper.mail_done WHERE queue = 'own_q';
SELECT count(*) AS events FROM gatekeeper.events WHERE queue = 'own_q';
SELECT * FROM pg_temp.claims(:'lease');

-- B's own claim is B's
SET ROLE regress_owner_b;
SELECT gatekeeper.ack(:b1, 1) AS b_ack;
RESET ROLE;

--
-- A on its own claims: extend never shortens, not even the lease of the
-- batch's one open mail; a longer lease holds for the batch
--
SET ROLE regress_owner_a;
SELECT gatekeeper.extend(:a1, 1, '1 second') AS shorter_extended;
RESET ROLE;
SELECT lease_until = :'lease' AS lease_kept FROM gatekeeper.mail_status WHERE id = :a1;
SELECT count(*) AS rows, sum(open) AS open FROM gatekeeper.mail_claim WHERE queue = 'own_q' AND lo = :a1;
SET ROLE regress_owner_a;
SELECT gatekeeper.ack(:a1, 1) AS a_ack;
RESET ROLE;
-- a superuser may act on another role's claim
SELECT gatekeeper.ack(:a2, 1) AS superuser_ack;
SELECT open AS open_left FROM gatekeeper.mail_claim WHERE queue = 'own_q' AND lo = :a1;
SET ROLE regress_owner_a;
SELECT gatekeeper.extend(:a3, 1, '1 second') AS alone_shorter;
RESET ROLE;
SELECT lease_until = :'lease' AS alone_lease_kept FROM gatekeeper.mail_status WHERE id = :a3;
BEGIN;
SET LOCAL ROLE regress_owner_a;
SELECT gatekeeper.extend(:a3, 1, '1 hour') AS longer;
RESET ROLE;
SELECT lease_until = now() + interval '1 hour' AS hour FROM gatekeeper.mail_status WHERE id = :a3;
COMMIT;
SELECT gatekeeper.nack(:a3, 1, '451 later') AS superuser_nack;
SELECT * FROM pg_temp.claims(:'lease');

--
-- a background worker's claim (owner 0: the background workers' claims
-- are written so, t/083_claim_owner.pl): no SQL caller, superuser
-- included, acks, nacks, extends or hands it back
--
UPDATE gatekeeper.mail_claim SET owner = 0 WHERE queue = 'own_q' AND lo = :b1;
SELECT owner, open FROM gatekeeper.mail_claim WHERE queue = 'own_q' AND lo = :b1;
SELECT pg_temp.refused(format('SELECT gatekeeper.ack(%s, 1)', :b2)) AS superuser_ack_background;
SELECT pg_temp.refused(format('SELECT gatekeeper.extend(%s, 1, %L)', :b2, '1 second')) AS superuser_extend_background;
SELECT pg_temp.refused(format('SELECT gatekeeper.unclaim(ARRAY[%s], ARRAY[1], %L, %L)', :b3, 'x', '0')) AS superuser_unclaim_background;
SET ROLE regress_owner_b;
SELECT pg_temp.refused(format('SELECT gatekeeper.nack_batch(ARRAY[%s], ARRAY[1], ARRAY[%L])', :b3, 'x')) AS nack_batch_background;
RESET ROLE;
-- a claim made before owners were kept (an update leaves an external
-- worker's with none): whoever holds the worker grant settles it
UPDATE gatekeeper.mail_claim SET owner = NULL WHERE queue = 'own_q' AND lo = :b1;
SET ROLE regress_owner_a;
SELECT gatekeeper.extend(:b2, 1, '1 hour') AS legacy_extend;
SELECT gatekeeper.ack_batch(ARRAY[:b2, :b3]::bigint[], ARRAY[1, 1]) AS legacy_acked;
RESET ROLE;
SELECT * FROM pg_temp.claims(:'lease');
SELECT count(*) AS batches_left FROM gatekeeper.mail_claim WHERE queue = 'own_q';

SELECT gatekeeper.cancel_queue('own_q') AS cancelled;
SELECT gatekeeper.drop_queue('own_q');
DELETE FROM gatekeeper.role_grant WHERE role IN ('regress_owner_a'::regrole, 'regress_owner_b'::regrole);
DROP OWNED BY regress_owner_a, regress_owner_b;
DROP ROLE regress_owner_a, regress_owner_b;
