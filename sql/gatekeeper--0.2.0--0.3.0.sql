/* gatekeeper 0.2.0 -> 0.3.0 (ALTER EXTENSION gatekeeper UPDATE TO '0.3.0') */
\echo Use "ALTER EXTENSION gatekeeper UPDATE TO '0.3.0'" to load this file. \quit

/*
 * Every change here is also in gatekeeper--0.3.0.sql; t/031_upgrade.pl
 * checks that a 0.2.0 updated to 0.3.0, a 0.1.0 updated through 0.2.0 and
 * a fresh 0.3.0 have the same objects.  Each issue's changes are a section
 * of their own, in the order they landed.
 */
