-- COPY into gatekeeper.mail that leaves segment to its default is written
-- straight into the current segment's partition, where PostgreSQL writes
-- its rows with multi-row inserts (src/mail_copy.c): the WAL shows it.
-- What it writes, what it refuses and who may run it are those of a COPY
-- into gatekeeper.mail.  A COPY that names segment, has a WHERE clause or
-- meets a trigger of the user's own is left to PostgreSQL, and still
-- enqueues.  Rows that give neither ids nor dedupe keys are checked as
-- they are read, without a transition table.  Other inserts into a
-- partition (rotation, a restore) are not enqueued mail.
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of.inc

CREATE EXTENSION IF NOT EXISTS pg_walinspect;
SELECT gatekeeper.create_queue('cp_q');

-- the heap records of the current segment's partition since lsn: single
-- inserts, multi-row inserts
CREATE FUNCTION pg_temp.heap_writes(lsn pg_lsn, OUT single bigint, OUT multi bigint)
LANGUAGE sql AS $$
SELECT count(*) FILTER (WHERE w.record_type LIKE 'INSERT%'),
	   count(*) FILTER (WHERE w.record_type LIKE 'MULTI_INSERT%')
  FROM pg_get_wal_records_info(lsn, pg_current_wal_flush_lsn()) w
 WHERE w.resource_manager IN ('Heap', 'Heap2')
   AND w.block_ref LIKE '%/' || pg_relation_filenode(format('gatekeeper.mail_%s',
		   current_setting('gatekeeper.current_segment'))::regclass) || ' %'
$$;

-- a mail's state as the application sees it
CREATE FUNCTION pg_temp.states(prefix text) RETURNS text
LANGUAGE sql AS $$
SELECT string_agg(s.recipient || ':' || s.state, ' ' ORDER BY s.recipient)
  FROM gatekeeper.mail_status s
 WHERE s.queue = 'cp_q' AND s.recipient LIKE prefix || '%@cp.example'
$$;

--
-- the superuser's COPY: one multi-row insert, every mail scheduled, in
-- the current segment
--
SELECT pg_current_wal_insert_lsn() AS lsn \gset
COPY gatekeeper.mail (recipient, subject, body, queue) FROM STDIN (FORMAT csv);
a1@cp.example,s,b,cp_q
a2@cp.example,s,b,cp_q
a3@cp.example,s,b,cp_q
a4@cp.example,s,b,cp_q
\.
SELECT * FROM pg_temp.heap_writes(:'lsn');
SELECT pg_temp.states('a');
SELECT count(*) AS in_current_segment, count(DISTINCT id) AS ids
  FROM gatekeeper.mail
 WHERE recipient LIKE 'a%@cp.example' AND segment = current_setting('gatekeeper.current_segment')::int;

-- every row is still checked: a bad address fails the COPY, nothing written
SELECT pg_temp.error_of($$COPY gatekeeper.mail (recipient, subject, body, queue)
	FROM PROGRAM 'printf "b1@cp.example,s,b,cp_q\nnot an address,s,b,cp_q\n"' (FORMAT csv)$$) AS bad_address;
SELECT pg_temp.error_of($$COPY gatekeeper.mail (recipient, subject, body, queue)
	FROM PROGRAM 'printf "b2@cp.example,s,b,no_such_q\n"' (FORMAT csv)$$) AS unknown_queue;
SELECT count(*) AS written FROM gatekeeper.mail WHERE recipient LIKE 'b%@cp.example';

-- an error in the data names gatekeeper.mail, the table the COPY named
\set VERBOSITY default
COPY gatekeeper.mail (recipient, subject, body, queue, send_at) FROM STDIN (FORMAT csv);
c1@cp.example,s,b,cp_q,2026-01-01 00:00+00
c2@cp.example,s,b,cp_q,not a time
\.
\set VERBOSITY terse

--
-- an application role
--
CREATE ROLE regress_cp_app NOLOGIN;
CREATE ROLE regress_cp_manual NOLOGIN;
CREATE ROLE regress_cp_nobody NOLOGIN;
SELECT gatekeeper.grant('regress_cp_app', 'enqueue');
-- privileges given by hand, without the sequence: still a COPY that works
GRANT USAGE ON SCHEMA gatekeeper TO regress_cp_manual, regress_cp_nobody;
GRANT INSERT (recipient, subject, body, queue) ON gatekeeper.mail TO regress_cp_manual;
GRANT EXECUTE ON FUNCTION gatekeeper._segment() TO regress_cp_manual;

SELECT pg_current_wal_insert_lsn() AS lsn \gset
SET ROLE regress_cp_app;
COPY gatekeeper.mail (recipient, subject, body, queue) FROM STDIN (FORMAT csv);
d1@cp.example,s,b,cp_q
d2@cp.example,s,b,cp_q
\.
-- not the columns that are gatekeeper's, not by this way either
COPY gatekeeper.mail (id, recipient, subject, body, queue) FROM STDIN (FORMAT csv);
1,d3@cp.example,s,b,cp_q
\.
RESET ROLE;
SELECT * FROM pg_temp.heap_writes(:'lsn');
SELECT pg_temp.states('d');

SELECT pg_current_wal_insert_lsn() AS lsn \gset
SET ROLE regress_cp_manual;
COPY gatekeeper.mail (recipient, subject, body, queue) FROM STDIN (FORMAT csv);
e1@cp.example,s,b,cp_q
e2@cp.example,s,b,cp_q
\.
RESET ROLE;
SELECT * FROM pg_temp.heap_writes(:'lsn');
SELECT pg_temp.states('e');

SET ROLE regress_cp_nobody;
COPY gatekeeper.mail (recipient, subject, body, queue) FROM STDIN (FORMAT csv);
f1@cp.example,s,b,cp_q
\.
RESET ROLE;
SELECT count(*) AS written FROM gatekeeper.mail WHERE recipient LIKE 'f%@cp.example';

--
-- left to PostgreSQL: a COPY naming segment, a COPY with WHERE, a trigger
-- of the user's own; row by row, and every mail enqueued
--
SELECT pg_current_wal_insert_lsn() AS lsn \gset
DO $$
BEGIN
	EXECUTE format($c$COPY gatekeeper.mail (recipient, subject, body, queue, segment)
		FROM PROGRAM 'printf "g1@cp.example,s,b,cp_q,%1$s\ng2@cp.example,s,b,cp_q,%1$s\n"' (FORMAT csv)$c$,
		current_setting('gatekeeper.current_segment'));
END
$$;
SELECT * FROM pg_temp.heap_writes(:'lsn');
SELECT pg_temp.states('g');

SELECT pg_current_wal_insert_lsn() AS lsn \gset
COPY gatekeeper.mail (recipient, subject, body, queue) FROM STDIN (FORMAT csv) WHERE recipient <> 'h2@cp.example';
h1@cp.example,s,b,cp_q
h2@cp.example,s,b,cp_q
h3@cp.example,s,b,cp_q
\.
SELECT * FROM pg_temp.heap_writes(:'lsn');
SELECT pg_temp.states('h');

-- FREEZE is refused for gatekeeper.mail, even where its partition was
-- emptied in the same transaction (a partition would take it)
BEGIN;
TRUNCATE gatekeeper.mail;
COPY gatekeeper.mail (recipient, subject, body, queue) FROM STDIN (FORMAT csv, FREEZE);
k1@cp.example,s,b,cp_q
\.
ROLLBACK;

CREATE TABLE cp_seen (n bigint);
CREATE FUNCTION pg_temp.cp_seen() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO cp_seen SELECT count(*) FROM new_rows;
	RETURN NULL;
END
$$;
CREATE TRIGGER cp_seen AFTER INSERT ON gatekeeper.mail REFERENCING NEW TABLE AS new_rows
	FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.cp_seen();
SELECT pg_current_wal_insert_lsn() AS lsn \gset
COPY gatekeeper.mail (recipient, subject, body, queue) FROM STDIN (FORMAT csv);
i1@cp.example,s,b,cp_q
i2@cp.example,s,b,cp_q
\.
DROP TRIGGER cp_seen ON gatekeeper.mail;
SELECT * FROM pg_temp.heap_writes(:'lsn');
SELECT pg_temp.states('i');
SELECT n AS user_trigger_saw FROM cp_seen;

--
-- other inserts into a partition are not enqueued mail: the partition's
-- trigger lets them be (rotation moves mail that has its live row)
--
DO $$
BEGIN
	EXECUTE format($i$INSERT INTO gatekeeper.mail_%s (id, recipient, subject, body, queue)
		VALUES (nextval('gatekeeper.mail_id_seq'), 'j1@cp.example', 's', 'b', 'cp_q')$i$,
		current_setting('gatekeeper.current_segment'));
END
$$;
SELECT (SELECT count(*) FROM gatekeeper.mail WHERE recipient = 'j1@cp.example') AS content,
	   pg_temp.states('j') AS states;

--
-- rows taken in as they are read: a COPY that gives neither ids nor dedupe
-- keys is checked batch by batch as it reads, with no transition table, so
-- it writes no temporary file however far its rows exceed work_mem; one
-- that gives dedupe keys is checked by the trigger over its transition
-- table, spilled to a temporary file.  Both as the application's role.
--
CREATE FUNCTION pg_temp.temp_files() RETURNS bigint
LANGUAGE sql AS $$
SELECT temp_files FROM pg_stat_database WHERE datname = current_database()
$$;
-- the path is taken while the sequence is ahead of every finished mail's
-- id (new ids cannot be a restored mail's); earlier tests gave ids above
-- it by hand, so it is set past them, as a restore sets it
SELECT setval('gatekeeper.mail_id_seq', (SELECT max(id) FROM gatekeeper.mail)) > 0 AS ahead;
SET work_mem = '64kB';
SET ROLE regress_cp_app;
SELECT pg_temp.temp_files() AS temp_before \gset
\copy gatekeeper.mail (recipient, subject, body, queue) from program 'seq 1 3000 | sed "s/.*/m&@cp.example,subject &,body &,cp_q/"' with (format csv)
SELECT pg_stat_force_next_flush();
SELECT pg_stat_clear_snapshot();
SELECT pg_temp.temp_files() - :temp_before AS temp_files_unkeyed;
SELECT pg_temp.temp_files() AS temp_before \gset
\copy gatekeeper.mail (recipient, subject, body, queue, dedupe_key) from program 'seq 1 3000 | sed "s/.*/n&@cp.example,subject &,body &,cp_q,key-&/"' with (format csv)
SELECT pg_stat_force_next_flush();
SELECT pg_stat_clear_snapshot();
SELECT pg_temp.temp_files() - :temp_before > 0 AS temp_files_keyed;
RESET ROLE;
RESET work_mem;
SELECT count(*) FILTER (WHERE recipient LIKE 'm%') AS unkeyed,
	   count(*) FILTER (WHERE recipient LIKE 'n%') AS keyed,
	   count(DISTINCT state) AS states, min(state::text) AS state
  FROM gatekeeper.mail_status WHERE queue = 'cp_q' AND recipient ~ '^[mn][0-9]+@cp.example$';
SELECT count(*) AS keys FROM gatekeeper.mail_key WHERE queue = 'cp_q';
-- the recipient's hash index entries of such a COPY are held back and
-- inserted in bucket order, work_mem's worth at a time (5,461 of them at
-- 64kB) and at its end: every one of 12,000 rows is found by the index,
-- as history() finds a recipient's mail
SET work_mem = '64kB';
SET ROLE regress_cp_app;
\copy gatekeeper.mail (recipient, subject, body, queue) from program 'seq 1 12000 | sed "s/.*/q&@cp.example,subject &,body &,cp_q/"' with (format csv)
RESET ROLE;
RESET work_mem;
SET enable_seqscan = off;
SET enable_bitmapscan = off;
SELECT count(*) AS found_by_recipient
  FROM generate_series(1, 12000) i,
	   LATERAL (SELECT 1 FROM gatekeeper.mail m
				 WHERE m.recipient = 'q' || i || '@cp.example' LIMIT 1) f;
SELECT count(*) AS history FROM gatekeeper.history('q6789@cp.example');
RESET enable_seqscan;
RESET enable_bitmapscan;
-- a bad row of the 3,000 still fails the whole COPY, named by its row
\set VERBOSITY default
SET ROLE regress_cp_app;
\copy gatekeeper.mail (recipient, subject, body, queue) from program 'seq 1 3000 | sed "s/.*/p&@cp.example,subject &,body &,cp_q/; 2345s/.*/not an address,s,b,cp_q/"' with (format csv)
RESET ROLE;
\set VERBOSITY terse
SELECT count(*) AS written FROM gatekeeper.mail WHERE recipient LIKE 'p%@cp.example';

-- nothing was left behind: live figures agree with the mail
SELECT count(*) FILTER (WHERE state = 'scheduled') AS scheduled FROM gatekeeper.mail_status WHERE queue = 'cp_q';
SELECT scheduled FROM gatekeeper.queue_stats WHERE queue = 'cp_q';

DROP TABLE cp_seen;
SELECT gatekeeper.cancel_queue('cp_q') >= 0 AS cancelled;
DROP OWNED BY regress_cp_app, regress_cp_manual, regress_cp_nobody;
DROP ROLE regress_cp_app, regress_cp_manual, regress_cp_nobody;
DELETE FROM gatekeeper.role_grant;
DROP EXTENSION pg_walinspect;
