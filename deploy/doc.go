// Package deploy holds no code: it is the configuration for the backing
// services and Docker Compose (the folders beside this file), and its
// tests check what can be checked without Docker: that the Prometheus
// rules pass promtool (check and unit tests), and that every metric the
// Grafana dashboards and the rules query is one a Sluice service
// registers.
package deploy
