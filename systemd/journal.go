package systemd

import (
	"context"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/coreos/go-systemd/v22/journal"
)

// NewLogger returns ferry's logger: entries go to journald with their
// attributes as fields (phase → PHASE, bundle → BUNDLE, …) when stderr is
// connected to the journal (a systemd service), and as text lines on stderr
// otherwise. A nil level is Info.
func NewLogger(level slog.Leveler) *slog.Logger {
	return slog.New(NewHandler(os.Stderr, level))
}

// NewHandler is NewLogger's handler; w is where text goes off the journal
// (and when journald refuses an entry).
func NewHandler(w io.Writer, level slog.Leveler) slog.Handler {
	text := slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})
	if ok, _ := journal.StderrIsJournalStream(); ok {
		return newJournalHandler(level, journal.Send, text)
	}
	return text
}

// sendFunc is journal.Send.
type sendFunc func(message string, priority journal.Priority, vars map[string]string) error

// journalHandler is a slog.Handler that sends each entry to journald with
// the journal's native protocol. Every attribute becomes a field named in
// journald's rules (upper case, digits, underscores; group names joined by
// "_"), and is appended as key=value to MESSAGE too, so that a plain
// `journalctl -u ferry` shows it.
type journalHandler struct {
	level    slog.Leveler
	send     sendFunc
	fallback slog.Handler
	fields   []field // from WithAttrs
	groups   []string
}

type field struct {
	name string // journald field: BUNDLE, HTTP_STATUS
	key  string // as in the text: bundle, http.status
	val  string
}

func newJournalHandler(level slog.Leveler, send sendFunc, fallback slog.Handler) *journalHandler {
	if level == nil {
		level = slog.LevelInfo
	}
	return &journalHandler{level: level, send: send, fallback: fallback}
}

func (h *journalHandler) Enabled(_ context.Context, l slog.Level) bool {
	return l >= h.level.Level()
}

func (h *journalHandler) WithAttrs(as []slog.Attr) slog.Handler {
	if len(as) == 0 {
		return h
	}
	c := *h
	c.fields = append(append([]field(nil), h.fields...), flatten(h.groups, as)...)
	if h.fallback != nil {
		c.fallback = h.fallback.WithAttrs(as)
	}
	return &c
}

func (h *journalHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := *h
	c.groups = append(append([]string(nil), h.groups...), name)
	if h.fallback != nil {
		c.fallback = h.fallback.WithGroup(name)
	}
	return &c
}

func (h *journalHandler) Handle(ctx context.Context, r slog.Record) error {
	fields := h.fields
	if r.NumAttrs() > 0 {
		var as []slog.Attr
		r.Attrs(func(a slog.Attr) bool { as = append(as, a); return true })
		fields = append(append([]field(nil), fields...), flatten(h.groups, as)...)
	}
	var msg strings.Builder
	msg.WriteString(r.Message)
	vars := make(map[string]string, len(fields)+4)
	vars["SYSLOG_IDENTIFIER"] = "ferry"
	if r.PC != 0 {
		f, _ := runtime.CallersFrames([]uintptr{r.PC}).Next()
		if f.File != "" {
			vars["CODE_FILE"] = f.File
			vars["CODE_LINE"] = strconv.Itoa(f.Line)
			vars["CODE_FUNC"] = f.Function
		}
	}
	for _, f := range fields {
		msg.WriteByte(' ')
		msg.WriteString(f.key)
		msg.WriteByte('=')
		msg.WriteString(quoteIfNeeded(f.val))
		if f.name != "" {
			vars[f.name] = f.val
		}
	}
	if err := h.send(msg.String(), priority(r.Level), vars); err != nil && h.fallback != nil {
		// journald is gone (restarting, or the socket is not mounted in a
		// test root): do not lose the entry.
		return h.fallback.Handle(ctx, r)
	}
	return nil
}

// flatten resolves attrs into fields, groups joined by "_" (field) and "."
// (text key); empty attrs are dropped, as slog's handlers do.
func flatten(groups []string, as []slog.Attr) []field {
	var out []field
	var walk func(prefix []string, as []slog.Attr)
	walk = func(prefix []string, as []slog.Attr) {
		for _, a := range as {
			v := a.Value.Resolve()
			if a.Equal(slog.Attr{}) {
				continue
			}
			if v.Kind() == slog.KindGroup {
				p := prefix
				if a.Key != "" {
					p = append(append([]string(nil), prefix...), a.Key)
				}
				walk(p, v.Group())
				continue
			}
			path := append(append([]string(nil), prefix...), a.Key)
			out = append(out, field{
				name: FieldName(strings.Join(path, "_")),
				key:  strings.Join(path, "."),
				val:  valueString(v),
			})
		}
	}
	walk(groups, as)
	return out
}

func valueString(v slog.Value) string {
	switch v.Kind() {
	case slog.KindTime:
		return v.Time().Format(time.RFC3339Nano)
	case slog.KindDuration:
		return v.Duration().String()
	default:
		return v.String()
	}
}

// reservedFields are set by the handler itself (or trusted by journald), so
// an attribute of that name gets a FERRY_ prefix.
var reservedFields = map[string]bool{
	"MESSAGE": true, "PRIORITY": true, "SYSLOG_IDENTIFIER": true,
	"CODE_FILE": true, "CODE_LINE": true, "CODE_FUNC": true,
}

// FieldName turns an attribute key into a journald field name: upper case,
// every character other than A–Z, 0–9 and "_" replaced by "_", no leading
// "_" (journald keeps those for its trusted fields), not starting with a
// digit, at most 64 characters. "" when nothing is left.
func FieldName(key string) string {
	var b strings.Builder
	for _, r := range strings.ToUpper(key) {
		if (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	s := strings.TrimLeft(b.String(), "_")
	if s == "" {
		return ""
	}
	if s[0] >= '0' && s[0] <= '9' {
		s = "F_" + s
	}
	if reservedFields[s] {
		s = "FERRY_" + s
	}
	if len(s) > 64 {
		s = s[:64]
	}
	return s
}

func priority(l slog.Level) journal.Priority {
	switch {
	case l >= slog.LevelError+4:
		return journal.PriCrit
	case l >= slog.LevelError:
		return journal.PriErr
	case l >= slog.LevelWarn:
		return journal.PriWarning
	case l >= slog.LevelInfo:
		return journal.PriInfo
	default:
		return journal.PriDebug
	}
}

func quoteIfNeeded(s string) string {
	if s == "" {
		return `""`
	}
	for _, r := range s {
		if r == ' ' || r == '=' || r == '"' || !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}
