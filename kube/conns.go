package kube

import (
	"context"
	"net"
	"sync"
)

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

// closeAll closes every open connection: the requests on them fail and
// are made again (watches resume from their resourceVersion) on new ones.
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
