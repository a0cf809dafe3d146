// The built-in host's queues (hostq.h): plain C on purpose. The nginx
// thread calls qrpc_submit_async, qrpc_poll and qrpc_release and must not
// enter Go there: a thread that has called into Go keeps a Go scheduler
// slot (a P) while it runs nginx, and the goroutines it readies then wait
// for a spinning thread or sysmon to take them (issue 13).
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qrpc.h"
#include "hostq.h"

// Bounds the commands waiting for the submitter (memory stays bounded if
// it stalls); far above what one worker queues between two of its runs.
#define QRPC_SUBMITQ_MAX 65536

// Blocks smaller than this are freed at once by qrpc_release; bigger ones
// go back to Go's buffer cache (internal/bufcache.MinBlock).
#define QRPC_CACHE_MIN (16 << 10)

static pthread_mutex_t q_mu = PTHREAD_MUTEX_INITIALIZER;

// Submit queue, under q_mu.
static qrpc_qitem_t *sq_head, *sq_tail;
static size_t sq_len;
static int q_fd = -1;  // the submitter's eventfd; -1: closed
static int sq_sleeping; // the submitter found the queue empty

// Completion queue: a ring, under q_mu.
static qrpc_completion_t *cq_buf;
static size_t cq_cap, cq_head, cq_len, cq_logs;

// Released blocks, under q_mu.
static void *rel_head;

// Freed submit blocks of QRPC_CACHE_MIN bytes and more, kept for the next
// big command, under q_mu. Why: freeing a block that big lets glibc give
// the top of its heap back to the kernel, and the next malloc faults the
// pages in again: 100 KB bodies cost 6-7 page faults a call without this
// (internal/bufcache explains the same for result blocks, which Go keeps).
#define SQ_CACHE_BLOCKS 32
#define SQ_CACHE_BYTES (8 << 20)
static struct { void *p; size_t n; } sq_cache[SQ_CACHE_BLOCKS];
static size_t sq_cached, sq_cache_bytes;
static size_t sq_cache_low; // fewest blocks kept since the last trim: not needed

static size_t field_len(const char *p, size_t n) { return p != NULL ? n : 0; }

// Copies n bytes of src to *dst and returns the copy (NULL when src is).
static const char *copy_field(char **dst, const char *src, size_t n) {
    if (src == NULL) {
        return NULL;
    }
    char *p = *dst;
    if (n > 0) {
        memcpy(p, src, n);
    }
    *dst += n;
    return p;
}

// A block for a command of n bytes: a kept one that fits (and is at most
// twice as big), else malloc's.
static void *item_alloc(size_t n) {
    if (n >= QRPC_CACHE_MIN) {
        pthread_mutex_lock(&q_mu);
        for (size_t i = sq_cached; i-- > 0;) {
            if (sq_cache[i].n >= n && sq_cache[i].n / 2 <= n) {
                void *p = sq_cache[i].p;
                sq_cache_bytes -= sq_cache[i].n;
                sq_cache[i] = sq_cache[--sq_cached];
                if (sq_cached < sq_cache_low) {
                    sq_cache_low = sq_cached;
                }
                pthread_mutex_unlock(&q_mu);
                return p;
            }
        }
        pthread_mutex_unlock(&q_mu);
    }
    return malloc(n);
}

void qrpc_submitq_free(qrpc_qitem_t *it) {
    if (it == NULL) {
        return;
    }
    size_t u = malloc_usable_size(it);
    if (u >= QRPC_CACHE_MIN) {
        pthread_mutex_lock(&q_mu);
        if (sq_cached < SQ_CACHE_BLOCKS && sq_cache_bytes + u <= SQ_CACHE_BYTES) {
            sq_cache[sq_cached].p = it;
            sq_cache[sq_cached].n = u;
            sq_cached++;
            sq_cache_bytes += u;
            pthread_mutex_unlock(&q_mu);
            return;
        }
        pthread_mutex_unlock(&q_mu);
    }
    free(it);
}

void qrpc_submitq_trim(int all) {
    void *drop[SQ_CACHE_BLOCKS];
    size_t nd = 0;
    pthread_mutex_lock(&q_mu);
    size_t k = all ? sq_cached : sq_cache_low;
    while (k-- > 0 && sq_cached > 0) {
        sq_cached--;
        drop[nd++] = sq_cache[sq_cached].p;
        sq_cache_bytes -= sq_cache[sq_cached].n;
    }
    sq_cache_low = sq_cached;
    pthread_mutex_unlock(&q_mu);
    for (size_t i = 0; i < nd; i++) {
        free(drop[i]);
    }
}

size_t qrpc_submitq_cached(void) {
    pthread_mutex_lock(&q_mu);
    size_t n = sq_cached;
    pthread_mutex_unlock(&q_mu);
    return n;
}

int qrpc_submit_async(const qrpc_cmd_t *cmd) {
    if (cmd == NULL || (cmd->op != QRPC_OP_UNARY && cmd->op != QRPC_OP_CANCEL)) {
        return QRPC_ERR_BADARG;
    }
    size_t method = field_len(cmd->method, cmd->method_len);
    size_t body = field_len(cmd->body, cmd->body_len);
    size_t hdrs = field_len(cmd->hdrs, cmd->hdrs_len);
    size_t hash_key = field_len(cmd->hash_key, cmd->hash_key_len);
    size_t req_type = field_len(cmd->req_type, cmd->req_type_len);
    size_t resp_type = field_len(cmd->resp_type, cmd->resp_type_len);
    size_t extra = 0;
    const size_t parts[] = {method, body, hdrs, hash_key, req_type, resp_type};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (parts[i] > SIZE_MAX - sizeof(qrpc_qitem_t) - extra) {
            return QRPC_ERR_TOOBIG;
        }
        extra += parts[i];
    }
    qrpc_qitem_t *it = item_alloc(sizeof(qrpc_qitem_t) + extra);
    if (it == NULL) {
        return QRPC_ERR_FULL;
    }
    it->next = NULL;
    it->cmd = *cmd;
    char *p = (char *)(it + 1);
    it->cmd.method = copy_field(&p, cmd->method, method);
    it->cmd.body = copy_field(&p, cmd->body, body);
    it->cmd.hdrs = copy_field(&p, cmd->hdrs, hdrs);
    it->cmd.hash_key = copy_field(&p, cmd->hash_key, hash_key);
    it->cmd.req_type = copy_field(&p, cmd->req_type, req_type);
    it->cmd.resp_type = copy_field(&p, cmd->resp_type, resp_type);
    // UNARY and CANCEL read none of the others: not copied, so not kept.
    it->cmd.addr = NULL; it->cmd.addr_len = 0;
    it->cmd.server_name = NULL; it->cmd.server_name_len = 0;
    it->cmd.ca = NULL; it->cmd.ca_len = 0;
    it->cmd.cert = NULL; it->cmd.cert_len = 0;
    it->cmd.key = NULL; it->cmd.key_len = 0;
    it->cmd.pins = NULL; it->cmd.pins_len = 0;
    it->cmd.opts = NULL; it->cmd.opts_len = 0;

    pthread_mutex_lock(&q_mu);
    if (q_fd < 0 || sq_len >= QRPC_SUBMITQ_MAX) {
        int rc = q_fd < 0 ? QRPC_ERR_CLOSED : QRPC_ERR_FULL;
        pthread_mutex_unlock(&q_mu);
        qrpc_submitq_free(it);
        return rc;
    }
    if (sq_tail != NULL) {
        sq_tail->next = it;
    } else {
        sq_head = it;
    }
    sq_tail = it;
    sq_len++;
    if (sq_sleeping) {
        // Under the lock: qrpc_hostq_set_fd(-1) cannot close the fd meanwhile.
        sq_sleeping = 0;
        uint64_t one = 1;
        ssize_t n;
        do {
            n = write(q_fd, &one, sizeof one);
        } while (n < 0 && errno == EINTR);
        // EAGAIN: the counter is full, so the submitter wakes anyway.
    }
    pthread_mutex_unlock(&q_mu);
    return cmd->op == QRPC_OP_UNARY ? QRPC_PENDING : QRPC_OK;
}

void qrpc_hostq_set_fd(int fd) {
    pthread_mutex_lock(&q_mu);
    q_fd = fd;
    sq_sleeping = 0;
    pthread_mutex_unlock(&q_mu);
}

qrpc_qitem_t *qrpc_submitq_take(void) {
    pthread_mutex_lock(&q_mu);
    qrpc_qitem_t *it = sq_head;
    sq_head = sq_tail = NULL;
    sq_len = 0;
    // Set under the lock that pushes take: a push after this one sees it
    // and writes the eventfd, so no wake-up is lost.
    sq_sleeping = it == NULL;
    pthread_mutex_unlock(&q_mu);
    return it;
}

// Grows the ring to hold one more; 0 on failure. Under q_mu.
static int cq_grow(void) {
    size_t ncap = cq_cap ? 2 * cq_cap : 256;
    qrpc_completion_t *nb = malloc(ncap * sizeof *nb);
    if (nb == NULL) {
        return 0;
    }
    for (size_t i = 0; i < cq_len; i++) {
        nb[i] = cq_buf[(cq_head + i) % cq_cap];
    }
    free(cq_buf);
    cq_buf = nb;
    cq_cap = ncap;
    cq_head = 0;
    return 1;
}

int qrpc_cq_push(const qrpc_completion_t *c, int max_logs, void **released) {
    pthread_mutex_lock(&q_mu);
    if (released != NULL) {
        *released = rel_head;
        rel_head = NULL;
    }
    if (q_fd < 0) {
        pthread_mutex_unlock(&q_mu);
        return -1;
    }
    int is_log = c->status == QRPC_LOG;
    if ((is_log && cq_logs >= (size_t)max_logs) || (cq_len == cq_cap && !cq_grow())) {
        pthread_mutex_unlock(&q_mu);
        return -2;
    }
    cq_buf[(cq_head + cq_len) % cq_cap] = *c;
    cq_len++;
    cq_logs += is_log;
    int was_empty = cq_len == 1;
    pthread_mutex_unlock(&q_mu);
    return was_empty;
}

int qrpc_poll(qrpc_completion_t *out, int max) {
    if (out == NULL || max <= 0) {
        return 0;
    }
    pthread_mutex_lock(&q_mu);
    size_t n = cq_len < (size_t)max ? cq_len : (size_t)max;
    for (size_t i = 0; i < n; i++) {
        out[i] = cq_buf[cq_head];
        cq_logs -= out[i].status == QRPC_LOG;
        cq_head = (cq_head + 1) % cq_cap;
    }
    cq_len -= n;
    if (cq_len == 0) {
        cq_head = 0;
        if (cq_cap > 4096) {
            // A burst's ring need not stay.
            free(cq_buf);
            cq_buf = NULL;
            cq_cap = 0;
        }
    }
    pthread_mutex_unlock(&q_mu);
    return (int)n;
}

size_t qrpc_cq_len(void) {
    pthread_mutex_lock(&q_mu);
    size_t n = cq_len;
    pthread_mutex_unlock(&q_mu);
    return n;
}

size_t qrpc_cq_logs(void) {
    pthread_mutex_lock(&q_mu);
    size_t n = cq_logs;
    pthread_mutex_unlock(&q_mu);
    return n;
}

void qrpc_release(void *p) {
    if (p == NULL) {
        return;
    }
    if (malloc_usable_size(p) < QRPC_CACHE_MIN) {
        free(p);
        return;
    }
    pthread_mutex_lock(&q_mu);
    *(void **)p = rel_head;
    rel_head = p;
    pthread_mutex_unlock(&q_mu);
}

void *qrpc_released_take(void) {
    pthread_mutex_lock(&q_mu);
    void *p = rel_head;
    rel_head = NULL;
    pthread_mutex_unlock(&q_mu);
    return p;
}
