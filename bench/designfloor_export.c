// The "export" design floor's host thread (designfloor_export.go): a C
// thread that makes each call inside a Go export, as an nginx thread
// that called into Go for its calls would.

#include <pthread.h>
#include "_cgo_export.h"

static void *floor_export_host(void *arg) {
	long n = (long)arg;
	for (long i = 0; i < n; i++) {
		if (floorExportCall() != 0) break;
	}
	return 0;
}

// Starts the host thread, detached: Go waits for its last call in Go,
// not in a cgo call that would hold its P.
int floor_export_start(long n) {
	pthread_t t;
	pthread_attr_t a;
	int rc = pthread_attr_init(&a);
	if (rc != 0) return rc;
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	rc = pthread_create(&t, &a, floor_export_host, (void *)n);
	pthread_attr_destroy(&a);
	return rc;
}
