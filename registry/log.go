package registry

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/sirupsen/logrus"
)

// distribution logs through logrus' global logger (one "response
// completed" line per request at info). ferry silences it and forwards
// warnings and errors to the slog logger of the registry whose app is
// running, until that app shuts down: a logger is never used after its
// owner is gone (a test's logger then panics).
var (
	logrusOnce sync.Once
	logSink    atomic.Pointer[slog.Logger]
)

// forwardDistributionLogs sends distribution's warnings and errors to log
// until the returned func is called.
func forwardDistributionLogs(log *slog.Logger) (stop func()) {
	logSink.Store(log)
	logrusOnce.Do(func() {
		l := logrus.StandardLogger()
		l.SetOutput(io.Discard)
		l.SetLevel(logrus.WarnLevel)
		l.AddHook(slogHook{})
	})
	return func() { logSink.CompareAndSwap(log, nil) }
}

// unknownCodes are distribution's error codes for a name, manifest or
// blob the bundle does not hold (404).
var unknownCodes = map[string]bool{"manifest unknown": true, "blob unknown": true, "name unknown": true}

type slogHook struct{}

func (slogHook) Levels() []logrus.Level {
	return []logrus.Level{logrus.PanicLevel, logrus.FatalLevel, logrus.ErrorLevel, logrus.WarnLevel}
}

func (slogHook) Fire(e *logrus.Entry) error {
	log := logSink.Load()
	if log == nil {
		return nil
	}
	level := slog.LevelWarn
	switch {
	case unknownCodes[fmt.Sprint(e.Data["err.code"])]:
		// Normal: with the node's own mirrors after ferry's, CRI-O asks
		// the embedded registry first for images the bundle does not have.
		level = slog.LevelDebug
	case e.Level <= logrus.ErrorLevel:
		level = slog.LevelError
	}
	attrs := make([]slog.Attr, 0, 4)
	for _, k := range []string{"err.message", "err.detail", "http.request.uri", "vars.name"} {
		if v, ok := e.Data[k]; ok {
			attrs = append(attrs, slog.Any(k, v))
		}
	}
	log.LogAttrs(context.Background(), level, "registry: "+e.Message, attrs...)
	return nil
}
