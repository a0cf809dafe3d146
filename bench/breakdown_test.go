package main

import (
	"strings"
	"testing"
)

func TestParsePerfScriptAndComponents(t *testing.T) {
	const out = `100/100     1000000 
	    7f0ad89ed2b0 [unknown] ([unknown])

100/101     2000000 
	ffffffff813aecd3 finish_task_switch.isra.0 ([kernel.kallsyms])
	ffffffff82248b73 schedule ([kernel.kallsyms])
	ffffffff813da42a __x64_sys_epoll_pwait+0x1a ([kernel.kallsyms])
	          162f2e runtime.netpoll (/tmp/x/libffi_qrpc.so)

100/101     3000000 
	          3beb4b github.com/quic-go/quic-go.(*frameSorter).push (/tmp/x/libffi_qrpc.so)

  100/100     500000 
	          10a97a qrpc_vm_poll (/tmp/x/libffi_qrpc.so)

100/101     500000 
	          10a97a github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc.(*Pool).start (/tmp/x/libffi_qrpc.so)
`
	s, err := parsePerfScript(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 5 {
		t.Fatalf("%d samples, want 5", len(s))
	}
	want := []string{compLuaJITTraces, compKernelPrefix + "epoll_pwait", compQuic, compCQueue, compPool}
	for i, w := range want {
		if got := component(s[i].frames, s[i].main); got != w {
			t.Errorf("sample %d: %q, want %q", i, got, w)
		}
	}
	b := profile{samples: s, calls: 10}.breakdown()
	if b.total != 700 || b.main != 150 {
		t.Errorf("total %v µs, main %v µs per call; want 700, 150", b.total, b.main)
	}
	if svg := string(flameSVG("t", profile{samples: s, calls: 10})); !strings.Contains(svg, "frameSorter") || !strings.HasSuffix(svg, "</svg>\n") {
		t.Errorf("flame graph lacks a frame or its end:\n%s", svg)
	}
}

func TestParseJITV(t *testing.T) {
	st := parseJITV(`[TRACE   1 bench_common.lua:50 loop]
[TRACE --- host_builtin.lua:263 -- inner loop in root trace at host_builtin.lua:277]
[TRACE   2 (1/3) host_builtin.lua:300 -> 1]
[TRACE --- host_builtin.lua:263 -- inner loop in root trace at host_builtin.lua:277]
`)
	if st.compiled != 2 || len(st.aborts) != 2 {
		t.Fatalf("%+v", st)
	}
	if s := st.summary(); len(s) != 1 || !strings.HasSuffix(s[0], "(2×)") {
		t.Errorf("summary %q", s)
	}
}
