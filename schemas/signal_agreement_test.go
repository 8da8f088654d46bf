package schemas_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/internal/schematest"
)

// checkAgainstReference holds DecodeSignal to DecodeSignalReference, the
// same judges and validation fed by encoding/json's Decoder: both accept
// with equal signals, both reject with the same problems (and equal
// partial signals), or both find the input malformed. The one known
// difference: DecodeSignal gives up past MaxNesting levels of arrays and
// objects, where encoding/json goes on to 10,000.
func checkAgainstReference(t *testing.T, data []byte) {
	t.Helper()
	var fast, ref schemas.Signal
	fastErr := schemas.DecodeSignal(data, &fast)
	refErr := schemas.DecodeSignalReference(data, &ref)
	var fastSE, refSE *schemas.SyntaxError
	fastSyntax, refSyntax := errors.As(fastErr, &fastSE), errors.As(refErr, &refSE)
	switch {
	case fastSyntax && refSyntax:
		return
	case fastSyntax && strings.Contains(fastSE.Msg, "nested too deeply"):
		return
	case fastSyntax != refSyntax:
		t.Fatalf("syntax verdicts differ: DecodeSignal %v, encoding/json %v\n%q", fastErr, refErr, data)
	}
	if !reflect.DeepEqual(fastErr, refErr) {
		t.Fatalf("problems differ:\nDecodeSignal  %v\nencoding/json %v\n%q", fastErr, refErr, data)
	}
	if !reflect.DeepEqual(fast, ref) {
		t.Fatalf("decoded signals differ:\nDecodeSignal  %+v\nencoding/json %+v\n%q", fast, ref, data)
	}
}

// agreementCorpus is every signal document the tests of this package
// know, and variations aimed at the walker: the JSON Schema corpus, every
// mutation of every field, the fuzz corpus, and documents with escapes,
// whitespace, nesting and broken syntax in every place.
func agreementCorpus(t *testing.T) []string {
	var docs []string
	for _, tc := range schematest.SignalCorpus {
		docs = append(docs, tc.Doc)
	}
	fields := []string{"id", "kind", "time", "tenant", "model", "quota", "period", "period_start", "period_end",
		"tier", "previous_tier", "direction", "used", "limit", "unit", "rate", "predicted_exhaustion", "mode",
		"reason", "source", "attributes", "future", "Tenant", "\\u0074enant", "t\\u00e9nant", ""}
	values := append([]string{`"\u0000"`, `"a\"b"`, `"\/"`, `"\ud83d\ude00"`, `"\udc00"`, `"\ud800\u0041"`, "\"\xff\"",
		"\"a\xc3\"", `{"partition":1,"partition":2}`, `{"a":"b","a":"c"}`, `{"a":"\ud800"}`, "{\"\xff\":\"x\"}",
		`{"a\u0062":"1","ab":"2"}`, `{"partition":1.0,"from_offset":1e2,"to_offset":-0}`, `[1,[2,{"a":[]}],{}]`,
		`-0.0e-0`, `1E+2`, `0.1`, `1e400`, `-1e400`, `123456789012345678901234567890`, ` "x" `},
		schematest.MutationValues...)
	for _, f := range fields {
		for _, v := range values {
			docs = append(docs, schematest.Sig(f, v))
		}
	}
	base := schematest.Sig("source", `{"partition":3,"from_offset":1,"to_offset":2}`, "attributes", `{"a":"b","c":"d"}`,
		"future", `{"x":[1,true,false,null,"y",{"z":{}}]}`, "used", "9.05e7")
	docs = append(docs,
		base,
		" \t\r\n"+strings.NewReplacer(`":`, "\" :\n", `,"`, " ,\t\"", `{`, "{ ", `}`, " }", `[`, "[ ", `]`, " ]").Replace(base)+"\n ",
		base+base, base+",", base+" x", "["+base+"]", "\ufeff"+base, strings.Replace(base, `"tier"`, `"tier","tier":70`, 1),
		strings.Replace(base, `"tier":90`, `"tier":90,"tier":90`, 1), "", " ", "{", "}", "{}", "[]", "null", `"x"`, "1",
		`{"a"}`, `{"a":}`, `{"a":1,}`, `{,}`, `{"a":1 "b":2}`, `{"a":tru}`, `{"a":truex}`, `{"a":nul}`, `{"a":-}`,
		`{"a":01}`, `{"a":1.}`, `{"a":.5}`, `{"a":1e}`, `{"a":+1}`, `{"a":"\x"}`, `{"a":"\u12"}`, `{"a":"\u12g4"}`,
		"{\"a\":\"\x01\"}", "{\"a\x01\":1}", `{"a":[1,]}`, `{"a":[1 2]}`, `{"a":{"b" 1}}`, `{"a":{"b":1,}}`, `{"a":{1:2}}`,
		`{'a':1}`, `{a:1}`, "{\"a\":1}\x00",
		strings.Repeat(`{"a":`, 600)+"1"+strings.Repeat("}", 600),
		schematest.Sig("future", strings.Repeat("[", 100)+strings.Repeat("]", 100)),
	)
	// Every prefix of a document with every kind of value.
	for i := range len(base) {
		docs = append(docs, base[:i])
	}
	// The fuzz corpus, seeds found by fuzzing included.
	files, _ := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzDecodeSignal", "*"))
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			if lit, ok := strings.CutPrefix(line, "[]byte("); ok {
				if s, err := strconv.Unquote(strings.TrimSuffix(lit, ")")); err == nil {
					docs = append(docs, s)
				}
			}
		}
	}
	return docs
}

// TestDecodeSignalAgreesWithEncodingJSON holds the hand-written walker to
// encoding/json's verdicts over the agreement corpus.
func TestDecodeSignalAgreesWithEncodingJSON(t *testing.T) {
	docs := agreementCorpus(t)
	if len(docs) < 2500 {
		t.Fatalf("agreement corpus has %d documents; keep at least 2,500", len(docs))
	}
	for i, doc := range docs {
		t.Run(strconv.Itoa(i), func(t *testing.T) { checkAgainstReference(t, []byte(doc)) })
	}
}
