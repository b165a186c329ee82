/*-------------------------------------------------------------------------
 *
 * keep_freed.c
 *		A process that claims or records mail keeps the memory it frees
 *		for its next round, instead of giving it back to the kernel.
 *
 * A claim, an ack, a batch of gate passes and a worker's round each
 * allocate about the same memory every time and free it at the end: the
 * claimed mails' content, the result's tuplestore, the statement's and
 * SPI's memory contexts (some MB for a claim of 1,000 mails of 1 kB).
 * glibc's malloc gives the top of its heap back to the kernel once 128 kB
 * of it are free (M_TRIM_THRESHOLD), and serves a request of 128 kB or
 * more with a mapping of its own (M_MMAP_THRESHOLD), unmapped when freed.
 * So every round shrank the heap (brk) or unmapped, which flushes the TLB
 * of every CPU the process has run on, and then took a page fault for
 * each 4 kB page it touched again, each page zeroed by the kernel: some
 * 750 faults a round of claim(1000) + ack_batch (t/109).  In a one-claimer
 * drain at batch 100 the brk calls were 8% of the backend's time and the
 * faults of forming claim()'s result rows another 7% (perf), most of it
 * trapping to the hypervisor of a virtual machine.
 *
 * So the first claim, ack, nack or gate pass of a process (the moves
 * themselves call it: claim.c, mail_state.c, mail_nack.c, gate.c, so the
 * SQL functions and the worker alike) raises both thresholds: up to
 * KEEP_TOP_BYTES free at the top of the heap stay mapped for the next
 * round, and requests below MMAP_FROM_BYTES come from the heap.  The
 * process then keeps what its largest round used, plus at most
 * KEEP_TOP_BYTES.  Other backends (a session that only enqueues, any
 * other application's) are left as glibc sets them.  Without glibc,
 * nothing changes.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "keep_freed.h"

/* the most of a freed heap top kept mapped */
#define KEEP_TOP_BYTES		(64 * 1024 * 1024)
/* requests this large or larger get a mapping of their own (glibc's cap) */
#define MMAP_FROM_BYTES		(32 * 1024 * 1024)
/* what each growth of the heap adds beyond the request */
#define GROW_PAD_BYTES		(1024 * 1024)

static bool keeping = false;

/*
 * gatekeeper_keep_freed_memory
 *		From now on this process keeps the memory it frees (once per
 *		process; cheap to call again).
 */
void
gatekeeper_keep_freed_memory(void)
{
	if (keeping)
		return;
	keeping = true;
#ifdef __GLIBC__
	/* each fails only for a value out of glibc's range, which these are not */
	(void) mallopt(M_MMAP_THRESHOLD, MMAP_FROM_BYTES);
	(void) mallopt(M_TRIM_THRESHOLD, KEEP_TOP_BYTES);
	(void) mallopt(M_TOP_PAD, GROW_PAD_BYTES);
#endif
}
