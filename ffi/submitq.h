/* The built-in host's submit queue (submitq.c): between the nginx thread,
 * which pushes with qrpc_submit_async (qrpc.h), and the Go submitter
 * (submitq.go), which takes everything queued at once. */
#ifndef QRPC_SUBMITQ_H
#define QRPC_SUBMITQ_H

#include "qrpc.h"

/* One queued command; its strings follow it in the same allocation. */
typedef struct qrpc_qitem {
    struct qrpc_qitem *next;
    qrpc_cmd_t cmd;
} qrpc_qitem_t;

/* Opens the queue with the eventfd that wakes the submitter, or closes it
 * (fd < 0): pushes then fail with QRPC_ERR_CLOSED. After it returns, the
 * old fd is no longer written to. */
void qrpc_submitq_set_fd(int fd);

/* Takes every queued item (a list in queue order, free each with free()),
 * or returns NULL and records that the submitter is about to sleep: the
 * next push writes the eventfd. */
qrpc_qitem_t *qrpc_submitq_take(void);

#endif
