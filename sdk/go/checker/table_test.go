package checker

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/sdk/go/flags"
)

func TestTenantHashDependsOnEveryByteAndTheLength(t *testing.T) {
	// Each length exercises a different path: the short tail, the two word
	// tails and the 16-byte rounds.
	for n := 0; n <= 70; n++ {
		base := []byte(strings.Repeat("t", n))
		h := tenantHash(string(base), 7)
		if n > 0 && h == tenantHash(string(base[:n-1]), 7) {
			t.Errorf("length %d hashes like length %d", n, n-1)
		}
		for i := range base {
			b := append([]byte(nil), base...)
			b[i] ^= 0x01
			if tenantHash(string(b), 7) == h {
				t.Errorf("length %d: flipping byte %d does not change the hash", n, i)
			}
		}
		if n > 0 && tenantHash(string(base), 8) == h {
			t.Errorf("length %d: the seed does not change the hash", n)
		}
	}
}

func TestTenantHashSpreadsSimilarNamesOverShardsAndFingerprints(t *testing.T) {
	const n = 100_000
	var shards [shardCount]int
	var top [256]int // the byte fingerprints come from
	for i := range n {
		h := tenantHash(fmt.Sprintf("tenant-%06d", i), 99)
		shards[shardIndex(h)]++
		top[h>>56]++
	}
	// A uniform spread puts about 390 names in each bucket; allow a wide
	// margin, which a hash ignoring bytes or bits would still miss by far.
	for i, c := range shards {
		if c < 250 || c > 550 {
			t.Fatalf("shard %d holds %d of %d names", i, c, n)
		}
	}
	for b, c := range top {
		if c < 250 || c > 550 {
			t.Fatalf("top byte %d taken by %d of %d names", b, c, n)
		}
	}
}

func testView(name string, hash uint64) *tenantView {
	tv := newView(0)
	tv.setName(name, hash)
	return tv
}

func TestTableTellsApartNamesThatShareHashOrFingerprint(t *testing.T) {
	long := strings.Repeat("x", inlineNameMax+1)
	// Same full hash, same fingerprint with different home slots, names
	// that are prefixes of one another, a name too long to inline, and
	// the empty name.
	const same = 0xab00_0000_0000_0100
	views := []*tenantView{
		testView("a", same),
		testView("b", same),
		testView("ab", same),
		testView(long, same),
		testView(long+"y", same),
		testView("", same),
		testView("c", 0xab00_0000_0000_0200),
		testView("d", 0x0000_0000_0000_0300), // fingerprint 0 is stored as 1
	}
	tb := newTable(views)
	if tb.n != len(views) {
		t.Fatalf("table holds %d views, want %d", tb.n, len(views))
	}
	for _, want := range views {
		if got := tb.get(want.hash, want.name); got != want {
			t.Errorf("get(%q) = %v, want its own view", want.name, got)
		}
	}
	for _, miss := range []string{"aa", "abc", "B", long + "z", long[:inlineNameMax]} {
		if got := tb.get(same, miss); got != nil {
			t.Errorf("get(%q) found %q", miss, got.name)
		}
	}
	if got := tb.get(0xab00_0000_0000_0300, "d"); got != nil {
		t.Errorf("a different hash with the same name found %q", got.name)
	}
	if got := emptyTable.get(same, "a"); got != nil {
		t.Errorf("empty table found %q", got.name)
	}
}

func TestProbesLeftSurviveChangesToOtherTenantsOfTheShard(t *testing.T) {
	c := newTestChecker(t)
	until := time.Now().Add(time.Hour)
	install(c, "acme", 1, map[string]*flags.Flag{"m": {State: flags.StateHalfOpen, Kind: flags.KindSlowCall, Probes: 2, Until: until}})
	if d := c.Check("acme", "m", ""); d.Outcome != Probe {
		t.Fatalf("first request: %+v", d)
	}
	// Rebuild acme's shard (and every other) by changing many tenants.
	for i := range 2000 {
		install(c, fmt.Sprintf("other-%d", i), 2, map[string]*flags.Flag{"*": {State: flags.StateOpen, Kind: flags.KindManual, Until: until}})
	}
	if d := c.Check("acme", "m", ""); d.Outcome != Probe {
		t.Fatalf("second request: %+v", d)
	}
	if d := c.Check("acme", "m", ""); d.Outcome != Refused {
		t.Fatalf("third request got a probe the breaker did not grant: %+v", d)
	}
}

// refFlags is the reference model of TestCheckAgreesWithAReferenceUnderChurn:
// tenant -> field -> whether that field holds a refusing flag.
type refFlags map[string]map[string]bool

func (r refFlags) refuses(tenant, model, key string) bool {
	f := r[tenant]
	return f[flags.KeyField(key)] || f[model] || f[flags.AllModels]
}

func TestCheckAgreesWithAReferenceUnderChurn(t *testing.T) {
	c := newTestChecker(t)
	rng := rand.New(rand.NewPCG(3, 4))
	names := make([]string, 3000)
	for i := range names {
		// Short, inline-sized and too-long-to-inline names.
		names[i] = fmt.Sprintf("t%d%s", i, strings.Repeat("-", i%60))
	}
	models := []string{"gpt-4o", "claude", "mini", flags.AllModels}
	until := time.Now().Add(time.Hour)
	ref := refFlags{}
	version := int64(0)
	check := func(step int) {
		t.Helper()
		for _, name := range names {
			for _, m := range models[:3] {
				for _, key := range []string{"", "k1"} {
					want := ref.refuses(name, m, key)
					if got := !c.Check(name, m, key).Allowed(); got != want {
						t.Fatalf("step %d: Check(%q, %q, %q) refuses=%v, want %v", step, name, m, key, got, want)
					}
				}
			}
		}
		if c.Tenants() != len(ref) {
			t.Fatalf("step %d: Tenants() = %d, want %d", step, c.Tenants(), len(ref))
		}
	}
	for step := range 40 {
		version++
		updates := map[string]*tenantView{}
		for range 1 + rng.IntN(400) {
			name := names[rng.IntN(len(names))]
			fields := map[string]string{flags.VersionField: fmt.Sprint(version)}
			want := map[string]bool{}
			for _, m := range models {
				if rng.IntN(4) == 0 {
					fields[m] = flags.Encode(&flags.Flag{State: flags.StateOpen, Kind: flags.KindManual, Until: until})
					want[m] = true
				}
			}
			if rng.IntN(6) == 0 {
				fields[flags.KeyField("k1")] = flags.Encode(&flags.Flag{State: flags.StateBlacklist, Kind: flags.KindBlacklist, Until: until})
				want[flags.KeyField("k1")] = true
			}
			updates[name] = c.buildView(name, fields)
			if len(want) == 0 {
				delete(ref, name)
			} else {
				ref[name] = want
			}
		}
		if step%10 == 9 {
			// A full resync that saw only these tenants drops the others.
			c.apply(updates, version, true)
			for name := range ref {
				if _, seen := updates[name]; !seen {
					delete(ref, name)
				}
			}
		} else {
			c.apply(updates, 0, false)
		}
		check(step)
	}
}
