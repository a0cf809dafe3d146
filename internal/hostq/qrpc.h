/*
 * libffi_qrpc.so: the C ABI between Lua (LuaJIT FFI) and the Go runtime.
 *
 * This header is the contract. lua/resty/ffi/qrpc/abi.lua declares the same
 * types and functions in ffi.cdef (keep them in sync: a test compares them).
 * It lives beside the C queues that implement the built-in host's half of
 * it (internal/hostq), so that nothing below ffi/ reaches up for it; make
 * install and the rockspec install it as <prefix>/include/qrpc.h.
 * All integers are native-endian (the library and nginx share a process).
 *
 * Ownership, in one rule: every pointer passed INTO the library is borrowed
 * and only read while the command is being accepted (built-in host: until
 * qrpc_submit_async or qrpc_query returns; lua-resty-ffi host: until the
 * task is answered). Every buffer passed OUT of the library
 * (qrpc_completion_t.data, qrpc_query's answer, the lua-resty-ffi
 * response) comes from malloc and belongs to the receiver, who frees it
 * with free() or, on the built-in host, qrpc_release() / qrpc_release_n(),
 * which keep blocks for reuse.
 */
#ifndef QRPC_FFI_H
#define QRPC_FFI_H

#include <stddef.h>
#include <stdint.h>

/* qrpc_cmd_t.op */
#define QRPC_OP_CONNECT 1 /* dial; completes with a connection handle */
#define QRPC_OP_UNARY   2 /* request/response; completes with a result blob */
#define QRPC_OP_EVENT   3 /* one-way; accepted or refused synchronously (built-in host: qrpc_query) */
#define QRPC_OP_CLOSE   4 /* close a connection; synchronous (built-in host: qrpc_query) */
#define QRPC_OP_CANCEL  5 /* forget call_id (built-in host); no completion */
#define QRPC_OP_ECHO    6 /* completes with body, no network: the IPC benchmark (bench/) times the
                             hand-off every call makes with it, so it ships in the library it measures */
/* 7 is no op (refused): the ops after it keep their numbers. A connection's
 * counters are qrpc_stats's. */

/* Query ops: only for qrpc_query (synchronous, any host). An op this
 * library does not implement fails with QRPC_ERR_BADARG "unsupported op N". */
#define QRPC_OP_PEERS      8  /* conn -> a record block: per server of that pool PEER_ADDR, then
                                 PEER_STATE, PEER_INFLIGHT, PEER_CALLS, PEER_FAILURES,
                                 PEER_EJECTED_UNTIL_MS, PEER_STALLED; conn 0 -> CONNECTIONS */
#define QRPC_OP_METRICS    9  /* method "": this worker's figures, Prometheus text; "snapshot": the same as
                                 records (SAMPLE_SERIES, then SAMPLE_COUNTER or SAMPLE_GAUGE); "render":
                                 body = records of SAMPLE_SERIES and SAMPLE_COUNTER (a dict's sums) ->
                                 Prometheus text */
#define QRPC_OP_PROTO_LOAD 10 /* body = .proto path or descriptor-set bytes;
                                 method = "file" | "descriptor_set";
                                 opts = IMPORT_PATH records */
#define QRPC_OP_CONFIGURE  11 /* opts GOMAXPROCS, METRICS (1|0: pools dialled later); none: only ask;
                                 answers the settings in force: GOMAXPROCS, METRICS, SYSMON records */
#define QRPC_OP_PROFILE    12 /* a pprof profile (gzipped protobuf, for go tool pprof) of this worker's
                                 Go runtime: opts PROFILE_KIND heap|allocs|goroutine|threadcreate;
                                 PROFILE_KIND cpu + PROFILE_SECONDS N starts the CPU profile (answers
                                 nothing; it stops by itself N+5 s later), PROFILE_KIND cpu-stop stops
                                 it and answers it */
#define QRPC_OP_PROTO_DESCRIBE 13 /* body = .proto path, method = "file", opts as PROTO_LOAD: loads it if
                                     needed and answers JSON: services, google.api.http rules, messages */
#define QRPC_OP_POOL_SHARE 14 /* conn, opts = a binary record of the other workers' verdicts (and roles,
                                 resolved list) -> this worker's own, same form: internal/bridge/share.go.
                                 The built-in host may also queue it (qrpc_submit_async): the answer
                                 then comes as a QRPC_SHARE completion with the command's call_id
                                 (code 1: data = the answer; code 2: the step failed, data = the
                                 message); a malformed command, or one that panics, completes with
                                 an error status instead, as any other */

/* qrpc_cmd_t.flags */
#define QRPC_F_DISCARD_UNKNOWN 1 /* req_type: ignore unknown JSON fields */
#define QRPC_F_PROTO_NAMES     2 /* resp_type: JSON field names as in the .proto (user_name), not lowerCamelCase */
#define QRPC_F_LUA_TABLE       4 /* resp_type: the reply is a NUL byte then the value in LuaJIT's
                                    string.buffer serialization format (decoding gives what cjson.decode
                                    gives for the JSON), not JSON text; a reply the format cannot hold
                                    (nested more than 100 levels, a key twice) is QRPC_BAD_RESPONSE */
#define QRPC_F_LUA_REQUEST     8 /* req_type: the body is a Lua table in LuaJIT's string.buffer serialization
                                    format (buffer.encode), not JSON text */
#define QRPC_F_EMIT_UNPOPULATED 16 /* resp_type: fields that hold their zero value are in the answer */

/* Status codes: the return value of qrpc_submit_async and qrpc_query,
 * qrpc_completion_t.status and the lua-resty-ffi rc. Negative values are
 * errors; the message is in the completion data / qrpc_query's error
 * buffer / the response (qrpc_submit_async's own refusals have none). */
#define QRPC_OK           0
#define QRPC_PENDING      1  /* qrpc_submit_async: accepted, a completion will follow */
#define QRPC_LOG          2  /* completion carrying a log line (code = level) */
#define QRPC_BAD_RESPONSE 3  /* UNARY with resp_type: the answer did not decode as that message;
                                data = [uint32 msg_len][msg][result blob with the raw body] */
#define QRPC_SHARE        4  /* completion of a shared pool (handle = the pool's connection): code 0
                                asks for a step (it has verdicts to publish, QRPC_OP_POOL_SHARE);
                                codes 1 and 2 answer a queued QRPC_OP_POOL_SHARE */
#define QRPC_ERR         -1  /* anything else; read the message */
#define QRPC_ERR_TIMEOUT -2  /* "timeout" */
#define QRPC_ERR_CLOSED  -3  /* "closed": connection or runtime closed */
#define QRPC_ERR_FULL    -4  /* "queue full" */
#define QRPC_ERR_BADARG  -5  /* malformed command (a bug in the caller) */
#define QRPC_ERR_CONNECT -6  /* "connect: <reason>" */
#define QRPC_ERR_UNAVAIL -7  /* "unavailable: <reason>" (re-dialling) */
#define QRPC_ERR_TOOBIG  -8  /* "too large: ..." */
#define QRPC_ERR_LOST    -9  /* "connection lost: ..." while in flight */

/* One command, the same for both hosts. Unused fields are zero: a
 * version 2 field set on an op that does not read it is refused
 * (QRPC_ERR_BADARG), as are unknown flags and a vm of QRPC_MAX_VMS or more.
 * Strings are (pointer, length); they need not be NUL-terminated.
 * hdrs is a packed block of alternating key, value entries, each
 * [uint32 length][bytes]; nhdrs counts entries (keys + values). */
typedef struct {
    uint32_t    version;     /* QRPC_CMD_VERSION */
    uint32_t    op;
    uint64_t    conn;        /* connection handle (UNARY, EVENT, CLOSE, CANCEL, STATS) */
    uint64_t    call_id;     /* chosen by Lua, echoed in the completion (built-in host) */
    int32_t     timeout_ms;  /* UNARY: call deadline; CONNECT: dial timeout; 0 = default */
    uint32_t    nhdrs;
    const char *method;  size_t method_len;
    const char *body;    size_t body_len;
    const char *hdrs;    size_t hdrs_len;
    /* CONNECT only */
    const char *addr;        size_t addr_len;
    const char *server_name; size_t server_name_len;
    const char *ca;          size_t ca_len;     /* PEM */
    const char *cert;        size_t cert_len;   /* PEM */
    const char *key;         size_t key_len;    /* PEM */
    const char *pins;        size_t pins_len;   /* n x 32 raw SHA-256 SPKI digests */
    int32_t     insecure;
    int32_t     conns;
    int32_t     streams;
    int32_t     idle_timeout_ms;
    int32_t     max_frame_size;
    int32_t     retries;     /* UNARY: extra attempts on other servers for calls that may
                                have run (opt-in), 0..16; 0 = none */
    /* version 2 */
    const char *hash_key;    size_t hash_key_len;   /* UNARY/EVENT: key for balance = "hash" (<= 64 KiB) */
    const char *req_type;    size_t req_type_len;   /* UNARY/EVENT: body is JSON for this protobuf
                                                       message: encoded before sending (<= 1024) */
    const char *resp_type;   size_t resp_type_len;  /* UNARY: the response body is decoded as this
                                                       message, to JSON (<= 1024) */
    uint32_t    flags;       /* QRPC_F_* */
    uint32_t    vm;          /* built-in host: the Lua VM (qrpc_vm_open) whose queue gets
                                this command's completion; 0 = the first VM. The
                                lua-resty-ffi host ignores it */
    const char *opts;        size_t opts_len;       /* CONNECT: pool options; UNARY: per-call pool
                                                       options; query ops: their options; a record
                                                       block (below, <= 64 KiB) */
} qrpc_cmd_t;

/* A record block (qrpc_cmd_t.opts, the answers of PEERS and CONFIGURE) is
 * a run of records, each
 *   [uint16 key][uint32 length][length bytes of value]
 * native-endian, unaligned. A value is a string's bytes, or an int64 or a
 * float64 (length 8), as its key's type says. The keys and their types
 * are numbered once in internal/schema (WireKeys) and generated into
 * lua/resty/ffi/qrpc/wire_keys.lua and internal/bridge/wire_keys.go; an
 * unknown key, a number whose length is not 8 or a block that ends inside
 * a record is refused (QRPC_ERR_BADARG), never guessed at. */

/* The version of this interface: qrpc_cmd_t's layout, the record blocks'
 * keys, the result blob's and the error messages' (5: options and query
 * answers are record blocks; an error message is
 * err [ 0x1f detail 0x1f attempts 0x1f budget ]: err the word or
 * "word: reason" a caller compares, detail the library's own text,
 * attempts a pool call's count, budget "1" when the retry budget refused a
 * retry; a message with none of the three is err alone). A caller built
 * for another one gets QRPC_ERR_BADARG "version N, this library speaks M"
 * for every command, never a misread answer. */
#define QRPC_CMD_VERSION 5

/* How many Lua VMs one process's built-in host serves (qrpc_vm_open). */
#define QRPC_MAX_VMS 8

/* A finished command (built-in host). data is malloc'd (free with
 * qrpc_release_n / qrpc_release) or NULL; for QRPC_OK it is a result blob:
 *   [uint32 code][uint32 hdrs_len][uint32 attempts][hdrs block as in qrpc_cmd_t][body]
 * and for errors and QRPC_LOG it is the message text (len bytes).
 * attempts: for UNARY, how many attempts the call made through its pool
 * (the first, its retries and the hedged copies sent: 1 for a call its
 * first attempt answered alone); 1 for the other ops. */
#define QRPC_RESULT_HEAD 12 /* bytes of a result blob before its hdrs block */
typedef struct {
    uint64_t call_id;
    uint64_t handle;   /* CONNECT: the new connection's handle */
    int32_t  status;
    uint32_t code;     /* QRPC_LOG: nginx log level (NGX_LOG_ERR = 4, ...) */
    char    *data;
    size_t   len;
} qrpc_completion_t;

/* Built-in host. Call only from the nginx worker thread. */

/* Starts the runtime once per process (later calls are no-ops returning 0).
 * Returns a status; on error, writes a NUL-terminated message to err. */
int qrpc_init(char *err, size_t err_len);

/* Records this copy of the library in the process's QRPC_LIBRARY
 * environment variable, or fails (with a message in err) when another
 * copy of it runs in the process: one Go runtime per process. The Lua
 * loader calls it right after loading the file; qrpc_init checks too. */
int qrpc_claim(char *err, size_t err_len);

/* Registers a Lua VM of this process by name (the nginx subsystem of
 * ngx_http_lua or ngx_stream_lua: "http", "stream"): each VM gets a
 * completion queue and a wake-up socket of its own, so that no VM takes
 * another's completions. token tells one Lua VM from another (any value
 * of the caller's, not 0): a name registers once per process, and the
 * same name with another token is refused (lua_code_cache off gives each
 * request a VM of its own, which would take over the first one's queue);
 * token 0 skips the check. Returns the VM's index (0 .. QRPC_MAX_VMS-1;
 * the same index again for a name already registered; the first name gets
 * 0), or a negative status with a message in err. Commands carry the
 * index in qrpc_cmd_t.vm. */
int qrpc_vm_open(const char *name, size_t name_len, uint64_t token, char *err, size_t err_len);

/* Creates a fresh wake-up socket for VM vm at dir/qrpc-<pid>-<n>.sock,
 * owned by the worker's user, writes its path (NUL-terminated) into path.
 * The library unlinks the file as soon as one client has connected, so
 * nothing is left on disk; call again if the dispatcher must reconnect. */
int qrpc_vm_wake_open(int vm, const char *dir, size_t dir_len, char *path,
                      size_t path_len, char *err, size_t err_len);

/* The built-in host has one way in and one way out, both plain C that
 * never enter the Go runtime: a thread that has called into Go keeps a Go
 * scheduler slot while it runs nginx, and Go then spends more CPU on its
 * scheduler than on the call.
 *
 * qrpc_submit_async queues a CONNECT, UNARY, ECHO, POOL_SHARE or CANCEL command
 * and returns at once: it copies the command and its strings (addr to
 * pins for CONNECT only; the other ops never read them), and wakes the
 * library's submitter only when it sleeps. Returns
 * QRPC_PENDING (a completion with cmd->call_id follows; every failure, bad
 * arguments included, then comes as that completion, with its status and
 * message; CONNECT's carries the new handle), QRPC_OK for CANCEL (no
 * completion), QRPC_ERR_CLOSED when the host is not open, QRPC_ERR_FULL
 * when too many commands wait, QRPC_ERR_BADARG for other ops and for a
 * cmd->vm that qrpc_vm_open did not return (VM 0 is always open). Commands run
 * in the order queued. Connections are not cached here: the Lua module
 * reuses its handles. */
int qrpc_submit_async(const qrpc_cmd_t *cmd);

/* Moves up to max finished commands of VM vm's queue into out; returns
 * how many (0 for a VM that is not open). */
int qrpc_vm_poll(int vm, qrpc_completion_t *out, int max);

/* Frees a block the library handed out (a completion's data, qrpc_query's
 * answer): small ones are kept for the next results and commands, big
 * ones go back to the library's buffer cache. */
void qrpc_release(void *p);

/* qrpc_release of ps[0..n) (NULL entries skipped), under one lock: what a
 * dispatcher calls once per qrpc_vm_poll batch. */
void qrpc_release_n(void *const *ps, int n);

/* How many calls entered Go through this library's exports so far (this
 * one not counted): diagnostics, and the tests that check that the
 * built-in host's hot path stays in C. */
uint64_t qrpc_go_entries(void);

/* How many calls Go has made into C so far (runtime.NumCgoCall): the
 * built-in host's steady hot path makes none, as a cgo call after Go was
 * idle wakes Go's sysmon thread (hostq.c). For tests and diagnostics. */
uint64_t qrpc_go_cgo_calls(void);

/* Counters of one connection (or, with conn = 0, of the whole runtime). */
typedef struct {
    uint64_t inflight;   /* calls sent and not yet finished */
    uint64_t calls;      /* unary calls started */
    uint64_t events;     /* events sent */
    uint64_t dropped;    /* events refused ("queue full") */
    uint64_t reconnects; /* connections re-established */
    uint64_t queued;     /* completions waiting to be drained */
} qrpc_stats_t;

/* Fills out; returns QRPC_OK or QRPC_ERR_CLOSED for an unknown handle. */
int qrpc_stats(uint64_t conn, qrpc_stats_t *out);

/* Runs a command now, on the calling thread, entering Go: a query op
 * (QRPC_OP_PEERS and above; any host may call it), or the built-in host's
 * EVENT and CLOSE. Those two stay synchronous because conn:event and
 * conn:close return their errors ("queue full", "closed", a bad argument)
 * to the caller at once, where a queued command could only answer with a
 * completion to wait for; an event is written to its stream right here,
 * so it costs no hand-off either. On QRPC_OK, *out is a malloc'd blob
 * of *out_len bytes (possibly 0, NULL for EVENT and CLOSE; free it with
 * qrpc_release) whose format is the op's. Otherwise *out is NULL and err
 * holds the message (NUL-terminated). Other ops are refused
 * (QRPC_ERR_BADARG): they go through qrpc_submit_async. */
int qrpc_query(const qrpc_cmd_t *cmd, char **out, size_t *out_len, char *err, size_t err_len);

/* Test builds (-tags qrpctesthooks) also export void qrpc_shutdown(void):
 * it fails pending calls, closes connections and the wake socket (no host
 * stops the runtime: a worker's lives as long as the worker). */

/* lua-resty-ffi host: see design notes. cfg may be NULL, or space/comma
 * separated key=value pairs (only log_level=debug|info|warn|error).
 * Each task's request is exactly one qrpc_cmd_t (sizeof bytes); each task
 * is answered exactly once:
 *   rc 0, UNARY/ECHO/STATS: a result blob as in qrpc_completion_t;
 *   rc 0, CONNECT: 8 bytes, the handle (native-endian uint64_t);
 *   rc 0, EVENT/CLOSE/CANCEL: no data (CANCEL does nothing: the caller is
 *         parked on its own task, and every UNARY has a deadline in Go);
 *   rc < 0: the status, with the message as data. */
int libffi_init(char *cfg, void *tq);

#endif
