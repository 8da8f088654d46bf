package framing_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/eventjson"
	"github.com/sluicehq/sluice/schemas/framing"
	"github.com/sluicehq/sluice/schemas/internal/schematest"
)

func collectArray(t *testing.T, in string) ([]string, error) {
	t.Helper()
	var got []string
	err := framing.SplitJSONArray([]byte(in), func(i int, elem []byte) error {
		if i != len(got) {
			t.Errorf("index %d, want %d", i, len(got))
		}
		got = append(got, string(elem))
		return nil
	})
	return got, err
}

func TestSplitJSONArray(t *testing.T) {
	cases := []struct {
		in   string
		want []string
	}{
		{`[]`, nil},
		{" [ ] \n", nil},
		{`[1]`, []string{"1"}},
		{`[1,"a",true,null,-2.5e3]`, []string{"1", `"a"`, "true", "null", "-2.5e3"}},
		{`[{"a":"]"},{"b":"}\"]"}]`, []string{`{"a":"]"}`, `{"b":"}\"]"}`}},
		{`[{"a":"\\"},{"b":[1,{"c":"\\\""}]}]`, []string{`{"a":"\\"}`, `{"b":[1,{"c":"\\\""}]}`}},
		{"[\n {\"x\": [[], {}]} ,\n\t[] ]", []string{`{"x": [[], {}]}`, "[]"}},
		{`["[", "{", "\u005d"]`, []string{`"["`, `"{"`, `"\u005d"`}},
	}
	for _, tc := range cases {
		got, err := collectArray(t, tc.in)
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if strings.Join(got, "|") != strings.Join(tc.want, "|") || len(got) != len(tc.want) {
			t.Errorf("%s: got %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestSplitJSONArrayErrors(t *testing.T) {
	cases := []struct {
		in     string
		offset int64
	}{
		{``, 0},
		{`{}`, 0},
		{`[`, 1},
		{`[1`, 2},
		{`[1,]`, 3},
		{`[,1]`, 1},
		{`[1 2]`, 3},
		{`[{"a":1]`, 7},
		{`[{"a":"1}]`, 6},
		{`[1]]`, 3},
		{`[1] x`, 4},
		{`[}`, 1},
		{`[{}}]`, 3},
		{`[:]`, 1},
		{`[1,:]`, 3},
	}
	for _, tc := range cases {
		_, err := collectArray(t, tc.in)
		var se *schemas.SyntaxError
		if !errors.As(err, &se) {
			t.Errorf("%q: want *SyntaxError, got %v", tc.in, err)
			continue
		}
		if se.Offset != tc.offset {
			t.Errorf("%q: offset %d, want %d (%v)", tc.in, se.Offset, tc.offset, se)
		}
	}
}

func TestSplitJSONArrayStopsOnCallbackError(t *testing.T) {
	stop := errors.New("stop")
	calls := 0
	err := framing.SplitJSONArray([]byte(`[1,2,3]`), func(i int, _ []byte) error {
		calls++
		if i == 1 {
			return stop
		}
		return nil
	})
	if err != stop || calls != 2 {
		t.Errorf("err %v after %d calls", err, calls)
	}
}

func TestSplitJSONArrayDeepNesting(t *testing.T) {
	deep := "[" + strings.Repeat("[", 1000) + strings.Repeat("]", 1000) + "]"
	got, err := collectArray(t, deep)
	if err != nil || len(got) != 1 {
		t.Errorf("got %d elements, %v", len(got), err)
	}
}

func TestSplitTestdataBatches(t *testing.T) {
	for _, tc := range []struct {
		file  string
		split func([]byte, func(int, []byte) error) error
	}{{"batch.json", framing.SplitJSONArray}, {"batch.ndjson", framing.SplitNDJSON}} {
		var ids []string
		err := tc.split(schematest.ReadTestdata(t, tc.file), func(_ int, raw []byte) error {
			var ev schemas.UsageEvent
			if err := eventjson.DecodeUsageEvent(raw, &ev); err != nil {
				return err
			}
			ids = append(ids, ev.ID)
			return nil
		})
		if err != nil || len(ids) != 3 {
			t.Errorf("%s: %v, ids %v", tc.file, err, ids)
		}
	}
}

func TestSplitNDJSON(t *testing.T) {
	in := "\n{\"a\":1}\r\n  \n\t{\"b\":2}  \n\n{\"c\":3}"
	var got []string
	err := framing.SplitNDJSON([]byte(in), func(i int, line []byte) error {
		if i != len(got) {
			t.Errorf("index %d, want %d", i, len(got))
		}
		got = append(got, string(line))
		return nil
	})
	if err != nil || strings.Join(got, "|") != `{"a":1}|{"b":2}|{"c":3}` {
		t.Errorf("got %q, %v", got, err)
	}
	stop := errors.New("stop")
	if err := framing.SplitNDJSON([]byte("1\n2\n"), func(int, []byte) error { return stop }); err != stop {
		t.Errorf("callback error not returned: %v", err)
	}
	if err := framing.SplitNDJSON(nil, func(int, []byte) error { t.Error("called"); return nil }); err != nil {
		t.Error(err)
	}
}
