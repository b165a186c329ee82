/* gatekeeper 0.1.0 -> 0.2.0 (ALTER EXTENSION gatekeeper UPDATE TO '0.2.0') */
\echo Use "ALTER EXTENSION gatekeeper UPDATE TO '0.2.0'" to load this file. \quit

/*
 * Every change here is also in gatekeeper--0.2.0.sql; t/030_upgrade.pl
 * checks that an updated 0.1.0 and a fresh 0.2.0 have the same objects.
 */
