/*
 * The built-in host's two queues, in plain C so that the nginx thread's hot
 * path never enters the Go runtime.
 *
 * Why: every call from C into Go makes the calling thread take one of Go's
 * Ps, and after the call returns the thread keeps it, parked "in a
 * syscall", until Go's sysmon takes it back. While the nginx thread holds a
 * P, the goroutines it readied wait for sysmon (GOMAXPROCS=1) or wake
 * another thread at every call (GOMAXPROCS>=2), and sysmon polls every
 * 20 us. With these queues the nginx thread only touches memory, plus one
 * eventfd write when Go's consumer sleeps.
 *
 * Submit ring: single producer (the nginx thread), single consumer (one
 * goroutine). The ring holds copies of qrpc_cmd_t; the strings they point
 * to belong to Lua, which keeps them alive until qrpc_sq_consumed() has
 * passed their sequence number.
 *
 * Completion queue: many producers (Go's goroutines), one consumer (the
 * nginx thread), a mutex-protected list: pushes are short and rare compared
 * with the work behind each one.
 */

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "qrpc.h"
#include "queues.h"

/* ---- submit ring ---- */

static qrpc_cmd_t sq[QRPC_SQ_CAP];
static _Atomic uint64_t sq_head;  /* next entry the consumer takes */
static _Atomic uint64_t sq_tail;  /* next entry the producer fills */
static _Atomic int sq_sleeping;   /* the consumer is (about to be) blocked on sq_efd */
static _Atomic int sq_efd = -1;
static _Atomic int sq_open;

int qrpc_sq_open(void)
{
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) {
        return -errno;
    }
    atomic_store(&sq_head, 0);
    atomic_store(&sq_tail, 0);
    atomic_store(&sq_sleeping, 0);
    atomic_store(&sq_efd, fd);
    atomic_store(&sq_open, 1);
    return fd;
}

void qrpc_sq_close(void)
{
    atomic_store(&sq_open, 0);
    atomic_store(&sq_efd, -1);
}

int qrpc_sq_submit(const qrpc_cmd_t *cmd)
{
    uint64_t t, h;
    int fd;

    if (cmd == NULL) {
        return QRPC_ERR_BADARG;
    }
    if (!atomic_load(&sq_open)) {
        return QRPC_ERR_CLOSED;
    }
    t = atomic_load_explicit(&sq_tail, memory_order_relaxed);
    h = atomic_load_explicit(&sq_head, memory_order_acquire);
    if (t - h >= QRPC_SQ_CAP) {
        return QRPC_ERR_FULL;
    }
    sq[t & (QRPC_SQ_CAP - 1)] = *cmd;
    /* seq_cst store then seq_cst load of sq_sleeping, against the
     * consumer's store of sq_sleeping then load of sq_tail: one of the two
     * sides sees the other, so no wake-up is lost. */
    atomic_store(&sq_tail, t + 1);
    if (atomic_load(&sq_sleeping) && atomic_exchange(&sq_sleeping, 0)) {
        fd = atomic_load(&sq_efd);
        if (fd >= 0) {
            uint64_t one = 1;
            ssize_t rc;
            do {
                rc = write(fd, &one, sizeof one);
            } while (rc < 0 && errno == EINTR);
            /* EAGAIN: the counter is full, so the consumer is awake anyway */
        }
    }
    return QRPC_PENDING;
}

double qrpc_sq_consumed(void)
{
    return (double) atomic_load_explicit(&sq_head, memory_order_acquire);
}

double qrpc_sq_submitted(void)
{
    return (double) atomic_load_explicit(&sq_tail, memory_order_relaxed);
}

int qrpc_sq_take(qrpc_cmd_t *out, int max)
{
    uint64_t h = atomic_load_explicit(&sq_head, memory_order_relaxed);
    uint64_t t = atomic_load_explicit(&sq_tail, memory_order_acquire);
    int n = 0;

    while (h + n < t && n < max) {
        out[n] = sq[(h + n) & (QRPC_SQ_CAP - 1)];
        n++;
    }
    return n;
}

void qrpc_sq_release(int n)
{
    atomic_fetch_add_explicit(&sq_head, (uint64_t) n, memory_order_release);
}

int qrpc_sq_sleep(void)
{
    atomic_store(&sq_sleeping, 1);
    if (atomic_load(&sq_tail) != atomic_load(&sq_head)) {
        atomic_store(&sq_sleeping, 0);
        return 0;
    }
    return 1;
}

/* ---- completion queue ---- */

typedef struct cq_node {
    qrpc_completion_t c;
    struct cq_node *next;
} cq_node;

static pthread_mutex_t cq_mu = PTHREAD_MUTEX_INITIALIZER;
static cq_node *cq_head, *cq_tail;
static size_t cq_len, cq_logs;

int qrpc_cq_push(const qrpc_completion_t *c)
{
    cq_node *n = malloc(sizeof *n);
    int was_empty;

    if (n == NULL) {
        return -1;
    }
    n->c = *c;
    n->next = NULL;
    pthread_mutex_lock(&cq_mu);
    was_empty = cq_head == NULL;
    if (cq_tail != NULL) {
        cq_tail->next = n;
    } else {
        cq_head = n;
    }
    cq_tail = n;
    cq_len++;
    if (c->status == QRPC_LOG) {
        cq_logs++;
    }
    pthread_mutex_unlock(&cq_mu);
    return was_empty;
}

int qrpc_drain(qrpc_completion_t *out, int max)
{
    int n = 0;

    if (out == NULL || max <= 0) {
        return 0;
    }
    pthread_mutex_lock(&cq_mu);
    while (cq_head != NULL && n < max) {
        cq_node *p = cq_head;
        out[n++] = p->c;
        if (p->c.status == QRPC_LOG) {
            cq_logs--;
        }
        cq_head = p->next;
        free(p);
    }
    if (cq_head == NULL) {
        cq_tail = NULL;
    }
    cq_len -= n;
    pthread_mutex_unlock(&cq_mu);
    return n;
}

void qrpc_cq_counts(size_t *len, size_t *logs)
{
    pthread_mutex_lock(&cq_mu);
    *len = cq_len;
    *logs = cq_logs;
    pthread_mutex_unlock(&cq_mu);
}

void qrpc_cq_clear(void)
{
    cq_node *p;

    pthread_mutex_lock(&cq_mu);
    p = cq_head;
    cq_head = cq_tail = NULL;
    cq_len = cq_logs = 0;
    pthread_mutex_unlock(&cq_mu);
    while (p != NULL) {
        cq_node *next = p->next;
        free(p->c.data);
        free(p);
        p = next;
    }
}
