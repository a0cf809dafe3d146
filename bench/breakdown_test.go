package main

import (
	"os"
	"path/filepath"
	"strconv"
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

100/102     500000 
	          4a1b20 floor_host (/tmp/x/bench)
`
	s, err := parsePerfScript(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 6 {
		t.Fatalf("%d samples, want 6", len(s))
	}
	want := []string{compLuaJITTraces, compKernelPrefix + "epoll_pwait", compQuic, compCQueue, compPool, compGoClient}
	for i, w := range want {
		if got := component(s[i].frames, s[i].main); got != w {
			t.Errorf("sample %d: %q, want %q", i, got, w)
		}
	}
	b := profile{samples: s, calls: 10}.breakdown()
	if b.total != 750 || b.main != 150 {
		t.Errorf("total %v µs, main %v µs per call; want 750, 150", b.total, b.main)
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

// TestGoClientProfileNamesItsCode profiles the Go client's sequential
// calls as the breakdown does and checks that perf names nearly all of
// its CPU time: without a symbol table the Go client's column was 40%
// "unknown" and could not be compared with the worker's component by
// component.
func TestGoClientProfileNamesItsCode(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the bench and runs perf")
	}
	if why := perfUsable(); why != "" {
		t.Skip(why)
	}
	dir := t.TempDir()
	bin, err := symbolBinary("..", dir)
	if err != nil {
		t.Fatal(err)
	}
	ca, pair := testCA(t)
	certFile, keyFile, caFile := filepath.Join(dir, "s.crt"), filepath.Join(dir, "s.key"), filepath.Join(dir, "ca.pem")
	for f, b := range map[string][]byte{certFile: pair.CertPEM, keyFile: pair.KeyPEM, caFile: ca.CertPEM} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := startChildOf(bin, "-serve", certFile+","+keyFile)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.stop()
	e := &env{root: "..", dir: dir, qrpcAddr: srv.addr, caFile: caFile}
	data := filepath.Join(dir, "goclient.data")
	const n = 2000
	if _, err := e.goClientUnder(placement{}, []string{"perf", "record", "-F", strconv.Itoa(perfFreq), "-g", "-o", data, "--"}, n, "seq"); err != nil {
		t.Fatal(err)
	}
	s, err := readProfile(data)
	if err != nil {
		t.Fatal(err)
	}
	b := profile{samples: s, calls: n}.breakdown()
	share := b.perCall[compUnknown] / b.total
	t.Logf("%d samples, %.1f µs per call, unknown %.1f%%, Go runtime %.1f µs, quic-go %.1f µs", len(s), b.total, 100*share,
		b.perCall[compGoSched], b.perCall[compQuic])
	if share > 0.05 {
		t.Errorf("%.0f%% of the Go client's samples have no symbol (at most 5%%)", 100*share)
	}
	if b.perCall[compQuic] == 0 {
		t.Errorf("no sample in quic-go: %v", b.perCall)
	}
}
