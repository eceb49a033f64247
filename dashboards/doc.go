// Package dashboards holds the Grafana dashboard for stormguard's metrics
// (package stormotel, exported with the OpenTelemetry Prometheus exporter).
//
// stormguard.json (schemaVersion 39) imports into Grafana 10.4 or later
// as is (Dashboards > New > Import, or file provisioning): it asks for a
// Prometheus data source through its "datasource" variable. A tier is the
// Prometheus job label: scrape each service under its own job (OTLP
// ingestion into Prometheus sets job from service.namespace/service.name
// already). The "job" variable filters tiers.
package dashboards

import _ "embed"

//go:embed stormguard.json
var stormguard []byte

// Stormguard returns the dashboard's JSON, for a program that provisions
// or serves it.
func Stormguard() []byte { return append([]byte(nil), stormguard...) }
