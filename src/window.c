/*-------------------------------------------------------------------------
 *
 * window.c
 *		Sending windows: the local hours in which a queue may send, judged
 *		in the mail's time zone or the queue's.
 *
 * A window is 'HH:MM-HH:MM' in local time.  It may wrap midnight
 * ('21:00-08:00'), and '00:00-24:00' is all day.  Due mail outside its
 * window is deferred by the claim to the window's next opening, found
 * here with PostgreSQL's own time zone data (pg_tz), so that daylight
 * saving changes move the opening with the local clock.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <unistd.h>

#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"

#include "window.h"

#define SECS_PER_LOCAL_DAY	86400

/* how many local days ahead an opening is looked for (DST gaps skip one) */
#define MAX_DAYS_AHEAD		4

static bool parse_hhmm(const char *s, int *secs, bool closing);
static bool local_time(TimestampTz t, pg_tz *zone, struct pg_tm *tm);
static bool inside(const GatekeeperWindow *window, const struct pg_tm *tm);

/*
 * parse_hhmm
 *		Two digits, ':', two digits, as seconds since midnight.  24:00 is
 *		accepted only as a window's closing time.
 */
static bool
parse_hhmm(const char *s, int *secs, bool closing)
{
	int			h;
	int			m;

	if (!isdigit((unsigned char) s[0]) || !isdigit((unsigned char) s[1]) ||
		s[2] != ':' ||
		!isdigit((unsigned char) s[3]) || !isdigit((unsigned char) s[4]))
		return false;
	h = (s[0] - '0') * 10 + (s[1] - '0');
	m = (s[3] - '0') * 10 + (s[4] - '0');
	if (m > 59 || h > 24 || (h == 24 && (m != 0 || !closing)))
		return false;
	*secs = h * 3600 + m * 60;
	return true;
}

/*
 * gatekeeper_parse_window
 *		Read 'HH:MM-HH:MM' into window, or raise 22023.
 *
 * An empty window (the same time twice) is refused rather than read as
 * "never" or "always": '00:00-24:00' says all day.
 */
void
gatekeeper_parse_window(const char *text, GatekeeperWindow *window)
{
	if (strlen(text) != 11 || text[5] != '-' ||
		!parse_hhmm(text, &window->open, false) ||
		!parse_hhmm(text + 6, &window->close, true))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid send_window \"%s\"", text),
				 errdetail("A sending window is two local times, HH:MM-HH:MM, such as 09:00-20:00 or 21:00-08:00; 24:00 may close it."),
				 errhint("Use 00:00-24:00 for a window open all day.")));
	if (window->open == window->close)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid send_window \"%s\"", text),
				 errdetail("The window opens and closes at the same time."),
				 errhint("Use 00:00-24:00 for a window open all day.")));
}

/*
 * PostgreSQL's own lookup of a zone file (src/timezone/pgtz.c, declared in
 * pgtz.h, which is not among the installed headers): the file name under
 * the time zone database's directory, matched in any case, opened, with
 * its canonical spelling in canonname (TZ_STRLEN_MAX + 1 bytes); -1 when
 * there is no such file.  It is what pg_tzset() itself loads a zone with.
 */
extern int	pg_open_tzfile(const char *name, char *canonname);

/*
 * Zones found valid, by upper-cased name, so that a COPY naming the same
 * zone on every row looks its file up once per backend.  Only zone files
 * enter it, so it holds at most as many zones as the database has.
 */
typedef struct ZoneCacheEntry
{
	char		name[TZ_STRLEN_MAX + 1];	/* upper-cased: the key */
	pg_tz	   *zone;
} ZoneCacheEntry;

static HTAB *zone_cache = NULL;

/*
 * The zone file named name (in any case) as pg_tzset() loads it, or NULL
 * when the database has no such file, or the file is no valid zone.
 */
static pg_tz *
zone_file(const char *name)
{
	char		canonical[TZ_STRLEN_MAX + 1];
	int			fd;
	pg_tz	   *zone;

	fd = pg_open_tzfile(name, canonical);
	if (fd < 0)
		return NULL;
	close(fd);

	/*
	 * pg_tzset() reads a name it cannot load as a file as a POSIX
	 * specification, named in upper case: the zone came from the file only
	 * if it bears the file's name.
	 */
	zone = pg_tzset(name);
	if (zone == NULL || strcmp(pg_get_timezone_name(zone), canonical) != 0)
		return NULL;
	return zone;
}

/*
 * gatekeeper_check_timezone
 *		The time zone named name, or raise 22023 unless PostgreSQL's time
 *		zone database has a zone file of that name (in any case).
 *
 * pg_tzset() also reads POSIX zone specifications ("FOO+3", "<+03>-3",
 * and "Etc/GMT+14" or "Foo/Bar+5" alike), whose offsets have the opposite
 * sign to what most readers expect and which follow no country's rules:
 * whatever its shape, a name counts only if it is a file of the zone
 * database (Etc/GMT+12 and Etc/GMT-14 are; Etc/GMT+14 is not).
 */
pg_tz *
gatekeeper_check_timezone(const char *name, const char *what)
{
	pg_tz	   *zone = NULL;

	if (name[0] != '\0' && strlen(name) < TZ_STRLEN_MAX)
	{
		ZoneCacheEntry *entry;
		char		key[TZ_STRLEN_MAX + 1];
		bool		found;
		int			i;

		if (zone_cache == NULL)
		{
			HASHCTL		info;

			info.keysize = sizeof(key);
			info.entrysize = sizeof(ZoneCacheEntry);
			zone_cache = hash_create("gatekeeper time zones", 64, &info,
									 HASH_ELEM | HASH_STRINGS);
		}
		memset(key, 0, sizeof(key));
		for (i = 0; name[i]; i++)
			key[i] = pg_toupper((unsigned char) name[i]);
		entry = hash_search(zone_cache, key, HASH_FIND, NULL);
		if (entry != NULL)
			zone = entry->zone;
		else
		{
			zone = zone_file(name);
			if (zone != NULL && pg_tz_acceptable(zone))
			{
				entry = hash_search(zone_cache, key, HASH_ENTER, &found);
				entry->zone = zone;
			}
		}
	}
	if (zone == NULL || !pg_tz_acceptable(zone))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid %s \"%s\"", what, name),
				 errdetail("A time zone is an IANA name that PostgreSQL knows, such as Europe/Paris or America/New_York."),
				 errhint("pg_timezone_names lists them.")));
	return zone;
}

/*
 * local_time
 *		t as a local date and time in zone; false when t is out of range.
 */
static bool
local_time(TimestampTz t, pg_tz *zone, struct pg_tm *tm)
{
	int			tz;
	fsec_t		fsec;

	return timestamp2tm(t, &tz, tm, &fsec, NULL, zone) == 0;
}

/*
 * inside
 *		Is the local time of day tm within window?
 */
static bool
inside(const GatekeeperWindow *window, const struct pg_tm *tm)
{
	int			s = tm->tm_hour * 3600 + tm->tm_min * 60 + tm->tm_sec;

	if (window->open < window->close)
		return s >= window->open && s < window->close;
	return s >= window->open || s < window->close;
}

/*
 * gatekeeper_window_next_open
 *		t itself when its local time in zone is inside window; otherwise the
 *		first instant after t at which the window opens.
 *
 * The opening is a local time on a local date; DetermineTimeZoneOffset
 * turns it into an instant by the zone's rules on that date, so the answer
 * moves with daylight saving.  An opening that falls in a spring-forward
 * gap becomes the instant after the gap when that is still inside the
 * window; when it is not (a window that lies wholly in the gap), that day
 * has no opening and the next day's is taken.
 */
TimestampTz
gatekeeper_window_next_open(const GatekeeperWindow *window, pg_tz *zone, TimestampTz t)
{
	struct pg_tm tm;
	int			julian;
	int			day;

	if (TIMESTAMP_NOT_FINITE(t) ||
		(window->open == 0 && window->close == SECS_PER_LOCAL_DAY))
		return t;
	if (!local_time(t, zone, &tm))
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("timestamp out of range")));
	if (inside(window, &tm))
		return t;

	julian = date2j(tm.tm_year, tm.tm_mon, tm.tm_mday);
	for (day = 0; day < MAX_DAYS_AHEAD; day++)
	{
		struct pg_tm open_tm;
		struct pg_tm check;
		TimestampTz opening;
		int			tz;

		memset(&open_tm, 0, sizeof(open_tm));
		j2date(julian + day, &open_tm.tm_year, &open_tm.tm_mon, &open_tm.tm_mday);
		open_tm.tm_hour = window->open / 3600;
		open_tm.tm_min = (window->open % 3600) / 60;
		open_tm.tm_isdst = -1;
		tz = DetermineTimeZoneOffset(&open_tm, zone);
		if (tm2timestamp(&open_tm, 0, &tz, &opening) != 0)
			ereport(ERROR,
					(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
					 errmsg("timestamp out of range")));
		if (opening > t && local_time(opening, zone, &check) &&
			inside(window, &check))
			return opening;
	}
	elog(ERROR, "no opening of sending window found within %d days", MAX_DAYS_AHEAD);
	return t;					/* keep the compiler quiet */
}

PG_FUNCTION_INFO_V1(gatekeeper_window_open);

/*
 * _window_open(send_window text, timezone text, at timestamptz)
 *		RETURNS timestamptz
 *		at when at is inside the window in the zone, else the window's next
 *		opening; at when there is no window.  The claim's computation, for
 *		tests at fixed times: not in the install script, the tests declare
 *		it (sql/window_open.inc).
 */
Datum
gatekeeper_window_open(PG_FUNCTION_ARGS)
{
	GatekeeperWindow window;
	pg_tz	   *zone;
	TimestampTz at;

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("at must not be null")));
	at = PG_GETARG_TIMESTAMPTZ(2);
	zone = gatekeeper_check_timezone(PG_ARGISNULL(1) ? "UTC" :
									 text_to_cstring(PG_GETARG_TEXT_PP(1)),
									 "timezone");
	if (PG_ARGISNULL(0))
		PG_RETURN_TIMESTAMPTZ(at);
	gatekeeper_parse_window(text_to_cstring(PG_GETARG_TEXT_PP(0)), &window);
	PG_RETURN_TIMESTAMPTZ(gatekeeper_window_next_open(&window, zone, at));
}

PG_FUNCTION_INFO_V1(gatekeeper_check_window);

/*
 * gatekeeper._check_window(send_window text, timezone text) RETURNS void
 *		Raise 22023 unless each that is not NULL is valid (create_queue,
 *		alter_queue and enqueue use it).
 */
Datum
gatekeeper_check_window(PG_FUNCTION_ARGS)
{
	GatekeeperWindow window;

	if (!PG_ARGISNULL(0))
		gatekeeper_parse_window(text_to_cstring(PG_GETARG_TEXT_PP(0)), &window);
	if (!PG_ARGISNULL(1))
		(void) gatekeeper_check_timezone(text_to_cstring(PG_GETARG_TEXT_PP(1)),
										 "timezone");
	PG_RETURN_VOID();
}
