/*-------------------------------------------------------------------------
 *
 * smtp_config.c
 *		The SMTP client's configuration layer: a relay URL taken apart, the
 *		relay password read from gatekeeper.smtp_password_file, and the
 *		relay's addresses resolved.
 *
 * A URL is smtp://[user[:password]@]host[:port][/] or smtps://...; an
 * SmtpConfig holds what it says with the settings that go with it
 * (gatekeeper.smtp_user, smtp_connections, smtp_timeout, helo_name,
 * smtp_ca_file) and says whether it can be used, and why not.  Resolving
 * blocks (getaddrinfo), so it happens once per configuration, and again
 * after a failure only when mail is submitted.  Nothing here opens a
 * connection.
 *
 * IDENTIFICATION
 *		src/smtp_config.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "smtp_config.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gatekeeper.h"
#include "nodes/pg_list.h"
#include "utils/memutils.h"

/* longest relay password read from gatekeeper.smtp_password_file */
#define SMTP_PASSWORD_MAX		1024

/*
 * The relay password as smtp_config_load_password last read it from
 * gatekeeper.smtp_password_file, in TopMemoryContext; NULL for none.
 */
static char *smtp_password = NULL;

/* this host's name, as smtp_config_fqdn found it */
static char *host_fqdn = NULL;

static bool parse_url(SmtpConfig *cfg, const char *url);
static int	share_of(int total);

/*
 * This worker's place among the workers that share a relay's connections
 * and rate (smtp_config_set_share): 0 of 1 until told.
 */
static int	share_index = 0;
static int	share_count = 1;

/*
 * smtp_config_load_password
 *		Read the relay password from gatekeeper.smtp_password_file; forget
 *		the one read before.  Returns false, having said why in the log,
 *		when the file cannot be used: then no mail should be delivered.
 *
 * The file must be a regular file that only the server's OS user can
 * read, with the rule PostgreSQL applies to its SSL key: owned by that
 * user with no group or other permissions (u=rw, 0600, or less), or owned
 * by root with at most u=rw,g=r (0640).  One trailing newline (LF or
 * CRLF) is not part of the password.  The password is never logged.
 * Problems are logged at LOG, as PostgreSQL logs a bad configuration
 * file at reload: the server log is where an administrator looks.
 */
bool
smtp_config_load_password(void)
{
	const char *path = gatekeeper_smtp_password_file;
	char		buf[SMTP_PASSWORD_MAX + 2];
	struct stat st;
	ssize_t		len = 0;
	int			fd;

	if (smtp_password != NULL)
	{
		explicit_bzero(smtp_password, strlen(smtp_password));
		pfree(smtp_password);
		smtp_password = NULL;
	}
	if (path == NULL || path[0] == '\0')
		return true;

	fd = open(path, O_RDONLY | PG_BINARY | O_CLOEXEC, 0);
	if (fd < 0)
	{
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("could not open relay password file \"%s\": %m", path),
				 errdetail("The gatekeeper worker delivers no mail until gatekeeper.smtp_password_file can be read.")));
		return false;
	}
	if (fstat(fd, &st) != 0)
	{
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("could not stat relay password file \"%s\": %m", path)));
		close(fd);
		return false;
	}
	if (!S_ISREG(st.st_mode))
	{
		ereport(LOG,
				(errcode(ERRCODE_CONFIG_FILE_ERROR),
				 errmsg("relay password file \"%s\" is not a regular file", path),
				 errdetail("The gatekeeper worker delivers no mail until it is corrected.")));
		close(fd);
		return false;
	}
	if (st.st_uid != geteuid() && st.st_uid != 0)
	{
		ereport(LOG,
				(errcode(ERRCODE_CONFIG_FILE_ERROR),
				 errmsg("relay password file \"%s\" must be owned by the database user or root", path),
				 errdetail("The gatekeeper worker delivers no mail until it is corrected.")));
		close(fd);
		return false;
	}
	if ((st.st_uid == geteuid() && (st.st_mode & (S_IRWXG | S_IRWXO))) ||
		(st.st_uid == 0 && (st.st_mode & (S_IWGRP | S_IXGRP | S_IRWXO))))
	{
		ereport(LOG,
				(errcode(ERRCODE_CONFIG_FILE_ERROR),
				 errmsg("relay password file \"%s\" has group or world access", path),
				 errdetail("File must have permissions u=rw (0600) or less if owned by the database user, "
						   "or permissions u=rw,g=r (0640) or less if owned by root.  "
						   "The gatekeeper worker delivers no mail until it is corrected.")));
		close(fd);
		return false;
	}

	for (;;)
	{
		ssize_t		n = read(fd, buf + len, sizeof(buf) - 1 - len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
		{
			ereport(LOG,
					(errcode_for_file_access(),
					 errmsg("could not read relay password file \"%s\": %m", path)));
			explicit_bzero(buf, sizeof(buf));
			close(fd);
			return false;
		}
		if (n == 0 || len + n >= (ssize_t) sizeof(buf) - 1)
		{
			len += n;
			break;
		}
		len += n;
	}
	close(fd);
	buf[len] = '\0';

	if (len > 0 && buf[len - 1] == '\n')
		buf[--len] = '\0';
	if (len > 0 && buf[len - 1] == '\r')
		buf[--len] = '\0';

	if (len > SMTP_PASSWORD_MAX || len == 0 ||
		memchr(buf, '\0', len) != NULL || strpbrk(buf, "\r\n") != NULL)
	{
		ereport(LOG,
				(errcode(ERRCODE_CONFIG_FILE_ERROR),
				 errmsg("relay password file \"%s\" does not hold a password", path),
				 errdetail("It must hold one line of 1 to %d bytes, without NUL.  "
						   "The gatekeeper worker delivers no mail until it is corrected.",
						   SMTP_PASSWORD_MAX)));
		explicit_bzero(buf, sizeof(buf));
		return false;
	}

	smtp_password = MemoryContextStrdup(TopMemoryContext, buf);
	explicit_bzero(buf, sizeof(buf));
	return true;
}

/*
 * smtp_config_split
 *		The relay URLs of a gatekeeper.smtp_url value, in order, as a List
 *		of palloc'd strings: the value cut at each comma, and, in a list of
 *		several, the white space around each URL left off.  An empty value
 *		is an empty list.
 */
List *
smtp_config_split(const char *value)
{
	List	   *urls = NIL;
	bool		several = strchr(value, ',') != NULL;
	const char *p = value;

	if (value[0] == '\0')
		return NIL;
	for (;;)
	{
		const char *start = p;
		size_t		len = strcspn(p, ",");

		while (several && len > 0 && isspace((unsigned char) *start))
		{
			start++;
			len--;
		}
		while (several && len > 0 && isspace((unsigned char) start[len - 1]))
			len--;
		urls = lappend(urls, pnstrdup(start, len));
		p += strcspn(p, ",");
		if (*p == '\0')
			break;
		p++;
	}
	return urls;
}

/*
 * smtp_config_load
 *		Read the settings of the relay named by url into cfg, in cxt;
 *		cfg->valid says whether they can be used, cfg->problem why not.
 */
void
smtp_config_load(SmtpConfig *cfg, MemoryContext cxt, const char *url)
{
	MemoryContext old = MemoryContextSwitchTo(cxt);

	memset(cfg, 0, sizeof(*cfg));
	cfg->url = pstrdup(url);
	cfg->connections = Max(gatekeeper_smtp_connections, 1);
	cfg->default_connections = cfg->connections;
	cfg->timeout = Max(gatekeeper_smtp_timeout, 1);
	cfg->helo = pstrdup(gatekeeper_helo_name ? gatekeeper_helo_name : "");
	cfg->ca_file = pstrdup(gatekeeper_smtp_ca_file ? gatekeeper_smtp_ca_file : "");
	cfg->valid = parse_url(cfg, url);
	if (cfg->valid)
	{
		if (gatekeeper_smtp_user != NULL && gatekeeper_smtp_user[0] != '\0')
		{
			pfree(cfg->user);
			cfg->user = pstrdup(gatekeeper_smtp_user);
		}
		if (smtp_password != NULL)
		{
			pfree(cfg->password);
			cfg->password = pstrdup(smtp_password);
		}

		cfg->parsed = true;
		cfg->valid = smtp_config_resolve(cfg);
	}
	MemoryContextSwitchTo(old);
}

/*
 * smtp_config_resolve
 *		The relay's addresses.  Resolved once per configuration (getaddrinfo
 *		blocks), and again after a failure only when mail is submitted, which
 *		the worker's backoff spaces out.
 */
bool
smtp_config_resolve(SmtpConfig *cfg)
{
	struct addrinfo hints;
	struct addrinfo *ai;
	int			rc;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV;
	cfg->naddrs = 0;
	rc = getaddrinfo(cfg->host, cfg->port, &hints, &cfg->addrs);
	if (rc != 0)
	{
		snprintf(cfg->problem, sizeof(cfg->problem),
				 "relay %s: could not resolve \"%s\": %s",
				 cfg->peer, cfg->host, gai_strerror(rc));
		cfg->addrs = NULL;
		return false;
	}
	for (ai = cfg->addrs; ai != NULL; ai = ai->ai_next)
		cfg->naddrs++;
	return true;
}

/*
 * smtp_config_free
 *		Forget cfg, the password wiped.
 */
void
smtp_config_free(SmtpConfig *cfg)
{
	if (cfg->password != NULL)
		explicit_bzero(cfg->password, strlen(cfg->password));
	if (cfg->addrs != NULL)
		freeaddrinfo(cfg->addrs);
	/* the strings live in the client's context; they are few and small */
	memset(cfg, 0, sizeof(*cfg));
}

/*
 * smtp_config_matches
 *		Whether the settings are still those cfg was loaded from, url the
 *		relay's.
 */
bool
smtp_config_matches(const SmtpConfig *cfg, const char *url)
{
	const char *user = gatekeeper_smtp_user ? gatekeeper_smtp_user : "";
	const char *password = smtp_password ? smtp_password : "";

	return strcmp(cfg->url, url) == 0 &&
		strcmp(cfg->user, user) == 0 &&
		strcmp(cfg->password, password) == 0 &&
		strcmp(cfg->helo, gatekeeper_helo_name ? gatekeeper_helo_name : "") == 0 &&
		strcmp(cfg->ca_file, gatekeeper_smtp_ca_file ? gatekeeper_smtp_ca_file : "") == 0 &&
		cfg->default_connections == Max(gatekeeper_smtp_connections, 1) &&
		cfg->timeout == Max(gatekeeper_smtp_timeout, 1);
}

/*
 * parse_url
 *		Fill cfg->host, port, peer and smtps, and the options' share of
 *		connections and rate, from url; false, with why in cfg->problem,
 *		when the worker cannot use it (the rules of smtp_config_check_url,
 *		which the setting's check hook applies before a value is taken).
 */
static bool
parse_url(SmtpConfig *cfg, const char *url)
{
	SmtpUrl		u;
	SmtpUrlProblem problem;

	cfg->user = pstrdup("");
	cfg->password = pstrdup("");
	cfg->host = pstrdup("");
	cfg->port = pstrdup("");
	cfg->peer = pstrdup("");

	if (url[0] == '\0')
	{
		strlcpy(cfg->problem, "gatekeeper.smtp_url is not set", sizeof(cfg->problem));
		return false;
	}
	if (!smtp_config_check_url(url, "gatekeeper.smtp_url", &u, &problem))
	{
		strlcpy(cfg->problem, problem.message, sizeof(cfg->problem));
		return false;
	}
	cfg->smtps = u.smtps;
	cfg->host = pstrdup(u.host);
	cfg->port = pstrdup(u.port);
	cfg->peer = psprintf(strchr(cfg->host, ':') ? "[%s]:%s" : "%s:%s", cfg->host, cfg->port);
	if (u.connections > 0)
		cfg->connections = share_of(u.connections);
	if (u.rate > 0)
	{
		cfg->rate_limited = true;
		cfg->rate = share_of(u.rate);
	}
	return true;
}

/*
 * smtp_config_check_url
 *		Read one relay's URL, smtp://host[:port][/][?options] or smtps://...,
 *		into *u; false, with the message, detail and hint of what is wrong
 *		in *problem (naming the relay as subject says), when the worker
 *		cannot use it.  The one reader of a relay URL: the check hook of
 *		gatekeeper.smtp_url refuses with it what the worker would refuse.
 *
 * A URL names the relay and nothing else: a password in it would be
 * readable by pg_read_all_settings and written wherever the setting is
 * logged or copied, and a user name belongs beside the password.
 */
bool
smtp_config_check_url(const char *url, const char *subject, SmtpUrl *u, SmtpUrlProblem *problem)
{
	const char *authority;
	const char *end;
	const char *rest;
	const char *at = NULL;
	const char *p;
	const char *host;
	const char *hostend;
	const char *port = NULL;

	memset(u, 0, sizeof(*u));
	memset(problem, 0, sizeof(*problem));
#define URL_PROBLEM(field, ...) snprintf(problem->field, sizeof(problem->field), __VA_ARGS__)

	authority = strstr(url, "://");
	authority = authority ? authority + 3 : url;
	end = authority + strcspn(authority, "/?#");
	for (p = authority; p < end; p++)
	{
		if (*p == '@')
			at = p;
	}
	if (at != NULL)
	{
		if (memchr(authority, ':', at - authority) != NULL)
		{
			URL_PROBLEM(message, "%s must not contain a password", subject);
			URL_PROBLEM(detail, "Every setting can be read by members of pg_read_all_settings.");
			URL_PROBLEM(hint, "Put the password in a file that only the server's OS user can read, "
						"name it in gatekeeper.smtp_password_file, and set the user name in "
						"gatekeeper.smtp_user.");
		}
		else
		{
			URL_PROBLEM(message, "%s must not contain a user name", subject);
			URL_PROBLEM(hint, "Set the user name in gatekeeper.smtp_user and the password file in "
						"gatekeeper.smtp_password_file.");
		}
		return false;
	}
	if (pg_strncasecmp(url, "smtps://", 8) == 0)
		u->smtps = true;
	else if (pg_strncasecmp(url, "smtp://", 7) != 0)
	{
		URL_PROBLEM(message, "%s must begin with smtp:// or smtps://", subject);
		URL_PROBLEM(hint, "For example smtp://relay.example.com:587 (STARTTLS when offered) or "
					"smtps://relay.example.com:465.");
		return false;
	}

	/* options: ?connections=N&rate=N, after an optional "/" */
	rest = *end == '/' ? end + 1 : end;
	if (*rest == '?')
	{
		char		why[200];

		if (!smtp_config_parse_options(rest + 1, &u->connections, &u->rate, why, sizeof(why)))
		{
			URL_PROBLEM(message, "%s has %s", subject, why);
			URL_PROBLEM(hint, "For example smtp://relay.example.com:587?connections=4&rate=14: that relay's "
						"connections and messages per second, shared by the workers.");
			return false;
		}
	}
	else if (*rest != '\0')
	{
		URL_PROBLEM(message, "%s must be smtp://host:port or smtps://host:port, with nothing after the port "
					"but ?connections=N&rate=N", subject);
		return false;
	}

	host = authority;
	if (*host == '[')
	{
		hostend = memchr(host, ']', end - host);
		if (hostend == NULL || hostend == host + 1)
		{
			URL_PROBLEM(message, "%s has an unterminated or empty IPv6 address", subject);
			return false;
		}
		if (hostend + 1 < end)
		{
			if (hostend[1] != ':')
			{
				URL_PROBLEM(message, "%s does not name a host and port", subject);
				return false;
			}
			port = hostend + 2;
		}
		snprintf(u->host, sizeof(u->host), "%.*s", (int) (hostend - host - 1), host + 1);
	}
	else
	{
		hostend = memchr(host, ':', end - host);
		if (hostend == NULL)
			hostend = end;
		else
			port = hostend + 1;
		if (hostend == host)
		{
			URL_PROBLEM(message, "%s does not name a host", subject);
			return false;
		}
		for (p = host; p < hostend; p++)
		{
			if (!(isalnum((unsigned char) *p) || *p == '.' || *p == '-' || *p == '_'))
			{
				URL_PROBLEM(message, "%s has an invalid host name", subject);
				return false;
			}
		}
		if (hostend - host >= (ptrdiff_t) sizeof(u->host))
		{
			URL_PROBLEM(message, "%s has an invalid host name", subject);
			return false;
		}
		snprintf(u->host, sizeof(u->host), "%.*s", (int) (hostend - host), host);
	}
	if (port != NULL)
	{
		long		n = 0;

		if (port >= end)
		{
			URL_PROBLEM(message, "%s has an empty port", subject);
			return false;
		}
		for (p = port; p < end; p++)
		{
			if (!isdigit((unsigned char) *p) || (n = n * 10 + (*p - '0')) > 65535)
				break;
		}
		if (p < end || n == 0)
		{
			URL_PROBLEM(message, "%s has an invalid port", subject);
			URL_PROBLEM(detail, "A port is a number from 1 to 65535.");
			return false;
		}
		snprintf(u->port, sizeof(u->port), "%ld", n);
	}
	else
		strlcpy(u->port, u->smtps ? "465" : "25", sizeof(u->port));
#undef URL_PROBLEM
	return true;
}

/*
 * smtp_config_parse_options
 *		Read a relay URL's options, the query after its "?": connections=N
 *		(1 to SMTP_URL_MAX_CONNECTIONS) and rate=N messages a second (1 to
 *		SMTP_URL_MAX_RATE), each at most once, joined by "&".  Returns
 *		false, with the reason in problem, for anything else.  What is not
 *		given is left as it is.
 */
bool
smtp_config_parse_options(const char *query, int *connections, int *rate,
						  char *problem, size_t problemlen)
{
	const char *p = query;
	bool		seen_connections = false;
	bool		seen_rate = false;

	if (*p == '\0')
	{
		snprintf(problem, problemlen, "an empty option list after \"?\"");
		return false;
	}
	for (;;)
	{
		size_t		len = strcspn(p, "&");
		const char *eq = memchr(p, '=', len);
		size_t		namelen = eq ? (size_t) (eq - p) : len;
		bool		is_connections = namelen == 11 && strncmp(p, "connections", 11) == 0;
		bool		is_rate = namelen == 4 && strncmp(p, "rate", 4) == 0;
		long		max = is_connections ? SMTP_URL_MAX_CONNECTIONS : SMTP_URL_MAX_RATE;
		long		n = 0;
		const char *v;

		if (!is_connections && !is_rate)
		{
			snprintf(problem, problemlen, "an unknown option \"%.*s\" (a relay takes connections=N and rate=N)",
					 (int) Min(namelen, 64), p);
			return false;
		}
		if ((is_connections && seen_connections) || (is_rate && seen_rate))
		{
			snprintf(problem, problemlen, "option \"%s\" given twice",
					 is_connections ? "connections" : "rate");
			return false;
		}
		if (eq == NULL || eq + 1 == p + len)
		{
			snprintf(problem, problemlen, "option \"%s\" without a value",
					 is_connections ? "connections" : "rate");
			return false;
		}
		for (v = eq + 1; v < p + len; v++)
		{
			if (!isdigit((unsigned char) *v) || (n = n * 10 + (*v - '0')) > max)
				break;
		}
		if (v < p + len || n < 1)
		{
			snprintf(problem, problemlen, "option \"%s\" must be a number from 1 to %ld",
					 is_connections ? "connections" : "rate", max);
			return false;
		}
		if (is_connections)
		{
			seen_connections = true;
			if (connections)
				*connections = (int) n;
		}
		else
		{
			seen_rate = true;
			if (rate)
				*rate = (int) n;
		}
		p += len;
		if (*p == '\0')
			break;
		p++;
	}
	return true;
}

/*
 * smtp_config_set_share
 *		This worker is number index of count that share each relay's
 *		connections= and rate=: each worker takes its even share of them,
 *		the remainder going to the first workers, so that together they
 *		never exceed the relay's.
 */
void
smtp_config_set_share(int index, int count)
{
	share_count = Max(count, 1);
	share_index = Min(Max(index, 0), share_count - 1);
}

/*
 * This worker's share of a relay's total (connections or messages a
 * second); 0 when there are more workers than the total.
 */
static int
share_of(int total)
{
	return total / share_count + (share_index < total % share_count ? 1 : 0);
}

/*
 * smtp_config_fqdn
 *		This host's fully qualified name (getaddrinfo's canonical name of
 *		gethostname), or the bare host name when that has no dot.
 */
const char *
smtp_config_fqdn(void)
{
	char		name[256];
	struct addrinfo hints;
	struct addrinfo *res = NULL;

	if (host_fqdn != NULL)
		return host_fqdn;
	if (gethostname(name, sizeof(name)) != 0)
		strlcpy(name, "localhost", sizeof(name));
	name[sizeof(name) - 1] = '\0';
	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = AI_CANONNAME;
	hints.ai_socktype = SOCK_STREAM;
	if (getaddrinfo(name, NULL, &hints, &res) == 0 && res != NULL &&
		res->ai_canonname != NULL && strchr(res->ai_canonname, '.') != NULL)
		strlcpy(name, res->ai_canonname, sizeof(name));
	if (res != NULL)
		freeaddrinfo(res);
	host_fqdn = MemoryContextStrdup(TopMemoryContext, name);
	return host_fqdn;
}
