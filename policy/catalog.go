package policy

import (
	"bytes"
	_ "embed" // the built-in price catalog
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"
)

// builtinCatalog is prices/catalog.yaml, the price list every policy
// starts from unless it says price_catalog: none.
//
//go:embed prices/catalog.yaml
var builtinCatalog []byte

// BuiltinCatalogName names the built-in catalog in errors and reports.
const BuiltinCatalogName = "policy/prices/catalog.yaml (built in)"

// MaxPricePerMillion bounds every price of a catalog or policy, per million
// tokens: a thousand dollars a token, far above any list price, so that
// an exponent typo fails the load instead of overflowing a budget.
const MaxPricePerMillion = 1e9

// CatalogTokenTypes are the token types a catalog entry may price.
var CatalogTokenTypes = []string{"input", "cached_input", "cache_write", "output", "reasoning"}

// Catalog is a dated price list in the catalog format: the built-in one,
// or a file named by the policy's prices_file (see "Prices" in the package
// doc). It is immutable.
type Catalog struct {
	// Source is the file the catalog came from.
	Source string
	// AsOf is the day its sources were read; an entry without
	// effective_from takes effect then.
	AsOf time.Time
	// Sources name where the figures come from, by provider.
	Sources map[string]string
	prices  map[string][]Price
}

type rawCatalog struct {
	Version  int               `yaml:"version"`
	Currency string            `yaml:"currency"`
	AsOf     string            `yaml:"as_of"`
	Sources  map[string]string `yaml:"sources"`
	Prices   []rawCatalogPrice `yaml:"prices"`
}

type rawCatalogPrice struct {
	Model         string     `yaml:"model"`
	Provider      string     `yaml:"provider"`
	Currency      string     `yaml:"currency"`
	EffectiveFrom *time.Time `yaml:"effective_from"`
	Input         *float64   `yaml:"input"`
	CachedInput   *float64   `yaml:"cached_input"`
	CacheWrite    *float64   `yaml:"cache_write"`
	Output        *float64   `yaml:"output"`
	Reasoning     *float64   `yaml:"reasoning"`
	Note          string     `yaml:"note"`
}

// ParseCatalog parses and validates a price catalog; filename is used in
// error messages only. Like Parse it reports every problem at once, each
// with its line and field.
func ParseCatalog(data []byte, filename string) (*Catalog, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, fmt.Errorf("prices: %s: %w", filename, err)
	}
	var raw rawCatalog
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&raw); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("prices: %s: %w (an entry's token types are %s)", filename, err, strings.Join(CatalogTokenTypes, ", "))
	}
	v := &validator{file: filename, root: &root}
	c := &Catalog{Source: filename, Sources: raw.Sources, prices: map[string][]Price{}}
	if raw.Version != 1 {
		v.fail("version", "is %d; this Sluice reads catalog version 1", raw.Version)
	}
	if raw.Currency == "" {
		v.fail("currency", "is required (e.g. USD): the currency of every entry without its own")
	}
	if len(raw.Sources) == 0 {
		v.fail("sources", "is required: name where the figures come from, by provider")
	}
	asOf, err := time.Parse(time.DateOnly, raw.AsOf)
	if err != nil {
		v.fail("as_of", "%q is not a date (YYYY-MM-DD): the day the sources were read is required", raw.AsOf)
	}
	c.AsOf = asOf
	for i, rp := range raw.Prices {
		path := fmt.Sprintf("prices.%d", i)
		if rp.Model == "" {
			v.fail(path+".model", "is required")
			continue
		}
		pr := Price{Model: rp.Model, Currency: raw.Currency, EffectiveFrom: asOf}
		if rp.Currency != "" {
			pr.Currency = rp.Currency
		}
		if rp.EffectiveFrom != nil {
			pr.EffectiveFrom = rp.EffectiveFrom.UTC()
		}
		for _, req := range []struct {
			name string
			x    *float64
		}{{"input", rp.Input}, {"output", rp.Output}} {
			if req.x == nil {
				v.fail(path+"."+req.name, "is required (price per million tokens, 0 to %v)", MaxPricePerMillion)
			}
		}
		v.catalogPrices(path, rp)
		pr.Prompt, pr.Completion = deref(rp.Input), deref(rp.Output)
		pr.Cached = pr.Prompt // not known: never cheaper than input
		if rp.CachedInput != nil {
			pr.Cached = *rp.CachedInput
		}
		// Not listed: the provider bills cache writes as input and
		// reasoning as output (see the catalog's header).
		pr.CacheWrite, pr.Reasoning = pr.Prompt, pr.Completion
		if rp.CacheWrite != nil {
			pr.CacheWrite = *rp.CacheWrite
		}
		if rp.Reasoning != nil {
			pr.Reasoning = *rp.Reasoning
		}
		c.prices[rp.Model] = append(c.prices[rp.Model], pr)
	}
	v.sortPrices("prices", c.prices)
	if len(v.problems) > 0 {
		sort.SliceStable(v.problems, func(i, j int) bool { return v.problems[i].Line < v.problems[j].Line })
		return nil, &Error{Problems: v.problems}
	}
	return c, nil
}

// LoadCatalog reads and parses the catalog file at path.
func LoadCatalog(path string) (*Catalog, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("prices: read %s: %w", path, err)
	}
	return ParseCatalog(data, path)
}

var builtinOnce = sync.OnceValues(func() (*Catalog, error) { return ParseCatalog(builtinCatalog, BuiltinCatalogName) })

// BuiltinCatalog returns the catalog shipped with Sluice. It never fails
// in a released build: TestBuiltinCatalogIsValid parses it.
func BuiltinCatalog() *Catalog {
	c, err := builtinOnce()
	if err != nil {
		panic("policy: the built-in price catalog is invalid: " + err.Error())
	}
	return c
}

// Prices returns every entry, by model then date.
func (c *Catalog) Prices() []Price { return sortedPrices(c.prices) }

func deref(x *float64) float64 {
	if x == nil {
		return 0
	}
	return *x
}

// catalogPrices checks every price of a catalog entry against 0 and
// MaxPricePerMillion.
func (v *validator) catalogPrices(path string, rp rawCatalogPrice) {
	for i, x := range []*float64{rp.Input, rp.CachedInput, rp.CacheWrite, rp.Output, rp.Reasoning} {
		if x != nil {
			v.price(path+"."+CatalogTokenTypes[i], *x)
		}
	}
}

// priceOr checks the optional price x and returns it, or def when it is
// not set.
func (v *validator) priceOr(path string, x *float64, def float64) float64 {
	if x == nil {
		return def
	}
	v.price(path, *x)
	return *x
}

// price checks one price per million tokens.
func (v *validator) price(path string, x float64) {
	if x < 0 || x > MaxPricePerMillion || x != x {
		v.fail(path, "price %v is outside 0..%v (per million tokens)", x, MaxPricePerMillion)
	}
}

// sortPrices orders each model's entries by date and reports two entries
// of one model with the same date.
func (v *validator) sortPrices(path string, prices map[string][]Price) {
	for model, list := range prices {
		sort.SliceStable(list, func(i, j int) bool { return list[i].EffectiveFrom.Before(list[j].EffectiveFrom) })
		for i := 1; i < len(list); i++ {
			if list[i].EffectiveFrom.Equal(list[i-1].EffectiveFrom) {
				v.fail(path, "model %s has two prices effective from %s", model, list[i].EffectiveFrom.Format(time.RFC3339))
			}
		}
	}
}

func sortedPrices(m map[string][]Price) []Price {
	var out []Price
	for _, list := range m {
		out = append(out, list...)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Model != out[j].Model {
			return out[i].Model < out[j].Model
		}
		return out[i].EffectiveFrom.Before(out[j].EffectiveFrom)
	})
	return out
}

// pricesFilePath resolves a policy's prices_file against the policy
// file's folder.
func pricesFilePath(policyFile, pricesFile string) string {
	if pricesFile == "" || filepath.IsAbs(pricesFile) {
		return pricesFile
	}
	return filepath.Join(filepath.Dir(policyFile), pricesFile)
}

// PricesFileOf returns the prices file the policy document data (read from
// policyFile) names, resolved against policyFile's folder, or "" when it
// names none. It reads only that one field, so it answers for a file
// whose other parts are broken: `sluicectl prices import` uses it to know
// where to write.
func PricesFileOf(data []byte, policyFile string) (string, error) {
	var head struct {
		PricesFile string `yaml:"prices_file"`
	}
	if err := yaml.Unmarshal(data, &head); err != nil {
		return "", fmt.Errorf("policy: %s: %w", policyFile, err)
	}
	return pricesFilePath(policyFile, head.PricesFile), nil
}

// layerPrices lays over base, model by model, the models over names: a
// model over names is priced by over's entries alone (see "Prices").
func layerPrices(base, over map[string][]Price) map[string][]Price {
	out := make(map[string][]Price, len(base)+len(over))
	for m, l := range base {
		out[m] = l
	}
	for m, l := range over {
		out[m] = l
	}
	return out
}
