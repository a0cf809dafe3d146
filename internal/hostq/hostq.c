// The built-in host's queues (hostq.h): plain C on purpose. The nginx
// thread calls qrpc_submit_async, qrpc_vm_poll and qrpc_release_n and must not
// enter Go there: a thread that has called into Go keeps a Go scheduler
// slot (a P) while it runs nginx, and the goroutines it readies then wait
// for a spinning thread or sysmon to take them.
#include <errno.h>
#include <malloc.h>
#include <sched.h>
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

// All the queues' state is one struct under one spinlock, shared with Go:
// the submitter and the completion pushes in hostq.go take the lock with
// atomics and read the fields directly, without a cgo call. Why: a cgo
// call (or a system call through Go's syscall package) after Go's runtime
// was idle wakes its sysmon thread, which then polls every 20 us for at
// least a millisecond; a worker went idle and busy again several times
// per call, and those wake-ups were a third or more of its CPU (README,
// Tuning). The lock is held for a few loads and stores only.
qrpc_hostq_t qrpc_hostq = {.fd = -1, .vms = 1};

#define hq qrpc_hostq

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __asm__ __volatile__("pause");
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void q_lock(void) {
    unsigned spins = 0;
    while (__atomic_exchange_n(&hq.lock, 1, __ATOMIC_ACQUIRE)) {
        while (__atomic_load_n(&hq.lock, __ATOMIC_RELAXED)) {
            // The holder may be a Go thread the kernel has preempted.
            if (++spins < 64) {
                cpu_relax();
            } else {
                sched_yield();
            }
        }
    }
}

static void q_unlock(void) { __atomic_store_n(&hq.lock, 0, __ATOMIC_RELEASE); }

// Small blocks kept for the next results and commands (see
// qrpc_small_class): class c holds blocks of at least 64 << c bytes, at
// most SMALL_MAX of them (about 4 MiB in all). Why that many: a worker
// with 100 calls of 4 KB in flight holds 200 blocks of the 8 KiB class
// (its commands and their results); with 64 kept, the rest went to
// malloc and free, and glibc, finding its heap top free, gave it back to
// the kernel (brk, a TLB shootdown on the other CPU) to fault it in again
// on the next call: the queued 4 KB echo cost 3 times the 512 B one.
#define SMALL_MAX 256

// Keeps a free block of usable size u in the largest class it holds;
// 0 when it is too small or its class is full (the caller frees it).
// Under the lock.
static int small_put_locked(void *p, size_t u) {
    int c = QRPC_SMALL_CLASSES - 1;
    while (c >= 0 && u < ((size_t)64 << c)) {
        c--;
    }
    if (c < 0 || hq.small_n[c] >= SMALL_MAX) {
        return 0;
    }
    *(void **)p = hq.small[c];
    hq.small[c] = p;
    hq.small_n[c]++;
    return 1;
}

// Frees a chain of blocks linked through their first word (outside the
// lock: what the lists could not keep).
static void free_chain(void *p) {
    while (p != NULL) {
        void *next = *(void **)p;
        free(p);
        p = next;
    }
}

// A block of class c from its list, else a new one.
static void *small_get(int c) {
    q_lock();
    void *p = hq.small[c];
    if (p != NULL) {
        hq.small[c] = *(void **)p;
        hq.small_n[c]--;
        hq.small_used++;
    }
    q_unlock();
    return p != NULL ? p : qrpc_small_alloc_slow(c);
}

int qrpc_small_class(size_t n) {
    for (int c = 0; c < QRPC_SMALL_CLASSES; c++) {
        if (n <= ((size_t)64 << c)) {
            return c;
        }
    }
    return -1;
}

static uint64_t small_news; // blocks malloc'd for a class, for tests

void *qrpc_small_alloc_slow(int c) {
    q_lock();
    hq.small_used++; // busy: the lists are too short, not idle
    small_news++;
    q_unlock();
    return malloc((size_t)64 << c);
}

uint64_t qrpc_small_allocs(void) {
    q_lock();
    uint64_t n = small_news;
    q_unlock();
    return n;
}

// Freed submit blocks of QRPC_CACHE_MIN bytes and more, kept for the next
// big command, under the lock. Why: freeing a block that big lets glibc give
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

// Commands smaller than this are malloc'd and freed: glibc's per-thread
// cache serves blocks up to 1 KiB faster than the lists' lock, and never
// gives them back to the kernel.
#define ITEM_SMALL_MIN 1024

// A block for a command of n bytes: a small block of its class, or a
// kept big one that fits (and is at most twice as big), else malloc's.
static void *item_alloc(size_t n) {
    int c = n > ITEM_SMALL_MIN ? qrpc_small_class(n) : -1;
    if (c >= 0) {
        return small_get(c);
    }
    if (n >= QRPC_CACHE_MIN) {
        q_lock();
        for (size_t i = sq_cached; i-- > 0;) {
            if (sq_cache[i].n >= n && sq_cache[i].n / 2 <= n) {
                void *p = sq_cache[i].p;
                sq_cache_bytes -= sq_cache[i].n;
                sq_cache[i] = sq_cache[--sq_cached];
                if (sq_cached < sq_cache_low) {
                    sq_cache_low = sq_cached;
                }
                q_unlock();
                return p;
            }
        }
        q_unlock();
    }
    return malloc(n);
}

// Keeps a run command's block for the next command (big ones) or the next
// small block of its class; 0 when it is to be freed. Under the lock.
// While the trimmer sleeps nothing is kept (see qrpc_release_n): the
// commands that do not start it (shared-pool steps) would leave their
// blocks, up to the cache's 8 MB, for as long as the worker stays idle.
static int item_keep_locked(qrpc_qitem_t *it) {
    if (hq.trim_asleep) {
        return 0;
    }
    size_t u = malloc_usable_size(it);
    if (u >= QRPC_CACHE_MIN) {
        if (sq_cached < SQ_CACHE_BLOCKS && sq_cache_bytes + u <= SQ_CACHE_BYTES) {
            sq_cache[sq_cached].p = it;
            sq_cache[sq_cached].n = u;
            sq_cached++;
            sq_cache_bytes += u;
            return 1;
        }
        return 0;
    }
    return u > ITEM_SMALL_MIN && small_put_locked(it, u);
}

void qrpc_submitq_free(qrpc_qitem_t *it) {
    if (it == NULL) {
        return;
    }
    q_lock();
    int kept = item_keep_locked(it);
    q_unlock();
    if (!kept) {
        free(it);
    }
}

void qrpc_done_free(void) {
    if (__atomic_load_n(&hq.done_head, __ATOMIC_RELAXED) == NULL) {
        return; // a hint only: a miss waits for the next call
    }
    // One lock for the whole list: the lock's cache line moves between
    // the two CPUs on each take, and a burst's commands come back together.
    void *drop = NULL;
    q_lock();
    qrpc_qitem_t *it = hq.done_head;
    hq.done_head = NULL;
    while (it != NULL) {
        qrpc_qitem_t *next = it->next;
        if (!item_keep_locked(it)) {
            *(void **)it = drop;
            drop = it;
        }
        it = next;
    }
    q_unlock();
    free_chain(drop);
}

void qrpc_submitq_trim(int all) {
    void *drop[SQ_CACHE_BLOCKS];
    size_t nd = 0;
    q_lock();
    size_t k = all ? sq_cached : sq_cache_low;
    while (k-- > 0 && sq_cached > 0) {
        sq_cached--;
        drop[nd++] = sq_cache[sq_cached].p;
        sq_cache_bytes -= sq_cache[sq_cached].n;
    }
    sq_cache_low = sq_cached;
    q_unlock();
    for (size_t i = 0; i < nd; i++) {
        free(drop[i]);
    }
}

size_t qrpc_submitq_cached(void) {
    q_lock();
    size_t n = sq_cached;
    q_unlock();
    return n;
}

// The ops that go through the submit queue: those that complete later
// (CONNECT, UNARY, ECHO, and POOL_SHARE's steps that Go asked for) and
// CANCEL, which must not overtake the call it cancels. EVENT, CLOSE and
// the query ops answer at once (qrpc_query).
static int queued_op(uint32_t op) {
    return op == QRPC_OP_CONNECT || op == QRPC_OP_UNARY || op == QRPC_OP_ECHO ||
           op == QRPC_OP_CANCEL || op == QRPC_OP_POOL_SHARE;
}

// Whether VM vm is open (qrpc_vm_open); VM 0 always is. Read without
// the lock: a VM is opened once, before its first command, on the thread
// that submits.
static int vm_open(uint32_t vm) {
    return vm < QRPC_MAX_VMS && (__atomic_load_n(&hq.vms, __ATOMIC_ACQUIRE) >> vm) & 1;
}

void qrpc_vm_mark_open(int vm) {
    if (vm >= 0 && vm < QRPC_MAX_VMS) {
        __atomic_fetch_or(&hq.vms, (uint64_t)1 << vm, __ATOMIC_RELEASE);
    }
}

int qrpc_submit_async(const qrpc_cmd_t *cmd) {
    if (cmd == NULL || !queued_op(cmd->op) || !vm_open(cmd->vm)) {
        return QRPC_ERR_BADARG;
    }
    qrpc_done_free(); // first: a big block freed there serves this command
    // Only CONNECT reads the connect fields: the others' are not copied
    // (and not kept). opts is copied for every op: Go refuses it on an op
    // that does not read it, as qrpc_query and lua-resty-ffi do.
    int conn = cmd->op == QRPC_OP_CONNECT;
    const size_t parts[] = {
        field_len(cmd->method, cmd->method_len),
        field_len(cmd->body, cmd->body_len),
        field_len(cmd->hdrs, cmd->hdrs_len),
        field_len(cmd->hash_key, cmd->hash_key_len),
        field_len(cmd->req_type, cmd->req_type_len),
        field_len(cmd->resp_type, cmd->resp_type_len),
        conn ? field_len(cmd->addr, cmd->addr_len) : 0,
        conn ? field_len(cmd->server_name, cmd->server_name_len) : 0,
        conn ? field_len(cmd->ca, cmd->ca_len) : 0,
        conn ? field_len(cmd->cert, cmd->cert_len) : 0,
        conn ? field_len(cmd->key, cmd->key_len) : 0,
        conn ? field_len(cmd->pins, cmd->pins_len) : 0,
        field_len(cmd->opts, cmd->opts_len),
    };
    size_t extra = 0;
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
    it->cmd.method = copy_field(&p, cmd->method, parts[0]);
    it->cmd.body = copy_field(&p, cmd->body, parts[1]);
    it->cmd.hdrs = copy_field(&p, cmd->hdrs, parts[2]);
    it->cmd.hash_key = copy_field(&p, cmd->hash_key, parts[3]);
    it->cmd.req_type = copy_field(&p, cmd->req_type, parts[4]);
    it->cmd.resp_type = copy_field(&p, cmd->resp_type, parts[5]);
    if (conn) {
        it->cmd.addr = copy_field(&p, cmd->addr, parts[6]);
        it->cmd.server_name = copy_field(&p, cmd->server_name, parts[7]);
        it->cmd.ca = copy_field(&p, cmd->ca, parts[8]);
        it->cmd.cert = copy_field(&p, cmd->cert, parts[9]);
        it->cmd.key = copy_field(&p, cmd->key, parts[10]);
        it->cmd.pins = copy_field(&p, cmd->pins, parts[11]);
    } else {
        it->cmd.addr = NULL; it->cmd.addr_len = 0;
        it->cmd.server_name = NULL; it->cmd.server_name_len = 0;
        it->cmd.ca = NULL; it->cmd.ca_len = 0;
        it->cmd.cert = NULL; it->cmd.cert_len = 0;
        it->cmd.key = NULL; it->cmd.key_len = 0;
        it->cmd.pins = NULL; it->cmd.pins_len = 0;
    }
    it->cmd.opts = copy_field(&p, cmd->opts, parts[12]);

    q_lock();
    if (hq.fd < 0 || hq.sq_len >= QRPC_SUBMITQ_MAX) {
        int rc = hq.fd < 0 ? QRPC_ERR_CLOSED : QRPC_ERR_FULL;
        q_unlock();
        qrpc_submitq_free(it);
        return rc;
    }
    if (hq.sq_tail != NULL) {
        hq.sq_tail->next = it;
    } else {
        hq.sq_head = it;
    }
    hq.sq_tail = it;
    hq.sq_len++;
    if (hq.sleeping) {
        // Under the lock: qrpc_hostq_set_fd(-1) cannot close the fd meanwhile.
        hq.sleeping = 0;
        hq.rings++;
        uint64_t one = 1;
        ssize_t n;
        do {
            n = write(hq.fd, &one, sizeof one);
        } while (n < 0 && errno == EINTR);
        // The submitter never reads the counter (hostq.go): each write is
        // a new edge for its edge-triggered netpoller. EAGAIN (a full
        // counter) would take 2^64-2 writes.
    }
    q_unlock();
    return cmd->op == QRPC_OP_CANCEL ? QRPC_OK : QRPC_PENDING;
}

void qrpc_hostq_set_fd(int fd) {
    q_lock();
    hq.fd = fd;
    hq.sleeping = 0;
    hq.trim_asleep = 0; // a new submitter starts its trimmer running
    q_unlock();
}

// Grows VM q's ring to hold one more; 0 on failure. Under the lock.
static int cq_grow(qrpc_cq_t *q) {
    size_t ncap = q->cap ? 2 * q->cap : 256;
    qrpc_completion_t *nb = malloc(ncap * sizeof *nb);
    if (nb == NULL) {
        return 0;
    }
    for (size_t i = 0; i < q->len; i++) {
        nb[i] = q->buf[(q->head + i) % q->cap];
    }
    free(q->buf);
    q->buf = nb;
    q->cap = ncap;
    q->head = 0;
    return 1;
}

int qrpc_cq_push(int vm, const qrpc_completion_t *c, int max_logs, void **released) {
    q_lock();
    if (released != NULL) {
        *released = hq.rel_head;
        hq.rel_head = NULL;
    }
    if (hq.fd < 0 || vm < 0 || vm >= QRPC_MAX_VMS) {
        q_unlock();
        return -1;
    }
    qrpc_cq_t *q = &hq.cq[vm];
    int is_log = c->status == QRPC_LOG;
    if ((is_log && q->logs >= (size_t)max_logs) || (q->len == q->cap && !cq_grow(q))) {
        q_unlock();
        return -2;
    }
    q->buf[(q->head + q->len) % q->cap] = *c;
    q->len++;
    q->logs += is_log;
    int was_empty = q->len == 1;
    q_unlock();
    return was_empty;
}

int qrpc_vm_poll(int vm, qrpc_completion_t *out, int max) {
    if (out == NULL || max <= 0 || vm < 0 || vm >= QRPC_MAX_VMS) {
        return 0;
    }
    qrpc_done_free();
    q_lock();
    qrpc_cq_t *q = &hq.cq[vm];
    size_t n = q->len < (size_t)max ? q->len : (size_t)max;
    for (size_t i = 0; i < n; i++) {
        out[i] = q->buf[q->head];
        q->logs -= out[i].status == QRPC_LOG;
        q->head = (q->head + 1) % q->cap;
    }
    q->len -= n;
    if (q->len == 0) {
        q->head = 0;
        if (q->cap > 4096) {
            // A burst's ring need not stay.
            free(q->buf);
            q->buf = NULL;
            q->cap = 0;
        }
    }
    q_unlock();
    return (int)n;
}

size_t qrpc_cq_len(int vm) {
    size_t n = 0;
    q_lock();
    for (int i = 0; i < QRPC_MAX_VMS; i++) {
        if (vm < 0 || vm == i) {
            n += hq.cq[i].len;
        }
    }
    q_unlock();
    return n;
}

size_t qrpc_cq_logs(int vm) {
    size_t n = 0;
    q_lock();
    for (int i = 0; i < QRPC_MAX_VMS; i++) {
        if (vm < 0 || vm == i) {
            n += hq.cq[i].logs;
        }
    }
    q_unlock();
    return n;
}

// Keeps a released block: a small one in its class's list for Go's next
// small result (Go takes blocks without a cgo call: hostq.go, smallAlloc)
// or the next command, a big one on the list Go's buffer cache takes
// back; 0 when it is to be freed. Under the lock.
static int release_locked(void *p) {
    size_t u = malloc_usable_size(p);
    if (u < QRPC_CACHE_MIN) {
        return small_put_locked(p, u);
    }
    *(void **)p = hq.rel_head;
    hq.rel_head = p;
    return 1;
}

void qrpc_release(void *p) { qrpc_release_n(&p, 1); }

void qrpc_release_n(void *const *ps, int n) {
    if (ps == NULL || n <= 0) {
        return;
    }
    void *drop = NULL;
    q_lock();
    // The lists serve a queue in use. While the trimmer sleeps (nothing
    // kept, no command for a whole tick) a block is freed, not kept:
    // keeping it would take the trimmer's timer to give it back, a few
    // ticks that wake three of Go's threads each, for the one answer an
    // idle worker's shared-pool step or query gets.
    int keep = !hq.trim_asleep;
    for (int i = 0; i < n; i++) {
        void *p = ps[i];
        if (p != NULL && !(keep && release_locked(p))) {
            *(void **)p = drop;
            drop = p;
        }
    }
    q_unlock();
    free_chain(drop);
}

void *qrpc_released_take(void) {
    q_lock();
    void *p = hq.rel_head;
    hq.rel_head = NULL;
    q_unlock();
    return p;
}

void qrpc_small_trim(void) {
    void *lists[QRPC_SMALL_CLASSES];
    q_lock();
    for (int c = 0; c < QRPC_SMALL_CLASSES; c++) {
        lists[c] = hq.small[c];
        hq.small[c] = NULL;
        hq.small_n[c] = 0;
    }
    q_unlock();
    for (int c = 0; c < QRPC_SMALL_CLASSES; c++) {
        free_chain(lists[c]);
    }
}

// Weak: a C library without malloc_trim (it is glibc's) leaves it NULL,
// and the library still loads there.
extern int malloc_trim(size_t pad) __attribute__((weak));

// free() keeps a freed block in its arena (the main one, the nginx
// thread's; a thread arena, a Go thread's) until the arena's top is free
// too, so the blocks of a burst (commands, results, the buffer cache's
// blocks) stay private memory of the idle worker. malloc_trim(0) hands
// every free page of every arena back (madvise), the free lists stay.
// Measured side by side (bench -idle-libs, -idle-burst 100): 100
// concurrent 64 KB echoes leave an idle worker 4.2 MB more PSS and
// private memory without it; no difference after one call. It holds each
// arena's lock while it walks that arena's free chunks, so a malloc on
// the nginx thread (the main arena) may wait that long: up to 5.7 ms
// with 320 freed 64 KB chunks and both CPUs busy (2.7 ms with no trim),
// once per idle spell, when nothing is queued (docs/tuning.md).
int qrpc_heap_trim(void) {
    if (malloc_trim == NULL) {
        return 0;
    }
    malloc_trim(0);
    return 1;
}
