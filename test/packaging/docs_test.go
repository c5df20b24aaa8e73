package packaging

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
)

// configKey is one key of agent.Config as TOML spells it: "paths.state_dir".
type configKey struct {
	name  string
	index []int // field path, for reflect.Value.FieldByIndex
	typ   reflect.Type
}

// configKeys walks agent.Config's toml tags, descending into tables.
func configKeys(t *testing.T) []configKey {
	t.Helper()
	var keys []configKey
	var walk func(typ reflect.Type, prefix string, index []int)
	walk = func(typ reflect.Type, prefix string, index []int) {
		for i := range typ.NumField() {
			f := typ.Field(i)
			if !f.IsExported() {
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			if name == "-" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			idx := append(slices.Clone(index), i)
			if f.Type.Kind() == reflect.Struct && f.Type.PkgPath() == typ.PkgPath() {
				walk(f.Type, prefix+name+".", idx)
				continue
			}
			keys = append(keys, configKey{name: prefix + name, index: idx, typ: f.Type})
		}
	}
	walk(reflect.TypeFor[agent.Config](), "", nil)
	if len(keys) < 10 {
		t.Fatalf("found only %d config keys: the walk is broken", len(keys))
	}
	return keys
}

// typeName is how the reference names a key's type.
func typeName(t *testing.T, typ reflect.Type) string {
	switch {
	case typ.Kind() == reflect.String:
		return "string"
	case typ.Kind() == reflect.Bool:
		return "boolean"
	case typ.Kind() >= reflect.Int && typ.Kind() <= reflect.Int64:
		return "integer"
	case typ.Kind() == reflect.Slice && typ.Elem().Kind() == reflect.String:
		return "list of strings"
	}
	t.Fatalf("config type %s: teach typeName (test/packaging/docs_test.go) its name in docs/admin.md", typ)
	return ""
}

// computedDefaults are keys whose default depends on the machine; the
// reference describes them in words.
var computedDefaults = map[string]bool{"node_name": true, "arch": true}

// referenceRow is one row of docs/admin.md's configuration reference.
type referenceRow struct{ key, typ, def, meaning string }

func configReference(t *testing.T) []referenceRow {
	t.Helper()
	doc := repoFile(t, "docs/admin.md")
	_, section, ok := strings.Cut(doc, "\n## Configuration reference\n")
	if !ok {
		t.Fatal(`docs/admin.md has no "## Configuration reference" section`)
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	var rows []referenceRow
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		if len(cells) != 4 {
			t.Fatalf("reference row %q: want 4 cells (key, type, default, meaning)", line)
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows = append(rows, referenceRow{key: strings.Trim(cells[0], "`"), typ: cells[1], def: cells[2], meaning: cells[3]})
	}
	return rows
}

// TestDocs_ConfigReferenceListsExactlyTheConfigKeys compares the table in
// docs/admin.md with agent.Config: the same keys, no more, no fewer, each
// with its type and, where it is a literal, its default.
func TestDocs_ConfigReferenceListsExactlyTheConfigKeys(t *testing.T) {
	keys := configKeys(t)
	rows := configReference(t)
	documented := map[string]referenceRow{}
	for _, r := range rows {
		if _, dup := documented[r.key]; dup {
			t.Errorf("docs/admin.md lists %s twice", r.key)
		}
		documented[r.key] = r
	}
	def := reflect.ValueOf(agent.DefaultConfig())
	inStruct := map[string]bool{}
	for _, k := range keys {
		inStruct[k.name] = true
		r, ok := documented[k.name]
		if !ok {
			t.Errorf("config key %s (agent.Config) is missing from docs/admin.md's configuration reference", k.name)
			continue
		}
		if want := typeName(t, k.typ); r.typ != want {
			t.Errorf("%s: docs say type %q, the struct has %s", k.name, r.typ, want)
		}
		if r.meaning == "" {
			t.Errorf("%s: no meaning", k.name)
		}
		lit := regexp.MustCompile("^`([^`]*)`$").FindStringSubmatch(r.def)
		if lit == nil {
			if !computedDefaults[k.name] {
				t.Errorf("%s: default %q is not a `literal`", k.name, r.def)
			}
			continue
		}
		var c agent.Config
		if _, err := toml.Decode(k.name+" = "+lit[1], &c); err != nil {
			t.Errorf("%s: default %s does not parse as TOML: %v", k.name, lit[1], err)
			continue
		}
		got := reflect.ValueOf(c).FieldByIndex(k.index).Interface()
		want := def.FieldByIndex(k.index).Interface()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: docs say default %s, agent.DefaultConfig() has %#v", k.name, lit[1], want)
		}
	}
	for _, r := range rows {
		if !inStruct[r.key] {
			t.Errorf("docs/admin.md documents %s, which agent.Config does not have", r.key)
		}
	}
}

// TestDocs_DefaultConfigFileShowsEveryKeyAndLoadsAsDefaults checks the
// config.toml the RPM installs: each key appears, commented out, in its
// table, and the file as shipped loads to exactly the defaults.
func TestDocs_DefaultConfigFileShowsEveryKeyAndLoadsAsDefaults(t *testing.T) {
	path := filepath.Join(root, "packaging/config.toml")
	got, err := agent.LoadConfig(path, true)
	if err != nil {
		t.Fatal(err)
	}
	if want := agent.DefaultConfig(); !reflect.DeepEqual(got, want) {
		t.Errorf("packaging/config.toml loads to\n%+v\nnot the defaults\n%+v", got, want)
	}
	table := ""
	seen := map[string]bool{}
	for _, line := range strings.Split(repoFile(t, "packaging/config.toml"), "\n") {
		if m := regexp.MustCompile(`^\[(\w+)\]$`).FindStringSubmatch(line); m != nil {
			table = m[1] + "."
		}
		if m := regexp.MustCompile(`^# (\w+) = `).FindStringSubmatch(line); m != nil {
			seen[table+m[1]] = true
		}
	}
	for _, k := range configKeys(t) {
		if !seen[k.name] {
			t.Errorf("packaging/config.toml does not show %s (as a commented '# key = default' line in its table)", k.name)
		}
		delete(seen, k.name)
	}
	for k := range seen {
		t.Errorf("packaging/config.toml shows %s, which agent.Config does not have", k)
	}
}

// phases reads the Phase constants of agent/machine/phase.go.
func phases(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root, "agent/machine/phase.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Phase" {
				continue
			}
			for _, v := range vs.Values {
				if lit, ok := v.(*ast.BasicLit); ok {
					p, _ := strconv.Unquote(lit.Value)
					out = append(out, p)
				}
			}
		}
	}
	if len(out) < 5 {
		t.Fatalf("found phases %v in agent/machine/phase.go: the parse is broken", out)
	}
	sort.Strings(out)
	return out
}

// TestDocs_TechnicianGuideCoversEveryPhaseAndRefusal checks that the
// technician can find every status line ferry shows and every reason a
// bundle is refused.
func TestDocs_TechnicianGuideCoversEveryPhaseAndRefusal(t *testing.T) {
	doc := repoFile(t, "docs/technician.md")
	// What `systemctl status` starts the line with, per phase.
	seenAs := map[string]string{
		"detected":      "`verifying ",
		"fetching":      "`fetching ",
		"extracted":     "`extracted ",
		"loading":       "`loading ",
		"loaded":        "`loaded ",
		"cluster-ready": "`cluster-ready ",
		"upgrading":     "`upgrading to ",
		"upgraded":      "`upgraded to ",
		"idle":          "`waiting for an upgrade stick`",
		"cleaned":       "`waiting for an upgrade stick`",
		"rejected":      "`rejected ",
		"failed":        "`failed ",
		"conflict":      "`conflict: ",
	}
	for _, p := range phases(t) {
		line, ok := seenAs[p]
		if !ok {
			t.Errorf("phase %q (agent/machine/phase.go) is new: add what it shows to docs/technician.md and to this test", p)
			continue
		}
		if !strings.Contains(doc, line) {
			t.Errorf("docs/technician.md never shows a status line starting %s (phase %s)", line, p)
		}
	}
	for _, err := range []error{bundle.ErrMismatch, bundle.ErrWrongArch, bundle.ErrNotApproved, bundle.ErrNoSpace, bundle.ErrInvalid} {
		if r := bundle.Reason(err); !strings.Contains(doc, r) {
			t.Errorf("docs/technician.md does not explain the refusal %q", r)
		}
	}
	if !strings.Contains(doc, "unplug") {
		t.Error("docs/technician.md does not say when the stick may be unplugged")
	}
}

// TestDocs_SecurityListMatchesTheUnit checks docs/admin.md names every
// check systemd-analyze security still flags on the unit.
func TestDocs_SecurityListMatchesTheUnit(t *testing.T) {
	analyze := needTool(t, "systemd-analyze", "systemd")
	out := run(t, root, analyze, "security", "--offline=true", "--no-pager", "packaging/ferry.service")
	doc := repoFile(t, "docs/admin.md")
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "✗ ") {
			continue
		}
		check := strings.Fields(strings.TrimPrefix(line, "✗ "))[0]
		if !strings.Contains(doc, "✗ "+check+" ") {
			t.Errorf("docs/admin.md does not list the flagged check %s", check)
		}
	}
}

// TestDocs_TroubleshootingUsesTheJournalFields checks the journal fields
// the guide filters on are ones ferry logs.
func TestDocs_TroubleshootingUsesTheJournalFields(t *testing.T) {
	doc := repoFile(t, "docs/troubleshooting.md")
	// slog attribute keys the agent logs, upper-cased by the journal handler.
	var src strings.Builder
	for _, dir := range []string{"agent", "agent/machine", "cmd/ferry"} {
		files, _ := filepath.Glob(filepath.Join(root, dir, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			src.Write(b)
		}
	}
	for _, field := range regexp.MustCompile(`journalctl -u ferry ([A-Z_]+)=`).FindAllStringSubmatch(doc, -1) {
		key := strings.ToLower(field[1])
		if !strings.Contains(src.String(), `"`+key+`", `) {
			t.Errorf("docs/troubleshooting.md filters on %s=, but the agent never logs %q", field[1], key)
		}
	}
	for _, must := range []string{"PHASE=rejected", "BUNDLE=", "DIGEST=", "-o verbose"} {
		if !strings.Contains(doc, must) {
			t.Errorf("docs/troubleshooting.md does not show %s", must)
		}
	}
}
