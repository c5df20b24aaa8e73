package localapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/pull"
)

// ErrNotRunning means nothing answers on the status socket.
var ErrNotRunning = errors.New("the ferry agent is not running")

// ErrNoPermission means the caller may not open the status socket.
var ErrNoPermission = errors.New("permission denied on the ferry agent's socket")

// Client talks to a running agent over its socket.
type Client struct {
	path string
	hc   *http.Client
}

// NewClient returns a client for the socket at path.
func NewClient(path string) *Client {
	c := &Client{path: path}
	c.hc = &http.Client{
		Timeout:   30 * time.Minute,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return c.dial(ctx) }},
	}
	return c
}

func (c *Client) dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", c.path)
}

// Status asks the agent for its status.
func (c *Client) Status(ctx context.Context) (agent.Status, error) {
	return c.call(ctx, http.MethodGet, "/v1/status")
}

// Cluster asks the agent for every node's phase.
func (c *Client) Cluster(ctx context.Context) (agent.ClusterStatus, error) {
	var cs agent.ClusterStatus
	b, err := c.raw(ctx, http.MethodGet, "/v1/cluster")
	if err != nil {
		return cs, err
	}
	return cs, json.Unmarshal(b, &cs)
}

// Do asks the agent to clean up ("cleanup") or proceed ("proceed"); Load
// gives it a bundle.
func (c *Client) Do(ctx context.Context, kind string) (agent.Status, error) {
	return c.call(ctx, http.MethodPost, "/v1/"+kind)
}

func (c *Client) call(ctx context.Context, method, path string) (agent.Status, error) {
	var s agent.Status
	b, err := c.raw(ctx, method, path)
	if err != nil {
		return s, err
	}
	return s, json.Unmarshal(b, &s)
}

func (c *Client) raw(ctx context.Context, method, path string) ([]byte, error) {
	return raw(ctx, c.hc, method, path)
}

func raw(ctx context.Context, hc *http.Client, method, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://ferry"+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if errors.Is(err, os.ErrPermission) {
		// The socket is root's only (0600): the agent may well run.
		return nil, fmt.Errorf("%w (%v): the ferry socket is root's only; run it as root: sudo ferry …", ErrNoPermission, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w (%v): start it with 'systemctl start ferry'", ErrNotRunning, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		json.Unmarshal(b, &e)
		return nil, errors.New(e.Error)
	}
	return b, nil
}

// Pull asks the agent for a release from the site's registry (ferry load
// --release): it returns once the request is taken; the pull runs on.
func (c *Client) Pull(ctx context.Context, req pull.Request) (agent.Status, error) {
	q := url.Values{"release": {req.Release}, "extra": req.Extras}
	return c.call(ctx, http.MethodPost, "/v1/pull?"+q.Encode())
}

// Load gives the agent the bundle at path (ferry load): the files are
// opened here, as the caller, and passed to the agent.
func (c *Client) Load(ctx context.Context, path string) (agent.Status, error) {
	p, err := OpenBundle(path)
	if err != nil {
		return agent.Status{}, err
	}
	defer p.Close() // the agent holds its own copies
	return c.pass(ctx, p)
}

// pass sends p's files to the agent with a load request.
func (c *Client) pass(ctx context.Context, p *PassedBundle) (agent.Status, error) {
	files, kinds := p.files()
	rights := unix.UnixRights(fds(files)...)
	hc := &http.Client{Timeout: c.hc.Timeout, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			conn, err := c.dial(ctx)
			if err != nil {
				return nil, err
			}
			return &rightsConn{UnixConn: conn.(*net.UnixConn), rights: rights}, nil
		},
	}}
	q := url.Values{"files": {strings.Join(kinds, ",")}, "label": {p.Label}}
	b, err := raw(ctx, hc, http.MethodPost, "/v1/load?"+q.Encode())
	if err != nil {
		return agent.Status{}, err
	}
	var s agent.Status
	return s, json.Unmarshal(b, &s)
}

func fds(files []*os.File) []int {
	out := make([]int, len(files))
	for i, f := range files {
		out[i] = int(f.Fd())
	}
	return out
}

// rightsConn sends the descriptors with the request's first bytes.
type rightsConn struct {
	*net.UnixConn
	rights []byte
}

func (c *rightsConn) Write(b []byte) (int, error) {
	if c.rights == nil {
		return c.UnixConn.Write(b)
	}
	n, _, err := c.WriteMsgUnix(b, c.rights, nil)
	c.rights = nil
	if err == nil && n < len(b) {
		var m int
		m, err = io.Writer(c.UnixConn).Write(b[n:])
		n += m
	}
	return n, err
}
