package testwait

import (
	"testing"
	"time"
)

func TestForSeesTheStateAndGivesUp(t *testing.T) {
	n := 0
	if !For(time.Minute, func() bool { n++; return n == 3 }) {
		t.Fatal("a state that comes on the third look was not seen")
	}
	if For(0, func() bool { return false }) {
		t.Fatal("a state that never comes was reported")
	}
}
