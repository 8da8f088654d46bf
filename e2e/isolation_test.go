package e2e

import (
	"bufio"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// sharedNames match the names a real deployment uses: the default topics,
// consumer groups and Redis flag prefix. A test or benchmark that uses one
// of them talks to every deployment on the same broker or Redis — the
// enforcement-lag benchmark once published its signals into the shared
// sluice.signals.v1, and another deployment's enforcer and alerter wrote
// 40 flags and fired 40 alerts for tenants that existed only in the
// benchmark. Tests take their own names from itest.Unique instead.
var sharedNames = []*regexp.Regexp{
	regexp.MustCompile(`\bschemas\.Topic(Usage|Signals|Admin)V1\b`),
	regexp.MustCompile(`"sluice\.(usage|signals|admin|deferred)\.v1`),
	regexp.MustCompile(`"sluice-(aggregator|enforcer|alerter|reconciler|ingest|deferred)"`),
	regexp.MustCompile(`\bflags\.(DefaultPrefix|Default)\b`),
	regexp.MustCompile(`"sluice:flags:`),
}

// isolationAllowed lists the test files that may name a shared default,
// each with why it touches no shared service.
var isolationAllowed = map[string]string{
	"sdk/go/flags/flags_test.go": "checks the default key layout as strings; no Redis",
	"e2e/isolation_test.go":      "this check",
}

// TestTestsUseTheirOwnTopicsGroupsAndPrefixes fails when a test or
// benchmark file anywhere in the module names a default topic, consumer
// group or Redis flag prefix outside the allow-list above.
func TestTestsUseTheirOwnTopicsGroupsAndPrefixes(t *testing.T) {
	checked := 0
	walkModule(t, func(path, rel string) error {
		if !strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		checked++
		if _, ok := isolationAllowed[rel]; ok {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			if strings.HasPrefix(strings.TrimSpace(line), "//") {
				continue
			}
			for _, re := range sharedNames {
				if m := re.FindString(line); m != "" {
					t.Errorf("%s:%d uses %s, a name real deployments share: give the test its own with itest.Unique (or add the file to isolationAllowed with the reason it touches no shared service)", rel, n, m)
				}
			}
		}
		return sc.Err()
	})
	if checked < 50 {
		t.Fatalf("checked only %d test files; the walk is broken", checked)
	}
}

// sharedDefault matches a configuration default that real deployments
// share: a topic, a consumer group, the Redis flag prefix or the shared
// upstreams' prefix.
var sharedDefault = regexp.MustCompile(`^(sluice\.[a-z]+\.v[0-9]+|sluice-[a-z]+|sluice:flags:|sluice:up:)$`)

// TestStackOverridesEverySharedDefault: the services of an e2e stack (and
// of the enforcement-lag benchmark) run with the defaults of every setting
// the stack does not pass, so every setting whose default is a shared
// topic, group or prefix — today's and any added later — must be among
// the stack's flags. The settings come from the binary's own
// config-reference.
func TestStackOverridesEverySharedDefault(t *testing.T) {
	out, err := exec.Command(sluiceBin, "config-reference").Output()
	if err != nil {
		t.Fatalf("sluice config-reference: %v", err)
	}
	s := &stack{t: t, dir: t.TempDir(), prefix: "p:", topic: "usage", signals: "signals",
		groups: map[string]string{"aggregator": "a", "enforcer": "e", "alerter": "l"}}
	args := strings.Join(s.args("127.0.0.1:0"), " ")
	shared := 0
	for _, line := range strings.Split(string(out), "\n") {
		cols := strings.Split(line, "|")
		if len(cols) < 5 {
			continue
		}
		key, def := strings.Trim(strings.TrimSpace(cols[1]), "`"), strings.Trim(strings.TrimSpace(cols[3]), "`")
		if !sharedDefault.MatchString(def) {
			continue
		}
		shared++
		if !strings.Contains(" "+args, " -"+key+"=") {
			t.Errorf("setting %s defaults to the shared %q, and the e2e stack does not override it: add -%s=<itest.Unique name> to stack.args", key, def, key)
		}
	}
	if shared < 5 {
		t.Fatalf("found only %d settings with a shared default in config-reference; the parse is broken:\n%s", shared, out)
	}
}
