package safefile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const secret = "root:$y$SECRET-MARKER:19000:0:99999:7:::"

// stick is a directory laid out as a crafted stick would be, next to a
// host file holding a secret.
func stick(t *testing.T) *os.File {
	t.Helper()
	host := filepath.Join(t.TempDir(), "shadow")
	if err := os.WriteFile(host, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, "good.sha256"), []byte("ok\n"), 0o644))
	must(os.WriteFile(filepath.Join(dir, "big.minisig"), make([]byte, 5000), 0o644))
	must(os.Symlink(host, filepath.Join(dir, "link.sha256")))
	must(os.Symlink("good.sha256", filepath.Join(dir, "relative-link.sha256")))
	must(unix.Mkfifo(filepath.Join(dir, "fifo.tar"), 0o644))
	must(os.Mkdir(filepath.Join(dir, "dir.tar"), 0o755))
	d, err := os.Open(dir)
	must(err)
	t.Cleanup(func() { d.Close() })
	return d
}

func TestOpenBeneath(t *testing.T) {
	for _, fallback := range []bool{false, true} {
		name := "openat2"
		if fallback {
			name = "openat fallback (no openat2)"
		}
		t.Run(name, func(t *testing.T) {
			if fallback {
				old := openat2
				openat2 = func(int, string, *unix.OpenHow) (int, error) { return -1, unix.ENOSYS }
				t.Cleanup(func() { openat2 = old })
			}
			dir := stick(t)
			tests := []struct {
				name    string
				wantErr error
				says    string
			}{
				{"good.sha256", nil, ""},
				{"link.sha256", ErrNotRegular, "symbolic link"},
				{"relative-link.sha256", ErrNotRegular, "symbolic link"},
				{"fifo.tar", ErrNotRegular, "a FIFO"},
				{"dir.tar", ErrNotRegular, "a directory"},
				{"../etc/shadow", ErrNotRegular, "not a name"},
				{"..", ErrNotRegular, "not a name"},
				{"missing.tar", os.ErrNotExist, ""},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					done := make(chan struct{})
					var f *os.File
					var err error
					go func() { defer close(done); f, err = OpenBeneath(dir, tt.name) }()
					select {
					case <-done:
					case <-time.After(10 * time.Second):
						t.Fatal("OpenBeneath blocked")
					}
					if tt.wantErr == nil {
						if err != nil {
							t.Fatal(err)
						}
						defer f.Close()
						b, err := ReadAll(f, tt.name, 4<<10)
						if err != nil || string(b) != "ok\n" {
							t.Fatalf("read %q, %v", b, err)
						}
						return
					}
					if f != nil {
						f.Close()
					}
					if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.says) {
						t.Fatalf("err = %v, want %v saying %q", err, tt.wantErr, tt.says)
					}
					if strings.Contains(err.Error(), "SECRET-MARKER") {
						t.Fatalf("the error echoes the host file: %v", err)
					}
				})
			}
		})
	}
}

func TestReadAll_RefusesOverTheCap(t *testing.T) {
	dir := stick(t)
	f, err := OpenBeneath(dir, "big.minisig")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := ReadAll(f, "big.minisig", 4<<10); !errors.Is(err, ErrTooBig) {
		t.Fatalf("err = %v, want ErrTooBig", err)
	}
}

func TestReadFile_RefusesDevicesAndFIFOsWithoutReading(t *testing.T) {
	if _, err := ReadFile("/dev/zero", 4<<10); !errors.Is(err, ErrNotRegular) {
		t.Errorf("/dev/zero: err = %v, want ErrNotRegular", err)
	}
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := ReadFile(fifo, 4<<10); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrNotRegular) {
			t.Errorf("FIFO: err = %v, want ErrNotRegular", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ReadFile blocked on a FIFO")
	}
	big := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(big, make([]byte, 4097), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(big, 4<<10); !errors.Is(err, ErrTooBig) {
		t.Errorf("big file: err = %v, want ErrTooBig", err)
	}
	if b, err := ReadFile(big, 8<<10); err != nil || len(b) != 4097 {
		t.Errorf("under the cap: %d bytes, %v", len(b), err)
	}
}

// A file whose fstat size lies (a growing file, a procfs-like file) is
// still read no further than the cap.
func TestReadAll_NeverReadsPastTheCap(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	go func() { w.Write(make([]byte, 64<<10)); w.Close() }()
	if _, err := ReadAll(r, "pipe", 4<<10); !errors.Is(err, ErrTooBig) {
		t.Fatalf("err = %v, want ErrTooBig", err)
	}
}
