-- The enqueue path and the suppression list's writer in C (issue 26, item
-- 1): enqueue() does the enqueue itself, with no PL/pgSQL _enqueue under
-- it, and _suppress is C (the reports, the nacks and unsubscribe() call
-- its C function directly).  What they do stays what it was:
--   a keyed enqueue returns the holder of its key and writes nothing,
--   whatever gatekeeper.on_duplicate says, and leaves that setting as it
--   found it;
--   every error of enqueue reaches the caller with its SQLSTATE and none
--   of the context of gatekeeper's own statements, keyed or not;
--   a suppression entry takes a new reason only when that stops more, and
--   _suppress says whether the entry is new.
SET client_min_messages = warning;
\set VERBOSITY terse
CREATE EXTENSION IF NOT EXISTS gatekeeper;
\i sql/error_of.inc

-- the language of each: C, and no _enqueue
SELECT p.proname, l.lanname
  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
 WHERE p.pronamespace = 'gatekeeper'::regnamespace
   AND p.proname IN ('enqueue', '_enqueue', '_suppress')
 ORDER BY 1;

SELECT gatekeeper.create_queue('ec');

-- a keyed enqueue, then the same key again: one mail, the same id
SELECT gatekeeper.enqueue('a@example.com', 'first', 'b', 'ec', dedupe_key => 'k1') AS first_id \gset
SELECT gatekeeper.enqueue('a@example.com', 'again', 'b', 'ec', dedupe_key => 'k1') = :first_id AS same_id;
-- under 'skip' too, and the setting is the session's again afterwards
SET gatekeeper.on_duplicate = skip;
SELECT gatekeeper.enqueue('a@example.com', 'skip', 'b', 'ec', dedupe_key => 'k1') = :first_id AS same_id_skip;
SELECT gatekeeper.enqueue('a@example.com', 'new', 'b', 'ec', dedupe_key => 'k2') IS NOT NULL AS new_key;
SHOW gatekeeper.on_duplicate;
RESET gatekeeper.on_duplicate;
-- an unkeyed enqueue is a mail of its own every time
SELECT count(DISTINCT gatekeeper.enqueue('u@example.com', 'u', 'b', 'ec')) AS unkeyed FROM generate_series(1, 3);
SELECT subject, dedupe_key FROM gatekeeper.mail WHERE queue = 'ec' ORDER BY id;
SELECT queue, dedupe_key FROM gatekeeper.mail_key WHERE queue = 'ec' ORDER BY dedupe_key;

-- a held key in a transaction that goes on: the holder, and the
-- transaction still works (no subtransaction left open)
BEGIN;
SELECT gatekeeper.enqueue('a@example.com', 'in xact', 'b', 'ec', dedupe_key => 'k1') = :first_id AS same_id_in_xact;
SELECT gatekeeper.enqueue('b@example.com', 'in xact', 'b', 'ec', dedupe_key => 'k3') IS NOT NULL AS new_in_xact;
COMMIT;
SELECT count(*) AS ec_mails FROM gatekeeper.mail WHERE queue = 'ec';

-- errors, keyed and not, as the application sees them: SQLSTATE, message,
-- detail, hint, and no context of gatekeeper's own statements
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('a@example.com', 's', 'b', 'ec', priority => NULL)$$) AS null_priority;
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('a@example.com', 's', 'b', 'ec', priority => NULL, dedupe_key => 'k9')$$) AS null_priority_keyed;
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('a@example.com', 's', 'b', NULL, dedupe_key => 'k9')$$) AS null_queue_keyed;
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('no address', 's', 'b', 'ec', dedupe_key => 'k9')$$) AS bad_recipient_keyed;
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('a@example.com', 's', 'b', 'ec', send_at => 'infinity', dedupe_key => 'k9')$$) AS infinite_keyed;
\set VERBOSITY default
SELECT gatekeeper.enqueue('no address', 's', 'b', 'ec', dedupe_key => 'k9');
SELECT gatekeeper.enqueue('a@example.com', E'two\nlines', 'b', 'ec', dedupe_key => 'k9');
SELECT gatekeeper.enqueue('a@example.com', 's', 'b', 'ec', timezone => 'Mars/Olympus');
SELECT gatekeeper.enqueue('a@example.com', 's', 'b', 'ec', priority => NULL);
-- from the application's own function: its context only
DO $$ BEGIN PERFORM gatekeeper.enqueue('no address', 's', 'b', 'ec', dedupe_key => 'k9'); END $$;
-- caught by the application, which goes on in the same transaction
DO $$
BEGIN
	BEGIN
		PERFORM gatekeeper.enqueue('no address', 's', 'b', 'ec', dedupe_key => 'k9');
	EXCEPTION WHEN invalid_parameter_value OR syntax_error OR data_exception THEN
		RAISE NOTICE 'caught %', SQLSTATE;
	END;
	PERFORM gatekeeper.enqueue('c@example.com', 'after', 'b', 'ec', dedupe_key => 'k9');
END
$$;
\set VERBOSITY terse
-- nothing written by the errors; k9 once, by the call after the caught one
SELECT count(*) AS ec_mails, count(*) FILTER (WHERE dedupe_key = 'k9') AS k9 FROM gatekeeper.mail WHERE queue = 'ec';

-- the suppression list's writer: new, then the reason that stops more
SELECT gatekeeper._suppress('s@example.com', 'unsubscribe', 'ec', 'one', NULL) AS new_entry;
SELECT gatekeeper._suppress('s@example.com', 'unsubscribe', 'ec', 'two', NULL) AS same_again;
SELECT gatekeeper._suppress('s@example.com', 'soft_bounce', 'ec', 'three', 7) AS soft_over_unsubscribe;
SELECT gatekeeper._suppress('s@example.com', 'complaint', 'ec', 'four', 8) AS complaint_not_over_soft;
SELECT gatekeeper._suppress('s@example.com', 'hard_bounce', 'ec', NULL, 9) AS hard_over_soft;
SELECT gatekeeper._suppress('s@example.com', 'soft_bounce', 'ec', 'five', 10) AS soft_not_over_hard;
SELECT gatekeeper._suppress('s@example.com', 'manual', NULL, 'global', NULL) AS new_global;
SELECT address, queue, reason, detail, mail_id FROM gatekeeper.suppression_list
 WHERE address = 's@example.com' ORDER BY queue NULLS FIRST;
SELECT pg_temp.error_of($$SELECT gatekeeper._suppress('s@example.com', 'bored', NULL, NULL, NULL)$$) AS bad_reason;
SELECT pg_temp.error_of($$SELECT gatekeeper._suppress(NULL, 'manual', NULL, NULL, NULL)$$) AS null_address;

SELECT gatekeeper.cancel_queue('ec') > 0 AS cancelled;
DELETE FROM gatekeeper.suppression_list WHERE address = 's@example.com';
