package fleet

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// gatewayBin is the gateway built once for the process tests.
var gatewayBin string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	if role := os.Getenv(workerEnv); role != "" {
		return runWorker(role) // a simulator process of TestFleetHarness
	}
	dir, err := os.MkdirTemp("", "fleet-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	gatewayBin = filepath.Join(dir, "gateway")
	build := exec.Command("go", "build", "-o", gatewayBin, "../cmd/gateway")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build gateway: %v\n%s", err, out)
		return 1
	}
	os.Unsetenv("GATEWAY_ADMIN_TOKEN")
	return m.Run()
}
