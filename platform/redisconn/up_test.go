package redisconn_test

import (
	"net"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
)

// TestUpReadsRedisHealth: sluice_redis_up is 1 for a client of the real
// Redis, 0 for one whose Redis does not answer, and absent for a
// component without Redis (a 0 there would page for nothing).
func TestUpReadsRedisHealth(t *testing.T) {
	live := redisconn.NewClient(itest.Redis(t))
	defer live.Close()
	// A port that was open a moment ago and is closed now: refused at once.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadCfg := redisconn.Defaults()
	deadCfg.Addr = ln.Addr().String()
	ln.Close()
	dead := redisconn.NewClient(deadCfg)
	defer dead.Close()

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(redisconn.NewUp("gateway", redisconn.Ready(live)), redisconn.NewUp("enforcer", redisconn.Ready(dead)),
		redisconn.NewUp("none", nil))
	got, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]float64{}
	for _, f := range got {
		for _, m := range f.GetMetric() {
			values[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	if values["gateway"] != 1 || values["enforcer"] != 0 || len(values) != 2 {
		t.Fatalf("sluice_redis_up = %v; want gateway 1, enforcer 0, no series for none", values)
	}
	if n := testutil.CollectAndCount(redisconn.NewUp("gateway", redisconn.Ready(live)), "sluice_redis_up"); n != 1 {
		t.Fatalf("%d series; want 1", n)
	}
}
