/*-------------------------------------------------------------------------
 *
 * keep_freed.h
 *		A process that claims or records mail keeps the memory it frees.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_KEEP_FREED_H
#define GATEKEEPER_KEEP_FREED_H

extern void gatekeeper_keep_freed_memory(void);

#endif
