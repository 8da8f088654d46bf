module github.com/sluicehq/sluice/gateway

go 1.26.0

require (
	github.com/sluicehq/sluice/platform v0.0.0
	github.com/sluicehq/sluice/schemas v0.0.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/prometheus/client_golang v1.25.0 // indirect
	github.com/redis/go-redis/v9 v9.23.0 // indirect
	github.com/twmb/franz-go v1.22.3 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)

replace (
	github.com/sluicehq/sluice/platform => ../platform
	github.com/sluicehq/sluice/schemas => ../schemas
)
