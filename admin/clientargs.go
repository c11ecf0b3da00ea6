package admin

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
)

// ClientTimeout bounds one request of a Client from NewClientFor.
const ClientTimeout = 10 * time.Second

// NewClientFor is the client of the commands that call a running
// gateway's admin API (`gateway quota`, forward, reload, backup): the
// address is addr, else $GATEWAY_ADMIN_ADDR, else the default
// admin.addr; the token is token, else $GATEWAY_ADMIN_TOKEN, else the
// token file the gateway wrote in dataDir. Without a token it says which
// flag gives one.
func NewClientFor(addr, token, dataDir string) (*Client, error) {
	if addr == "" {
		addr = os.Getenv("GATEWAY_ADMIN_ADDR")
	}
	if addr == "" {
		addr = config.Default().Admin.Addr
	}
	if token == "" {
		token = os.Getenv("GATEWAY_ADMIN_TOKEN")
	}
	if token == "" {
		b, err := os.ReadFile(filepath.Join(dataDir, TokenFile))
		if err != nil {
			return nil, fmt.Errorf("no token: give --token or GATEWAY_ADMIN_TOKEN, or --data-dir of the gateway (%w)", err)
		}
		token = strings.TrimSpace(string(b))
	}
	return &Client{Addr: addr, Token: token, HTTP: &http.Client{Timeout: ClientTimeout}}, nil
}

// ParseWindows reads windows as `gateway quota set --windows` takes
// them: N/DURATION (messages) or SIZE/DURATION (bytes, SIZE with a
// unit), comma-separated.
func ParseWindows(s string) ([]WindowJSON, error) {
	ls, err := devicelimit.ParseLimits(s, ",")
	if err != nil {
		return nil, err
	}
	return WindowsJSON(ls), nil
}

// ParseClasses reads topic classes as `gateway quota set --class` takes
// them, NAME:WINDOWS:FILTER each, into the API's terms, in the order
// their names first appear; a class named again adds a filter and must
// repeat its windows. Each class's policy is policy.
func ParseClasses(specs []string, policy string) ([]SetClassJSON, error) {
	var out []SetClassJSON
	at := map[string]int{}
	spec := map[string]string{}
	for _, v := range specs {
		name, rest, ok1 := strings.Cut(v, ":")
		windows, filter, ok2 := strings.Cut(rest, ":")
		if !ok1 || !ok2 || name == "" || filter == "" {
			return nil, fmt.Errorf("%q is not NAME:WINDOWS:FILTER, such as alarms:2/1m:devices/+/alarm/#", v)
		}
		if i, seen := at[name]; seen {
			if spec[name] != windows {
				return nil, fmt.Errorf("class %q: windows %q, and %q in an earlier --class", name, windows, spec[name])
			}
			out[i].Topics = append(out[i].Topics, filter)
			continue
		}
		ls, err := devicelimit.ParseLimits(windows, ",")
		if err != nil {
			return nil, fmt.Errorf("class %q: %v", name, err)
		}
		q := SetQuotaJSON{Windows: WindowsJSON(ls), Policy: policy}
		if len(ls) == 1 && ls[0].Unit == devicelimit.Messages {
			q = SetQuotaJSON{Limit: ls[0].N, Window: ls[0].Window.String(), Policy: policy}
		}
		at[name], spec[name] = len(out), windows
		out = append(out, SetClassJSON{Name: name, Topics: []string{filter}, Quota: q})
	}
	return out, nil
}
