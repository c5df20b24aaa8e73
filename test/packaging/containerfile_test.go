package packaging

import (
	"regexp"
	"strings"
	"testing"
)

// instruction is one Containerfile instruction, continuations joined.
type instruction struct {
	line    int
	keyword string // upper case
	args    string
}

// parseContainerfile splits a Containerfile into instructions the way
// buildah and BuildKit do: comments and blank lines dropped, a trailing
// backslash joins the next line, the first word is the keyword.
func parseContainerfile(t *testing.T, text string) []instruction {
	t.Helper()
	known := map[string]bool{
		"FROM": true, "RUN": true, "CMD": true, "LABEL": true, "EXPOSE": true, "ENV": true,
		"ADD": true, "COPY": true, "ENTRYPOINT": true, "VOLUME": true, "USER": true,
		"WORKDIR": true, "ARG": true, "ONBUILD": true, "STOPSIGNAL": true,
		"HEALTHCHECK": true, "SHELL": true,
	}
	var out []instruction
	var cur *instruction
	for n, raw := range strings.Split(text, "\n") {
		line := strings.TrimSpace(raw)
		if cur == nil && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if cur != nil && strings.HasPrefix(line, "#") {
			continue // comment inside a continuation
		}
		cont := strings.HasSuffix(line, `\`)
		line = strings.TrimSuffix(line, `\`)
		if cur == nil {
			kw, args, _ := strings.Cut(line, " ")
			kw = strings.ToUpper(kw)
			if !known[kw] {
				t.Fatalf("line %d: unknown instruction %q", n+1, kw)
			}
			cur = &instruction{line: n + 1, keyword: kw, args: strings.TrimSpace(args)}
		} else {
			cur.args += " " + strings.TrimSpace(line)
		}
		if !cont {
			out = append(out, *cur)
			cur = nil
		}
	}
	if cur != nil {
		t.Fatalf("line %d: continuation runs past the end of the file", cur.line)
	}
	return out
}

// TestContainerfile_LayersTheRPMOntoCoreOS checks packaging/Containerfile is
// well-formed and does what docs/admin.md says: a CoreOS base, the RPM
// copied in and installed with rpm-ostree, the unit enabled, and the layer
// committed last.
func TestContainerfile_LayersTheRPMOntoCoreOS(t *testing.T) {
	ins := parseContainerfile(t, repoFile(t, "packaging/Containerfile"))
	args := map[string]string{}
	i := 0
	for ; i < len(ins) && ins[i].keyword == "ARG"; i++ {
		k, v, _ := strings.Cut(ins[i].args, "=")
		args[k] = v
	}
	if i == len(ins) || ins[i].keyword != "FROM" {
		t.Fatalf("the first instruction after ARGs is not FROM: %+v", ins)
	}
	base := regexp.MustCompile(`\$\{?(\w+)\}?`).ReplaceAllStringFunc(ins[i].args, func(ref string) string {
		return args[strings.Trim(ref, "${}")]
	})
	if !strings.Contains(base, "coreos") {
		t.Errorf("FROM %s (%s) is not a CoreOS image", ins[i].args, base)
	}
	for _, in := range ins[i+1:] {
		if in.keyword == "FROM" {
			t.Errorf("line %d: a second stage; the layered image must be the last FROM's", in.line)
		}
	}

	var copied bool
	var runs []instruction
	for _, in := range ins {
		switch in.keyword {
		case "COPY", "ADD":
			if strings.HasPrefix(in.args, "ferry-*.rpm ") {
				copied = true
			}
		case "RUN":
			runs = append(runs, in)
		}
	}
	if !copied {
		t.Error("no COPY ferry-*.rpm")
	}
	if len(runs) == 0 {
		t.Fatal("no RUN")
	}
	all := ""
	for _, r := range runs {
		all += r.args + " && "
	}
	for _, want := range []string{"rpm-ostree install /tmp/ferry-*.rpm", "systemctl enable ferry"} {
		if !strings.Contains(all, want) {
			t.Errorf("no RUN does %q", want)
		}
	}
	if last := runs[len(runs)-1].args; !strings.HasSuffix(strings.TrimSpace(last), "ostree container commit") {
		t.Errorf("the last RUN does not end with ostree container commit: %q", last)
	}
}
