package vm

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/ferry-edge/ferry/test/vm/ctl"
)

// channel is the host end of the control channel (package ctl).
type channel struct {
	conn net.Conn
	log  io.Writer // every line received, for the test's artifacts

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan ctl.Response
	events  []ctl.Response
	changed chan struct{}
	closed  error
}

func newChannel(conn net.Conn, log io.Writer) *channel {
	c := &channel{conn: conn, log: log, pending: map[uint64]chan ctl.Response{}, changed: make(chan struct{})}
	go c.read()
	return c
}

func (c *channel) read() {
	sc := bufio.NewScanner(c.conn)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	for sc.Scan() {
		if c.log != nil {
			fmt.Fprintf(c.log, "%s\n", sc.Bytes())
		}
		var r ctl.Response
		if json.Unmarshal(sc.Bytes(), &r) != nil {
			continue
		}
		c.mu.Lock()
		if r.ID == 0 {
			c.events = append(c.events, r)
			close(c.changed)
			c.changed = make(chan struct{})
		} else if ch, ok := c.pending[r.ID]; ok {
			delete(c.pending, r.ID)
			ch <- r
		}
		c.mu.Unlock()
	}
	c.mu.Lock()
	c.closed = fmt.Errorf("guest control channel closed (qemu exited?): %v", sc.Err())
	for _, ch := range c.pending {
		close(ch)
	}
	c.pending = nil
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

func (c *channel) do(ctx context.Context, req ctl.Request) (ctl.Response, error) {
	c.mu.Lock()
	if c.closed != nil {
		c.mu.Unlock()
		return ctl.Response{}, c.closed
	}
	c.nextID++
	req.ID = c.nextID
	ch := make(chan ctl.Response, 1)
	c.pending[req.ID] = ch
	b, _ := json.Marshal(req)
	_, err := c.conn.Write(append(b, '\n')) // under mu: one line at a time
	c.mu.Unlock()
	if err != nil {
		return ctl.Response{}, fmt.Errorf("send to guest: %w", err)
	}
	select {
	case r, ok := <-ch:
		if !ok {
			return ctl.Response{}, c.closed
		}
		return r, nil
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.pending, req.ID)
		c.mu.Unlock()
		return ctl.Response{}, ctx.Err()
	}
}

// waitEvent waits for the guest event named name.
func (c *channel) waitEvent(ctx context.Context, name string) (ctl.Response, error) {
	for {
		c.mu.Lock()
		for _, e := range c.events {
			if e.Event == name {
				c.mu.Unlock()
				return e, nil
			}
		}
		changed, closed := c.changed, c.closed
		c.mu.Unlock()
		if closed != nil {
			return ctl.Response{}, closed
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctl.Response{}, ctx.Err()
		}
	}
}
