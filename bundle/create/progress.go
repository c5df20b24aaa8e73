package create

import (
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ferry-edge/ferry/bundle"
)

// Progress is a snapshot of bundle create's copy.
type Progress struct {
	Phase       string // "resolve", "copy", "write", "done"
	Images      int    // images complete
	ImagesTotal int
	Bytes       int64 // bytes downloaded
	BytesTotal  int64 // bytes to download (what the work tree lacked)
	Elapsed     time.Duration
}

// Rate is the download rate so far, in bytes per second.
func (p Progress) Rate() float64 {
	if p.Elapsed <= 0 {
		return 0
	}
	return float64(p.Bytes) / p.Elapsed.Seconds()
}

// ETA is the time left at the current rate, or 0 when unknown.
func (p Progress) ETA() time.Duration {
	r := p.Rate()
	if r <= 0 || p.BytesTotal <= p.Bytes {
		return 0
	}
	return time.Duration(float64(p.BytesTotal-p.Bytes) / r * float64(time.Second)).Round(time.Second)
}

func (p Progress) String() string {
	eta := "--"
	if e := p.ETA(); e > 0 {
		eta = e.String()
	}
	return fmt.Sprintf("%s: images %d/%d  %s/%s  %.1f MB/s  ETA %s", p.Phase, p.Images, p.ImagesTotal,
		bundle.HumanSize(p.Bytes), bundle.HumanSize(p.BytesTotal), p.Rate()/1e6, eta)
}

// ProgressPrinter returns a Options.Progress function. On a terminal
// it redraws one line on w; otherwise it logs a line to log at most every
// interval (and at each phase change).
func ProgressPrinter(w io.Writer, terminal bool, log *slog.Logger, interval time.Duration) func(Progress) {
	var last time.Time
	var lastPhase string
	return func(p Progress) {
		if terminal {
			fmt.Fprintf(w, "\r\033[K%s", p)
			if p.Phase == "done" {
				fmt.Fprintln(w)
			}
			return
		}
		if p.Phase == lastPhase && time.Since(last) < interval {
			return
		}
		last, lastPhase = time.Now(), p.Phase
		log.Info("bundle create", "phase", p.Phase, "images", fmt.Sprintf("%d/%d", p.Images, p.ImagesTotal),
			"bytes", bundle.HumanSize(p.Bytes), "total", bundle.HumanSize(p.BytesTotal),
			"rate", fmt.Sprintf("%.1f MB/s", p.Rate()/1e6), "eta", p.ETA().String())
	}
}

// progressCounter holds the live counts behind Progress.
type progressCounter struct {
	start       time.Time
	phase       atomic.Value // string
	images      atomic.Int64
	imagesTotal atomic.Int64
	bytes       atomic.Int64
	bytesTotal  atomic.Int64
}

func (c *progressCounter) snapshot() Progress {
	ph, _ := c.phase.Load().(string)
	return Progress{
		Phase: ph, Images: int(c.images.Load()), ImagesTotal: int(c.imagesTotal.Load()),
		Bytes: c.bytes.Load(), BytesTotal: c.bytesTotal.Load(), Elapsed: time.Since(c.start),
	}
}

// fetchCounter adds what it reads to n.
type fetchCounter struct {
	io.ReadCloser
	n *atomic.Int64
}

func (r fetchCounter) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.n.Add(int64(n))
	return n, err
}
