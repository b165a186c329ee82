-- gatekeeper.shard(n, count) (issue 29): the mail ids a shard draws are
-- those congruent to n modulo count, above every id it drew or holds, so
-- that ids are unique across shards and name the shard that holds them.
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of.inc

SELECT gatekeeper.create_queue('sh_q');
-- a mail before sharding: later ids must be above it
SELECT gatekeeper.enqueue('before@example.com', 'Before', 'Body', queue => 'sh_q',
	send_at => now() + interval '1 day') > 0 AS enqueued_before;
CREATE TEMP TABLE mark AS
SELECT greatest((SELECT last_value FROM gatekeeper.mail_id_seq), (SELECT max(id) FROM gatekeeper.mail)) AS top;

-- bad input: nothing is written
SELECT pg_temp.error_of($$SELECT gatekeeper.shard(0, 3)$$) AS count_not_power_of_two;
SELECT pg_temp.error_of($$SELECT gatekeeper.shard(0, 0)$$) AS count_zero;
SELECT pg_temp.error_of($$SELECT gatekeeper.shard(0, -4)$$) AS count_negative;
SELECT pg_temp.error_of($$SELECT gatekeeper.shard(0, 131072)$$) AS count_too_large;
SELECT pg_temp.error_of($$SELECT gatekeeper.shard(4, 4)$$) AS n_too_large;
SELECT pg_temp.error_of($$SELECT gatekeeper.shard(-1, 4)$$) AS n_negative;
SELECT pg_temp.error_of($$SELECT gatekeeper.shard(1, 1)$$) AS n_not_below_one;
SELECT pg_temp.error_of($$SELECT gatekeeper.shard(NULL, 4)$$) AS null_n;
SELECT pg_temp.error_of($$SELECT gatekeeper.shard(1, NULL)$$) AS null_count;
SELECT count(*) AS positions FROM gatekeeper.shard_position;
SELECT increment_by FROM pg_sequences WHERE schemaname = 'gatekeeper' AND sequencename = 'mail_id_seq';

-- shard 2 of 4: every id drawn after, by enqueue and by a bulk insert, is
-- 2 modulo 4 and above every earlier one
SELECT gatekeeper.shard(2, 4);
SELECT n, count FROM gatekeeper.shard_position;
SELECT increment_by FROM pg_sequences WHERE schemaname = 'gatekeeper' AND sequencename = 'mail_id_seq';
CREATE TEMP TABLE ids (id bigint, step int);
INSERT INTO ids
SELECT gatekeeper.enqueue('r' || i || '@example.com', 'S', 'Body', queue => 'sh_q',
						  send_at => now() + interval '1 day'), 1
  FROM generate_series(1, 5) AS i;
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, send_at)
SELECT 'bulk' || i || '@example.com', 'S', 'Body', 'sh_q', now() + interval '1 day'
  FROM generate_series(1, 150) AS i;
INSERT INTO ids SELECT id, 1 FROM gatekeeper.mail WHERE recipient LIKE 'bulk%' AND queue = 'sh_q';
SELECT count(*) AS drawn, count(DISTINCT id) AS distinct_ids,
	   bool_and(id % 4 = 2) AS all_two_mod_four,
	   bool_and(id > (SELECT top FROM mark)) AS all_above_earlier
  FROM ids WHERE step = 1;

-- run again as shard 6 of 8 (shard 2 of 4 split in two): 6 modulo 8,
-- above everything drawn as shard 2 of 4
SELECT gatekeeper.shard(6, 8);
SELECT n, count FROM gatekeeper.shard_position;
INSERT INTO ids
SELECT gatekeeper.enqueue('s' || i || '@example.com', 'S', 'Body', queue => 'sh_q',
						  send_at => now() + interval '1 day'), 2
  FROM generate_series(1, 5) AS i;
SELECT count(*) AS drawn, bool_and(id % 8 = 6) AS all_six_mod_eight,
	   bool_and(id > (SELECT max(id) FROM ids WHERE step = 1)) AS all_above_step_one
  FROM ids WHERE step = 2;

-- only the owner runs it
SELECT has_function_privilege('public', 'gatekeeper.shard(int, int)', 'EXECUTE') AS public_may_shard;

-- back to one node, for the tests after this one
SELECT gatekeeper.cancel_queue('sh_q') AS cancelled;
SELECT gatekeeper.drop_queue('sh_q');
SELECT gatekeeper.shard(0, 1);
DELETE FROM gatekeeper.shard_position;
SELECT increment_by FROM pg_sequences WHERE schemaname = 'gatekeeper' AND sequencename = 'mail_id_seq';
