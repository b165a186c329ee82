/*-------------------------------------------------------------------------
 *
 * mail_exec.h
 *		The one executor helper of the mail's direct writers
 *		(src/mail/mail_exec.c): a relation's result info and indexes,
 *		a tuple inserted, updated or deleted with its index entries.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_MAIL_EXEC_H
#define GATEKEEPER_MAIL_EXEC_H

#include "access/heapam.h"
#include "access/tableam.h"
#include "executor/tuptable.h"
#include "nodes/execnodes.h"
#include "utils/relcache.h"

/*
 * A mail table written past the executor: the relation (opened, locked
 * and closed by the caller, who checked the direct path may write it),
 * its result relation info with its indexes open, and the executor state
 * its index entries and constraints are evaluated in (its own, or one
 * several relations share).
 */
typedef struct MailExec
{
	Relation	rel;
	ResultRelInfo *rri;
	EState	   *estate;
	CommandId	cid;
	bool		own_estate;
	struct MailExecHeld *held;	/* hash index entries held back, or NULL */
} MailExec;

extern EState *mail_exec_estate(CommandId cid);
extern void mail_exec_open(MailExec *x, Relation rel, CommandId cid);
extern void mail_exec_open_in(MailExec *x, Relation rel, EState *estate);
extern void mail_exec_close(MailExec *x);
extern void mail_exec_check(MailExec *x, TupleTableSlot *slot);
extern void mail_exec_insert(MailExec *x, TupleTableSlot *slot);
extern void mail_exec_insert_heap(MailExec *x, TupleTableSlot **slots, int n,
								  BulkInsertState bistate);
extern void mail_exec_index(MailExec *x, TupleTableSlot *slot, bool update);
extern void mail_exec_hold_hash(MailExec *x, Size limit);
extern void mail_exec_index_held(MailExec *x);
extern void mail_exec_new_version(TupleTableSlot *from, TupleTableSlot *to);
extern TM_Result mail_exec_update(MailExec *x, ItemPointer tid, TupleTableSlot *slot,
								  Snapshot snapshot, bool wait, TM_FailureData *tmfd);
extern TM_Result mail_exec_delete(Relation rel, ItemPointer tid, CommandId cid,
								  Snapshot snapshot, bool wait, TM_FailureData *tmfd);

#endif							/* GATEKEEPER_MAIL_EXEC_H */
