package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/schemas/internal/scalar"
)

// DecodeSignalReference is DecodeSignal with the members walked by
// encoding/json's Decoder instead of eachMember: the same judges and the
// same validation, fed by the standard library's parser. The tests hold
// DecodeSignal to its verdicts (signal_agreement_test.go).
func DecodeSignalReference(data []byte, s *Signal) error {
	return decodeSignal(string(data), s, eachMemberStd)
}

// eachMemberStd is eachMember built on encoding/json's Decoder: it was
// DecodeSignal's own walker until the hand-written one replaced it.
func eachMemberStd(data, what string, member func(key, raw string)) error {
	dec := json.NewDecoder(strings.NewReader(data))
	syntaxError := func(err error) *SyntaxError {
		var se *json.SyntaxError
		switch {
		case errors.As(err, &se):
			return &SyntaxError{Offset: se.Offset, Msg: se.Error()}
		case err == io.EOF || err == io.ErrUnexpectedEOF:
			return &SyntaxError{Offset: int64(len(data)), Msg: "unexpected end of input; " + what + " is one JSON object"}
		}
		return &SyntaxError{Offset: dec.InputOffset(), Msg: err.Error()}
	}
	if tok, err := dec.Token(); err != nil {
		return syntaxError(err)
	} else if tok != json.Delim('{') {
		rest := bytes.TrimLeft([]byte(data), " \t\r\n")
		return &SyntaxError{Offset: int64(len(data) - len(rest)),
			Msg: what + " is a JSON object, but the input starts with " + scalar.Kind(rest[0])}
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return syntaxError(err)
		}
		key := tok.(string) // json.Decoder guarantees a key after '{' or ','
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return syntaxError(err)
		}
		member(key, string(raw))
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return syntaxError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return &SyntaxError{Offset: dec.InputOffset(), Msg: "unexpected data after " + what}
	}
	return nil
}

// TestSignalFieldNamed checks that every JSON field of Signal has its own
// bit, which decodeSignal's duplicate check and validation's skip set rely on.
func TestSignalFieldNamed(t *testing.T) {
	var all signalField
	typ := reflect.TypeFor[Signal]()
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		f := signalFieldNamed(name)
		if f == 0 || f&(f-1) != 0 || all&f != 0 {
			t.Errorf("field %q: bit %b (bits so far %b)", name, f, all)
		}
		all |= f
	}
	if signalFieldNamed("Tenant") != 0 || signalFieldNamed("") != 0 {
		t.Error("names are matched exactly")
	}
}
