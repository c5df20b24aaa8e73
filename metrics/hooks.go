package metrics

import (
	"context"
	"net/http"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/crio"
)

// The wrappers cmd/ferry puts around the agent's parts, so that what
// they do is counted without their knowing of metrics.

// Reloader counts each reload of CRI-O that r does: ok, failed, or
// crio_down (nothing to reload; the loader waits for CRI-O and tries
// again).
func (m *Metrics) Reloader(r crio.Reloader) crio.Reloader { return countedReloader{r, m} }

type countedReloader struct {
	crio.Reloader
	m *Metrics
}

func (c countedReloader) Reload(ctx context.Context) error {
	err := c.Reloader.Reload(ctx)
	switch {
	case ctx.Err() != nil:
	default:
		c.m.Reloaded(err)
	}
	return err
}

// Loader counts the checks of the running release that l's Restore
// does (Checked).
func (m *Metrics) Loader(l agent.Loader) agent.Loader { return checkedLoader{l, m} }

type checkedLoader struct {
	agent.Loader
	m *Metrics
}

func (c checkedLoader) Restore(ctx context.Context, meta *bundle.Metadata, images []string, dir string) (int, error) {
	n, err := c.Loader.Restore(ctx, meta, images, dir)
	if ctx.Err() == nil { // not a check cut short by the agent stopping
		c.m.Checked(n, err)
	}
	return n, err
}

// Transport counts each request rt sends to the API server, by method
// and answer (ferry_api_requests_total); a watch counts once, when its
// answer starts.
func (m *Metrics) Transport(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(r)
		code := 0
		if err == nil {
			code = resp.StatusCode
		}
		if r.Context().Err() == nil || code > 0 {
			m.apiRequest(r.Method, code)
		}
		return resp, err
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
