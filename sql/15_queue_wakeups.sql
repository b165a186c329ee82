-- Queue wake-up options (issue 13): background and notify.
--   create_queue/alter_queue: background (default true: the background
--   workers claim the queue; false: only external claimers do) and notify
--   (default false: NOTIFY gatekeeper, '<queue>' when its mail is due);
--   alter_queue's NULL leaves each unchanged; bad values are refused.
--   An external claim, with or without queues, takes a background = false
--   queue's mail.  gatekeeper._first_due and _announce_due, which the first
--   worker uses to announce mail that comes due later, look past every
--   priority level and only at notify queues.
-- (The notifications themselves, and the workers' claims, are tested in
-- t/034_wakeups.pl.)
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of_detail.inc

-- defaults, and both options given
SELECT gatekeeper.create_queue('wk_plain');
SELECT gatekeeper.create_queue('wk_external', background => false);
SELECT gatekeeper.create_queue('wk_listened', notify => true);
SELECT gatekeeper.create_queue('wk_both', background => false, notify => true, weight => 2);
SELECT name, background, notify, weight
  FROM gatekeeper.queue WHERE name LIKE 'wk\_%' OR name = 'default' ORDER BY name;

-- alter_queue: NULL leaves both unchanged; each flips on its own
SELECT gatekeeper.alter_queue('wk_both', weight => 3);
SELECT gatekeeper.alter_queue('wk_both', background => NULL, notify => NULL);
SELECT gatekeeper.alter_queue('wk_plain', notify => true);
SELECT gatekeeper.alter_queue('wk_external', background => true);
SELECT gatekeeper.alter_queue('wk_listened', background => false, notify => false);
SELECT name, background, notify, weight
  FROM gatekeeper.queue WHERE name LIKE 'wk\_%' ORDER BY name;
SELECT gatekeeper.alter_queue('wk_external', background => false);
SELECT gatekeeper.alter_queue('wk_listened', background => true, notify => true);
SELECT gatekeeper.alter_queue('wk_plain', notify => false);
-- the default queue, changed, is marked for pg_dump
SELECT gatekeeper.alter_queue('default', notify => true);
SELECT name, background, notify, altered FROM gatekeeper.queue WHERE name = 'default';
SELECT gatekeeper.alter_queue('default', notify => false);

-- bad values: nothing is written
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('wk_bad', background => NULL)$$) AS null_background;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('wk_bad', notify => NULL)$$) AS null_notify;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('wk_bad', notify => 'maybe')$$) AS not_a_boolean;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_queue('wk_plain', background => 'sometimes')$$) AS alter_not_a_boolean;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_queue('wk_nowhere', notify => true)$$) AS alter_unknown_queue;
-- a queue name is a NOTIFY payload, which PostgreSQL keeps under 8000 bytes
SELECT pg_temp.error_of(format('SELECT gatekeeper.create_queue(%L, notify => true)', repeat('n', 8000))) AS long_name_notify;
SELECT pg_temp.error_of(format('SELECT gatekeeper.create_queue(%L)', repeat('n', 8000))) AS long_name_quiet;
SELECT pg_temp.error_of(format('SELECT gatekeeper.alter_queue(%L, notify => true)', repeat('n', 8000))) AS alter_long_name_notify;
SELECT pg_temp.error_of(format('SELECT gatekeeper.create_queue(%L, notify => true)', repeat('n', 7999))) AS name_just_fits;
SELECT count(*) AS bad_queues FROM gatekeeper.queue WHERE name = 'wk_bad';
SELECT length(name), notify FROM gatekeeper.queue WHERE name LIKE 'nnn%' ORDER BY 1;
SELECT count(gatekeeper.drop_queue(name)) AS dropped FROM gatekeeper.queue WHERE name LIKE 'nnn%';

-- an external claim takes a background = false queue's mail, named or not
SELECT gatekeeper.enqueue('ext1@example.com', 'S', 'B', queue => 'wk_external') > 0 AS enqueued;
SELECT gatekeeper.enqueue('ext2@example.com', 'S', 'B', queue => 'wk_external') > 0 AS enqueued;
SELECT queue, recipient FROM gatekeeper.claim('ext', 1, queues => '{wk_external}') ORDER BY recipient;
SELECT queue, recipient FROM gatekeeper.claim('ext', 10) WHERE queue LIKE 'wk\_%' ORDER BY recipient;

-- what the first worker looks at: the earliest mail due after a time,
-- across priority levels, in notify queues only
SELECT gatekeeper.enqueue('a@example.com', 'S', 'B', queue => 'wk_listened', priority => 5,
						  send_at => '2100-01-01 10:00+00') > 0 AS enqueued;
SELECT gatekeeper.enqueue('b@example.com', 'S', 'B', queue => 'wk_listened', priority => -1,
						  send_at => '2100-01-01 09:00+00') > 0 AS enqueued;
SELECT gatekeeper.enqueue('c@example.com', 'S', 'B', queue => 'wk_listened', priority => 0,
						  send_at => '2100-01-01 11:00+00') > 0 AS enqueued;
SELECT gatekeeper.enqueue('d@example.com', 'S', 'B', queue => 'wk_plain',
						  send_at => '2100-01-01 08:00+00') > 0 AS enqueued;
SELECT gatekeeper._first_due('wk_listened', '2000-01-01') = '2100-01-01 09:00+00' AS earliest,
	   gatekeeper._first_due('wk_listened', '2100-01-01 09:00+00') = '2100-01-01 10:00+00' AS after_nine,
	   gatekeeper._first_due('wk_listened', '2100-01-01 10:30+00') = '2100-01-01 11:00+00' AS after_half_past_ten,
	   gatekeeper._first_due('wk_listened', '2100-01-01 11:00+00') IS NULL AS after_all,
	   gatekeeper._first_due('wk_nowhere', '2000-01-01') IS NULL AS no_queue;
SELECT queue, next_due = '2100-01-01 09:00+00' AS next_is_nine, next_due IS NULL AS nothing_later
  FROM gatekeeper._announce_due('{}', '2000-01-01', '2099-12-31') ORDER BY queue;
