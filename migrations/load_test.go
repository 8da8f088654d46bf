package migrations

import (
	"strings"
	"testing"
	"testing/fstest"
)

// TestLoadRefusesAddColumnsApplyCannotRepeat: several columns in one
// ALTER, or IF NOT EXISTS (a syntax error on 18.16), are refused at load
// with the form to use.
func TestLoadRefusesAddColumnsApplyCannotRepeat(t *testing.T) {
	for _, sql := range []string{
		"ALTER TABLE t ADD COLUMN a UInt8, ADD COLUMN b UInt8;",
		"ALTER TABLE t ADD COLUMN IF NOT EXISTS a UInt8;",
	} {
		_, err := load(fstest.MapFS{"001_x.sql": {Data: []byte(sql)}})
		if err == nil || !strings.Contains(err.Error(), "one column per statement") {
			t.Errorf("%s: error %v, want one naming the form to use", sql, err)
		}
	}
	if _, err := load(fstest.MapFS{"001_x.sql": {Data: []byte("ALTER TABLE t ADD COLUMN a UInt8 DEFAULT 0;")}}); err != nil {
		t.Errorf("one column: %v", err)
	}
}
