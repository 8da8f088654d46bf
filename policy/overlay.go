package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"

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
			// Decoded first, so that an alias of an anchor elsewhere in the
			// file and a merge key (<<) become the values they stand for:
			// the node alone would be marshalled as a dangling *alias.
			var v any
			if err := n.Decode(&v); err != nil {
				return Overlay{}, fmt.Errorf("policy: %s.%s: %w", s.where, name, err)
			}
			b, err := yaml.Marshal(v)
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
	return overlaid(data, filename, o, nil, nil, opts...)
}

// overlaid is Overlaid with data's own sections when known (file; nil:
// computed) and the records decoded by an earlier call (cache; nil: none).
//
// A change of one tenant among thousands must not cost a parse of them
// all: the records are decoded on their own (by the cache, once per
// content) and validated with the file as one document. Only when that
// finds anything wrong is the document merged as YAML and parsed whole,
// which places each problem on its line of the merged document as before.
func overlaid(data []byte, filename string, o Overlay, file *Overlay, cache *recordCache, opts ...Option) (*Policy, []string, error) {
	if o.Empty() {
		p, err := Parse(data, filename, opts...)
		return p, nil, err
	}
	if file == nil {
		f, err := SectionsOf(data)
		if err != nil {
			return nil, nil, err
		}
		file = &f
	}
	laid, conflicts := recordsToLay(o, *file)
	p, err := mergedDecoded(data, filename, laid, cache, newOptions(opts))
	if err != nil {
		p, err = mergedYAML(data, filename, laid, opts...)
	}
	if err != nil {
		return nil, conflicts, err
	}
	p.fingerprint = overlaidFingerprint(data, laid, p.pricesFile.data)
	return p, conflicts, nil
}

// laidRecord is a record laid over the file: where is tenants or plans.
type laidRecord struct {
	where, name string
	body        json.RawMessage
}

// recordsToLay returns o's records the file does not define, plans first
// and each kind by name, and the conflicts: the records the file defines
// differently.
func recordsToLay(o Overlay, file Overlay) (laid []laidRecord, conflicts []string) {
	for _, s := range []struct {
		where    string
		records  map[string]json.RawMessage
		fileDefs map[string]json.RawMessage
	}{{"plans", o.Plans, file.Plans}, {"tenants", o.Tenants, file.Tenants}} {
		for _, name := range slices.Sorted(maps.Keys(s.records)) {
			body := s.records[name]
			if def, ok := s.fileDefs[name]; ok {
				if c, err := Canonical(body); err != nil || !bytes.Equal(c, def) {
					conflicts = append(conflicts, s.where+"."+name)
				}
				continue
			}
			laid = append(laid, laidRecord{where: s.where, name: name, body: body})
		}
	}
	return laid, conflicts
}

// mergedDecoded is the policy of data with laid added to its tenants and
// plans, decoded apart and validated together, or an error when anything
// is wrong: what is wrong is then for mergedYAML to say. A file with a
// merge key ("<<") is left to mergedYAML too: adding a tenants or plans
// key beside a merged one is what the YAML merge does to it.
func mergedDecoded(data []byte, filename string, laid []laidRecord, cache *recordCache, o options) (*Policy, error) {
	if bytes.Contains(data, []byte("<<")) {
		return nil, errors.New("a merge key")
	}
	var raw rawPolicy
	if err := decodeStrict(data, &raw); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if raw.Tenants == nil {
		raw.Tenants = map[string]rawTenant{}
	}
	if raw.Plans == nil {
		raw.Plans = map[string]rawTenant{}
	}
	prev, seen := cache.begin(len(laid))
	for _, r := range laid {
		rt, err := decodeRecord(prev, seen, r)
		if err != nil {
			return nil, err
		}
		if r.where == "plans" {
			raw.Plans[r.name] = rt
		} else {
			raw.Tenants[r.name] = rt
		}
	}
	cache.end(seen)
	return build(raw, nil, filename+" with the admin API's tenants and plans", o)
}

// mergedYAML lays laid over data as YAML and parses the document that
// makes: the way to the errors of a merge that does not validate, each on
// its line of that document.
func mergedYAML(data []byte, filename string, laid []laidRecord, opts ...Option) (*Policy, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, fmt.Errorf("policy: %s: %w", filename, err)
	}
	if root.Kind != yaml.DocumentNode || len(root.Content) == 0 {
		root = yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{{Kind: yaml.MappingNode, Tag: "!!map"}}}
	}
	doc := root.Content[0]
	if doc.Kind != yaml.MappingNode { // an empty file
		*doc = yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	}
	into := map[string]*yaml.Node{}
	for _, r := range laid {
		var n yaml.Node
		if err := yaml.Unmarshal(r.body, &n); err != nil || len(n.Content) == 0 {
			return nil, fmt.Errorf("policy: %s.%s (admin API record): not a section: %v", r.where, r.name, err)
		}
		if into[r.where] == nil {
			into[r.where] = mappingChild(doc, r.where)
		}
		m := into[r.where]
		m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: r.name}, n.Content[0])
	}
	merged, err := yaml.Marshal(&root)
	if err != nil {
		return nil, fmt.Errorf("policy: %s with the admin API's records: %w", filename, err)
	}
	return Parse(merged, filename+" with the admin API's tenants and plans", opts...)
}

// overlaidFingerprint is the fingerprint of data with laid over it and the
// prices file prices: each record's place, name and bytes, length-prefixed
// so that no two overlays hash alike.
func overlaidFingerprint(data []byte, laid []laidRecord, prices []byte) string {
	h := sha256.New()
	h.Write(data)
	var n [8]byte
	for _, r := range laid {
		for _, part := range [][]byte{[]byte(r.where), []byte(r.name), r.body} {
			binary.BigEndian.PutUint64(n[:], uint64(len(part)))
			h.Write(n[:])
			h.Write(part)
		}
	}
	if prices != nil {
		h.Write([]byte{0})
		h.Write(prices)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// recordCache keeps each record's decoded section with its bytes, so that
// a change of one record among thousands decodes that one. It holds the
// records of the last merge only. A nil cache decodes every time.
type recordCache struct {
	mu   sync.Mutex
	last map[recordKey]decodedRecord
}

// recordKey names a record: where is tenants or plans.
type recordKey struct{ where, name string }

type decodedRecord struct {
	body json.RawMessage
	raw  rawTenant
}

// begin starts a merge of n records: prev is what the last merge kept
// (never modified after, so read without the lock), seen collects this
// one's for end.
func (c *recordCache) begin(n int) (prev, seen map[recordKey]decodedRecord) {
	if c == nil {
		return nil, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last, make(map[recordKey]decodedRecord, n)
}

// end keeps seen, the records of a merge that decoded them all.
func (c *recordCache) end(seen map[recordKey]decodedRecord) {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.last = seen
	c.mu.Unlock()
}

// decodeRecord returns r's section decoded, from prev when it holds r
// with the same bytes, and notes it in seen (when not nil). The slices
// the validator hands on to the policy are copied: policies built from
// one decoding share none of them.
func decodeRecord(prev, seen map[recordKey]decodedRecord, r laidRecord) (rawTenant, error) {
	key := recordKey{r.where, r.name}
	d, ok := prev[key]
	if !ok || !bytes.Equal(d.body, r.body) {
		d = decodedRecord{body: r.body}
		if err := decodeStrict(r.body, &d.raw); err != nil {
			return rawTenant{}, err
		}
	}
	if seen != nil {
		seen[key] = d
	}
	rt := d.raw
	rt.AlertTiers, rt.Channels = slices.Clone(rt.AlertTiers), slices.Clone(rt.Channels)
	return rt, nil
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
