package kube

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
)

// rotating is the client's transport. When the client certificate
// rotates it puts a new transport, with a pool of its own, in place of
// the old and then closes every connection the old one made. Closing
// alone is not enough: the HTTP/2 pool learns that a connection is closed
// only when its reader sees it, and a request sent before that (the very
// request that found the new certificate) fails on the closed connection.
type rotating struct {
	build func(*conns) *http.Transport
	dial  func(ctx context.Context, network, addr string) (net.Conn, error)
	cur   atomic.Pointer[generation]
}

// generation is one transport and the connections it dialled.
type generation struct {
	tr    *http.Transport
	conns *conns
}

func newRotating(build func(*conns) *http.Transport, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *rotating {
	r := &rotating{build: build, dial: dial}
	r.cur.Store(r.generation())
	return r
}

func (r *rotating) generation() *generation {
	d := &conns{dial: r.dial}
	return &generation{tr: r.build(d), conns: d}
}

func (r *rotating) RoundTrip(req *http.Request) (*http.Response, error) {
	return r.cur.Load().tr.RoundTrip(req)
}

// rotate sends what comes next on new connections and ends the old ones:
// the requests on them fail and are made again (watches resume from their
// resourceVersion).
func (r *rotating) rotate() {
	old := r.cur.Swap(r.generation())
	old.conns.closeAll()
	old.tr.CloseIdleConnections()
}

// conns dials the API server and remembers every connection it made, so
// that all of them can be closed when the client certificate rotates. The
// API server checks the certificate a connection was opened with on every
// request; over HTTP/2 one connection carries every request and watch and
// is never idle, so closing only idle ones would keep the old certificate
// until it expires. client-go's connrotation does the same.
type conns struct {
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	mu   sync.Mutex
	open map[*trackedConn]struct{}
}

func (d *conns) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := d.dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	t := &trackedConn{Conn: c, owner: d}
	d.mu.Lock()
	if d.open == nil {
		d.open = map[*trackedConn]struct{}{}
	}
	d.open[t] = struct{}{}
	d.mu.Unlock()
	return t, nil
}

// closeAll closes every open connection.
func (d *conns) closeAll() {
	d.mu.Lock()
	open := d.open
	d.open = nil
	d.mu.Unlock()
	for c := range open {
		c.Conn.Close()
	}
}

type trackedConn struct {
	net.Conn
	owner *conns
	once  sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.owner.mu.Lock()
		delete(c.owner.open, c)
		c.owner.mu.Unlock()
	})
	return c.Conn.Close()
}
