package scalar

import "testing"

func TestParseInt(t *testing.T) {
	cases := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"-0", 0, true}, {"123", 123, true}, {"-123", -123, true},
		{"999999999999999999", 999999999999999999, true},
		{"9223372036854775807", 9223372036854775807, true},
		{"9223372036854775808", 0, false},
		{"-9223372036854775807", -9223372036854775807, true},
		{"1.0", 1, true}, {"1.5", 0, false}, {"10e-1", 1, true}, {"1e18", 1e18, true},
		{"1e19", 0, false}, {"0.0001e4", 1, true}, {"123456789012345678.9e1", 1234567890123456789, true},
		{"1e-400", 0, false}, {"0e399", 0, true}, {"1e401", 0, false}, {"0e401", 0, false},
		{"1E+2", 100, true}, {"100e-2", 1, true}, {"000", 0, true},
	}
	for _, tc := range cases {
		got, reason := ParseInt(tc.in, 1, "Lim")
		if (reason == "") != tc.ok || tc.ok && got != tc.want {
			t.Errorf("ParseInt(%s) = %d, %q; want %d ok=%v", tc.in, got, reason, tc.want, tc.ok)
		}
	}
}
