package schemas

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// readTestdata returns a file under testdata/.
func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// validEvent returns an event that passes every rule, for tests to break
// one rule at a time.
func validEvent() UsageEvent {
	return UsageEvent{
		ID:               "evt-1",
		Time:             time.Date(2024, 5, 1, 12, 0, 0, 250_000_000, time.UTC),
		Tenant:           "acme",
		Model:            "gpt-4o",
		PromptTokens:     1200,
		CompletionTokens: 350,
	}
}

// equalEvents compares events field by field, times by instant and
// attribute maps by content, treating nil and empty alike.
func equalEvents(a, b *UsageEvent) bool {
	x, y := *a, *b
	if !x.Time.Equal(y.Time) {
		return false
	}
	if !maps.Equal(x.Attributes, y.Attributes) {
		return false
	}
	x.Time, y.Time = time.Time{}, time.Time{}
	x.Attributes, y.Attributes = nil, nil
	return reflect.DeepEqual(x, y)
}

// fieldErrors unwraps a ValidationError or fails the test.
func fieldErrors(t testing.TB, err error) ValidationError {
	t.Helper()
	var ve ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("want a ValidationError, got %T: %v", err, err)
	}
	return ve
}

// wantFieldError checks that err is a ValidationError naming field, and that
// the reason mentions each of wantInReason.
func wantFieldError(t testing.TB, err error, field string, wantInReason ...string) {
	t.Helper()
	ve := fieldErrors(t, err)
	for _, fe := range ve {
		if fe.Field != field {
			continue
		}
		for _, w := range wantInReason {
			if !strings.Contains(fe.Reason, w) {
				t.Errorf("%s: reason %q does not mention %q", field, fe.Reason, w)
			}
		}
		return
	}
	t.Errorf("no problem reported for %s; got %v", field, err)
}
