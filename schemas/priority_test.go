package schemas

import (
	"errors"
	"testing"
)

func TestParsePriorityAcceptsTheFourNamesInAnyCase(t *testing.T) {
	for in, want := range map[string]Priority{"critical": PriorityCritical, "High": PriorityHigh, " normal ": PriorityNormal, "LOW": PriorityLow} {
		if got, err := ParsePriority(in); err != nil || got != want {
			t.Errorf("ParsePriority(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "urgent", "crit", "0"} {
		if _, err := ParsePriority(in); !errors.Is(err, ErrUnknownPriority) {
			t.Errorf("ParsePriority(%q) error = %v, want ErrUnknownPriority", in, err)
		}
	}
}

func TestPriorityRanksOrderTheClasses(t *testing.T) {
	for i, p := range Priorities {
		if p.Index() != i || p.Rank() != i+1 || !p.Valid() {
			t.Errorf("%q: index %d rank %d valid %v; want index %d", p, p.Index(), p.Rank(), p.Valid(), i)
		}
	}
	if !(PriorityCritical.Rank() > PriorityHigh.Rank() && PriorityHigh.Rank() > PriorityNormal.Rank() && PriorityNormal.Rank() > PriorityLow.Rank()) {
		t.Fatal("ranks must order low < normal < high < critical")
	}
	if Priority("").Rank() != 0 || Priority("urgent").Valid() || Priority("").OrDefault() != PriorityNormal {
		t.Fatal("the empty and unknown priorities rank 0, are not valid and default to normal")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Index of an unknown priority must panic")
		}
	}()
	_ = Priority("urgent").Index()
}
