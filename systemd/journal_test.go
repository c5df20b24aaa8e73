package systemd

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-systemd/v22/journal"
)

type sent struct {
	msg  string
	pri  journal.Priority
	vars map[string]string
}

type fakeJournal struct {
	entries []sent
	err     error
}

func (f *fakeJournal) send(msg string, pri journal.Priority, vars map[string]string) error {
	if f.err != nil {
		return f.err
	}
	f.entries = append(f.entries, sent{msg, pri, vars})
	return nil
}

func TestJournalHandler_MapsAttrsToFields(t *testing.T) {
	fj := &fakeJournal{}
	log := slog.New(newJournalHandler(slog.LevelInfo, fj.send, nil)).With("phase", "verifying")
	log.Info("verifying bundle",
		"bundle", "upgrade-4.13.7-x86_64.tar",
		"digest", "sha256:9a0b",
		"device", "/dev/sdb1",
		"bytes-done", 42,
		"_trusted", "no",
		"9lives", true,
		"message", "collides",
		"took", 1500*time.Millisecond,
		slog.Group("http", "status", 200),
		slog.Group("", "inlined", "yes"),
	)
	if len(fj.entries) != 1 {
		t.Fatalf("sent %d entries, want 1", len(fj.entries))
	}
	e := fj.entries[0]
	want := map[string]string{
		"SYSLOG_IDENTIFIER": "ferry",
		"PHASE":             "verifying",
		"BUNDLE":            "upgrade-4.13.7-x86_64.tar",
		"DIGEST":            "sha256:9a0b",
		"DEVICE":            "/dev/sdb1",
		"BYTES_DONE":        "42",
		"TRUSTED":           "no",
		"F_9LIVES":          "true",
		"FERRY_MESSAGE":     "collides",
		"TOOK":              "1.5s",
		"HTTP_STATUS":       "200",
		"INLINED":           "yes",
	}
	for k, v := range want {
		if e.vars[k] != v {
			t.Errorf("field %s = %q, want %q", k, e.vars[k], v)
		}
	}
	for k := range e.vars {
		if err := validName(k); err != nil {
			t.Errorf("field %q breaks journald's rules: %v", k, err)
		}
	}
	if e.vars["CODE_FILE"] == "" || !strings.HasSuffix(e.vars["CODE_FUNC"], "TestJournalHandler_MapsAttrsToFields") {
		t.Errorf("CODE_FILE/CODE_FUNC = %q/%q, want the caller", e.vars["CODE_FILE"], e.vars["CODE_FUNC"])
	}
	if e.pri != journal.PriInfo {
		t.Errorf("priority %d, want info", e.pri)
	}
	if !strings.HasPrefix(e.msg, "verifying bundle phase=verifying bundle=upgrade-4.13.7-x86_64.tar") ||
		!strings.Contains(e.msg, "http.status=200") {
		t.Errorf("MESSAGE %q lacks the attributes a technician reads", e.msg)
	}
}

// validName is journald's rule for field names (sd-journal's
// journal_field_valid): A–Z, 0–9, "_", not starting with "_" or a digit,
// at most 64 characters.
func validName(s string) error {
	if s == "" || len(s) > 64 {
		return errors.New("empty or too long")
	}
	if s[0] == '_' || (s[0] >= '0' && s[0] <= '9') {
		return errors.New("bad first character")
	}
	for _, r := range s {
		if !(r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_') {
			return errors.New("bad character")
		}
	}
	return nil
}

func TestFieldName(t *testing.T) {
	for in, want := range map[string]string{
		"phase":                  "PHASE",
		"last.error":             "LAST_ERROR",
		"déjà vu":                "D_J__VU",
		"__x":                    "X",
		"___":                    "",
		"1st":                    "F_1ST",
		"priority":               "FERRY_PRIORITY",
		strings.Repeat("a", 100): strings.Repeat("A", 64),
	} {
		got := FieldName(in)
		if got != want {
			t.Errorf("FieldName(%q) = %q, want %q", in, got, want)
		}
		if got != "" {
			if err := validName(got); err != nil {
				t.Errorf("FieldName(%q) = %q: %v", in, got, err)
			}
		}
	}
}

func TestJournalHandler_PriorityFromLevel(t *testing.T) {
	fj := &fakeJournal{}
	log := slog.New(newJournalHandler(slog.LevelDebug, fj.send, nil))
	log.Debug("d")
	log.Info("i")
	log.Warn("w")
	log.Error("e")
	log.Log(t.Context(), slog.LevelError+4, "c")
	want := []journal.Priority{journal.PriDebug, journal.PriInfo, journal.PriWarning, journal.PriErr, journal.PriCrit}
	if len(fj.entries) != len(want) {
		t.Fatalf("sent %d entries, want %d", len(fj.entries), len(want))
	}
	for i, w := range want {
		if fj.entries[i].pri != w {
			t.Errorf("entry %q: priority %d, want %d", fj.entries[i].msg, fj.entries[i].pri, w)
		}
	}
}

func TestJournalHandler_HonoursLevelAndGroups(t *testing.T) {
	fj := &fakeJournal{}
	log := slog.New(newJournalHandler(slog.LevelWarn, fj.send, nil))
	log.Info("dropped")
	log.WithGroup("peer").With("addr", "10.0.0.2:8090").Warn("slow", "ms", 900)
	if len(fj.entries) != 1 {
		t.Fatalf("sent %d entries, want only the warning", len(fj.entries))
	}
	v := fj.entries[0].vars
	if v["PEER_ADDR"] != "10.0.0.2:8090" || v["PEER_MS"] != "900" {
		t.Errorf("grouped fields: %v", v)
	}
}

func TestJournalHandler_FallsBackToTextWhenJournaldRefuses(t *testing.T) {
	var buf bytes.Buffer
	fj := &fakeJournal{err: errors.New("connection refused")}
	h := newJournalHandler(slog.LevelInfo, fj.send, slog.NewTextHandler(&buf, nil))
	slog.New(h).With("bundle", "b").Info("extracted", "phase", "extracted")
	if !strings.Contains(buf.String(), "msg=extracted bundle=b phase=extracted") {
		t.Errorf("fallback text %q lacks the entry", buf.String())
	}
}

func TestNewHandler_TextOffTheJournal(t *testing.T) {
	t.Setenv("JOURNAL_STREAM", "")
	var buf bytes.Buffer
	slog.New(NewHandler(&buf, slog.LevelInfo)).Info("watching", "device", "/dev/loop3")
	if !strings.Contains(buf.String(), "level=INFO msg=watching device=/dev/loop3") {
		t.Errorf("text output %q", buf.String())
	}
	if NewLogger(slog.LevelInfo) == nil {
		t.Fatal("NewLogger returned nil")
	}
}
