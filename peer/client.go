package peer

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/sha256digest"
)

// Client speaks the peer protocol to other nodes.
type Client struct {
	hc     *http.Client
	token  string
	scheme string // http, or https with node identities (NewNodeClient)
	// IdleRead is how long a body may stall before the request is dropped.
	idleRead time.Duration
	// A range that gets fewer than minRate bytes a second over any
	// rateWindow is dropped (ErrTooSlow), and the piece asked elsewhere:
	// a peer that drips a byte now and then never holds one for long.
	minRate    int64
	rateWindow time.Duration
	// Received, when set, is told of each tar byte received from a peer
	// (cmd/ferry counts them in metrics).
	Received func(n int64)
}

// Default minimum rate of a range from a peer: what a node's LAN gives
// many times over even when busy.
const (
	DefaultMinRate    = 64 << 10 // bytes a second
	DefaultRateWindow = 10 * time.Second
)

// ErrTooSlow: a peer sent a range slower than the client's minimum rate.
var ErrTooSlow = errors.New("peer too slow")

// SetMinRate sets the minimum rate (bytes a second, over window) below
// which a range is dropped; rate 0 turns the check off.
func (c *Client) SetMinRate(rate int64, window time.Duration) {
	c.minRate, c.rateWindow = rate, window
}

// NewClient makes a client sending token (if set). hc nil: a client with
// dial and header timeouts suited to a LAN.
func NewClient(token string, hc *http.Client) *Client {
	if hc == nil {
		hc = &http.Client{Transport: &http.Transport{
			DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost:   4,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: 15 * time.Second,
			DisableCompression:    true,
		}}
	}
	return &Client{hc: hc, token: token, scheme: "http", idleRead: 30 * time.Second, minRate: DefaultMinRate, rateWindow: DefaultRateWindow}
}

// Transport is the client's transport with its credential (the token
// added to each request, or this node's certificate), for other
// protocols spoken to the peers (a node following another's pull).
func (c *Client) Transport() http.RoundTripper {
	return tokenTransport{base: c.hc.Transport, token: c.token}
}

// TLS reports whether the client speaks HTTPS (node identities).
func (c *Client) TLS() bool { return c.scheme == "https" }

type tokenTransport struct {
	base  http.RoundTripper
	token string
}

func (t tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.token != "" {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+t.token)
	}
	return t.base.RoundTrip(r)
}

// StatusError is a peer's answer other than the one asked for.
type StatusError struct {
	Peer, Path string
	Code       int
	Body       string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("peer %s: GET %s: %d %s: %s", e.Peer, e.Path, e.Code, http.StatusText(e.Code), e.Body)
}

// Unwrap maps codes to the package's sentinels.
func (e *StatusError) Unwrap() error {
	switch e.Code {
	case http.StatusUnauthorized:
		return ErrUnauthorized
	case http.StatusNotFound:
		return ErrUnknownBundle
	case http.StatusServiceUnavailable:
		return ErrNotReady
	case http.StatusRequestedRangeNotSatisfiable:
		return ErrBadRange
	case http.StatusConflict:
		return ErrSentElsewhere
	}
	return nil
}

func (c *Client) do(ctx context.Context, peer, path string, hdr http.Header, want int) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.scheme+"://"+peer+path, nil)
	if err != nil {
		return nil, fmt.Errorf("peer %s: %w", peer, err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("peer %s: %w", peer, err)
	}
	if resp.StatusCode != want {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, &StatusError{Peer: peer, Path: path, Code: resp.StatusCode, Body: string(b)}
	}
	return resp, nil
}

func (c *Client) getJSON(ctx context.Context, peer, path string, limit int64, v any) ([]byte, error) {
	return c.getJSONFrom(ctx, peer, path, limit, v, nil)
}

// getJSONFrom is getJSON that also gives the connection's TLS state
// (nil when not over TLS).
func (c *Client) getJSONFrom(ctx context.Context, peer, path string, limit int64, v any, state **tls.ConnectionState) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := c.do(ctx, peer, path, nil, http.StatusOK)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if state != nil {
		*state = resp.TLS
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("peer %s: GET %s: %w", peer, path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("peer %s: GET %s: answer larger than %d bytes", peer, path, limit)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			return nil, fmt.Errorf("peer %s: GET %s: %w", peer, path, err)
		}
	}
	return b, nil
}

// Offers lists the bundles peer serves.
func (c *Client) Offers(ctx context.Context, peer string) ([]Offer, error) {
	var o []Offer
	_, err := c.getJSON(ctx, peer, "/v1/bundles", 64<<20, &o)
	return o, err
}

// Pieces gets and validates digest's piece list from peer (size < 0: any).
func (c *Client) Pieces(ctx context.Context, peer string, digest digest.Digest, size int64) (*PieceList, error) {
	b, err := c.getJSON(ctx, peer, "/v1/bundles/"+string(digest)+"/pieces", 64*maxPieces+4096, nil)
	if err != nil {
		return nil, err
	}
	p, err := ParsePieceList(b, digest, size)
	if err != nil {
		return nil, fmt.Errorf("peer %s: %w", peer, err)
	}
	return p, nil
}

// Have gets peer's bitmap of digest's pieces.
func (c *Client) Have(ctx context.Context, peer string, digest digest.Digest) (Have, error) {
	var h Have
	if _, err := c.getJSON(ctx, peer, "/v1/bundles/"+string(digest)+"/have", maxPieces/8+4096, &h); err != nil {
		return Have{}, err
	}
	if !h.valid() {
		return Have{}, fmt.Errorf("peer %s: have bitmap of %d bytes for %d pieces", peer, len(h.Bits), h.Pieces)
	}
	return h, nil
}

// Status gets peer's node status.
func (c *Client) Status(ctx context.Context, peer string) (Status, error) {
	st := c.status(ctx, peer)
	return st.Status, st.Err
}

// status is peer's status with the node its serving certificate names
// (TLS with node identities): a status that names another node is
// refused, so that nothing acts on a peer's word about who it is.
func (c *Client) status(ctx context.Context, peer string) PeerStatus {
	var st PeerStatus
	var state *tls.ConnectionState
	_, st.Err = c.getJSONFrom(ctx, peer, "/v1/status", 1<<20, &st.Status, &state)
	if st.Err != nil || state == nil {
		return st
	}
	if len(state.PeerCertificates) > 0 {
		st.Verified, st.Err = nodeOf(state.PeerCertificates[0])
	}
	if st.Err == nil && st.Node != st.Verified {
		st.Err = fmt.Errorf("peer %s: %w: it says %q, its certificate names %q", peer, ErrNodeMismatch, st.Node, st.Verified)
		st.Status = Status{} // nothing reads its word (the gate's exclusions by name)
	}
	return st
}

// CopyRange copies digest's tar bytes [off, off+n) from peer to w. A body
// that stalls for the idle timeout is dropped; a short body is an error.
func (c *Client) CopyRange(ctx context.Context, peer string, digest digest.Digest, off, n int64, w io.Writer) error {
	return c.copyRange(ctx, peer, digest, off, n, w, false)
}

// copyRange is CopyRange, asking for a first copy (FirstCopyHeader) if
// firstCopy.
func (c *Client) copyRange(ctx context.Context, peer string, digest digest.Digest, off, n int64, w io.Writer, firstCopy bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	idle := time.AfterFunc(c.idleRead, cancel)
	defer idle.Stop()
	var got atomic.Int64
	var slow atomic.Bool
	if c.minRate > 0 && c.rateWindow > 0 {
		stop := c.watchRate(&got, &slow, cancel)
		defer stop()
	}
	tooSlow := func(err error) error {
		if slow.Load() {
			return fmt.Errorf("%w: peer %s sent a range of %s at under %d bytes/s over %s: the piece is asked from another peer", ErrTooSlow, peer, sha256digest.Short(digest), c.minRate, c.rateWindow)
		}
		return err
	}
	rng := "bytes=" + strconv.FormatInt(off, 10) + "-" + strconv.FormatInt(off+n-1, 10)
	hdr := http.Header{"Range": {rng}}
	if firstCopy {
		hdr.Set(FirstCopyHeader, "1")
	}
	resp, err := c.do(ctx, peer, "/v1/bundles/"+string(digest)+"/tar", hdr, http.StatusPartialContent)
	if err != nil {
		return tooSlow(err)
	}
	defer resp.Body.Close()
	if resp.ContentLength != n {
		return fmt.Errorf("peer %s: range %s answered with %d bytes", peer, rng, resp.ContentLength)
	}
	buf := make([]byte, 256<<10)
	for got.Load() < n {
		k, rerr := resp.Body.Read(buf[:min(int64(len(buf)), n-got.Load())])
		if k > 0 {
			idle.Reset(c.idleRead)
			if _, werr := w.Write(buf[:k]); werr != nil {
				return werr
			}
			got.Add(int64(k))
			if c.Received != nil {
				c.Received(int64(k))
			}
		}
		if rerr != nil && got.Load() < n {
			if rerr == io.EOF {
				rerr = io.ErrUnexpectedEOF
			}
			return tooSlow(fmt.Errorf("peer %s: range %s: after %d bytes: %w", peer, rng, got.Load(), rerr))
		}
	}
	return nil
}

// watchRate cancels a range whose bytes (got) fall under the minimum
// rate over a window, and says so (slow); stop ends the watch.
func (c *Client) watchRate(got *atomic.Int64, slow *atomic.Bool, cancel context.CancelFunc) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(c.rateWindow)
		defer t.Stop()
		var last int64
		need := c.minRate * int64(c.rateWindow/time.Millisecond) / 1000
		for {
			select {
			case <-done:
				return
			case <-t.C:
				now := got.Load()
				if now-last < need {
					slow.Store(true)
					cancel()
					return
				}
				last = now
			}
		}
	}()
	return func() { close(done) }
}

func afterPoll() <-chan time.Time { return time.After(50 * time.Millisecond) }
