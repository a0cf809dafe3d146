/* The Go side's view of queues.c (the Lua side's is in qrpc.h). */
#ifndef QRPC_QUEUES_H
#define QRPC_QUEUES_H

#include <stddef.h>
#include "qrpc.h"

/* Internal to the library: not part of the ABI in qrpc.h. */
#define QRPC_HIDDEN __attribute__((visibility("hidden")))

/* Opens the submit ring, empty; returns the eventfd the consumer blocks on
 * (the caller owns and closes it) or -errno. */
QRPC_HIDDEN int qrpc_sq_open(void);
/* Refuses further submits (QRPC_ERR_CLOSED). */
QRPC_HIDDEN void qrpc_sq_close(void);
/* Copies up to max queued commands into out without consuming them. */
QRPC_HIDDEN int qrpc_sq_take(qrpc_cmd_t *out, int max);
/* Consumes n commands: their Lua strings may go. */
QRPC_HIDDEN void qrpc_sq_release(int n);
/* Announces that the consumer is going to block on the eventfd; 0 when
 * a command arrived meanwhile (do not block). */
QRPC_HIDDEN int qrpc_sq_sleep(void);

/* Queues a completion (copied); 1 when the queue was empty, 0 when not,
 * -1 when out of memory (c->data stays the caller's). */
QRPC_HIDDEN int qrpc_cq_push(const qrpc_completion_t *c);
QRPC_HIDDEN void qrpc_cq_counts(size_t *len, size_t *logs);
/* Frees every queued completion and its data. */
QRPC_HIDDEN void qrpc_cq_clear(void);

#endif
