package dashboards

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
	"github.com/stormguard/stormguard/stormotel"
)

// The exported-names test runs a gRPC chain.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// exported runs a scripted outage through a chain with stormguard and
// stormotel in every process, exports through the OpenTelemetry Prometheus
// exporter into a registry, and returns the series names it produced
// (histograms as their _bucket, _sum and _count series) and, for each,
// its label names (le for buckets).
func exported(t *testing.T) map[string][]string {
	t.Helper()
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	m, err := stormotel.New(mp)
	if err != nil {
		t.Fatal(err)
	}
	frozen := clock.NewFake(time.Unix(1_000_000, 0))
	set, err := breaker.NewSet(breaker.Config{ConsecutiveFailures: 3, Clock: frozen}, 0) // New reports its changes to m
	if err != nil {
		t.Fatal(err)
	}
	m.TrackBreakers(set)
	// One Metrics for every process: the names do not depend on how the
	// processes are split. The edge's client has a throttle, every other
	// hop a budget and a breaker.
	newInterceptors := func(opts ...interceptor.Option) *interceptor.Interceptors {
		ic, err := interceptor.New(append(opts, interceptor.WithObserver(m),
			interceptor.WithBackoff(interceptor.Backoff{Base: time.Microsecond, Cap: time.Microsecond}))...)
		if err != nil {
			t.Fatal(err)
		}
		m.TrackLimiters(ic)
		return ic
	}
	edge := newInterceptors(interceptor.WithThrottle(budget.ThrottleConfig{}))
	tiers := newInterceptors(interceptor.WithBreaker(set), interceptor.WithBudget(budget.Config{Clock: frozen}))
	c := testsvc.New(t, testsvc.Config{
		DialOptions: func(hop int) []grpc.DialOption {
			if hop == 0 {
				return edge.DialOptions()
			}
			return tiers.DialOptions()
		},
		ServerOptions: func(int) []grpc.ServerOption { return tiers.ServerOptions() },
	})
	c.Tier("payment").SetDown(codes.Unavailable)
	for range 3 { // the third request finds the breaker open
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, _ = c.Client().Unary(ctx, &testsvcv1.UnaryRequest{})
		cancel()
	}
	exportAdmission(t, mp)
	exportAdaptive(t, mp)

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, f := range families {
		var labels []string
		for _, met := range f.GetMetric() {
			for _, l := range met.GetLabel() {
				if !slices.Contains(labels, l.GetName()) {
					labels = append(labels, l.GetName())
				}
			}
		}
		slices.Sort(labels)
		name := f.GetName()
		if f.GetType() == dto.MetricType_HISTOGRAM {
			out[name+"_bucket"] = slices.Concat(labels, []string{"le"})
			out[name+"_sum"] = labels
			out[name+"_count"] = labels
		} else {
			out[name] = labels
		}
	}
	return out
}

// wantSeries are the series the package doc's table promises, under the
// exporter's names.
var wantSeries = []string{
	"stormguard_client_attempts_total",
	"stormguard_client_attempt_duration_seconds_bucket",
	"stormguard_client_retries_total",
	"stormguard_client_retry_refusals_total",
	"stormguard_client_retry_delay_seconds_bucket",
	"stormguard_server_request_attempt_bucket",
	"stormguard_server_request_depth_bucket",
	"stormguard_server_request_upstream_retries_bucket",
	"stormguard_server_pushbacks_total",
	"stormguard_breaker_state",
	"stormguard_breaker_transitions_total",
	"stormguard_budget_ratio",
	"stormguard_throttle_tokens",
	"stormguard_admission_overloaded",
	"stormguard_admission_in_flight",
	"stormguard_admission_latency_seconds",
	"stormguard_admission_queue",
	"stormguard_admission_refusals_total",
	"stormguard_health_serving",
	"stormguard_health_not_serving_total",
	"stormguard_adaptive_refusals_total",
	"stormguard_adaptive_probes_total",
	"stormguard_adaptive_transitions_total",
	"stormguard_adaptive_rejection_probability_ratio",
	"stormguard_adaptive_down",
}

func TestExportedNames(t *testing.T) {
	series := exported(t)
	for _, name := range slices.Sorted(maps.Keys(series)) {
		t.Logf("%s %v", name, series[name])
	}
	for _, name := range wantSeries {
		if _, ok := series[name]; !ok {
			t.Errorf("series %s not exported", name)
		}
	}
}

// The dashboard, as far as the test reads it.
type (
	dashboard struct {
		UID           string     `json:"uid"`
		Title         string     `json:"title"`
		SchemaVersion int        `json:"schemaVersion"`
		Panels        []panel    `json:"panels"`
		Templating    templating `json:"templating"`
		Time          *struct {
			From string `json:"from"`
			To   string `json:"to"`
		} `json:"time"`
	}
	panel struct {
		ID         int         `json:"id"`
		Type       string      `json:"type"`
		Title      string      `json:"title"`
		GridPos    *gridPos    `json:"gridPos"`
		Datasource *datasource `json:"datasource"`
		Targets    []target    `json:"targets"`
	}
	gridPos    struct{ X, Y, W, H int }
	datasource struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	}
	target struct {
		RefID        string      `json:"refId"`
		Expr         string      `json:"expr"`
		LegendFormat string      `json:"legendFormat"`
		Datasource   *datasource `json:"datasource"`
	}
	templating struct {
		List []variable `json:"list"`
	}
	variable struct {
		Name       string      `json:"name"`
		Type       string      `json:"type"`
		Query      any         `json:"query"`
		Definition string      `json:"definition"`
		Datasource *datasource `json:"datasource"`
	}
)

// panelTypes are the panel types the dashboard may use: core panels of
// Grafana 10 and later, no plugins.
var panelTypes = []string{"timeseries", "state-timeline", "heatmap", "stat", "bargauge", "gauge", "table"}

// promql are the PromQL functions, aggregations and keywords the
// expressions may use.
var promql = []string{
	"sum", "max", "min", "avg", "count", "rate", "increase", "irate", "histogram_quantile",
	"clamp_min", "clamp_max", "by", "without", "on", "ignoring", "group_left", "group_right",
	"and", "or", "unless", "bool", "offset",
}

// grafanaVars are Grafana's built-in variables.
var grafanaVars = []string{"__rate_interval", "__interval", "__range"}

// alwaysLabels are added by Prometheus at scrape time.
var alwaysLabels = []string{"job", "instance"}

var (
	reString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	reSelector = regexp.MustCompile(`([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}`)
	reMatcher  = regexp.MustCompile(`^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"`)
	reGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	reRange    = regexp.MustCompile(`\[[^\]]*\]`)
	reIdent    = regexp.MustCompile(`\b[A-Za-z_:][A-Za-z0-9_:]*\b`)
	reVar      = regexp.MustCompile(`\$\{?(\w+)\}?`)
	reLegend   = regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`)
	reNameRE   = regexp.MustCompile(`__name__=~"([^"]*)"`)
)

func loadDashboard(t *testing.T) (dashboard, map[string]any) {
	t.Helper()
	data := Stormguard()
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("stormguard.json: %v", err)
	}
	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	return d, raw
}

func TestDashboardStructure(t *testing.T) {
	d, raw := loadDashboard(t)
	for _, key := range []string{"uid", "title", "schemaVersion", "panels", "templating", "time", "editable", "annotations"} {
		if _, ok := raw[key]; !ok {
			t.Errorf("top-level field %q missing", key)
		}
	}
	if d.Title != "stormguard" {
		t.Errorf("title: got %q, want stormguard", d.Title)
	}
	if d.UID == "" || len(d.UID) > 40 {
		t.Errorf("uid %q: want 1 to 40 characters", d.UID)
	}
	if d.SchemaVersion < 36 || d.SchemaVersion > 41 {
		t.Errorf("schemaVersion %d: want 36 to 41 (Grafana 9.4 to 12)", d.SchemaVersion)
	}
	if d.Time == nil || d.Time.From == "" || d.Time.To == "" {
		t.Errorf("time range missing")
	}
	if id, ok := raw["id"]; ok && id != nil {
		t.Errorf("id: got %v, want null (Grafana assigns it on import)", id)
	}

	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if ds, ok := vars["datasource"]; !ok || ds.Type != "datasource" || ds.Query != "prometheus" {
		t.Fatalf("templating: want a variable datasource of type datasource with query prometheus, got %+v", ds)
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" && (v.Datasource == nil || v.Datasource.Type != "prometheus" || v.Datasource.UID != "${datasource}") {
			t.Errorf("variable %s: datasource %+v, want prometheus ${datasource}", v.Name, v.Datasource)
		}
	}

	if len(d.Panels) == 0 {
		t.Fatal("no panels")
	}
	ids := map[int]bool{}
	for i, p := range d.Panels {
		name := fmt.Sprintf("panel %d (%q)", i, p.Title)
		switch {
		case p.Title == "":
			t.Errorf("%s: no title", name)
		case !slices.Contains(panelTypes, p.Type):
			t.Errorf("%s: type %q, want one of %v", name, p.Type, panelTypes)
		case p.ID == 0 || ids[p.ID]:
			t.Errorf("%s: id %d missing or repeated", name, p.ID)
		}
		ids[p.ID] = true
		if g := p.GridPos; g == nil || g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			t.Errorf("%s: gridPos %+v, want inside the 24-column grid", name, g)
		} else {
			for _, q := range d.Panels[:i] {
				if h := q.GridPos; h != nil && g.X < h.X+h.W && h.X < g.X+g.W && g.Y < h.Y+h.H && h.Y < g.Y+g.H {
					t.Errorf("%s overlaps %q", name, q.Title)
				}
			}
		}
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
			t.Errorf("%s: datasource %+v, want prometheus ${datasource}", name, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no targets", name)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.Expr == "" || tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("%s: target %+v: want an expr and a unique refId", name, tg)
			}
			refs[tg.RefID] = true
			if tg.Datasource != nil && *tg.Datasource != *p.Datasource {
				t.Errorf("%s: target %s datasource %+v differs from the panel's", name, tg.RefID, tg.Datasource)
			}
			for _, m := range reVar.FindAllStringSubmatch(tg.Expr, -1) {
				if _, ok := vars[m[1]]; !ok && !slices.Contains(grafanaVars, m[1]) {
					t.Errorf("%s: %s uses undefined variable $%s", name, tg.RefID, m[1])
				}
			}
		}
	}
}

// exprNames returns the metrics, the labels by metric (from selectors),
// the grouping labels and the other identifiers of a PromQL expression.
func exprNames(expr string) (metrics []string, selectorLabels map[string][]string, grouping, idents []string) {
	selectorLabels = map[string][]string{}
	for _, m := range reSelector.FindAllStringSubmatch(expr, -1) {
		for _, matcher := range strings.Split(m[2], ",") {
			if l := reMatcher.FindStringSubmatch(matcher); l != nil {
				selectorLabels[m[1]] = append(selectorLabels[m[1]], l[1])
			}
		}
	}
	for _, m := range reGrouping.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(m[1], ",") {
			grouping = append(grouping, strings.TrimSpace(l))
		}
	}
	rest := reString.ReplaceAllString(expr, `""`)
	rest = regexp.MustCompile(`\{[^}]*\}`).ReplaceAllString(rest, "")
	rest = reGrouping.ReplaceAllString(rest, "")
	rest = reRange.ReplaceAllString(rest, "")
	for _, id := range reIdent.FindAllString(rest, -1) {
		if strings.HasPrefix(id, "stormguard_") {
			metrics = append(metrics, id)
		} else {
			idents = append(idents, id)
		}
	}
	return metrics, selectorLabels, grouping, idents
}

func TestExprNames(t *testing.T) {
	metrics, sel, grouping, idents := exprNames(`1 - sum by (job, le) (rate(stormguard_a_bucket{job=~"$job", le=~"0|0.0"}[$__rate_interval])) / sum without(x)(stormguard_b)`)
	if fmt.Sprint(metrics, sel, grouping, idents) != "[stormguard_a_bucket stormguard_b] map[stormguard_a_bucket:[job le]] [job le x] [sum rate sum]" {
		t.Fatalf("got %v %v %v %v", metrics, sel, grouping, idents)
	}
}

// TestDashboardMetrics checks every expression against what stormotel
// really exports through the Prometheus exporter: metric names, the labels
// of selectors, groupings and legends, and the PromQL around them.
func TestDashboardMetrics(t *testing.T) {
	series := exported(t)
	d, _ := loadDashboard(t)
	used := map[string]bool{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			where := fmt.Sprintf("panel %q target %s", p.Title, tg.RefID)
			metrics, sel, grouping, idents := exprNames(tg.Expr)
			if len(metrics) == 0 {
				t.Errorf("%s: no stormguard metric in %q", where, tg.Expr)
			}
			labels := slices.Clone(alwaysLabels)
			for _, m := range metrics {
				used[m] = true
				ls, ok := series[m]
				if !ok {
					t.Errorf("%s: %s is not exported (exported: %v)", where, m, slices.Sorted(maps.Keys(series)))
					continue
				}
				labels = append(labels, ls...)
			}
			for m, ls := range sel {
				for _, l := range ls {
					if !slices.Contains(series[m], l) && !slices.Contains(alwaysLabels, l) {
						t.Errorf("%s: %s has no label %s (labels: %v)", where, m, l, series[m])
					}
				}
			}
			for _, l := range grouping {
				if !slices.Contains(labels, l) {
					t.Errorf("%s: grouping label %s is not on %v", where, l, metrics)
				}
			}
			for _, id := range idents {
				if !slices.Contains(promql, id) {
					t.Errorf("%s: unknown identifier %s in %q", where, id, tg.Expr)
				}
			}
			for _, m := range reLegend.FindAllStringSubmatch(tg.LegendFormat, -1) {
				if len(grouping) > 0 && !slices.Contains(grouping, m[1]) || !slices.Contains(labels, m[1]) {
					t.Errorf("%s: legend uses %s, which the result does not carry", where, m[1])
				}
			}
		}
	}
	// The panels the issue asks for.
	for _, m := range []string{
		"stormguard_client_retries_total", "stormguard_client_retry_refusals_total",
		"stormguard_breaker_state", "stormguard_budget_ratio",
		"stormguard_server_request_attempt_bucket", "stormguard_server_pushbacks_total",
	} {
		if !used[m] {
			t.Errorf("no panel shows %s", m)
		}
	}
	// The tier variable must find the series.
	for _, v := range d.Templating.List {
		m := reNameRE.FindStringSubmatch(v.Definition)
		if v.Type != "query" || m == nil {
			continue
		}
		re := regexp.MustCompile("^(?:" + m[1] + ")$")
		if !slices.ContainsFunc(slices.Collect(maps.Keys(series)), re.MatchString) {
			t.Errorf("variable %s: %s matches no exported series", v.Name, m[1])
		}
	}
}
