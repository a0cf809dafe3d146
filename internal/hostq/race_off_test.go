//go:build !race

package hostq

const raceEnabled = false
