/*-------------------------------------------------------------------------
 *
 * smtp.c
 *		Delivery over SMTP through libcurl's multi interface.
 *
 * gatekeeper_smtp_deliver sends a batch of built messages to the relay
 * named by gatekeeper.smtp_url, up to gatekeeper.smtp_connections at a
 * time, and records what became of each.  The multi handle, and with it
 * libcurl's connection cache, lives as long as the process, so relay
 * connections are reused from one message to the next and from one call
 * to the next; gatekeeper_smtp_reset tears it all down, and a change of
 * any relay setting does the same on the next call.
 *
 * The wait is a WaitEventSet on libcurl's sockets (CURLMOPT_SOCKETFUNCTION
 * keeps the list) plus MyLatch and postmaster death, with libcurl's timer
 * (CURLMOPT_TIMERFUNCTION) as the timeout: a signal or a dying postmaster
 * is seen at once, however slow the relay.
 *
 * Outcomes (see smtp_finish): a 2xx reply to the data is SENT; from MAIL
 * FROM on, 5xx is FAIL and 4xx, a timeout or a lost connection RETRY; a
 * failure before MAIL FROM (no connection, no greeting, a refused
 * greeting, EHLO, STARTTLS or login) is the relay's, not the mail's, and
 * UNREACHABLE.
 *
 * libcurl does the SMTP dot-stuffing of the message and sends the final
 * ".": the message is handed over as built.
 *
 * libcurl's callbacks run inside libcurl and must never ereport: they only
 * touch plain memory allocated beforehand, or malloc.
 *
 *-------------------------------------------------------------------------
 */
#include "gatekeeper.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <curl/curl.h>

#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

/* Longest a connection attempt may take, when the timeout is longer. */
#define SMTP_CONNECT_TIMEOUT_MS 10000

/* Longest single wait, a safety net should libcurl's timer be missed. */
#define SMTP_MAX_WAIT_MS	1000

/* Longest relay password read from gatekeeper.smtp_password_file. */
#define SMTP_PASSWORD_MAX	1024

/* One easy handle of the pool and the transfer it carries. */
typedef struct SmtpSlot
{
	CURL	   *easy;
	GatekeeperDelivery *item;	/* NULL when idle */
	struct curl_slist *rcpt;	/* the RCPT list of the transfer */
	size_t		offset;			/* octets of the message handed to libcurl */
	bool		mail_sent;		/* MAIL FROM went out in this transfer */
	bool		rcpt_sent;		/* RCPT TO went out in this transfer */
	bool		quit_sent;		/* QUIT went out: later replies are not news */
	bool		in_auth;		/* AUTH went out, and no command since */
	bool		retried;		/* already restarted on a fresh connection */
	long		reply_code;		/* last reply code seen in this transfer */
	char		reply[160];		/* its text */
	char		errbuf[CURL_ERROR_SIZE];
} SmtpSlot;

/* A socket libcurl asked us to watch. */
typedef struct SmtpSocket
{
	curl_socket_t fd;
	int			what;			/* CURL_POLL_IN, _OUT or _INOUT */
	int			pos;			/* its position in smtp_waitset */
	bool		changed;		/* "what" changed since the set was built */
} SmtpSocket;

/* The relay settings the current state was built with. */
typedef struct SmtpConfig
{
	char	   *url;
	char	   *user;
	char	   *password;
	int			connections;
	int			timeout;
	bool		smtps;
	bool		loopback;
} SmtpConfig;

static bool smtp_curl_initialized = false;
static CURLM *smtp_multi = NULL;
static SmtpSlot *smtp_slots = NULL;
static int	smtp_nslots = 0;
static SmtpConfig smtp_config;

/*
 * The relay password as gatekeeper_smtp_load_password last read it from
 * gatekeeper.smtp_password_file, in TopMemoryContext; NULL for none.
 */
static char *smtp_password = NULL;

/* sockets, kept with malloc: the socket callback may not ereport */
static SmtpSocket *smtp_socks = NULL;
static int	smtp_nsocks = 0;
static int	smtp_socks_cap = 0;
static bool smtp_socks_rebuild = true;
static WaitEventSet *smtp_waitset = NULL;
static WaitEvent *smtp_events = NULL;
static int	smtp_events_cap = 0;

/* libcurl's timer: when it next wants CURL_SOCKET_TIMEOUT, if at all */
static bool smtp_timer_set = false;
static TimestampTz smtp_timer_deadline = 0;

/* every socket libcurl has open, kept with malloc (see smtp_abort_sockets) */
static curl_socket_t *smtp_open_fds = NULL;
static int	smtp_nopen = 0;
static int	smtp_open_cap = 0;

static void smtp_run(GatekeeperDelivery *items, int n);
static void smtp_setup(void);
static bool smtp_config_matches(void);
static void smtp_parse_url(const char *url);
static CURL *smtp_new_easy(SmtpSlot *slot);
static void smtp_check(CURLcode rc, const char *what);
static void smtp_start(SmtpSlot *slot, GatekeeperDelivery *item);
static void smtp_restart(SmtpSlot *slot);
static void smtp_launch(SmtpSlot *slot);
static bool smtp_finish(SmtpSlot *slot, CURLcode rc);
static void smtp_set_error(SmtpSlot *slot, CURLcode rc, const char *prefix);
static void smtp_scrub(char *text, const char *secret);
static char *smtp_envelope_address(const char *address);
static int	smtp_collect(GatekeeperDelivery *items, int n, int *next, int active);
static void smtp_wait(bool *latch_seen);
static void smtp_sync_waitset(void);
static void smtp_socket_action(curl_socket_t fd, int mask);
static void smtp_fail_all(GatekeeperDelivery *items, int n, const char *error);
static size_t smtp_read_cb(char *buffer, size_t size, size_t nitems, void *arg);
static int	smtp_debug_cb(CURL *easy, curl_infotype type, char *data, size_t size,
						  void *arg);
static int	smtp_socket_cb(CURL *easy, curl_socket_t fd, int what, void *arg,
						   void *sockp);
static int	smtp_timer_cb(CURLM *multi, long timeout_ms, void *arg);
static curl_socket_t smtp_open_cb(void *arg, curlsocktype purpose,
								  struct curl_sockaddr *address);
static int	smtp_close_cb(void *arg, curl_socket_t fd);
static void smtp_abort_sockets(void);

/*
 * gatekeeper_smtp_deliver
 *		Send items[0..n-1] and set each one's outcome, reply_code and error.
 *
 * At most gatekeeper.smtp_connections transfers run at once; as one ends
 * the next message starts on its easy handle, usually over the connection
 * it just freed.  Returns when every item has an outcome.  Must be called
 * outside a transaction; waits only on MyLatch and the relay's sockets,
 * and checks for interrupts on every wakeup.  A latch set while we wait
 * is set again on return, so a wake-up meant for the caller is not lost.
 */
void
gatekeeper_smtp_deliver(GatekeeperDelivery *items, int n)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		items[i].outcome = GATEKEEPER_UNREACHABLE;
		items[i].reply_code = 0;
		items[i].error[0] = '\0';
	}
	if (n <= 0)
		return;

	if (gatekeeper_smtp_url == NULL || gatekeeper_smtp_url[0] == '\0')
	{
		smtp_fail_all(items, n, "gatekeeper.smtp_url is not set");
		return;
	}
	if (pg_strncasecmp(gatekeeper_smtp_url, "smtp://", 7) != 0 &&
		pg_strncasecmp(gatekeeper_smtp_url, "smtps://", 8) != 0)
	{
		smtp_fail_all(items, n, "gatekeeper.smtp_url must begin with smtp:// or smtps://");
		return;
	}

	if (smtp_multi != NULL && !smtp_config_matches())
		gatekeeper_smtp_reset();
	if (smtp_multi == NULL)
	{
		gatekeeper_smtp_reset();	/* whatever a failed setup left */
		smtp_setup();
	}

	PG_TRY();
	{
		smtp_run(items, n);
	}
	PG_CATCH();
	{
		/* transfers point into items: drop them all, and every connection */
		gatekeeper_smtp_reset();
		PG_RE_THROW();
	}
	PG_END_TRY();
}

/*
 * smtp_run
 *		The body of gatekeeper_smtp_deliver: start the first transfers, then
 *		wait and start the next as each ends, until all are done.
 */
static void
smtp_run(GatekeeperDelivery *items, int n)
{
	int			next = 0;
	int			active = 0;
	bool		latch_seen = false;

	while (next < n && active < smtp_nslots)
	{
		smtp_start(&smtp_slots[active], &items[next++]);
		active++;
	}

	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		active = smtp_collect(items, n, &next, active);
		if (active == 0)
			break;
		smtp_wait(&latch_seen);
	}

	if (latch_seen)
		SetLatch(MyLatch);
}

/*
 * gatekeeper_smtp_reset
 *		Close every relay connection and free all of libcurl's state.
 *
 * Called when the relay settings change; the next delivery starts afresh.
 * Also called when an error (a query cancel, say) interrupts a delivery.
 *
 * The connections are shut down before libcurl is asked to close them, so
 * the QUIT libcurl would send, and wait for, fails at once: a stuck relay
 * can never hold up a reload or an error.  A transfer cut short this way
 * never sends the final ".", so the relay discards its partial message
 * (libcurl's SMTP "done" handler would otherwise send "." for a transfer
 * removed while in progress, and wait for the reply).
 */
void
gatekeeper_smtp_reset(void)
{
	int			i;

	smtp_abort_sockets();

	if (smtp_multi != NULL)
	{
		for (i = 0; i < smtp_nslots; i++)
		{
			if (smtp_slots[i].easy != NULL && smtp_slots[i].item != NULL)
				curl_multi_remove_handle(smtp_multi, smtp_slots[i].easy);
		}
	}
	for (i = 0; i < smtp_nslots; i++)
	{
		if (smtp_slots[i].easy != NULL)
			curl_easy_cleanup(smtp_slots[i].easy);
		if (smtp_slots[i].rcpt != NULL)
			curl_slist_free_all(smtp_slots[i].rcpt);
	}
	if (smtp_multi != NULL)
		curl_multi_cleanup(smtp_multi);
	smtp_multi = NULL;

	if (smtp_slots != NULL)
		pfree(smtp_slots);
	smtp_slots = NULL;
	smtp_nslots = 0;

	if (smtp_waitset != NULL)
		FreeWaitEventSet(smtp_waitset);
	smtp_waitset = NULL;
	if (smtp_events != NULL)
		pfree(smtp_events);
	smtp_events = NULL;
	smtp_events_cap = 0;
	free(smtp_socks);
	smtp_socks = NULL;
	smtp_nsocks = 0;
	smtp_socks_cap = 0;
	smtp_socks_rebuild = true;
	smtp_timer_set = false;

	if (smtp_config.url != NULL)
		pfree(smtp_config.url);
	if (smtp_config.user != NULL)
		pfree(smtp_config.user);
	if (smtp_config.password != NULL)
	{
		explicit_bzero(smtp_config.password, strlen(smtp_config.password));
		pfree(smtp_config.password);
	}
	memset(&smtp_config, 0, sizeof(smtp_config));
}

/*
 * gatekeeper_smtp_load_password
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
gatekeeper_smtp_load_password(void)
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
 * smtp_setup
 *		Initialize libcurl (once per process), the multi handle and the
 *		slot pool for the current settings.
 */
static void
smtp_setup(void)
{
	MemoryContext oldcxt;
	int			conns = Max(gatekeeper_smtp_connections, 1);

	if (!smtp_curl_initialized)
	{
		CURLcode	rc = curl_global_init(CURL_GLOBAL_ALL);

		if (rc != CURLE_OK)
			elog(ERROR, "could not initialize libcurl: %s", curl_easy_strerror(rc));
		smtp_curl_initialized = true;
	}

	oldcxt = MemoryContextSwitchTo(TopMemoryContext);
	smtp_config.url = pstrdup(gatekeeper_smtp_url);
	smtp_config.user = pstrdup(gatekeeper_smtp_user ? gatekeeper_smtp_user : "");
	smtp_config.password = pstrdup(smtp_password ? smtp_password : "");
	smtp_config.connections = gatekeeper_smtp_connections;
	smtp_config.timeout = gatekeeper_smtp_timeout;
	smtp_parse_url(smtp_config.url);
	smtp_slots = palloc0(sizeof(SmtpSlot) * conns);
	MemoryContextSwitchTo(oldcxt);
	smtp_nslots = conns;

	smtp_multi = curl_multi_init();
	if (smtp_multi == NULL)
		elog(ERROR, "could not create a libcurl multi handle");

	/*
	 * One connection per slot, never more, and keep them all in the cache
	 * between calls (the default cache size follows the number of easy
	 * handles added, which drops to nothing between calls).
	 */
	curl_multi_setopt(smtp_multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long) conns);
	curl_multi_setopt(smtp_multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long) conns);
	curl_multi_setopt(smtp_multi, CURLMOPT_MAXCONNECTS, (long) conns);
	curl_multi_setopt(smtp_multi, CURLMOPT_SOCKETFUNCTION, smtp_socket_cb);
	curl_multi_setopt(smtp_multi, CURLMOPT_TIMERFUNCTION, smtp_timer_cb);
}

/*
 * smtp_config_matches
 *		Are the relay settings still those the current state was built for?
 */
static bool
smtp_config_matches(void)
{
	return strcmp(smtp_config.url, gatekeeper_smtp_url) == 0 &&
		strcmp(smtp_config.user, gatekeeper_smtp_user ? gatekeeper_smtp_user : "") == 0 &&
		strcmp(smtp_config.password, smtp_password ? smtp_password : "") == 0 &&
		smtp_config.connections == gatekeeper_smtp_connections &&
		smtp_config.timeout == gatekeeper_smtp_timeout;
}

/*
 * smtp_parse_url
 *		Note in smtp_config whether the URL is smtps://, and whether its host
 *		is the loopback.  (It holds no user information: the setting's
 *		check hook refuses that.)
 */
static void
smtp_parse_url(const char *url)
{
	CURLU	   *u = curl_url();
	char	   *part = NULL;

	smtp_config.smtps = pg_strncasecmp(url, "smtps://", 8) == 0;
	smtp_config.loopback = false;
	if (u == NULL)
		return;
	if (curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK)
	{
		if (curl_url_get(u, CURLUPART_HOST, &part, 0) == CURLUE_OK)
		{
			smtp_config.loopback = pg_strcasecmp(part, "localhost") == 0 ||
				strncmp(part, "127.", 4) == 0 ||
				strcmp(part, "[::1]") == 0;
			curl_free(part);
		}
	}
	curl_url_cleanup(u);
}

/*
 * smtp_check
 *		Raise an error when setting an option failed.  Only for options
 *		whose failure would make delivery wrong or unsafe.
 */
static void
smtp_check(CURLcode rc, const char *what)
{
	if (rc != CURLE_OK)
		elog(ERROR, "could not set libcurl option %s: %s", what,
			 curl_easy_strerror(rc));
}

/*
 * smtp_new_easy
 *		Create a slot's easy handle with the options common to every
 *		transfer it will carry.
 *
 * TLS: smtps:// is TLS from the first octet.  smtp:// is plain unless
 * credentials are set and the relay is not on the loopback: then STARTTLS
 * is required, so the password never crosses a network in clear text
 * (that is also what submission relays on port 587 expect).  Certificates
 * are verified (libcurl's default).
 */
static CURL *
smtp_new_easy(SmtpSlot *slot)
{
	CURL	   *e = curl_easy_init();
	long		timeout = gatekeeper_smtp_timeout > 0 ? gatekeeper_smtp_timeout : 30000;

	if (e == NULL)
		elog(ERROR, "could not create a libcurl easy handle");
	slot->easy = e;

	smtp_check(curl_easy_setopt(e, CURLOPT_URL, smtp_config.url), "CURLOPT_URL");
#if LIBCURL_VERSION_NUM >= 0x075500
	smtp_check(curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "smtp,smtps"),
			   "CURLOPT_PROTOCOLS_STR");
#else
	smtp_check(curl_easy_setopt(e, CURLOPT_PROTOCOLS,
								(long) (CURLPROTO_SMTP | CURLPROTO_SMTPS)),
			   "CURLOPT_PROTOCOLS");
#endif
	if (smtp_config.user[0] != '\0')
		smtp_check(curl_easy_setopt(e, CURLOPT_USERNAME, smtp_config.user),
				   "CURLOPT_USERNAME");
	if (smtp_config.password[0] != '\0')
		smtp_check(curl_easy_setopt(e, CURLOPT_PASSWORD, smtp_config.password),
				   "CURLOPT_PASSWORD");
	if (!smtp_config.smtps)
	{
		bool		credentials = smtp_config.user[0] != '\0' ||
			smtp_config.password[0] != '\0';

		smtp_check(curl_easy_setopt(e, CURLOPT_USE_SSL,
									(long) (credentials && !smtp_config.loopback ?
											CURLUSESSL_ALL : CURLUSESSL_NONE)),
				   "CURLOPT_USE_SSL");
	}

	smtp_check(curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L), "CURLOPT_NOSIGNAL");
	smtp_check(curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout), "CURLOPT_TIMEOUT_MS");
	smtp_check(curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
								Min(timeout, (long) SMTP_CONNECT_TIMEOUT_MS)),
			   "CURLOPT_CONNECTTIMEOUT_MS");

	/*
	 * Also bounds the wait for each reply, including the reply to the QUIT
	 * libcurl sends, blocking, when it closes a connection.
	 */
	smtp_check(curl_easy_setopt(e, CURLOPT_SERVER_RESPONSE_TIMEOUT,
								(timeout + 999) / 1000),
			   "CURLOPT_SERVER_RESPONSE_TIMEOUT");

	smtp_check(curl_easy_setopt(e, CURLOPT_UPLOAD, 1L), "CURLOPT_UPLOAD");
	smtp_check(curl_easy_setopt(e, CURLOPT_READFUNCTION, smtp_read_cb),
			   "CURLOPT_READFUNCTION");
	smtp_check(curl_easy_setopt(e, CURLOPT_READDATA, slot), "CURLOPT_READDATA");
	smtp_check(curl_easy_setopt(e, CURLOPT_PRIVATE, slot), "CURLOPT_PRIVATE");
	smtp_check(curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, smtp_open_cb),
			   "CURLOPT_OPENSOCKETFUNCTION");
	smtp_check(curl_easy_setopt(e, CURLOPT_CLOSESOCKETFUNCTION, smtp_close_cb),
			   "CURLOPT_CLOSESOCKETFUNCTION");
#if LIBCURL_VERSION_NUM >= 0x075700
	/* never wait for a resolver thread when a transfer is torn down */
	smtp_check(curl_easy_setopt(e, CURLOPT_QUICK_EXIT, 1L), "CURLOPT_QUICK_EXIT");
#endif
	smtp_check(curl_easy_setopt(e, CURLOPT_ERRORBUFFER, slot->errbuf),
			   "CURLOPT_ERRORBUFFER");

	/*
	 * The debug callback sees each command and reply line: it tells how far
	 * the session got and keeps the relay's last reply for the error text.
	 * VERBOSE is what makes libcurl call it; nothing goes to stderr.
	 */
	smtp_check(curl_easy_setopt(e, CURLOPT_DEBUGFUNCTION, smtp_debug_cb),
			   "CURLOPT_DEBUGFUNCTION");
	smtp_check(curl_easy_setopt(e, CURLOPT_DEBUGDATA, slot), "CURLOPT_DEBUGDATA");
	smtp_check(curl_easy_setopt(e, CURLOPT_VERBOSE, 1L), "CURLOPT_VERBOSE");

	return e;
}

/*
 * smtp_start
 *		Start delivering item on slot's easy handle.
 */
static void
smtp_start(SmtpSlot *slot, GatekeeperDelivery *item)
{
	char	   *from;
	char	   *rcpt;

	if (slot->easy == NULL)
		smtp_new_easy(slot);

	from = smtp_envelope_address(item->from ? item->from : "");
	rcpt = smtp_envelope_address(item->mail->recipient);

	if (slot->rcpt != NULL)
		curl_slist_free_all(slot->rcpt);
	slot->rcpt = curl_slist_append(NULL, rcpt);
	if (slot->rcpt == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));

	/* libcurl copies string options */
	smtp_check(curl_easy_setopt(slot->easy, CURLOPT_MAIL_FROM, from),
			   "CURLOPT_MAIL_FROM");
	smtp_check(curl_easy_setopt(slot->easy, CURLOPT_MAIL_RCPT, slot->rcpt),
			   "CURLOPT_MAIL_RCPT");
	smtp_check(curl_easy_setopt(slot->easy, CURLOPT_INFILESIZE_LARGE,
								(curl_off_t) item->message.len),
			   "CURLOPT_INFILESIZE_LARGE");
	pfree(from);
	pfree(rcpt);

	slot->item = item;
	slot->retried = false;
	smtp_launch(slot);
}

/*
 * smtp_restart
 *		Send slot's message again from the start, once.
 */
static void
smtp_restart(SmtpSlot *slot)
{
	slot->retried = true;
	smtp_launch(slot);
}

/*
 * smtp_launch
 *		Start slot's transfer from the beginning of its message, with the
 *		progress of any earlier try forgotten.
 */
static void
smtp_launch(SmtpSlot *slot)
{
	CURLMcode	mc;

	slot->offset = 0;
	slot->mail_sent = false;
	slot->rcpt_sent = false;
	slot->quit_sent = false;
	slot->in_auth = false;
	slot->reply_code = 0;
	slot->reply[0] = '\0';
	slot->errbuf[0] = '\0';

	mc = curl_multi_add_handle(smtp_multi, slot->easy);
	if (mc != CURLM_OK)
		elog(ERROR, "could not start an SMTP transfer: %s", curl_multi_strerror(mc));
}

/*
 * smtp_finish
 *		Record the outcome of slot's finished transfer (already removed from
 *		the multi handle).  Returns true when it was restarted instead.
 *
 * 2xx to the data: sent.  A failure before MAIL FROM went out is the
 * session's, not the mail's: no connection, no greeting, a refused
 * greeting, EHLO, STARTTLS or login.  The relay is unreachable for this
 * mail, which goes back uncharged, whatever the reply code.  From MAIL
 * FROM on, a 5xx reply is a permanent failure, a 4xx reply, a timeout or
 * a broken connection a retry.
 *
 * A connection taken from the cache (CURLINFO_NUM_CONNECTS 0: no new
 * connection was made) may have been closed by the relay while idle.  When
 * such a reused connection fails before RCPT TO went out with no reply or
 * a 421, the relay cannot have taken the mail, and it is sent again once,
 * on a new connection, before anything is recorded.
 */
static bool
smtp_finish(SmtpSlot *slot, CURLcode rc)
{
	GatekeeperDelivery *item = slot->item;
	long		code = slot->reply_code;
	long		connects = -1;

	if (code == 0)
		curl_easy_getinfo(slot->easy, CURLINFO_RESPONSE_CODE, &code);
	curl_easy_getinfo(slot->easy, CURLINFO_NUM_CONNECTS, &connects);

	if (rc != CURLE_OK && connects == 0 && !slot->retried && !slot->rcpt_sent &&
		(code == 0 || code == 421))
	{
		smtp_restart(slot);
		return true;
	}

	/* the reply code only where a reply decided the outcome */
	item->reply_code = (rc == CURLE_OK || code >= 400) ? code : 0;
	if (rc == CURLE_OK)
	{
		item->outcome = GATEKEEPER_SENT;
		item->error[0] = '\0';
	}
	else if (!slot->mail_sent)
	{
		item->outcome = GATEKEEPER_UNREACHABLE;
		smtp_set_error(slot, rc, code == 0 ? "relay not reached" :
					   "relay refused the session");
	}
	else if (code >= 500 && code < 600)
	{
		item->outcome = GATEKEEPER_FAIL;
		smtp_set_error(slot, rc, NULL);
	}
	else
	{
		item->outcome = GATEKEEPER_RETRY;
		smtp_set_error(slot, rc, NULL);
	}

	curl_slist_free_all(slot->rcpt);
	slot->rcpt = NULL;
	slot->item = NULL;
	return false;
}

/*
 * smtp_set_error
 *		Fill the item's error text: the relay's last reply when it was an
 *		error, then libcurl's message and code.  Never holds a password.
 */
static void
smtp_set_error(SmtpSlot *slot, CURLcode rc, const char *prefix)
{
	GatekeeperDelivery *item = slot->item;
	const char *detail = slot->errbuf[0] ? slot->errbuf : curl_easy_strerror(rc);
	char		reply[sizeof(slot->reply) + 4];

	reply[0] = '\0';
	if (slot->reply[0] != '\0' && slot->reply_code >= 400)
		snprintf(reply, sizeof(reply), "%s; ", slot->reply);

	snprintf(item->error, sizeof(item->error), "%s%s%s%s (curl error %d)",
			 prefix ? prefix : "", prefix ? ": " : "",
			 reply, detail, (int) rc);

	smtp_scrub(item->error, smtp_config.password);
}

/*
 * smtp_scrub
 *		Overwrite every occurrence of secret in text with '*'.
 */
static void
smtp_scrub(char *text, const char *secret)
{
	size_t		len;
	char	   *p;

	if (secret == NULL || secret[0] == '\0')
		return;
	len = strlen(secret);
	while ((p = strstr(text, secret)) != NULL)
		memset(p, '*', len);
}

/*
 * smtp_envelope_address
 *		The SMTP path for an address, "<local@domain>": the part between
 *		angle brackets when there is one ("Name <a@b>"), else the whole of
 *		it, trimmed.
 */
static char *
smtp_envelope_address(const char *address)
{
	const char *lt = strrchr(address, '<');
	const char *start;
	const char *end;

	if (lt != NULL && strchr(lt, '>') != NULL)
	{
		start = lt + 1;
		end = strchr(lt, '>');
	}
	else
	{
		start = address;
		end = address + strlen(address);
	}
	while (start < end && (*start == ' ' || *start == '\t'))
		start++;
	while (end > start && (end[-1] == ' ' || end[-1] == '\t'))
		end--;
	return psprintf("<%.*s>", (int) (end - start), start);
}

/*
 * smtp_collect
 *		Handle every transfer libcurl reports done; start the next message
 *		on each freed slot.  Returns the number of transfers still running.
 */
static int
smtp_collect(GatekeeperDelivery *items, int n, int *next, int active)
{
	CURLMsg    *msg;
	int			left;

	while ((msg = curl_multi_info_read(smtp_multi, &left)) != NULL)
	{
		CURL	   *easy = msg->easy_handle;
		CURLcode	rc = msg->data.result;
		char	   *priv = NULL;
		SmtpSlot   *slot;

		if (msg->msg != CURLMSG_DONE)
			continue;

		/* msg is invalid once the handle is removed */
		curl_easy_getinfo(easy, CURLINFO_PRIVATE, &priv);
		slot = (SmtpSlot *) priv;
		curl_multi_remove_handle(smtp_multi, easy);

		if (smtp_finish(slot, rc))
			continue;
		active--;
		if (*next < n)
		{
			smtp_start(slot, &items[(*next)++]);
			active++;
		}
	}
	return active;
}

/*
 * smtp_wait
 *		Wait for socket activity, libcurl's timer, the latch or postmaster
 *		death, and let libcurl act on what happened.
 */
static void
smtp_wait(bool *latch_seen)
{
	long		timeout = SMTP_MAX_WAIT_MS;
	int			nevents;
	int			i;
	bool		timer_due = false;

	if (smtp_timer_set)
	{
		TimestampTz now = GetCurrentTimestamp();

		if (now >= smtp_timer_deadline)
			timeout = 0;
		else
			timeout = Min(timeout,
						  (long) ((smtp_timer_deadline - now + 999) / 1000));
	}

	if (timeout > 0)
	{
		smtp_sync_waitset();
		nevents = WaitEventSetWait(smtp_waitset, timeout, smtp_events,
								   smtp_events_cap, PG_WAIT_EXTENSION);
		for (i = 0; i < nevents; i++)
		{
			WaitEvent  *ev = &smtp_events[i];

			if (ev->events & WL_LATCH_SET)
			{
				ResetLatch(MyLatch);
				*latch_seen = true;
			}
			else if (ev->events & WL_SOCKET_MASK)
			{
				int			mask = 0;

				if (ev->events & WL_SOCKET_READABLE)
					mask |= CURL_CSELECT_IN;
				if (ev->events & WL_SOCKET_WRITEABLE)
					mask |= CURL_CSELECT_OUT;
				smtp_socket_action(ev->fd, mask);
			}
		}
		if (nevents == 0)
			timer_due = true;
	}
	else
		timer_due = true;

	if (smtp_timer_set && GetCurrentTimestamp() >= smtp_timer_deadline)
		timer_due = true;

	if (timer_due)
	{
		smtp_timer_set = false;
		smtp_socket_action(CURL_SOCKET_TIMEOUT, 0);
	}
}

/*
 * smtp_sync_waitset
 *		Bring smtp_waitset in line with the sockets libcurl watches: rebuilt
 *		when a socket came or went, modified in place when only the events
 *		of one changed.
 */
static void
smtp_sync_waitset(void)
{
	int			i;

	if (smtp_waitset == NULL || smtp_socks_rebuild)
	{
		if (smtp_waitset != NULL)
			FreeWaitEventSet(smtp_waitset);
		smtp_waitset = NULL;

		if (smtp_events_cap < smtp_nsocks + 2)
		{
			int			cap = Max(smtp_nsocks + 2, 2 * smtp_nslots + 4);

			if (smtp_events != NULL)
				pfree(smtp_events);
			smtp_events = MemoryContextAlloc(TopMemoryContext, sizeof(WaitEvent) * cap);
			smtp_events_cap = cap;
		}

		smtp_waitset = CreateWaitEventSet(TopMemoryContext, smtp_nsocks + 2);
		AddWaitEventToSet(smtp_waitset, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
		if (IsUnderPostmaster)
			AddWaitEventToSet(smtp_waitset, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET,
							  NULL, NULL);
		for (i = 0; i < smtp_nsocks; i++)
		{
			SmtpSocket *s = &smtp_socks[i];
			uint32		events = 0;

			if (s->what & CURL_POLL_IN)
				events |= WL_SOCKET_READABLE;
			if (s->what & CURL_POLL_OUT)
				events |= WL_SOCKET_WRITEABLE;
			s->pos = AddWaitEventToSet(smtp_waitset, events, s->fd, NULL, NULL);
			s->changed = false;
		}
		smtp_socks_rebuild = false;
		return;
	}

	for (i = 0; i < smtp_nsocks; i++)
	{
		SmtpSocket *s = &smtp_socks[i];
		uint32		events = 0;

		if (!s->changed)
			continue;
		if (s->what & CURL_POLL_IN)
			events |= WL_SOCKET_READABLE;
		if (s->what & CURL_POLL_OUT)
			events |= WL_SOCKET_WRITEABLE;
		ModifyWaitEvent(smtp_waitset, s->pos, events, NULL);
		s->changed = false;
	}
}

/*
 * smtp_socket_action
 *		Let libcurl act on a socket event, or on its timer.
 */
static void
smtp_socket_action(curl_socket_t fd, int mask)
{
	int			running;
	CURLMcode	mc;

	mc = curl_multi_socket_action(smtp_multi, fd, mask, &running);
	if (mc != CURLM_OK)
		elog(ERROR, "libcurl failed: %s", curl_multi_strerror(mc));
}

/*
 * smtp_fail_all
 *		Mark every item unreachable with the same reason.
 */
static void
smtp_fail_all(GatekeeperDelivery *items, int n, const char *error)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		items[i].outcome = GATEKEEPER_UNREACHABLE;
		items[i].reply_code = 0;
		strlcpy(items[i].error, error, sizeof(items[i].error));
	}
}

/*
 * smtp_read_cb
 *		libcurl's read callback: the next piece of the slot's message.
 */
static size_t
smtp_read_cb(char *buffer, size_t size, size_t nitems, void *arg)
{
	SmtpSlot   *slot = (SmtpSlot *) arg;
	const StringInfoData *msg = &slot->item->message;
	size_t		room = size * nitems;
	size_t		left = (size_t) msg->len - slot->offset;
	size_t		n = Min(room, left);

	memcpy(buffer, msg->data + slot->offset, n);
	slot->offset += n;
	return n;
}

/*
 * smtp_debug_cb
 *		libcurl's debug callback: note the commands sent and keep the last
 *		reply before QUIT (libcurl closes a connection after a failed
 *		transfer with QUIT, and "221" would hide the reply that failed it).
 *		Commands are only matched, never stored (AUTH carries the password).
 */
static int
smtp_debug_cb(CURL *easy, curl_infotype type, char *data, size_t size, void *arg)
{
	SmtpSlot   *slot = (SmtpSlot *) arg;

	(void) easy;

	if (type == CURLINFO_HEADER_OUT)
	{
		/* what follows AUTH until the next command belongs to the login */
		if (size >= 4 && pg_strncasecmp(data, "AUTH", 4) == 0)
			slot->in_auth = true;
		else if (size >= 4 && (pg_strncasecmp(data, "MAIL", 4) == 0 ||
							   pg_strncasecmp(data, "RSET", 4) == 0 ||
							   pg_strncasecmp(data, "QUIT", 4) == 0 ||
							   pg_strncasecmp(data, "EHLO", 4) == 0))
			slot->in_auth = false;

		if (size >= 9 && pg_strncasecmp(data, "MAIL FROM", 9) == 0)
			slot->mail_sent = true;
		else if (size >= 7 && pg_strncasecmp(data, "RCPT TO", 7) == 0)
			slot->rcpt_sent = true;
		else if (size >= 4 && pg_strncasecmp(data, "QUIT", 4) == 0)
			slot->quit_sent = true;
	}
	else if (type == CURLINFO_HEADER_IN && !slot->quit_sent && size >= 3 &&
			 data[0] >= '1' && data[0] <= '5' &&
			 data[1] >= '0' && data[1] <= '9' &&
			 data[2] >= '0' && data[2] <= '9')
	{
		size_t		len = size;
		size_t		i;

		while (len > 0 && (data[len - 1] == '\r' || data[len - 1] == '\n'))
			len--;

		/*
		 * A reply during the login keeps its codes only: a relay may echo
		 * what it was sent, and the client's side of AUTH carries the
		 * password (base64 is no disguise).
		 */
		if (slot->in_auth)
		{
			size_t		codes = 3;

			while (codes < len && (data[codes] == ' ' || data[codes] == '-' ||
								   data[codes] == '.' ||
								   (data[codes] >= '0' && data[codes] <= '9')))
				codes++;
			len = codes;
		}
		len = Min(len, sizeof(slot->reply) - 1);
		for (i = 0; i < len; i++)
		{
			unsigned char c = (unsigned char) data[i];

			slot->reply[i] = (c < 0x20 || c == 0x7f) ? ' ' : (char) c;
		}
		slot->reply[len] = '\0';
		if (slot->in_auth)
			strlcat(slot->reply, " (reply to AUTH)", sizeof(slot->reply));
		slot->reply_code = (data[0] - '0') * 100 + (data[1] - '0') * 10 + (data[2] - '0');
	}
	return 0;
}

/*
 * smtp_socket_cb
 *		libcurl's socket callback: keep smtp_socks in step with the sockets
 *		libcurl wants watched.  Returns -1 when out of memory, which fails
 *		the transfer.
 */
static int
smtp_socket_cb(CURL *easy, curl_socket_t fd, int what, void *arg, void *sockp)
{
	int			i;

	(void) easy;
	(void) arg;
	(void) sockp;

	for (i = 0; i < smtp_nsocks; i++)
	{
		if (smtp_socks[i].fd == fd)
			break;
	}

	if (what == CURL_POLL_REMOVE)
	{
		if (i < smtp_nsocks)
		{
			smtp_socks[i] = smtp_socks[smtp_nsocks - 1];
			smtp_nsocks--;
			smtp_socks_rebuild = true;
		}
		return 0;
	}

	if (i < smtp_nsocks)
	{
		if (smtp_socks[i].what != what)
		{
			smtp_socks[i].what = what;
			smtp_socks[i].changed = true;
		}
		return 0;
	}

	if (smtp_nsocks == smtp_socks_cap)
	{
		int			cap = Max(16, smtp_socks_cap * 2);
		SmtpSocket *socks = realloc(smtp_socks, sizeof(SmtpSocket) * cap);

		if (socks == NULL)
			return -1;
		smtp_socks = socks;
		smtp_socks_cap = cap;
	}
	smtp_socks[smtp_nsocks].fd = fd;
	smtp_socks[smtp_nsocks].what = what;
	smtp_socks[smtp_nsocks].pos = -1;
	smtp_socks[smtp_nsocks].changed = false;
	smtp_nsocks++;
	smtp_socks_rebuild = true;
	return 0;
}

/*
 * smtp_timer_cb
 *		libcurl's timer callback: when to call it back with
 *		CURL_SOCKET_TIMEOUT; -1 cancels.
 */
static int
smtp_timer_cb(CURLM *multi, long timeout_ms, void *arg)
{
	(void) multi;
	(void) arg;

	if (timeout_ms < 0)
		smtp_timer_set = false;
	else
	{
		smtp_timer_set = true;
		smtp_timer_deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														  timeout_ms);
	}
	return 0;
}

/*
 * smtp_open_cb
 *		libcurl's open-socket callback: open the socket and remember it.
 */
static curl_socket_t
smtp_open_cb(void *arg, curlsocktype purpose, struct curl_sockaddr *address)
{
	curl_socket_t fd;

	(void) arg;
	(void) purpose;

	if (smtp_nopen == smtp_open_cap)
	{
		int			cap = Max(16, smtp_open_cap * 2);
		curl_socket_t *fds = realloc(smtp_open_fds, sizeof(curl_socket_t) * cap);

		if (fds == NULL)
			return CURL_SOCKET_BAD;
		smtp_open_fds = fds;
		smtp_open_cap = cap;
	}

	fd = socket(address->family, address->socktype, address->protocol);
	if (fd != CURL_SOCKET_BAD)
		smtp_open_fds[smtp_nopen++] = fd;
	return fd;
}

/*
 * smtp_close_cb
 *		libcurl's close-socket callback: forget the socket and close it.
 */
static int
smtp_close_cb(void *arg, curl_socket_t fd)
{
	int			i;

	(void) arg;

	for (i = 0; i < smtp_nopen; i++)
	{
		if (smtp_open_fds[i] == fd)
		{
			smtp_open_fds[i] = smtp_open_fds[--smtp_nopen];
			break;
		}
	}
	return close(fd);
}

/*
 * smtp_abort_sockets
 *		Shut down every socket libcurl has open, so that whatever libcurl
 *		tries next on them fails at once instead of waiting on the relay.
 *		libcurl still closes them itself.
 */
static void
smtp_abort_sockets(void)
{
	int			i;

	for (i = 0; i < smtp_nopen; i++)
		(void) shutdown(smtp_open_fds[i], SHUT_RDWR);
}
