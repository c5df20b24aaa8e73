// Package journaldtest checks systemd.NewLogger end to end over journald's
// native protocol: the test plays journald, listening on its socket
// (/run/systemd/journal/socket) with stderr declared a journal stream, and
// reads the datagrams the logger sends.
//
// Needs root (to create the socket) and no journald running (its socket
// must be free). About 0.1 s.
package journaldtest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/systemd"
)

const socketPath = "/run/systemd/journal/socket"

func need(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// fakeJournald listens where journald does, and declares stderr a journal
// stream (JOURNAL_STREAM = its device:inode), as systemd does for a
// service whose output goes to the journal.
func fakeJournald(t *testing.T) *net.UnixConn {
	t.Helper()
	if os.Geteuid() != 0 {
		need(t, "needs root to create "+socketPath)
	}
	if _, err := os.Stat(socketPath); err == nil {
		need(t, "a journald runs here; its socket is not ours to take over (run this test where none runs, as CI does)")
	}
	for _, d := range []string{"/run/systemd", "/run/systemd/journal"} {
		if err := os.Mkdir(d, 0o755); err == nil {
			t.Cleanup(func() { os.Remove(d) }) // only if we made it; runs after the socket's removal
		} else if !errors.Is(err, os.ErrExist) {
			t.Fatal(err)
		}
	}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: socketPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); os.Remove(socketPath) })
	var st syscall.Stat_t
	if err := syscall.Fstat(2, &st); err != nil {
		t.Fatal(err)
	}
	t.Setenv("JOURNAL_STREAM", fmt.Sprintf("%d:%d", st.Dev, st.Ino))
	return conn
}

// readEntry reads one native-protocol datagram: KEY=VALUE lines, or KEY,
// newline, little-endian 64-bit length, value, newline for values with
// newlines.
func readEntry(t *testing.T, conn *net.UnixConn) map[string]string {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 1<<16)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatalf("no journal entry: %v", err)
	}
	b := buf[:n]
	out := map[string]string{}
	for len(b) > 0 {
		line, rest, _ := bytes.Cut(b, []byte("\n"))
		if k, v, ok := bytes.Cut(line, []byte("=")); ok {
			out[string(k)] = string(v)
			b = rest
			continue
		}
		if len(rest) < 8 {
			t.Fatalf("truncated binary field %q", line)
		}
		size := binary.LittleEndian.Uint64(rest[:8])
		if uint64(len(rest)) < 8+size+1 {
			t.Fatalf("truncated binary field %q", line)
		}
		out[string(line)] = string(rest[8 : 8+size])
		b = rest[8+size+1:]
	}
	return out
}

func TestNewLogger_SendsFieldsToJournald(t *testing.T) {
	conn := fakeJournald(t)
	log := systemd.NewLogger(slog.LevelInfo).With("bundle", "upgrade-4.13.7-x86_64.tar")
	log.Debug("not sent")
	log.Error("rejected bundle", "phase", "rejected", "digest", "sha256:3f00",
		"device", "/dev/sdb1", "err", errors.New("sha256 mismatch\ncopy the bundle again"))

	e := readEntry(t, conn)
	want := map[string]string{
		"PRIORITY":          "3",
		"SYSLOG_IDENTIFIER": "ferry",
		"PHASE":             "rejected",
		"BUNDLE":            "upgrade-4.13.7-x86_64.tar",
		"DIGEST":            "sha256:3f00",
		"DEVICE":            "/dev/sdb1",
		"ERR":               "sha256 mismatch\ncopy the bundle again",
	}
	for k, v := range want {
		if e[k] != v {
			t.Errorf("%s = %q, want %q", k, e[k], v)
		}
	}
	if !strings.HasPrefix(e["MESSAGE"], "rejected bundle bundle=upgrade-4.13.7-x86_64.tar phase=rejected") {
		t.Errorf("MESSAGE = %q", e["MESSAGE"])
	}
	if !strings.HasSuffix(e["CODE_FILE"], "journald_test.go") {
		t.Errorf("CODE_FILE = %q, want this file", e["CODE_FILE"])
	}
}
