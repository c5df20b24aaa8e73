package create

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"time"
)

// cutReader gives data from off on and fails after cut bytes, as a
// connection dropped mid-response does.
type cutReader struct {
	r   io.Reader
	cut int
}

func (c *cutReader) Read(p []byte) (int, error) {
	if c.cut <= 0 {
		return 0, io.ErrUnexpectedEOF
	}
	if len(p) > c.cut {
		p = p[:c.cut]
	}
	n, err := c.r.Read(p)
	c.cut -= n
	return n, err
}

// A blob whose every response is cut is read whole, each byte fetched
// once, by opening it again where it stopped.
func TestResumingBlob_ResumesWhereEachCutStopped(t *testing.T) {
	data := make([]byte, 1<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	var served int64
	opens := 0
	b := &resumingBlob{ctx: context.Background(), size: int64(len(data)),
		open: func(off int64) (io.ReadCloser, error) {
			opens++
			r := &cutReader{r: bytes.NewReader(data[off:]), cut: 100_000}
			return io.NopCloser(servedReader{r, &served}), nil
		}}
	got, err := io.ReadAll(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the blob read differs from the blob served")
	}
	if served != int64(len(data)) || opens < 10 {
		t.Fatalf("served %d bytes in %d opens, want each of %d bytes once over about 11 opens", served, opens, len(data))
	}
}

// A source that keeps failing without a byte gives up, saying where.
func TestResumingBlob_GivesUpWithNoProgress(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no waiting between the tries
	b := &resumingBlob{ctx: ctx, size: 10, open: func(int64) (io.ReadCloser, error) { return nil, errors.New("connection refused") }}
	if _, err := io.ReadAll(b); err == nil {
		t.Fatal("read a blob from a source that never answers")
	}
}

type servedReader struct {
	r io.Reader
	n *int64
}

func (c servedReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	*c.n += int64(n)
	return n, err
}

// The rate limit reserves each read's time on one clock for all blobs: a
// MiB at a MiB a second holds the next read back about a second.
func TestRateLimiter_ReservesTimeForEveryRead(t *testing.T) {
	l := &rateLimiter{perSecond: 1 << 20}
	start := time.Now()
	if err := l.wait(context.Background(), 1<<20); err != nil {
		t.Fatal(err)
	}
	if ahead := l.next.Sub(start); ahead < 900*time.Millisecond || ahead > 1100*time.Millisecond+time.Since(start) {
		t.Fatalf("the next read may start %s after the first, want about a second", ahead)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.wait(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("a read that must wait, its context cancelled: %v", err)
	}
	var none *rateLimiter
	if err := none.wait(ctx, 1<<30); err != nil {
		t.Fatalf("no limit: %v", err)
	}
}
