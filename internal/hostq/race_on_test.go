//go:build race

package hostq

// raceEnabled: the race detector slows each side of the submit queue by
// different factors, which changes how the threads take turns; scheduling
// outcomes are not checked under it.
const raceEnabled = true
