package pull

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// A follower reads the followed node's responses through idleCut: a
// response that sends nothing for the stall (the node, or the link to
// it, stopped) fails instead of holding the follower's pull for ever;
// bundle create resumes the blob where it stopped, with a Range request.

// errStalled is a response from the followed node that sent nothing
// for the follower's stall.
var errStalled = errors.New("the followed node sent nothing")

type idleCut struct {
	base  http.RoundTripper
	stall time.Duration
}

func (c idleCut) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancelCause(r.Context())
	resp, err := c.base.RoundTrip(r.WithContext(ctx))
	if err != nil {
		cancel(nil)
		return nil, err
	}
	resp.Body = &idleBody{rc: resp.Body, stall: c.stall, cancel: cancel}
	return resp, nil
}

// idleBody fails a Read that waits longer than stall for a byte.
type idleBody struct {
	rc     io.ReadCloser
	stall  time.Duration
	cancel context.CancelCauseFunc
}

func (b *idleBody) Read(p []byte) (int, error) {
	t := time.AfterFunc(b.stall, func() { b.cancel(errStalled) })
	n, err := b.rc.Read(p)
	if !t.Stop() && err != nil {
		err = fmt.Errorf("%w for %s: %v", errStalled, b.stall, err)
	}
	return n, err
}

func (b *idleBody) Close() error {
	b.cancel(nil)
	return b.rc.Close()
}
