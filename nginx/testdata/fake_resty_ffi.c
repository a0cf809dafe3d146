/*
 * A stand-in for lua-resty-ffi's C side, for the integration tests only.
 *
 * lua-resty-ffi needs an nginx rebuilt against its source tree, which a
 * stock Debian nginx is not. This library implements the three functions
 * a lua-resty-ffi runtime calls (looked up by libffi_qrpc.so with dlsym, so
 * it must be loaded RTLD_GLOBAL first) with the same contract, plus a few
 * fake_* functions that fake_resty_ffi.lua uses to post tasks and poll
 * for their answers. Everything else in those tests is real.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct task {
    struct task *next;
    char        *req;
    int          req_len;
    int          done;      /* atomic */
    int          responds;  /* atomic: must end at exactly 1 */
    int          rc;
    char        *rsp;
    int          rsp_len;
} task_t;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    task_t         *head, *tail;
    int             finished;
} tq_t;

void *fake_tq_new(void) {
    tq_t *q = calloc(1, sizeof *q);
    if (q == NULL) return NULL;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    return q;
}

/* Copies req, like lua-resty-ffi's post (which mallocs and copies). */
void *fake_task_post(void *tqp, const char *req, int len) {
    tq_t *q = tqp;
    task_t *t = calloc(1, sizeof *t);
    if (t == NULL) return NULL;
    t->req = malloc(len + 1);
    if (t->req == NULL) { free(t); return NULL; }
    memcpy(t->req, req, len);
    t->req[len] = 0;
    t->req_len = len;
    pthread_mutex_lock(&q->mu);
    if (q->tail) q->tail->next = t; else q->head = t;
    q->tail = t;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return t;
}

/* Makes the runtime's poll return NULL: lua-resty-ffi unloading it. */
void fake_tq_finish(void *tqp) {
    tq_t *q = tqp;
    pthread_mutex_lock(&q->mu);
    q->finished = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

void *ngx_http_lua_ffi_task_poll(void *tqp) {
    tq_t *q = tqp;
    pthread_mutex_lock(&q->mu);
    while (q->head == NULL && !q->finished) pthread_cond_wait(&q->cv, &q->mu);
    task_t *t = q->head;
    if (t != NULL) {
        q->head = t->next;
        if (q->head == NULL) q->tail = NULL;
    }
    pthread_mutex_unlock(&q->mu);
    return t;
}

char *ngx_http_lua_ffi_get_req(void *tp, int *len) {
    task_t *t = tp;
    if (len) *len = t->req_len;
    return t->req;
}

void ngx_http_lua_ffi_respond(void *tp, int rc, char *rsp, int rsp_len) {
    task_t *t = tp;
    if (__atomic_fetch_add(&t->responds, 1, __ATOMIC_ACQ_REL) != 0) {
        free(rsp); /* a second answer: counted, not applied */
        return;
    }
    if (rsp != NULL && rsp_len == 0) rsp_len = (int)strlen(rsp);
    t->rc = rc;
    t->rsp = rsp;
    t->rsp_len = rsp_len;
    __atomic_store_n(&t->done, 1, __ATOMIC_RELEASE);
}

int fake_task_done(void *tp) { return __atomic_load_n(&((task_t *)tp)->done, __ATOMIC_ACQUIRE); }
int fake_task_rc(void *tp) { return ((task_t *)tp)->rc; }
int fake_task_responds(void *tp) { return __atomic_load_n(&((task_t *)tp)->responds, __ATOMIC_ACQUIRE); }

char *fake_task_rsp(void *tp, int *len) {
    task_t *t = tp;
    *len = t->rsp_len;
    return t->rsp;
}

void fake_task_free(void *tp) {
    task_t *t = tp;
    free(t->req);
    free(t->rsp);
    free(t);
}
