package channel

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

// fake is a kind that takes one URL setting.
type fake struct{ name string }

func (f fake) Name() string                            { return f.name }
func (fake) Delivery() notify.ChannelConfig            { return notify.DefaultChannelConfig() }
func (fake) New(Settings, Deps) (notify.Sender, error) { return nil, nil }
func (fake) Check(s Settings) error {
	return errors.Join(CheckKeys(s, "url"), CheckURL(s, "url"))
}

func TestRegistryRefusesBadAndRepeatedKinds(t *testing.T) {
	for _, kinds := range [][]Kind{{fake{"Teams"}}, {fake{"alertmanager"}}, {fake{"teams"}, fake{"teams"}}} {
		if _, err := NewRegistry(kinds...); err == nil {
			t.Errorf("NewRegistry(%v) accepted", kinds)
		}
	}
}

func TestRegistryChecksRefsAndSettings(t *testing.T) {
	r := MustRegistry(fake{"teams"}, fake{"feishu"})
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
}
