package message

import (
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/services/alerter/alert"
)

func BenchmarkRenderSingle(b *testing.B) {
	r, err := New("en", "", Links{Dashboard: "https://g/{tenant}"}, 50)
	if err != nil {
		b.Fatal(err)
	}
	m := alert.Message{Alerts: []alert.Alert{sampleAlert("zh")}}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := r.Message(&m, Markdown); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRenderIncident500(b *testing.B) {
	r, err := New("en", "", Links{}, 50)
	if err != nil {
		b.Fatal(err)
	}
	var m alert.Message
	for i := 0; i < 500; i++ {
		a := sampleAlert("en")
		a.Key.Tenant = fmt.Sprint("t", i)
		m.Alerts = append(m.Alerts, a)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := r.Message(&m, Slack); err != nil {
			b.Fatal(err)
		}
	}
}
