package vm

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
)

// Hub is a private Ethernet segment between guests and nothing else: a
// unix socket that QEMU's `-netdev stream` clients connect to, and a
// repeater that copies every frame to every other guest. QEMU frames each
// packet with a 4-byte big-endian length.
type Hub struct {
	ln   net.Listener
	dir  string
	path string

	mu    sync.Mutex
	ports []*hubPort
	wg    sync.WaitGroup
}

type hubPort struct {
	conn net.Conn
	mu   sync.Mutex
}

// NewHub listens on a fresh unix socket.
func NewHub() (*Hub, error) {
	dir, err := os.MkdirTemp("", "fvm-hub-")
	if err != nil {
		return nil, err
	}
	p := filepath.Join(dir, "hub.sock")
	ln, err := net.Listen("unix", p)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	h := &Hub{ln: ln, dir: dir, path: p}
	h.wg.Add(1)
	go h.accept()
	return h, nil
}

// Path is the socket guests connect to.
func (h *Hub) Path() string { return h.path }

func (h *Hub) accept() {
	defer h.wg.Done()
	for {
		c, err := h.ln.Accept()
		if err != nil {
			return
		}
		p := &hubPort{conn: c}
		h.mu.Lock()
		h.ports = append(h.ports, p)
		h.mu.Unlock()
		h.wg.Add(1)
		go h.serve(p)
	}
}

func (h *Hub) serve(from *hubPort) {
	defer h.wg.Done()
	defer h.drop(from)
	var hdr [4]byte
	buf := make([]byte, 65536)
	for {
		if _, err := io.ReadFull(from.conn, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n > uint32(len(buf)) {
			return
		}
		if _, err := io.ReadFull(from.conn, buf[:n]); err != nil {
			return
		}
		h.mu.Lock()
		ports := append([]*hubPort(nil), h.ports...)
		h.mu.Unlock()
		for _, to := range ports {
			if to == from {
				continue
			}
			to.mu.Lock()
			_, err := to.conn.Write(append(hdr[:4:4], buf[:n]...))
			to.mu.Unlock()
			if err != nil {
				to.conn.Close()
			}
		}
	}
}

func (h *Hub) drop(p *hubPort) {
	p.conn.Close()
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, q := range h.ports {
		if q == p {
			h.ports = append(h.ports[:i], h.ports[i+1:]...)
			return
		}
	}
}

// Close stops the hub and disconnects every guest.
func (h *Hub) Close() error {
	err := h.ln.Close()
	h.mu.Lock()
	for _, p := range h.ports {
		p.conn.Close()
	}
	h.mu.Unlock()
	h.wg.Wait()
	os.RemoveAll(h.dir)
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
