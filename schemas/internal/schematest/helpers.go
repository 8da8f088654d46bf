package schematest

import (
	"bytes"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
)

// testdata is schemas/testdata, wherever the test that asks runs: the
// example documents there are the contract's, shared by every subpackage.
var testdata = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "testdata")
}()

// ReadTestdata returns a file under schemas/testdata.
func ReadTestdata(tb testing.TB, name string) []byte {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(testdata, name))
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// ValidEvent returns an event that passes every rule, for tests to break
// one rule at a time.
func ValidEvent() schemas.UsageEvent {
	return schemas.UsageEvent{
		ID:               "evt-1",
		Time:             time.Date(2024, 5, 1, 12, 0, 0, 250_000_000, time.UTC),
		Tenant:           "acme",
		Model:            "gpt-4o",
		PromptTokens:     1200,
		CompletionTokens: 350,
	}
}

// EqualEvents compares events field by field, times by instant and
// attribute maps by content, treating nil and empty alike.
func EqualEvents(a, b *schemas.UsageEvent) bool {
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

// FieldErrors unwraps a ValidationError or fails the test.
func FieldErrors(tb testing.TB, err error) schemas.ValidationError {
	tb.Helper()
	var ve schemas.ValidationError
	if !errors.As(err, &ve) {
		tb.Fatalf("want a ValidationError, got %T: %v", err, err)
	}
	return ve
}

// WantFieldError checks that err is a ValidationError naming field, and
// that the reason mentions each of wantInReason.
func WantFieldError(tb testing.TB, err error, field string, wantInReason ...string) {
	tb.Helper()
	ve := FieldErrors(tb, err)
	for _, fe := range ve {
		if fe.Field != field {
			continue
		}
		for _, w := range wantInReason {
			if !strings.Contains(fe.Reason, w) {
				tb.Errorf("%s: reason %q does not mention %q", field, fe.Reason, w)
			}
		}
		return
	}
	tb.Errorf("no problem reported for %s; got %v", field, err)
}

// CheckDecodeError fails unless err is one of the documented error types,
// with every problem naming a field and a reason.
func CheckDecodeError(tb testing.TB, err error) {
	tb.Helper()
	var se *schemas.SyntaxError
	var ve schemas.ValidationError
	switch {
	case errors.As(err, &se):
		if se.Msg == "" || se.Offset < 0 {
			tb.Fatalf("bad SyntaxError %+v", se)
		}
	case errors.As(err, &ve):
		if len(ve) == 0 {
			tb.Fatal("empty ValidationError")
		}
		for _, fe := range ve {
			if fe.Field == "" || fe.Reason == "" {
				tb.Fatalf("FieldError without field or reason: %+v", fe)
			}
		}
	default:
		tb.Fatalf("unexpected error type %T: %v", err, err)
	}
}

// TypicalBatch returns a JSON array of n copies of testdata/event-typical.json,
// one per line, as a gateway sends a batch.
func TypicalBatch(tb testing.TB, n int) []byte {
	one := bytes.TrimSpace(ReadTestdata(tb, "event-typical.json"))
	var buf bytes.Buffer
	buf.WriteString("[\n")
	for i := range n {
		if i > 0 {
			buf.WriteString(",\n")
		}
		buf.Write(one)
	}
	buf.WriteString("\n]")
	return buf.Bytes()
}
