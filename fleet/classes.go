package fleet

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/simulator"
)

// topicClasses reads --topic-class, "NAME:EVERY,...": classes of the
// started gateway's limits.classes that every EVERY-th message of each
// device is sent in. A device's topic in a class is made from the
// class's first topic filter: its first '+' level is the device's ID,
// other '+' levels "x", a last '#' "sim-RUNID" (the run's own topics).
func topicClasses(flag string, gcfg *config.Config, runID string) ([]simulator.TopicClass, error) {
	if flag == "" {
		return nil, nil
	}
	var out []simulator.TopicClass
	for _, item := range strings.Split(flag, ",") {
		name, every, ok := strings.Cut(strings.TrimSpace(item), ":")
		n, err := strconv.Atoi(every)
		if !ok || err != nil || n < 1 {
			return nil, usagef("simulate: --topic-class: %q is not NAME:EVERY with EVERY >= 1", item)
		}
		var class *config.Class
		for i := range gcfg.Limits.Classes {
			if gcfg.Limits.Classes[i].Name == name {
				class = &gcfg.Limits.Classes[i]
			}
		}
		if class == nil {
			return nil, usagef("simulate: --topic-class: the gateway's limits.classes has no class %q", name)
		}
		topic, err := classTopic(class.Topics[0], runID)
		if err != nil {
			return nil, usagef("simulate: --topic-class %s: %v", name, err)
		}
		out = append(out, simulator.TopicClass{Name: name, Topic: topic, Every: n, Quota: class.Quota.Quota()})
	}
	return out, nil
}

// classTopic makes a device topic template (one %s) that filter
// matches.
func classTopic(filter, runID string) (string, error) {
	levels := strings.Split(filter, "/")
	device := false
	for i, l := range levels {
		switch {
		case l == "+" && !device:
			levels[i], device = "%s", true
		case l == "+":
			levels[i] = "x"
		case l == "#":
			levels[i] = "sim-" + runID
		}
	}
	if !device {
		return "", fmt.Errorf("its first topic filter %q has no '+' level for the device's ID", filter)
	}
	return strings.Join(levels, "/"), nil
}
