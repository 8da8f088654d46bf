// Package svgchart draws the console's line charts as inline SVG on the
// server: time on the x axis, one polyline per series, an optional
// horizontal limit line, dashed series for forecasts. The browser needs no
// script and the page no build step; the SVG scales with its container
// (viewBox, width 100%), so a chart fits a phone's width.
package svgchart

import (
	"fmt"
	"html/template"
	"math"
	"strconv"
	"strings"
	"time"
)

// Point is one value at one time.
type Point struct {
	T time.Time
	V float64
}

// Series is one line.
type Series struct {
	Name   string
	Points []Point
	// Dashed draws a forecast or an estimate rather than a measurement.
	Dashed bool
}

// Chart is a line chart over time.
type Chart struct {
	// Title names the chart for screen readers (the SVG's title).
	Title  string
	Series []Series
	// Limit, when positive, is drawn as a horizontal line labelled
	// LimitLabel.
	Limit      float64
	LimitLabel string
	// From and To bound the x axis; zero means the data's extent.
	From, To time.Time
	// Format writes a y value; nil means Compact.
	Format func(float64) string
	// Zone is the time zone of the x axis labels; nil means UTC.
	Zone *time.Location
}

// Geometry of the drawing, in SVG user units.
const (
	width, height = 640, 240
	padLeft       = 56
	padRight      = 12
	padTop        = 12
	padBottom     = 26
)

// PointCount returns how many points the chart's series hold together.
func (c Chart) PointCount() int {
	n := 0
	for _, s := range c.Series {
		n += len(s.Points)
	}
	return n
}

// SVG renders the chart.
func (c Chart) SVG() template.HTML {
	format := c.Format
	if format == nil {
		format = Compact
	}
	zone := c.Zone
	if zone == nil {
		zone = time.UTC
	}
	from, to := c.From, c.To
	ymax := c.Limit
	for _, s := range c.Series {
		for _, p := range s.Points {
			if c.From.IsZero() && (from.IsZero() || p.T.Before(from)) {
				from = p.T
			}
			if c.To.IsZero() && (to.IsZero() || p.T.After(to)) {
				to = p.T
			}
			if !math.IsNaN(p.V) && !math.IsInf(p.V, 0) {
				ymax = max(ymax, p.V)
			}
		}
	}
	if !to.After(from) {
		to = from.Add(time.Minute)
	}
	if ymax <= 0 {
		ymax = 1
	}
	ymax = niceCeil(ymax * 1.05)
	plotW, plotH := float64(width-padLeft-padRight), float64(height-padTop-padBottom)
	x := func(t time.Time) float64 {
		f := float64(t.Sub(from)) / float64(to.Sub(from))
		return padLeft + math.Max(0, math.Min(1, f))*plotW
	}
	y := func(v float64) float64 { return padTop + plotH*(1-math.Max(0, math.Min(v, ymax))/ymax) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d" preserveAspectRatio="xMidYMid meet" role="img" data-points="%d">`, width, height, c.PointCount())
	fmt.Fprintf(&b, `<title>%s</title>`, template.HTMLEscapeString(c.Title))
	// Grid and y labels: 0, half, top.
	for _, v := range []float64{0, ymax / 2, ymax} {
		fmt.Fprintf(&b, `<line class="grid" x1="%d" x2="%d" y1="%.1f" y2="%.1f"/>`, padLeft, width-padRight, y(v), y(v))
		fmt.Fprintf(&b, `<text class="ylabel" x="%d" y="%.1f">%s</text>`, padLeft-6, y(v)+4, template.HTMLEscapeString(format(v)))
	}
	// x labels: start, middle, end.
	for i, t := range []time.Time{from, from.Add(to.Sub(from) / 2), to} {
		anchor := [...]string{"start", "middle", "end"}[i]
		fmt.Fprintf(&b, `<text class="xlabel" x="%.1f" y="%d" text-anchor="%s">%s</text>`, x(t), height-8, anchor, timeLabel(t.In(zone), to.Sub(from)))
	}
	if c.Limit > 0 {
		fmt.Fprintf(&b, `<line class="limit" x1="%d" x2="%d" y1="%.1f" y2="%.1f"/>`, padLeft, width-padRight, y(c.Limit), y(c.Limit))
		label := c.LimitLabel
		if label == "" {
			label = "limit " + format(c.Limit)
		}
		fmt.Fprintf(&b, `<text class="limitlabel" x="%d" y="%.1f" text-anchor="end">%s</text>`, width-padRight-4, y(c.Limit)-4, template.HTMLEscapeString(label))
	}
	for i, s := range c.Series {
		if len(s.Points) == 0 {
			continue
		}
		class := "s" + strconv.Itoa(i%6)
		if s.Dashed {
			class += " dashed"
		}
		fmt.Fprintf(&b, `<polyline class="%s" data-series="%s" data-points="%d" points="`, class, template.HTMLEscapeString(s.Name), len(s.Points))
		for j, p := range s.Points {
			if j > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%.1f,%.1f", x(p.T), y(p.V))
		}
		b.WriteString(`"/>`)
		last := s.Points[len(s.Points)-1]
		fmt.Fprintf(&b, `<circle class="%s" cx="%.1f" cy="%.1f" r="3"><title>%s %s</title></circle>`, class, x(last.T), y(last.V),
			template.HTMLEscapeString(s.Name), template.HTMLEscapeString(format(last.V)))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // every text inside was escaped above
}

func timeLabel(t time.Time, span time.Duration) string {
	if span > 36*time.Hour {
		return t.Format("Jan 2 15:04")
	}
	return t.Format("15:04")
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten, so axis labels
// are round numbers.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// Compact writes v with a k, M or G suffix (12.5k, 3M).
func Compact(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e9:
		return trim(v/1e9) + "G"
	case a >= 1e6:
		return trim(v/1e6) + "M"
	case a >= 1e3:
		return trim(v/1e3) + "k"
	case a == 0:
		return "0"
	case a < 1:
		return strconv.FormatFloat(v, 'g', 2, 64)
	}
	return trim(v)
}

func trim(v float64) string {
	s := strconv.FormatFloat(v, 'f', 1, 64)
	return strings.TrimSuffix(s, ".0")
}
