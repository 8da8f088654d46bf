module github.com/sluicehq/sluice/demo

go 1.26.0

require (
	github.com/sluicehq/sluice/gateway v0.0.0
	github.com/sluicehq/sluice/schemas v0.0.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/redis/go-redis/v9 v9.23.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)

replace (
	github.com/sluicehq/sluice/gateway => ../gateway
	github.com/sluicehq/sluice/platform => ../platform
	github.com/sluicehq/sluice/policy => ../policy
	github.com/sluicehq/sluice/schemas => ../schemas
)
