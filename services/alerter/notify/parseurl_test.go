package notify

import (
	"strings"
	"testing"
)

// TestParseURLErrorsDoNotQuoteCredentials: a malformed webhook still
// carries its credentials (DingTalk's access_token, Slack's secret path),
// and the error ends up in logs (a refused policy reload), so it names
// what is wrong without the value.
func TestParseURLErrorsDoNotQuoteCredentials(t *testing.T) {
	for raw, want := range map[string]string{
		"htps://oapi.dingtalk.com/robot/send?access_token=TOKEN4711": `scheme "htps" is not http or https`,
		"hooks.slack.com/services/T0SECRET/B0SECRET/XSECRET":         "has no scheme and host",
		"https:///services/T0SECRET/B0SECRET/XSECRET":                "has no scheme and host",
		"%zz/services/T0SECRET?access_token=TOKEN4711":               "does not parse",
	} {
		_, err := ParseURL(raw)
		if err == nil {
			t.Errorf("ParseURL(%q) accepted it", raw)
			continue
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("ParseURL(%q) = %v, want it to say %q", raw, err, want)
		}
		for _, secret := range []string{"TOKEN4711", "SECRET", "access_token"} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("ParseURL(%q) error quotes %q: %v", raw, secret, err)
			}
		}
	}
	if _, err := ParseURL("http://127.0.0.1:9093"); err != nil {
		t.Errorf("a plain http URL refused: %v", err)
	}
}
