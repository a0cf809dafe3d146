// The built-in host's submit queue: see qrpc_submit_async in qrpc.h and
// submitq.h. Plain C on purpose: qrpc_submit_async runs on the nginx thread
// and must not enter Go.
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qrpc.h"
#include "submitq.h"

// Bounds the commands waiting for the submitter (memory stays bounded if
// it stalls); far above what one worker queues between two of its runs.
#define QRPC_SUBMITQ_MAX 65536

static pthread_mutex_t q_mu = PTHREAD_MUTEX_INITIALIZER;
static qrpc_qitem_t *q_head, *q_tail;
static size_t q_len;
static int q_fd = -1;      // the submitter's eventfd; -1: closed
static int q_sleeping;     // the submitter found the queue empty

static size_t field_len(const char *p, size_t n) { return p != NULL ? n : 0; }

// Copies n bytes of src to *dst and returns the copy (NULL when empty).
static const char *copy_field(char **dst, const char *src, size_t n) {
    if (src == NULL || n == 0) {
        return NULL;
    }
    char *p = *dst;
    memcpy(p, src, n);
    *dst += n;
    return p;
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
    size_t extra = method + body + hdrs + hash_key + req_type + resp_type;
    if (extra < body || extra > SIZE_MAX - sizeof(qrpc_qitem_t)) {
        return QRPC_ERR_TOOBIG;
    }
    qrpc_qitem_t *it = malloc(sizeof(qrpc_qitem_t) + extra);
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
    // Only UNARY's fields are read by Go; CONNECT's and opts are not copied.
    it->cmd.addr = NULL; it->cmd.addr_len = 0;
    it->cmd.server_name = NULL; it->cmd.server_name_len = 0;
    it->cmd.ca = NULL; it->cmd.ca_len = 0;
    it->cmd.cert = NULL; it->cmd.cert_len = 0;
    it->cmd.key = NULL; it->cmd.key_len = 0;
    it->cmd.pins = NULL; it->cmd.pins_len = 0;
    it->cmd.opts = NULL; it->cmd.opts_len = 0;

    pthread_mutex_lock(&q_mu);
    if (q_fd < 0 || q_len >= QRPC_SUBMITQ_MAX) {
        int rc = q_fd < 0 ? QRPC_ERR_CLOSED : QRPC_ERR_FULL;
        pthread_mutex_unlock(&q_mu);
        free(it);
        return rc;
    }
    if (q_tail != NULL) {
        q_tail->next = it;
    } else {
        q_head = it;
    }
    q_tail = it;
    q_len++;
    if (q_sleeping) {
        // Under the lock: set_fd(-1) cannot close the fd meanwhile.
        q_sleeping = 0;
        uint64_t one = 1;
        ssize_t n;
        do {
            n = write(q_fd, &one, sizeof one);
        } while (n < 0 && errno == EINTR);
        // EAGAIN: the counter is full, so the submitter is awake anyway.
    }
    pthread_mutex_unlock(&q_mu);
    return cmd->op == QRPC_OP_UNARY ? QRPC_PENDING : QRPC_OK;
}

void qrpc_submitq_set_fd(int fd) {
    pthread_mutex_lock(&q_mu);
    q_fd = fd;
    q_sleeping = 0;
    pthread_mutex_unlock(&q_mu);
}

qrpc_qitem_t *qrpc_submitq_take(void) {
    pthread_mutex_lock(&q_mu);
    qrpc_qitem_t *it = q_head;
    q_head = q_tail = NULL;
    q_len = 0;
    if (it == NULL) {
        q_sleeping = 1;
    }
    pthread_mutex_unlock(&q_mu);
    return it;
}
