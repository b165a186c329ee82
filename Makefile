# gatekeeper: PGXS build.  The version lives in gatekeeper.control only.

# gatekeeper, and gatekeeper_router: its application API over shards, for
# a routing database with PL/Proxy (docs/sharding.md)
EXTENSION = gatekeeper gatekeeper_router
EXTVERSION = $(shell sed -n "s/^default_version *= *'\([^']*\)'.*/\1/p" gatekeeper.control)

PG_CONFIG ?= pg_config

MODULE_big = gatekeeper
OBJS = \
	src/gatekeeper.o \
	src/settings.o \
	src/xact.o \
	src/keep_freed.o \
	src/catalog.o \
	src/worker_slots.o \
	src/delivery_check.o \
	src/wake.o \
	src/worker.o \
	src/worker_step.o \
	src/worker_announce.o \
	src/worker_standbys.o \
	src/worker_breakers.o \
	src/worker_database.o \
	src/worker_delivery.o \
	src/worker_record.o \
	src/mail/claim.o \
	src/claim_queues.o \
	src/mail/claim_take.o \
	src/mail/claim_writer.o \
	src/mail/mail_exec.o \
	src/mail/mail_runs.o \
	src/mail/mail_state.o \
	src/mail/mail_nack.o \
	src/mail/mail_store.o \
	src/mail/done_writer.o \
	src/mail/live_record.o \
	src/mail_state_funcs.o \
	src/mail/mail_state_upkeep.o \
	src/due_floor.o \
	src/gate_store.o \
	src/gate_log.o \
	src/gate.o \
	src/gate_funcs.o \
	src/mail/mail.o \
	src/mail/mail_copy.o \
	src/mail/live_writer.o \
	src/mail/enqueue.o \
	src/validate.o \
	src/message.o \
	src/template.o \
	src/template_funcs.o \
	src/dkim.o \
	src/smtp_client.o \
	src/smtp_config.o \
	src/smtp_io.o \
	src/smtp_relay.o \
	src/smtp_session.o \
	src/smtp_txn.o \
	src/smtp_chat.o \
	src/suppression.o \
	src/unsubscribe.o \
	src/window.o \
	src/address.o \
	src/mail/count_totals.o \
	src/mail/mail_count.o \
	src/mail/count_triggers.o \
	src/mail/live_count.o \
	src/maintenance.o \
	src/progress.o \
	src/mail/mail_state_sweep.o \
	src/mail/mail_state_sync.o \
	src/smtp_trouble.o \
	src/report_parse.o \
	src/report.o \
	src/message_id.o \
	src/router_deadline.o

DATA = $(wildcard sql/gatekeeper--*.sql) $(wildcard sql/gatekeeper_router--*.sql)

# The server's headers are read as system headers: under -Wextra they
# warn about their own unused parameters, which is not ours to fix.
PG_CPPFLAGS = -isystem $(shell $(PG_CONFIG) --includedir-server) \
	-I$(srcdir)/src -DGATEKEEPER_VERSION='"$(EXTVERSION)"'
PG_CFLAGS = -Wall -Wextra -Wno-unused-parameter
SHLIB_LINK = -lssl -lcrypto

# pg_regress and isolation tests run in a private instance with the
# library preloaded (test/gatekeeper.conf).
# (the extensions' scripts are no tests)
REGRESS = $(patsubst sql/%.sql,%,$(sort $(filter-out $(foreach e,$(EXTENSION),sql/$(e)--%),$(wildcard sql/*.sql))))
REGRESS_OPTS = --temp-instance=./tmp_check --temp-config=./test/gatekeeper.conf
ISOLATION = $(patsubst specs/%.spec,%,$(sort $(wildcard specs/*.spec)))
ISOLATION_OPTS = --temp-instance=./tmp_check_iso --temp-config=./test/gatekeeper.conf
TAP_TESTS = 1

# No bitcode: the server does not need it and clang need not be installed.
override with_llvm = no

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)
