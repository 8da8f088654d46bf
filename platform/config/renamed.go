package config

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// renamedError names the setting an old one became.
func renamedError(where, old, now string) error {
	return fmt.Errorf("config: %s: %s was renamed to %s; use the new name (see the upgrade notes in README.md)", where, old, now)
}

// removedError says why a setting is gone.
func removedError(where, old, why string) error {
	return fmt.Errorf("config: %s: %s was removed: %s; delete it (see the upgrade notes in README.md)", where, old, why)
}

// renamedFlag refuses a command-line flag of a renamed or removed setting.
func renamedFlag(args []string, renamed, removed map[string]string) error {
	for _, a := range args {
		if a == "--" || !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if now, ok := renamed[name]; ok {
			return renamedError("flag", "-"+name, "-"+now)
		}
		if why, ok := removed[name]; ok {
			return removedError("flag", "-"+name, why)
		}
	}
	return nil
}

// renamedEnv refuses the environment variable of a renamed setting: the
// loader ignores unknown variables (tools and tests share the prefix),
// so without this a renamed variable would silently stop applying.
func renamedEnv(prefix string, lookup func(string) (string, bool), renamed, removed map[string]string) error {
	for _, old := range slices.Sorted(maps.Keys(removed)) {
		if _, ok := lookup(envName(prefix, old)); ok {
			return removedError("environment", envName(prefix, old), removed[old])
		}
	}
	olds := make([]string, 0, len(renamed))
	for old := range renamed {
		olds = append(olds, old)
	}
	slices.Sort(olds)
	for _, old := range olds {
		if envName(prefix, old) == envName(prefix, renamed[old]) {
			continue // policy_file and policy.file are both SLUICE_POLICY_FILE
		}
		if _, ok := lookup(envName(prefix, old)); ok {
			return renamedError("environment", envName(prefix, old), envName(prefix, renamed[old]))
		}
	}
	return nil
}

// renamedYAML refuses a renamed setting in the YAML file, naming its line.
func renamedYAML(path string, data []byte, renamed, removed map[string]string) error {
	if len(renamed)+len(removed) == 0 {
		return nil
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil || len(doc.Content) == 0 {
		return nil // the strict decode reports it
	}
	var found error
	var walk func(n *yaml.Node, prefix string)
	walk = func(n *yaml.Node, prefix string) {
		if found != nil || n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			p := k.Value
			if prefix != "" {
				p = prefix + "." + p
			}
			if now, ok := renamed[p]; ok {
				found = renamedError(fmt.Sprintf("%s line %d", path, k.Line), p, now)
				return
			}
			if why, ok := removed[p]; ok {
				found = removedError(fmt.Sprintf("%s line %d", path, k.Line), p, why)
				return
			}
			walk(n.Content[i+1], p)
		}
	}
	walk(doc.Content[0], "")
	return found
}
