/* gatekeeper 0.1.0 -> 0.2.0 (ALTER EXTENSION gatekeeper UPDATE TO '0.2.0') */
\echo Use "ALTER EXTENSION gatekeeper UPDATE TO '0.2.0'" to load this file. \quit

/*
 * Every change here is also in gatekeeper--0.2.0.sql; t/031_upgrade.pl
 * checks that an updated 0.1.0 and a fresh 0.2.0 have the same objects.
 */

/* ---------------------------------------------------------------------------
 * pg_dump and pg_restore (issue 9, defect 5): queue rows load before mail,
 * identity sequences are dumped, changes to the built-in rows are dumped.
 * ---------------------------------------------------------------------------
 */
ALTER TABLE gatekeeper.gate ADD COLUMN altered boolean NOT NULL DEFAULT false;
ALTER TABLE gatekeeper.queue ADD COLUMN altered boolean NOT NULL DEFAULT false;
ALTER TABLE gatekeeper.mail ADD COLUMN _dump_order text;

/*
 * Whether 0.1.0's built-in rows were changed (or dropped and made again)
 * cannot be told for sure, so they count as altered: pg_dump dumps them,
 * and a restore puts them in place of the ones CREATE EXTENSION makes.
 */
UPDATE gatekeeper.queue SET altered = true WHERE name = 'default';
UPDATE gatekeeper.gate SET altered = true WHERE name = 'smart_sending';

/*
 * pg_dump and pg_restore.  pg_dump dumps the rows of gatekeeper's tables
 * (config tables: the extension's objects themselves are not dumped) and
 * the values of its identity sequences; pg_restore runs CREATE EXTENSION,
 * then loads them.  Three things make a restored database whole:
 *
 * Order.  mail_check refuses scheduled mail whose queue does not exist, so
 * queue rows must load before mail.  pg_dump orders config tables' data by
 * the foreign keys between them and otherwise by name, which puts mail
 * first.  mail._dump_order is that foreign key's column: always NULL (its
 * CHECK), referencing queue, its triggers disabled.  It orders the dump
 * and costs a COPY into mail nothing (an enforced foreign key on mail.queue
 * doubled the time of COPY, and would forbid dropping a queue that finished
 * mail names).  Should its triggers come back enabled (pg_upgrade re-creates
 * the constraint without its disabled triggers), they check only NULLs,
 * which always pass.  Both constraints are NOT VALID so that the update
 * from 0.1.0 adds them without reading the table.
 *
 * Sequences.  Ids go on after the restored rows' instead of colliding
 * with them (enqueue, gate_pass and create_gate would fail with 23505).
 *
 * Built-in rows.  CREATE EXTENSION makes the queue default and the gate
 * smart_sending; pg_dump skips them while they are as it made them.  Once
 * such a row changes, or is made again after a drop, altered is set and
 * pg_dump dumps it; a row inserted with altered set (a restore) replaces
 * the unaltered one that CREATE EXTENSION made in the new database.
 */
ALTER TABLE gatekeeper.mail
	ADD CONSTRAINT mail_dump_order_null CHECK (_dump_order IS NULL) NOT VALID,
	ADD CONSTRAINT mail_dump_order FOREIGN KEY (_dump_order)
		REFERENCES gatekeeper.queue (name) NOT VALID;

DO $$
DECLARE
	t record;
BEGIN
	FOR t IN SELECT n.nspname, c.relname, tg.tgname
			   FROM pg_catalog.pg_trigger tg
			   JOIN pg_catalog.pg_constraint k ON k.oid = tg.tgconstraint
			   JOIN pg_catalog.pg_class c ON c.oid = tg.tgrelid
			   JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
			  WHERE k.conrelid = 'gatekeeper.mail'::pg_catalog.regclass
				AND k.conname = 'mail_dump_order'
	LOOP
		EXECUTE pg_catalog.format('ALTER TABLE %I.%I DISABLE TRIGGER %I',
								  t.nspname, t.relname, t.tgname);
	END LOOP;
END
$$;

COMMENT ON COLUMN gatekeeper.mail._dump_order IS 'always NULL; its foreign key (not enforced) makes pg_dump restore queues before mail';
COMMENT ON COLUMN gatekeeper.queue.altered IS 'the default queue was changed since CREATE EXTENSION made it: pg_dump dumps it';
COMMENT ON COLUMN gatekeeper.gate.altered IS 'the smart_sending gate was changed since CREATE EXTENSION made it: pg_dump dumps it';

-- a built-in row inserted with altered set replaces the unaltered one
CREATE FUNCTION gatekeeper._queue_builtin_insert() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF NEW.altered THEN
		DELETE FROM gatekeeper.queue q WHERE q.name = NEW.name AND NOT q.altered;
	END IF;
	NEW.altered := true;
	RETURN NEW;
END
$$;

CREATE FUNCTION gatekeeper._gate_builtin_insert() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	replaced int;
BEGIN
	IF NEW.altered THEN
		DELETE FROM gatekeeper.gate g WHERE g.name = NEW.name AND NOT g.altered
		RETURNING g.id INTO replaced;
		IF replaced <> NEW.id THEN
			DELETE FROM gatekeeper.gate_log l WHERE l.gate = replaced;
		END IF;
	END IF;
	NEW.altered := true;
	RETURN NEW;
END
$$;

-- a built-in row that changes is altered
CREATE FUNCTION gatekeeper._builtin_update() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	NEW.altered := true;
	RETURN NEW;
END
$$;

CREATE TRIGGER queue_builtin_insert BEFORE INSERT ON gatekeeper.queue
	FOR EACH ROW WHEN (NEW.name = 'default')
	EXECUTE FUNCTION gatekeeper._queue_builtin_insert();
CREATE TRIGGER queue_builtin_update BEFORE UPDATE ON gatekeeper.queue
	FOR EACH ROW WHEN (OLD.name = 'default' AND NOT OLD.altered)
	EXECUTE FUNCTION gatekeeper._builtin_update();
CREATE TRIGGER gate_builtin_insert BEFORE INSERT ON gatekeeper.gate
	FOR EACH ROW WHEN (NEW.name = 'smart_sending')
	EXECUTE FUNCTION gatekeeper._gate_builtin_insert();
CREATE TRIGGER gate_builtin_update BEFORE UPDATE ON gatekeeper.gate
	FOR EACH ROW WHEN (OLD.name = 'smart_sending' AND NOT OLD.altered)
	EXECUTE FUNCTION gatekeeper._builtin_update();

SELECT pg_catalog.pg_extension_config_dump('gatekeeper.mail', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.queue', 'WHERE name <> ''default'' OR altered');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.gate', 'WHERE name <> ''smart_sending'' OR altered');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.gate_log', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.mail_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.gate_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('gatekeeper.gate_log_id_seq', '');

REVOKE ALL ON FUNCTION gatekeeper._queue_builtin_insert() FROM PUBLIC;
REVOKE ALL ON FUNCTION gatekeeper._gate_builtin_insert() FROM PUBLIC;
REVOKE ALL ON FUNCTION gatekeeper._builtin_update() FROM PUBLIC;
