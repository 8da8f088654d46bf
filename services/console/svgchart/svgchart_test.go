package svgchart

import (
	"strings"
	"testing"
	"time"
)

func TestChartEscapesNamesAndScalesToTheLimit(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	c := Chart{Title: `<script>`, Limit: 1000, Series: []Series{{Name: `"><x`, Points: []Point{{T: t0, V: 0}, {T: t0.Add(time.Minute), V: 500}}}}}
	svg := string(c.SVG())
	if strings.Contains(svg, "<script>") || strings.Contains(svg, `"><x`) {
		t.Fatalf("unescaped text in the SVG: %s", svg)
	}
	if !strings.Contains(svg, `class="limit"`) || !strings.Contains(svg, `data-points="2"`) {
		t.Errorf("no limit line or points: %s", svg)
	}
	if got := Compact(1234567); got != "1.2M" {
		t.Errorf("Compact = %q", got)
	}
}
