/*-------------------------------------------------------------------------
 *
 * smtp_config.h
 *		The SMTP client's configuration layer: what a relay URL says, the
 *		relay password, and the relay's addresses.
 *
 * IDENTIFICATION
 *		src/smtp_config.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef SMTP_CONFIG_H
#define SMTP_CONFIG_H

#include <netdb.h>

#include "nodes/pg_list.h"

/* the settings a relay's connections are opened with */
typedef struct SmtpConfig
{
	char	   *url;
	char	   *host;			/* as in the URL, without brackets */
	char	   *port;
	char	   *peer;			/* "host:port", for messages */
	char	   *user;
	char	   *password;
	char	   *helo;			/* empty: work it out per connection */
	char	   *ca_file;
	int			connections;	/* this worker's connections to the relay */
	int			default_connections;	/* gatekeeper.smtp_connections, as loaded */
	bool		rate_limited;	/* the URL sets rate= */
	int			rate;			/* then this worker's messages per second (0: none) */
	int			timeout;
	bool		smtps;
	bool		parsed;			/* the URL is well-formed */
	bool		valid;			/* and its host resolved */
	char		problem[256];	/* why not valid */
	struct addrinfo *addrs;
	int			naddrs;
} SmtpConfig;

/* the most a relay URL's options may ask for */
#define SMTP_URL_MAX_CONNECTIONS	1000
#define SMTP_URL_MAX_RATE			100000

/* a relay's URL, as smtp_config_check_url reads it */
typedef struct SmtpUrl
{
	bool		smtps;
	char		host[256];		/* without the brackets of an IPv6 address */
	char		port[8];
	int			connections;	/* ?connections=, 0 when not given */
	int			rate;			/* ?rate=, 0 when not given */
} SmtpUrl;

/* why a relay's URL cannot be used: an error's message, detail and hint */
typedef struct SmtpUrlProblem
{
	char		message[512];
	char		detail[256];
	char		hint[384];
} SmtpUrlProblem;

extern bool smtp_config_check_url(const char *url, const char *subject, SmtpUrl *u,
								  SmtpUrlProblem *problem);
extern List *smtp_config_split(const char *value);
extern bool smtp_config_parse_options(const char *query, int *connections, int *rate,
									  char *problem, size_t problemlen);
extern void smtp_config_set_share(int index, int count);
extern bool smtp_config_load_password(void);
extern void smtp_config_load(SmtpConfig *cfg, MemoryContext cxt, const char *url);
extern void smtp_config_free(SmtpConfig *cfg);
extern bool smtp_config_matches(const SmtpConfig *cfg, const char *url);
extern bool smtp_config_resolve(SmtpConfig *cfg);
extern const char *smtp_config_fqdn(void);

#endif							/* SMTP_CONFIG_H */
