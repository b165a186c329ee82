/*-------------------------------------------------------------------------
 *
 * window.h
 *		Sending windows: a queue's local hours for sending, judged in a
 *		time zone (src/window.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_WINDOW_H
#define GATEKEEPER_WINDOW_H

#include "datatype/timestamp.h"
#include "pgtime.h"

/*
 * 'HH:MM-HH:MM' as seconds since local midnight.  open < close is a window
 * within one day; open > close wraps midnight; 0 and 86400 is all day.
 */
typedef struct GatekeeperWindow
{
	int			open;
	int			close;
} GatekeeperWindow;

/* parse a window, or raise 22023 */
extern void gatekeeper_parse_window(const char *text, GatekeeperWindow *window);

/* an IANA time zone name known to PostgreSQL, or raise 22023 */
extern pg_tz *gatekeeper_check_timezone(const char *name, const char *what);

/* t when t is inside the window in zone, else the window's next opening */
extern TimestampTz gatekeeper_window_next_open(const GatekeeperWindow *window,
											   pg_tz *zone, TimestampTz t);

#endif							/* GATEKEEPER_WINDOW_H */
