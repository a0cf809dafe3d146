/* The built-in host's queues in C (hostq.c), so that the nginx thread does
 * not enter Go on the hot path: a submit queue (qrpc_submit_async pushes,
 * the Go submitter takes), a completion queue (Go pushes, qrpc_vm_poll pops)
 * and a list of released result blocks (qrpc_release pushes the big ones,
 * Go takes them back into its buffer cache). */
#ifndef QRPC_HOSTQ_H
#define QRPC_HOSTQ_H

#include "qrpc.h"

/* One queued command; its strings follow it in the same allocation. */
typedef struct qrpc_qitem {
    struct qrpc_qitem *next;
    qrpc_cmd_t cmd;
} qrpc_qitem_t;

#include <stdint.h>

/* Classes of small result blocks kept for reuse: 64 B << c, c < 8. */
#define QRPC_SMALL_CLASSES 8

/* One Lua VM's completion queue, a ring (see qrpc_vm_open). */
typedef struct {
    qrpc_completion_t *buf;
    uint64_t cap, head, len, logs;
} qrpc_cq_t;

/* The queues' state (hostq.c), read and written by Go too (queue.go)
 * under lock, a spinlock taken with atomics on both sides. */
typedef struct {
    uint32_t lock;
    int32_t fd;       /* the submitter's eventfd; -1: closed */
    int32_t sleeping; /* the submitter found the queue empty */
    /* The trimmer stopped with nothing kept (queue.go, trimmer):
     * qrpc_release_n then frees what it is given instead of keeping it. */
    uint8_t trim_asleep, pad_[3];
    qrpc_qitem_t *sq_head, *sq_tail; /* submit queue */
    uint64_t sq_len;
    qrpc_cq_t cq[QRPC_MAX_VMS]; /* a completion queue per Lua VM */
    uint64_t vms;                /* bit i: VM i is open (VM 0 always is) */
    void *rel_head;          /* big blocks released for Go's buffer cache */
    qrpc_qitem_t *done_head; /* commands Go has run, for C to free */
    void *small[QRPC_SMALL_CLASSES]; /* free small blocks, by class */
    uint32_t small_n[QRPC_SMALL_CLASSES];
    uint64_t small_used; /* small blocks handed out since the trimmer looked */
    uint64_t rings;      /* eventfd writes by qrpc_submit_async, for tests */
} qrpc_hostq_t;

extern qrpc_hostq_t qrpc_hostq;

/* The class whose blocks hold n bytes, or -1 when n is above the last;
 * and a new block of class c (malloc), when its list is empty. */
int qrpc_small_class(size_t n);
void *qrpc_small_alloc_slow(int c);

/* How many blocks qrpc_small_alloc_slow made, for tests. */
uint64_t qrpc_small_allocs(void);

/* Frees the commands Go has run (Go queues them on done_head: freeing
 * from Go would be a cgo call). The nginx thread calls it on its own
 * calls; Go calls it when the host stops. */
void qrpc_done_free(void);

/* Frees the kept small blocks (the submitter's timer, when idle). */
void qrpc_small_trim(void);

/* Gives the C heap's free pages back to the kernel (glibc's malloc_trim;
 * nothing where the C library has none). The trimmer calls it as it
 * stops, once every cache has been freed. Returns 1 when it trimmed. */
int qrpc_heap_trim(void);

/* Opens the queues with the eventfd that wakes the submitter, or closes
 * them (fd < 0): pushes then fail with QRPC_ERR_CLOSED. After it returns
 * the old fd is no longer written to. */
void qrpc_hostq_set_fd(int fd);

/* Frees a queued command once run: big blocks are kept for the next big
 * command (see hostq.c). */
void qrpc_submitq_free(qrpc_qitem_t *it);

/* Frees the kept command blocks that were not needed since the last call
 * (all of them with all != 0); the submitter's timer calls it. */
void qrpc_submitq_trim(int all);

/* Command blocks kept, for tests. */
size_t qrpc_submitq_cached(void);

/* Queues a completion. Returns 1 when the queue was empty (the dispatcher
 * needs a wake byte), 0 when not, -1 when closed, -2 when it cannot take
 * it (no memory; for a log line, max_logs reached). *released receives the
 * list of released blocks (linked through their first word), or NULL. */
int qrpc_cq_push(int vm, const qrpc_completion_t *c, int max_logs, void **released);

/* Completions waiting in VM vm's queue (all VMs' with vm < 0), and the log
 * lines among them. */
size_t qrpc_cq_len(int vm);
size_t qrpc_cq_logs(int vm);

/* Marks VM vm open: qrpc_submit_async then takes its commands. */
void qrpc_vm_mark_open(int vm);

/* Takes the released blocks list (see qrpc_cq_push). */
void *qrpc_released_take(void);

#endif
