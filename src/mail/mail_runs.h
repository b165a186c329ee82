/*-------------------------------------------------------------------------
 *
 * mail_runs.h
 *		Runs (mail_run) moved into mail_live, a row per mail, before a
 *		change to one of their mails (src/mail/mail_runs.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_MAIL_RUNS_H
#define GATEKEEPER_MAIL_RUNS_H

extern void mail_runs_to_live(const Datum *ids, int n);
extern void mail_runs_to_live_of(Datum queue, int segment);

#endif							/* GATEKEEPER_MAIL_RUNS_H */
