module github.com/sluicehq/sluice/services/ingest

go 1.26.0

require (
	github.com/sluicehq/sluice/gateway v0.0.0
	github.com/sluicehq/sluice/migrations v0.0.0
	github.com/sluicehq/sluice/platform v0.0.0
	github.com/sluicehq/sluice/schemas v0.0.0
)

require (
	github.com/prometheus/client_golang v1.25.0 // indirect
	github.com/twmb/franz-go v1.22.3 // indirect
)

replace (
	github.com/sluicehq/sluice/gateway => ../../gateway
	github.com/sluicehq/sluice/migrations => ../../migrations
	github.com/sluicehq/sluice/platform => ../../platform
	github.com/sluicehq/sluice/schemas => ../../schemas
)
