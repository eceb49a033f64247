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
// the middle of each sampling interval.
func rates(s []sample) plotter.XYs {
	var xys plotter.XYs
	for i := 1; i < len(s); i++ {
		dt := (s[i].t - s[i-1].t).Seconds()
		if dt <= 0 {
			continue
		}
		x := (s[i].t + s[i-1].t).Seconds() / 2
		xys = append(xys, plotter.XY{X: x, Y: float64(s[i].calls-s[i-1].calls) / dt})
	}
	return xys
}

// writeChart draws calls per second at payment over time, one line per
// mode, with the kill and each mode's restart marked, and writes it to path
// in the format its extension names. It writes a temporary file next to
// path and renames it, so a reader never sees half a chart.
// broke and back name the two marks: "payment killed" and "payment
// restarted", or for --flaky "payment failing" and "payment healthy".
func writeChart(path, title, broke, back string, rs []result) error {
	format, err := chartFormat(path)
	if err != nil {
		return err
	}
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "seconds since payment broke"
	p.Y.Label.Text = "calls per second at payment"
	p.Legend.Top = true
	p.Add(plotter.NewGrid())

	ymax := 1.0
	for i, r := range rs {
		xys := rates(r.series)
		for _, xy := range xys {
			ymax = max(ymax, xy.Y)
		}
		line, err := plotter.NewLine(xys)
		if err != nil {
			return err
		}
		line.Color = plotutil.Color(i)
		line.Width = vg.Points(1.5)
		p.Add(line)
		p.Legend.Add(r.Mode, line)
	}

	// Payment broke at 0: a vertical line.
	top := ymax * 1.4 // room for the legend above the lines
	kill, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}, {X: 0, Y: top}})
	if err != nil {
		return err
	}
	kill.Color = color.RGBA{R: 200, A: 255}
	kill.Width = vg.Points(1)
	kill.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(kill)
	p.Legend.Add(broke, kill)

	// Each mode restarts payment when its sustained phase has drained: a
	// triangle on the mode's line.
	for i, r := range rs {
		if r.restartAt <= 0 {
			continue
		}
		y := 0.0
		for _, xy := range rates(r.series) {
			if xy.X <= r.restartAt.Seconds() {
				y = xy.Y
			}
		}
		mark, err := plotter.NewScatter(plotter.XYs{{X: r.restartAt.Seconds(), Y: y}})
		if err != nil {
			return err
		}
		mark.GlyphStyle = draw.GlyphStyle{Color: plotutil.Color(i), Radius: vg.Points(5), Shape: draw.PyramidGlyph{}}
		p.Add(mark)
		if i == 0 {
			legend := *mark
			legend.GlyphStyle.Color = color.Black
			p.Legend.Add(back, &legend)
		}
	}
	p.X.Min = -0.2
	p.Y.Min = 0
	p.Y.Max = top

	wt, err := p.WriterTo(8*vg.Inch, 4.5*vg.Inch, format)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := wt.WriteTo(f); err != nil {
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
