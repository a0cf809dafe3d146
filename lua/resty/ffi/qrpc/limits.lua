-- resty.ffi.qrpc.limits: the bounds Lua checks before Go checks them
-- again. Generated from internal/limits/limits.go by "make limits": do not
-- edit (make lint fails when the two differ).

return {
    CONNS = 64,
    STREAMS = 1024,
    STREAM_BATCH = 1024,
    MIN_FRAME_SIZE = 64,
    MAX_FRAME_SIZE = 1073741824,
    MS = 2147483647,
    RETRIES = 16,
    HEDGE = 4,
    BUDGET_MIN_PER_S = 100000,
    ADDRS = 256,
    HEADER_ENTRIES = 65536,
    TYPE_NAME = 1024,
    HASH_KEY = 65536,
    GOMAXPROCS = 1024,
    PROFILE_SECONDS = 300,
    -- Go's defaults (qrpc.Config), for the connection cache
    DEFAULT_CONNS = 1,
    DEFAULT_STREAMS = 32,
    DEFAULT_STREAM_BATCH = 16,
    DEFAULT_TIMEOUT_MS = 5000,
    DEFAULT_IDLE_TIMEOUT_MS = 30000,
    DEFAULT_MAX_FRAME_SIZE = 16777216,
}
