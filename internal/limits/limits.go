// Package limits holds the bounds that both sides of the library check:
// Lua checks them first, so that a caller gets "bad argument #N: ..."
// before anything reaches Go, and Go checks them again, so that no caller
// of the C ABI can pass nonsense. The Lua copy,
// lua/resty/ffi/qrpc/limits.lua, is generated from this file (make
// limits); make lint and this package's test fail when the two differ.
package limits

// The bounds, by the name limits.lua gives them.
const (
	Conns          = 64      // connect's conns
	Streams        = 1024    // connect's streams
	StreamBatch    = 1024    // connect's stream_batch
	MinFrameSize   = 64      // connect's max_frame_size, lower bound
	MaxFrameSize   = 1 << 30 // connect's max_frame_size, upper bound
	MS             = 1<<31 - 1
	Retries        = 16      // retries (connect and per call)
	Hedge          = 4       // hedge.max
	BudgetMinPerS  = 100000  // budget.min_per_s
	Addrs          = 256     // servers of a pool
	HeaderEntries  = 1 << 16 // names + values of a call's headers
	TypeName       = 1024    // request / response type names, in bytes
	HashKey        = 64 << 10
	GOMAXPROCS     = 1024 // configure's gomaxprocs
	ProfileSeconds = 300  // qrpc.profile's seconds
)

// Lua lists the bounds under the names limits.lua gives them, in the
// order it lists them.
var Lua = []struct {
	Name  string
	Value int64
}{
	{"CONNS", Conns},
	{"STREAMS", Streams},
	{"STREAM_BATCH", StreamBatch},
	{"MIN_FRAME_SIZE", MinFrameSize},
	{"MAX_FRAME_SIZE", MaxFrameSize},
	{"MS", MS},
	{"RETRIES", Retries},
	{"HEDGE", Hedge},
	{"BUDGET_MIN_PER_S", BudgetMinPerS},
	{"ADDRS", Addrs},
	{"HEADER_ENTRIES", HeaderEntries},
	{"TYPE_NAME", TypeName},
	{"HASH_KEY", HashKey},
	{"GOMAXPROCS", GOMAXPROCS},
	{"PROFILE_SECONDS", ProfileSeconds},
}
