package machine

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/cluster"
)

// The machine's words without fmt say what fmt said.
func TestText_AsFmt(t *testing.T) {
	for _, n := range []int64{0, 7, -3, 1 << 40} {
		if got, want := itoa(n), fmt.Sprintf("%d", n); got != want {
			t.Errorf("itoa(%d) = %s, fmt says %s", n, got, want)
		}
	}
	for _, f := range []float64{0, 6.66, 15.95, 1.25, 1023.99} {
		if got, want := oneDecimal(f), fmt.Sprintf("%.1f", f); got != want {
			t.Errorf("oneDecimal(%v) = %s, fmt says %s", f, got, want)
		}
	}
	for _, err := range []error{nil, errors.New("EOF")} {
		if got, want := errText(err), fmt.Sprintf("%v", err); got != want {
			t.Errorf("errText(%v) = %s, fmt says %s", err, got, want)
		}
	}
	for _, m := range []map[string]string{nil, {"w2": "why", "w1": "not ready"}} {
		if got, want := mapText(m), fmt.Sprint(m); got != want {
			t.Errorf("mapText = %s, fmt says %s", got, want)
		}
	}
	for _, a := range [][]cluster.Approval{nil, {{Bundle: "4.19.8-x86-64", Digest: "sha256:aa"}, {Bundle: "b", Digest: ""}}} {
		if got, want := approvalsText(a), fmt.Sprint(a); got != want {
			t.Errorf("approvalsText = %s, fmt says %s", got, want)
		}
	}
	for _, s := range []string{"3/5", "0/0", "", "x/2", "4/"} {
		var r, w int
		fmt.Sscanf(s, "%d/%d", &r, &w)
		if gr, gw := readyOf(s); gr != r || gw != w {
			t.Errorf("readyOf(%q) = %d, %d; Sscanf says %d, %d", s, gr, gw, r, w)
		}
	}
	base := errors.New("invalid bundle")
	if err := wrap(base, "cleanup of x: "+base.Error()); !errors.Is(err, base) || err.Error() != fmt.Errorf("cleanup of x: %w", base).Error() {
		t.Errorf("wrap = %v", err)
	}
	if got, want := warningsPointer(2), fmt.Sprintf("WARNING: %d standing warning(s), see ferry status", 2); got != want {
		t.Errorf("warningsPointer(2) = %s", got)
	}
}

// withLog writes the lines slog.Logger.With writes.
func TestWithLog_AsSlogWith(t *testing.T) {
	var got, want bytes.Buffer
	opts := &slog.HandlerOptions{Level: slog.LevelDebug, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}
	mine, theirs := slog.New(slog.NewTextHandler(&got, opts)), slog.New(slog.NewTextHandler(&want, opts))
	l := withLog(withLog(mine, "device", "/dev/sdb"), "bundle", "upgrade-4.19.8-x86_64.tar")
	s := theirs.With("device", "/dev/sdb").With("bundle", "upgrade-4.19.8-x86_64.tar")
	l.Debug("d", "err", errors.New("x"))
	s.Debug("d", "err", errors.New("x"))
	l.Info("i", "phase", string(PhaseDetected), "took", time.Second)
	s.Info("i", "phase", string(PhaseDetected), "took", time.Second)
	l.Warn("w")
	s.Warn("w")
	l.Error("e", "n", 3)
	s.Error("e", "n", 3)
	if got.String() != want.String() {
		t.Errorf("withLog wrote\n%s\nslog's With writes\n%s", got.String(), want.String())
	}
}
