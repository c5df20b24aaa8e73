package udevtest

import (
	"io"
	"os"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/test/udevenv"
	"github.com/ferry-edge/ferry/udev"
)

// BenchmarkPlugToFirstByte measures what the agent's "udev event to first
// byte hashed ≤ 1 s" rests on, per plug of an ext4 stick: losetup → the
// udev change event (event-ms), and event → mounted, bundle found, first
// byte read (open-ms).
//
//	go test ./test/udev -run '^$' -bench PlugToFirstByte -benchtime 20x
func BenchmarkPlugToFirstByte(b *testing.B) {
	udevenv.Require(b)
	img := udevenv.Ext4Image(b, "STICK", stickFiles(b, udevenv.SmallBundleTar(b, "1.0.0"))...)
	events := watch(b, false)
	mountDir := b.TempDir()
	var toEvent, toByte time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		l := udevenv.Attach(b, img)
		ev := waitFor(b, events, l, func(e udev.Event) bool { return e.FSType == "ext4" })
		got := time.Now()
		med, err := openStick(b.Context(), ev, mountDir)
		if err != nil {
			b.Fatal(err)
		}
		f, err := os.Open(med.Candidates[0].TarPath)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(f, make([]byte, 1)); err != nil {
			b.Fatal(err)
		}
		done := time.Now()
		toEvent += got.Sub(start)
		toByte += done.Sub(got)
		f.Close()
		if err := med.Close(); err != nil {
			b.Fatal(err)
		}
		l.Detach()
		waitFor(b, events, l, udev.Event.Gone)
	}
	b.ReportMetric(float64(toEvent.Milliseconds())/float64(b.N), "event-ms")
	b.ReportMetric(float64(toByte.Microseconds())/1000/float64(b.N), "open-ms")
}
