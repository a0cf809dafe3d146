//go:build qrpctesthooks

package hostq

/*
#include <stdlib.h>
#include <string.h>

// Leaves n blocks of size bytes free inside the C heap: each written
// (so resident), then freed, behind a small block allocated after them
// so that the arena's top cannot give them back on its own. Returns that
// block (free it to end the hole), or NULL when malloc failed.
static void *qrpc_test_heap_hole(int n, size_t size) {
    void **b = calloc((size_t)n, sizeof *b);
    if (b == NULL) {
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        b[i] = malloc(size);
        if (b[i] != NULL) {
            memset(b[i], 1, size);
        }
    }
    void *pin = malloc(64);
    for (int i = 0; i < n; i++) {
        free(b[i]);
    }
    free(b);
    return pin;
}
*/
import "C"

import "unsafe"

// heapHole frees n written blocks of size bytes inside the C heap, which
// free() alone keeps (TestTrimmerGivesBackTheCHeap); free the returned
// block when done. Only a build with the qrpctesthooks tag has it.
func heapHole(n, size int) unsafe.Pointer {
	return C.qrpc_test_heap_hole(C.int(n), C.size_t(size))
}

func heapFree(p unsafe.Pointer) { C.free(p) }
