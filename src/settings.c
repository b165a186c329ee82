/*-------------------------------------------------------------------------
 *
 * settings.c
 *		The variables behind the gatekeeper.* settings, and the workers'
 *		flag the claim reads.
 *
 * Every module reads its settings from these variables (declared in
 * gatekeeper.h), as PostgreSQL's modules read theirs from globals.c.  They
 * are defined here, below every module and calling none, so that reading a
 * setting never makes a module depend on src/gatekeeper.c, which defines
 * the settings (their names, bounds and check hooks) and so calls into the
 * modules whose rules the check hooks apply.  The values here are the
 * defaults until _PG_init defines the settings.
 *
 * IDENTIFICATION
 *		src/settings.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "gatekeeper.h"

/* Settings; see the Settings table of the specification */
char	   *gatekeeper_database = NULL;
int			gatekeeper_workers = 1;
int			gatekeeper_naptime = 1000;
int			gatekeeper_batch_size = 500;
int			gatekeeper_lease = 5 * 60 * 1000;	/* gatekeeper.lease, whole ms */
int			gatekeeper_retry_delay = 30 * 1000;
char	   *gatekeeper_smtp_url = NULL;
char	   *gatekeeper_smtp_user = NULL;
char	   *gatekeeper_smtp_password_file = NULL;
char	   *gatekeeper_dkim_key_table = NULL;
int			gatekeeper_smtp_connections = 16;
int			gatekeeper_smtp_timeout = 30 * 1000;
char	   *gatekeeper_helo_name = NULL;
char	   *gatekeeper_smtp_ca_file = NULL;
int			gatekeeper_max_in_flight = 64 * 1024 * 1024;
char	   *gatekeeper_default_sender = NULL;
char	   *gatekeeper_message_id_domain = NULL;
int			gatekeeper_retention = 7 * 24 * 60 * 60;
int			gatekeeper_soft_bounce_limit = 5;
int			gatekeeper_max_message_size = 10 * 1024 * 1024;
int			gatekeeper_gate_memory = 256 * 1024;
int			gatekeeper_claim_standbys = 0;
int			gatekeeper_on_duplicate = GATEKEEPER_ON_DUPLICATE_ERROR;

/* set by the background workers (src/worker.c), read by the claim */
bool		gatekeeper_background_claim = false;
