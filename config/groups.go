package config

import (
	"fmt"

	"github.com/devicegate/devicegate/devicelimit"
)

// Group puts the devices of a rule (or of the default quota) in a
// group: windows shared by all of them, checked with each device's own
// (docs/quotas.md, "Groups and tenants").
type Group struct {
	// Name is the group's name, or a template of it: fixed text and
	// parts, {client_id}, {username}, or a named part of the rule's
	// match patterns ("{tenant}" with client_id "tenant-{tenant}-*").
	Name string `yaml:"name"`
	// Quota is the group's windows (limit and window, or windows) and
	// enforce; a group has no policy (the device's applies) and no
	// block.
	Quota Quota `yaml:"quota"`
}

// group returns g in devicelimit's terms; nil for none.
func (g *Group) group() *devicelimit.Group {
	if g == nil {
		return nil
	}
	return &devicelimit.Group{Name: g.Name, Quota: g.Quota.Quota()}
}

// group checks the group g of the rule (or default) under key, whose
// match patterns are clientID and username and whose own quota (and
// classes) are q and cs, under the keys qkey and ckey.
func (v *validator) group(key string, g *Group, clientID, username, qkey string, q Quota, ckey string, cs []Class, buckets int, cluster Cluster) {
	if g == nil {
		return
	}
	parts := []string{devicelimit.PartClientID, devicelimit.PartUsername}
	for _, p := range []string{clientID, username} {
		if p == "" {
			continue
		}
		if gl, err := devicelimit.CompileGlob(p); err == nil {
			parts = append(parts, gl.Names()...)
		}
	}
	if g.Name == "" {
		v.add(key+".name", `must name the group: fixed text, or a template such as "{tenant}" or "{username}"`)
	} else if _, err := devicelimit.CompileTemplate(g.Name, parts); err != nil {
		v.add(key+".name", err.Error())
	}
	gq := g.Quota
	switch {
	case gq.Limit == 0 && gq.Window == 0 && len(gq.Windows) == 0 && gq.Enforce != nil:
		v.add(key+".quota.enforce", "sets shadow mode on windows that do not exist: give the group limit and window, or windows")
	case gq.Limit == 0 && gq.Window == 0 && len(gq.Windows) == 0:
		v.add(key+".quota", "a group needs windows of its own: limit and window, or windows")
	case gq.Block != nil:
		v.add(key+".quota.block", "a group has no block: blocking is per device (give it in the rule's quota)")
	case gq.Policy != devicelimit.PolicyDrop:
		v.add(key+".quota.policy", fmt.Sprintf("a group has no policy: the device's applies (got %s)", gq.Policy))
	default:
		v.quota(key+".quota", gq, buckets)
	}
	if q.Policy == devicelimit.PolicyDefer {
		v.add(qkey+".policy", "defer cannot be used with a group: a deferred message would be released without its group's windows; use drop or disconnect")
	}
	for i, c := range cs {
		if c.Quota.Policy == devicelimit.PolicyDefer {
			v.add(fmt.Sprintf("%s[%d].quota.policy", ckey, i), "defer cannot be used with a group: a deferred message would be released without its group's windows; use drop or disconnect")
		}
	}
	if len(cluster.Redis.Addrs) > 1 && cluster.Decisions != "owner" {
		v.add(key, "groups need one Redis server, not Redis Cluster (several cluster.redis.addrs), unless cluster.decisions is owner: a device's windows and its group's are decided in one script call, which Redis Cluster allows only within one hash slot (owner mode decides the device's where it is and the group's in the group's own slot)")
	}
}

// oneQuotaPerGroup refuses two rules (or a rule and the default) that
// put devices in the same group, named by fixed text, with different
// quotas: each message would be judged by its own device's rule's
// quota of the group (docs/quotas.md, "Groups and tenants"). Groups named by
// templates are known only as devices join; the broker logs a clash
// then.
func (v *validator) oneQuotaPerGroup(l Limits) {
	type maker struct {
		key string
		q   devicelimit.Quota
	}
	seen := map[string]maker{}
	check := func(key string, g *Group) {
		if g == nil {
			return
		}
		// Without parts to name, a template fails to compile: only
		// fixed text passes.
		if t, err := devicelimit.CompileTemplate(g.Name, nil); err != nil || !t.Fixed() {
			return
		}
		q := g.Quota.Quota()
		if first, ok := seen[g.Name]; !ok {
			seen[g.Name] = maker{key, q}
		} else if first.q != q {
			v.add(key+".quota", fmt.Sprintf("group %q is also made by %s with another quota (%s, here %s): give one group one quota", g.Name, first.key, describeGroup(first.q), describeGroup(q)))
		}
	}
	for i, r := range l.Rules {
		check(fmt.Sprintf("limits.rules[%d].group", i), r.Group)
	}
	check("limits.group", l.Group)
}

// describeGroup says what a group's quota allows, and whether it is in
// shadow mode.
func describeGroup(q devicelimit.Quota) string {
	if q.Shadow {
		return q.Describe() + " in shadow mode"
	}
	return q.Describe()
}
