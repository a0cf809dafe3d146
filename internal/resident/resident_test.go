package resident

import (
	"os"
	"testing"
)

const sample = `7f8262000000-7f8262159000 r--p 00000000 08:01 4242 /usr/local/lib/libffi_qrpc.so
Size:               1380 kB
Rss:                1380 kB
Anonymous:             0 kB
VmFlags: rd mr mw me sd
7f8262159000-7f8262715000 r-xp 00159000 08:01 4242 /usr/local/lib/libffi_qrpc.so
Size:               5872 kB
Rss:                5872 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me sd
7f8262715000-7f8262bc5000 r--p 00715000 08:01 4242 /usr/local/lib/libffi_qrpc.so
Rss:                4672 kB
Anonymous:             0 kB
7f8262bc5000-7f8262d2c000 r--p 00bc5000 08:01 4242 /usr/local/lib/libffi_qrpc.so
Rss:                1436 kB
Anonymous:          1232 kB
7f8262d2c000-7f8262d7c000 rw-p 00d2c000 08:01 4242 /usr/local/lib/libffi_qrpc.so
Rss:                 320 kB
Anonymous:           148 kB
7f8262d7c000-7f8262d80000 r--p 00d7c000 08:01 4242 /usr/local/lib/libffi_qrpc.so
Rss:                   0 kB
Anonymous:             0 kB
7f8263000000-7f8263100000 r--p 00000000 08:01 4243 /usr/local/lib/libffi_qrpc.so (deleted)
Rss:                 100 kB
Anonymous:             0 kB
7f8265244000-7f826539a000 r-xp 00028000 08:01 777 /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                1112 kB
Anonymous:             0 kB
7f8264de3000-7f8264f72000 rw-p 00000000 00:00 0 
Rss:                 980 kB
Anonymous:           980 kB
`

// TestDroppable: of the library's mappings, only the clean read-only
// ones with pages resident; never RELRO (private pages), the writable
// data, another file (libc, or a deleted copy of the library with
// another inode), or anonymous memory.
func TestDroppable(t *testing.T) {
	ms, err := parseSmaps([]byte(sample))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 9 {
		t.Fatalf("parsed %d mappings, want 9", len(ms))
	}
	got := droppable(ms, 0x7f8262200000)
	want := []uintptr{0x7f8262000000, 0x7f8262159000, 0x7f8262715000}
	if len(got) != len(want) {
		t.Fatalf("droppable: %+v, want the mappings at %x", got, want)
	}
	var kb int64
	for i, m := range got {
		if m.start != want[i] {
			t.Errorf("droppable #%d at %x, want %x", i, m.start, want[i])
		}
		kb += m.rss
	}
	if kb != 1380+5872+4672 {
		t.Errorf("droppable holds %d kB, want %d", kb, 1380+5872+4672)
	}
	if got := droppable(ms, 0x7f8264de4000); got != nil {
		t.Errorf("anonymous memory's pc gave %+v, want nothing", got)
	}
	if got := droppable(ms, 0x1000); got != nil {
		t.Errorf("an unmapped pc gave %+v, want nothing", got)
	}
}

func TestParseSmapsBad(t *testing.T) {
	for _, s := range []string{
		"zz-10 r--p 0 08:01 1 /x\n",
		"10-zz r--p 0 08:01 1 /x\n",
		"20-10 r--p 0 08:01 1 /x\n",
		"10-20 r--p 0 08:01 1 /x\nRss: x kB\n",
	} {
		if _, err := parseSmaps([]byte(s)); err == nil {
			t.Errorf("parseSmaps(%q) gave no error", s)
		}
	}
}

// ownRSS is the kB resident in this program's clean read-only mappings.
func ownRSS(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	ms, err := parseSmaps(b)
	if err != nil {
		t.Fatal(err)
	}
	var kb int64
	for _, m := range droppable(ms, self) {
		kb += m.rss
	}
	return kb
}

// TestRelease drops the test program's own read-only mappings (the code
// running this test among them): they empty, and the program runs on,
// mapping back what it touches.
func TestRelease(t *testing.T) {
	before := ownRSS(t)
	if before == 0 {
		t.Skip("no resident read-only page of the program to drop")
	}
	kb, err := Release()
	if err != nil {
		t.Fatal(err)
	}
	after := ownRSS(t)
	t.Logf("resident before %d kB, dropped %d kB, resident after (reading smaps again) %d kB", before, kb, after)
	if kb < before/2 {
		t.Errorf("dropped %d kB of %d", kb, before)
	}
	// Reading smaps again maps back the code that reads and parses it
	// (with the folios around it: about half of this small program).
	if after > before*3/4 {
		t.Errorf("still %d kB resident of %d after dropping", after, before)
	}
	// The program runs on, from the pages it maps back.
	if _, err := parseSmaps([]byte(sample)); err != nil {
		t.Fatal(err)
	}
}
