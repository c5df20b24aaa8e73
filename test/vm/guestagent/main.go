// Command ferry-vm-agent is the guest half of the VM test harness's control
// channel. It runs as a systemd service in the test guest, reads requests
// (package ctl) from the virtio-serial port, runs each in its own goroutine
// and writes one response per request. When the host is not connected the
// port reads EOF; the agent then waits and reads again.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ferry-edge/ferry/test/vm/ctl"
)

func main() {
	log.SetFlags(0)
	path := "/dev/virtio-ports/" + ctl.PortName
	port, err := openPort(path, 5*time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	a := &agent{port: port}
	a.send(ctl.Response{Event: "up", Uptime: uptime()})
	go func() {
		out, _ := exec.Command("systemctl", "is-system-running", "--wait").Output()
		a.send(ctl.Response{Event: "ready", Uptime: uptime(), State: strings.TrimSpace(string(out))})
	}()
	a.serve()
}

func openPort(path string, wait time.Duration) (*os.File, error) {
	deadline := time.Now().Add(wait)
	for {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err == nil {
			return f, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("control port: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type agent struct {
	port *os.File
	mu   sync.Mutex
}

func (a *agent) send(r ctl.Response) {
	b, _ := json.Marshal(r)
	b = append(b, '\n')
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, err := a.port.Write(b); err != nil {
		log.Printf("write to host: %v", err)
	}
}

func (a *agent) serve() {
	for {
		sc := bufio.NewScanner(a.port)
		sc.Buffer(make([]byte, 1<<20), 256<<20)
		for sc.Scan() {
			var req ctl.Request
			if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
				log.Printf("bad request: %v", err)
				continue
			}
			go func() { a.send(handle(req)) }()
		}
		if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
			log.Printf("read from host: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // host not connected: poll
	}
}

func handle(req ctl.Request) ctl.Response {
	start := time.Now()
	resp := ctl.Response{ID: req.ID}
	defer func() { resp.Seconds = time.Since(start).Seconds() }()
	if req.Path != "" {
		if err := writeFile(req.Path, req.Data, os.FileMode(req.Mode)); err != nil {
			resp.Code, resp.Err = -1, err.Error()
		}
		resp.Seconds = time.Since(start).Seconds()
		return resp
	}
	ctx := context.Background()
	if req.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.Timeout)*time.Second)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", req.Cmd)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), "SYSTEMD_COLORS=0", "SYSTEMD_PAGER=", "PAGER=cat", "TERM=dumb")
	err := cmd.Run()
	resp.Stdout, resp.Stderr = stdout.String(), stderr.String()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		resp.Code = exit.ExitCode()
		if ctx.Err() != nil {
			resp.Err = fmt.Sprintf("timed out after %ds", req.Timeout)
		}
	default:
		resp.Code, resp.Err = -1, err.Error()
	}
	resp.Seconds = time.Since(start).Seconds()
	return resp
}

func writeFile(path string, data []byte, mode os.FileMode) error {
	if mode == 0 {
		mode = 0o644
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".ferry-vm")
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func uptime() float64 {
	b, _ := os.ReadFile("/proc/uptime")
	f, _ := strconv.ParseFloat(strings.Fields(string(b) + " 0")[0], 64)
	return f
}
