package channel

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

// fake is a kind called name that takes one URL setting.
func fake(name string) Kind {
	return Kind{Name: name, Delivery: notify.DefaultChannelConfig(), Keys: []string{"url"}, URL: "url",
		New: func(Settings, Deps) (notify.Sender, error) { return nil, nil }}
}

func TestRegistryRefusesBadAndRepeatedKinds(t *testing.T) {
	for _, kinds := range [][]Kind{{fake("Teams")}, {fake("alertmanager")}, {fake("teams"), fake("teams")}} {
		if _, err := NewRegistry(kinds...); err == nil {
			t.Errorf("NewRegistry(%s) accepted", kinds[0].Name)
		}
	}
}

// TestRegistryRefusesIncompleteKinds: a kind missing a part is refused
// when the registry is built, not when a channel of it is first defined.
func TestRegistryRefusesIncompleteKinds(t *testing.T) {
	for what, spoil := range map[string]func(*Kind){
		"no URL":          func(k *Kind) { k.URL = "" },
		"URL not in Keys": func(k *Kind) { k.URL = "webhook" },
		"no New":          func(k *Kind) { k.New = nil },
		"no Delivery":     func(k *Kind) { k.Delivery = notify.ChannelConfig{} },
		"a zero rate":     func(k *Kind) { k.Delivery.RatePerMinute = 0 },
	} {
		k := fake("teams")
		spoil(&k)
		if _, err := NewRegistry(k); err == nil {
			t.Errorf("%s: NewRegistry accepted", what)
		}
	}
}

func TestRegistryChecksRefsAndSettings(t *testing.T) {
	r := MustRegistry(fake("teams"), fake("feishu"))
	for _, ok := range []string{"alertmanager", "teams:ops", "feishu:a.b"} {
		if err := r.CheckRef(ok); err != nil {
			t.Errorf("CheckRef(%q) = %v", ok, err)
		}
	}
	err := r.CheckRef("pager:ops")
	if err == nil || err.Error() != `"pager:ops" is not a channel; use alertmanager, feishu:<name> or teams:<name>` {
		t.Errorf("CheckRef(pager:ops) = %v", err)
	}
	if err := r.Check("pager", Settings{}); err == nil || !strings.Contains(err.Error(), "feishu, teams") {
		t.Errorf("unknown kind: %v", err)
	}
	err = r.Check("teams", Settings{"url": "ftp://x", "urll": "https://x"})
	var se *policy.SettingError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), `urll: unknown setting; this kind takes url`) ||
		!strings.Contains(err.Error(), `url: scheme "ftp" is not http or https`) {
		t.Errorf("bad settings: %v", err)
	}
	if _, err := r.New("teams", Settings{"url": "nope"}, Deps{}); err == nil {
		t.Error("New built a sender from settings Check refuses")
	}
	if err := r.Check("teams", Settings{"url": "https://x"}); err != nil {
		t.Errorf("good settings: %v", err)
	}
}

// TestCheckRunsCheckValuesAfterKeysAndURL: a kind's own checks add to the
// common ones, and the nil errors they return are dropped.
func TestCheckRunsCheckValuesAfterKeysAndURL(t *testing.T) {
	k := fake("teams")
	k.CheckValues = func(s Settings) []error {
		return []error{nil, &policy.SettingError{Key: "url", Err: errors.New("has no token")}}
	}
	err := k.Check(Settings{"url": "ftp://x"})
	if err == nil || !strings.HasPrefix(err.Error(), `url: scheme "ftp" is not http or https`) ||
		!strings.HasSuffix(err.Error(), "\nurl: has no token") {
		t.Errorf("Check = %q", err)
	}
}
