package policy

import (
	"fmt"
	"os"
)

// UnpricedAction is what happens to a call of a model no price covers.
type UnpricedAction string

const (
	// UnpricedFallback serves the call and counts it at the policy's
	// unpriced_price (0 when it sets none). The default.
	UnpricedFallback UnpricedAction = "fallback"
	// UnpricedRefuse has the gateway refuse the call when the tenant has
	// a money budget: a budget cannot hold against spend it cannot price.
	// A tenant without a budget is served as with fallback.
	UnpricedRefuse UnpricedAction = "refuse"
)

// pricesFile is the prices_file a policy read, kept for its fingerprint
// and for Policy.PricesFile.
type pricesFile struct {
	path string
	data []byte
}

// PricesFile returns the prices file the policy names, resolved against
// the policy file's folder, or "" when it names none.
func (p *Policy) PricesFile() string { return p.pricesFile.path }

// layeredPrices builds the policy's price list from its layers: the
// built-in catalog (unless price_catalog: none), the prices_file, then
// the prices: section. Per model the highest layer naming it wins whole.
func (v *validator) layeredPrices(raw rawPolicy, filename string, inline map[string][]Price) (map[string][]Price, pricesFile) {
	prices := map[string][]Price{}
	switch raw.PriceCatalog {
	case "", "builtin":
		prices = layerPrices(prices, BuiltinCatalog().prices)
	case "none":
	default:
		v.fail("price_catalog", "%q is not one of builtin, none", raw.PriceCatalog)
	}
	var pf pricesFile
	if raw.PricesFile != "" {
		pf.path = pricesFilePath(filename, raw.PricesFile)
		data, err := os.ReadFile(pf.path)
		if err != nil {
			v.fail("prices_file", "cannot be read: %v", err)
		} else if c, err := ParseCatalog(data, pf.path); err != nil {
			v.fail("prices_file", "%v", err)
		} else {
			pf.data = data
			prices = layerPrices(prices, c.prices)
		}
	}
	return layerPrices(prices, inline), pf
}

func (v *validator) unpricedPrice(raw *rawUnpricedPrice) *Price {
	if raw == nil {
		return nil
	}
	if raw.Currency == "" {
		v.fail("unpriced_price.currency", "is required (e.g. USD)")
	}
	v.price("unpriced_price.prompt", raw.Prompt)
	v.price("unpriced_price.completion", raw.Completion)
	v.price("unpriced_price.cached", raw.Cached)
	return &Price{Model: "(unpriced)", Currency: raw.Currency, Prompt: raw.Prompt, Completion: raw.Completion, Cached: raw.Cached,
		CacheWrite: v.priceOr("unpriced_price.cache_write", raw.CacheWrite, raw.Prompt),
		Reasoning:  v.priceOr("unpriced_price.reasoning", raw.Reasoning, raw.Completion)}
}

// UnpricedPrice returns the policy's unpriced_price, the price the
// pipeline counts a model without a price at, and whether the file sets
// one. A nil p sets none.
func (p *Policy) UnpricedPrice() (Price, bool) {
	if p == nil || p.fallback == nil {
		return Price{}, false
	}
	return *p.fallback, true
}

// CostSpan is PriceSpan for counting: where no price is in force it
// returns the unpriced_price (zero when none is set) with priced false,
// so that every caller counts an unpriced model the same way and can
// still tell it was unpriced.
func (p *Policy) CostSpan(model string, ts int64) (pr Price, priced bool, from, until int64) {
	pr, priced, from, until = p.PriceSpan(model, ts)
	if !priced {
		pr, _ = p.UnpricedPrice()
	}
	return pr, priced, from, until
}

// Refuses reports whether the gateway refuses tenant's calls of model at
// time at: the tenant says unpriced: refuse, has a money budget, and no
// price covers the model then.
func (p *Policy) Refuses(tenant, model string, ts int64) bool {
	t := p.Tenant(tenant)
	if t.Unpriced != UnpricedRefuse || t.Budget == nil {
		return false
	}
	_, priced, _, _ := p.PriceSpan(model, ts)
	return !priced
}

// UnpricedRefusal is the message of the gateway's refusal of a call of an
// unpriced model, naming what to change.
func UnpricedRefusal(tenant, model string) string {
	return fmt.Sprintf("The model `%s` has no price, and tenant %s has a money budget with unpriced: refuse; "+
		"price the model (prices: or prices_file in the policy, or `sluicectl prices import`) or set unpriced: fallback.", model, tenant)
}
