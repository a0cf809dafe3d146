package nginx

import "testing"

// TestStreamBatch: connect's stream_batch reaches Go. The server answers
// "stream" with the id of the QUIC stream a call came on; 32 sequential
// calls over 4 streams then run on one stream stream_batch at a time (the
// first batch one short: the counter starts before it), 1 moves on every
// call, and the default keeps 16 on one. Each value is a connection of its
// own.
func TestStreamBatch(t *testing.T) {
	runBlocks(t, []block{{
		name: "stream_batch",
		conf: ngxConf{Workers: 1, Server: loc("/t", `
                local qt = require "qtest"
                local function spread(o)
                    local c = assert(qt.connect(o))
                    local lens, seen, last = {}, {}, nil
                    for _ = 1, 32 do
                        local id = assert(c:unary("stream", "")).body
                        if id ~= last then
                            lens[#lens + 1] = 0
                            last = id
                        end
                        lens[#lens] = lens[#lens] + 1
                        seen[id] = true
                    end
                    local n = 0
                    for _ in pairs(seen) do n = n + 1 end
                    ngx.say(table.concat(lens, ","), " on ", n, " streams")
                    return c
                end
                local c1 = spread({ streams = 4, stream_batch = 1 })
                local c8 = spread({ streams = 4, stream_batch = 8 })
                local cd = spread({ streams = 4 })
                local cd2 = assert(qt.connect({ streams = 4, stream_batch = 16 }))
                ngx.say(c1 ~= c8, " ", c8 ~= cd, " ", cd == cd2)`)},
		body: lines(
			"1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1 on 4 streams",
			"7,8,8,8,1 on 4 streams",
			"15,16,1 on 3 streams",
			"true true true",
		),
	}})
}
