package vm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// QMP is a minimal client for QEMU's machine protocol: commands matched to
// their replies by id, and asynchronous events kept until waited for.
type QMP struct {
	conn net.Conn

	mu      sync.Mutex
	nextID  uint64
	pending map[string]chan qmpMsg
	events  []Event
	changed chan struct{} // closed and replaced when events or closed change
	closed  error
}

// Event is an asynchronous QMP event.
type Event struct {
	Name     string          `json:"event"`
	Data     json.RawMessage `json:"data"`
	Received time.Time       `json:"-"`
}

type qmpMsg struct {
	ID     string          `json:"id"`
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	Event string          `json:"event"`
	Data  json.RawMessage `json:"data"`
}

// ErrQMP marks a command QEMU refused.
var ErrQMP = errors.New("QMP command failed")

func dialQMP(ctx context.Context, path string) (*QMP, error) {
	conn, err := dialUnix(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("QMP socket: %w", err)
	}
	q := &QMP{conn: conn, pending: map[string]chan qmpMsg{}, changed: make(chan struct{})}
	r := bufio.NewReader(conn)
	if _, err := r.ReadBytes('\n'); err != nil { // greeting
		conn.Close()
		return nil, fmt.Errorf("QMP greeting: %w", err)
	}
	go q.read(r)
	if _, err := q.Execute(ctx, "qmp_capabilities", nil); err != nil {
		conn.Close()
		return nil, err
	}
	return q, nil
}

func (q *QMP) read(r *bufio.Reader) {
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			q.mu.Lock()
			q.closed = fmt.Errorf("QMP connection closed: %w", err)
			for _, ch := range q.pending {
				close(ch)
			}
			q.pending = map[string]chan qmpMsg{}
			close(q.changed)
			q.changed = make(chan struct{})
			q.mu.Unlock()
			return
		}
		var m qmpMsg
		if json.Unmarshal(line, &m) != nil {
			continue
		}
		q.mu.Lock()
		if m.Event != "" {
			q.events = append(q.events, Event{Name: m.Event, Data: m.Data, Received: time.Now()})
			close(q.changed)
			q.changed = make(chan struct{})
		} else if ch, ok := q.pending[m.ID]; ok {
			delete(q.pending, m.ID)
			ch <- m
		}
		q.mu.Unlock()
	}
}

// Execute runs one command and returns its "return" value.
func (q *QMP) Execute(ctx context.Context, command string, args any) (json.RawMessage, error) {
	q.mu.Lock()
	if q.closed != nil {
		q.mu.Unlock()
		return nil, q.closed
	}
	q.nextID++
	id := fmt.Sprint(q.nextID)
	ch := make(chan qmpMsg, 1)
	q.pending[id] = ch
	q.mu.Unlock()
	msg := map[string]any{"execute": command, "id": id}
	if args != nil {
		msg["arguments"] = args
	}
	b, _ := json.Marshal(msg)
	if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("QMP %s: %w", command, err)
	}
	select {
	case m, ok := <-ch:
		if !ok {
			return nil, fmt.Errorf("QMP %s: connection closed (qemu exited?)", command)
		}
		if m.Error != nil {
			return nil, fmt.Errorf("%w: %s: %s: %s", ErrQMP, command, m.Error.Class, m.Error.Desc)
		}
		return m.Return, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("QMP %s: %w", command, ctx.Err())
	}
}

// WaitEvent waits for an event named name whose data satisfies match (nil
// matches all), consuming it.
func (q *QMP) WaitEvent(ctx context.Context, name string, match func(json.RawMessage) bool) (Event, error) {
	for {
		q.mu.Lock()
		for i, e := range q.events {
			if e.Name == name && (match == nil || match(e.Data)) {
				q.events = append(q.events[:i], q.events[i+1:]...)
				q.mu.Unlock()
				return e, nil
			}
		}
		changed, closed := q.changed, q.closed
		q.mu.Unlock()
		if closed != nil {
			return Event{}, fmt.Errorf("waiting for QMP event %s: %w", name, closed)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return Event{}, fmt.Errorf("waiting for QMP event %s: %w", name, ctx.Err())
		}
	}
}

// Close ends the connection.
func (q *QMP) Close() error { return q.conn.Close() }

// dialUnix connects to a unix socket that QEMU creates shortly after start.
func dialUnix(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%s: %w (last error: %v)", path, ctx.Err(), err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
