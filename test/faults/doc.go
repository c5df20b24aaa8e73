// Package faults is ferry's fault campaign: real `ferry agent` processes
// against real CRI-O, udev and peers, hurt on purpose — kill -9 at random
// points of extraction, fetch and load; a stick pulled mid-read; CRI-O
// stopped mid-load; the disk filling up; a peer serving wrong bytes; the
// config dirs unwritable — and after each, the node checked: it is
// unchanged or it converges to the bundle with the right digest, never a
// broken crio drop-in, never a half-extracted dir taken as good, nothing
// pinned that was not verified.
//
// The tests carry the build tag "faults" so that `go test ./...` does not
// run them; `make faults` (test/faults/run.sh) does:
//
//	go test -tags faults -count=1 -v -timeout 40m ./test/faults
//
// Each case prints one summary line, "kill-extract: 20/20 passed". They
// need root and what test/setup/install-deps.sh and build-crio.sh install.
package faults
