package fenceqweb

import (
	"fmt"
	"math"
	"time"

	"github.com/fenceq/fenceq/queue"
)

// chart is the overview's throughput chart as SVG geometry, drawn on the server: jobs
// finished per interval above the axis (completed, discarded and cancelled, stacked),
// failed attempts below it on a scale of their own. The template only places the
// shapes; colours come from the stylesheet's classes.
type chart struct {
	W, H   float64
	Bars   []chartShape
	Lines  []chartShape
	Labels []chartLabel
	// Totals over the whole window.
	Completed, Discarded, Cancelled, Failed int64
	Bucket                                  time.Duration
	Capped                                  bool
}

type chartShape struct {
	X, Y, W, H float64
	Class      string
	Title      string
}

type chartLabel struct {
	X, Y   float64
	Text   string
	Anchor string
	Class  string
}

// Chart layout, in SVG user units.
const (
	chartW       = 760.0
	chartH       = 230.0
	chartLeft    = 48.0
	chartRight   = 8.0
	chartTop     = 12.0
	chartUpper   = 130.0 // height of the finished-jobs area
	chartGap     = 4.0
	chartLower   = 56.0 // height of the failed-attempts area
	chartXLabels = 22.0
)

func buildChart(t *queue.Throughput, loc *time.Location) chart {
	c := chart{W: chartW, H: chartH, Bucket: t.Bucket, Capped: t.Capped}
	n := len(t.Buckets)
	if n == 0 {
		return c
	}
	var maxUp, maxDown int64
	for _, b := range t.Buckets {
		maxUp = max(maxUp, b.Completed+b.Discarded+b.Cancelled)
		maxDown = max(maxDown, b.Failed)
		c.Completed += b.Completed
		c.Discarded += b.Discarded
		c.Cancelled += b.Cancelled
		c.Failed += b.Failed
	}
	upScale, downScale := niceCeil(maxUp), niceCeil(maxDown)
	plotW := chartW - chartLeft - chartRight
	slot := plotW / float64(n)
	barW := math.Max(slot*0.78, 1)
	axisY := chartTop + chartUpper
	downTop := axisY + chartGap
	for i, b := range t.Buckets {
		x := chartLeft + float64(i)*slot + (slot-barW)/2
		title := fmt.Sprintf("%s: %d completed, %d discarded, %d cancelled, %d failed attempts",
			b.Start.In(loc).Format("15:04"), b.Completed, b.Discarded, b.Cancelled, b.Failed)
		// The finished jobs, stacked from the axis up.
		y := axisY
		for _, part := range []struct {
			n     int64
			class string
		}{{b.Completed, "bar-completed"}, {b.Discarded, "bar-discarded"}, {b.Cancelled, "bar-cancelled"}} {
			if part.n == 0 {
				continue
			}
			hgt := chartUpper * float64(part.n) / float64(upScale)
			y -= hgt
			c.Bars = append(c.Bars, chartShape{X: x, Y: y, W: barW, H: hgt, Class: part.class, Title: title})
		}
		if b.Failed > 0 {
			hgt := chartLower * float64(b.Failed) / float64(downScale)
			c.Bars = append(c.Bars, chartShape{X: x, Y: downTop, W: barW, H: hgt, Class: "bar-failed", Title: title})
		}
		// A transparent column over the whole slot carries the tooltip for empty buckets too.
		c.Bars = append(c.Bars, chartShape{X: chartLeft + float64(i)*slot, Y: chartTop, W: slot,
			H: chartUpper + chartGap + chartLower, Class: "bar-hit", Title: title})
		// A label every ten intervals, on whole multiples of ten intervals (10:20, 10:30).
		if every := int64(10 * t.Bucket / time.Second); every > 0 && b.Start.Unix()%every == 0 {
			c.Labels = append(c.Labels, chartLabel{X: x + barW/2, Y: chartH - 6, Text: b.Start.In(loc).Format("15:04"),
				Anchor: "middle", Class: "chart-x"})
		}
	}
	// Axis, the top of each scale, and their labels.
	c.Lines = append(c.Lines,
		chartShape{X: chartLeft, Y: axisY, W: plotW, Class: "chart-axis"},
		chartShape{X: chartLeft, Y: chartTop, W: plotW, Class: "chart-grid"},
		chartShape{X: chartLeft, Y: chartTop + chartUpper/2, W: plotW, Class: "chart-grid"},
		chartShape{X: chartLeft, Y: downTop + chartLower, W: plotW, Class: "chart-grid"},
	)
	c.Labels = append(c.Labels,
		chartLabel{X: chartLeft - 6, Y: chartTop + 4, Text: formatInt(upScale), Anchor: "end", Class: "chart-y"},
		chartLabel{X: chartLeft - 6, Y: chartTop + chartUpper/2 + 4, Text: formatInt(upScale / 2), Anchor: "end", Class: "chart-y"},
		chartLabel{X: chartLeft - 6, Y: axisY + 4, Text: "0", Anchor: "end", Class: "chart-y"},
		chartLabel{X: chartLeft - 6, Y: downTop + chartLower, Text: formatInt(downScale), Anchor: "end", Class: "chart-y chart-y-failed"},
	)
	return c
}

// niceCeil rounds n up to an even number that reads well as the top of a scale (2, 4,
// 5, 6 or 8 times a power of ten, or the next power), so that its half is whole too.
func niceCeil(n int64) int64 {
	if n <= 2 {
		return 2
	}
	p := int64(1)
	for p*10 < n {
		p *= 10
	}
	for _, m := range []int64{2, 4, 5, 6, 8, 10} {
		if v := m * p; v >= n && v%2 == 0 {
			return v
		}
	}
	return 10 * p
}
