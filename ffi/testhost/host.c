//go:build ignore

/*
 * A C host for libffi_qrpc.so, standing in for nginx: it dlopen()s the
 * library like LuaJIT's ffi.load, plays lua-resty-ffi (it implements and
 * exports ngx_http_lua_ffi_task_poll / get_req / respond with a pthread
 * task queue) and drives the built-in host's exports the way the Lua
 * dispatcher does. Run by host_test.go against a real qrpc server.
 *
 * usage: host LIB ADDR CA_PEM OTHER_CA_PEM DIR     (full run)
 *        host signals LIB                          (signal checks only)
 *        host-nosyms LIB                           (built without -rdynamic:
 *                                                   libffi_init must refuse)
 *
 * Prints "ok ..." / "FAIL ..." lines; exits 1 if anything failed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "qrpc.h"

static int failures;

static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    failures++;
}

static void ok(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("ok ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

#define CHECK(cond, ...) do { if (cond) ok(__VA_ARGS__); else fail(__VA_ARGS__); } while (0)

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(n + 1);
    if (fread(b, 1, n, f) != (size_t)n) { perror(path); exit(2); }
    fclose(f);
    b[n] = 0;
    *len = (size_t)n;
    return b;
}

/* ---------------------------------------------------------------------
 * lua-resty-ffi, as seen by a runtime
 * ------------------------------------------------------------------- */

#define TQ_MAGIC 0x71727063u

typedef struct task {
    struct task *next;
    int          finish;    /* the NULL-task sentinel */
    char        *req;       /* malloc'd copy, freed when answered (as lua-resty-ffi does) */
    int          req_len;
    int          answers;   /* must end at exactly 1 */
    int          rc;
    char        *rsp;
    int          rsp_len;
} task_t;

typedef struct {
    unsigned        magic;  /* cleared when "freed": polling after NULL is a bug */
    pthread_mutex_t mu;
    pthread_cond_t  cond;
    task_t         *head, *tail;
} tq_t;

static pthread_mutex_t ans_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t  ans_cond = PTHREAD_COND_INITIALIZER;
static int polls_after_free;
static int finish_seen;

void *ngx_http_lua_ffi_task_poll(void *p) {
    tq_t *tq = p;
    if (tq->magic != TQ_MAGIC) {
        __atomic_add_fetch(&polls_after_free, 1, __ATOMIC_SEQ_CST);
        return NULL;
    }
    pthread_mutex_lock(&tq->mu);
    while (tq->head == NULL) pthread_cond_wait(&tq->cond, &tq->mu);
    task_t *t = tq->head;
    tq->head = t->next;
    if (!tq->head) tq->tail = NULL;
    pthread_mutex_unlock(&tq->mu);
    if (t->finish) {
        /* lua-resty-ffi frees the queue here; the runtime must not touch it again */
        free(t);
        tq->magic = 0;
        __atomic_store_n(&finish_seen, 1, __ATOMIC_SEQ_CST);
        return NULL;
    }
    return t;
}

char *ngx_http_lua_ffi_get_req(void *tsk, int *len) {
    task_t *t = tsk;
    if (len) *len = t->req_len;
    return t->req;
}

void ngx_http_lua_ffi_respond(void *tsk, int rc, char *rsp, int rsp_len) {
    task_t *t = tsk;
    pthread_mutex_lock(&ans_mu);
    t->answers++;
    if (t->answers == 1) {
        t->rc = rc;
        t->rsp = rsp;
        t->rsp_len = rsp_len;
        /* Poison the request: a runtime that reads it after answering
         * would see garbage (lua-resty-ffi frees it right after). */
        if (t->req) {
            memset(t->req, 0xdd, t->req_len);
            free(t->req);
            t->req = NULL;
        }
    } else {
        free(rsp);
    }
    pthread_cond_broadcast(&ans_cond);
    pthread_mutex_unlock(&ans_mu);
}

static void tq_post(tq_t *tq, task_t *t) {
    pthread_mutex_lock(&tq->mu);
    if (tq->tail) tq->tail->next = t; else tq->head = t;
    tq->tail = t;
    pthread_cond_signal(&tq->cond);
    pthread_mutex_unlock(&tq->mu);
}

static task_t *post_raw(tq_t *tq, const void *req, int len) {
    task_t *t = calloc(1, sizeof *t);
    t->req = malloc(len ? len : 1);
    memcpy(t->req, req, len);
    t->req_len = len;
    tq_post(tq, t);
    return t;
}

static task_t *post_cmd(tq_t *tq, const qrpc_cmd_t *cmd) {
    return post_raw(tq, cmd, (int)sizeof *cmd);
}

/* Waits for the answer; returns 0 when none came in time. */
static int wait_answer(task_t *t, int ms) {
    long long end = now_ms() + ms;
    pthread_mutex_lock(&ans_mu);
    while (t->answers == 0) {
        long long left = end - now_ms();
        if (left <= 0) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += left / 1000;
        ts.tv_nsec += (left % 1000) * 1000000;
        if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
        pthread_cond_timedwait(&ans_cond, &ans_mu, &ts);
    }
    int n = t->answers;
    pthread_mutex_unlock(&ans_mu);
    return n;
}

static char *rsp_text(const task_t *t) {
    static char buf[512];
    if (!t->rsp) return "(null)";
    size_t n = t->rsp_len ? (size_t)t->rsp_len : strlen(t->rsp);
    if (n >= sizeof buf) n = sizeof buf - 1;
    memcpy(buf, t->rsp, n);
    buf[n] = 0;
    return buf;
}

/* ---------------------------------------------------------------------
 * Commands and result blobs
 * ------------------------------------------------------------------- */

static char hdrbuf[256];

/* Packs key/value pairs into hdrbuf; returns its length. */
static size_t pack_headers(int n, const char **kv) {
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        uint32_t l = (uint32_t)strlen(kv[i]);
        memcpy(hdrbuf + off, &l, 4);
        memcpy(hdrbuf + off + 4, kv[i], l);
        off += 4 + l;
    }
    return off;
}

static qrpc_cmd_t unary_cmd(uint64_t conn, uint64_t id, const char *method, const char *body, int timeout_ms) {
    qrpc_cmd_t c;
    memset(&c, 0, sizeof c);
    c.version = QRPC_CMD_VERSION;
    c.op = QRPC_OP_UNARY;
    c.conn = conn;
    c.call_id = id;
    c.timeout_ms = timeout_ms;
    c.method = method;
    c.method_len = strlen(method);
    c.body = body;
    c.body_len = strlen(body);
    return c;
}

static qrpc_cmd_t connect_cmd(uint64_t id, const char *addr, const char *ca, size_t ca_len, int timeout_ms) {
    qrpc_cmd_t c;
    memset(&c, 0, sizeof c);
    c.version = QRPC_CMD_VERSION;
    c.op = QRPC_OP_CONNECT;
    c.call_id = id;
    c.timeout_ms = timeout_ms;
    c.addr = addr;
    c.addr_len = strlen(addr);
    c.ca = ca;
    c.ca_len = ca_len;
    return c;
}

typedef struct {
    uint32_t code;
    const char *hdrs; uint32_t hdrs_len;
    uint32_t attempts;
    const char *body; size_t body_len;
} result_t;

static int parse_result(const char *p, size_t n, result_t *r) {
    if (!p || n < QRPC_RESULT_HEAD) return -1;
    memcpy(&r->code, p, 4);
    memcpy(&r->hdrs_len, p + 4, 4);
    memcpy(&r->attempts, p + 8, 4);
    if ((size_t)r->hdrs_len > n - QRPC_RESULT_HEAD) return -1;
    r->hdrs = p + QRPC_RESULT_HEAD;
    r->body = r->hdrs + r->hdrs_len;
    r->body_len = n - QRPC_RESULT_HEAD - r->hdrs_len;
    return 0;
}

/* Compares a packed header block with key/value strings. */
static int headers_equal(const char *h, uint32_t len, int n, const char **kv) {
    uint32_t off = 0;
    for (int i = 0; i < n; i++) {
        uint32_t l;
        if (off + 4 > len) return 0;
        memcpy(&l, h + off, 4);
        if (l != strlen(kv[i]) || off + 4 + l > len || memcmp(h + off + 4, kv[i], l) != 0) return 0;
        off += 4 + l;
    }
    return off == len;
}

/* ---------------------------------------------------------------------
 * The library
 * ------------------------------------------------------------------- */

static void *lib;
static __typeof__(qrpc_init) *p_init;
static __typeof__(qrpc_vm_wake_open) *p_wake_open;
static __typeof__(qrpc_stats) *p_stats;
static __typeof__(qrpc_query) *p_query;
/* a test build's export (-tags qrpctesthooks), not in qrpc.h */
static void (*p_shutdown)(void);
static __typeof__(libffi_init) *p_libffi_init;
static __typeof__(qrpc_submit_async) *p_submit_async;
static __typeof__(qrpc_vm_poll) *p_poll;
static __typeof__(qrpc_release) *p_release;
static __typeof__(qrpc_go_entries) *p_go_entries;

static void *sym(const char *name) {
    void *p = dlsym(lib, name);
    if (!p) { fprintf(stderr, "dlsym %s: %s\n", name, dlerror()); exit(2); }
    return p;
}

static void load(const char *path) {
    /* LuaJIT's ffi.load: RTLD_NOW, local unless asked otherwise. */
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); exit(2); }
    p_init = sym("qrpc_init");
    p_wake_open = sym("qrpc_vm_wake_open");
    p_stats = sym("qrpc_stats");
    p_query = sym("qrpc_query");
    p_shutdown = sym("qrpc_shutdown");
    p_libffi_init = sym("libffi_init");
    p_submit_async = sym("qrpc_submit_async");
    p_poll = sym("qrpc_vm_poll");
    p_release = sym("qrpc_release");
    p_go_entries = sym("qrpc_go_entries");
}

/* ---------------------------------------------------------------------
 * Signals: nginx's set-up, and what loading Go does to it
 * ------------------------------------------------------------------- */

static pthread_t main_thread;
static volatile sig_atomic_t chld_calls, chld_off_main;
static volatile sig_atomic_t usr1_calls, usr1_off_main;

/* Like ngx_signal_handler + ngx_process_get_status: every SIGCHLD reaps
 * whatever child has exited. */
static void chld_handler(int sig, siginfo_t *si, void *uc) {
    (void)sig; (void)si; (void)uc;
    int saved = errno;
    chld_calls++;
    if (!pthread_equal(pthread_self(), main_thread)) chld_off_main++;
    for (;;) {
        int status;
        if (waitpid(-1, &status, WNOHANG) <= 0) break;
    }
    errno = saved;
}

/* Like nginx's handling of SIGQUIT/SIGTERM/SIGUSR1 in a worker: set a flag
 * that the event loop, interrupted in epoll_wait, looks at. */
static void usr1_handler(int sig, siginfo_t *si, void *uc) {
    (void)sig; (void)si; (void)uc;
    usr1_calls++;
    if (!pthread_equal(pthread_self(), main_thread)) usr1_off_main++;
}

static struct sigaction chld_before, usr1_before, pipe_before;

static void install_nginx_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = chld_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGCHLD, &sa, NULL);
    sa.sa_sigaction = usr1_handler;
    sigaction(SIGUSR1, &sa, NULL);
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_IGN;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPIPE, &sa, NULL);
    sigaction(SIGCHLD, NULL, &chld_before);
    sigaction(SIGUSR1, NULL, &usr1_before);
    sigaction(SIGPIPE, NULL, &pipe_before);
}

static void *pipe_writer(void *arg) {
    int *res = arg;
    int fds[2];
    if (pipe(fds) != 0) { *res = -1; return NULL; }
    close(fds[0]);
    ssize_t n = write(fds[1], "x", 1);
    *res = (n < 0 && errno == EPIPE) ? 1 : 0;
    close(fds[1]);
    return NULL;
}

static void check_dispositions(const char *when) {
    struct sigaction chld, usr1, pipe_now;
    sigaction(SIGCHLD, NULL, &chld);
    sigaction(SIGUSR1, NULL, &usr1);
    sigaction(SIGPIPE, NULL, &pipe_now);
    /* The library routes asynchronous signals that have a handler to the
     * thread that loaded it (see internal/hostq/sigfwd.go); the behaviour checks below
     * are what matters. */
    CHECK(chld.sa_sigaction != chld_before.sa_sigaction && (chld.sa_flags & (SA_SIGINFO | SA_ONSTACK)) == (SA_SIGINFO | SA_ONSTACK),
          "%s: SIGCHLD goes through the library's forwarder to the host thread", when);
    CHECK(usr1.sa_sigaction != usr1_before.sa_sigaction, "%s: SIGUSR1 too", when);
    if (pipe_now.sa_handler == SIG_IGN)
        ok("%s: SIGPIPE still SIG_IGN", when);
    else
        ok("%s: SIGPIPE handled by Go, which forwards it to the host's SIG_IGN outside Go code", when);

    /* Whatever the disposition, a broken pipe must stay an EPIPE, on the
     * host's thread and on a fresh non-Go thread. */
    int res = 0;
    pipe_writer(&res);
    CHECK(res == 1, "%s: write to a broken pipe on the main thread gives EPIPE and the process lives", when);
    pthread_t th;
    res = 0;
    pthread_create(&th, NULL, pipe_writer, &res);
    pthread_join(th, NULL);
    CHECK(res == 1, "%s: same on another non-Go thread", when);
}

/* os.execute / io.popen: system() blocks SIGCHLD on the calling thread and
 * waits for its child. If the SIGCHLD runs the host's reaping handler on
 * another thread (a Go thread, where SIGCHLD is unblocked), the child is
 * reaped there and system() fails with ECHILD (openresty/openresty#1022). */
static void check_system(const char *when, int rounds) {
    int bad = 0, first_bad = 0;
    chld_off_main = 0;
    sig_atomic_t calls = chld_calls;
    for (int i = 0; i < rounds; i++) {
        int st = system("exit 3");
        if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 3) {
            if (!bad) first_bad = st;
            bad++;
        }
    }
    CHECK(bad == 0 && chld_off_main == 0,
          "%s: system(\"exit 3\") returned 3 in %d/%d rounds (first bad: %d); host SIGCHLD handler ran %d times, %d of them off the main thread",
          when, rounds - bad, rounds, first_bad, (int)(chld_calls - calls), (int)chld_off_main);
}

/* ngx.pipe: ngx_lua blocks SIGCHLD on the nginx thread and reads it from a
 * signalfd. A SIGCHLD taken by another thread never reaches the signalfd
 * (golang/go#55066) and, with nginx's handler, reaps the child there. */
static void check_signalfd(const char *when, int rounds) {
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    pthread_sigmask(SIG_BLOCK, &set, &old);
    int sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    int good = 0;
    chld_off_main = 0;
    for (int i = 0; i < rounds; i++) {
        pid_t pid = fork();
        if (pid == 0) _exit(5);
        /* Level-triggered like nginx's event loop: poll can report the
         * process-wide SIGCHLD that another thread then takes (and
         * forwards), so keep polling until it is read or time is up. */
        struct pollfd pfd = { .fd = sfd, .events = POLLIN };
        int seen = 0;
        long long end = now_ms() + 2000;
        while (!seen && now_ms() < end) {
            if (poll(&pfd, 1, (int)(end - now_ms())) != 1) continue;
            struct signalfd_siginfo fi;
            while (read(sfd, &fi, sizeof fi) == (ssize_t)sizeof fi)
                if (fi.ssi_signo == SIGCHLD) seen = 1;
        }
        int st;
        pid_t w = waitpid(pid, &st, 0);
        if (seen && w == pid && WIFEXITED(st) && WEXITSTATUS(st) == 5) good++;
    }
    close(sfd);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    CHECK(good == rounds && chld_off_main == 0,
          "%s: signalfd saw SIGCHLD and waitpid got the status in %d/%d rounds; host handler ran off the main thread %d times",
          when, good, rounds, (int)chld_off_main);
}

/* A signal sent to the process while the main thread blocks it (as nginx
 * does around fork in ngx.pipe) must wait for the main thread, as in a
 * single-threaded process, not run on whichever thread the kernel picks. */
static void check_process_signal(const char *when, int rounds) {
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    usr1_off_main = 0;
    int good = 0;
    for (int i = 0; i < rounds; i++) {
        sig_atomic_t before = usr1_calls;
        pthread_sigmask(SIG_BLOCK, &set, &old);
        kill(getpid(), SIGUSR1);
        usleep(20 * 1000);
        int early = usr1_calls != before;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (!early && usr1_calls == before + 1) good++;
    }
    CHECK(good == rounds && usr1_off_main == 0,
          "%s: SIGUSR1 sent while the main thread blocked it ran there once unblocked in %d/%d rounds (off the main thread %d times)",
          when, good, rounds, (int)usr1_off_main);
}

/* ---------------------------------------------------------------------
 * lua-resty-ffi host scenario
 * ------------------------------------------------------------------- */

static void resty_host(const char *addr, const char *ca, size_t ca_len, const char *other_ca, size_t other_len) {
    tq_t *tq = calloc(1, sizeof *tq);
    tq->magic = TQ_MAGIC;
    pthread_mutex_init(&tq->mu, NULL);
    pthread_cond_init(&tq->cond, NULL);

    CHECK(p_libffi_init("bogus_key=1", tq) != 0, "resty: libffi_init refuses an unknown cfg key");
    {
        /* cfg is freed right after the call: the library must copy it. */
        char *cfg = strdup("log_level=info");
        int rc = p_libffi_init(cfg, tq);
        memset(cfg, 0, strlen(cfg));
        free(cfg);
        CHECK(rc == 0, "resty: libffi_init returns 0 (%d)", rc);
        if (rc != 0) return;
    }

    /* CONNECT: 8 bytes, the handle. */
    qrpc_cmd_t cc = connect_cmd(0, addr, ca, ca_len, 3000);
    task_t *t = post_cmd(tq, &cc);
    int n = wait_answer(t, 10000);
    uint64_t h = 0;
    if (n == 1 && t->rc == 0 && t->rsp && t->rsp_len == 8) memcpy(&h, t->rsp, 8);
    CHECK(h != 0, "resty: CONNECT answers rc 0 with an 8-byte handle (rc %d, len %d, %s)", t->rc, t->rsp_len, t->rc ? rsp_text(t) : "");
    if (!h) return;

    /* UNARY with headers. */
    const char *kv[] = { "x-id", "7", "k", "" };
    qrpc_cmd_t uc = unary_cmd(h, 0, "echo", "hello from C", 5000);
    uc.nhdrs = 4;
    uc.hdrs = hdrbuf;
    uc.hdrs_len = pack_headers(4, kv);
    t = post_cmd(tq, &uc);
    n = wait_answer(t, 5000);
    result_t r;
    CHECK(n == 1 && t->rc == 0 && parse_result(t->rsp, t->rsp_len, &r) == 0 && r.code == 0 &&
          r.attempts == 1 && r.body_len == 12 && memcmp(r.body, "hello from C", 12) == 0 &&
          headers_equal(r.hdrs, r.hdrs_len, 4, kv),
          "resty: UNARY echo returns the body and headers, in 1 attempt");

    /* A non-zero code is an answer. */
    uc = unary_cmd(h, 0, "code", "", 5000);
    t = post_cmd(tq, &uc);
    n = wait_answer(t, 5000);
    CHECK(n == 1 && t->rc == 0 && parse_result(t->rsp, t->rsp_len, &r) == 0 && r.code == 7 &&
          r.body_len == 5 && memcmp(r.body, "seven", 5) == 0, "resty: UNARY with code 7");

    /* Go enforces the deadline: lua-resty-ffi's yield has none. */
    uc = unary_cmd(h, 0, "sleep", "3000", 150);
    long long t0 = now_ms();
    t = post_cmd(tq, &uc);
    n = wait_answer(t, 5000);
    long long el = now_ms() - t0;
    CHECK(n == 1 && t->rc == QRPC_ERR_TIMEOUT && strcmp(rsp_text(t), "timeout") == 0 && el >= 140 && el < 2000,
          "resty: UNARY deadline -> rc %d \"%s\" after %lld ms", t->rc, rsp_text(t), el);

    /* EVENT, synchronous: rc 0 and no data. */
    uc = unary_cmd(h, 0, "ev", "event from C", 0);
    uc.op = QRPC_OP_EVENT;
    t = post_cmd(tq, &uc);
    n = wait_answer(t, 5000);
    CHECK(n == 1 && t->rc == 0 && t->rsp == NULL, "resty: EVENT answered rc 0 without data");

    /* ECHO; the counters of the connection. */
    uc = unary_cmd(0, 0, "x", "echo body", 0);
    uc.op = QRPC_OP_ECHO;
    t = post_cmd(tq, &uc);
    n = wait_answer(t, 5000);
    CHECK(n == 1 && t->rc == 0 && parse_result(t->rsp, t->rsp_len, &r) == 0 && r.body_len == 9 &&
          memcmp(r.body, "echo body", 9) == 0, "resty: ECHO returns the body");
    qrpc_stats_t st;
    memset(&st, 0xff, sizeof st);
    int src = p_stats(h, &st);
    CHECK(src == QRPC_OK && st.calls == 3 && st.events == 1 && st.inflight == 0,
          "resty: qrpc_stats of the connection: rc %d, %llu calls, %llu events, %llu in flight", src,
          (unsigned long long)st.calls, (unsigned long long)st.events, (unsigned long long)st.inflight);

    /* 7 is no op. */
    uc = unary_cmd(h, 0, "echo", "", 0);
    uc.op = 7;
    t = post_cmd(tq, &uc);
    n = wait_answer(t, 5000);
    CHECK(n == 1 && t->rc == QRPC_ERR_BADARG && strcmp(rsp_text(t), "bad command: unknown op 7") == 0,
          "resty: op 7 -> rc %d \"%s\"", t->rc, rsp_text(t));

    /* Bad commands: answered, never crash. */
    t = post_raw(tq, "short", 5);
    n = wait_answer(t, 5000);
    CHECK(n == 1 && t->rc == QRPC_ERR_BADARG && strstr(rsp_text(t), "sizeof(qrpc_cmd_t)"),
          "resty: a request of the wrong size -> rc %d \"%s\"", t->rc, rsp_text(t));
    uc = unary_cmd(h, 0, "echo", "", 0);
    uc.version = 99;
    t = post_cmd(tq, &uc);
    n = wait_answer(t, 5000);
    CHECK(n == 1 && t->rc == QRPC_ERR_BADARG, "resty: bad version -> rc %d \"%s\"", t->rc, rsp_text(t));
    uc = unary_cmd(h, 0, "echo", "", 0);
    uc.op = QRPC_OP_METRICS;
    t = post_cmd(tq, &uc);
    n = wait_answer(t, 5000);
    CHECK(n == 1 && t->rc == QRPC_ERR_BADARG && strcmp(rsp_text(t), "bad command: op 9 is a query: use qrpc_query") == 0,
          "resty: a query op as a task -> rc %d \"%s\"", t->rc, rsp_text(t));
    uc = unary_cmd(h, 0, "echo", "", 0);
    uc.op = 42;
    t = post_cmd(tq, &uc);
    n = wait_answer(t, 5000);
    CHECK(n == 1 && t->rc == QRPC_ERR_BADARG, "resty: unknown op -> rc %d \"%s\"", t->rc, rsp_text(t));
    uc = unary_cmd(h, 0, "echo", "", 0);
    uc.body = NULL;
    uc.body_len = 10;
    t = post_cmd(tq, &uc);
    n = wait_answer(t, 5000);
    CHECK(n == 1 && t->rc == QRPC_ERR_BADARG, "resty: NULL body with a length -> rc %d \"%s\"", t->rc, rsp_text(t));
    uc = unary_cmd(987654, 0, "echo", "", 0);
    t = post_cmd(tq, &uc);
    n = wait_answer(t, 5000);
    CHECK(n == 1 && t->rc == QRPC_ERR_CLOSED && strcmp(rsp_text(t), "closed") == 0, "resty: unknown handle -> \"closed\"");

    /* Wrong CA. */
    cc = connect_cmd(0, addr, other_ca, other_len, 3000);
    t = post_cmd(tq, &cc);
    n = wait_answer(t, 10000);
    CHECK(n == 1 && t->rc == QRPC_ERR_CONNECT && strcmp(rsp_text(t), "connect: certificate signed by unknown authority") == 0,
          "resty: wrong CA -> rc %d \"%s\"", t->rc, rsp_text(t));

    /* Many calls in flight at once. */
    enum { MANY = 200 };
    static task_t *many[MANY];
    static char bodies[MANY][16];
    for (int i = 0; i < MANY; i++) {
        snprintf(bodies[i], sizeof bodies[i], "call-%d", i);
        uc = unary_cmd(h, 0, "echo", bodies[i], 10000);
        many[i] = post_cmd(tq, &uc);
    }
    int good = 0;
    for (int i = 0; i < MANY; i++) {
        n = wait_answer(many[i], 10000);
        if (n == 1 && many[i]->rc == 0 && parse_result(many[i]->rsp, many[i]->rsp_len, &r) == 0 &&
            r.body_len == strlen(bodies[i]) && memcmp(r.body, bodies[i], r.body_len) == 0)
            good++;
    }
    CHECK(good == MANY, "resty: %d/%d concurrent calls answered with their own body", good, MANY);

    /* Calls still in flight when the NULL task comes: the host closes its
     * connections, so they are answered "closed" rather than lost. */
    enum { LATE = 5 };
    task_t *late[LATE];
    for (int i = 0; i < LATE; i++) {
        uc = unary_cmd(h, 0, "sleep", "4000", 20000);
        late[i] = post_cmd(tq, &uc);
    }
    usleep(200 * 1000);
    task_t *fin = calloc(1, sizeof *fin);
    fin->finish = 1;
    t0 = now_ms();
    tq_post(tq, fin);
    int closed = 0;
    for (int i = 0; i < LATE; i++) {
        n = wait_answer(late[i], 10000);
        if (n == 1 && late[i]->rc == QRPC_ERR_CLOSED) closed++;
    }
    el = now_ms() - t0;
    CHECK(closed == LATE && el < 3000, "resty: NULL task: %d/%d calls in flight answered \"closed\" within %lld ms", closed, LATE, el);
    CHECK(__atomic_load_n(&finish_seen, __ATOMIC_SEQ_CST) == 1, "resty: the runtime polled the NULL task");
    usleep(300 * 1000);
    CHECK(__atomic_load_n(&polls_after_free, __ATOMIC_SEQ_CST) == 0, "resty: no poll on the freed queue");
    /* tq itself is deliberately leaked: "freed" memory must stay mapped for
     * the magic check above. */
}

/* ---------------------------------------------------------------------
 * Built-in host scenario
 * ------------------------------------------------------------------- */

static int wake_fd = -1;

/* Waits up to ms for wake bytes; returns how many were read. */
static int read_wake(int ms) {
    struct pollfd pfd = { .fd = wake_fd, .events = POLLIN };
    if (poll(&pfd, 1, ms) <= 0) return 0;
    char buf[64];
    ssize_t n = recv(wake_fd, buf, sizeof buf, MSG_DONTWAIT);
    return n > 0 ? (int)n : 0;
}

enum { MAXC = 512 };
static qrpc_completion_t got[MAXC];
static int ngot;
static int nlogs;
static char last_log[512];
static unsigned last_log_level;

/* Drains with qrpc_vm_poll and frees with qrpc_release, as the Lua module
 * does (plain C, no Go). */
static void drain_all(void) {
    qrpc_completion_t out[8];
    for (;;) {
        int n = p_poll(0, out, 8);
        for (int i = 0; i < n; i++) {
            if (out[i].status == QRPC_LOG) {
                printf("log level %u: %.*s\n", out[i].code, (int)out[i].len, out[i].data);
                snprintf(last_log, sizeof last_log, "%.*s", (int)out[i].len, out[i].data);
                last_log_level = out[i].code;
                p_release(out[i].data);
                nlogs++;
            } else if (ngot < MAXC) {
                got[ngot++] = out[i];
            } else {
                p_release(out[i].data);
            }
        }
        if (n < 8) return;
    }
}

/* Pumps until call id completes (or ms pass); the completion is removed
 * from got and returned through *c. */
static int wait_completion(uint64_t id, int ms, qrpc_completion_t *c) {
    long long end = now_ms() + ms;
    for (;;) {
        drain_all();
        for (int i = 0; i < ngot; i++) {
            if (got[i].call_id == id) {
                *c = got[i];
                got[i] = got[--ngot];
                return 1;
            }
        }
        long long left = end - now_ms();
        if (left <= 0) return 0;
        read_wake(left < 50 ? (int)left : 50);
    }
}

static void builtin_host(const char *addr, const char *ca, size_t ca_len, const char *dir) {
    char err[256], path[256];
    int rc = p_init(err, sizeof err);
    CHECK(rc == QRPC_OK, "builtin: qrpc_init (%d %s)", rc, rc ? err : "");
    CHECK(p_init(err, sizeof err) == QRPC_OK, "builtin: a second qrpc_init is a no-op");

    rc = p_wake_open(0, dir, strlen(dir), path, sizeof path, err, sizeof err);
    CHECK(rc == QRPC_OK, "builtin: qrpc_vm_wake_open -> %s", rc ? err : path);
    if (rc) return;
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && S_ISSOCK(sb.st_mode) && (sb.st_mode & 0777) == 0600 && sb.st_uid == getuid(),
          "builtin: the wake socket is ours, mode %o", sb.st_mode & 0777);
    wake_fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sun;
    memset(&sun, 0, sizeof sun);
    sun.sun_family = AF_UNIX;
    strncpy(sun.sun_path, path, sizeof sun.sun_path - 1);
    CHECK(connect(wake_fd, (struct sockaddr *)&sun, sizeof sun) == 0, "builtin: connected to the wake socket");
    int gone = 0;
    for (int i = 0; i < 200 && !gone; i++) {
        if (stat(path, &sb) != 0 && errno == ENOENT) gone = 1; else usleep(10000);
    }
    CHECK(gone, "builtin: the socket file is unlinked once the dispatcher is connected");

    /* A too-small path buffer is an error, not an overflow. */
    char tiny[4];
    CHECK(p_wake_open(0, dir, strlen(dir), tiny, sizeof tiny, err, sizeof err) == QRPC_ERR_BADARG,
          "builtin: qrpc_vm_wake_open with a tiny path buffer -> %s", err);
    /* ... and it must not have replaced the live wake connection. */

    /* The built-in host's one way in: CONNECT, UNARY, ECHO and CANCEL
     * through qrpc_submit_async, completions through qrpc_vm_poll, blocks
     * back through qrpc_release (drain_all). */
    uint64_t entries = p_go_entries();

    /* CONNECT. */
    qrpc_cmd_t cc = connect_cmd(1, addr, ca, ca_len, 3000);
    rc = p_submit_async(&cc);
    CHECK(rc == QRPC_PENDING, "builtin: CONNECT pending (%d)", rc);
    qrpc_completion_t c;
    int have = wait_completion(1, 10000, &c);
    uint64_t h = (have && c.status == QRPC_OK) ? c.handle : 0;
    CHECK(h != 0, "builtin: CONNECT completed with handle %llu", (unsigned long long)h);
    if (have) p_release(c.data);
    if (!h) return;

    /* A failed dial: its completion, and Go's log line about it arrives
     * as a QRPC_LOG completion (NOTICE) for the dispatcher to ngx.log.
     * The command is copied: its strings may change once submitted. */
    char junk[] = "junk";
    cc = connect_cmd(7, addr, junk, 4, 3000);
    p_submit_async(&cc);
    memcpy(junk, "JUNK", 4);
    have = wait_completion(7, 5000, &c);
    CHECK(have && c.status == QRPC_ERR_BADARG && c.len > 0 && strncmp(c.data, "bad config: ", 12) == 0,
          "builtin: CONNECT with a junk CA -> status %d \"%.*s\"", have ? c.status : 0, have ? (int)c.len : 0, have ? c.data : "");
    if (have) p_release(c.data);
    qrpc_cmd_t cc2 = connect_cmd(8, "127.0.0.1:1", ca, ca_len, 200);
    p_submit_async(&cc2);
    have = wait_completion(8, 5000, &c);
    CHECK(have && c.status == QRPC_ERR_CONNECT && c.len > 9 && strncmp(c.data, "connect: ", 9) == 0,
          "builtin: CONNECT to a closed port -> status %d \"%.*s\"", have ? c.status : 0, have ? (int)c.len : 0, have ? c.data : "");
    if (have) p_release(c.data);
    drain_all();
    CHECK(nlogs >= 1 && last_log_level == 6 && strncmp(last_log, "qrpc: connect failed addr=127.0.0.1:1 ", 38) == 0,
          "builtin: Go's log line came through the queue at NOTICE: %s", last_log);

    /* UNARY, woken by the wake byte. */
    const char *kv[] = { "a", "1" };
    qrpc_cmd_t uc = unary_cmd(h, 2, "echo", "builtin body", 5000);
    uc.nhdrs = 2;
    uc.hdrs = hdrbuf;
    uc.hdrs_len = pack_headers(2, kv);
    rc = p_submit_async(&uc);
    memset(&uc, 0, sizeof uc); /* copied: the library must not read it again */
    int woke = read_wake(5000);
    have = wait_completion(2, 5000, &c);
    result_t r;
    CHECK(rc == QRPC_PENDING && woke >= 1 && have && c.status == QRPC_OK && parse_result(c.data, c.len, &r) == 0 &&
          r.attempts == 1 && r.body_len == 12 && memcmp(r.body, "builtin body", 12) == 0 &&
          headers_equal(r.hdrs, r.hdrs_len, 2, kv),
          "builtin: UNARY completes in 1 attempt after a wake byte (%d bytes read)", woke);
    if (have) p_release(c.data);

    /* Timeout. */
    uc = unary_cmd(h, 3, "sleep", "3000", 100);
    p_submit_async(&uc);
    have = wait_completion(3, 5000, &c);
    CHECK(have && c.status == QRPC_ERR_TIMEOUT && c.len == 7 && memcmp(c.data, "timeout", 7) == 0,
          "builtin: UNARY deadline -> status %d", have ? c.status : 0);
    if (have) p_release(c.data);

    /* Cancel, queued after its call: no completion, nothing left in flight. */
    uc = unary_cmd(h, 4, "sleep", "300", 5000);
    p_submit_async(&uc);
    qrpc_cmd_t xc;
    memset(&xc, 0, sizeof xc);
    xc.version = QRPC_CMD_VERSION;
    xc.op = QRPC_OP_CANCEL;
    xc.conn = h;
    xc.call_id = 4;
    CHECK(p_submit_async(&xc) == QRPC_OK, "builtin: CANCEL through the queue");
    usleep(500 * 1000);
    CHECK(!wait_completion(4, 200, &c), "builtin: no completion for the cancelled call");
    qrpc_stats_t st;
    p_stats(h, &st);
    CHECK(st.inflight == 0, "builtin: nothing in flight after CANCEL (%llu)", (unsigned long long)st.inflight);

    /* Bad commands: the completion says why. */
    uc = unary_cmd(h, 5, "", "", 0);
    rc = p_submit_async(&uc);
    have = wait_completion(5, 5000, &c);
    CHECK(rc == QRPC_PENDING && have && c.status == QRPC_ERR_BADARG && c.len > 0 && memmem(c.data, c.len, "empty method", 12),
          "builtin: empty method -> %d \"%.*s\"", have ? c.status : 0, have ? (int)c.len : 0, have ? c.data : "");
    if (have) p_release(c.data);
    uc = unary_cmd(h, 9, "echo", "", -5);
    p_submit_async(&uc);
    have = wait_completion(9, 5000, &c);
    CHECK(have && c.status == QRPC_ERR_BADARG && c.len > 0 && memmem(c.data, c.len, "negative timeout", 16),
          "builtin: negative timeout -> %d \"%.*s\"", have ? c.status : 0, have ? (int)c.len : 0, have ? c.data : "");
    if (have) p_release(c.data);
    CHECK(p_submit_async(NULL) == QRPC_ERR_BADARG, "builtin: NULL command refused");

    /* A burst: one wake byte, every completion drained once. */
    drain_all();
    read_wake(0);
    for (int i = 0; i < 50; i++) {
        qrpc_cmd_t ec = unary_cmd(0, 100 + i, "x", "burst", 0);
        ec.op = QRPC_OP_ECHO;
        p_submit_async(&ec);
    }
    int bytes = read_wake(1000);
    int seen = 0;
    for (int i = 0; i < 50; i++) {
        if (wait_completion(100 + i, 1000, &c)) {
            seen++;
            p_release(c.data);
        }
    }
    CHECK(bytes == 1 && seen == 50, "builtin: 50 ECHO completions, %d wake byte(s)", bytes);

    /* All of the above from this thread, which like nginx's is not a Go
     * thread: qrpc_submit_async, qrpc_poll, qrpc_release never enter Go
     * (qrpc_stats does, once). */
    CHECK(p_go_entries() == entries + 1, "builtin: the C way in and out entered Go %llu times besides qrpc_stats",
          (unsigned long long)(p_go_entries() - entries - 1));

    /* EVENT and CLOSE answer at once, through qrpc_query. */
    char *out = (char *)&uc;
    size_t out_len = 1;
    uc = unary_cmd(h, 0, "ev", "builtin event", 0);
    uc.op = QRPC_OP_EVENT;
    rc = p_query(&uc, &out, &out_len, err, sizeof err);
    CHECK(rc == QRPC_OK && out == NULL && out_len == 0, "builtin: EVENT accepted synchronously (%d)", rc);
    CHECK(p_submit_async(&uc) == QRPC_ERR_BADARG, "builtin: EVENT refused by qrpc_submit_async");
    /* The connection is closed below: qrpc's Close does not drain what the
     * server has not read yet, so give the event time to be handled. */
    usleep(300 * 1000);
    uc = unary_cmd(h, 0, "", "", 0);
    uc.op = QRPC_OP_EVENT;
    rc = p_query(&uc, &out, &out_len, err, sizeof err);
    CHECK(rc == QRPC_ERR_BADARG && strstr(err, "empty method"), "builtin: EVENT with an empty method -> %d \"%s\"", rc, err);

    /* CLOSE fails pending calls with "closed". */
    uc = unary_cmd(h, 6, "sleep", "5000", 10000);
    p_submit_async(&uc);
    usleep(100 * 1000); /* run by the submitter before the CLOSE below */
    qrpc_cmd_t clc;
    memset(&clc, 0, sizeof clc);
    clc.version = QRPC_CMD_VERSION;
    clc.op = QRPC_OP_CLOSE;
    clc.conn = h;
    CHECK(p_submit_async(&clc) == QRPC_ERR_BADARG, "builtin: CLOSE refused by qrpc_submit_async");
    rc = p_query(&clc, &out, &out_len, err, sizeof err);
    CHECK(rc == QRPC_OK && out == NULL, "builtin: CLOSE (%d)", rc);
    have = wait_completion(6, 5000, &c);
    CHECK(have && c.status == QRPC_ERR_CLOSED, "builtin: call pending at CLOSE -> status %d", have ? c.status : 0);
    if (have) p_release(c.data);
    rc = p_query(&clc, &out, &out_len, err, sizeof err);
    CHECK(rc == QRPC_ERR_CLOSED && strcmp(err, "closed") == 0, "builtin: a second CLOSE -> %d \"%s\"", rc, err);
    CHECK(p_stats(h, &st) == QRPC_ERR_CLOSED, "builtin: stats of a closed handle -> QRPC_ERR_CLOSED");

    p_stats(0, &st);
    CHECK(st.inflight == 0 && st.queued == 0, "builtin: runtime stats at the end: %llu in flight, %llu queued, %llu calls, %llu events",
          (unsigned long long)st.inflight, (unsigned long long)st.queued, (unsigned long long)st.calls, (unsigned long long)st.events);

    p_shutdown();
    p_shutdown();
    ok("builtin: qrpc_shutdown twice");
    char b;
    struct pollfd pfd = { .fd = wake_fd, .events = POLLIN };
    int eof = poll(&pfd, 1, 2000) == 1 && recv(wake_fd, &b, 1, 0) == 0;
    CHECK(eof, "builtin: the wake socket is closed by qrpc_shutdown");
    uc = unary_cmd(h, 10, "echo", "", 0);
    rc = p_submit_async(&uc);
    CHECK(rc == QRPC_ERR_CLOSED, "builtin: qrpc_submit_async after shutdown -> %d", rc);
    uc.op = QRPC_OP_EVENT;
    rc = p_query(&uc, &out, &out_len, err, sizeof err);
    CHECK(rc == QRPC_ERR_CLOSED, "builtin: EVENT after shutdown -> %d \"%s\"", rc, err);
    close(wake_fd);
}

/* ---------------------------------------------------------------------
 * qrpc_query: synchronous, host-independent
 * ------------------------------------------------------------------- */

/* Runs one query; returns rc, with out/out_len and err as the library left them. */
static int query(const qrpc_cmd_t *q, char **out, size_t *out_len, char *err, size_t err_len) {
    *out = (char *)q; /* junk: the library must reset it */
    *out_len = 12345;
    err[0] = 0;
    return p_query(q, out, out_len, err, err_len);
}

static void query_checks(void) {
    char err[256], *out;
    size_t out_len;
    qrpc_cmd_t q;
    memset(&q, 0, sizeof q);
    q.version = QRPC_CMD_VERSION;

    /* PEERS (pools): conn 0 is the worker's count of QUIC connections; an
     * unknown handle is "closed". */
    q.op = QRPC_OP_PEERS;
    q.conn = 0;
    int prc = query(&q, &out, &out_len, err, sizeof err);
    /* a record block: one CONNECTIONS record (key 28, an int64) */
    uint16_t rkey = 0;
    if (prc == QRPC_OK && out != NULL && out_len >= 2)
        memcpy(&rkey, out, 2);
    CHECK(prc == QRPC_OK && out != NULL && out_len == 14 && rkey == 28,
          "query: PEERS of conn 0 -> %d \"%s\"", prc, err);
    if (prc == QRPC_OK)
        p_release(out);
    q.conn = 987654321;
    prc = query(&q, &out, &out_len, err, sizeof err);
    CHECK(prc == QRPC_ERR_CLOSED && out == NULL && out_len == 0 && strcmp(err, "closed") == 0,
          "query: PEERS of an unknown handle -> %d \"%s\"", prc, err);

    /* METRICS answers through its handler: an unknown view is refused. */
    q.op = QRPC_OP_METRICS;
    q.conn = 0;
    q.method = "nonsense";
    q.method_len = 8;
    prc = query(&q, &out, &out_len, err, sizeof err);
    CHECK(prc == QRPC_ERR_BADARG && out == NULL && out_len == 0 && strncmp(err, "bad command: ", 13) == 0,
          "query: METRICS of an unknown view -> %d \"%s\"", prc, err);
    q.method = NULL;
    q.method_len = 0;

    /* CONFIGURE: no lines answers the settings in force; a bad line is
       refused with its reason. */
    q.op = QRPC_OP_CONFIGURE;
    q.conn = 0;
    prc = query(&q, &out, &out_len, err, sizeof err);
    /* records, GOMAXPROCS (key 22) first */
    rkey = 0;
    if (prc == QRPC_OK && out != NULL && out_len >= 2)
        memcpy(&rkey, out, 2);
    CHECK(prc == QRPC_OK && out != NULL && out_len > 14 && rkey == 22,
          "query: CONFIGURE without lines -> %d \"%.*s\"", prc, prc == QRPC_OK ? (int)out_len : 0, prc == QRPC_OK ? out : "");
    if (prc == QRPC_OK)
        p_release(out);
    /* one GOMAXPROCS record: [u16 22][u32 8][int64 0] */
    char rec[14] = {0};
    uint16_t k22 = 22;
    uint32_t l8 = 8;
    memcpy(rec, &k22, 2);
    memcpy(rec + 2, &l8, 4);
    q.opts = rec;
    q.opts_len = sizeof rec;
    prc = query(&q, &out, &out_len, err, sizeof err);
    CHECK(prc == QRPC_ERR_BADARG && out == NULL && out_len == 0 &&
          strcmp(err, "bad command: opts: gomaxprocs must be an integer 1..1024, got 0") == 0,
          "query: CONFIGURE gomaxprocs=0 -> %d \"%s\"", prc, err);
    q.opts = NULL;
    q.opts_len = 0;

    /* The error paths: every one answers BADARG with a reason, out NULL. */
#define STR_(x) #x
#define STR(x) STR_(x)
    struct { const char *what; uint32_t version, op, vm; const char *want; } bad[] = {
        { "an op of qrpc_submit_async", QRPC_CMD_VERSION, QRPC_OP_UNARY, 0, "bad command: op 2 is not a query: use qrpc_submit_async" },
        { "an unknown op", QRPC_CMD_VERSION, 42, 0, "bad command: unknown op 42" },
        { "version 1", 1, QRPC_OP_METRICS, 0, "bad command: version 1, this library speaks " STR(QRPC_CMD_VERSION) },
        { "vm out of range", QRPC_CMD_VERSION, QRPC_OP_METRICS, QRPC_MAX_VMS, "bad command: vm must be below 8, got 8" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&q, 0, sizeof q);
        q.version = bad[i].version;
        q.op = bad[i].op;
        q.vm = bad[i].vm;
        if (q.op == QRPC_OP_UNARY) {
            q.conn = 1;
            q.method = "m";
            q.method_len = 1;
        }
        int rc = query(&q, &out, &out_len, err, sizeof err);
        CHECK(rc == QRPC_ERR_BADARG && out == NULL && out_len == 0 && strcmp(err, bad[i].want) == 0,
              "query: %s -> %d \"%s\"", bad[i].what, rc, err);
    }
    int rc = query(NULL, &out, &out_len, err, sizeof err);
    CHECK(rc == QRPC_ERR_BADARG && out == NULL && strcmp(err, "bad command: NULL command") == 0,
          "query: NULL command -> %d \"%s\"", rc, err);
    q.vm = 0;
    q.op = QRPC_OP_METRICS;
    rc = p_query(&q, NULL, NULL, err, sizeof err);
    CHECK(rc == QRPC_ERR_BADARG && strstr(err, "NULL out"), "query: NULL out -> %d \"%s\"", rc, err);
    q.op = QRPC_OP_CONFIGURE; /* refused: the error has nowhere to go */
    q.opts = "nope=1";
    q.opts_len = 6;
    rc = p_query(&q, &out, &out_len, NULL, 0);
    q.opts = NULL;
    q.opts_len = 0;
    CHECK(rc == QRPC_ERR_BADARG && out == NULL, "query: no error buffer is fine (%d)", rc);

    /* A version 2 field on an op that does not read it is refused. */
    qrpc_cmd_t ev = unary_cmd(1, 0, "ev", "", 0);
    ev.op = QRPC_OP_EVENT;
    ev.resp_type = "pkg.Resp";
    ev.resp_type_len = 8;
    rc = query(&ev, &out, &out_len, err, sizeof err);
    CHECK(rc == QRPC_ERR_BADARG && strcmp(err, "bad command: resp_type: only for UNARY") == 0,
          "query: resp_type on an EVENT -> %d \"%s\"", rc, err);
    q.op = QRPC_OP_METRICS;
    rc = p_submit_async(&q);
    CHECK(rc == QRPC_ERR_BADARG, "submit: a query op refused by qrpc_submit_async -> %d", rc);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    main_thread = pthread_self();
    if (argc == 2) {
        /* Built without -rdynamic: lua-resty-ffi's functions are not
         * visible, as in an nginx without lua-resty-ffi. */
        load(argv[1]);
        char *cfg = NULL;
        int dummy;
        int rc = p_libffi_init(cfg, &dummy);
        CHECK(rc != 0, "nosyms: libffi_init refuses without lua-resty-ffi (%d)", rc);
        char err[128];
        CHECK(p_init(err, sizeof err) == QRPC_OK, "nosyms: the built-in host still works");
        p_shutdown();
        return failures ? 1 : 0;
    }
    if (argc == 3 && strcmp(argv[1], "signals") == 0) {
        /* Signal checks only: run with QRPC_NO_SIGNAL_FORWARD=1 to see
         * them fail without the library's forwarders. */
        install_nginx_signals();
        load(argv[2]);
        qrpc_stats_t st;
        p_stats(0, &st);
        check_system("signals only", 50);
        check_signalfd("signals only", 8);
        return failures ? 1 : 0;
    }
    if (argc != 6) {
        fprintf(stderr, "usage: %s LIB ADDR CA_PEM OTHER_CA_PEM DIR\n", argv[0]);
        return 2;
    }
    size_t ca_len, other_len;
    char *ca = read_file(argv[3], &ca_len);
    char *other = read_file(argv[4], &other_len);

    install_nginx_signals();
    /* Baselines: the checks pass in a single-threaded process. */
    check_system("before loading Go", 30);
    check_signalfd("before loading Go", 10);
    check_process_signal("before loading Go", 10);

    load(argv[1]);
    qrpc_stats_t st;
    CHECK(p_stats(0, &st) == QRPC_OK, "loaded; runtime stats readable");  /* waits for the Go runtime to start */
    check_dispositions("after dlopen");
    check_system("after dlopen", 200);
    check_signalfd("after dlopen", 50);
    check_process_signal("after dlopen", 30);

    resty_host(argv[2], ca, ca_len, other, other_len);
    query_checks();
    builtin_host(argv[2], ca, ca_len, argv[5]);

    check_dispositions("after the hosts ran");
    check_system("after the hosts ran", 300);
    check_signalfd("after the hosts ran", 100);
    check_process_signal("after the hosts ran", 30);

    printf("done: %d failure(s), %d log completion(s)\n", failures, nlogs);
    return failures ? 1 : 0;
}
