package main

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// chartFormats are the file extensions the chart can be written as.
var chartFormats = []string{"svg", "png", "pdf", "eps", "jpg", "jpeg", "tif", "tiff"}

func chartFormat(path string) (string, error) {
	ext := strings.ToLower(strings.TrimPrefix(filepath.Ext(path), "."))
	for _, f := range chartFormats {
		if ext == f {
			return f, nil
		}
	}
	return "", fmt.Errorf("--chart %s: unknown format %q (want one of %s)", path, ext, strings.Join(chartFormats, ", "))
}

// rates turns the cumulative samples of a mode into calls per second, at
// the middle of each sampling interval. An interval shorter than half of
// sampleEvery (the last reading, taken when the load stopped) is left
// out: a few calls in 3 ms would read as thousands a second.
func rates(s []sample) plotter.XYs {
	var xys plotter.XYs
	for i := 1; i < len(s); i++ {
		dt := (s[i].t - s[i-1].t).Seconds()
		if dt < (sampleEvery / 2).Seconds() {
			continue
		}
		x := (s[i].t + s[i-1].t).Seconds() / 2
		xys = append(xys, plotter.XY{X: x, Y: float64(s[i].calls-s[i-1].calls) / dt})
	}
	return xys
}

// Chart geometry: one panel per mode, stacked, sharing both axes.
const (
	chartWidth  = 8 * vg.Inch
	panelHeight = 1.5 * vg.Inch
	headHeight  = 0.55 * vg.Inch // the chart's title and the key of the marks
)

// writeChart draws calls per second at payment over time, one panel per
// mode (stacked, on the same axes, so that the modes compare at a glance),
// with payment's kill as a dashed line at 0, the start of the mode's
// closed-loop users as a dotted line and its restart as a triangle. There is no legend over the lines: each panel names its mode
// and its calls at payment per user request, and the head of the chart
// says what the marks are. broke and back name them: "payment killed" and
// "payment restarted", or for --flaky "payment failing" and "payment
// healthy"; openKey and usersKey name the open loop that follows the kill
// and the closed-loop users that start at each panel's dotted line. It
// writes path in the format its extension names, through a
// temporary file next to it, so a reader never sees half a chart.
func writeChart(path, title, broke, back, openKey, usersKey string, rs []result) error {
	format, err := chartFormat(path)
	if err != nil {
		return err
	}
	if len(rs) == 0 {
		return fmt.Errorf("no mode to chart")
	}
	ymax, xmax := 1.0, 1.0
	for _, r := range rs {
		for _, xy := range rates(r.series) {
			ymax, xmax = max(ymax, xy.Y), max(xmax, xy.X)
		}
		xmax = max(xmax, r.restartAt.Seconds())
	}
	top := ymax * 1.1
	plots := make([][]*plot.Plot, len(rs))
	for i, r := range rs {
		p, err := panel(r, plotutil.Color(i), top)
		if err != nil {
			return err
		}
		p.X.Min, p.X.Max = -0.2, xmax
		if i == len(rs)-1 {
			p.X.Label.Text = "seconds since " + broke
		}
		plots[i] = []*plot.Plot{p}
	}

	c, err := draw.NewFormattedCanvas(chartWidth, headHeight+panelHeight*vg.Length(len(rs)), format)
	if err != nil {
		return err
	}
	dc := draw.New(c)
	head := plots[0][0].Title.TextStyle
	head.Font.Size = vg.Points(13)
	head.XAlign = draw.XCenter
	head.YAlign = draw.YTop
	dc.FillText(head, vg.Point{X: chartWidth / 2, Y: dc.Max.Y - vg.Points(4)}, title)
	key := head
	key.Font.Size = vg.Points(9)
	dc.FillText(key, vg.Point{X: chartWidth / 2, Y: dc.Max.Y - vg.Points(22)},
		fmt.Sprintf("dashed line at 0: %s; %s; dotted line: %s; triangle: %s; every panel on the same scale", broke, openKey, usersKey, back))
	tiles := draw.Tiles{Rows: len(rs), Cols: 1, PadTop: headHeight, PadBottom: vg.Points(4),
		PadLeft: vg.Points(4), PadRight: vg.Points(12), PadY: vg.Points(6)}
	for i, cs := range plot.Align(plots, tiles, dc) {
		plots[i][0].Draw(cs[0])
	}

	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		_ = f.Close()
		_ = os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// panel is one mode's plot: its line, the kill at 0 and its restart.
func panel(r result, c color.Color, top float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s: %.0f calls/s at payment from %d req/s, %.2f per request; %d users: %.2f per request",
		r.Mode, r.Sustained.CallsPerSecond, r.Sustained.Rate, r.Sustained.Amplification, r.ClosedLoop.Users, r.ClosedLoop.Amplification)
	p.Title.TextStyle.Font.Size = vg.Points(10)
	p.Y.Label.Text = "calls/s"
	p.Y.Min, p.Y.Max = 0, top
	p.Add(plotter.NewGrid())

	xys := rates(r.series)
	line, err := plotter.NewLine(xys)
	if err != nil {
		return nil, err
	}
	line.Color = c
	line.Width = vg.Points(1.5)
	p.Add(line)

	kill, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}, {X: 0, Y: top}})
	if err != nil {
		return nil, err
	}
	kill.Color = color.RGBA{R: 200, A: 255}
	kill.Width = vg.Points(1)
	kill.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(kill)

	if r.usersAt > 0 {
		users, err := plotter.NewLine(plotter.XYs{{X: r.usersAt.Seconds(), Y: 0}, {X: r.usersAt.Seconds(), Y: top}})
		if err != nil {
			return nil, err
		}
		users.Color = color.Gray{Y: 90}
		users.Width = vg.Points(1)
		users.Dashes = []vg.Length{vg.Points(1), vg.Points(2)}
		p.Add(users)
	}

	if r.restartAt > 0 {
		y := 0.0
		for _, xy := range xys {
			if xy.X <= r.restartAt.Seconds() {
				y = xy.Y
			}
		}
		mark, err := plotter.NewScatter(plotter.XYs{{X: r.restartAt.Seconds(), Y: y}})
		if err != nil {
			return nil, err
		}
		mark.GlyphStyle = draw.GlyphStyle{Color: c, Radius: vg.Points(5), Shape: draw.PyramidGlyph{}}
		p.Add(mark)
	}
	return p, nil
}

// checkWritableDir reports whether a file can be created next to path.
func checkWritableDir(path string) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".stormsim-check-*")
	if err != nil {
		return err
	}
	name := f.Name()
	_ = f.Close()
	return os.Remove(name)
}
