package flags

import (
	"strings"
	"testing"
	"time"
)

func TestEncodeDecodeRoundTrip(t *testing.T) {
	f := &Flag{State: StateOpen, Kind: KindQuota, Quota: "monthly_tokens", Period: "month",
		Until: time.UnixMilli(1767225600000), RetryAfter: 90 * time.Second, Limit: 1e7, Used: 10000123.5,
		ResetsAt: time.UnixMilli(1767225600000), Probes: 0, Reason: "monthly; quota exhausted"}
	got, err := Decode(Encode(f))
	if err != nil {
		t.Fatal(err)
	}
	if !got.Until.Equal(f.Until) || !got.ResetsAt.Equal(f.ResetsAt) {
		t.Fatalf("times: got %v %v", got.Until, got.ResetsAt)
	}
	got.Until, got.ResetsAt = f.Until, f.ResetsAt
	if *got != *f {
		t.Fatalf("round trip:\n got %+v\nwant %+v", *got, *f)
	}
}

func TestDecodeNamesBadElements(t *testing.T) {
	_, err := Decode("1;shut;weird;q;p;x;-1;a;b;c;d;r")
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"state", "kind", "until", "retry_after", "limit", "used", "resets_at", "probes"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if _, err := Decode("2;open;quota;;;0;0;0;0;0;0;"); err == nil || !strings.Contains(err.Error(), "format") {
		t.Errorf("unknown format version: %v", err)
	}
	if _, err := Decode("1;open"); err == nil {
		t.Error("short value accepted")
	}
}

func TestKeysAndChanges(t *testing.T) {
	k := Default.TenantKey("acme")
	if k != "sluice:flags:{acme}" {
		t.Fatal(k)
	}
	if ten, ok := Default.TenantFromKey(k); !ok || ten != "acme" {
		t.Fatal(ten, ok)
	}
	ten, v, err := ParseChange(FormatChange("acme", 42))
	if err != nil || ten != "acme" || v != 42 {
		t.Fatal(ten, v, err)
	}
	if _, _, err := ParseChange("acme"); err == nil {
		t.Fatal("accepted a message without version")
	}
}
