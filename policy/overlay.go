package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"go.yaml.in/yaml/v3"
)

// Overlay is the tenants and plans defined at runtime, through the admin
// API (internal/controlplane's tenant and plan records), rather than in the
// file: each the JSON of its section exactly as the file would hold it
// under tenants: or plans:. See docs/controlplane.md.
//
// The rule between the two is that a tenant (or plan) is defined in one
// place: one the file defines is the file's. A record of the same name
// whose section differs from the file's is a conflict, which Overlaid
// reports and never resolves silently; one equal to the file's (as after
// `sluicectl policy apply`) is no conflict.
type Overlay struct {
	Tenants map[string]json.RawMessage `json:"tenants,omitempty"`
	Plans   map[string]json.RawMessage `json:"plans,omitempty"`
}

// Empty reports whether o defines nothing.
func (o Overlay) Empty() bool { return len(o.Tenants) == 0 && len(o.Plans) == 0 }

// equal reports whether o and x define the same sections.
func (o Overlay) equal(x Overlay) bool {
	eq := func(a, b map[string]json.RawMessage) bool {
		return maps.EqualFunc(a, b, func(x, y json.RawMessage) bool { return bytes.Equal(x, y) })
	}
	return eq(o.Tenants, x.Tenants) && eq(o.Plans, x.Plans)
}

// Canonical returns section (JSON or YAML of one tenant or plan section) as
// compact JSON with sorted keys, the form records hold and comparisons use,
// or an error naming what is wrong with it.
func Canonical(section []byte) (json.RawMessage, error) {
	var v any
	if err := yaml.Unmarshal(section, &v); err != nil {
		return nil, fmt.Errorf("not a YAML or JSON section: %w", err)
	}
	if v == nil {
		v = map[string]any{}
	}
	if _, ok := v.(map[string]any); !ok {
		return nil, fmt.Errorf("must be an object of a tenant's settings (as under tenants: in the policy file), not %T", v)
	}
	out, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("not representable as JSON: %w", err)
	}
	return out, nil
}

// SectionsOf returns the tenants and plans a policy document defines, each
// section in Canonical form: what `sluicectl policy diff` compares with the
// live records.
func SectionsOf(data []byte) (Overlay, error) {
	var raw struct {
		Plans   map[string]yaml.Node `yaml:"plans"`
		Tenants map[string]yaml.Node `yaml:"tenants"`
	}
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return Overlay{}, fmt.Errorf("policy: %w", err)
	}
	o := Overlay{Tenants: map[string]json.RawMessage{}, Plans: map[string]json.RawMessage{}}
	for _, s := range []struct {
		where string
		in    map[string]yaml.Node
		out   map[string]json.RawMessage
	}{{"tenants", raw.Tenants, o.Tenants}, {"plans", raw.Plans, o.Plans}} {
		for name, n := range s.in {
			b, err := yaml.Marshal(&n)
			if err != nil {
				return Overlay{}, fmt.Errorf("policy: %s.%s: %w", s.where, name, err)
			}
			c, err := Canonical(b)
			if err != nil {
				return Overlay{}, fmt.Errorf("policy: %s.%s: %w", s.where, name, err)
			}
			s.out[name] = c
		}
	}
	return o, nil
}

// Overlaid parses the policy document data with o laid over it: o's
// tenants and plans the file does not define are added to it, and the
// whole is validated as one document (every problem names its field, as
// for the file). conflicts lists, as "tenants.NAME" or "plans.NAME", the
// records the file also defines with a different section: the file's is
// in force for them.
func Overlaid(data []byte, filename string, o Overlay, opts ...Option) (p *Policy, conflicts []string, err error) {
	if o.Empty() {
		p, err = Parse(data, filename, opts...)
		return p, nil, err
	}
	file, err := SectionsOf(data)
	if err != nil {
		return nil, nil, err
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, nil, fmt.Errorf("policy: %s: %w", filename, err)
	}
	if root.Kind != yaml.DocumentNode || len(root.Content) == 0 {
		root = yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{{Kind: yaml.MappingNode, Tag: "!!map"}}}
	}
	doc := root.Content[0]
	if doc.Kind != yaml.MappingNode { // an empty file
		*doc = yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	}
	for _, s := range []struct {
		where    string
		records  map[string]json.RawMessage
		fileDefs map[string]json.RawMessage
	}{{"plans", o.Plans, file.Plans}, {"tenants", o.Tenants, file.Tenants}} {
		var into *yaml.Node
		for _, name := range slices.Sorted(maps.Keys(s.records)) {
			body := s.records[name]
			if def, ok := s.fileDefs[name]; ok {
				if c, err := Canonical(body); err != nil || !bytes.Equal(c, def) {
					conflicts = append(conflicts, s.where+"."+name)
				}
				continue
			}
			var n yaml.Node
			if err := yaml.Unmarshal(body, &n); err != nil || len(n.Content) == 0 {
				return nil, conflicts, fmt.Errorf("policy: %s.%s (admin API record): not a section: %v", s.where, name, err)
			}
			if into == nil {
				into = mappingChild(doc, s.where)
			}
			into.Content = append(into.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: name}, n.Content[0])
		}
	}
	merged, err := yaml.Marshal(&root)
	if err != nil {
		return nil, conflicts, fmt.Errorf("policy: %s with the admin API's records: %w", filename, err)
	}
	p, err = Parse(merged, filename+" with the admin API's tenants and plans", opts...)
	return p, conflicts, err
}

// mappingChild returns the mapping under key of mapping n, made (or made a
// mapping, for a key the file left empty) when missing.
func mappingChild(n *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			v := n.Content[i+1]
			if v.Kind != yaml.MappingNode {
				*v = yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
			}
			return v
		}
	}
	v := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, v)
	return v
}

// withoutSection returns the document data without its section where.name
// (where is tenants or plans).
func withoutSection(data []byte, where, name string) ([]byte, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	if root.Kind != yaml.DocumentNode || len(root.Content) == 0 || root.Content[0].Kind != yaml.MappingNode {
		return data, nil // defines no section to take out
	}
	m := mappingChild(root.Content[0], where)
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == name {
			m.Content = append(m.Content[:i], m.Content[i+2:]...)
			break
		}
	}
	return yaml.Marshal(&root)
}
