package config

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/devicegate/devicegate/auth"
	"github.com/devicegate/devicegate/broker"
	"github.com/devicegate/devicegate/devicelimit"
)

// Validate reports every key whose value the gateway cannot run with,
// as FieldErrors naming the key and the value (joined, at most 20). The
// quota ranges are devicelimit's (Quota.Validate).
func (c Config) Validate() error {
	v := validator{badNames: c.badNames}
	if c.MQTT.TCP != "" {
		v.tcp("mqtt.tcp", c.MQTT.TCP)
	}
	v.tcp("admin.addr", c.Admin.Addr)
	v.token("admin.token", c.Admin.Token)
	switch {
	case c.DataDir == "":
		v.add("data_dir", `must name a directory (got "")`)
	case strings.ContainsRune(c.DataDir, 0):
		v.add("data_dir", fmt.Sprintf("must not contain a NUL byte (got %q)", c.DataDir))
	}
	switch si := time.Duration(c.Persist.SnapshotInterval); {
	case si <= 0:
		v.add("persist.snapshot_interval", fmt.Sprintf("must be > 0 (got %q)", si.String()))
	case si > MaxSnapshotInterval:
		v.add("persist.snapshot_interval", fmt.Sprintf("must be at most %s (got %q)", MaxSnapshotInterval, si.String()))
	}
	switch c.Persist.AfterCrash {
	case "charge", "forgive":
	default:
		v.add("persist.after_crash", fmt.Sprintf("must be charge or forgive (got %q)", c.Persist.AfterCrash))
	}
	if err := c.Persist.Lease.Policy().Validate(); err != nil {
		var fe *devicelimit.FieldError
		if errors.As(err, &fe) {
			v.add("persist.lease."+fe.Field, fe.Msg)
		} else {
			v.add("persist.lease", err.Error())
		}
	}
	if c.Persist.MinFreeBytes < 0 {
		v.add("persist.min_free_bytes", fmt.Sprintf("must be >= 0, 0 for no floor (got %d)", c.Persist.MinFreeBytes))
	}
	switch c.Persist.CheckOnStart {
	case "always", "after_crash", "never":
	default:
		v.add("persist.check_on_start", fmt.Sprintf("must be always, after_crash or never (got %q)", c.Persist.CheckOnStart))
	}

	// With a bad bucket count, check the quotas against one bucket so
	// their own mistakes still show; the bucket width then adds nothing.
	buckets := c.Limits.Buckets
	if err := validBuckets(buckets); err != nil {
		var fe *devicelimit.FieldError
		if errors.As(err, &fe) {
			v.add("limits.buckets", fe.Msg)
		}
		buckets = 1
	}
	for _, key := range c.mixed {
		v.add(key+".windows", "give limit and window, or windows, not both")
	}
	v.quota("limits.default", c.Limits.Default, buckets)
	_, err := c.Identity()
	v.name("limits.identity", err)
	names := make(map[string]int, len(c.Limits.Rules))
	for i, r := range c.Limits.Rules {
		key := fmt.Sprintf("limits.rules[%d]", i)
		name := c.Limits.RuleName(i)
		if j, dup := names[name]; dup {
			v.add(key+".name", fmt.Sprintf("%q is also the name of limits.rules[%d]; rule names must be unique", name, j))
		} else {
			names[name] = i
		}
		if r.Match.ClientID == "" && r.Match.Username == "" {
			v.add(key+".match", "needs a client_id or username pattern (or both)")
		}
		v.glob(key+".match.client_id", r.Match.ClientID)
		v.glob(key+".match.username", r.Match.Username)
		v.quota(key+".quota", r.Quota, buckets)
		v.classes(key+".classes", r.Classes, buckets)
		v.group(key+".group", r.Group, r.Match.ClientID, r.Match.Username, key+".quota", r.Quota, key+".classes", r.Classes, buckets, c.Cluster)
	}
	v.classes("limits.classes", c.Limits.Classes, buckets)
	v.group("limits.group", c.Limits.Group, "", "", "limits.default", c.Limits.Default, "limits.classes", c.Limits.Classes, buckets, c.Cluster)
	v.oneQuotaPerGroup(c.Limits)
	d := c.Limits.Defer
	if d.MaxMessagesPerDevice < 1 || d.MaxMessagesPerDevice > MaxDeferMessages {
		v.add("limits.defer.max_messages_per_device", fmt.Sprintf("must be between 1 and %d (got %d)", MaxDeferMessages, d.MaxMessagesPerDevice))
	}
	if d.MaxBytesPerDevice < 1 {
		v.add("limits.defer.max_bytes_per_device", fmt.Sprintf("must be at least 1B (got %s)", d.MaxBytesPerDevice))
	}
	if d.MaxTotalBytes < d.MaxBytesPerDevice {
		v.add("limits.defer.max_total_bytes", fmt.Sprintf("must be at least limits.defer.max_bytes_per_device, %s (got %s)", d.MaxBytesPerDevice, d.MaxTotalBytes))
	}
	if age := time.Duration(d.MaxAge); age <= 0 || age > devicelimit.MaxWindow {
		v.add("limits.defer.max_age", fmt.Sprintf("must be > 0 and at most %s (got %q)", devicelimit.MaxWindow, age.String()))
	}
	if rd := time.Duration(d.RestoreDelay); rd < 0 || rd > time.Hour {
		v.add("limits.defer.restore_delay", fmt.Sprintf("must be between 0s and 1h (got %q)", rd.String()))
	}
	_, err = c.LogLevel()
	v.name("log.level", err)
	v.logFormat(c.Log.Format)
	v.cluster(c.Cluster)
	v.ownerDefer(c)
	v.forward(c.Forward)
	c.validateSecurity(&v)
	if len(v.errs) == 0 {
		return nil
	}
	return joinErrors(v.errs, v.dropped)
}

// MaxDeferMessages bounds limits.defer.max_messages_per_device.
const MaxDeferMessages = 1_000_000

type validator struct {
	errs     []error
	dropped  int
	badNames map[string]string // Config.badNames
}

// name reports a name Parse refused under key, else err (a typed value
// no name stands for), if any.
func (v *validator) name(key string, err error) {
	if msg, ok := v.badNames[key]; ok {
		v.add(key, msg)
	} else if err != nil {
		v.add(key, err.Error())
	}
}

func (v *validator) add(key, msg string) {
	if len(v.errs) == maxErrors {
		v.dropped++
		return
	}
	v.errs = append(v.errs, &FieldError{Key: key, Msg: msg})
}

func (v *validator) tcp(key, addr string) {
	const want = `must be host:port such as ":1883" or "127.0.0.1:1883"`
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		v.add(key, fmt.Sprintf("%s (got %q)", want, addr))
		return
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		v.add(key, fmt.Sprintf("%s; the port must be a number from 0 to 65535 (got %q)", want, addr))
	}
}

// token checks a bearer token the admin API can match (see
// auth.CheckBearerToken).
func (v *validator) token(key, tok string) {
	if tok == "" {
		return // GATEWAY_ADMIN_TOKEN or the token file
	}
	if err := auth.CheckBearerToken(tok); err != nil {
		v.add(key, err.Error())
	}
}

func (v *validator) glob(key, pattern string) {
	if pattern == "" {
		return
	}
	if _, err := devicelimit.CompileGlob(pattern); err != nil {
		v.add(key, trimSentinel(err, devicelimit.ErrInvalidPattern))
	}
}

// classes checks a list of topic classes under key: names, filters and
// quotas (drop or disconnect).
func (v *validator) classes(key string, cs []Class, buckets int) {
	names := map[string]int{}
	for i, c := range cs {
		k := fmt.Sprintf("%s[%d]", key, i)
		if c.Name == "" || len(c.Name) > devicelimit.MaxClassName || strings.ContainsRune(c.Name, 0) {
			v.add(k+".name", fmt.Sprintf("must be 1 to %d bytes without NUL (got %q)", devicelimit.MaxClassName, c.Name))
		} else if j, dup := names[c.Name]; dup {
			v.add(k+".name", fmt.Sprintf("%q is also the name of %s[%d]", c.Name, key, j))
		} else if c.Name == broker.OverrideClass {
			v.add(k+".name", fmt.Sprintf("%q is reserved: the metrics count the classes only overrides name under it", c.Name))
		} else if c.Name == devicelimit.GroupPolicy {
			v.add(k+".name", fmt.Sprintf("%q names the group's windows in the RateLimit fields; choose another name", c.Name))
		}
		names[c.Name] = i
		if len(c.Topics) == 0 {
			v.add(k+".topics", "must list at least one topic filter")
		}
		for j, f := range c.Topics {
			if msg := topicFilter(f); msg != "" {
				v.add(fmt.Sprintf("%s.topics[%d]", k, j), msg)
			}
		}
		if c.Quota.Limit == 0 && c.Quota.Window == 0 && len(c.Quota.Windows) == 0 {
			v.add(k+".quota", "a class needs a quota of its own: limit and window, or windows")
			continue
		}
		v.quota(k+".quota", c.Quota, buckets)
	}
}

// quota checks q under key with devicelimit's ranges; the field
// devicelimit names goes into the key ("limits.default.limit: must be
// ...").
func (v *validator) quota(key string, q Quota, buckets int) {
	if _, bad := v.badNames[key+".policy"]; bad {
		v.name(key+".policy", nil)
		q.Policy = devicelimit.PolicyDrop // reported: check the rest
	}
	for i, w := range q.Windows {
		if (w.Messages != 0) == (w.Bytes != 0) {
			v.add(fmt.Sprintf("%s.windows[%d]", key, i), fmt.Sprintf("give messages or bytes, one of them (got messages %d, bytes %d)", w.Messages, w.Bytes))
			return
		}
	}
	if err := q.Quota().Validate(buckets); err != nil {
		v.field(key, err)
	}
}

// field adds err under key, with the field a *devicelimit.FieldError
// names appended to the key; the bucket count is reported where it is
// checked (limits.buckets), not under each quota.
func (v *validator) field(key string, err error) {
	var fe *devicelimit.FieldError
	if !errors.As(err, &fe) {
		v.add(key, err.Error())
		return
	}
	if fe.Field != "buckets" {
		v.add(key+"."+fe.Field, fe.Msg)
	}
}

// validBuckets checks a bucket count with devicelimit's own range,
// which Quota.Validate checks before anything else.
func validBuckets(buckets int) error {
	err := devicelimit.Quota{Limit: 1, Window: devicelimit.MaxWindow}.Validate(buckets)
	if errors.Is(err, devicelimit.ErrInvalidBuckets) {
		return err
	}
	return nil
}

// trimSentinel drops devicelimit's "invalid quota: " style prefix, which
// the key in front of the message already says.
func trimSentinel(err, sentinel error) string {
	return strings.TrimPrefix(err.Error(), sentinel.Error()+": ")
}
